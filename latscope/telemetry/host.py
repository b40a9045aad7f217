"""latscope's own load: CPU and memory of the parent and of each worker process, CPU of the whole
host, and each worker's event-loop lag — so a run shows when the generator, not the target, was
the bottleneck.

CPU is in percent of one core (a worker using two cores reads 200), the host's total included, so
all cpu_pct rows share one unit. Event-loop lag is not sampled here: workers already measure it
(engine.py, intervals.py) and send it in their interval reports; `loop_lag_sample` turns one report into a row.
"""

from __future__ import annotations

import numpy as np
import psutil

from latscope.records import IntervalReport
from latscope.recorder import from_sparse, values_at
from latscope.telemetry import Sample

NAME = "host"


class HostSampler:
    """CPU% and RSS of `processes` ({device: pid}, e.g. {"parent": ..., "worker-0": ...}) and the host's CPU%."""

    name = NAME

    def __init__(self, processes: dict[str, int]):
        self.processes: dict[str, psutil.Process] = {}
        for device, pid in processes.items():
            try:
                self.processes[device] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
        self.cores = psutil.cpu_count() or 1
        # cpu_percent() measures from its previous call: the first call only starts the clock. The
        # host-wide one keeps that call per thread, so it is started by the first sample() instead.
        self._system_started = False
        for p in self.processes.values():
            self._quiet(p.cpu_percent, None)

    @staticmethod
    def _quiet(read, *args):
        try:
            return read(*args)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def sample(self) -> list[Sample]:
        system = psutil.cpu_percent(None) * self.cores
        out: list[Sample] = [("system", "cpu_pct", system)] if self._system_started else []
        self._system_started = True
        for device, process in list(self.processes.items()):
            with process.oneshot():
                cpu = self._quiet(process.cpu_percent, None)
                memory = self._quiet(process.memory_info)
            if cpu is None or memory is None:  # the process has ended (a worker that finished or died)
                del self.processes[device]
                continue
            out += [(device, "cpu_pct", float(cpu)), (device, "rss_bytes", float(memory.rss))]
        return out

    def close(self) -> None:
        pass


def loop_lag_sample(report: IntervalReport, interval_s: float) -> tuple[float, str, float] | None:
    """(t_s, device, p99 ms) of one worker interval report's event-loop lag — at the interval's start on
    the run's clock, like timeseries.parquet's interval_start_s — or None when it holds none."""
    parts = [sparse for (metric, _, _), sparse in report.histograms.items() if metric == "loop_lag"]
    if not parts:
        return None
    h = from_sparse(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    p99 = values_at(h, [99.0]).get(99.0)
    if p99 is None:
        return None
    return report.interval * interval_s, f"worker-{report.worker}", p99 / 1000.0
