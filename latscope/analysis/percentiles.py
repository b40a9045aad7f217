"""Percentiles from a run's histograms: the whole-run spectrum per class, and per interval."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latscope.analysis.run_data import RunData, metric_intervals
from latscope.recorder import values_at

# The percentile ladder of the spectrum plot: HdrHistogram's "percentile distribution" idea, with
# points evenly spaced on the 1/(1-p) axis up to the deepest percentile the count supports.
SPECTRUM_PERCENTILES: tuple[float, ...] = (
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.75, 99.9, 99.95, 99.975, 99.99, 99.995, 99.999, 100.0,
)
INTERVAL_COLUMNS = ("t_s", "phase", "warmup", "count", "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms",
                    "scheduled", "completed", "errors", "in_flight")


def spectrum(run: RunData, metric: str = "latency") -> dict[str, pd.DataFrame]:
    """class -> DataFrame(percentile, value_ms, count) over the measured (non-warm-up) intervals,
    merged losslessly from histograms.hlog; only percentiles with at least one sample beyond them
    (100 * (1 - 1/count) at most) plus the max. {} when the metric has no data.

    `count` is, as in HdrHistogram's percentile distribution (its TotalCount column), the number
    of values at or below `value_ms`; the last row's is the class's total."""
    out = {}
    for cls, intervals in metric_intervals(run, metric).items():
        h = intervals.merged(~run.is_warmup(intervals.start_s))
        n = h.get_total_count()
        if n == 0:
            continue
        deepest = 100.0 * (1.0 - 1.0 / n)
        ladder = [p for p in SPECTRUM_PERCENTILES if p <= deepest + 1e-9 and p < 100.0] + [100.0]
        values = values_at(h, ladder)
        counts = np.ctypeslib.as_array(h.counts)
        cum = np.cumsum(counts)
        rows = []
        for p in ladder:
            us = values[p]
            # values at or below the value: through the counts-array index of its bucket
            rows.append({"percentile": p, "value_ms": us / 1000, "count": int(cum[h.get_counts_array_index(us)])})
        out[cls] = pd.DataFrame(rows, columns=["percentile", "value_ms", "count"])
    return out


def interval_percentiles(run: RunData, metric: str = "latency", cls: str = "all") -> pd.DataFrame:
    """One row per interval from timeseries.parquet: t_s (interval start), phase, warmup (bool),
    count, p50_ms, p90_ms, p99_ms, p99.9_ms, max_ms, scheduled, completed, errors, in_flight
    (counters and in_flight as written; in_flight only for class "all"). Warm-up rows are kept
    and flagged so that a plot can shade them."""
    ts = run.timeseries
    if not len(ts) or "metric" not in ts:
        return pd.DataFrame({c: [] for c in INTERVAL_COLUMNS})
    rows = ts[(ts["metric"] == metric) & (ts["class"] == cls)].sort_values("interval_start_s", kind="stable")
    frame = pd.DataFrame({
        "t_s": rows["interval_start_s"].to_numpy(float),
        "phase": rows["phase"].to_numpy(object),
        "warmup": rows["phase"].isin(run.warmup_phases).to_numpy(bool),
    })
    for column in INTERVAL_COLUMNS[3:]:
        frame[column] = rows[column].to_numpy() if column in rows else None
    return frame


def percentile_ms(run: RunData, metric: str, q: float, cls: str = "all") -> float:
    """The q-th percentile (0 to 100) of `metric` for `cls`, in ms, over the measured intervals merged
    losslessly from histograms.hlog, with the summary's semantics (recorder.values_at): any q, not
    only the summary's ladder (p99.99 of a long run, say); the spectrum's value at its own points.
    Warm-up is left out by interval, as everywhere in analysis (run_data.py): without a warm-up phase
    this is summary.json's p99_ms at q = 99 to the µs; with one it can differ a little, since the
    summary leaves out exactly the warm-up's values. NaN when the class recorded nothing."""
    intervals = metric_intervals(run, metric).get(cls)
    if intervals is None:
        return float("nan")
    h = intervals.merged(~run.is_warmup(intervals.start_s))
    if h.get_total_count() == 0:
        return float("nan")
    return values_at(h, [q])[q] / 1000
