"""Run against run: percentile deltas per metric × class."""

from __future__ import annotations

import pandas as pd

from latscope.analysis.run_data import RunData

COMPARED_STATS = ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "mean_ms")
COLUMNS = ("metric", "class", "stat", "base", "new", "delta_ms", "delta_pct")


def percentile_deltas(base: RunData, new: RunData) -> pd.DataFrame:
    """One row per metric × class × stat present in either summary.json: metric, class, stat,
    base, new, delta_ms (new − base), delta_pct (None when base is 0 or missing).
    Rows come in base's metric and class order, then what only the new run has; a side that
    lacks the metric, class or stat gives None there (and None deltas)."""
    a, b = base.summary.get("metrics", {}), new.summary.get("metrics", {})
    rows = []
    for metric in dict.fromkeys([*a, *b]):
        ca, cb = a.get(metric, {}), b.get(metric, {})
        for cls in dict.fromkeys([*ca, *cb]):
            sa, sb = ca.get(cls, {}), cb.get(cls, {})
            for stat in COMPARED_STATS:
                va, vb = sa.get(stat), sb.get(stat)
                if va is None and vb is None:
                    continue
                delta = None if va is None or vb is None else round(vb - va, 6)
                pct = None if delta is None or not va else round(100.0 * delta / va, 3)
                rows.append({"metric": metric, "class": cls, "stat": stat, "base": va, "new": vb,
                             "delta_ms": delta, "delta_pct": pct})
    return pd.DataFrame(rows, columns=list(COLUMNS))
