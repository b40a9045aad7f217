"""One run, end to end: launch the target, start the workers, collect, stop, write the results.

The parent process does no sending. It starts N worker processes (each rebuilds the plan from the
scenario and sends its share, see engine.py), gives them one common start time on the monotonic
clock, merges their interval reports as they arrive (collector.py), and writes the results directory
(summary.py). Telemetry, scenario actions and live metrics run beside it as run parts (parts.py).
Ctrl-C, SIGTERM, a target that dies or a worker that fails all end the run the same way: workers are
told to stop, what was measured is collected, and a complete directory marked `"partial": true` is
written.

    run_scenario: plan -> results dir (scenario.yaml, schedule) -> _Run.execute: launch -> workers
                  -> ready -> t0 -> parts start -> collect ... -> _Run.close: parts stop -> workers
                  and target stop -> parts write -> summary.write_results -> report
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


from latscope import results
from latscope.errors import RunError
from latscope.interrupt import Interrupted, StopRequest
from latscope.plan import Plan, after_idle, build_plan, schedule_table
from latscope.records import IntervalReport, WorkerDone, WorkerFailed, WorkerMessage, WorkerReady
from latscope.results.hlog import HlogWriter
from latscope.results.schema import COMPLETED, ERROR_INDEX, SENT
from latscope.run.actions import ActionRunner
from latscope.run.collector import Collector
from latscope.run.launch import LaunchedTarget, core_split, cores_for_latscope, scrub_log, start_target, stop_target
from latscope.run.live import LiveMetrics, start_live_metrics
from latscope.run.parts import RunPart
from latscope.run.pool import LocalPool, Pool
from latscope.run.requests import RequestRecords, requests_dir
from latscope.run.summary import RunFacts, write_results
from latscope.scenario import Scenario, redacted_yaml, scrub, secret_values
from latscope.telemetry.session import TelemetrySession
from latscope.workload import Payloads, with_run_salt

STOP_GRACE_S = 10.0  # how long stopped workers get to report what they measured
HURRY_GRACE_S = 1.0  # ... after a second Ctrl-C (a stopped worker drains for 0.5 s, engine.Engine._drain)
# Events the live progress display shows as they happen.
NOTABLE_EVENTS = {"target_ready", "target_stopped", "action_end", "action_skipped", "replica_first_seen",
                  "first_after_idle", "abort"}
RECENT_EVENTS = 8


@dataclass
class Progress:
    elapsed_s: float
    duration_s: float
    phase: str
    offered_rps: float
    achieved_rps: float
    in_flight: int
    sent: int
    completed: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    stopping: str | None
    recent_events: list[dict]  # the latest notable events (NOTABLE_EVENTS), oldest first
    events_seen: int  # notable events so far: a display prints the ones it has not printed yet


@dataclass
class RunResult:
    run_dir: Path
    summary: dict


def run_scenario(
    scenario: Scenario,
    *,
    out: str | Path | None = None,
    workers: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    stop: StopRequest | None = None,
    make_pool: Callable[[Scenario, Plan, results.EventLog, Path | None], Pool] | None = None,
) -> RunResult:
    """Run `scenario` and write its results directory. Raises RunError when the run could not
    start; a run that started always leaves a results directory (partial when cut short).
    `metrics_port` (0: a free one) serves live Prometheus metrics on metrics_host during the run (live.py).
    SIGINT and SIGTERM go to `stop` (default: a new one) for the whole call: one before the results
    directory exists raises Interrupted (a KeyboardInterrupt; nothing written), one after it stops
    the run in order (latscope.interrupt). `make_pool` gives the run's senders (run/pool.py; a
    distributed run's coordinator passes its remote pool); default: `workers` local processes."""
    stop = stop or StopRequest()
    with stop.handling():
        return _run_scenario(scenario, out, workers, on_progress, metrics_port, metrics_host, stop, make_pool)


def _run_scenario(scenario: Scenario, out: str | Path | None, workers: int | None,
                  on_progress: Callable[[Progress], None] | None, metrics_port: int | None, metrics_host: str,
                  stop: StopRequest, make_pool: Callable[[Scenario, Plan, results.EventLog, Path | None], Pool] | None) -> RunResult:
    split = core_split(scenario.target.launch)  # a launched target's own cores, latscope's the rest
    workers = max(1, workers or (len(split[0]) if split else os.cpu_count() or 1))
    started_wall = time.time()
    written, scenario = scenario, with_run_salt(scenario)  # one salt for the whole run (summary.json prompt_salt)
    plan = build_plan(scenario)
    Payloads(scenario)  # a dataset or tensor file that does not load fails here, not in every worker
    live = _start_live(scenario, plan, metrics_port, metrics_host)  # a taken port fails here, before any file
    try:
        stop.commit()  # no gap: from before the directory exists, a signal is a request the run honours
        if stop.reason:  # one came, and a finalizer it interrupted swallowed its exception
            raise Interrupted(stop.reason)
        run_dir = results.create_run_dir(scenario.output.dir, scenario.name, started_wall, out)
        results.write_text(run_dir / results.SCENARIO, redacted_yaml(written))  # as written: `prompt_salt: run` draws again
        events = results.EventLog(run_dir / results.EVENTS)
        if scenario.output.save_schedule:
            _write_schedule(run_dir, plan)
        parts_dir = requests_dir(run_dir, scenario, plan)  # None: output.requests is off
        pool = make_pool(scenario, plan, events, parts_dir) if make_pool else LocalPool(
            scenario, workers, requests_dir=parts_dir)
        run = _Run(scenario, plan, pool, run_dir, events, on_progress)
        if scenario.output.requests != "off":  # after the pool's own parts: merged once the workers are gone
            run.records = RequestRecords(scenario, plan)
        run.target_cores = split[1] if split else None
        if live is not None:
            live.set_run_dir(str(run_dir))
            events.listeners.append(live.on_event)
            run.parts.append(live)
        with cores_for_latscope(split):
            try:
                run.execute(stop)
            except RunError as exc:  # its message may quote the target (its log, a URL): without secrets
                run.failure = scrub(str(exc), run.secrets)
                run.abort_reason = run.abort_reason or run.failure.splitlines()[0]
            finally:
                run.close()
        summary = write_results(run_dir, run.facts(started_wall), events)
    finally:
        if live is not None:
            live.close()  # the endpoint is served until the results are written
    _write_explain(run_dir, stop)  # before the report, which shows it
    if scenario.output.report:
        _write_report(run_dir, stop)
    if run.failure:
        raise RunError(f"{run.failure}; partial results in {run_dir}")
    return RunResult(run_dir, summary)


def _write_schedule(run_dir: Path, plan: Plan) -> None:
    """schedule.parquet: the realized schedule, one row per planned request (results.schema.SCHEDULE_COLUMNS)."""
    results.write_table(run_dir / results.SCHEDULE, schedule_table(plan))


def _start_live(scenario: Scenario, plan: Plan, port: int | None, host: str) -> LiveMetrics | None:
    """The live Prometheus endpoint (None without a port); its URL goes to stderr once."""
    if port is None:
        return None
    live = start_live_metrics(port, host, scenario=scenario.name, class_names=plan.class_names,
                              interval_s=scenario.output.interval, actions=[(a.name, a.kind) for a in scenario.actions])
    print(f"live metrics: {live.url}", file=sys.stderr, flush=True)
    return live


def _write_explain(run_dir: Path, stop: StopRequest) -> None:
    """explain.json (analysis/explain.py): why the tail is what it is; `not_enough_data` with the
    reason when the run kept no usable requests.parquet. Like the report, never at the cost of the
    results, and skipped after a second Ctrl-C."""
    if stop.hurry:
        return
    try:
        from latscope.analysis.explain import explain_or_reason, write_explain

        write_explain(run_dir, explain_or_reason(run_dir))
    except Exception as exc:  # noqa: BLE001 - never lose a run's results to its explanation
        logging.getLogger("latscope.explain").warning(
            "explain.json not written (%s: %s); the results are complete, retry with: latscope explain %s",
            type(exc).__name__, exc, run_dir)


def _write_report(run_dir: Path, stop: StopRequest) -> None:
    """report.html and summary.md, partial runs included. A report that cannot be written is a
    warning: the results directory is complete without it (`latscope report` can try again). After
    a second Ctrl-C the user is waiting: no report."""
    if stop.hurry:
        print(f"report skipped (stopped twice); write it with: latscope report {run_dir}", file=sys.stderr, flush=True)
        return
    try:
        from latscope.report import write_report

        write_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - never lose a run's results to its report
        logging.getLogger("latscope.report").warning(
            "report not written (%s: %s); the results are complete, retry with: latscope report %s",
            type(exc).__name__, exc, run_dir)


class _Run:
    def __init__(self, scenario: Scenario, plan: Plan, pool: Pool, run_dir: Path, events: results.EventLog,
                 on_progress: Callable[[Progress], None] | None):
        self.scenario, self.plan, self.pool, self.run_dir = scenario, plan, pool, run_dir
        self.events = events
        self.on_progress = on_progress
        self.parts: list[RunPart] = []  # hooked in at the run's moments (parts.py), in this order
        self.records: RequestRecords | None = None  # requests.parquet (run/requests.py): written after the parts
        self.target: LaunchedTarget | None = None
        self.target_cores: set[int] | None = None  # where a launched target is pinned (launch.core_split)
        self.secrets = secret_values(scenario)  # kept out of the abort reason, the events and target.log
        self.actions: ActionRunner | None = None  # the scenario's actions (actions.py); may restart the target
        self.abort_reason: str | None = None
        self.failure: str | None = None  # an abort that is the run's fault, not the user's wish
        self.t0_ns: int | None = None
        self.t0_wall: float | None = None
        self.end_ns: int | None = None
        self.abort_ns: int | None = None
        self.done: dict[int, WorkerDone | None] = {}  # sender -> its last message (None: it died or failed)
        self.started = False  # the pool was started: close() stops it
        self.stop: StopRequest | None = None  # SIGINT/SIGTERM (execute's); its `hurry` shortens the teardown
        self._hlog_file = open(run_dir / f".{results.HLOG}.tmp", "w")
        self.created_wall = time.time()  # the empty log's StartTime when the run never reaches t = 0
        self.collector: Collector | None = None
        self.telemetry: TelemetrySession | None = None
        self.launched: tuple[int, int] | None = None  # (started, ready) perf_counter_ns of the first launch
        self._launch_logged = False
        probes, gaps = after_idle(plan)
        self.idle_gaps = dict(zip(probes.tolist(), gaps.tolist()))  # probe request -> idle gap before it (s)
        self.recent_events: deque[dict] = deque(maxlen=RECENT_EVENTS)
        self.events_seen = 0
        self._recent_lock = threading.Lock()
        events.listeners.append(self._note_event)

    def _note_event(self, event: dict) -> None:
        """Keep the notable ones for the progress display (called under the event log's lock, from
        the run loop and from action threads)."""
        if event["event"] in NOTABLE_EVENTS:
            with self._recent_lock:
                self.recent_events.append(event)
                self.events_seen += 1

    # -- execution ----------------------------------------------------------------------------

    def execute(self, stop: StopRequest) -> None:
        scenario = self.scenario
        self.stop = stop
        self.telemetry = TelemetrySession.from_config(scenario.telemetry, self.events, scenario.output.interval,
                                                      processes=lambda: {"parent": os.getpid(), **self.pool.pids()})
        self.parts.insert(0, self.telemetry)
        self.parts.extend(self.pool.parts())  # a remote pool's: its machines' health (nodes.parquet)
        if stop.reason:  # it came while the directory was made: nothing to launch, start or wait for
            self._abort(stop.reason)
            return
        if scenario.target.launch is not None:
            self.target = start_target(
                scenario.target.launch,
                scenario.resolve_path(scenario.target.launch.cwd or "."),
                self.run_dir / results.TARGET_LOG,
                should_stop=lambda: stop.reason is not None,
                cores=self.target_cores,
            )
            self.launched = (self.target.started_ns, self.target.ready_ns)  # a restart action replaces self.target
        self.started = True
        self.pool.start()
        if not self._wait_ready(stop):
            return

        delay = self.pool.start_delay_s
        self.t0_ns = time.perf_counter_ns() + int(delay * 1e9)
        self.t0_wall = time.time() + delay
        self.events.t0_ns = self.t0_ns
        self._log_launch()  # now on the run's clock: before t = 0
        if scenario.actions:
            # First among the parts: stopped first, no action (a restart) starts while the run is torn down.
            self.actions = ActionRunner(scenario, self.plan, self.events, self, cancelled=lambda: self.abort_reason is not None)
            self.parts.insert(0, self.actions)
        for part in self.parts:
            part.start(self.t0_ns)
        self.collector = Collector(
            self.pool.senders, self.plan, scenario.output.interval, HlogWriter(self._hlog_file, self.t0_wall)
        )
        self.pool.go(self.t0_ns)
        self.events.emit("run_start", planned_requests=len(self.plan), workers=self.pool.engines)
        self._collect(stop)
        self.end_ns = time.perf_counter_ns()

    def _wait_ready(self, stop: StopRequest) -> bool:
        """True once every sender is ready (within the pool's ready_timeout_s); False when the user
        stopped the run first."""
        ready = set()
        deadline = time.monotonic() + self.pool.ready_timeout_s
        while len(ready) < self.pool.senders:
            if stop.reason:
                self._abort(stop.reason)
                return False
            message = self.pool.get(timeout=0.1)
            if message is None:
                dead = self.pool.lost()
                if dead or time.monotonic() > deadline:
                    raise RunError("workers did not start; " + (", ".join(why for _, why in dead) or "timed out waiting for them"))
                continue
            if isinstance(message, WorkerFailed):
                raise RunError(f"worker {message.worker} failed to start:\n{message.error}")
            if isinstance(message, WorkerReady):
                ready.add(message.worker)
        return True

    def _collect(self, stop: StopRequest) -> None:
        hard_deadline = time.monotonic() + self.plan.duration_s + self.scenario.target.timeout + 30.0
        grace_deadline = None
        next_phase = 0
        while len(self.done) < self.pool.senders:
            now = time.monotonic()
            if self.abort_reason is None:
                reason = stop.reason or self._target_gone()
                if reason is None and now > hard_deadline:
                    reason = "workers did not finish within the planned duration plus the target timeout"
                    self.failure = reason
                if reason:
                    self._abort(reason)
            if self.abort_reason is not None:  # stopping: the workers get a grace to report what they have
                grace = HURRY_GRACE_S if stop.hurry else STOP_GRACE_S
                grace_deadline = min(grace_deadline or math.inf, now + grace)
                if now > grace_deadline:
                    if not stop.hurry:  # after a second Ctrl-C, not waiting is what was asked
                        self.failure = self.failure or "workers did not stop in time"
                    break
            while next_phase < len(self.plan.phases) and self._elapsed_s() >= self.plan.phases[next_phase].start_s:
                phase = self.plan.phases[next_phase]
                self.events.emit("phase_start", phase=phase.name, planned_at_s=phase.start_s, warmup=phase.warmup)
                next_phase += 1
            message = self.pool.get(timeout=0.1)
            if message is None:
                for i, why in self.pool.lost():
                    if i not in self.done:
                        self._sender_lost(i, why)
                        grace_deadline = grace_deadline or now + STOP_GRACE_S
                continue
            self._handle(message)

    def _sender_lost(self, i: int, why: str) -> None:
        """A sender gone without its WorkerDone: the run aborts, unless the pool may go on without it
        (a distributed run's `--on-node-loss continue`: the collector stops waiting for it)."""
        self.done[i] = None
        if self.pool.continue_without(i):
            self.collector.drop(i)
            return
        self.failure = why
        self._abort(why)

    def _handle(self, message: WorkerMessage) -> None:
        if isinstance(message, IntervalReport):
            for part in self.parts:
                part.on_report(message)
            before = self.collector.completed_intervals
            self.collector.add(message)
            self._emit_firsts()
            if self.collector.completed_intervals > before:
                elapsed = self._elapsed_s()
                for part in self.parts:  # before on_progress: both see this interval
                    part.on_interval(self.collector, elapsed)
                if self.on_progress:
                    self.on_progress(self.progress())
        elif isinstance(message, WorkerDone):
            self.done[message.worker] = message
        elif isinstance(message, WorkerFailed):
            self.failure = f"worker {message.worker} failed:\n{message.error}"
            self._abort(f"worker {message.worker} failed")
            self.done[message.worker] = None

    def _log_launch(self) -> None:
        """target_launch and target_ready of the first launch, once: logged when t = 0 is known, so
        that they get their (negative) times on the run's clock, or at the end of a run that never
        got that far (t_s null)."""
        if self.launched is not None and not self._launch_logged:
            self._launch_logged = True
            started, ready = self.launched
            self.events.emit("target_launch", at_ns=started)
            self.events.emit("target_ready", at_ns=ready, after_s=round((ready - started) / 1e9, 4))

    def _emit_firsts(self) -> None:
        """Events for the cold-start analysis, as the collector found them: the run's first
        successful response, each replica's first response, each request after an idle stretch."""
        c = self.collector
        if c.new_first_ok:
            end_ns, latency_us = c.first_ok
            self.events.emit("first_response", at_ns=end_ns, latency_ms=latency_us / 1000)
            c.new_first_ok = False
        for replica, first_ns, latency_us in c.new_replicas:
            self.events.emit("replica_first_seen", at_ns=first_ns, replica=replica,
                             latency_ms=None if latency_us is None else latency_us / 1000)
        c.new_replicas.clear()
        for probe in sorted(c.new_probes, key=lambda p: p.seq):
            self.events.emit("first_after_idle", at_ns=probe.end_ns, request=probe.seq,
                             intended_s=round(float(self.plan.offsets_s[probe.seq]), 6),
                             idle_gap_s=round(self.idle_gaps.get(probe.seq, 0.0), 6),
                             phase=self.plan.phases[int(self.plan.phase[probe.seq])].name,
                             latency_ms=probe.latency_us / 1000, error=probe.error, replica=probe.replica)
        c.new_probes.clear()

    def _abort(self, reason: str) -> None:
        reason = scrub(reason, self.secrets)
        if self.abort_reason is None:
            self.abort_reason = reason
            self.abort_ns = time.perf_counter_ns()
            self.events.emit("abort", reason=reason)
        if self.started:
            self.pool.stop()

    def _target_gone(self) -> str | None:
        # A restart action stops the target on purpose; its lock keeps one from starting between the
        # check and the poll, and afterwards self.target is the new process (None if it failed to come back).
        with self.actions.target_lock if self.actions is not None else nullcontext():
            if self.actions is not None and self.actions.restarting:
                return None
            if self.target is not None and (code := self.target.exit_code()) is not None:
                self.failure = f"the launched target exited with code {code} during the run"
                return self.failure
        return None

    def _elapsed_s(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9 if self.t0_ns else 0.0

    def progress(self) -> Progress:
        c = self.collector
        elapsed = self._elapsed_s()
        pace = c.pace(elapsed)
        rows = c.counters.values()
        latency = c.latency_so_far()
        with self._recent_lock:
            recent, seen = list(self.recent_events), self.events_seen
        return Progress(
            elapsed_s=elapsed,
            duration_s=self.plan.duration_s,
            phase=pace.phase,
            offered_rps=pace.offered_rps,
            achieved_rps=pace.achieved_rps,
            in_flight=pace.in_flight,
            sent=sum(int(v[SENT]) for v in rows),
            completed=sum(int(v[COMPLETED]) for v in rows),
            errors=sum(int(v[i]) for v in rows for i in ERROR_INDEX.values()),
            p50_ms=latency.get("p50_ms"),
            p99_ms=latency.get("p99_ms"),
            stopping=self.abort_reason,
            recent_events=recent,
            events_seen=seen,
        )

    # -- teardown and results ------------------------------------------------------------------

    def close(self) -> None:
        """Stop the parts, the workers and the target; finish the interval log; let the parts write
        their files. Runs whatever happened before."""
        self._log_launch()  # when the run ended before t = 0
        for part in self.parts:
            part.stop(self.abort_reason)
        if self.started:
            self.pool.close(hurry=self.t0_ns is None or (self.stop is not None and self.stop.hurry))
        if self.target is not None:
            stop_target(self.target)
            self.events.emit("target_stopped", exit_code=self.target.exit_code())
        if self.scenario.target.launch is not None:
            scrub_log(self.run_dir / results.TARGET_LOG, self.secrets)
        if self.collector is not None:
            self.collector.finish()
            self._emit_firsts()
        else:  # stopped before t = 0: the log is empty but has its header (a 0-byte file is not a log)
            HlogWriter(self._hlog_file, self.created_wall)
        self._hlog_file.close()
        os.replace(self._hlog_file.name, self.run_dir / results.HLOG)
        for part in self.parts:
            part.write(self.run_dir)
        if self.records is not None:
            self.records.node_of_worker = getattr(self.pool, "node_of_worker", lambda: None)()  # a remote pool's roster
            self.records.write(self.run_dir)

    def facts(self, started_wall: float) -> RunFacts:
        """What summary.json is made of, once the run is closed."""
        examples: dict[str, list[str]] = {}
        for done in self.done.values():
            for kind, messages in (done.error_examples if done else {}).items():
                bucket = examples.setdefault(kind, [])
                bucket.extend(m for m in messages if m not in bucket)
        return RunFacts(
            scenario=self.scenario, plan=self.plan, workers=self.pool.engines, collector=self.collector,
            started_wall=started_wall, t0_ns=self.t0_ns, t0_wall=self.t0_wall, end_ns=self.end_ns,
            abort_ns=self.abort_ns, abort_reason=self.abort_reason, launched=self.launched,
            gpus=self.telemetry.gpus if self.telemetry else [], error_examples={k: v[:5] for k, v in examples.items()},
            unaccounted=sum(done.unaccounted for done in self.done.values() if done),
            distributed=self.pool.describe(self.plan.duration_s) if self.started else None,
            request_records=self.records.summary() if self.records is not None else None,
        )
