"""Latency against telemetry: one value of each per interval, aligned on the run's clock."""

from __future__ import annotations

import pandas as pd

from latscope.analysis.run_data import RunData


def aligned(run: RunData, metric: str = "latency", cls: str = "all", stat: str = "p99_ms") -> pd.DataFrame:
    """One row per measured interval: t_s, the latency statistic (column named `stat`), and one
    column per telemetry series "<source>/<device>/<metric>" with the mean of its samples in
    that interval (NaN where none)."""
    raise NotImplementedError


def correlations(run: RunData, metric: str = "latency", cls: str = "all", stat: str = "p99_ms") -> list[dict]:
    """Per telemetry series: {"series", "source", "device", "metric", "n" (intervals with both),
    "pearson", "spearman"} (None where n < 3 or a side is constant), strongest |spearman| first."""
    raise NotImplementedError
