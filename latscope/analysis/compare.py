"""Run against run: percentile deltas per metric × class."""

from __future__ import annotations

import pandas as pd

from latscope.analysis.run_data import RunData

COMPARED_STATS = ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "mean_ms")


def percentile_deltas(base: RunData, new: RunData) -> pd.DataFrame:
    """One row per metric × class × stat present in either summary.json: metric, class, stat,
    base, new, delta_ms (new − base), delta_pct (None when base is 0 or missing)."""
    raise NotImplementedError
