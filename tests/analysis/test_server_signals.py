"""analysis/server_signals.py: the server's per-scrape quantiles placed at their windows' middles,
interpolated to the client's interval middles (never extrapolated), several series averaged, and
client − server. (The end-to-end path, a real run against an engine page: tests/telemetry/test_engine_mappings.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from latscope.analysis.run_data import RunData
from latscope.analysis.server_signals import client_vs_server, outside_median_ms
from latscope.report.server_panel import server_panel


def run_data(telemetry_rows: list[tuple[float, str, str, float]]) -> RunData:
    """Five 1 s intervals of client TTFT (p50 100, 110, ..., 140 ms; p99 300 ms) and the given
    (t_s, device, metric, value) telemetry rows of one source."""
    ts = pd.DataFrame({"interval_start_s": [float(k) for k in range(5)], "metric": "ttft", "class": "all", "phase": "p",
                       "count": 10, "p50_ms": [100.0 + 10 * k for k in range(5)], "p90_ms": 250.0, "p99_ms": 300.0,
                       "p99.9_ms": 300.0, "max_ms": 300.0})
    tel = pd.DataFrame([{"t_s": t, "source": "prom", "device": d, "metric": m, "value": v} for t, d, m, v in telemetry_rows],
                       columns=["t_s", "source", "device", "metric", "value"])
    summary = {"generator": {"interval_s": 1.0}, "phases": [{"name": "p", "start_s": 0.0, "duration_s": 5.0}], "duration_s": 5.0}
    return RunData(Path("."), summary, [], ts, tel)


def test_server_windows_interpolated_to_the_client_intervals():
    # Scrapes at 1, 2, 3 s: windows (0,1], (1,2], (2,3], middles 0.5, 1.5, 2.5: the client's interval middles.
    # Two replicas (devices), averaged: (40+60)/2, (50+70)/2, (60+80)/2.
    rows = [(t, d, "server_ttft_p50_ms", v + (20 if d == "r2" else 0)) for t, v in ((1.0, 40), (2.0, 50), (3.0, 60))
            for d in ("r1", "r2")]
    frame = client_vs_server(run_data(rows), "ttft", "server_ttft")
    assert frame["t_s"].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert frame["server_p50_ms"].tolist()[:3] == [50.0, 60.0, 70.0]
    assert all(math.isnan(v) for v in frame["server_p50_ms"].tolist()[3:])  # past the last window: not extrapolated
    assert frame["outside_p50_ms"].tolist()[:3] == [50.0, 50.0, 50.0]  # 100 − 50, 110 − 60, 120 − 70
    assert all(math.isnan(v) for v in frame["server_p99_ms"])  # the server exported no p99 here
    assert outside_median_ms(frame) == 50.0
    panel = server_panel([("TTFT", "the server's TTFT", frame)], run_data(rows).summary, [])
    assert panel.figure is not None and "50.0 ms of the median" in panel.lead


def test_without_the_servers_histogram_nothing_to_compare():
    frame = client_vs_server(run_data([(1.0, "server", "queue_depth", 3.0)]), "ttft", "server_ttft")
    assert frame.empty and outside_median_ms(frame) is None
    panel = server_panel([("TTFT", "the server's TTFT", frame)], {}, [])
    assert panel.figure is None and panel.not_measured == "the server's own TTFT and latency"


@pytest.mark.parametrize("gap_s", [0.25, 2.0])
def test_a_window_sits_at_its_middle_whatever_the_scrape_interval(gap_s):
    # scrapes every gap_s from gap_s: the value at t describes (t − gap_s, t], placed at t − gap_s/2
    times = [gap_s * k for k in range(1, int(6 / gap_s))]
    rows = [(t, "server", "server_ttft_p50_ms", (t - gap_s / 2) * 10) for t in times]  # linear in the middle's time
    frame = client_vs_server(run_data(rows), "ttft", "server_ttft").dropna(subset=["server_p50_ms"])
    assert frame["server_p50_ms"].tolist() == pytest.approx([x * 10 for x in frame["t_s"]])
