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
With ``max_ids=`` a request may hold at most that many ids, and a line is read only up to the bytes
such a request takes (`line_bytes`): a 50 MB line is refused after its first few kilobytes, not
parsed whole. Problems raise `ScenarioError` "trace file PATH: line N: ..." (N 1-based). Result: a
`MooncakeTrace` of numpy arrays in file order, the hash ids as CSR (request i's ids are
``hash_ids[hash_start[i]:hash_start[i+1]]``), ``offset_s = (timestamp - min timestamp) / 1000``,
and each request's line in the file (for messages).

What a replay may ask of a run is checked when the scenario is (`ReplayLimits`, `check_replay`;
`latscope validate` and `run` alike), so that nothing `validate` accepts fails in a worker: at most
``max_prompt_tokens`` prompt tokens a request (``max_ids(b)`` ids), every id a prompt uses below
`id_capacity`, at most ``max_requests`` requests and ``max_duration_s`` seconds of replay.

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

import math
from array import array
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn, Sequence

import numpy as np

from latscope.errors import ScenarioError

BLOCK_SIZE = 512  # tokens a hash id stands for in the published Mooncake traces
ID_WORDS = 4  # leading words of a block that spell its hash id (base len(words))
BLOCK_CACHE = 4096  # block texts kept (about 3 KB each at 512 words: ~12 MB at most)
POOL_WORDS = 1 << 16  # length of the seeded word stream that blocks' filler words are cut from
MAX_TOKENS = 2**31 - 1  # lengths are int32 in the plan
ID_BYTES = 21  # the most one id takes in a line: 19 digits (< 2^63), a comma and a space
LINE_OVERHEAD = 4096  # bytes a line may hold besides its ids: the other fields, keys, spaces

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
    line: np.ndarray | None = None  # int64 [n]: each request's line in the file (1-based)
    path: str = ""  # the file, as messages name it

    def __len__(self) -> int:
        return len(self.offset_s)

    def ids(self, i: int) -> np.ndarray:
        """Request i's hash ids (a view)."""
        return self.hash_ids[self.hash_start[i] : self.hash_start[i + 1]]


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _problem(obj: Any, block_size: int, max_ids: int | None) -> str | None:
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
    if type(ol) is not int or not 0 <= ol <= MAX_TOKENS:
        return f"output_length {ol!r} is not an int in [0, 2^31 - 1]"
    if type(ids) is not list:
        return f"hash_ids is {type(ids).__name__}, expected a list of ints"
    need = -(-il // block_size)
    if max_ids is not None and need > max_ids:
        return _too_many_ids(f"input_length {il:,} is {need:,} blocks of {block_size} tokens", max_ids)
    if len(ids) != need:
        return (f"hash_ids has {len(ids)} ids but input_length {il} needs ceil({il}/{block_size}) = "
                f"{need} (one id per block of {block_size} tokens)")
    if set(map(type, ids)) != _INT:  # bool is not an int here
        bad = next(h for h in ids if type(h) is not int)
        return f"hash_ids holds {bad!r}, expected ints"
    if min(ids) < 0 or max(ids) > _MASK >> 1:
        return f"hash_ids holds {min(ids) if min(ids) < 0 else max(ids)}, expected ints in [0, 2^63)"
    return None


def _too_many_ids(what: str, max_ids: int) -> str:
    return (f"{what}; a request may have at most {max_ids:,} hash_ids (limits.max_prompt_tokens over the tokens a "
            "block replays, before any lengths.max_prompt cap): raise limits.max_prompt_tokens to replay longer prompts")


def line_bytes(max_ids: int) -> int:
    """The longest line a request of at most `max_ids` ids takes (longer: it holds more ids, or padding)."""
    return max_ids * ID_BYTES + LINE_OVERHEAD


def read_mooncake(path: str | Path, block_size: int = BLOCK_SIZE, max_ids: int | None = None) -> MooncakeTrace:
    """Load and check a Mooncake trace (JSON Lines); `block_size` is the tokens a hash id stands for,
    `max_ids` the most ids a request may hold (None: any; a line is then parsed whatever its length)."""
    import orjson

    path = Path(path)
    if not block_size >= 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not path.is_file():
        raise ScenarioError(f"trace file {path}: not found")
    limit = -1 if max_ids is None else line_bytes(max_ids)
    ts: list[int | float] = []
    il: list[int] = []
    ol: list[int] = []
    lines: list[int] = []
    flat = array("q")  # every request's ids, 8 bytes each (a list of Python ints takes 40)
    counts: list[int] = []
    try:
        with path.open("rb") as file:
            for n, line in enumerate(iter(lambda: file.readline(limit + 1 if limit >= 0 else -1), b""), 1):
                if limit >= 0 and len(line) > limit and not line.endswith(b"\n"):
                    raise ScenarioError(f"trace file {path}: line {n}: " + _too_many_ids(
                        f"the line is over {limit:,} bytes, more than its hash_ids can take", max_ids))
                if not line.strip():
                    continue
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ScenarioError(f"trace file {path}: line {n}: not JSON ({exc})") from None
                if (problem := _problem(obj, block_size, max_ids)) is not None:
                    raise ScenarioError(f"trace file {path}: line {n}: {problem}")
                ts.append(obj["timestamp"])
                il.append(obj["input_length"])
                ol.append(obj["output_length"])
                lines.append(n)
                counts.append(len(obj["hash_ids"]))
                flat.extend(obj["hash_ids"])
    except OSError as exc:
        raise ScenarioError(f"trace file {path}: cannot read it ({exc})") from None
    if not ts:
        raise ScenarioError(f"trace file {path}: no requests (the file is empty or blank)")

    stamps = np.array(ts)  # int64, or float64 when any timestamp is fractional
    start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    return MooncakeTrace(
        offset_s=((stamps - stamps.min()) / 1000.0).astype(np.float64),
        input_length=np.array(il, dtype=np.int64),
        output_length=np.array(ol, dtype=np.int64),
        hash_ids=np.frombuffer(flat, dtype=np.int64) if flat else np.empty(0, np.int64),
        hash_start=start,
        block_size=block_size,
        line=np.array(lines, dtype=np.int64),
        path=str(path),
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


def scaled_block(block_size: int, scale: float) -> int:
    """Tokens a block of `block_size` tokens replays as at `scale` in (0, 1]: max(1, rint(B·s))."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    return max(1, int(np.rint(block_size * scale)))


def scaled_lengths(trace: MooncakeTrace, rows: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, int]:
    """(prompt tokens int64, output tokens int64, tokens a block) of `rows` scaled by `scale` in
    (0, 1], keeping every request's block count (formulas in the module docstring). int64: an
    input_length past 2^31 is not cut short here; `check_replay` refuses it."""
    rows = np.asarray(rows, dtype=np.int64)
    size = trace.block_size
    block = scaled_block(size, scale)
    il = trace.input_length[rows]
    full = (il - 1) // size  # n - 1 full blocks
    last = il - full * size  # 1..size
    prompt = full * block + np.clip(np.rint(last * scale), 1, block).astype(np.int64)
    ol = trace.output_length[rows]
    output = np.where(ol > 0, np.maximum(1, np.rint(ol * scale)), 0)
    return prompt.astype(np.int64), output.astype(np.int64), block


@dataclass(frozen=True, slots=True)
class ReplayLimits:
    """What a replay may ask of a run: the scenario's bounds (docs/guarantees.md), checked on the
    trace when the scenario is checked, so that what `validate` accepts a worker can send."""

    max_prompt_tokens: int  # limits.max_prompt_tokens: one prompt, as sent (scaled, capped)
    max_requests: int  # limits.max_planned_requests: requests one replay may send
    max_duration_s: float  # the longest a phase may last (plan.MAX_DURATION_S)
    vocabulary_size: int  # words the prompts are made of: with the block size, the ids' capacity

    def max_ids(self, block_tokens: int) -> int:
        """The most ids a request may hold: with n ids its prompt is at least (n - 1)·b + 1 tokens."""
        return (min(self.max_prompt_tokens, MAX_TOKENS) - 1) // block_tokens + 1


def check_replay(trace: MooncakeTrace, rows: np.ndarray, offsets: np.ndarray, prompt: np.ndarray, block_tokens: int,
                 limits: ReplayLimits) -> None:
    """Refuse a replay (its `rows`, send `offsets`, prompt tokens as sent, tokens a block) that a run
    could not carry out, naming the trace line to change: too many requests, too long, a prompt over
    limits.max_prompt_tokens, or a block id its prompt text cannot spell (`id_capacity`)."""
    def refuse(row: int, message: str) -> NoReturn:
        raise ScenarioError(f"trace file {trace.path}: line {int(trace.line[row])}: {message}")

    if len(rows) > limits.max_requests:
        refuse(rows[limits.max_requests], f"the replay would send {len(rows):,} requests, this one past the limit of "
                                          f"{limits.max_requests:,} (limits.max_planned_requests): a phase duration, "
                                          "start or speedup replays a part of the trace")
    if len(offsets) and offsets[-1] > limits.max_duration_s:
        last = int(np.argmax(offsets > limits.max_duration_s))
        refuse(rows[last], f"this request comes {offsets[last]:.6g} s into the replay; a phase lasts at most "
                           f"{limits.max_duration_s:,.0f} s ({limits.max_duration_s / 86400:g} days): give the phase a "
                           "duration, or a start or speedup, to replay a part of the trace")
    top = min(limits.max_prompt_tokens, MAX_TOKENS)
    if len(prompt) and (over := np.flatnonzero(prompt > top)).size:
        i = over[np.argmin(trace.line[rows[over]])]
        refuse(rows[i], f"input_length {int(trace.input_length[rows[i]]):,} makes a prompt of {int(prompt[i]):,} "
                        f"tokens (blocks of {block_tokens}); the limit is {top:,} (limits.max_prompt_tokens)")
    capacity = id_capacity(block_tokens, limits.vocabulary_size)
    used = -(-prompt // block_tokens)  # blocks each prompt is built from: the ids past them are never spelled
    owner = np.repeat(np.arange(len(rows)), used)
    position = np.arange(len(owner)) - np.repeat(np.cumsum(used) - used, used)
    ids = trace.hash_ids[trace.hash_start[rows][owner] + position]
    if (bad := np.flatnonzero(ids >= capacity)).size:
        j = bad[np.argmin(trace.line[rows[owner[bad]]])]
        wider = f", or a scale that makes blocks of {ID_WORDS} tokens or more" if block_tokens < ID_WORDS else ""
        refuse(rows[owner[j]], f"hash_ids holds {int(ids[j]):,} (block {int(position[j]) + 1}): blocks of {block_tokens} "
                               f"tokens spell at most {capacity:,} distinct ids (0 to {capacity - 1:,}); number the "
                               f"trace's ids from 0 (e.g. in order of first use){wider}")


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
