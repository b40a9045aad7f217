"""A worker's per-request records: the rows of requests.parquet, written in bounded batches.

intervals.py hands each sent request's outcome here with the very integer µs it gave the
histograms (`add`), so a percentile from requests.parquet is the histograms' to HDR precision;
a request cancelled at the teardown comes through `cancelled`. Rows go into one flat int64 buffer
(array.array, one `extend` a row: no object per row, and the cheapest append Python has, measured
against one append per column), and a batch leaves the event loop as that buffer, made columns by numpy: a writer thread (pyarrow encodes and compresses without the GIL) writes each as a
complete part file `<run_dir>/.requests/w<engine:03d>-<batch:06d>.parquet` (a temporary name, then
a rename: whole or absent). A batch leaves when it holds BATCH_ROWS rows, and at an interval report
once FLUSH_AFTER_NS have passed since the last, so memory stays flat whatever the run's length and a
worker that is killed loses at most that much. The run's parent merges the parts at the end
(results/requests.py `merge_parts`).

Stalls: the engine's GC pauses and event-loop lags of 1 ms or more (intervals.py
`record_generator`) are kept, the last MAX_STALLS of them, and each request gets the union of
those overlapping its [intended, end] (`stall_us`): the generator's own share of its wait. The
overlap is taken when its batch leaves (`flush`), not when the row is added: a stall is known only
once the loop runs again, and the answers it held back are read in that same loop turn, often
before the loop-lag probe reports it (a starved worker's late reads would otherwise show none).

Sampling (output.requests max_rows): past max_rows planned requests a row is kept when a hash of
(seed, row) falls below max_rows / planned (`sample_fraction`), decided per row with no
coordination between workers, so a distributed run samples the same rows whatever its machines.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from array import array
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from latscope.records import Outcome, Request
from latscope.results.requests import write_options
from latscope.results.schema import ERROR_KINDS, REQUEST_SERVER_PREFIX
from latscope.scenario import scrub, secret_values

if TYPE_CHECKING:
    from latscope.plan import Plan
    from latscope.scenario import Scenario

BATCH_ROWS = 32_768  # rows a part file holds at most (the buffers' bound)
FLUSH_AFTER_NS = 10_000_000_000  # an interval report sends what is buffered once this long has passed
QUEUED_BATCHES = 2  # batches waiting for the writer thread at most (then a flush waits: memory stays bounded)
MAX_SERVER_PARTS = 64  # Server-Timing names a worker keeps a column for (later new names are left out)
MAX_STALLS = 8_192  # the generator's recent stalls kept for `stall_us` (a 10 s batch of 10 ms probes needs 1,000)
STALL_MIN_US = 1_000  # stalls shorter than this are not kept
NULL = -(1 << 63)  # an int column's "null" in the buffers
ERRORS = (*ERROR_KINDS, "cancelled")  # the `error` column's values, by code (-1: success)
_MASK = (1 << 64) - 1

# The file's int64 times and durations, in its order (null where NULL)
TIMES = ("intended_us", "sent_us", "first_byte_us", "first_token_us", "end_us")
DURATIONS = ("latency_us", "service_us", "send_lag_us", "encode_us", "decode_us", "network_us", "ttft_us",
             "tpot_us", "itl_max_us", "client_inclusive_us")
# A buffered row, in the order `add` writes it (class, error, replica: codes; -1 none)
FIELDS = ("row", "class", "warmup", "session", "turn", *TIMES, "error", "status", "latency_us", "service_us",
          "send_lag_us", "encode_us", "decode_us", "network_us", "client_inclusive_us", "ttft_us", "tpot_us",
          "itl_max_us", "prompt_tokens", "output_tokens", "cached_tokens", "replica", "bytes_in", "bytes_out",
          "stall_us", "connection", "ttfot_us", "reasoning_tokens", "prompt_count", "output_count")
SMALL = ("class", "warmup", "turn", "error", "status", "prompt_tokens", "output_tokens", "cached_tokens", "replica",
         "connection", "reasoning_tokens", "prompt_count", "output_count")  # int32 in the file (class, error, replica,
# and the counts' sources below: dictionary codes)
PROMPT_COUNTS = ("usage", "plan")  # where prompt_tokens came from (-1: no prompt)
OUTPUT_COUNTS = ("usage", "tokenizer", "chunks")  # where output_tokens came from (-1: not counted)


def sample_fraction(scenario: Scenario, plan: Plan) -> float:
    """The share of rows kept (output.requests): 1 unless the plan's requests are more than max_rows
    (a closed-loop run plans none up front: all its rows are kept)."""
    setting = scenario.output.requests
    if setting == "off":
        return 0.0
    max_rows = getattr(setting, "max_rows", None)
    planned = int(plan.planned_requests.sum())
    return 1.0 if max_rows is None or planned <= max_rows else max_rows / planned


def kept(seed: int, row: int, fraction: float) -> bool:
    """Whether row `row` is in the sample (splitmix64 of seed and row, against the fraction)."""
    z = (seed * 0x9E3779B97F4A7C15 + row + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) < fraction * 18446744073709551616.0


class RequestLog:
    """One worker's rows, buffered by column and written as part files (the module docstring)."""

    def __init__(self, directory: str | Path, engine: int, t0_ns: int, class_names: list[str], plan_phase: np.ndarray,
                 phase_names: list[str], phase_starts_s: list[float], *, fraction: float = 1.0, seed: int = 0,
                 secrets: list[str] | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.engine, self.t0_ns = engine, t0_ns
        self.class_names, self.phase_names = class_names, phase_names
        self.plan_phase = plan_phase  # the plan's phase of each row (a session's later turns: by time)
        self.phase_starts_us = np.asarray([int(s * 1e6) for s in phase_starts_s], np.int64)
        self.fraction, self.seed = fraction, seed
        self.stalls: deque[tuple[int, int]] = deque(maxlen=MAX_STALLS)  # (start, end) ns, in end order
        self.secrets = secrets or []  # what the target said is scrubbed of them, as intervals.py does
        self.part_names: dict[str, str] = {}  # a Server-Timing name -> its column, scrubbed (MAX_SERVER_PARTS at most)
        self.rows_written = 0
        self._batch = 0
        self._flushed_ns = time.perf_counter_ns()
        self._queue: queue.Queue = queue.Queue(QUEUED_BATCHES)
        self._writer = threading.Thread(target=self._write_loop, name="latscope-request-log", daemon=True)
        self._writer.start()
        self._failure: BaseException | None = None
        self._new_buffers()

    def _new_buffers(self) -> None:
        self.n = 0
        # this batch's replica ids (a target that names a new one in every response costs one batch's worth)
        self.replicas: dict[str, int] = {}  # a replica id as the target said it -> its code in `replica_names`
        self.replica_names: list[str] = []  # scrubbed
        self.buf = array("q")  # FIELDS of each row, one after the other (one `extend` a row: the cheapest append)
        self.server: dict[str, tuple[array, array]] = {}  # part -> (rows of this batch, ms)
        self._extend = self.buf.extend

    # -- the worker's event loop -------------------------------------------------------------------

    def stall(self, duration_us: int) -> None:
        """A GC pause or loop lag of `duration_us` that just ended."""
        if duration_us >= STALL_MIN_US:
            end = time.perf_counter_ns()
            self.stalls.append((end - duration_us * 1000, end))

    def add(self, request: Request, outcome: Outcome, durations: tuple[int, int, int, int, int, int, int],
            tokens: tuple[int, int, int]) -> None:
        """One sent request's row. `durations`: latency, service, send lag, encode, decode, network and
        client-inclusive µs as the histograms got them (NULL: not recorded); `tokens`: ttft, tpot and the
        worst ITL µs, the same."""
        seq = request.seq
        if self.fraction < 1.0 and not kept(self.seed, seq, self.fraction):
            return
        t0 = self.t0_ns
        intended, end = request.intended_ns, outcome.end_ns
        session = request.session
        times = outcome.token_ns
        replica = outcome.replica
        self._extend((seq, request.cls, request.warmup, NULL if session is None else session.id, request.turn,
                      (intended - t0) // 1000, (outcome.sent_ns - t0) // 1000 if outcome.sent_ns else NULL,
                      (outcome.first_byte_ns - t0) // 1000 if outcome.first_byte_ns else NULL,
                      (times[0] - t0) // 1000 if times else NULL, (end - t0) // 1000,
                      -1 if outcome.error is None else ERRORS.index(outcome.error), outcome.status, *durations, *tokens,
                      outcome.prompt_tokens or request.prompt_tokens, outcome.output_tokens or len(times or ()),
                      outcome.cached_tokens, -1 if replica is None else self._replica(replica), outcome.bytes_in,
                      outcome.bytes_out, 0, outcome.connection,  # stall_us: at flush (the module docstring)
                      # ttfot as intervals.py records it (a success with a content chunk), the reasoning tokens
                      (outcome.content_ns - intended) // 1000 if outcome.content_ns and outcome.error is None else NULL,
                      outcome.reasoning_tokens if outcome.reasoning_tokens >= 0 else outcome.reasoning_chunks,
                      # where the token counts came from (PROMPT_COUNTS, OUTPUT_COUNTS)
                      0 if outcome.prompt_from_usage or outcome.prompt_tokens else 1 if request.prompt_tokens else -1,
                      0 if outcome.tokens_from_usage else 1 if outcome.output_by_tokenizer else 2 if times is not None else -1))
        if outcome.server_timing:
            for part, ms in outcome.server_timing.items():
                rows = self.server.get(part)
                if rows is None and (rows := self._server_part(part)) is None:
                    continue
                rows[0].append(self.n)
                rows[1].append(ms)
        self.n += 1
        if self.n >= BATCH_ROWS:
            self.flush()

    def _replica(self, replica: str) -> int:
        code = self.replicas.get(replica)
        if code is None:
            code = self.replicas[replica] = len(self.replica_names)
            self.replica_names.append(scrub(replica, self.secrets))
        return code

    def _server_part(self, part: str) -> tuple[array, array] | None:
        """This batch's buffers of a Server-Timing part (rows, ms), under its scrubbed name; None past
        MAX_SERVER_PARTS names (a target that makes up names: a column each would be unbounded)."""
        name = self.part_names.get(part)
        if name is None:
            if len(self.part_names) >= MAX_SERVER_PARTS:
                return None
            name = self.part_names[part] = scrub(part, self.secrets)
        rows = self.server.get(name)
        if rows is None:
            rows = self.server[name] = (array("q"), array("d"))
        if name != part:
            self.server[part] = rows  # looked up by the name the target said from now on (this batch)
        return rows

    def cancelled(self, request: Request) -> None:
        """A sent request cancelled at the teardown: its row, with error `cancelled` (no sent time:
        the client did not say)."""
        self.add(request, Outcome(0, time.perf_counter_ns(), error="cancelled"), (NULL,) * 7, (NULL, NULL, NULL))

    def on_interval(self) -> None:
        """An interval report: the buffer leaves if FLUSH_AFTER_NS have passed since the last batch."""
        if self.n and time.perf_counter_ns() - self._flushed_ns >= FLUSH_AFTER_NS:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered rows to the writer thread (waits only when QUEUED_BATCHES are waiting)."""
        self._flushed_ns = time.perf_counter_ns()
        if not self.n:
            return
        server = {name: rows for name, rows in self.server.items() if name in self.part_names.values()}
        stalls = np.array(self.stalls, np.int64).reshape(-1, 2)  # (start, end) ns: overlaps taken at the write
        batch = (self._batch, self.n, self.buf, server, self.replica_names, stalls)
        self._batch += 1
        self._new_buffers()
        self._queue.put(batch)

    def close(self) -> None:
        """Write what is buffered and wait for the writer (a worker's last act before WorkerDone)."""
        self.flush()
        self._queue.put(None)
        self._writer.join()
        if self._failure is not None:
            raise RuntimeError(f"could not write the per-request records to {self.dir} "
                               f"({type(self._failure).__name__}: {self._failure}); `output.requests: off` runs without "
                               "them") from self._failure

    # -- the writer thread --------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._failure is None:
                try:
                    self._write(*batch)
                except BaseException as exc:  # noqa: BLE001 - reported by close(), on the worker's thread
                    self._failure = exc

    def _write(self, batch: int, n: int, buf: array, server: dict, replicas: list[str], stalls: np.ndarray) -> None:
        table = self.table(n, buf, server, replicas, stalls)
        path = self.dir / f"w{self.engine:03d}-{batch:06d}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp, **write_options(table.schema))
        os.replace(tmp, path)
        self.rows_written += n

    def table(self, n: int, buf: array, server: dict, replicas: list[str], stalls: np.ndarray | None = None) -> pa.Table:
        """A batch's buffers as a part file's table (requests.parquet's columns but `node`; strings as
        dictionary columns, which the merge makes plain). Built from buffers (`_array`), not pa.array,
        which would import pandas on this thread, holding the GIL for most of a second mid-run."""
        rows = np.frombuffer(buf, np.int64).reshape(n, len(FIELDS))
        col = {name: np.ascontiguousarray(rows[:, i]) for i, name in enumerate(FIELDS)}
        if stalls is not None and len(stalls):
            col["stall_us"] = stall_overlap_us((stalls - self.t0_ns) // 1000, col["intended_us"], col["end_us"])
        sm = {name: col[name].astype(np.int32) for name in SMALL}

        def i64(a: np.ndarray) -> pa.Array:
            return _array(a, pa.int64(), a != NULL)

        def i32(a: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
            return _array(a, pa.int32(), valid)

        def strings(codes: np.ndarray, names: list[str]) -> pa.Array:
            return pa.DictionaryArray.from_arrays(i32(np.maximum(codes, 0).astype(np.int32), codes >= 0), _strings(names))

        row = col["row"]
        planned = row < len(self.plan_phase)
        phase = np.where(planned, self.plan_phase[np.where(planned, row, 0)],
                         np.searchsorted(self.phase_starts_us, col["intended_us"], "right") - 1)
        out = {
            "row": i64(row),
            "class": strings(sm["class"], self.class_names),
            "phase": strings(np.clip(phase, 0, len(self.phase_names) - 1).astype(np.int32), self.phase_names),
            "warmup": _booleans(sm["warmup"] != 0),
            "worker": i32(np.full(n, self.engine, np.int32)),
            "session": i64(col["session"]),
            "turn": i32(sm["turn"]),
            **{name: i64(col[name]) for name in TIMES},
            "error": strings(sm["error"], list(ERRORS)),
            "status": i32(sm["status"]),
            **{name: i64(col[name]) for name in DURATIONS},
            "prompt_tokens": i32(sm["prompt_tokens"]),
            "output_tokens": i32(sm["output_tokens"]),
            "cached_tokens": i32(sm["cached_tokens"], sm["cached_tokens"] >= 0),
            "replica": strings(sm["replica"], replicas),
            "bytes_in": i64(col["bytes_in"]),
            "bytes_out": i64(col["bytes_out"]),
            "stall_us": i64(col["stall_us"]),
            "connection": i32(sm["connection"], sm["connection"] >= 0),
            "ttfot_us": i64(col["ttfot_us"]),
            "reasoning_tokens": i32(sm["reasoning_tokens"]),
            "prompt_count": strings(sm["prompt_count"], list(PROMPT_COUNTS)),
            "output_count": strings(sm["output_count"], list(OUTPUT_COUNTS)),
        }
        for part, (rows, ms) in sorted(server.items()):
            values = np.zeros(n)
            valid = np.zeros(n, bool)
            at = np.frombuffer(rows, np.int64)
            values[at], valid[at] = np.frombuffer(ms, np.float64), True
            out[REQUEST_SERVER_PREFIX + part] = _array(values, pa.float64(), valid)
        return pa.Table.from_arrays(list(out.values()), names=list(out))


def stall_overlap_us(stalls_us: np.ndarray, start_us: np.ndarray, end_us: np.ndarray) -> np.ndarray:
    """Per row, how much of [start, end] the union of the stalls (rows of (start, end), µs) covers, µs.

    The stalls are merged into disjoint spans S_k..E_k (sorted by start, a span ends at the running
    maximum of the ends); with C_k the stalled time before span k, the stalled time before t is
    F(t) = C_k + clip(t − S_k, 0, E_k − S_k) for the last span starting at or before t, and a row's
    overlap is F(end) − F(start)."""
    order = np.argsort(stalls_us[:, 0], kind="stable")
    s, e = stalls_us[order, 0], np.maximum.accumulate(stalls_us[order, 1])
    first = np.r_[True, s[1:] > e[:-1]]  # a span starts where a stall begins after every earlier one ended
    starts = s[first]
    ends = e[np.r_[np.flatnonzero(first)[1:] - 1, len(e) - 1]]
    before = np.r_[0, np.cumsum(ends - starts)]

    def stalled_before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, "right") - 1
        at = np.maximum(k, 0)
        inside = np.clip(t - starts[at], 0, ends[at] - starts[at])
        return np.where(k >= 0, before[at] + inside, 0)

    return stalled_before(end_us) - stalled_before(start_us)


def _array(values: np.ndarray, kind: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A fixed-width arrow array over a numpy array's bytes, null where not `valid`."""
    values = np.ascontiguousarray(values)
    if valid is None or valid.all():
        return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)], null_count=0)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(values), [bitmap, pa.py_buffer(values)], null_count=int(len(valid) - valid.sum()))


def _booleans(values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))],
                                 null_count=0)


def _strings(names: list[str]) -> pa.Array:
    """A string array of `names` (a dictionary's values)."""
    encoded = [name.encode() for name in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    offsets[1:] = np.cumsum([len(e) for e in encoded], dtype=np.int64)
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=0)


def open_log(directory: str | None, engine: int, t0_ns: int, scenario: Scenario, plan: Plan) -> RequestLog | None:
    """The worker's RequestLog (None: records are off, or `directory` is None)."""
    fraction = sample_fraction(scenario, plan)
    if directory is None or fraction <= 0:
        return None
    return RequestLog(directory, engine, t0_ns, plan.class_names, plan.phase, [p.name for p in plan.phases],
                      [p.start_s for p in plan.phases], fraction=fraction, seed=scenario.seed,
                      secrets=secret_values(scenario))
