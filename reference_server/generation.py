"""Continuous batching for the decoder: every active sequence advances by one token per decode step.

Same shape as batcher.py: the asyncio front end calls `generator.submit(prompt_ids, max_tokens)` (no
await; a full waiting queue raises `Overloaded` at once) and reads tokens from the returned
`Generation`; one inference thread owns the model and the KV caches and hands each token to the
request's event loop with `loop.call_soon_threadsafe` as soon as it exists.

The inference thread loops:
1. admit waiting requests while there are free sequence slots (`max_sequences`) and the prompt tokens
   to compute fit the per-iteration prefill budget (`max_prefill_tokens`; at least one is always
   admitted); with a prefix cache (prefix_cache.py) each admitted prompt takes its longest cached prefix
   of full blocks, always leaving at least its last token to compute;
2. prefill them, several at once when they arrived together: a group shares its cached length (so the
   cached keys and values stack into one past tensor with no padding) and the power-of-two bucket of its
   tokens to compute, which are left-padded; each prefill yields its sequence's first token, then the
   prompts' full blocks that were computed go into the prefix cache;
3. merge them into the decode batch, then run one decode step for every active sequence together.
A sequence leaves the batch when it has `max_tokens` tokens (greedy argmax; there is no end-of-sequence
token, so every answer is exactly max_tokens long) or when its client cancels it.

Cost factors (named adapters, `--adapter NAME=FACTOR`): a sequence submitted with `factor` f >= 1 costs f
model runs per token. It carries a credit: every run it takes part in adds 1, and a run's result is kept
only when the credit reaches f (then f is taken off); the other runs are computed and thrown away. So its
prompt's prefill runs ceil(f) times back to back (its group holds only sequences of the same factor), and
in the decode batch it keeps one step's result in f on average (exactly every f-th step for a whole f;
1.5: steps 1, 3, 4, 6, ... after a prefill that left 0.5): its time per token is f times the step time of
the batch it decodes in, while the other rows still get a token every step. A thrown-away step's new KV
column is removed from that row by shifting the row right by one column (a padding column comes in on the
left), so the row's cache is exactly as before the step and the batch's width stays bounded.

KV cache layout: the decode batch keeps, per layer, one key and one value array [rows, heads, T, head_dim]
and an attention mask [rows, T]. Every row is **left-padded**: its real tokens are its last `length`
columns (but for the gap below), the columns before are padding with mask 0. A decode step appends one
column to every row, so rows stay right-aligned; a row that joins is left-padded (or the batch is) to
the wider of the two; when rows leave, leading columns that no remaining row attends are cut off.
Positions are per row (0 … length-1), so padding never shifts them, and the graph's last-position
logits are each row's own.
A prefill with a cached prefix feeds it as past and the rest of the prompt as new tokens (positions
from the cached length on); in a group whose rows compute different numbers of tokens, a shorter row
comes out as [cached][padding][new] and keeps that gap while it decodes: attention does not depend on
the order of the columns (positions travel in the keys), and masked columns get exactly zero weight
(exp of -1e9 underflows), so cached or not, padded or not, a sequence gets the same tokens.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from reference_server.batcher import Overloaded
from reference_server.decoder import DecoderConfig, empty_cache, past_names, present_names
from reference_server.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys, usable_blocks

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
PrefillObserver = Callable[[int, int, int], None]
"""Called from the inference thread after each prefill run with (rows, padded tokens, compute ns)."""
StepObserver = Callable[[int, int], None]
"""Called from the inference thread after each decode step with (rows, compute ns)."""
PromptObserver = Callable[[int, int], None]
"""Called from the inference thread after each prefill run with (prompt tokens, of which taken from the cache)."""
TokenObserver = Callable[[int], None]
"""Called from the inference thread with the number of tokens each prefill or decode step handed out (a cost
factor's thrown-away runs hand out none)."""

MAX_PREFILL_TOKENS = 4096  # prompt tokens computed between two decode steps (one long prompt always fits)


class ContextTooLong(ValueError):
    """Prompt plus max_tokens do not fit the decoder's context."""


class GenerationFailed(RuntimeError):
    """The model run of this sequence failed, or the server stopped before it finished."""


@dataclass(frozen=True)
class Token:
    id: int
    emitted_ns: int  # time.perf_counter_ns() right after the run that produced it


_END = object()


class Generation:
    """One request's sequence. The front end awaits `tokens()` until it returns [], and calls `cancel()`
    when its client goes away (harmless once finished). Timing fields are perf_counter_ns values written
    by the inference thread; they are complete once `tokens()` has returned []."""

    def __init__(self, prompt: np.ndarray, max_tokens: int, loop: asyncio.AbstractEventLoop, factor: float = 1.0,
                 cache_salt: bytes = b"") -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.factor = factor  # model runs per token (module docstring: cost factors)
        self.cache_salt = cache_salt  # starts its prefix-cache keys (an adapter's own blocks)
        self.enqueued_ns = time.perf_counter_ns()
        self.prefill_start_ns = 0
        self.prefill_ns = 0  # the prefill run of this sequence's group
        self.prefill_rows = 0  # sequences in that run
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache (set before its prefill)
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.generated = 0
        self.cancelled = False
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._ended = False
        self._error: BaseException | None = None
        # Inference-thread state: tokens in this row's KV cache, and the token to feed next; the prompt's
        # prefix-cache keys (computed once) and the cached blocks its prefill will use.
        self._length = 0
        self._next = 0
        self._keys: list[bytes] | None = None
        self._hit: list[np.ndarray] = []
        self._credit = 0.0  # runs taken part in, less f per kept result (cost factors)

    @property
    def queue_ns(self) -> int:
        """Submission to the start of its prefill run."""
        return self.prefill_start_ns - self.enqueued_ns

    @property
    def decode_ns(self) -> int:
        """First token to last token: the decode steps this sequence took part in, and whatever ran between them."""
        return self.last_token_ns - self.first_token_ns

    def cancel(self) -> None:
        self.cancelled = True

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens

    async def tokens(self) -> list[Token]:
        """Every token emitted since the last call (waits for at least one); [] once the sequence is complete.
        Raises GenerationFailed when the model run failed or the server is stopping."""
        if self._error is not None:
            raise self._error
        if self._ended:
            return []
        events = [await self._events.get()]
        while not self._events.empty():
            events.append(self._events.get_nowait())
        out: list[Token] = []
        for event in events:
            if event is _END:
                self._ended = True
                break
            if isinstance(event, BaseException):
                self._error = event
                if not out:
                    raise event
                break
            out.append(event)
        return out


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for events, event in items:
        events.put_nowait(event)


def _bucket(length: int) -> int:
    return 1 << max(length - 1, 0).bit_length()


def _left_pad(a: np.ndarray, width: int, axis: int) -> np.ndarray:
    missing = width - a.shape[axis]
    if missing == 0:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (missing, 0)
    return np.pad(a, pad)


class _Batch:
    """The decode batch: its rows' Generations, the KV cache (past_names order) and the attention mask."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: list[Generation] = []
        self.cache: list[np.ndarray] = []
        self.mask = np.zeros((0, 0), np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: list[Generation], cache: list[np.ndarray], mask: np.ndarray) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask = list(rows), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache = [np.concatenate([_left_pad(old, width, 2), _left_pad(new, width, 2)])
                      for old, new in zip(self.cache, cache)]
        self.mask = np.concatenate([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)])
        self.rows.extend(rows)

    def retain(self, keep: Callable[[Generation], bool]) -> list[Generation]:
        """Drop the rows `keep` rejects, and the leading columns no remaining row attends; returns the dropped."""
        kept = [i for i, g in enumerate(self.rows) if keep(g)]
        if len(kept) == len(self.rows):
            return []
        dropped = [g for g in self.rows if not keep(g)]
        if not kept:
            self.clear()
            return dropped
        index = np.array(kept)
        mask = self.mask[index]
        first = int(np.argmax(mask.any(axis=0)))  # every row has its last columns set, so this finds a real column
        self.rows = [self.rows[i] for i in kept]
        self.mask = np.ascontiguousarray(mask[:, first:])
        self.cache = [np.ascontiguousarray(a[index][:, :, first:]) for a in self.cache]
        return dropped


def _active(g: Generation) -> bool:
    return not g.cancelled and not g.finished


class Generator:
    def __init__(self, run: RunFn, config: DecoderConfig, *, max_sequences: int, max_waiting: int,
                 max_prefill_tokens: int = MAX_PREFILL_TOKENS, on_prefill: PrefillObserver | None = None,
                 on_step: StepObserver | None = None, prefix_cache: PrefixCache | None = None,
                 on_prompt: PromptObserver | None = None, on_tokens: TokenObserver | None = None) -> None:
        if max_sequences < 1 or max_waiting < 1 or max_prefill_tokens < 1:
            raise ValueError("max_sequences, max_waiting and max_prefill_tokens must be >= 1")
        self._run_fn = run
        self.config = config
        self.max_sequences = max_sequences
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self._on_prefill = on_prefill
        self._on_step = on_step
        self._on_prompt = on_prompt
        self._on_tokens = on_tokens
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(0)  # owned by the thread
        self._past = past_names(config.layers)
        self._present = present_names(config.layers)
        self._waiting: deque[Generation] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._active = 0
        self._thread = threading.Thread(target=self._loop, name="generation-0", daemon=True)

    # --- front end (event loop) ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Fail every sequence still waiting or decoding (GenerationFailed), end the inference thread. Blocks."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def active(self) -> int:
        """Sequences being decoded (admitted, not finished)."""
        return self._active

    def waiting(self) -> int:
        """Sequences submitted but not yet admitted."""
        return len(self._waiting)

    def submit(self, prompt: Iterable[int] | np.ndarray, max_tokens: int, *, factor: float = 1.0,
               cache_salt: bytes = b"") -> Generation:
        """Queue one sequence; call from a running event loop. `factor` >= 1: model runs per token (cost
        factors, in the module docstring); `cache_salt`: its prefix-cache blocks are those of this salt only.
        Raises ValueError (ContextTooLong) for a request that can never run, Overloaded when the waiting queue is
        full or the generator is stopping."""
        ids = np.asarray(prompt if isinstance(prompt, np.ndarray) else list(prompt), dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("the prompt must be a non-empty list of token ids")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not factor >= 1:
            raise ValueError("factor must be >= 1")
        if ids.size + max_tokens > self.config.max_context:
            raise ContextTooLong(f"prompt ({ids.size} tokens) + max_tokens ({max_tokens}) is over the context "
                                 f"of {self.config.max_context} tokens")
        generation = Generation(ids, max_tokens, asyncio.get_running_loop(), factor, cache_salt)
        with self._cond:
            if self._stopping:
                raise Overloaded("server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise Overloaded(f"generation queue full ({self.max_waiting} requests waiting)")
            self._waiting.append(generation)
            self._cond.notify()
        return generation

    # --- inference thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        batch = _Batch()
        try:
            while True:
                admitted = self._admit(len(batch))
                if admitted is None:
                    break
                for group in self._groups(admitted):
                    self._prefill(group, batch)
                batch.retain(_active)
                self._active = len(batch)
                if batch:
                    self._decode(batch)
                    batch.retain(_active)
                    self._active = len(batch)
        except Exception:  # noqa: BLE001 - a bug here must not leave requests waiting forever
            log.exception("generation loop failed")
        finally:
            with self._cond:
                self._stopping = True
                left = list(self._waiting) + batch.rows
                self._waiting.clear()
            self._active = 0
            self._fail(left, GenerationFailed("server is shutting down"))

    def _admit(self, active: int) -> list[Generation] | None:
        """Waiting sequences to prefill now (blocks while nothing is active and nothing waits); None: stop."""
        with self._cond:
            while not active and not self._waiting and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            taken: list[Generation] = []
            tokens = 0
            while self._waiting and active + len(taken) < self.max_sequences:
                head = self._waiting[0]
                if head.cancelled:
                    self._waiting.popleft()
                    continue
                self._look_up(head)  # under the lock: hashing once (~50 us for 1024 tokens), then a dict walk
                if taken and tokens + head.prompt.size - head.cached_tokens > self.max_prefill_tokens:
                    head._hit, head.cached_tokens = [], 0  # looked up again when its turn comes
                    break
                taken.append(self._waiting.popleft())
                tokens += head.prompt.size - head.cached_tokens
            return taken

    def _look_up(self, g: Generation) -> None:
        """Take the longest cached prefix of g's prompt, in full blocks, leaving at least one token to compute."""
        if not self.prefix_cache.enabled:
            return
        if g._keys is None:
            g._keys = block_keys(g.prompt, g.cache_salt)
        g._hit = self.prefix_cache.lookup(g._keys, usable_blocks(g.prompt.size))
        g.cached_tokens = len(g._hit) * BLOCK_TOKENS

    @staticmethod
    def _groups(admitted: list[Generation]) -> list[list[Generation]]:
        """Prefill groups: same cached length, and same power-of-two bucket of tokens to compute, so a short
        prompt never pays for a long one, and same cost factor (the group's run is repeated for it); shortest first."""
        groups: dict[tuple[int, int, float], list[Generation]] = {}
        for g in admitted:
            groups.setdefault((_bucket(g.prompt.size - g.cached_tokens), g.cached_tokens, g.factor), []).append(g)
        return [groups[k] for k in sorted(groups)]

    def _prefill(self, group: list[Generation], batch: _Batch) -> None:
        rows, past = len(group), group[0].cached_tokens  # the group shares its cached length (_groups)
        new = [g.prompt.size - past for g in group]
        width = max(new)
        ids = np.zeros((rows, width), np.int64)
        positions = np.zeros((rows, width), np.int64)
        mask = np.zeros((rows, past + width), np.int64)
        mask[:, :past] = 1
        for i, (g, n) in enumerate(zip(group, new)):  # left-pad the new tokens: real ones in the last columns
            ids[i, width - n:] = g.prompt[past:]
            positions[i, width - n:] = np.arange(past, g.prompt.size)
            mask[i, past + width - n:] = 1
        start = time.perf_counter_ns()  # the prefill includes gathering the cached blocks, which costs a copy
        inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": mask,
                  **self._past_inputs(group, past)}
        for g in group:
            g.prefill_start_ns = start
        runs = math.ceil(group[0].factor)  # a cost factor's extra runs are thrown away; the last one is kept
        run_start = start  # the first run's time includes gathering the cached blocks, as it always did
        for _ in range(runs):
            try:
                outputs = self._run_fn(inputs)
            except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving the others
                log.warning("prefill of %d sequences failed: %s", rows, exc)
                self._fail(group, GenerationFailed(f"prefill failed: {exc}"))
                return
            end = time.perf_counter_ns()
            if self._on_prefill:
                self._on_prefill(rows, rows * width, end - run_start)
            run_start = end
        if self._on_prompt:
            self._on_prompt(sum(g.prompt.size for g in group), rows * past)
        for g in group:
            g.prefill_ns, g.prefill_rows, g._length, g._hit = end - start, rows, g.prompt.size, []
            g._credit = runs - g.factor
        self._emit(group, outputs["logits"].argmax(axis=-1), end)
        cache = [outputs[name] for name in self._present]
        self._store(group, cache, past, width)
        keep = [i for i, g in enumerate(group) if _active(g)]
        if len(keep) == rows:
            batch.add(group, cache, mask)
        elif keep:
            index = np.array(keep)
            batch.add([group[i] for i in keep], [a[index] for a in cache], mask[index])

    def _past_inputs(self, group: list[Generation], past: int) -> dict[str, np.ndarray]:
        """The past_* inputs of a prefill: the rows' cached blocks side by side (all `past` tokens long)."""
        if not past:
            return empty_cache(self.config, len(group))
        cfg = self.config
        stacked = np.empty((len(self._past), len(group), cfg.heads, past, cfg.head_dim), np.float32)
        for i, g in enumerate(group):
            for j, block in enumerate(g._hit):  # block: [2 * layers, heads, BLOCK_TOKENS, head_dim]
                stacked[:, i, :, j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS] = block
        return {name: stacked[k] for k, name in enumerate(self._past)}

    def _store(self, group: list[Generation], cache: list[np.ndarray], past: int, width: int) -> None:
        """Put the prompts' full blocks into the prefix cache (those already there are only marked used).
        In the presents of a prefill with `past` cached and `width` new columns, prompt position p of a row that
        computed n tokens is column p when cached (p < past), else p + width - n (its padding comes first)."""
        if not self.prefix_cache.enabled:
            return
        for i, g in enumerate(group):
            gap = width - (g.prompt.size - past)

            def block(j: int, i: int = i, gap: int = gap) -> np.ndarray:
                # A cached block is normally present already; it is stored again from here when it was evicted
                # after this prompt looked it up (by an earlier group's blocks).
                start = j * BLOCK_TOKENS + (gap if j * BLOCK_TOKENS >= past else 0)
                return np.stack([a[i, :, start:start + BLOCK_TOKENS] for a in cache])

            self.prefix_cache.insert(g._keys or [], block)

    def _decode(self, batch: _Batch) -> None:
        rows = len(batch)
        mask = np.concatenate([batch.mask, np.ones((rows, 1), np.int64)], axis=1)
        inputs = {"input_ids": np.array([[g._next] for g in batch.rows], np.int64),
                  "position_ids": np.array([[g._length] for g in batch.rows], np.int64),
                  "attention_mask": mask, **dict(zip(self._past, batch.cache))}
        start = time.perf_counter_ns()
        try:
            outputs = self._run_fn(inputs)
        except Exception as exc:  # noqa: BLE001 - a failed step leaves no usable cache: fail its sequences
            log.warning("decode step of %d sequences failed: %s", rows, exc)
            self._fail(batch.rows, GenerationFailed(f"decode step failed: {exc}"))
            batch.clear()
            return
        end = time.perf_counter_ns()
        if self._on_step:
            self._on_step(rows, end - start)
        batch.cache = [outputs[name] for name in self._present]
        batch.mask = mask
        kept = []
        for i, g in enumerate(batch.rows):
            g._credit += 1
            if g._credit >= g.factor:
                g._credit -= g.factor
                g._length += 1
                kept.append(i)
        token_ids = outputs["logits"].argmax(axis=-1)
        if len(kept) < rows:
            self._throw_away(batch, sorted(set(range(rows)).difference(kept)))
            token_ids = token_ids[kept]
        self._emit([batch.rows[i] for i in kept], token_ids, end)

    @staticmethod
    def _throw_away(batch: _Batch, rows: list[int]) -> None:
        """Undo the last step for `rows` (their cost factor's extra runs): each row's new last column goes, the row
        shifts right by one with a padding column coming in on the left; then leading columns no row attends are cut."""
        index = np.array(rows)
        for a in batch.cache:  # [rows, heads, T, head_dim]
            a[index, :, 1:] = a[index, :, :-1]
            a[index, :, 0] = 0
        batch.mask[index, 1:] = batch.mask[index, :-1]
        batch.mask[index, 0] = 0
        first = int(np.argmax(batch.mask.any(axis=0)))
        if first:
            batch.mask = np.ascontiguousarray(batch.mask[:, first:])
            batch.cache = [np.ascontiguousarray(a[:, :, first:]) for a in batch.cache]

    def _emit(self, rows: list[Generation], token_ids: np.ndarray, now_ns: int) -> None:
        """Record one new token per row and hand them to their event loops, one wake-up per loop."""
        if self._on_tokens and rows:
            self._on_tokens(len(rows))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for g, token_id in zip(rows, token_ids.tolist()):
            g.generated += 1
            g._next = token_id
            if g.generated == 1:
                g.first_token_ns = now_ns
            g.last_token_ns = now_ns
            items = by_loop.setdefault(g._loop, [])
            items.append((g._events, Token(token_id, now_ns)))
            if g.finished:
                items.append((g._events, _END))
        self._post(by_loop)

    def _fail(self, rows: list[Generation], error: GenerationFailed) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for g in rows:
            by_loop.setdefault(g._loop, []).append((g._events, error))
        self._post(by_loop)

    @staticmethod
    def _post(by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]]) -> None:
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass


def warm_up(run: RunFn, config: DecoderConfig) -> None:
    """One small prefill and one decode step, so the first request does not pay for ONNX Runtime's first runs."""
    ids = np.arange(8, dtype=np.int64)[None]
    outputs = run({"input_ids": ids, "position_ids": ids, "attention_mask": np.ones_like(ids),
                   **empty_cache(config, 1)})
    past = present_names(config.layers)
    run({"input_ids": np.zeros((1, 1), np.int64), "position_ids": np.full((1, 1), 8, np.int64),
         "attention_mask": np.ones((1, 9), np.int64),
         **{name: outputs[p] for name, p in zip(past_names(config.layers), past)}})
