"""Run against run: deltas per metric × class × stat."""

from __future__ import annotations

import math

from analysis_runs import record_all, write_run
from latscope.analysis.compare import COMPARED_STATS, percentile_deltas
from latscope.analysis.run_data import load_run


def run_with(tmp_path, name, latency_us, extra_metric=None):
    def record(k, rec, phase):
        record_all(rec, "latency", "default", [latency_us] * 100)
        if extra_metric:
            record_all(rec, extra_metric, "default", [500] * 10)
    return load_run(write_run(tmp_path / name, [("m", 0.0, 1.0, False)], record))


def test_deltas_new_minus_base_with_percentages(tmp_path):
    base = run_with(tmp_path, "base", 1000, extra_metric="encode")
    new = run_with(tmp_path, "new", 1500, extra_metric="decode")
    frame = percentile_deltas(base, new)
    assert list(frame.columns) == ["metric", "class", "stat", "base", "new", "delta_ms", "delta_pct"]
    row = frame[(frame.metric == "latency") & (frame["class"] == "all") & (frame.stat == "p99_ms")].iloc[0]
    assert (row.base, row.new, row.delta_ms, row.delta_pct) == (1.0, 1.5, 0.5, 50.0)
    assert set(frame[frame.metric == "latency"].stat) == set(COMPARED_STATS)
    # a metric only one run has: the other side and the deltas are None
    only_base = frame[frame.metric == "encode"]
    assert len(only_base) == 2 * len(COMPARED_STATS)  # default and all
    assert only_base["new"].isna().all() and only_base["delta_ms"].isna().all()
    assert only_base["base"].tolist()[0] == 0.5
    only_new = frame[frame.metric == "decode"]
    assert only_new["base"].isna().all() and only_new["delta_pct"].isna().all()
    assert list(dict.fromkeys(frame.metric)) == ["latency", "encode", "decode"]


def test_a_zero_base_has_no_percentage(tmp_path):
    base = run_with(tmp_path, "base", 1000)
    new = run_with(tmp_path, "new", 1000)
    base.summary["metrics"]["latency"]["all"]["min_ms"] = 0.0
    base.summary["metrics"]["latency"]["all"]["p50_ms"] = 0.0
    frame = percentile_deltas(base, new)
    row = frame[(frame["class"] == "all") & (frame.stat == "p50_ms")].iloc[0]
    assert row.delta_ms == 1.0 and (row.delta_pct is None or math.isnan(row.delta_pct))
    same = frame[(frame["class"] == "all") & (frame.stat == "p99_ms")].iloc[0]
    assert same.delta_ms == 0.0 and same.delta_pct == 0.0
