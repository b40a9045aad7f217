"""Where a run's interval reports come from: the senders the orchestrator starts, starts at t0 and stops.

A run has one pool. `LocalPool` is N worker processes on this machine (engine.worker_main); a
distributed run's coordinator has a `RemotePool` instead (latscope/distributed/remote.py), whose
senders are whole machines. The orchestrator sees only this interface:

    start()                       spawn or set up the senders (returns at once)
    get(timeout) -> message       the next WorkerReady / IntervalReport / WorkerDone / WorkerFailed, or None
    lost() -> [(sender, why)]     senders gone without their WorkerDone, each reported once
    continue_without(sender)      whether the run goes on without a lost sender (else it aborts)
    start_delay_s                 how far ahead of now t0 must be for every sender to get it in time
    ready_timeout_s               how long the senders may take to be ready before the run gives up
    go(t0_ns)                     the common start, perf_counter_ns on this machine's clock
    stop()                        ask every sender to stop and report what it has (idempotent)
    close(hurry)                  stop, wait a little (not at all when hurrying), then kill what is left
    senders                       how many report streams the collector waits for at each interval
    engines                       how many engine processes send (summary.json generator.workers)
    parts()                       run parts of its own (parts.py), e.g. the remote pool's nodes.parquet
    pids()                        {device: pid} of its processes on this machine, for host telemetry
    describe(run_s)               summary.json generator's extra keys (a remote pool's machines), or None
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
from typing import Protocol

from latscope.engine import WorkerSpec, worker_main
from latscope.interrupt import blocked
from latscope.plan import Plan
from latscope.records import WorkerMessage
from latscope.scenario import Scenario

LOCAL_START_DELAY_S = 0.2  # between "all workers ready" and the first intended send
LOCAL_READY_TIMEOUT_S = 60.0  # for local workers to start


class Pool(Protocol):
    """The interface above; LocalPool and distributed.remote.RemotePool implement it."""

    senders: int
    engines: int
    start_delay_s: float
    ready_timeout_s: float

    def start(self) -> None: ...
    def get(self, timeout: float) -> WorkerMessage | None: ...
    def lost(self) -> list[tuple[int, str]]: ...
    def continue_without(self, sender: int) -> bool: ...
    def go(self, t0_ns: int) -> None: ...
    def stop(self) -> None: ...
    def close(self, hurry: bool) -> None: ...
    def pids(self) -> dict[str, int]: ...
    def parts(self) -> list: ...
    def describe(self, run_s: float) -> dict | None: ...


class LocalPool:
    """`count` engine processes on this machine, numbered first … first + count − 1 of `of` in all
    (a local run: 0 … N − 1 of N; a distributed node: its range of the run's engines). With `plan`,
    they send from it instead of building their own (a node gets the master's plan). With
    `requests_dir`, each writes its per-request records there as part files (request_log.py)."""

    start_delay_s = LOCAL_START_DELAY_S
    ready_timeout_s = LOCAL_READY_TIMEOUT_S

    def __init__(self, scenario: Scenario, count: int, *, first: int = 0, of: int | None = None, plan: Plan | None = None,
                 requests_dir: str | None = None):
        self.scenario, self.count, self.first, self.of, self.plan = scenario, count, first, of or count, plan
        self.requests_dir = requests_dir
        self.senders = self.engines = count
        self.processes: list = []
        self._reported_dead: set[int] = set()
        self._shared: tuple = ()

    def start(self) -> None:
        """Spawn the workers. The shared objects are kept on self for as long as the workers may
        live: a worker still starting when the run is stopped unpickles them, and one the parent has
        let go of is gone (a FileNotFoundError in the worker). Workers start with SIGINT and SIGTERM
        blocked (interrupt.blocked) until worker_main has its handlers."""
        ctx = mp.get_context("spawn")
        self._queue = ctx.Queue()
        self._start_event, self._stop_event = ctx.Event(), ctx.Event()
        self._t0 = ctx.Value("q", 0)
        self._shared = (self._queue, self._start_event, self._t0, self._stop_event)
        with blocked():
            for j in range(self.count):
                index = self.first + j
                process = ctx.Process(
                    target=worker_main,
                    args=(WorkerSpec(index, self.of, self.scenario, self.plan, self.requests_dir), self._queue, self._start_event,
                          self._t0, self._stop_event),
                    name=f"latscope-worker-{index}",
                    daemon=True,
                )
                process.start()
                self.processes.append(process)

    def get(self, timeout: float) -> WorkerMessage | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue_module.Empty:
            return None

    def lost(self) -> list[tuple[int, str]]:
        """Workers that exited (a worker that finished normally has sent its WorkerDone first: the
        orchestrator ignores those it has heard from)."""
        out = []
        for j, p in enumerate(self.processes):
            if p.exitcode is not None and j not in self._reported_dead:
                self._reported_dead.add(j)
                out.append((self.first + j, f"worker {self.first + j} exited unexpectedly with code {p.exitcode}"))
        return out

    def continue_without(self, sender: int) -> bool:
        return False  # a worker that died took its share of the plan with it: the run stops

    def go(self, t0_ns: int) -> None:
        self._t0.value = t0_ns
        self._start_event.set()

    def stop(self) -> None:
        if self._shared:
            self._stop_event.set()

    def close(self, hurry: bool) -> None:
        """Workers stopped before t = 0 have nothing to report, and after a second signal nobody waits
        for them: a short grace, then they are killed (no traceback: SIGKILL)."""
        self.stop()
        for p in self.processes:
            p.join(timeout=0.5 if hurry else 5.0)
            if p.is_alive():
                p.kill()
                p.join()

    def parts(self) -> list:
        return []

    def describe(self, run_s: float) -> dict | None:
        return None

    def pids(self) -> dict[str, int]:
        """{device: pid} of the workers, for the host telemetry sampler."""
        return {f"worker-{self.first + j}": p.pid for j, p in enumerate(self.processes) if p.pid is not None}
