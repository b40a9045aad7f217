"""Percentiles from a run's histograms: the whole-run spectrum per class, and per interval."""

from __future__ import annotations

import pandas as pd

from latscope.analysis.run_data import RunData

# The percentile ladder of the spectrum plot: HdrHistogram's "percentile distribution" idea, with
# points evenly spaced on the 1/(1-p) axis up to the deepest percentile the count supports.
SPECTRUM_PERCENTILES: tuple[float, ...] = (
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.75, 99.9, 99.95, 99.975, 99.99, 99.995, 99.999, 100.0,
)


def spectrum(run: RunData, metric: str = "latency") -> dict[str, pd.DataFrame]:
    """class -> DataFrame(percentile, value_ms, count) over the measured (non-warm-up) intervals,
    merged losslessly from histograms.hlog; only percentiles with at least one sample beyond them
    (100 * (1 - 1/count) at most) plus the max. {} when the metric has no data."""
    raise NotImplementedError


def interval_percentiles(run: RunData, metric: str = "latency", cls: str = "all") -> pd.DataFrame:
    """One row per interval from timeseries.parquet: t_s (interval start), phase, warmup (bool),
    count, p50_ms, p90_ms, p99_ms, p99.9_ms, max_ms, scheduled, completed, errors, in_flight
    (counters and in_flight as written; in_flight only for class "all"). Warm-up rows are kept
    and flagged so that a plot can shade them."""
    raise NotImplementedError
