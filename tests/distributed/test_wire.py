"""What crosses between machines: interval reports (lossless), the plan (exact), frames, and the clock maths."""

from __future__ import annotations

import dataclasses
import re
import socket
import struct

import numpy as np
import pytest

from latscope.analysis.verdicts import node_validity, validity
from latscope.distributed.clock import ClockEstimate
from latscope.distributed.remote import check_no_secrets
from latscope.errors import RunError
from latscope.distributed.frames import MAX_FRAME, PeerGone, recv_frame, send_frame
from latscope.distributed.wire import (decode_plan, decode_report, encode_plan, encode_report, merge_reports, report_limits,
                                      shift_report)
from latscope.plan import build_plan
from latscope.records import IntervalReport, Probe
from latscope.recorder import new_histogram, summarize, to_sparse
from latscope.results.schema import COUNTERS, TURN_COUNTERS
from latscope.run.collector import Collector
from latscope.scenario import Validity, load_scenario, secret_values
from conftest import REPO


def engine_report(rng: np.random.Generator, k: int, worker: int, n: int = 2000) -> IntervalReport:
    """What an engine sends (smoke.yaml's one class, measured and warm-up): latency and send-lag
    histograms of real recorded values, counters, first responses and a probe."""
    histograms = {}
    for metric, scale in (("latency", 5_000), ("send_lag", 50)):
        for cls, warmup in (("default", False), ("default", True)):
            h = new_histogram()
            for v in rng.lognormal(np.log(scale), 1.0, n).astype(np.int64) + 1:
                h.record_value(int(v))
            histograms[(metric, cls, warmup)] = to_sparse(h)
    counters = {(0, False): rng.integers(0, 1000, len(COUNTERS)), (0, True): rng.integers(0, 1000, len(COUNTERS))}
    return IntervalReport(k, histograms, {"latency": int(rng.integers(0, 3))}, counters, int(rng.integers(0, 50)),
                          {f"replica-{worker}": (10_000 + worker, 1234), "shared": (20_000 - worker, None)},
                          [Probe(7 + worker, 30_000 + worker, 999, None, "r")], (5_000 + worker, 321), worker=worker,
                          turns={(0, 1, False): list(range(1, len(TURN_COUNTERS) + 1))})


def smoke_limits():
    """What a node's reports may say in a run of scenarios/smoke.yaml (validate.Limits)."""
    return report_limits(build_plan(load_scenario(REPO / "scenarios" / "smoke.yaml")), 100, {})


def test_a_report_survives_the_wire_exactly_and_small():
    r = engine_report(np.random.default_rng(1), 3, 0)
    blob = encode_report(r)
    back = decode_report(blob, 5, smoke_limits(), 3)
    assert back.worker == 5 and back.interval == 3 and back.in_flight == r.in_flight
    assert back.histograms.keys() == r.histograms.keys()
    for key, (idx, cnt) in r.histograms.items():
        assert np.array_equal(back.histograms[key][0], idx) and np.array_equal(back.histograms[key][1], cnt)
    assert {k: list(v) for k, v in back.counters.items()} == {k: list(v) for k, v in r.counters.items()}
    assert back.replicas == r.replicas and back.probes == r.probes and back.first_ok == r.first_ok
    assert {k: list(v) for k, v in back.turns.items()} == {(0, 1, False): list(range(1, len(TURN_COUNTERS) + 1))}
    raw = sum(i.nbytes + c.nbytes for i, c in r.histograms.values())
    assert len(blob) < raw / 3, (len(blob), raw)  # deltas in the narrowest type, then zlib


def test_a_nodes_merged_report_collects_to_exactly_what_its_engines_reports_would():
    """The lossless claim, end to end: a collector fed one node's merged, encoded, decoded reports
    ends with the same histograms and counters as one fed the three engines' own reports."""
    plan = build_plan(load_scenario(REPO / "scenarios" / "smoke.yaml"))
    rng = np.random.default_rng(7)
    engines = {k: [engine_report(rng, k, w) for w in range(3)] for k in range(3)}
    direct, via_node = Collector(3, plan, 1.0, None), Collector(1, plan, 1.0, None)
    for k, reports in engines.items():
        for r in reports:
            direct.add(dataclasses.replace(r))
        via_node.add(decode_report(encode_report(merge_reports(reports, worker=0)), 0, report_limits(plan, 100, {}), k))
    assert direct.completed_intervals == via_node.completed_intervals == 3
    a, b = direct.totals_with_all(), via_node.totals_with_all()
    assert a.keys() == b.keys()
    for metric in a:
        for cls in a[metric]:
            assert a[metric][cls].get_total_count() == b[metric][cls].get_total_count()
            assert summarize(a[metric][cls]) == summarize(b[metric][cls])
    assert {k: list(v) for k, v in direct.counters.items()} == {k: list(v) for k, v in via_node.counters.items()}
    assert direct.first_ok == via_node.first_ok == (5_000, 321)  # the earliest of the engines'
    assert direct.replicas == via_node.replicas


def test_times_move_onto_the_coordinators_clock():
    r = shift_report(engine_report(np.random.default_rng(2), 0, 1), -1_000)
    assert r.first_ok == (4_001, 321) and r.replicas["replica-1"] == (9_001, 1234) and r.probes[0].end_ns == 29_001


@pytest.mark.parametrize("name", ["burst.yaml", "chat_sessions.yaml", "trace_replay.yaml"])
def test_the_plan_crosses_exactly(name):
    plan = build_plan(load_scenario(REPO / "scenarios" / name))
    back = decode_plan(encode_plan(plan))
    for f in dataclasses.fields(plan):
        a, b = getattr(plan, f.name), getattr(back, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name
        elif dataclasses.is_dataclass(a) and not isinstance(a, type):  # Turns
            assert all(np.array_equal(getattr(a, t.name), getattr(b, t.name)) for t in dataclasses.fields(a))
        else:
            assert a == b, f.name


def test_frames_cross_a_socket_and_a_broken_peer_is_named():
    a, b = socket.socketpair()
    send_frame(a, {"t": "interval", "blob": b"\x00" * 100_000, "k": 3})
    assert recv_frame(b) == {"t": "interval", "blob": b"\x00" * 100_000, "k": 3}
    a.sendall(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(PeerGone, match="not a latscope peer"):
        recv_frame(b)
    a.close()
    with pytest.raises(PeerGone):
        recv_frame(b)


def test_the_clock_estimate_is_within_half_the_shortest_round_trip_however_asymmetric():
    theta = 1_000_000_000_000  # the remote reads 1000 s ahead
    rng = np.random.default_rng(3)
    clock = ClockEstimate()
    t, rtts = 0, []
    for _ in range(16):
        out, back = rng.uniform(50_000, 3_000_000, 2).astype(int)  # one-way delays 0.05–3 ms, unequal
        t += 10_000_000
        clock.add(t, t + out + theta, t + out + back)
        rtts.append(out + back)
    assert clock.rtt_min_ns == min(rtts) and clock.bound_ns == (min(rtts) + 1) // 2
    assert abs(clock.offset_ns - theta) <= clock.bound_ns
    assert clock.samples == 16 and len(clock.windows) == 4 and clock.drift_ppm() is None  # 0.16 s: too short


def test_drift_is_the_slope_of_the_offsets_and_the_given_offset_is_frozen():
    ppm = 40.0
    clock = ClockEstimate()
    for w in range(8):  # a window of 4 pings every 5 s, 35 s in all
        for i in range(4):
            t1 = w * 5_000_000_000 + i * 10_000_000
            rtt = 200_000 + 50_000 * i
            clock.add(t1, int(t1 + rtt / 2 + 7_000 + ppm * 1e-6 * (t1 + rtt / 2)), t1 + rtt)
        if w == 0:
            given = clock.freeze()
    assert clock.drift_ppm() == pytest.approx(ppm, abs=0.5)
    assert clock.offset_ns == given  # later, better samples do not change what the node was given
    summary = clock.summary(run_s=100)
    assert summary["max_error_ms"] == pytest.approx(0.1 + ppm * 1e-6 * 100 * 1e3, abs=0.01)


def test_a_nodes_clock_error_and_loss_stamp_the_run():
    node = {"node": 1, "host": "box-b", "status": "ok", "lost_at_s": None, "clock": {"max_error_ms": 0.4}}
    thresholds = Validity()
    assert node_validity(node, thresholds) == []
    assert node_validity({**node, "clock": {"max_error_ms": 2.0}}, thresholds)[0][0] == "degraded"
    assert node_validity({**node, "clock": {"max_error_ms": 12.0}}, thresholds)[0][0] == "invalid"
    verdict, reasons = validity({}, {"sent": 10}, thresholds, 100, [{**node, "status": "lost", "lost_at_s": 4.2}])
    assert verdict == "invalid" and reasons == ["node 1 (box-b) lost at 4.2 s: its share of the schedule was not sent"]


def test_a_dropped_sender_no_longer_holds_intervals_back_and_keeps_what_it_reported():
    """--on-node-loss continue: the collector completes later intervals without the lost node, and
    the intervals it did report keep its counts."""
    plan = build_plan(load_scenario(REPO / "scenarios" / "smoke.yaml"))
    rng = np.random.default_rng(9)
    c = Collector(2, plan, 1.0, None)
    c.add(engine_report(rng, 0, 0))
    c.add(engine_report(rng, 0, 1))
    c.add(engine_report(rng, 1, 0))
    c.add(engine_report(rng, 2, 0))
    assert c.completed_intervals == 1  # interval 1 waits for sender 1
    c.drop(1)
    assert c.completed_intervals == 3
    # interval 0 had both senders' requests, 1 and 2 only sender 0's: 4 reports' worth in all
    assert c.totals["latency"]["default"].get_total_count() == 4 * 2000


def test_a_window_of_slow_round_trips_does_not_pass_for_drift():
    """On a busy machine one window's four pings may all take 160 ms: its offset is off by up to
    80 ms, and fitted with the others it would read as thousands of ppm."""
    clock = ClockEstimate()
    for w in range(8):  # a window every 5 s, no drift at all
        rtt = 160_000_000 if w == 3 else 300_000
        for i in range(4):
            t1 = w * 5_000_000_000 + i * 10_000_000
            clock.add(t1, t1 + (rtt if w == 3 else rtt // 2), t1 + rtt)  # the slow one: all of it outbound
    assert clock.drift_ppm() == pytest.approx(0.0, abs=1e-6)
    assert clock.summary(run_s=30)["max_error_ms"] == pytest.approx(0.15, abs=0.001)
    short = ClockEstimate()
    for t1 in range(0, 25_000_000_000, 1_250_000_000):  # 25 s of windows: too short a span to tell drift from noise
        short.add(t1, t1 + 150_000, t1 + 300_000)
    assert short.drift_ppm() is None


def test_a_secret_written_as_it_is_never_leaves_for_the_workers(tmp_path, monkeypatch):
    """Locust's link is neither authenticated nor encrypted: the scenario text and the --set values
    go to every node, so a secret may be in them only as ${VAR}, filled on each machine."""
    monkeypatch.setenv("DIST_TEST_KEY", "sk-live-0123456789")
    source = (REPO / "scenarios" / "chat_sessions.yaml").read_text()
    scenario = load_scenario(REPO / "scenarios" / "chat_sessions.yaml", ("target.api_key=${DIST_TEST_KEY}",))
    secrets = secret_values(scenario)
    assert "sk-live-0123456789" in secrets
    check_no_secrets(source, ["target.api_key=${DIST_TEST_KEY}"], secrets)  # as ${VAR}: fine
    with pytest.raises(RunError, match=r"--set target.api_key holds a secret .* Write it as \$\{VAR\}"):
        check_no_secrets(source, ["target.api_key=sk-live-0123456789"], secrets)
    with pytest.raises(RunError, match="the scenario file holds a secret"):
        check_no_secrets(source.replace("${OPENAI_API_KEY:-}", "sk-live-0123456789"), [], secrets)


def test_a_report_mangled_any_way_is_refused_by_name_or_collected_never_a_crash():
    """Fixed-seed fuzz of what a hostile node could send as an interval report: a real report's
    fields, one at a time, replaced by values of other types and ranges (and random bytes, a zip
    bomb). decode_report either refuses it with InvalidMessage or gives a report the collector
    merges and summarizes; no other exception."""
    import zlib

    from latscope.distributed.frames import pack, unpack
    from latscope.distributed.validate import MAX_INFLATED, InvalidMessage

    plan = build_plan(load_scenario(REPO / "scenarios" / "smoke.yaml"))
    limits = report_limits(plan, 100, {})
    body = unpack(zlib.decompress(encode_report(engine_report(np.random.default_rng(3), 0, 0, n=200))))
    rng = np.random.default_rng(30)
    garbage = [None, -1, 2**63 - 1, -(2**63), 1.5, float("nan"), "x", "\x1b[2J", b"\xff" * 7, [], {}, [1, 2],
               {"a": 1}, True, ["latency", "default", False, "u2", b"\x01", "u1", b"\x01\x02"]]

    def paths(node, prefix=()):
        yield prefix
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            yield from paths(value, (*prefix, key))

    every = [p for p in paths(body) if p]
    refused = collected = 0
    for _ in range(600):
        mangled = unpack(pack(body))
        path = every[rng.integers(len(every))]
        target = mangled
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = garbage[rng.integers(len(garbage))]
        try:
            report = decode_report(zlib.compress(pack(mangled)), 0, limits, 0)
        except InvalidMessage:
            refused += 1
            continue
        collector = Collector(1, plan, 1.0, None)
        collector.add(report)
        collector.finish()
        collector.totals_with_all()
        collected += 1
    assert refused > 300 and collected > 0, (refused, collected)
    for blob, why in ((bytes(rng.integers(0, 256, 4096, dtype=np.uint8)), "not zlib data"),
                      (zlib.compress(bytes(MAX_INFLATED + 1)), "inflates past"),
                      (zlib.compress(pack(body))[:-9], "cut short"), (zlib.compress(b"\xc1"), "not msgpack"),
                      (zlib.compress(pack([1, 2])), "not a mapping")):
        with pytest.raises(InvalidMessage, match=why):
            decode_report(blob, 0, limits, 0)


def test_printable_shows_control_characters_instead_of_obeying_them():
    from latscope.distributed.validate import printable

    assert printable("evil\x1b[2J\x9b\u202ehost") == "evil\\x1b[2J\\x9b\\u202ehost"
    assert printable("line\nnext\ttab", lines=True) == "line\nnext\ttab"
    assert printable("line\nnext") == "line\\nnext"
    assert printable("é日本 ok") == "é日本 ok" and printable("x" * 300) == "x" * 254 + "…"


def test_a_records_chunk_is_refused_unless_it_names_a_part_file_of_the_nodes_own_engines_in_order_and_within_bounds():
    """What a node ships of its requests.parquet part files: every field checked before the coordinator
    writes a byte under the run directory (a name that would leave `.requests/`, a chunk over CHUNK
    bytes, a file larger than it said, another node's engine, chunks out of order, more than its budget)."""
    from latscope.distributed.validate import (RECORDS_BASE_BYTES, RECORDS_ROW_BYTES, InvalidMessage, frame,
                                               records_budget, records_chunk)
    from latscope.distributed.wire import CHUNK

    limits = smoke_limits()

    def chunk(**fields):
        return {"t": "records", "name": "w003-000001.parquet", "offset": 0, "size": 10, "data": b"0123456789", **fields}

    good = frame(chunk(), limits)
    assert good == {"t": "records", "name": "w003-000001.parquet", "engine": 3, "offset": 0, "size": 10,
                    "data": b"0123456789"}
    records_chunk(good, range(2, 4), None, 0, 0)  # engine 3 of the node's 2…3, first chunk, within budget
    for bad, why in (
            ({"name": "../x"}, "name '../x' is not a part file's"),
            ({"name": "../../w003-000001.parquet"}, "is not a part file's"),
            ({"name": "w003-000001.parquet/../../x"}, "is not a part file's"),
            ({"name": ".w003-000001.parquet.part"}, "is not a part file's"),
            ({"name": "w3-1.parquet"}, "is not a part file's"),
            ({"name": "w0003-000001.parquet"}, "is not a part file's"),  # one file, one name: no second spelling
            ({"name": "w003-000001.parquet\x00"}, "is not a part file's"),
            ({"name": "w" * 100}, "name is 100 characters long"),
            ({"name": 3}, "name is 3, not a string"),
            ({"data": bytes(CHUNK + 1), "size": CHUNK + 1}, f"data is {CHUNK + 1:,} bytes, not a chunk of 1 to {CHUNK:,}"),
            ({"data": b""}, "data is 0 bytes"),
            ({"data": "text"}, "data is 'text', not a chunk"),
            ({"offset": 5}, "offset is 5, not an integer in [0, 0]"),  # 10 bytes from byte 5 pass the file's end
            ({"size": 0}, "size is 0, not an integer in [1, "),
            ({"offset": -1}, "offset is -1"),
    ):
        with pytest.raises(InvalidMessage, match=re.escape(why)):
            frame(chunk(**bad), limits)
    with pytest.raises(InvalidMessage, match="its records frame has no data"):
        frame({"t": "records", "name": "w003-000001.parquet", "offset": 0, "size": 10}, limits)
    with pytest.raises(InvalidMessage, match="its done frame has no records"):
        frame({"t": "done", "not_sent": 0, "error_examples": {}, "unaccounted": 0}, limits)

    second = frame(chunk(offset=4, data=b"456789"), limits)
    for args, why in (
            ((good, range(0, 2), None, 0, 0), "is engine 3's, not one of its engines 0…1"),  # another node's name
            ((second, range(2, 4), None, 0, 0), "starts at byte 4, not 0"),
            ((second, range(2, 4), ("w003-000001.parquet", 10, 2), 2, 0), "is not the next of w003-000001.parquet (byte 2"),
            ((good, range(2, 4), ("w002-000001.parquet", 10, 4), 4, 0), "is not the next of w002-000001.parquet"),
            ((frame(chunk(size=RECORDS_BASE_BYTES + 1, data=b"x"), limits), range(2, 4), None, 0, 0),
             f"would take more than {RECORDS_BASE_BYTES:,} bytes (0 requests sent)"),
            ((good, range(2, 4), None, records_budget(1000) - 9, 1000), "would take more than"),
    ):
        with pytest.raises(InvalidMessage, match=re.escape(why)):
            records_chunk(*args)
    records_chunk(second, range(2, 4), ("w003-000001.parquet", 10, 4), 4, 0)  # the next chunk in order
    records_chunk(good, range(2, 4), None, records_budget(1000) - 10, 1000)  # exactly the budget
    assert records_budget(1000) == RECORDS_BASE_BYTES + 1000 * RECORDS_ROW_BYTES
