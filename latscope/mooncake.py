"""Mooncake traces: read one, replay its arrivals, and build prompts that share exactly its prefixes.

The format (Mooncake, FAST 2025, Moonshot AI's Kimi service) is JSON Lines, one request a line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 2111, ...]}

* ``timestamp``: arrival, in milliseconds from the trace's start (an int; a finite float is taken too);
* ``input_length``: prompt tokens, >= 1; ``output_length``: output tokens, >= 0;
* ``hash_ids``: the prompt as blocks of B = 512 tokens (`BLOCK_SIZE`), one non-negative int id a
  block. With n = len(hash_ids) = ceil(input_length / B), blocks 0..n-2 are full and block n-1
  holds input_length - B·(n-1) tokens (1..B). Two requests whose lists start with the same k ids
  share their first k blocks of prompt text, which is what a server's prefix cache can reuse.

`read_mooncake` checks every line and requires n == ceil(input_length / B) exactly (the published
conversation trace holds it on all 12,031 lines; a trace cut with another block size is read with
``block_size=``), so the block structure behind every prompt is known. Blank lines are skipped.
Problems raise `ScenarioError` "trace file PATH: line N: ..." (N 1-based). Result: a `MooncakeTrace`
of numpy arrays in file order, the hash ids as CSR (request i's ids are
``hash_ids[hash_start[i]:hash_start[i+1]]``), and ``offset_s = (timestamp - min timestamp) / 1000``.

Replay (`mooncake_rows`, `mooncake_offsets`) is `latscope.arrivals.trace_rows/trace_offsets`'s
contract: rows sorted by offset (stable), those with offset < `start` skipped, offset' =
(offset - start) / speedup, and only offset' < `duration` kept when a duration is given.

Scaling (`scaled_lengths`) shrinks a trace for a small server while keeping its block structure
exactly. With s in (0, 1] and rint = round half to even::

    b      = max(1, rint(B·s))                                   tokens a block
    prompt = (n - 1)·b + clip(rint(last·s), 1, b)                last = input_length - B·(n-1)
    output = max(1, rint(output_length·s)) if output_length > 0 else 0   (0: "unset", as elsewhere)

so a prompt still has exactly n blocks, n - 1 of them full, whatever s is.

Prompt text (`block_prompt`): every word of the vocabulary V (v = len(V) distinct words, each one
BPE token with its leading space, e.g. `latscope.workload.VOCABULARY`, v = 141) is one token, so a
prompt of N words is N tokens and its first k blocks are exactly its first k·b words. Block j of a
request is the b words of its hash id h, a function of (seed, h, b, V) only. With mix = the
splitmix64 finalizer on 64-bit words, S = mix(seed mod 2^64), the seed's word stream
R_q = V[r_q], r_q = mix(S + q) mod v for q < Q = 2^16 (`POOL_WORDS`), and w = min(b, ID_WORDS = 4)::

    word p < w  (the id):     V[(digit_p(h) + r_p) mod v]      digit_p(h) = (h // v^p) mod v
    word p >= w (the filler): R_(o + p)                        o = mix(S xor mix(h)) mod (Q - b + 1)

The first w words are h's base-v digits (least significant first), each shifted by an offset that
depends on (seed, p) only: a bijection at every position, so different ids always give different
blocks, as long as h < v^w (`id_capacity`; 141^4 = 395,254,161 for b >= 4, 141^3 = 2,803,221 for
b = 3; b <= Q). The filler is a window of the seeded stream that starts where (seed, h) says. The
prompt is the blocks joined by single spaces (words within a block too), cut to exactly
`prompt_tokens` words. In code::

    b = scaled_lengths(trace, rows, scale)[2]
    text = block_prompt(trace.ids(row), prompt_tokens, b, VOCABULARY, seed)
    assert len(text.split(" ")) == prompt_tokens

A block's text is kept in an LRU (`BLOCK_CACHE` blocks), since requests share blocks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from latscope.errors import ScenarioError

BLOCK_SIZE = 512  # tokens a hash id stands for in the published Mooncake traces
ID_WORDS = 4  # leading words of a block that spell its hash id (base len(words))
BLOCK_CACHE = 4096  # block texts kept (about 3 KB each at 512 words: ~12 MB at most)
POOL_WORDS = 1 << 16  # length of the seeded word stream that blocks' filler words are cut from

_MASK = (1 << 64) - 1
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_INT = {int}


@dataclass(frozen=True, slots=True, eq=False)
class MooncakeTrace:
    """A Mooncake trace in file order; see the module docstring for the meaning of each array."""

    offset_s: np.ndarray  # float64 [n]: seconds since the earliest request
    input_length: np.ndarray  # int64 [n]: prompt tokens
    output_length: np.ndarray  # int64 [n]: output tokens
    hash_ids: np.ndarray  # int64 [sum of block counts]: every request's ids, one after the other
    hash_start: np.ndarray  # int64 [n + 1]: request i's ids are hash_ids[hash_start[i]:hash_start[i + 1]]
    block_size: int = BLOCK_SIZE  # tokens a hash id stands for

    def __len__(self) -> int:
        return len(self.offset_s)

    def ids(self, i: int) -> np.ndarray:
        """Request i's hash ids (a view)."""
        return self.hash_ids[self.hash_start[i] : self.hash_start[i + 1]]


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _problem(obj: Any, block_size: int) -> str | None:
    """What is wrong with one parsed line, or None. Checked on every line, so kept lean."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for name in _FIELDS:
        if name not in obj:
            return f"missing field {name!r} (a request needs {', '.join(_FIELDS)})"
    ts, il, ol, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    if type(ts) is int:
        if not 0 <= ts <= 1 << 53:
            return f"timestamp {ts} is not in [0, 2^53] milliseconds"
    elif type(ts) is not float or not (math.isfinite(ts) and ts >= 0):
        return f"timestamp {ts!r} is not a non-negative number of milliseconds"
    if type(il) is not int or il < 1:
        return f"input_length {il!r} is not an int >= 1"
    if type(ol) is not int or ol < 0:
        return f"output_length {ol!r} is not an int >= 0"
    if type(ids) is not list:
        return f"hash_ids is {type(ids).__name__}, expected a list of ints"
    need = -(-il // block_size)
    if len(ids) != need:
        return (f"hash_ids has {len(ids)} ids but input_length {il} needs ceil({il}/{block_size}) = "
                f"{need} (one id per block of {block_size} tokens)")
    if set(map(type, ids)) != _INT:  # bool is not an int here
        bad = next(h for h in ids if type(h) is not int)
        return f"hash_ids holds {bad!r}, expected ints"
    if min(ids) < 0 or max(ids) > _MASK >> 1:
        return f"hash_ids holds {min(ids) if min(ids) < 0 else max(ids)}, expected ints in [0, 2^63)"
    return None


def read_mooncake(path: str | Path, block_size: int = BLOCK_SIZE) -> MooncakeTrace:
    """Load and check a Mooncake trace (JSON Lines); `block_size` is the tokens a hash id stands for."""
    import orjson

    path = Path(path)
    if not block_size >= 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not path.is_file():
        raise ScenarioError(f"trace file {path}: not found")
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ScenarioError(f"trace file {path}: cannot read it ({exc})") from None
    ts: list[int | float] = []
    il: list[int] = []
    ol: list[int] = []
    ids: list[list[int]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ScenarioError(f"trace file {path}: line {n}: not JSON ({exc})") from None
        if (problem := _problem(obj, block_size)) is not None:
            raise ScenarioError(f"trace file {path}: line {n}: {problem}")
        ts.append(obj["timestamp"])
        il.append(obj["input_length"])
        ol.append(obj["output_length"])
        ids.append(obj["hash_ids"])
    if not ts:
        raise ScenarioError(f"trace file {path}: no requests (the file is empty or blank)")

    stamps = np.array(ts)  # int64, or float64 when any timestamp is fractional
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    start = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(start[-1]))
    return MooncakeTrace(
        offset_s=((stamps - stamps.min()) / 1000.0).astype(np.float64),
        input_length=np.array(il, dtype=np.int64),
        output_length=np.array(ol, dtype=np.int64),
        hash_ids=flat,
        hash_start=start,
        block_size=block_size,
    )


# --------------------------------------------------------------------------------------------
# Replay and scaling
# --------------------------------------------------------------------------------------------


def mooncake_rows(
    trace: MooncakeTrace, speedup: float = 1.0, start: float = 0.0, duration: float | None = None
) -> np.ndarray:
    """Positions of the requests a replay sends, in replay order (by offset, file order on ties):
    those at or after `start` (trace seconds) whose (offset - start) / speedup < `duration`."""
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    order = np.argsort(trace.offset_s, kind="stable")
    offsets = trace.offset_s[order]
    keep = offsets >= start
    if duration is not None:
        keep &= (offsets - start) / speedup < duration
    return order[keep]


def mooncake_offsets(
    trace: MooncakeTrace, speedup: float = 1.0, start: float = 0.0, duration: float | None = None
) -> np.ndarray:
    """Send offsets (seconds from the phase start) of `mooncake_rows`'s requests, in that order."""
    return (trace.offset_s[mooncake_rows(trace, speedup, start, duration)] - start) / speedup


def scaled_lengths(trace: MooncakeTrace, rows: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, int]:
    """(prompt tokens int32, output tokens int32, tokens a block) of `rows` scaled by `scale` in
    (0, 1], keeping every request's block count (formulas in the module docstring)."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    rows = np.asarray(rows, dtype=np.int64)
    size = trace.block_size
    block = max(1, int(np.rint(size * scale)))
    il = trace.input_length[rows]
    full = (il - 1) // size  # n - 1 full blocks
    last = il - full * size  # 1..size
    prompt = full * block + np.clip(np.rint(last * scale), 1, block).astype(np.int64)
    ol = trace.output_length[rows]
    output = np.where(ol > 0, np.maximum(1, np.rint(ol * scale)), 0)
    return prompt.astype(np.int32), output.astype(np.int32), block


# --------------------------------------------------------------------------------------------
# Prompt text
# --------------------------------------------------------------------------------------------


def _mix_int(x: int) -> int:
    """splitmix64's finalizer on one 64-bit word (Python ints)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """`_mix_int` on a uint64 array (array arithmetic wraps modulo 2^64 without warnings)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def id_capacity(block_tokens: int, vocabulary_size: int) -> int:
    """How many hash ids (0 .. capacity-1) blocks of `block_tokens` words tell apart."""
    return vocabulary_size ** min(block_tokens, ID_WORDS)


class _Words:
    """A vocabulary and seed's stream R (`POOL_WORDS` words), as one string plus word boundaries.
    Hashed by identity: `_block_text`'s cache keys on it without hashing the vocabulary again."""

    __slots__ = ("words", "seed_key", "index", "text", "starts", "ends")

    def __init__(self, words: tuple[str, ...], seed: int) -> None:
        if len(words) < 2 or len(set(words)) != len(words):
            raise ValueError(f"words must be at least 2 distinct words, got {len(words)} ({len(set(words))} distinct)")
        if any(not w or len(w.split()) != 1 or w != w.strip() for w in words):
            raise ValueError("every word must be non-empty and hold no whitespace")
        self.words = words
        self.seed_key = _mix_int(seed & _MASK)  # S
        self.index = (_mix(np.uint64(self.seed_key) + np.arange(POOL_WORDS, dtype=np.uint64))
                      % np.uint64(len(words))).astype(np.intp).tolist()  # r_q
        stream = [words[i] for i in self.index]
        self.text = " ".join(stream)
        lengths = np.fromiter(map(len, stream), dtype=np.int64, count=POOL_WORDS) + 1
        self.ends = (np.cumsum(lengths) - 1).tolist()  # R_q is text[starts[q]:ends[q]]
        self.starts = [e - n + 1 for e, n in zip(self.ends, lengths.tolist())]


@lru_cache(maxsize=8)
def _stream(words: tuple[str, ...], seed: int) -> _Words:
    return _Words(words, seed)


@lru_cache(maxsize=BLOCK_CACHE)
def _block_text(h: int, block_tokens: int, stream: _Words) -> str:
    """The `block_tokens` words of hash id `h`, joined by single spaces (construction: module docstring)."""
    words, index = stream.words, stream.index
    v, w = len(words), min(block_tokens, ID_WORDS)
    if not 0 <= h < v**w:
        raise ValueError(f"hash id {h} does not fit blocks of {block_tokens} words over {v} words: "
                         f"ids must be in [0, {v**w})")
    spelled, rest = [], h
    for p in range(w):
        rest, digit = divmod(rest, v)
        spelled.append(words[(digit + index[p]) % v])
    if block_tokens == w:
        return " ".join(spelled)
    o = _mix_int(stream.seed_key ^ _mix_int(h)) % (POOL_WORDS - block_tokens + 1)
    return " ".join(spelled) + " " + stream.text[stream.starts[o + w] : stream.ends[o + block_tokens - 1]]


def _cut(text: str, k: int) -> str:
    """The first k (>= 1) space-separated words of `text`."""
    rest = text.split(" ", k)
    return text if len(rest) <= k else text[: len(text) - len(rest[k]) - 1]


def block_prompt(
    hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int, words: Sequence[str], seed: int
) -> str:
    """Prompt text of exactly `prompt_tokens` words: the blocks of `hash_ids`, `block_tokens` words
    each, cut after `prompt_tokens` words (the last block used may be partial; blocks past it are
    not built). Needs 1 <= prompt_tokens <= len(hash_ids)·block_tokens."""
    if not 1 <= block_tokens <= POOL_WORDS:
        raise ValueError(f"block_tokens must be in [1, {POOL_WORDS}], got {block_tokens}")
    if not 1 <= prompt_tokens <= len(hash_ids) * block_tokens:
        raise ValueError(f"prompt_tokens must be in [1, {len(hash_ids)} blocks × {block_tokens}], "
                         f"got {prompt_tokens}")
    stream = _stream(words if isinstance(words, tuple) else tuple(words), int(seed))
    blocks = -(-prompt_tokens // block_tokens)
    ids = hash_ids[:blocks]
    ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(h) for h in ids]
    texts = [_block_text(h, block_tokens, stream) for h in ids]
    tail = prompt_tokens - (blocks - 1) * block_tokens
    if tail < block_tokens:
        texts[-1] = _cut(texts[-1], tail)
    return " ".join(texts)
