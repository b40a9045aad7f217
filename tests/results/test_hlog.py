"""The tagged HdrHistogram interval log: round trip, header, and interop with other readers/writers."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hdrh.log import HistogramLogReader, HistogramLogWriter

from latscope.results.hlog import HlogReader, HlogWriter, read_hlog
from latscope.recorder import new_histogram, values_at

START = 1732284000.0  # Fri Nov 22 14:00:00 UTC 2024


def counts(h) -> np.ndarray:
    return np.ctypeslib.as_array(h.counts).copy()


def histogram(seed: int, n: int = 2000):
    rng = np.random.default_rng(seed)
    h = new_histogram()
    for v in rng.lognormal(np.log(20_000), 1.0, n).astype(np.int64).tolist():
        h.record_value(v)
    return h


INTERVALS = [
    ("latency/all", 0.0, 1.0, histogram(1)),
    ("service_time/chat", 0.0, 1.0, histogram(2)),
    (None, 1.0, 1.0, histogram(3)),
    ("latency/all", 1.0, 1.0, histogram(4)),
    ("latency/all", 2.0, 0.5, new_histogram()),  # an empty interval
    ("latency/all", 1234.5678, 10.25, histogram(5, n=10)),
]


@pytest.fixture()
def hlog_path(tmp_path):
    path = tmp_path / "histograms.hlog"
    with open(path, "w") as f:
        w = HlogWriter(f, START)
        w.comment("latscope test run")
        for tag, start, length, h in INTERVALS:
            w.write(tag, start, length, h)
    return path


def test_round_trip(hlog_path):
    got = list(read_hlog(hlog_path))
    assert [g[0] for g in got] == [i[0] for i in INTERVALS]
    for (_tag, start, length, h), (_, gstart, glength, gh) in zip(INTERVALS, got):
        # times are written with %.3f: off by at most half a millisecond (+ float noise)
        assert abs(gstart - start) <= 0.0005 + 1e-9 and abs(glength - length) <= 0.0005 + 1e-9
        assert np.array_equal(counts(gh), counts(h))
        assert gh.get_total_count() == h.get_total_count()
    reader = HlogReader(hlog_path)
    assert len(list(reader)) == len(INTERVALS)
    assert (reader.version, reader.start_time_s, reader.base_time_s) == ("1.3", START, START)


def test_hdrh_reader_parses_tags_times_and_histograms(hlog_path):
    reader = HistogramLogReader(str(hlog_path), new_histogram())
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append(h)
    reader.close()
    assert reader.get_start_time_sec() == START
    assert [h.get_tag() for h in got] == [i[0] for i in INTERVALS]
    for (_, start, length, h), gh in zip(INTERVALS, got):
        # hdrh stamps absolute epoch milliseconds: StartTime + relative start (BaseTime == StartTime)
        assert abs(gh.get_start_time_stamp() / 1000 - (START + start)) <= 0.0005 + 1e-6
        assert abs((gh.get_end_time_stamp() - gh.get_start_time_stamp()) / 1000 - length) <= 0.001 + 1e-6
        assert np.array_equal(counts(gh), counts(h))


def test_header_and_interval_max_in_ms():
    buf = io.StringIO()
    w = HlogWriter(buf, START)
    h = new_histogram()
    h.record_value(12_345)  # bucket [12344, 12351] (8 µs wide): max is its highest value
    w.write("latency/all", 3.0, 1.0, h)
    w.write(None, 4.0, 1.0, new_histogram())
    lines = buf.getvalue().splitlines()
    assert lines[:4] == [
        "#[Histogram log format version 1.3]",
        "#[StartTime: 1732284000.000 (seconds since epoch), Fri Nov 22 14:00:00 UTC 2024]",
        "#[BaseTime: 1732284000.000 (seconds since epoch)]",
        '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"',
    ]
    assert lines[4].split(",")[:4] == ["Tag=latency/all", "3.000", "1.000", "12.351"]
    assert lines[5].split(",")[:3] == ["4.000", "1.000", "0.000"]
    assert len(lines) == 6


@pytest.mark.parametrize("tag", ["a,b", "a b", "a\nb", "a\tb", ""])
def test_bad_tag_raises(tag):
    buf = io.StringIO()
    w = HlogWriter(buf, START)
    before = buf.getvalue()
    with pytest.raises(ValueError):
        w.write(tag, 0.0, 1.0, new_histogram())
    assert buf.getvalue() == before


def test_negative_time_raises():
    w = HlogWriter(io.StringIO(), START)
    with pytest.raises(ValueError):
        w.write("x", -1.0, 1.0, new_histogram())


# Written by the Java HistogramLogWriter (format 1.2, no BaseTime, relative timestamps, ns values
# with lowestTrackable 20000 and 2 significant figures); the sample used by HdrHistogramJS's tests.
JAVA_BLOB = "HISTFAAAAEV42pNpmSzMwMCgyAABTBDKT4GBgdnNYMcCBvsPEBEJISEuATEZMQ4uASkhIR4nrxg9v2lMaxhvMekILGZkKmcCAEf2CsI="
JAVA_LOG = f"""#[Fake log chunk]
#[Histogram log format version 1.2]
#[StartTime: 1441812279.474 (seconds since epoch), Wed Sep 09 08:24:39 PDT 2015]
"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
Tag=NOT-EMPTY,0.127,1.007,2.769,{JAVA_BLOB}
0.127,1.007,2.769,{JAVA_BLOB}
"""


def test_reads_a_java_written_log():
    reader = HlogReader(io.StringIO(JAVA_LOG))
    got = list(reader)
    assert [(tag, start, length) for tag, start, length, _ in got] == [("NOT-EMPTY", 0.127, 1.007), (None, 0.127, 1.007)]
    assert (reader.version, reader.start_time_s, reader.base_time_s) == ("1.2", 1441812279.474, None)
    h = got[0][3]
    assert (h.lowest_trackable_value, h.significant_figures) == (20_000, 2)
    assert h.get_total_count() == 741 == counts(h).sum()
    assert round(h.get_max_value() / 1e6, 3) == 2.769  # the line's Interval_Max (ns -> ms)
    ps = [0, 50, 99, 100]
    assert values_at(h, ps) == h.get_percentile_to_value_dict(ps)


def test_reads_a_log_from_hdrh_writer(tmp_path):
    path = tmp_path / "py.hlog"
    h = new_histogram()
    for v in (100, 2000, 30_000):
        h.record_value(v)
    with open(path, "w") as f:
        w = HistogramLogWriter(f)
        w.output_log_format_version()
        w.output_legend()
        w.output_interval_histogram(h, 10.0, 11.0, 1000.0)
        w.output_interval_histogram(h, 11.0, 12.5, 1000.0)
    # No StartTime line: the first interval starts the log (as in the Java and hdrh readers).
    got = list(read_hlog(path))
    assert [(tag, start, length) for tag, start, length, _ in got] == [(None, 0.0, 1.0), (None, 1.0, 1.5)]
    assert np.array_equal(counts(got[1][3]), counts(h))


def test_torn_last_line(hlog_path):
    text = hlog_path.read_text()
    hlog_path.write_text(text + "Tag=latency/all,9.000,1.000,1.0,HISTFAAAA")  # writer killed mid-line
    with pytest.raises(ValueError, match=":12: malformed"):
        list(read_hlog(hlog_path))
    assert len(list(read_hlog(hlog_path, strict=False))) == len(INTERVALS)


def test_want_skips_other_tags_undecoded(hlog_path):
    got = list(read_hlog(hlog_path, want=lambda tag: tag == "latency/all"))
    assert [(g[0], round(g[1], 3)) for g in got] == [(t, round(s, 3)) for t, s, _, _ in INTERVALS if t == "latency/all"]
    assert np.array_equal(counts(got[0][3]), counts(INTERVALS[0][3]))


def test_read_intervals_groups_by_metric_and_class(hlog_path):
    from helpers import read_intervals

    by_key = read_intervals(hlog_path.parent, metrics=["latency"])
    assert list(by_key) == [("latency", "all")]
    assert [start for start, _, _ in by_key[("latency", "all")]] == [0.0, 1.0, 2.0, 1234.568]
    assert set(read_intervals(hlog_path.parent)) == {("latency", "all"), ("service_time", "chat")}
