"""The serialization breakdown: parts as shares of client-inclusive latency (of latency for a run
recorded before requests were prepared ahead), from a synthetic run with exact means (values below
2048 µs are exact in the histograms, so every mean is known)."""

from __future__ import annotations

import pytest

from analysis_runs import record_all, write_run
from latscope.analysis.run_data import load_run
from latscope.analysis.serialization import breakdown

N = 100  # requests per interval and class


def record(k, rec, phase):
    for cls, scale in (("json", 1), ("binary", 2)):
        record_all(rec, "latency", cls, [1000 * scale] * N)
        record_all(rec, "encode", cls, [100 * scale] * N)
        record_all(rec, "network", cls, [200 * scale] * N)
        record_all(rec, "server.queue", cls, [150 * scale] * (N // 2))  # half the responses carried it
        record_all(rec, "server.compute", cls, [400 * scale] * N)
        record_all(rec, "server.total", cls, [475 * scale] * N)  # queue + compute: not a part of its own
        record_all(rec, "decode", cls, [50 * scale] * N)


SCENARIO = {"target": {"url": "http://127.0.0.1:9", "protocol": "kserve-v2"},
            "workload": {"classes": [{"name": "json"}, {"name": "binary", "protocol": "kserve-v2-grpc"}]}}


def test_parts_and_other_are_shares_of_mean_latency_summing_to_one(tmp_path):
    path = write_run(tmp_path / "run", [("m", 0.0, 2.0, False)], record, classes=("json", "binary"), scenario=SCENARIO)
    frame = breakdown(load_run(path))
    assert list(frame.columns) == ["class", "protocol", "part", "mean_ms", "share", "latency_ms"]
    json_rows = frame[frame["class"] == "json"].set_index("part")
    assert list(json_rows.index) == ["encode", "network", "server.compute", "server.queue", "decode", "other"]
    expected = {"encode": 0.1, "network": 0.2, "server.compute": 0.4, "server.queue": 0.075, "decode": 0.05}
    expected["other"] = 1.0 - sum(expected.values())
    for part, mean_ms in expected.items():
        assert json_rows.loc[part, "mean_ms"] == pytest.approx(mean_ms, abs=1e-9)
        assert json_rows.loc[part, "share"] == pytest.approx(mean_ms / 1.0, abs=1e-9)
    assert set(json_rows["protocol"]) == {"kserve-v2"}
    binary = frame[frame["class"] == "binary"].set_index("part")
    assert set(binary["protocol"]) == {"kserve-v2-grpc"}
    assert binary["share"].tolist() == pytest.approx(json_rows["share"].tolist())  # every part doubled
    every = frame[frame["class"] == "all"]
    assert set(every["protocol"]) == {"mixed"}
    for cls in ("json", "binary", "all"):
        assert frame[frame["class"] == cls]["share"].sum() == pytest.approx(1.0, abs=1e-12)


def test_no_parts_no_rows(tmp_path):
    path = write_run(tmp_path / "run", [("m", 0.0, 1.0, False)],
                     lambda k, rec, phase: record_all(rec, "latency", "default", [1000] * 10))
    frame = breakdown(load_run(path))
    assert len(frame) == 0 and list(frame.columns) == ["class", "protocol", "part", "mean_ms", "share", "latency_ms"]


def test_with_encode_done_ahead_the_parts_are_shares_of_client_inclusive_latency(tmp_path):
    def ahead(k, rec, phase):
        record_all(rec, "latency", "default", [1000] * N)  # encode not inside: done before the intended time
        record_all(rec, "encode", "default", [100] * N)
        record_all(rec, "client_inclusive", "default", [1100] * N)
        record_all(rec, "network", "default", [600] * N)
        record_all(rec, "decode", "default", [50] * N)

    frame = breakdown(load_run(write_run(tmp_path / "run", [("m", 0.0, 1.0, False)], ahead))).set_index("part")
    frame = frame[frame["class"] == "default"]
    assert frame["mean_ms"].to_dict() == pytest.approx({"encode": 0.1, "network": 0.6, "decode": 0.05, "other": 0.35})
    assert frame["share"].to_dict() == pytest.approx({"encode": 0.1 / 1.1, "network": 0.6 / 1.1, "decode": 0.05 / 1.1,
                                                      "other": 0.35 / 1.1})
    assert set(frame["latency_ms"]) == {1.0}
