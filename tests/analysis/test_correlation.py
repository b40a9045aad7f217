"""Latency against telemetry, per interval: a constructed series with a known Pearson r."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis_runs import record_all, write_run
from latscope.analysis.correlation import aligned, correlations
from latscope.analysis.run_data import load_run

# p99 of the measured intervals 2..11 in µs (below 2048: exact in the histograms, so p99_ms = x / 1000)
X = np.array([500, 700, 600, 900, 800, 1000, 1200, 1100, 1500, 1300], float)
R = 0.8


def with_r(x: np.ndarray, r: float) -> np.ndarray:
    """A series whose Pearson correlation with x is exactly r: r of x's direction plus sqrt(1-r²)
    of a direction orthogonal to it (and to the mean)."""
    xc = (x - x.mean()) / np.linalg.norm(x - x.mean())
    z = np.random.default_rng(7).normal(size=len(x))
    z -= z.mean()
    z -= z.dot(xc) * xc
    z /= np.linalg.norm(z)
    return 50 + 10 * (r * xc + np.sqrt(1 - r * r) * z)


def record(k, rec, phase):
    record_all(rec, "latency", "default", [1900 if phase.warmup else int(X[k - 2])] * 100, phase.warmup)


def telemetry() -> pd.DataFrame:
    rows = []
    util = with_r(X, R)
    for k in range(12):
        measured = k >= 2
        y = util[k - 2] if measured else 0.0  # warm-up: nonsense that would spoil r if it were used
        for t, d in ((k + 0.25, -3.0), (k + 0.75, 3.0)):  # two samples an interval, mean y
            rows.append((t, "nvml", "0", "gpu_util_pct", y + d))
        rows.append((k + 0.5, "nvml", "0", "mem_bw_util_pct", (X[k - 2] / 100) ** 3 if measured else 1e6))
        rows.append((k + 0.5, "nvml", "0", "power_w", 300.0))
    rows += [(3.1, "host", None, "cpu_pct", 40.0), (4.1, "host", None, "cpu_pct", 60.0)]
    return pd.DataFrame(rows, columns=["t_s", "source", "device", "metric", "value"])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_run(tmp_path_factory.mktemp("t") / "run", [("warm", 0.0, 2.0, True), ("main", 2.0, 10.0, False)],
                     record, telemetry=telemetry())
    return load_run(path)


def test_aligned_has_one_row_per_measured_interval_and_interval_means(run):
    frame = aligned(run)
    assert frame["t_s"].tolist() == [float(k) for k in range(2, 12)]
    assert frame["p99_ms"].tolist() == (X / 1000).tolist()
    assert frame["nvml/0/gpu_util_pct"].to_numpy() == pytest.approx(with_r(X, R))
    cpu = frame["host//cpu_pct"]
    assert cpu[frame.t_s == 3.0].item() == 40.0 and cpu[frame.t_s == 4.0].item() == 60.0 and cpu.isna().sum() == 8


def test_correlations_give_the_constructed_r_strongest_first(run):
    out = correlations(run)
    assert [r["series"] for r in out] == ["nvml/0/mem_bw_util_pct", "nvml/0/gpu_util_pct", "host//cpu_pct",
                                         "nvml/0/power_w"]
    bw, util, cpu, power = out
    assert util["pearson"] == pytest.approx(R, abs=1e-9) and util["n"] == 10
    assert (util["source"], util["device"], util["metric"]) == ("nvml", "0", "gpu_util_pct")
    # a monotone but curved relation: rank correlation 1, Pearson below it
    assert bw["spearman"] == pytest.approx(1.0) and 0.9 < bw["pearson"] < 1.0
    assert cpu["n"] == 2 and cpu["pearson"] is None and cpu["spearman"] is None and cpu["device"] is None
    assert power["n"] == 10 and power["pearson"] is None  # constant: no correlation to speak of


def test_no_telemetry_no_series(tmp_path):
    run = load_run(write_run(tmp_path / "run", [("m", 0.0, 3.0, False)], record))
    assert list(aligned(run).columns) == ["t_s", "p99_ms"] and correlations(run) == []
