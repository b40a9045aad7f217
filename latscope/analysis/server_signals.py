"""The server's own view of a request beside latscope's: its TTFT (or end-to-end time) from its
/metrics, against the client-side TTFT (or latency) of the same intervals, and the difference, the
time spent outside the engine: the network, any proxy or gateway, the client.

Client side: p50 and p99 per reporting interval (timeseries.parquet, class "all"), each from the
intended send time. Server side: the per-scrape p50 and p99 of its histogram (telemetry.parquet
`server_ttft_p50_ms`, ...: telemetry/histograms.py), each placed at the middle of its scrape window
and interpolated linearly to the middle of each client interval, never extrapolated past the first
or last window; several series (replicas, sources) are averaged. Quantiles of two different
windows do not subtract exactly, and the server's are interpolated within its buckets (off by up to
a bucket's width), so the difference is a level to read over several intervals, not an exact
per-interval number.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from latscope.analysis.percentiles import interval_percentiles
from latscope.analysis.run_data import RunData

# (client metric, server signal prefix, how the report names the server's): pairs the report shows
PAIRS = (("ttft", "server_ttft", "the server's TTFT"), ("latency", "server_e2e", "the server's end-to-end time"))
COLUMNS = ("t_s", "warmup", "client_p50_ms", "client_p99_ms", "server_p50_ms", "server_p99_ms",
           "outside_p50_ms", "outside_p99_ms")


def has_server_signal(run: RunData, signal: str) -> bool:
    t = run.telemetry
    return bool(len(t)) and bool(t["metric"].isin([f"{signal}_p50_ms", f"{signal}_p99_ms"]).any())


def _server_at(run: RunData, metric: str, x: np.ndarray) -> np.ndarray:
    """The mean over the server's series of `metric` interpolated at x (NaN outside every series)."""
    t = run.telemetry
    rows = t[t["metric"] == metric]
    columns = []
    for _, series in rows.groupby(["source", "device"], sort=True, dropna=False):
        series = series.sort_values("t_s")
        ts, vs = series["t_s"].to_numpy(float), series["value"].to_numpy(float)
        if not len(ts):
            continue
        gap = float(np.median(np.diff(ts))) if len(ts) > 1 else 0.0
        mid = ts - gap / 2  # each value describes the window that ended at its scrape
        at = np.interp(x, mid, vs)
        at[(x < mid[0]) | (x > mid[-1])] = np.nan
        columns.append(at)
    if not columns:
        return np.full(len(x), np.nan)
    stacked = np.vstack(columns)
    with np.errstate(all="ignore"):
        counted = np.sum(~np.isnan(stacked), axis=0)
        return np.where(counted > 0, np.nansum(stacked, axis=0) / np.maximum(counted, 1), np.nan)


def client_vs_server(run: RunData, metric: str = "ttft", signal: str = "server_ttft") -> pd.DataFrame:
    """COLUMNS, one row per interval in which the client recorded `metric`: t_s (the interval's
    middle), warmup, the client's p50/p99, the server's (NaN where no window of it covers the
    interval) and client − server, all in ms. Empty when either side has nothing."""
    client = interval_percentiles(run, metric, "all")
    if not len(client) or not has_server_signal(run, signal):
        return pd.DataFrame({c: [] for c in COLUMNS})
    client = client[client["count"].fillna(0).to_numpy(float) > 0]
    x = client["t_s"].to_numpy(float) + run.interval_s / 2
    frame = pd.DataFrame({"t_s": x, "warmup": client["warmup"].to_numpy(bool)})
    for q in ("p50", "p99"):
        frame[f"client_{q}_ms"] = client[f"{q}_ms"].to_numpy(float)
        frame[f"server_{q}_ms"] = _server_at(run, f"{signal}_{q}_ms", x)
        frame[f"outside_{q}_ms"] = frame[f"client_{q}_ms"] - frame[f"server_{q}_ms"]
    return frame


def outside_median_ms(frame: pd.DataFrame, q: str = "p50") -> float | None:
    """The median over the measured intervals of client − server at `q`; None when none overlap."""
    values = frame.loc[~frame["warmup"].astype(bool), f"outside_{q}_ms"].to_numpy(float) if len(frame) else np.array([])
    values = values[~np.isnan(values)]
    return float(np.median(values)) if len(values) else None
