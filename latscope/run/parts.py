"""Run parts: what runs beside a run's measuring, plugged into the orchestrator at its moments.

Telemetry (telemetry/session.py), scenario actions (actions.py) and live metrics (live.py) are parts.
The orchestrator calls every part's hooks at the same moments, in the order of its parts (as Locust
calls its event listeners), so a new part is a class here-shaped and one line where the run builds
its parts, not another thread of `if`s through the orchestrator:

    start(t0_ns)                 t = 0 is known: perf_counter_ns of the first intended send
    on_report(report)            a worker's IntervalReport, as it arrives (before it is merged)
    on_interval(collector, s)    an interval every worker has reported, merged; s = seconds since t0
    stop(reason)                 the run is ending (reason: why it was cut short, None when it was not);
                                 called before the workers and the target are stopped
    write(run_dir)               the results directory is being written: add the part's own files

Hooks run on the orchestrator's thread and must return quickly (a part that needs time runs its own
thread) and catch their own failures (a failed sample is a gap, a failed action an event). A part
that subclasses RunPart gets a no-op for every hook it does not define; telemetry's session, which
lives below the run package (telemetry/ must not import it), defines all five instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from latscope.records import IntervalReport
    from latscope.run.collector import Collector


class RunPart(Protocol):
    """What the orchestrator calls on each of its parts (subclass it for no-op defaults)."""

    def start(self, t0_ns: int) -> None:
        pass

    def on_report(self, report: IntervalReport) -> None:
        pass

    def on_interval(self, collector: Collector, elapsed_s: float) -> None:
        pass

    def stop(self, reason: str | None) -> None:
        pass

    def write(self, run_dir: Path) -> None:
        pass
