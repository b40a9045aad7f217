"""Dynamic batching: merge requests from many connections into one backend run.

Independent of any front end: anything holding an asyncio loop calls `await batcher.submit(inputs)`.
Requests wait on a bounded queue (full -> `Overloaded` at once, never an unbounded backlog); one
inference thread per model instance takes the oldest request, gathers compatible ones that arrive
within `max_queue_delay_us` of it (up to `max_batch_size` rows), pads token inputs to the longest
sequence in the batch, runs the backend once and hands each request its slice.

Which requests are compatible comes from the model signature:
- the batch axis is the symbolic dimension every input and output starts with; a model without one
  runs each request alone;
- token inputs are padded only when the model has an `attention_mask` input: then every 2-D input
  sharing its sequence dimension is padded with 0 (mask 0 = ignored, the Hugging Face convention),
  requests are bucketed by power-of-two sequence length so a 16-token request never pays for a
  512-token neighbour, and outputs with that sequence dimension are cut back to each request's length;
- every other input must match exactly beyond the batch axis to share a batch.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable

import numpy as np

from reference_server.signature import Signature

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
BatchObserver = Callable[[int, int], None]
"""Called from the inference thread after each backend run with (rows in the batch, compute ns)."""

MASK_INPUT = "attention_mask"


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
                 max_queue: int, on_batch: BatchObserver | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_queue_delay_us < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_queue_delay_us >= 0")
        self._run_fn = run
        self._on_batch = on_batch
        self._batchable = signature.batch_dim is not None
        self.max_rows = max_batch_size if self._batchable else 1
        self._delay_ns = max_queue_delay_us * 1000
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
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
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            raise Overloaded(f"queue full ({self._queue.maxsize} requests waiting)") from None
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

    def _loop(self) -> None:
        held: deque[_Pending] = deque()  # taken off the queue but not compatible with the batch being formed
        stopping = False
        while held or not stopping:
            first = held.popleft() if held else self._queue.get()
            if first is _STOP:
                stopping = True
                continue
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
                elif p.key == first.key and rows + p.rows <= self.max_rows:
                    batch.append(p)
                    rows += p.rows
                else:
                    held.append(p)
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
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
