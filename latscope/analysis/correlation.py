"""Latency against telemetry: one value of each per interval, aligned on the run's clock.

A telemetry sample at t_s belongs to the interval [k·interval, (k+1)·interval) holding t_s, the
same intervals as the time series; a series' value for an interval is the mean of its samples
there. Only measured (non-warm-up) intervals are compared. Spearman's rank correlation is the
headline (latency and utilization are rarely linear in each other; a p99 that climbs steeply once
the GPU is saturated is still a perfect rank correlation), Pearson's r is given beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latscope.analysis.percentiles import interval_percentiles
from latscope.analysis.run_data import RunData

MIN_POINTS = 3


def _part(value: object) -> str | None:
    """A telemetry label as text; None when missing (None or NaN, as pandas reads a null)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def series_name(source: object, device: object, metric: object) -> str:
    """"<source>/<device>/<metric>"; a missing part is empty."""
    return "/".join(_part(v) or "" for v in (source, device, metric))


def aligned(run: RunData, metric: str = "latency", cls: str = "all", stat: str = "p99_ms") -> pd.DataFrame:
    """One row per measured interval: t_s, the latency statistic (column named `stat`), and one
    column per telemetry series "<source>/<device>/<metric>" with the mean of its samples in
    that interval (NaN where none)."""
    rows = interval_percentiles(run, metric, cls)
    if stat not in rows:
        ts = run.timeseries
        picked = ts[(ts["metric"] == metric) & (ts["class"] == cls)].sort_values("interval_start_s") if len(ts) else ts
        rows = rows.assign(**{stat: picked[stat].to_numpy() if stat in picked else np.nan})
    rows = rows[~rows["warmup"].astype(bool)]
    values = pd.to_numeric(rows[stat], errors="coerce").to_numpy(float)
    out = pd.DataFrame({"t_s": rows["t_s"].to_numpy(float), stat: values})
    tel = run.telemetry
    if not len(tel) or not len(out):
        return out
    interval = run.interval_s
    k = np.floor(tel["t_s"].to_numpy(float) / interval + 1e-9)
    names = [series_name(s, d, m) for s, d, m in zip(tel["source"], tel["device"], tel["metric"])]
    binned = (pd.DataFrame({"series": names, "k": k, "value": pd.to_numeric(tel["value"], errors="coerce")})
              .groupby(["series", "k"])["value"].mean().unstack("series"))
    keys = np.floor(out["t_s"].to_numpy() / interval + 1e-9)
    for name in sorted(binned.columns):
        out[name] = binned[name].reindex(keys).to_numpy(float)
    return out


def correlations(run: RunData, metric: str = "latency", cls: str = "all", stat: str = "p99_ms") -> list[dict]:
    """Per telemetry series: {"series", "source", "device", "metric", "n" (intervals with both),
    "pearson", "spearman"} (None where n < 3 or a side is constant), strongest |spearman| first."""
    frame = aligned(run, metric, cls, stat)
    tel = run.telemetry
    meta = {series_name(s, d, m): (_part(s), _part(d), _part(m)) for s, d, m in
            tel[["source", "device", "metric"]].drop_duplicates().itertuples(index=False)} if len(tel) else {}
    out = []
    for name in frame.columns[2:]:
        both = frame[[stat, name]].dropna()
        x, y = both[stat].to_numpy(float), both[name].to_numpy(float)
        source, device, tmetric = meta.get(name, (None, None, name.rsplit("/", 1)[-1]))
        out.append({"series": name, "source": source, "device": device, "metric": tmetric, "n": len(both),
                    "pearson": _pearson(x, y),
                    "spearman": _pearson(both[stat].rank().to_numpy(float), both[name].rank().to_numpy(float))})
    out.sort(key=lambda r: (r["spearman"] is None, -abs(r["spearman"] or 0.0), r["series"]))
    return out


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < MIN_POINTS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    r = float(np.corrcoef(x, y)[0, 1])
    return None if math.isnan(r) else r
