"""The open-loop engine: one per worker process. It sends on time; intervals.py records.

Timing rules (DESIGN.md), all on the monotonic `perf_counter_ns` clock:
- every request has an intended send time from the plan, and is sent then, whatever earlier
  requests are doing: a slow target makes requests pile up in flight, it never slows the offered load;
- latency = end − intended (the honest, coordinated-omission-free number), service_time = end −
  actual send, send_lag = actual send − intended (so a client that fell behind is visible); the
  engine hands each request and its outcome to an `IntervalRecorder`, which applies these rules;
- the engine watches its own event-loop lag and garbage-collection pauses, so client hiccups are
  reported, not blamed on the server.

Prepare ahead, send on time: building a request (its prompt, body, tensors: the client's `prepare`,
timed as `encode`) happens in a look-ahead window, while the engine waits for the next intended time
anyway: the requests due within LOOKAHEAD_NS, at most LOOKAHEAD_REQUESTS of them holding at most
LOOKAHEAD_BYTES, so memory stays flat however long the run. A request is prepared ahead only when
that should end before the next send is due (twice the recent cost of one prepare, plus a margin),
so preparing never makes a send late; the interval report (a snapshot of every histogram) waits for
such a gap too. A request the window did not reach (a rate the client cannot keep up with) is
prepared at its send time, and that cost shows as send lag, as it should. At its intended time
sending is then a stamp and a write.

Sessions (chat.py): a plan row may open a conversation (or start a closed-loop user), and each
answer may bring the session's next turn, intended at the answer's end plus a think time. Those
turns wait in a heap by intended time beside the plan; the send loop always sends the earliest of
the two, and a turn that arrives due earlier than what the loop waits for wakes it. They are
prepared ahead in their think time like the plan's requests in the window. The engine keeps going
while sessions are in progress, and counts the ones still going when it stops as cut.

The in-flight cap is the one place the engine may not send on time: with `overflow: queue` the
request waits for a slot (counted `late`; its latency still runs from the intended time), with
`overflow: drop` it is not sent (counted `dropped`).

Accounting: every request counted `sent` ends counted once more, as completed, as an error of some
kind, or as cancelled (in flight when the run was torn down). Clients report a failed request in its
Outcome; an exception that escapes one anyway (a bug, or a response no check foresaw) becomes a
`protocol` error with its message here, so no request vanishes. The engine checks the sum when it
is done (`unaccounted`, which the worker reports and the run's summary shows): anything but 0 is a bug.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import os
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from latscope.chat import Conversations
from latscope.intervals import IntervalRecorder
from latscope.plan import Plan, after_idle, build_plan
from latscope.protocols import Client, make_client
from latscope.records import IntervalReport, Outcome, Request, WorkerDone, WorkerFailed, WorkerReady
from latscope.request_log import open_log
from latscope.results.schema import DROPPED, LATE, SENT
from latscope.scenario import Scenario, scrub, secret_values

LOOP_LAG_PERIOD_NS = 10_000_000  # the lag probe asks to sleep 10 ms; anything beyond is loop lag
STOP_POLL_S = 0.05  # how often a worker checks for a stop request
YIELD_EVERY = 64  # when behind schedule, let responses be read at least this often
# Event-loop timers have millisecond granularity (libuv rounds to whole ms on a cached clock), so a
# timer alone sends up to ~1 ms late. With the precise timer the engine sleeps until SPIN_NS before
# the intended time and polls the clock for the rest, yielding to the loop at each poll so responses
# are still read on time. It costs up to rate x SPIN_NS of CPU per second; the coarse timer costs little
# (uvloop runs a timer under 0.5 ms at once, so it too polls the last half millisecond: ~20 loop turns a send).
SPIN_NS = 1_000_000
LOOKAHEAD_NS = 1_000_000_000  # the look-ahead window prepares requests due within this ...
LOOKAHEAD_REQUESTS = 1024  # ... at most this many ...
LOOKAHEAD_BYTES = 64 << 20  # ... holding at most this many bytes of ready requests
MARGIN_NS = 50_000  # work that can wait starts only if twice its recent cost plus this is left before the next send
PREPARE_SLICE_NS = 100_000  # preparing ahead yields to the loop at least this often
TURNS_LOOKED_AT = 8  # session turns looked at per prepare ahead (in arrival order; due order is the heap's)
REPORT_DEFER_NS = 50_000_000  # an interval's report waits for a gap between sends at most this long
REPORT_POLL_S = 0.0005
# The collector's thresholds in a worker, after start-up is frozen out of its reach (gc.freeze). A young
# collection walks every object allocated since the last one that is still alive, and in a worker
# nearly all of them are: requests in flight, their streams, tasks and buffers (measured with 1,000
# streams: each collection found 0 garbage). So its pause grows with the threshold: 8–12 ms at 20,000
# (the old setting), 0.3 ms (p50, max 2.7) at 2,000, for the same total work. Older generations stay rare.
GC_THRESHOLDS = (2_000, 50, 1_000)


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    workers: int
    scenario: Scenario
    plan: Plan | None = None  # the run's plan when it was built elsewhere (a distributed run's master); None: build it
    requests_dir: str | None = None  # where its requests.parquet part files go (request_log.py); None: not kept


class Engine:
    """Sends one worker's share of the plan, open loop, and reports per-interval results (`report`
    gets an IntervalReport at every interval boundary of the run's clock, and one last at the end)."""

    def __init__(
        self,
        client: Client,
        intended_ns: np.ndarray,
        seq: np.ndarray,
        cls: np.ndarray,
        warmup: np.ndarray,
        asks: tuple[np.ndarray, np.ndarray, np.ndarray],
        class_names: list[str],
        warmup_windows_ns: list[tuple[int, int]],
        *,
        t0_ns: int,
        interval_s: float,
        max_in_flight: int,
        overflow: str,
        drain_timeout_s: float,
        report: Callable[[IntervalReport], None],
        should_stop: Callable[[], bool],
        precise_timer: bool,
        probes: frozenset[int] = frozenset(),
        goodput: list[dict[str, float] | None] | None = None,
        secrets: list[str] | None = None,
        sessions: tuple[Scenario, Plan] | None = None,
        blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ):
        self.client = client
        self.intended_ns, self.seq, self.cls, self.warmup = intended_ns, seq, cls, warmup
        self.asks = asks  # per request: planned prompt tokens, output tokens, item (see workload.py)
        self.warmup_windows_ns = warmup_windows_ns
        self.t0_ns = t0_ns
        self.interval_ns = int(interval_s * 1e9)
        self.cap = max_in_flight
        self.overflow = overflow
        self.drain_timeout_s = drain_timeout_s
        self.report = report
        self.should_stop = should_stop
        self.spin_ns = SPIN_NS if precise_timer else 0
        # probes: plan indices reported one by one; goodput: each class's objectives (Scenario.goodput_objectives)
        # secrets: what must never leave the worker in a message (scenario.secret_values)
        self.measure = IntervalRecorder(class_names, probes, goodput, secrets)
        self.in_flight = 0
        self.sent = 0  # requests counted `sent`
        self.settled = 0  # of those, requests counted again: completed, an error, or cancelled
        self.consumed = 0  # how many of this worker's planned requests were sent, dropped or skipped
        self.stopping = False
        self._slot_free = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._interval = 0
        self._gc_started = 0
        self._upcoming = self._planned()  # the plan's requests not yet taken, in order
        self._head: Request | None = None  # the plan's next request, taken from the window or the plan, looked at
        self._next: Request | None = None  # the one after the window, once looked at
        self._ready: deque[Request] = deque()  # the look-ahead window: prepared requests, in order
        self._ready_bytes = 0
        self._prepare_cost_ns = 0  # a decaying maximum of what one prepare took
        self._report_cost_ns = 0  # the same for one interval report
        self._due_ns = 0  # when the request the send loop is at is due (0: none)
        self._unstarted = 0  # requests handed to their tasks that have not run yet (a task writes when it first runs)
        # Sessions (chat.py): a plan row may start a session or a closed-loop user, and each answer may
        # bring the next turn, kept in `_later` (a heap by intended time) until it is due.
        self.chat = Conversations(*sessions, t0_ns, self.measure) if sessions else None
        self.blocks = blocks  # Plan.blocks: a Mooncake trace's prompt blocks, by plan row
        self._later: list[tuple[int, int, Request]] = []
        self._later_unprepared: deque[Request] = deque()  # the same turns, to prepare ahead in arrival order
        self._woken = False  # a turn due earlier than the one waited for arrived, or a session ended
        self._nap_future: asyncio.Future | None = None

    # -- the schedule ------------------------------------------------------------------------

    def _planned(self) -> Iterator[Request]:
        """This worker's share of the plan as Requests, in order (in chunks: Python ints for speed,
        without a list of the whole plan)."""
        chunk = 65536
        for start in range(0, len(self.intended_ns), chunk):
            columns = [a[start : start + chunk].tolist() for a in (self.seq, self.intended_ns, self.cls, self.warmup, *self.asks)]
            for seq, intended, cls, warm, prompt, output, item in zip(*columns):
                request = Request(seq, intended, cls, warm, prompt, output, item)
                if self.blocks is not None and (block_tokens := int(self.blocks[2][seq])):
                    ids, start = self.blocks[0], self.blocks[1]
                    request.blocks = (ids[start[seq]:start[seq + 1]], block_tokens)
                if self.chat is not None and (request := self.chat.begin(request)) is None:
                    self.consumed += 1  # a closed-loop user whose phase is over before it began
                    continue
                yield request

    def _peek(self) -> Request | None:
        """The next request to send: the window's first, else the plan's next (not prepared yet), or a
        session's next turn when that is due earlier."""
        request = self._head
        if request is None:
            if self._ready:
                request = self._ready.popleft()
                self._ready_bytes -= request.wire_bytes
            else:
                request, self._next = self._next or next(self._upcoming, None), None
            self._head = request
        if self._later and (request is None or self._later[0][0] < request.intended_ns):
            return self._later[0][2]
        return request

    def _pop(self, request: Request) -> bool:
        """Take `request`, which `_peek` just gave, out of where it waited; whether it is a plan row
        (not a session's later turn)."""
        if self._head is request:
            self._head = None
            return True
        if self._later[0][2] is request:
            heapq.heappop(self._later)
        else:  # a turn due earlier came in between the look and the take (while yielding): rare
            self._later.remove((request.intended_ns, request.seq, request))
            heapq.heapify(self._later)
        if request.wire is not None:  # prepared ahead: its bytes leave the window's count
            self._ready_bytes -= request.wire_bytes
        return False

    def _push(self, request: Request) -> None:
        """A session's next turn, due at its intended time; the send loop looks again if it is earlier
        than what it waits for."""
        heapq.heappush(self._later, (request.intended_ns, request.seq, request))
        self._later_unprepared.append(request)
        if len(self._later_unprepared) > 2 * len(self._later) + 64:  # most were sent unprepared ahead: forget them
            waiting = {id(entry[2]) for entry in self._later}
            self._later_unprepared = deque(r for r in self._later_unprepared if r.wire is None and id(r) in waiting)
        self._wake()

    def _wake(self) -> None:
        self._woken = True
        if self._nap_future is not None and not self._nap_future.done():
            self._nap_future.set_result(None)

    async def _nap(self, seconds: float) -> None:
        """asyncio.sleep(seconds), cut short by `_wake` when sessions are run."""
        if self.chat is None:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        future = self._nap_future = loop.create_future()
        timer = loop.call_later(seconds, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            self._nap_future = None

    def _prepare(self, request: Request) -> None:
        self.client.prepare(request)  # the client times it (encode_ns): no second clock read here
        self._prepare_cost_ns = max(request.encode_ns, self._prepare_cost_ns * 15 // 16)

    def _fits(self, cost_ns: int, due_ns: int) -> bool:
        """Whether work that lately took up to `cost_ns` fits before `due_ns` (0: nothing is due), with
        as much again and MARGIN_NS to spare, and no request handed to its task is still unwritten."""
        return not self._unstarted and (not due_ns or due_ns - time.perf_counter_ns() >= 2 * cost_ns + MARGIN_NS)

    def _prepare_ahead(self, waiting: Request | None, due_ns: int) -> bool:
        """Prepare one request while waiting for `due_ns` (the request `waiting` for it first, then the
        window's next), if the window has room and it should be done in time; True when it did."""
        if not self._fits(self._prepare_cost_ns, due_ns):
            return False
        if waiting is not None and waiting.wire is None:
            self._prepare(waiting)
            if waiting is not self._head:  # a session turn: counted in the window's bytes until taken
                self._ready_bytes += waiting.wire_bytes
            return waiting.wire is not None  # a client that prepares nothing (the callable one) stays as it is
        if self._later_unprepared and self._prepare_turn_ahead():
            return True
        if len(self._ready) >= LOOKAHEAD_REQUESTS or self._ready_bytes >= LOOKAHEAD_BYTES:
            return False
        if self._next is None:
            self._next = next(self._upcoming, None)
        request = self._next
        if request is None or request.intended_ns - time.perf_counter_ns() > LOOKAHEAD_NS:
            return False
        self._next = None
        self._prepare(request)
        self._ready.append(request)
        self._ready_bytes += request.wire_bytes
        return True

    def _prepare_turn_ahead(self) -> bool:
        """Prepare one session turn due within LOOKAHEAD_NS (the window's bytes bound counts it too),
        looking at a few of the turns not prepared yet, in the order they came (a turn due later goes
        to the back; one already sent is forgotten); True when it did."""
        now = time.perf_counter_ns()
        for _ in range(min(len(self._later_unprepared), TURNS_LOOKED_AT)):
            request = self._later_unprepared.popleft()
            if request.wire is not None:  # sent (a send prepares what was not)
                continue
            if request.intended_ns - now > LOOKAHEAD_NS or self._ready_bytes >= LOOKAHEAD_BYTES:
                self._later_unprepared.append(request)
                continue
            self._prepare(request)
            self._ready_bytes += request.wire_bytes
            return request.wire is not None
        return False

    async def _sleep_until(self, when_ns: int, waiting: Request | None = None) -> None:
        """Sleep until `when_ns` (see SPIN_NS), preparing requests ahead meanwhile (`waiting`, the one
        due then, first); wakes at least every STOP_POLL_S to notice a stop request, and re-checks the
        clock after each sleep because timers may also fire early. Between prepares it yields to the
        loop at least every PREPARE_SLICE_NS, so responses are still read on time."""
        pc = time.perf_counter_ns
        self._woken = False
        if self._unstarted:
            await asyncio.sleep(0)  # first let the requests just handed to their tasks be written
        yielded = pc()
        while not self.stopping and not self._woken:
            delay = when_ns - pc()
            if delay <= 0:
                return
            if self._prepare_ahead(waiting, when_ns):
                if pc() - yielded < PREPARE_SLICE_NS:
                    continue
                await asyncio.sleep(0)
            elif delay <= self.spin_ns:
                await asyncio.sleep(0)
            else:
                await self._nap(min((delay - self.spin_ns) * 1e-9, STOP_POLL_S))
            yielded = pc()

    async def _send_all(self) -> None:
        loop = asyncio.get_running_loop()
        pc = time.perf_counter_ns
        count = self.measure.count
        since_yield = 0
        while True:
            request = self._peek()
            if request is None:
                if self.chat is None or not self.chat.live or self.stopping:
                    break
                self._due_ns = 0
                await self._sleep_until(time.perf_counter_ns() + int(STOP_POLL_S * 1e9))  # until a turn or an end
                continue
            cls, warm = request.cls, request.warmup
            self._due_ns = request.intended_ns
            if request.intended_ns > pc():
                await self._sleep_until(request.intended_ns, request)
                since_yield = 0
                if self._woken and not self.stopping:  # a turn due earlier came in meanwhile: look again
                    continue
            elif since_yield >= YIELD_EVERY:
                await asyncio.sleep(0)
                since_yield = 0
            if self.stopping:
                return
            row = self._pop(request)
            self.consumed += row
            if request.turn == 1:
                self.chat.starting(request)
            if self.in_flight >= self.cap:
                if self.overflow == "drop":
                    count(cls, warm, DROPPED)
                    if request.session is not None:
                        for follow in self.chat.after(request, None):
                            self._push(follow)
                    continue
                count(cls, warm, LATE)
                while self.in_flight >= self.cap and not self.stopping:
                    self._slot_free.clear()
                    await self._slot_free.wait()
                if self.stopping:
                    self.consumed -= row
                    if request.session is not None:
                        self._push(request)  # not sent: the sessions' count at the end sees it
                    return
            if request.wire is None:  # the window did not reach it: prepared now, its cost in send lag
                self._prepare(request)  # (and in the cost estimate, which must be able to come down)
            self.in_flight += 1
            self.sent += 1
            count(cls, warm, SENT)
            self._unstarted += 1
            task = loop.create_task(self._one(request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            since_yield += 1
        self._due_ns = 0

    async def _one(self, request: Request) -> None:
        self._unstarted -= 1  # from here to the write nothing yields (an idle connection), or it connects
        try:
            outcome = await self.client.send(request)
        except asyncio.CancelledError:
            self.measure.cancelled(request)
            self.settled += 1
            return
        except Exception as exc:  # noqa: BLE001 - a client must not lose a request, whatever went wrong
            now = time.perf_counter_ns()
            outcome = Outcome(now, now, error="protocol", reason=f"the client failed: {type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1
            self._slot_free.set()
        self.measure.record(request, outcome)
        self.settled += 1
        if request.session is not None:
            follows = self.chat.after(request, outcome)
            for follow in follows:
                self._push(follow)
            if not follows:
                self._wake()  # a session ended: the send loop may be waiting only for that

    @property
    def unaccounted(self) -> int:
        """Requests sent but counted neither completed, nor an error, nor cancelled: 0 unless latscope
        has a bug (checked once the engine is done)."""
        return self.sent - self.settled

    # -- health of the generator itself -----------------------------------------------------

    def _in_warmup(self, now_ns: int) -> bool:
        return any(start <= now_ns < end for start, end in self.warmup_windows_ns)

    async def _watch_loop_lag(self) -> None:
        pc = time.perf_counter_ns
        while True:
            before = pc()
            await asyncio.sleep(LOOP_LAG_PERIOD_NS * 1e-9)
            now = pc()
            lag_us = max(0, now - before - LOOP_LAG_PERIOD_NS) // 1000
            self.measure.record_generator("loop_lag", lag_us, self._in_warmup(now))

    def _gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
        else:
            now = time.perf_counter_ns()
            self.measure.record_generator("gc_pause", (now - self._gc_started) // 1000, self._in_warmup(now))

    async def _watch_stop(self) -> None:
        while not self.stopping:
            if self.should_stop():
                self.stopping = True
                self._slot_free.set()
            await asyncio.sleep(STOP_POLL_S)

    # -- reporting --------------------------------------------------------------------------

    def _emit_interval(self) -> None:
        started = time.perf_counter_ns()
        self.report(self.measure.take(self._interval, self.in_flight))
        self._interval += 1
        self._report_cost_ns = max(time.perf_counter_ns() - started, self._report_cost_ns * 15 // 16)

    async def _tick(self) -> None:
        """Report each interval once it has ended, in a gap between sends (up to REPORT_DEFER_NS later):
        what completes meanwhile counts in the interval reported."""
        while True:
            boundary = self.t0_ns + (self._interval + 1) * self.interval_ns
            delay = boundary - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay * 1e-9)
            if time.perf_counter_ns() < boundary:
                continue
            while not self._fits(self._report_cost_ns, self._due_ns) and time.perf_counter_ns() < boundary + REPORT_DEFER_NS:
                await asyncio.sleep(REPORT_POLL_S)
            self._emit_interval()

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> tuple[int, dict[str, list[str]]]:
        """Send everything (or until stopped), drain, report the last interval; (planned requests not
        sent, error examples by kind)."""
        helpers = [asyncio.create_task(c) for c in (self._tick(), self._watch_loop_lag(), self._watch_stop())]
        gc.callbacks.append(self._gc_callback)
        try:
            await self._sleep_until(self.t0_ns)
            await self._send_all()
            await self._drain()
            if self.chat is not None:
                self.chat.stop([entry[2] for entry in self._later])
        finally:
            gc.callbacks.remove(self._gc_callback)
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        self._emit_interval()
        return len(self.intended_ns) - self.consumed, self.measure.error_examples

    async def _drain(self) -> None:
        """Wait for requests still in flight: up to the target timeout normally, briefly when stopping."""
        deadline = time.monotonic() + self.drain_timeout_s
        while self._tasks and time.monotonic() < deadline:
            if self.stopping:
                deadline = min(deadline, time.monotonic() + 0.5)
            await asyncio.wait(set(self._tasks), timeout=STOP_POLL_S)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# -- the worker process ---------------------------------------------------------------------


def settle_gc() -> None:
    """Before a worker measures: freeze what exists now (plan, imports) out of the collector's reach,
    and keep young collections short (GC_THRESHOLDS). Pauses still happen and are recorded (gc_pause)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def worker_main(spec: WorkerSpec, queue: Any, start_event: Any, t0_value: Any, stop_event: Any) -> None:
    """Entry point of a worker process (spawned). Reports through `queue`; never raises."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent coordinates the stop
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    # The parent started us with both blocked (latscope.interrupt.blocked): one that came while we
    # were importing is delivered now, to these handlers.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        _run_loop(_worker(spec, queue, start_event, t0_value, stop_event))
    except BaseException:  # the traceback crosses to the parent and the console: without the scenario's secrets
        queue.put(WorkerFailed(spec.index, scrub(traceback.format_exc(), secret_values(spec.scenario))))


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _worker(spec: WorkerSpec, queue: Any, start_event: Any, t0_value: Any, stop_event: Any) -> None:
    scenario = spec.scenario
    plan = spec.plan if spec.plan is not None else build_plan(scenario)
    mine = plan.worker_slice(spec.index, spec.workers)
    cap = max(1, scenario.limits.max_in_flight // spec.workers)
    client = make_client(scenario)
    await client.open()
    parent = os.getppid()

    def report(message: IntervalReport) -> None:
        message.worker = spec.index  # the recorder that made it does not know which worker it is
        queue.put(message)

    def should_stop() -> bool:
        return stop_event.is_set() or os.getppid() != parent

    queue.put(WorkerReady(spec.index, len(mine)))
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, start_event.wait, 1.0):
        if should_stop():
            await client.close()
            return
    t0 = t0_value.value
    warmup_windows = [
        (t0 + int(p.start_s * 1e9), t0 + int((p.start_s + p.duration_s) * 1e9)) for p in plan.phases if p.warmup
    ]
    engine = Engine(
        client,
        t0 + (plan.offsets_s[mine] * 1e9).astype(np.int64),
        mine,
        plan.cls[mine],
        plan.warmup[mine],
        (plan.prompt_tokens[mine], plan.output_tokens[mine], plan.item[mine]),
        plan.class_names,
        warmup_windows,
        t0_ns=t0,
        interval_s=scenario.output.interval,
        max_in_flight=cap,
        overflow=scenario.limits.overflow,
        precise_timer=scenario.limits.timer == "precise",
        drain_timeout_s=scenario.target.timeout + 1.0,
        report=report,
        should_stop=should_stop,
        probes=frozenset(np.intersect1d(after_idle(plan)[0], mine).tolist()),
        goodput=scenario.goodput_objectives(),
        secrets=secret_values(scenario),
        sessions=(scenario, plan) if plan.turns is not None or plan.closed_loop else None,
        blocks=plan.blocks,
    )
    log = engine.measure.log = open_log(spec.requests_dir, spec.index, t0, scenario, plan)
    settle_gc()
    try:
        not_sent, error_examples = await engine.run()
    finally:
        await client.close()
        if log is not None:
            log.close()  # the last part file is written before WorkerDone
    queue.put(WorkerDone(spec.index, not_sent, error_examples, engine.unaccounted))
