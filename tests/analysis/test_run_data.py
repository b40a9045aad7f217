"""load_run: what it reads, and errors that name the file; the compact interval histograms."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from analysis_runs import record_all, write_run
from latscope.analysis.run_data import load_run, metric_intervals
from latscope.results.schema import TELEMETRY_COLUMNS
from latscope.errors import LatscopeError, ResultsError
from latscope.recorder import merge, values_at
from helpers import read_intervals


def simple(k, rec, phase):
    rng = np.random.default_rng(k)
    record_all(rec, "latency", "default", rng.lognormal(8, 0.7, 50 + 10 * k), phase.warmup)
    record_all(rec, "service_time", "default", rng.lognormal(7, 0.5, 20), phase.warmup)


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", [("w", 0.0, 2.0, True), ("m", 2.0, 4.0, False)], simple,
                     events=[{"event": "run_start", "t_s": 0.0}, {"event": "run_end", "t_s": 6.0}])


def test_load_run_reads_summary_events_timeseries_and_no_telemetry(run_dir):
    run = load_run(run_dir)
    assert run.summary["schema_version"] == 1 and run.warmup_phases == {"w"}
    assert [e["event"] for e in run.events] == ["run_start", "run_end"]
    assert set(run.timeseries["metric"]) == {"latency", "service_time"}
    assert len(run.timeseries[(run.timeseries.metric == "latency") & (run.timeseries["class"] == "all")]) == 6
    assert list(run.telemetry.columns) == list(TELEMETRY_COLUMNS) and len(run.telemetry) == 0
    assert run.interval_s == 1.0


def test_a_torn_last_event_line_is_skipped_and_missing_events_are_empty(run_dir):
    events = run_dir / "events.jsonl"
    events.write_text(events.read_text() + '{"event": "abo')
    assert len(load_run(run_dir).events) == 2
    events.unlink()
    assert load_run(run_dir).events == []


@pytest.mark.parametrize("damage, names", [
    (lambda d: d.rename(d.parent / "elsewhere"), "no such directory"),
    (lambda d: (d / "summary.json").unlink(), "summary.json is missing"),
    (lambda d: (d / "summary.json").write_text("{not json"), "summary.json: unreadable"),
    (lambda d: (d / "summary.json").write_text('{"scenario": "x"}'), "summary.json: not a latscope summary"),
    (lambda d: (d / "summary.json").write_text('{"schema_version": 99}'), "summary.json: schema_version 99 is newer"),
    (lambda d: (d / "timeseries.parquet").write_bytes(b"PAR1 garbage"), "timeseries.parquet: unreadable"),
    (lambda d: (d / "events.jsonl").write_text('{"event": "a"}\nnope\n{"event": "b"}\n'), "events.jsonl:2: not a JSON event"),
    (lambda d: pd.DataFrame({"t_s": [0.0]}).to_parquet(d / "telemetry.parquet"),
     "telemetry.parquet: missing columns source, device, metric, value"),
])
def test_load_run_errors_name_the_directory_and_file(run_dir, damage, names):
    damage(run_dir)
    with pytest.raises(ResultsError) as info:
        load_run(run_dir)
    assert names in str(info.value) and str(run_dir) in str(info.value)
    assert isinstance(info.value, LatscopeError)


def test_metric_intervals_match_the_hlog_and_a_missing_hlog_is_named(run_dir):
    run = load_run(run_dir)
    compact = metric_intervals(run, "latency")
    full = read_intervals(run_dir, metrics=["latency"])
    assert set(compact) == {"default", "all"}
    for cls, intervals in compact.items():
        expected = full[("latency", cls)]
        assert intervals.start_s.tolist() == [s for s, _, _ in expected]
        assert intervals.totals.tolist() == [h.get_total_count() for _, _, h in expected]
        p99 = [intervals.span_percentile(99.0, i, i) for i in range(len(intervals))]
        assert p99 == [values_at(h, [99.0])[99.0] for _, _, h in expected]
        for p, first, last in ((50.0, 0, 0), (99.0, 1, 3), (0.0, 2, 5), (100.0, 0, 5)):
            merged = merge(h for _, _, h in expected[first:last + 1])
            assert intervals.span_percentile(p, first, last) == values_at(merged, [p])[p]
        both = intervals.merged([1, 4])
        assert np.array_equal(np.ctypeslib.as_array(both.counts),
                              np.ctypeslib.as_array(merge([expected[1][2], expected[4][2]]).counts))
    assert metric_intervals(run, "latency") is compact  # decoded once
    assert metric_intervals(run, "nothing") == {}
    (run_dir / "histograms.hlog").unlink()
    with pytest.raises(ResultsError, match="histograms.hlog is missing"):
        metric_intervals(load_run(run_dir), "latency")


def test_a_log_from_another_writer_reads_the_same_through_the_reference_reader(run_dir):
    fast = metric_intervals(load_run(run_dir), "latency")
    hlog = run_dir / "histograms.hlog"
    # without BaseTime (as hdrh's own writer leaves it) the fast path steps aside
    hlog.write_text("".join(line for line in hlog.read_text().splitlines(True) if not line.startswith("#[BaseTime")))
    slow = metric_intervals(load_run(run_dir), "latency")
    assert set(slow) == set(fast)
    for cls in fast:
        for field in ("start_s", "length_s", "offsets", "index", "count"):
            assert np.array_equal(getattr(slow[cls], field), getattr(fast[cls], field)), (cls, field)


def test_a_malformed_interval_line_is_named(run_dir):
    hlog = run_dir / "histograms.hlog"
    lines = hlog.read_text().splitlines(True)
    at = next(i for i, line in enumerate(lines) if line.startswith("Tag=latency/all"))
    lines[at] = lines[at].rsplit(",", 1)[0] + ",HISTFAAAAnotbase64!!\n"
    hlog.write_text("".join(lines))
    with pytest.raises(ResultsError, match=rf"histograms.hlog:{at + 1}: malformed interval line"):
        metric_intervals(load_run(run_dir), "latency")
    metric_intervals(load_run(run_dir), "service_time")  # other metrics' lines are not even decoded
