"""Synthetic results directories for the analysis tests, written by the real writers: values go
through a Recorder, are merged by the Collector into histograms.hlog (HlogWriter) and
timeseries.parquet exactly as a run does, and summary.json holds the Collector's totals.

A plain module (not a conftest.py, see tests/reference_server/refserver.py for why); the tests of
this folder import it by name (pytest puts the folder on sys.path).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from latscope import results
from latscope.plan import PhasePlan, Plan
from latscope.records import IntervalReport
from latscope.recorder import Recorder, summarize
from latscope.results.hlog import HlogWriter
from latscope.results.schema import COMPLETED, COUNTERS, TIMESERIES_COLUMNS
from latscope.run.collector import Collector

START_EPOCH_S = 1_763_900_000.0
# record(k, rec, phase) puts interval k's values into the recorder: rec.record(metric, cls, µs, warmup)
Record = Callable[[int, Recorder, PhasePlan], None]


def write_run(
    path: Path,
    phases: list[tuple[str, float, float, bool]],  # (name, start_s, duration_s, warmup)
    record: Record,
    *,
    classes: tuple[str, ...] = ("default",),
    interval_s: float = 1.0,
    intervals: int | None = None,
    events: Iterable[dict] = (),
    telemetry: pd.DataFrame | None = None,
    scenario: dict | None = None,
) -> Path:
    """A results directory at `path` with `intervals` intervals (default: the phases' length)."""
    path.mkdir(parents=True, exist_ok=True)
    plan_phases = [PhasePlan(*p) for p in phases]
    empty = np.zeros(0)
    plan = Plan(empty, empty.astype(np.int16), empty.astype(np.int16), plan_phases, list(classes),
                empty.astype(np.int32), empty.astype(np.int32), empty.astype(np.int64))
    n = intervals if intervals is not None else int(round(plan.duration_s / interval_s))
    with open(path / results.HLOG, "w") as f:
        collector = Collector(1, plan, interval_s, HlogWriter(f, START_EPOCH_S))
        for k in range(n):
            phase = _phase_at(plan_phases, k * interval_s)
            rec = Recorder()
            record(k, rec, phase)
            histograms, clamped = rec.snapshot()
            counters = {}
            for (metric, cls, warmup), (_, counts) in histograms.items():
                if metric == "latency":
                    row = counters.setdefault((classes.index(cls), warmup), np.zeros(len(COUNTERS), np.int64))
                    row[COMPLETED] += int(counts.sum())
            collector.add(IntervalReport(k, histograms, clamped, counters, 0, {}, [], None, worker=0))
        collector.finish()
    results.write_rows(path / results.TIMESERIES, collector.rows, list(TIMESERIES_COLUMNS))
    totals = collector.totals_with_all()
    summary = {
        "schema_version": results.SCHEMA_VERSION,
        "scenario": "synthetic",
        "partial": False,
        "metrics": {m: {c: summarize(h) for c, h in by_class.items()} for m, by_class in totals.items()},
        "phases": [{"name": p.name, "start_s": p.start_s, "duration_s": p.duration_s, "warmup": p.warmup}
                   for p in plan_phases],
        "generator": {"workers": 1, "interval_s": interval_s},
    }
    results.write_json(path / results.SUMMARY, summary)
    (path / results.EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    if telemetry is not None:
        telemetry.to_parquet(path / "telemetry.parquet", index=False)
    if scenario is not None:
        results.write_text(path / results.SCENARIO, json.dumps(scenario))  # JSON is YAML
    return path


def _phase_at(phases: list[PhasePlan], t: float) -> PhasePlan:
    for p in phases:
        if p.start_s <= t < p.start_s + p.duration_s:
            return p
    return phases[-1]


def record_all(rec: Recorder, metric: str, cls: str, values_us: Iterable[int], warmup: bool = False) -> None:
    for v in values_us:
        rec.record(metric, cls, int(v), warmup)
