"""Continuous batching for the decoder: every active sequence advances by one token per decode step.

Same shape as batcher.py: the asyncio front end calls `generator.submit(prompt_ids, max_tokens)` (no
await; a full waiting queue raises `Overloaded` at once) and reads tokens from the returned
`Generation`; one inference thread owns the model and the KV caches and hands each step's tokens to the
requests' event loops with one `loop.call_soon_threadsafe` per loop as soon as they exist.

The inference thread loops; one pass is one *iteration*:
1. plan this iteration's prefill, at most `max_prefill_tokens` prompt tokens computed (the budget): first the
   next chunk of a prompt whose prefill is under way, then waiting requests while there are free sequence
   slots (`max_sequences`) and their tokens to compute fit the budget left. A prompt that does not fit is
   admitted only when nothing else is planned, and then computes its first `max_prefill_tokens` tokens
   (a *chunk*); the rest follows in later iterations, one chunk each, so the streams already decoding get
   a token between any two chunks. With a prefix cache (prefix_cache.py) each admitted prompt takes its
   longest cached prefix of full blocks, always leaving at least its last token to compute;
2. prefill the planned chunks, several at once when they can share a run: a group shares its past (the
   cached blocks, or the keys and values of its earlier chunks) width, so the pasts stack into one tensor,
   and the power-of-two bucket of its tokens to compute, which are left-padded; positions continue where
   the row's past ends. A prompt's last chunk yields its sequence's first token, then its full blocks go
   into the prefix cache;
3. merge the prompts that finished prefilling into the decode batch, then run one decode step for every
   active sequence together (the decode step graph, decoder.py: each row's cache updated in place).
A sequence leaves the batch when it has `max_tokens` tokens (greedy argmax; there is no end-of-sequence
token, so every answer is exactly max_tokens long) or when its client cancels it.

Chunking changes no token: a chunk attends to its row's past exactly as a prefill with a cached prefix does
(below), so a prompt prefilled in chunks gets the tokens it gets in one run. What it bounds is the stall: a
decode step waits for at most one iteration's prefill, `max_prefill_tokens` tokens, however long the prompt.

Cost factors (named adapters, `--adapter NAME=FACTOR`): a sequence submitted with `factor` f >= 1 costs f
model runs per token. It carries a credit: every run it takes part in adds 1, and a run's result is kept
only when the credit reaches f (then f is taken off); the other runs are computed and thrown away. So each
chunk of its prompt's prefill runs ceil(f) times back to back (its group holds only sequences of the same
factor), and in the decode batch it keeps one step's result in f on average (exactly every f-th step for a
whole f; 1.5: steps 1, 3, 4, 6, ... after a prefill that left 0.5): its time per token is f times the step
time of the batch it decodes in, while the other rows still get a token every step. A thrown-away step leaves
the row's length as it was, so the key and value it wrote after the row's tokens are overwritten by the next.

KV cache layout. A prefill run (the prefill graph) gives per layer one key and one value array [rows, heads,
T, head_dim] and an attention mask [rows, T]; every row is **left-padded**: its real tokens are its last
columns (but for the gaps below), the columns before are padding with mask 0. When a prompt's prefill is
complete its row joins the decode batch (kv_batch.py), which keeps each row's tokens compactly, in position
order, in the first `length` columns of reused arrays [rows, heads, capacity, head_dim]; a decode step (the
decode step graph) writes each row's new key and value at column `length` in place and attends to that row's
own columns only, so rows of different lengths cost what they hold, not the longest row's width.
Positions are per row (0 … length-1), so padding never shifts them, and the graph's last-position
logits are each row's own.
A prefill with a past (cached blocks, earlier chunks) feeds it as past and the rest of the chunk as new
tokens (positions from the past's token count on); in a group whose rows compute different numbers of
tokens, a shorter row comes out as [past][padding][new] and keeps that gap while it prefills its next chunk
and decodes: attention does not depend on the order of the columns (positions travel in the keys), and
masked columns get exactly zero weight (exp of -1e9 underflows), so cached or not, chunked or not, padded or
not, a sequence gets the same tokens. A prompt's token at position p is in the p-th attended column of its
row, which is where its prefix-cache blocks are read from, and where the decode batch takes its keys from.
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
from reference_server.kv_batch import DecodeBatch
from reference_server.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys, usable_blocks

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
RunIntoFn = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], dict[str, np.ndarray]]
"""Like RunFn, but writes the outputs named in its second argument into those arrays; returns the others. The
decode step graph's (decoder.py), its presents bound to the very arrays fed as its pasts."""
PrefillObserver = Callable[[int, int, int], None]
"""Called from the inference thread after each prefill run with (rows, padded tokens, compute ns)."""
StepObserver = Callable[[int, int], None]
"""Called from the inference thread after each decode step with (rows, compute ns)."""
PromptObserver = Callable[[int, int], None]
"""Called from the inference thread after each prefill run with (prompt tokens, of which taken from the cache)."""
TokenObserver = Callable[[int], None]
"""Called from the inference thread with the number of tokens each prefill or decode step handed out (a cost
factor's thrown-away runs hand out none)."""

# Prompt tokens computed between two decode steps, a longer prompt in chunks: the Generator's default; the server
# passes --max-prefill-tokens (config.py), much smaller, so that a long prompt stalls running streams one chunk.
MAX_PREFILL_TOKENS = 4096


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
        self.prefill_start_ns = 0  # the start of its first prefill run (chunk)
        self.prefill_ns = 0  # start of its first prefill run to the end of its last (steps between chunks too)
        self.prefill_rows = 0  # sequences in its last prefill run
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
        # A prefill under way (chunks): prompt tokens whose keys and values exist (cached or computed), and those
        # keys and values (past_names order, [1, heads, W, head_dim]) with their mask [1, W]; None before the first.
        self._done = 0
        self._kv: list[np.ndarray] | None = None
        self._kv_mask: np.ndarray | None = None

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


def _active(g: Generation) -> bool:
    return not g.cancelled and not g.finished


def _past_width(g: Generation) -> int:
    """Columns of the past a prefill of g's next chunk feeds: its earlier chunks', else its cached blocks'."""
    return g.cached_tokens if g._kv_mask is None else g._kv_mask.shape[1]


class Generator:
    def __init__(self, run: RunFn, step: RunIntoFn, config: DecoderConfig, *, max_sequences: int, max_waiting: int,
                 max_prefill_tokens: int = MAX_PREFILL_TOKENS, on_prefill: PrefillObserver | None = None,
                 on_step: StepObserver | None = None, prefix_cache: PrefixCache | None = None,
                 on_prompt: PromptObserver | None = None, on_tokens: TokenObserver | None = None) -> None:
        """`run`: the prefill graph's; `step`: the decode step graph's, run in place (decoder.py)."""
        if max_sequences < 1 or max_waiting < 1 or max_prefill_tokens < 1:
            raise ValueError("max_sequences, max_waiting and max_prefill_tokens must be >= 1")
        self._run_fn = run
        self._step = step
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
        self._partial: list[Generation] = []  # admitted, prefill under way (chunks); owned by the inference thread
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
        cfg = self.config
        batch = DecodeBatch(cfg.layers, cfg.heads, cfg.head_dim, self.max_sequences, cfg.max_context)
        try:
            while True:
                planned = self._plan(len(batch))
                if planned is None:
                    break
                for group in self._groups(planned):
                    self._prefill(group, batch)
                self._partial = [g for g in self._partial if g._kv is not None and not g.cancelled]
                batch.retain(_active)
                self._active = len(batch) + len(self._partial)
                if batch:
                    self._decode(batch)
                    batch.retain(_active)
                    self._active = len(batch) + len(self._partial)
        except Exception:  # noqa: BLE001 - a bug here must not leave requests waiting forever
            log.exception("generation loop failed")
        finally:
            with self._cond:
                self._stopping = True
                left = list(self._waiting) + batch.rows + self._partial
                self._waiting.clear()
            self._active = 0
            self._fail(left, GenerationFailed("server is shutting down"))

    def _plan(self, active: int) -> list[tuple[Generation, int]] | None:
        """This iteration's prefill chunks (sequence, tokens to compute), at most `max_prefill_tokens` tokens:
        the prompts under way first, then waiting ones (blocks while nothing is active and nothing waits);
        None: stop."""
        with self._cond:
            while not active and not self._partial and not self._waiting and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            budget = self.max_prefill_tokens
            planned: list[tuple[Generation, int]] = []
            for g in self._partial:
                if budget and not g.cancelled:
                    n = min(g.prompt.size - g._done, budget)
                    planned.append((g, n))
                    budget -= n
            while self._waiting and budget and active + len(self._partial) < self.max_sequences:
                head = self._waiting[0]
                if head.cancelled:
                    self._waiting.popleft()
                    continue
                self._look_up(head)  # under the lock: hashing once (~50 us for 1024 tokens), then a dict walk
                todo = head.prompt.size - head.cached_tokens
                if planned and todo > budget:  # not split while other work is planned: it may fit whole next time
                    head._hit, head.cached_tokens = [], 0  # looked up again when its turn comes
                    break
                self._waiting.popleft()
                head._done = head.cached_tokens
                planned.append((head, min(todo, budget)))
                budget -= planned[-1][1]
                self._partial.append(head)  # until its last chunk is computed (_loop drops it then)
            return planned

    def _look_up(self, g: Generation) -> None:
        """Take the longest cached prefix of g's prompt, in full blocks, leaving at least one token to compute."""
        if not self.prefix_cache.enabled:
            return
        if g._keys is None:
            g._keys = block_keys(g.prompt, g.cache_salt)
        g._hit = self.prefix_cache.lookup(g._keys, usable_blocks(g.prompt.size))
        g.cached_tokens = len(g._hit) * BLOCK_TOKENS

    @staticmethod
    def _groups(planned: list[tuple[Generation, int]]) -> list[list[tuple[Generation, int]]]:
        """Prefill groups: same past width (cached blocks or earlier chunks, so the pasts stack), same
        power-of-two bucket of tokens to compute, so a short prompt never pays for a long one, and same cost
        factor (the group's run is repeated for it); shortest first."""
        groups: dict[tuple[int, int, float], list[tuple[Generation, int]]] = {}
        for g, n in planned:
            groups.setdefault((_bucket(n), _past_width(g), g.factor), []).append((g, n))
        return [groups[k] for k in sorted(groups)]

    def _prefill(self, group: list[tuple[Generation, int]], batch: DecodeBatch) -> None:
        """One prefill run (ceil(factor) runs) of the group's chunks; rows whose prompt is then complete get their
        first token, store their blocks and join the decode batch, the others keep their keys and values."""
        rows, past = len(group), _past_width(group[0][0])  # the group shares its past width (_groups)
        width = max(n for _, n in group)
        ids = np.zeros((rows, width), np.int64)
        positions = np.zeros((rows, width), np.int64)
        mask = np.zeros((rows, past + width), np.int64)
        for i, (g, n) in enumerate(group):  # left-pad the new tokens: real ones in the last columns
            ids[i, width - n:] = g.prompt[g._done:g._done + n]
            positions[i, width - n:] = np.arange(g._done, g._done + n)
            mask[i, :past] = 1 if g._kv_mask is None else g._kv_mask[0]
            mask[i, past + width - n:] = 1
        start = time.perf_counter_ns()  # the prefill includes gathering the cached blocks, which costs a copy
        inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": mask,
                  **self._past_inputs([g for g, _ in group], past)}
        for g, _ in group:
            if not g.prefill_start_ns:
                g.prefill_start_ns = start
        factor = group[0][0].factor
        runs = math.ceil(factor)  # a cost factor's extra runs are thrown away; the last one is kept
        run_start = start  # the first run's time includes gathering the cached blocks, as it always did
        for _ in range(runs):
            try:
                outputs = self._run_fn(inputs)
            except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving the others
                log.warning("prefill of %d sequences failed: %s", rows, exc)
                for g, _ in group:
                    g._kv = None  # _loop drops it from the prefills under way
                self._fail([g for g, _ in group], GenerationFailed(f"prefill failed: {exc}"))
                return
            end = time.perf_counter_ns()
            if self._on_prefill:
                self._on_prefill(rows, rows * width, end - run_start)
            run_start = end
        cache = [outputs[name] for name in self._present]
        done: list[int] = []
        for i, (g, n) in enumerate(group):
            g._done += n
            g._hit = []
            if g._done < g.prompt.size:  # more chunks to come: keep this row's keys and values (views)
                g._kv, g._kv_mask = [a[i:i + 1] for a in cache], mask[i:i + 1]
                continue
            done.append(i)
            g._kv = g._kv_mask = None
            g.prefill_ns, g.prefill_rows, g._length = end - g.prefill_start_ns, rows, g.prompt.size
            g._credit = runs - factor
        if not done:
            return
        finished = [group[i][0] for i in done]
        if self._on_prompt:
            self._on_prompt(sum(g.prompt.size for g in finished), sum(g.cached_tokens for g in finished))
        token_ids = outputs["logits"].argmax(axis=-1)
        self._emit(finished, token_ids if len(done) == rows else token_ids[done], end)
        self._store(finished, done, cache, mask)
        keep = [i for i in done if _active(group[i][0])]
        if len(keep) == rows:
            batch.add(finished, cache, mask)
        elif keep:
            index = np.array(keep)
            batch.add([group[i][0] for i in keep], [a[index] for a in cache], mask[index])

    def _past_inputs(self, group: list[Generation], past: int) -> dict[str, np.ndarray]:
        """The past_* inputs of a prefill: the rows' earlier chunks or cached blocks side by side (all `past` wide)."""
        if not past:
            return empty_cache(self.config, len(group))
        if len(group) == 1 and group[0]._kv is not None:  # one prompt's next chunk: its arrays as they are
            return dict(zip(self._past, group[0]._kv))
        cfg = self.config
        stacked = np.empty((len(self._past), len(group), cfg.heads, past, cfg.head_dim), np.float32)
        for i, g in enumerate(group):
            if g._kv is not None:
                for k, a in enumerate(g._kv):
                    stacked[k, i] = a[0]
                continue
            for j, block in enumerate(g._hit):  # block: [2 * layers, heads, BLOCK_TOKENS, head_dim]
                stacked[:, i, :, j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS] = block
        return {name: stacked[k] for k, name in enumerate(self._past)}

    def _store(self, finished: list[Generation], rows: list[int], cache: list[np.ndarray], mask: np.ndarray) -> None:
        """Put the finished prompts' full blocks into the prefix cache (those already there are only marked used).
        Prompt position p of row i is its p-th attended column (the mask's p-th 1: cached, chunks and gaps alike)."""
        if not self.prefix_cache.enabled:
            return
        for g, i in zip(finished, rows):
            columns = np.flatnonzero(mask[i])

            def block(j: int, i: int = i, columns: np.ndarray = columns) -> np.ndarray:
                # A cached block is normally present already; it is stored again from here when it was evicted
                # after this prompt looked it up (by an earlier group's blocks).
                c = columns[j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS]
                part = slice(c[0], c[0] + BLOCK_TOKENS) if c[-1] - c[0] == BLOCK_TOKENS - 1 else c
                return np.stack([a[i, :, part] for a in cache])

            self.prefix_cache.insert(g._keys or [], block)

    def _decode(self, batch: DecodeBatch) -> None:
        rows, lengths = len(batch), batch.lengths()
        total = int(lengths.max()) + 1  # the longest row with its new token
        batch.reserve(total)
        cache = batch.cache()
        inputs = {"input_ids": np.array([[g._next] for g in batch.rows], np.int64),
                  "position_ids": lengths[:, None].astype(np.int64), "seqlens_k": lengths,
                  "total_sequence_length": np.array(total, np.int32), **dict(zip(self._past, cache))}
        start = time.perf_counter_ns()
        try:
            logits = self._step(inputs, dict(zip(self._present, cache)))["logits"]
        except Exception as exc:  # noqa: BLE001 - fail these sequences, keep serving the others
            log.warning("decode step of %d sequences failed: %s", rows, exc)
            self._fail(batch.rows, GenerationFailed(f"decode step failed: {exc}"))
            batch.rows.clear()
            return
        end = time.perf_counter_ns()
        if self._on_step:
            self._on_step(rows, end - start)
        kept = []
        for i, g in enumerate(batch.rows):
            g._credit += 1
            if g._credit >= g.factor:  # else the step is thrown away: the row's length stays (module docstring)
                g._credit -= g.factor
                g._length += 1
                kept.append(i)
        token_ids = logits.argmax(axis=-1)
        if len(kept) < rows:
            token_ids = token_ids[kept]
        self._emit([batch.rows[i] for i in kept], token_ids, end)

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


def warm_up(run: RunFn, step: RunIntoFn, config: DecoderConfig) -> None:
    """One small prefill and one decode step, so the first request does not pay for ONNX Runtime's first runs."""
    ids = np.arange(8, dtype=np.int64)[None]
    run({"input_ids": ids, "position_ids": ids, "attention_mask": np.ones_like(ids), **empty_cache(config, 1)})
    cache = [np.zeros((1, config.heads, 16, config.head_dim), np.float32) for _ in past_names(config.layers)]
    step({"input_ids": np.zeros((1, 1), np.int64), "position_ids": np.full((1, 1), 8, np.int64),
          "seqlens_k": np.array([8], np.int32), "total_sequence_length": np.array(9, np.int32),
          **dict(zip(past_names(config.layers), cache))}, dict(zip(present_names(config.layers), cache)))
