"""Dynamic batching: merge requests from many connections into one backend run.

Independent of any front end: anything holding an asyncio loop calls `await batcher.submit(inputs)`.
Requests wait on a bounded queue (full -> `Overloaded` at once, never an unbounded backlog); one
inference thread per model instance takes the oldest request, gathers compatible ones that arrive
within `max_queue_delay_us` of it (up to `max_batch_size` rows), lets the batch policy (below) choose
how many of them run now, pads token inputs to the longest sequence in the batch, runs the backend once
and hands each request its slice.

Which requests are compatible comes from the model signature:
- the batch axis is the symbolic dimension every input and output starts with; a model without one
  runs each request alone;
- token inputs are padded only when the model has an `attention_mask` input: then every 2-D input
  sharing its sequence dimension is padded with 0 (mask 0 = ignored, the Hugging Face convention),
  requests are bucketed by power-of-two sequence length so a 16-token request never pays for a
  512-token neighbour, and outputs with that sequence dimension are cut back to each request's length;
- every other input must match exactly beyond the batch axis to share a batch.

Which of the gathered requests the next run takes is the batch policy (`batch_policy`):
- "all": every one of them (up to `max_batch_size` rows). Right where a row costs little next to a run
  (8 tokens on a CPU: c(1) = 3.4 ms, c(12) = 22.4 ms), wrong where rows cost nearly their own run
  (32 tokens: c(2) = 15.0 ms against c(1) = 8.3 ms, so a pair delays its first request by 6.7 ms to save
  its second 1.6 ms);
- "cost" (the default): with n compatible requests gathered, oldest first, r_i rows each and
  R_j = r_1 + ... + r_j, the run takes the first j, j in 1..n minimising

      cost(j) = n*c(R_j) + (n - j)*c(R_n - R_j) + lambda*M^2 / (2*(1 - rho)),
      M = c(R_j) + c(R_n - R_j),   c(0) = 0,   rho = min(lambda*c(R_n)/n, RHO_MAX)

  (ties to the larger j): for the plan "the first j now, the other n - j next as one batch", the sum over
  the n requests of their time from now to their results (all n wait for the first run, the n - j for
  the second as well), plus what the plan's makespan M costs the requests that arrive during it at rate
  lambda: Poisson arrivals at t in [0, M] wait M - t for the model, lambda*M^2/2 in all, and each one's
  wait is passed on to the requests queueing behind it until the model is next idle, 1/(1 - rho) of them
  on average (an M/G/1 busy period opened by one request holds 1/(1 - rho) requests), rho the load at
  this batch's cost per request. With lambda = 0 and two one-row requests it batches the pair iff
  c(2) < 1.5*c(1). Without the 1/(1 - rho), near capacity it split queues that batching all serves
  better (8 tokens, 500 req/s, simulated with the costs above: p99 74 ms against 68.5 ms).
  The requests not taken stay first in line: they rejoin the held ones (taken off the queue, not yet
  run) in enqueue order, so the next run starts with the oldest request of all (FIFO).
  c(b) = max(alpha + beta*b, COST_FLOOR_S), a line per compatibility key (so per power-of-two length
  bucket) fitted by exponentially weighted least squares to (b, t) of that key's runs: b the rows, t the
  seconds the inference thread spent on the run (assembly, backend, split, hand-over: what the requests
  behind it wait for). Each run's weight halves with every HALF_LIFE_RUNS later runs of its key; with
  S = sum(w), X = sum(w*b), Y = sum(w*t), XX = sum(w*b^2), XY = sum(w*b*t) and D = S*XX - X^2,
  beta = (S*XY - X*Y)/D and alpha = (Y - beta*X)/S. A key has no line until its runs span two batch sizes
  (D > MIN_SPREAD*S^2, the weighted variance of b): until then it batches all, which explores. Once it has
  one, every EXPLORE_EVERY-th decision in a row that ran a single request of several waiting batches all
  anyway, so that a line that stopped batching sees batches again and recovers if it was wrong.
  lambda = sum(exp(-(now - t_i)/RATE_TAU_S))/RATE_TAU_S over the enqueue times t_i of the key's requests:
  a decaying count, an unbiased estimate of a steady Poisson rate (relative sd 1/sqrt(2*lambda*tau)) that
  falls to 0 when arrivals stop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from reference_server.signature import Signature

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
BatchObserver = Callable[[int, int], None]
"""Called from the inference thread after each backend run with (rows in the batch, compute ns)."""

MASK_INPUT = "attention_mask"

POLICIES = ("cost", "all")
# A run's weight in its key's cost line halves with every this many later runs of the key. Short enough
# to follow drift within a second at a few hundred runs per second (the box's other load comes and goes),
# long enough to average: the line rests on ~2*64/ln 2 = 185 runs' worth of weight.
HALF_LIFE_RUNS = 64
_DECAY = 0.5 ** (1 / HALF_LIFE_RUNS)
# Once the policy runs single requests though several wait, every EXPLORE_EVERY-th such decision in a row
# batches all anyway, so that a line gone stale (it stopped batching and then sees only single runs) gets
# a batch to learn from. 64: an exploration delays at most one request by c(2) - c(1) (6.7 ms at 32
# tokens), so at most 1 in 64 of the requests that queued behind another pays for it: under 1 %, below
# the p99, while a wrong line is corrected within 64 decisions that could have batched.
EXPLORE_EVERY = 64
# Time constant of the arrival-rate estimate: it counts ~10 arrivals at 10 req/s (the lowest fixed rate
# the benchmarks hold; relative sd 1/sqrt(2*rate*tau) = 22 %) and follows a rate step within ~1 s.
RATE_TAU_S = 1.0
COST_FLOOR_S = 1e-6  # c(b) never below 1 us: under any real run, and keeps every cost positive
MIN_SPREAD = 1e-6  # weighted variance of the batch sizes below which a key has no line (one size only)
RHO_MAX = 0.95  # load cap in the busy-period factor 1/(1 - rho): at or past capacity, 20 (makespan rules)
MAX_KEYS = 256  # compatibility keys the cost policy remembers (a generic model's shapes are the clients')


class Overloaded(Exception):
    """The queue is full (or the batcher is stopping): the caller should retry later."""


class RequestTooLarge(ValueError):
    """A single request has more rows than the batcher may ever run at once."""


class InferenceFailed(RuntimeError):
    """The backend raised while running this request on its own."""


@dataclass
class BatchResult:
    outputs: dict[str, np.ndarray]
    queue_ns: int  # enqueue -> backend run start (includes batch formation and padding)
    compute_ns: int  # the backend run of the whole batch
    batch_size: int  # rows in that run


@dataclass(eq=False)
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    seq: int | None
    key: Hashable
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)


_STOP = object()


def _age(p: _Pending) -> int:
    return p.enqueued_ns


def choose_first_batch(rows: Sequence[int], cost: Callable[[int], float], rate: float) -> int:
    """How many of the n waiting requests (`rows` of each, oldest first) the next run should take: the j in
    1..n minimising n*c(R_j) + (n-j)*c(R_n - R_j) + rate*M^2/(2*(1 - rho)), M = c(R_j) + c(R_n - R_j),
    rho = min(rate*c(R_n)/n, RHO_MAX) (module docstring); ties go to the larger j. `cost(b)` > 0 for b > 0,
    in the unit of 1/`rate`. O(n)."""
    n = len(rows)
    total = sum(rows)
    arrivals = rate / (2 * (1 - min(rate * cost(total) / n, RHO_MAX)))
    best_j, best = n, math.inf
    taken = 0
    for j in range(1, n + 1):
        taken += rows[j - 1]
        first = cost(taken)
        rest = cost(total - taken) if j < n else 0.0
        makespan = first + rest
        value = n * first + (n - j) * rest + arrivals * makespan * makespan
        if value <= best:
            best, best_j = value, j
    return best_j


class CostLine:
    """c(b) = alpha + beta*b by exponentially weighted least squares over (rows, seconds) of runs: five
    decayed sums, O(1) per run, so the line follows drift (module docstring)."""

    __slots__ = ("s", "x", "y", "xx", "xy")

    def __init__(self) -> None:
        self.s = self.x = self.y = self.xx = self.xy = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        d = _DECAY
        self.s = self.s * d + 1.0
        self.x = self.x * d + rows
        self.y = self.y * d + seconds
        self.xx = self.xx * d + rows * rows
        self.xy = self.xy * d + rows * seconds

    def fit(self) -> tuple[float, float] | None:
        """(alpha, beta), or None until the runs span two batch sizes."""
        s, x = self.s, self.x
        spread = s * self.xx - x * x
        if s == 0.0 or spread <= MIN_SPREAD * s * s:
            return None
        beta = (s * self.xy - x * self.y) / spread
        return (self.y - beta * x) / s, beta


class ArrivalRate:
    """Arrivals per second: a count decaying with time constant RATE_TAU_S (module docstring). Unlike an
    EWMA of inter-arrival gaps it is unbiased (a gap-weighted mean over-weights the long gaps) and falls to
    0 when arrivals stop, rather than keeping the last rate until the next arrival."""

    __slots__ = ("count", "last_ns")

    def __init__(self) -> None:
        self.count = 0.0
        self.last_ns = 0

    def arrive(self, at_ns: int) -> None:
        if self.count and at_ns > self.last_ns:
            self.count *= math.exp((self.last_ns - at_ns) / (RATE_TAU_S * 1e9))
        self.count += 1.0
        self.last_ns = max(self.last_ns, at_ns)

    def rate(self, now_ns: int) -> float:
        return self.count * math.exp(min(self.last_ns - now_ns, 0) / (RATE_TAU_S * 1e9)) / RATE_TAU_S


class _KeyCosts:
    """What the cost policy knows about one compatibility key."""

    __slots__ = ("line", "arrivals", "singles")

    def __init__(self) -> None:
        self.line = CostLine()
        self.arrivals = ArrivalRate()
        self.singles = 0  # decisions in a row that ran one request though several waited


def _bucket(length: int) -> int:
    """Smallest power of two >= length: requests in one bucket are at most 2x apart in length."""
    return 1 << max(length - 1, 0).bit_length()


def _settle_all(settled: list[tuple[asyncio.Future, BatchResult | BaseException]]) -> None:
    for future, value in settled:
        if future.done():  # the caller went away (cancelled)
            continue
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)


class Batcher:
    def __init__(self, run: RunFn, signature: Signature, *, max_batch_size: int, max_queue_delay_us: int,
                 max_queue: int, on_batch: BatchObserver | None = None, batch_policy: str = "cost") -> None:
        if max_batch_size < 1 or max_queue < 1 or max_queue_delay_us < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_queue_delay_us >= 0")
        if batch_policy not in POLICIES:
            raise ValueError(f"batch_policy must be one of {POLICIES}, not {batch_policy!r}")
        self._run_fn = run
        self._on_batch = on_batch
        self._batchable = signature.batch_dim is not None
        self.max_rows = max_batch_size if self._batchable else 1
        self._delay_ns = max_queue_delay_us * 1000
        self.batch_policy = batch_policy
        self._by_cost = batch_policy == "cost" and self.max_rows > 1
        self._keys: dict[Hashable, _KeyCosts] = {}  # the cost policy's per-key state; inference thread only
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # C-level put/get: no Python lock work per request
        self._max_queue = max_queue
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="inference-0", daemon=True)

        mask = signature.input(MASK_INPUT)
        seq_dim = mask.dims[1] if self._batchable and mask and len(mask.dims) == 2 else None
        if not isinstance(seq_dim, str):
            seq_dim = None
        self._pad_inputs = {t.name for t in signature.inputs
                            if seq_dim and len(t.dims) == 2 and t.dims[1] == seq_dim}
        self._cut_outputs = {t.name for t in signature.outputs
                             if seq_dim and len(t.dims) >= 2 and t.dims[1] == seq_dim}
        if not self._batchable and max_batch_size > 1:
            log.info("batching off: the model's inputs and outputs do not share a variable batch axis")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish every request already queued, then end the inference thread. Blocks."""
        self._stopping = True
        self._queue.put(_STOP)
        self._thread.join()

    def depth(self) -> int:
        """Requests waiting in the queue (not yet taken by the inference thread)."""
        return self._queue.qsize()

    async def submit(self, inputs: dict[str, np.ndarray]) -> BatchResult:
        """Queue one request (every array with the batch axis first) and wait for its outputs.

        Raises Overloaded when the queue is full, RequestTooLarge when it has more rows than a batch."""
        pending = self._pending(inputs)
        if self._stopping:
            raise Overloaded("server is shutting down")
        if self._queue.qsize() >= self._max_queue:
            raise Overloaded(f"queue full ({self._max_queue} requests waiting)")
        self._queue.put(pending)
        return await pending.future

    def _pending(self, inputs: dict[str, np.ndarray]) -> _Pending:
        any_input = next(iter(inputs.values()))
        rows = any_input.shape[0] if self._batchable else 1
        if rows > self.max_rows:
            raise RequestTooLarge(f"request has batch size {rows}; this server runs at most {self.max_rows} "
                                  f"rows per batch (--max-batch-size): split the request")
        seq = inputs[MASK_INPUT].shape[1] if self._pad_inputs else None
        key = tuple(sorted(
            (name, (_bucket(a.shape[1]),) if name in self._pad_inputs else a.shape[1:])
            for name, a in inputs.items()))
        loop = asyncio.get_running_loop()
        return _Pending(inputs, rows, seq, key, loop.create_future(), loop)

    def cost_lines(self) -> dict[Hashable, tuple[float, float] | None]:
        """Per compatibility key, the cost policy's (c(1), slope) in seconds, None before it has a line."""
        lines = {}
        for key, state in list(self._keys.items()):
            fit = state.line.fit()
            lines[key] = None if fit is None else (max(fit[0] + fit[1], COST_FLOOR_S), fit[1])
        return lines

    def _costs(self, key: Hashable) -> _KeyCosts:
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= MAX_KEYS:
                del self._keys[next(iter(self._keys))]  # the longest-known key
            state = self._keys[key] = _KeyCosts()
        return state

    def _arrived(self, p: _Pending) -> None:
        if self._by_cost:
            self._costs(p.key).arrivals.arrive(p.enqueued_ns)

    def _take(self, batch: list[_Pending]) -> int:
        """The cost policy: how many of `batch` (compatible, oldest first, len >= 2) to run now."""
        n = len(batch)
        state = self._costs(batch[0].key)
        fit = state.line.fit()
        if fit is None:
            return n  # explore: no line yet
        alpha, beta = fit
        rows = [p.rows for p in batch]
        costs = [0.0] + [max(alpha + beta * b, COST_FLOOR_S) for b in range(1, sum(rows) + 1)]
        j = choose_first_batch(rows, costs.__getitem__, state.arrivals.rate(time.perf_counter_ns()))
        if j > 1:
            state.singles = 0
        else:
            state.singles += 1
            if state.singles >= EXPLORE_EVERY:
                state.singles = 0
                return n
        return j

    def _loop(self) -> None:
        held: deque[_Pending] = deque()  # taken off the queue, not run yet: incompatible, or not taken by the policy
        stopping = False
        while held or not stopping:
            if held:
                first = held.popleft()
            else:
                first = self._queue.get()
                if first is _STOP:
                    stopping = True
                    continue
                self._arrived(first)
            batch, rows = [first], first.rows
            for p in list(held):
                if p.key == first.key and rows + p.rows <= self.max_rows:
                    held.remove(p)
                    batch.append(p)
                    rows += p.rows
            deadline = first.enqueued_ns + self._delay_ns
            while not stopping and rows < self.max_rows and len(held) < self.max_rows:
                wait_s = (deadline - time.perf_counter_ns()) / 1e9
                try:
                    p = self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if p is _STOP:
                    stopping = True
                    continue
                self._arrived(p)
                if p.key == first.key and rows + p.rows <= self.max_rows:
                    batch.append(p)
                    rows += p.rows
                else:
                    held.append(p)
            if self._by_cost and len(batch) > 1:
                j = self._take(batch)
                if j < len(batch):  # the rest stay first in line, in enqueue order with the other held ones
                    held = deque(sorted((*batch[j:], *held), key=_age))
                    batch = batch[:j]
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
        began = time.perf_counter_ns()
        try:
            inputs = self._assemble(batch)
            start = time.perf_counter_ns()
            outputs = self._run_fn(inputs)
            compute_ns = time.perf_counter_ns() - start
            rows = sum(p.rows for p in batch)
            results = [BatchResult(own, start - p.enqueued_ns, compute_ns, rows)
                       for p, own in zip(batch, self._split(batch, outputs))]
        except Exception as exc:  # noqa: BLE001 - a failure must reach the waiting callers, not kill the thread
            if len(batch) > 1:  # isolate the request that broke the batch; its neighbours should not fail with it
                for p in batch:
                    self._run([p])
                return
            log.warning("inference failed: %s", exc)
            self._deliver(batch, [InferenceFailed(f"inference failed: {exc}")])
            return
        self._deliver(batch, results)
        if self._on_batch:
            self._on_batch(rows, compute_ns)
        if self._by_cost:
            self._costs(batch[0].key).line.observe(rows, (time.perf_counter_ns() - began) / 1e9)

    def _assemble(self, batch: list[_Pending]) -> dict[str, np.ndarray]:
        if len(batch) == 1:
            return batch[0].inputs
        longest = max(p.seq for p in batch) if self._pad_inputs else 0
        merged = {}
        for name in batch[0].inputs:
            parts = [p.inputs[name] for p in batch]
            if name in self._pad_inputs:
                parts = [np.pad(a, ((0, 0), (0, longest - a.shape[1]))) for a in parts]
            merged[name] = np.concatenate(parts)
        return merged

    def _split(self, batch: list[_Pending], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        if len(batch) == 1:
            return [outputs]
        own: list[dict[str, np.ndarray]] = []
        offset = 0
        for p in batch:
            part = {name: a[offset:offset + p.rows] for name, a in outputs.items()}
            for name in self._cut_outputs & part.keys():
                part[name] = part[name][:, :p.seq]
            own.append(part)
            offset += p.rows
        return own

    @staticmethod
    def _deliver(batch: list[_Pending], values: list[BatchResult] | list[BaseException]) -> None:
        """Hand the results to the event loop: one wake-up for the whole batch, not one per request (each
        wake-up is a write to the loop's self-pipe, and the loop and this thread then take turns at the GIL)."""
        loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, BatchResult | BaseException]]] = {}
        for p, value in zip(batch, values):
            loops.setdefault(p.loop, []).append((p.future, value))
        for loop, settled in loops.items():
            try:
                loop.call_soon_threadsafe(_settle_all, settled)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
                pass
