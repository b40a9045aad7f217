"""A run's telemetry: the samplers the scenario asks for, each on its own thread, their rows, and
telemetry.parquet.

Each sampler gets a thread of its own, so a slow or dead Prometheus endpoint costs that source at
most its timeout per tick — never the other sources, never the run's collect loop. A failed sample
is a gap: no rows, one `telemetry_gap` event when a streak of failures starts (and
`telemetry_resumed` when it ends), and one warning line per source for the whole run.

Rows are kept in flat arrays (about 20 bytes a row: an hour at 4 Hz over 40 series is ~12 MB) up
to MAX_ROWS, then dropped with a warning. t_s is on the run's clock: seconds from t0_ns, the first
intended send, the clock of timeseries.parquet and events.jsonl; a sample's time is the middle of
its read.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from latscope import results
from latscope.errors import RunError
from latscope.telemetry import Sampler, TelemetryUnavailable
from latscope.telemetry.host import HostSampler, loop_lag_sample
from latscope.telemetry.nvml import open_nvml
from latscope.telemetry.prometheus import PrometheusSampler

if TYPE_CHECKING:
    from latscope.records import IntervalReport
    from latscope.scenario import Telemetry as TelemetryConfig

log = logging.getLogger("latscope.telemetry")

MAX_ROWS = 10_000_000
MAX_GAP_EVENTS = 20  # per source; a flapping endpoint must not flood events.jsonl
JOIN_GRACE_S = 2.0  # past a sampler's own timeout, how long stop() waits for its thread


class _Rows:
    """Columnar, thread-safe: t_s and value as float64 arrays, (source, device, metric) as a series id."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.t_s, self.series, self.value = array("d"), array("I"), array("d")
        self.keys: dict[tuple[str, str, str], int] = {}
        self.full = False
        self._lock = threading.Lock()

    def add(self, t_s: float, source: str, rows: list[tuple[str, str, float]]) -> bool:
        """False once MAX_ROWS is reached (the rows are dropped)."""
        with self._lock:
            if len(self.t_s) + len(rows) > self.max_rows:
                self.full = True
                return False
            for device, metric, value in rows:
                sid = self.keys.setdefault((source, device, metric), len(self.keys))
                self.t_s.append(t_s)
                self.series.append(sid)
                self.value.append(value)
            return True

    def table(self) -> dict[str, pa.Array]:
        with self._lock:
            names = list(self.keys)  # in id order
            ids = pa.array(self.series, pa.uint32())

            def column(i: int) -> pa.Array:
                return pa.array([n[i] for n in names], pa.string()).take(ids)

            return {
                "t_s": pa.array(self.t_s, pa.float64()),
                "source": column(0),
                "device": column(1),
                "metric": column(2),
                "value": pa.array(self.value, pa.float64()),
            }


class TelemetrySession:
    """A run part (run/parts.py, all five hooks): build with `from_config`; `start` (once t0 is known)
    starts the samplers, `on_report` takes each worker's event-loop lag, `stop`, then `write`
    telemetry.parquet."""

    def __init__(self, config: TelemetryConfig, events: results.EventLog, samplers: list[tuple[Sampler, float, float]],
                 gpus: list[dict], report_interval_s: float, max_rows: int = MAX_ROWS,
                 processes: Callable[[], dict[str, int]] = dict):
        """`processes`: {device: pid} of the processes whose CPU and memory the host source samples,
        asked for at start (when the workers exist)."""
        self.config = config
        self.processes = processes
        self.report_interval_s = report_interval_s  # the workers' reporting interval (output.interval)
        self.events = events
        self.samplers = samplers  # (sampler, interval s, join timeout s)
        self.gpus = gpus  # summary.json environment.gpus
        self.rows = _Rows(max_rows)
        self.t0_ns: int | None = None
        self._stop = threading.Event()
        self._threads: list[tuple[threading.Thread, Sampler, float]] = []
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # -- building -----------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: TelemetryConfig, events: results.EventLog, report_interval_s: float,
                    nvml: ModuleType | None = None, processes: Callable[[], dict[str, int]] = dict) -> TelemetrySession:
        """The samplers of a scenario's `telemetry:` section. NVML that cannot
        start is one event and one warning with `nvml: auto`, a RunError with `nvml: true`."""
        samplers: list[tuple[Sampler, float, float]] = []
        gpus: list[dict] = []
        missing: list[tuple[str, str]] = []
        if config.nvml is not False:
            try:
                sampler = open_nvml(nvml)
            except TelemetryUnavailable as exc:
                if config.nvml is True:
                    raise RunError(f"telemetry.nvml is true but GPU telemetry is unavailable: {exc}") from None
                missing.append(("nvml", str(exc)))
            else:
                gpus = sampler.environment()
                samplers.append((sampler, config.interval, JOIN_GRACE_S + 1.0))
        for source in config.prometheus:
            samplers.append((PrometheusSampler(source.name, source.url, source.mapping, source.timeout),
                             source.interval or config.interval, source.timeout + JOIN_GRACE_S))
        telemetry = cls(config, events, samplers, gpus, report_interval_s, processes=processes)
        for source, reason in missing:
            telemetry.unavailable(source, reason)
        return telemetry

    def unavailable(self, source: str, reason: str) -> None:
        self.events.emit("telemetry_unavailable", source=source, reason=reason)
        self._warn(source, f"telemetry: no {source} samples in this run ({reason})")

    # -- running ------------------------------------------------------------------------------

    def start(self, t0_ns: int) -> None:
        """Start every sampler on its own thread; with `host` on, the host source samples the host's
        CPU and the CPU and memory of `processes()`."""
        self.t0_ns = t0_ns
        if self.config.host:
            self.samplers.append((HostSampler(self.processes()), self.config.interval, JOIN_GRACE_S))
        for sampler, interval, join_s in self.samplers:
            thread = threading.Thread(target=self._loop, args=(sampler, interval),
                                      name=f"latscope-telemetry-{sampler.name}", daemon=True)
            thread.start()
            self._threads.append((thread, sampler, join_s))

    def _loop(self, sampler: Sampler, interval_s: float) -> None:
        interval_ns = int(interval_s * 1e9)
        next_ns = time.perf_counter_ns()
        failing, gaps = False, 0
        while not self._stop.is_set():
            before = time.perf_counter_ns()
            try:
                samples = sampler.sample()
            except Exception as exc:  # noqa: BLE001 - any failed read is a gap, never the end of the run
                reason = f"{type(exc).__name__}: {exc}"
                if not failing:
                    gaps += 1
                    if gaps <= MAX_GAP_EVENTS:
                        self.events.emit("telemetry_gap", source=sampler.name, reason=reason)
                failing = True
                self._warn(sampler.name, f"telemetry: {sampler.name} sample failed ({reason}); "
                                         "its samples are missing until it answers (warned once)")
            else:
                if failing and gaps <= MAX_GAP_EVENTS:
                    self.events.emit("telemetry_resumed", source=sampler.name)
                failing = False
                t_s = ((before + time.perf_counter_ns()) / 2 - self.t0_ns) / 1e9
                self._add(t_s, sampler.name, samples)
            now = time.perf_counter_ns()
            next_ns += interval_ns
            if next_ns <= now:  # a read longer than the interval: skip the ticks it overran
                next_ns += (now - next_ns) // interval_ns * interval_ns + interval_ns
            self._stop.wait((next_ns - now) / 1e9)

    def _add(self, t_s: float, source: str, samples: list[tuple[str, str, float]]) -> None:
        if samples and not self.rows.add(t_s, source, samples) and "rows" not in self._warned:
            self.events.emit("telemetry_truncated", max_rows=self.rows.max_rows)
            self._warn("rows", f"telemetry: {self.rows.max_rows:,} rows reached; later samples are dropped")

    def on_report(self, report: IntervalReport) -> None:
        """A worker's interval report: its event-loop lag p99 as a host/worker-N row at the interval's start."""
        if not self.config.host:
            return
        sample = loop_lag_sample(report, self.report_interval_s)
        if sample is not None:
            t_s, device, ms = sample
            self._add(t_s, "host", [(device, "loop_lag_p99_ms", ms)])

    def on_interval(self, collector: object, elapsed_s: float) -> None:
        """Nothing to do per merged interval (run part hook)."""

    def _warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("%s", message)

    # -- ending -------------------------------------------------------------------------------

    def stop(self, reason: str | None = None) -> None:
        """Stop sampling and close the samplers. Waits at most a sampler's timeout plus a grace for
        its thread; a thread stuck past that is left (it is a daemon) and its sampler not closed."""
        self._stop.set()
        for thread, sampler, join_s in self._threads:
            thread.join(join_s)
            if thread.is_alive():
                self._warn(f"stuck-{sampler.name}", f"telemetry: {sampler.name} did not stop in {join_s:g} s")
                continue
            try:
                sampler.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's results
                log.debug("closing %s: %s", sampler.name, exc)
        if not self._threads:  # never started (the run ended before t0): close what was opened
            for sampler, _, _ in self.samplers:
                try:
                    sampler.close()
                except Exception:  # noqa: BLE001
                    pass
        self._threads = []
        self.samplers = []

    def write(self, run_dir: Path) -> None:
        results.write_table(run_dir / results.TELEMETRY, self.rows.table())
