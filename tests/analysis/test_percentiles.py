"""The whole-run spectrum and the per-interval percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from analysis_runs import record_all, write_run
from latscope.analysis.percentiles import SPECTRUM_PERCENTILES, interval_percentiles, spectrum
from latscope.analysis.run_data import load_run
from latscope.recorder import merge, new_histogram, summarize, values_at
from helpers import read_intervals

WARMUP_US = 900_000  # every warm-up value: far above any measured one, so a leak would show at the top


def values(k: int) -> np.ndarray:
    return np.random.default_rng(k).lognormal(8, 0.8, 400)


def record(k, rec, phase):
    if phase.warmup:
        record_all(rec, "latency", "a", [WARMUP_US] * 50, True)
        return
    record_all(rec, "latency", "a", values(k))
    record_all(rec, "latency", "b", values(100 + k)[:37])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_run(tmp_path_factory.mktemp("p") / "run", [("warm", 0.0, 2.0, True), ("main", 2.0, 5.0, False)],
                     record, classes=("a", "b"))
    return load_run(path)


def test_spectrum_is_the_merged_measured_histogram(run):
    out = spectrum(run)
    assert set(out) == {"a", "b", "all"}
    by_tag = read_intervals(run.path, metrics=["latency"])
    for cls, frame in out.items():
        measured = merge(h for start, _, h in by_tag[("latency", cls)] if start >= 2.0)
        n = measured.get_total_count()
        assert n == {"a": 2000, "b": 185, "all": 2185}[cls]
        expected = values_at(measured, list(frame["percentile"]))
        assert frame["value_ms"].tolist() == [expected[p] / 1000 for p in frame["percentile"]]
        # counts run up to the total, as HdrHistogram's TotalCount column
        assert frame["count"].iloc[-1] == n and frame["count"].is_monotonic_increasing
        assert frame["count"].iloc[0] >= 1
        # warm-up is excluded: the 900 ms warm-up values would be the max
        assert frame["value_ms"].max() < WARMUP_US / 1000
        # only the percentiles the count supports, plus the max
        deepest = 100 * (1 - 1 / n)
        assert frame["percentile"].tolist() == [p for p in SPECTRUM_PERCENTILES if p <= deepest] + [100.0]
    assert out["b"]["percentile"].tolist()[-2] == 99.0  # 185 values: 99.5 would need 200
    assert spectrum(run, "ttft") == {}


def test_interval_percentiles_flag_warmup_and_match_each_interval(run):
    rows = interval_percentiles(run, "latency", "a")
    assert rows["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert rows["warmup"].tolist() == [True, True, False, False, False, False, False]
    assert rows["phase"].tolist() == ["warm"] * 2 + ["main"] * 5
    assert rows["count"].tolist() == [50, 50, 400, 400, 400, 400, 400]
    assert rows["completed"].tolist() == [50, 50, 400, 400, 400, 400, 400]
    hists = [h for _, _, h in read_intervals(run.path, metrics=["latency"])[("latency", "a")]]
    for column in ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms"):
        assert rows[column].tolist() == [summarize(h)[column] for h in hists]
    assert rows["in_flight"].isna().all()  # only "all" carries in_flight
    assert interval_percentiles(run, "latency", "all")["in_flight"].tolist() == [0] * 7
    assert len(interval_percentiles(run, "latency", "nope")) == 0


def test_percentile_rank_is_p_times_n_rounded_half_up_not_its_ceiling():
    """The rank of percentile p among N values is max(1, ⌊p·N + 0.5⌋) (HdrHistogram's definition,
    docs/timing.md), not ⌈p·N⌉: of the ten values 1 … 10 µs (each its own bucket, so the value is
    the rank), p91 is the 9th (9.1 rounds to 9; the ceiling would be 10), p14 the 1st (1.4 → 1, not
    2), p95 the 10th (9.5 rounds half up), p4 the 1st (0.4 → 0, at least 1). hdrh agrees."""
    h = new_histogram()
    for v in range(1, 11):
        h.record_value(v)
    got = values_at(h, [91, 14, 95, 4, 85])
    assert got == {91: 9, 14: 1, 95: 10, 4: 1, 85: 9}
    assert h.get_percentile_to_value_dict([91, 14, 95, 4, 85]) == got
