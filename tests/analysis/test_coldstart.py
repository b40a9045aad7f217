"""Cold starts on a synthetic run with known answers: the run's start (a warm-up phase), a phase
change, a replica present from the start and one first seen mid-run."""

from __future__ import annotations

import pytest

from analysis_runs import record_all, write_run
from latscope.analysis.coldstart import cold_starts
from latscope.analysis.run_data import load_run
from latscope.results.schema import OTHER_REPLICAS, REPLICA_METRIC
from latscope.recorder import from_sparse, summarize, Recorder

MS = 1000
NEW = "r1 two,x"  # as the server sent it; its class is "r1_two_x"


def latency(k: int) -> int:
    """All latency: warm-up starts at 50 ms, the main phase (from 2 s) at 100 ms for 2 s; else 10 ms."""
    return 50 * MS if k == 0 else 100 * MS if k in (2, 3) else 10 * MS


def new_replica(k: int) -> list[int]:
    """First seen at 5.3 s: 200 ms then 40 ms, then 10 ms."""
    return {5: [200 * MS] * 10, 6: [40 * MS] * 10}.get(k, [10 * MS] * 10) if k >= 5 else []


def record(k, rec, phase):
    record_all(rec, "latency", "default", [latency(k)] * 10, phase.warmup)
    record_all(rec, REPLICA_METRIC, "r0-1", [10 * MS] * 10, phase.warmup)
    record_all(rec, REPLICA_METRIC, "r1_two_x", new_replica(k), phase.warmup)
    if k == 11:
        record_all(rec, REPLICA_METRIC, "r9-late", [300 * MS] * 10, phase.warmup)
    record_all(rec, REPLICA_METRIC, OTHER_REPLICAS, [500 * MS], phase.warmup)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    events = [{"event": "replica_first_seen", "t_s": 0.004, "replica": "r0-1"},
              {"event": "replica_first_seen", "t_s": 5.3, "replica": NEW}]
    path = write_run(tmp_path_factory.mktemp("c") / "run", [("warm", 0.0, 2.0, True), ("main", 2.0, 10.0, False)],
                     record, events=events)
    return load_run(path)


def hdr_ms(values_us: list[int]) -> dict:
    """summarize() of a histogram of exactly these values."""
    rec = Recorder()
    record_all(rec, "x", "x", values_us)
    ((_, sparse),) = rec.snapshot()[0].items()
    return summarize(from_sparse(*sparse))


def test_each_start_against_its_own_steady_state(run):
    starts = {s["label"]: s for s in cold_starts(run, first_n=10)}
    assert list(starts) == ["warm", "r0-1", "main", "r1_two_x", "r9-late"]  # time order

    warm = starts["warm"]
    assert (warm["kind"], warm["at_s"], warm["warmup"], warm["class"]) == ("run_start", 0.0, True, "all")
    # first 10 requests: interval 0; steady: the second half of the phase, interval 1
    assert warm["first_count"] == 10 and warm["first_p50_ms"] == hdr_ms([50 * MS])["p50_ms"]
    assert warm["steady_count"] == 10 and warm["steady_p50_ms"] == hdr_ms([10 * MS])["p50_ms"]
    assert warm["cold"] is True and warm["slowdown_p50"] == pytest.approx(50 * 1.0 / 10, rel=2e-3)
    assert warm["time_to_steady_s"] == 1.0

    main = starts["main"]
    assert (main["kind"], main["at_s"], main["warmup"]) == ("phase", 2.0, False)
    assert main["first_p50_ms"] == hdr_ms([100 * MS])["p50_ms"] and main["cold"] is True
    # the last phase runs to the end of the run (12 intervals here): steady from 7 s, 5 intervals
    assert main["steady_from_s"] == 7.0 and main["steady_count"] == 50
    assert main["time_to_steady_s"] == 2.0  # intervals 2 and 3 are slow, 4 on are steady

    new = starts["r1_two_x"]
    assert (new["kind"], new["at_s"], new["metric"], new["warmup"]) == ("replica", 5.3, REPLICA_METRIC, False)
    assert new["replica"] == NEW  # the id as the server sent it
    assert new["first_count"] == 10 and new["first_p50_ms"] == hdr_ms([200 * MS])["p50_ms"]
    # steady: the second half of [5.3, 12): intervals starting at 8.65 s or later, 9..11
    assert new["steady_from_s"] == 9.0 and new["steady_count"] == 30
    assert new["steady_p50_ms"] == hdr_ms([10 * MS])["p50_ms"] and new["cold"] is True
    assert new["slowdown_p50"] == pytest.approx(20.0, rel=2e-3)
    assert new["time_to_steady_s"] == pytest.approx(7.0 - 5.3)  # 40 ms at 6 s is still 4x steady

    old = starts["r0-1"]
    assert old["at_s"] == 0.004 and old["warmup"] is True and old["cold"] is False
    assert old["slowdown_p50"] == 1.0 and old["time_to_steady_s"] == 0.0

    late = starts["r9-late"]  # no event: at its first interval; nothing after its first requests
    assert late["at_s"] == 11.0 and late["steady_count"] == 0 and late["steady_p50_ms"] is None
    assert late["slowdown_p50"] is None and late["time_to_steady_s"] is None and late["cold"] is False
    assert OTHER_REPLICAS not in starts


def test_first_n_merges_whole_intervals(run):
    starts = {s["label"]: s for s in cold_starts(run, first_n=15)}
    new = starts["r1_two_x"]
    # 15 requests need two intervals: both whole (interval granularity), 20 requests
    assert new["first_count"] == 20 and new["first_until_s"] == 7.0
    assert new["first_p50_ms"] == hdr_ms([200 * MS] * 10 + [40 * MS] * 10)["p50_ms"]
    assert new["first_max_ms"] == hdr_ms([200 * MS])["max_ms"]
    # default N = 20: the same two intervals
    assert {s["label"]: s for s in cold_starts(run)}["r1_two_x"]["first_count"] == 20


def one_slow_first(slow_ms: int, steady_outlier_ms: int, slow_in: int = 1):
    """A replica whose very first request waited `slow_ms` (a model load), then 10 ms; one steady
    request late in the run takes `steady_outlier_ms`. With `slow_in` > 1 the slow request is the
    first of that interval instead (the replica's first is interval 1)."""
    def record(k, rec, phase):
        values = [10 * MS] * 10
        if k == slow_in:
            values[0] = slow_ms * MS
        if k == 8:
            values[0] = steady_outlier_ms * MS
        record_all(rec, REPLICA_METRIC, "r1", values if k >= 1 else [], phase.warmup)
        record_all(rec, "latency", "default", [10 * MS] * 10, phase.warmup)
    return record


@pytest.mark.parametrize("slow_ms, outlier_ms, cold_by", [
    (250, 20, "max"),  # one request paid a 250 ms load: p50 of the first 10 is 10 ms, the max gives it away
    (25, 20, None),    # the first max within 1.5 x of a steady max: nothing steady state does not also do
    (250, 200, None),  # the steady state has its own 200 ms request: a 250 ms first one is not out of the ordinary
])
def test_a_single_slow_first_request_is_cold_by_max(tmp_path, slow_ms, outlier_ms, cold_by):
    path = write_run(tmp_path / "run", [("main", 0.0, 10.0, False)], one_slow_first(slow_ms, outlier_ms),
                     events=[{"event": "replica_first_seen", "t_s": 1.0, "replica": "r1"}])
    (replica,) = [s for s in cold_starts(load_run(path), first_n=10) if s["kind"] == "replica"]
    assert replica["first_p50_ms"] == hdr_ms([10 * MS])["p50_ms"] and replica["slowdown_p50"] == 1.0
    assert replica["steady_max_ms"] == hdr_ms([outlier_ms * MS])["max_ms"]
    assert (replica["cold_by"], replica["cold"]) == (cold_by, cold_by is not None)


def test_one_slow_request_after_the_first_interval_is_not_cold_by_max(tmp_path):
    """The same 250 ms request, in the replica's second interval (still among its first 20 requests),
    after a first interval as fast as its steady state: a load delays the first requests, a busy box
    stalls one at any time (a pre-warmed replica was called cold for one such request)."""
    path = write_run(tmp_path / "run", [("main", 0.0, 10.0, False)], one_slow_first(250, 20, slow_in=2),
                     events=[{"event": "replica_first_seen", "t_s": 1.0, "replica": "r1"}])
    (replica,) = [s for s in cold_starts(load_run(path), first_n=20) if s["kind"] == "replica"]
    assert replica["first_count"] == 20 and replica["first_max_ms"] == hdr_ms([250 * MS])["max_ms"]
    assert replica["steady_max_ms"] == hdr_ms([20 * MS])["max_ms"] and replica["slowdown_p50"] == 1.0
    assert (replica["cold_by"], replica["cold"]) == (None, False)


def test_capacity_events_say_how_long_and_how_badly_in_time_order():
    from latscope.analysis.coldstart import capacity_events, describe, title

    steady = {"first_count": 20, "first_max_ms": 380.0, "steady_p50_ms": 25.0, "steady_max_ms": 60.0}
    cold = {
        "target_launch": {"launched_at_s": -3.0, "ready_s": 2.0, "first_response_s": 3.2, "steady_s": 3.7,
                          "first_response_latency_ms": 200.0, **steady, "cold": True, "suffered_s": 0.5, "affected_requests": 10},
        "restarts": [],
        "scale_up": [{"action": "add", "issued_at_s": 10.0, "replica": "r1-7", "class": "r1-7", "first_seen_s": 12.0,
                      "first_sent_s": 11.6, "first_latency_ms": 400.0, **steady, "cold": True, "suffered_s": 2.5,
                      "affected_requests": 31}],
        "scale_from_zero": [{"phase": "wake", "at_s": 20.0, "idle_gap_s": 6.0, "first_latency_ms": 30.0, **steady,
                             "cold": False, "suffered_s": 0.0, "affected_requests": 0}],
    }
    launch, up, wake = capacity_events(cold)
    assert [e["kind"] for e in (launch, up, wake)] == ["launch", "scale_up", "scale_from_zero"]
    # each on its own series, caused when it was caused, measured from when users met it
    assert (launch["cause_at_s"], launch["at_s"], launch["metric"]) == (-3.0, 0.0, "latency")
    assert (up["cause_at_s"], up["at_s"], up["metric"], up["class"]) == (10.0, 11.6, "replica_latency", "r1-7")
    assert (wake["cause_at_s"], wake["at_s"]) == (14.0, 20.0)
    assert title(up) == "scale-up r1-7 @ 11.6 s" and title(wake) == "scale from zero after idle, phase wake @ 20.0 s"
    assert describe(up) == "users waited up to 400 ms, 16× the steady p50 of 25.0 ms, for 2.5 s (31 requests)"
    assert describe(launch) == ("users waited up to 200 ms, 8× the steady p50 of 25.0 ms, for 0.5 s (10 requests) "
                                "(after the process started: ready 2.0 s, first response 3.2 s, steady 3.7 s)")
    assert describe(wake) == "not cold: first requests up to 30 ms, steady p50 25.0 ms"
    assert capacity_events(None) == [] and capacity_events({"target_launch": None, "restarts": [], "scale_up": [],
                                                            "scale_from_zero": []}) == []


def _one_phase_run(tmp_path, p50_ms_of: dict[int, float], default_ms: float = 10.0):
    """20 one-second intervals of 10 equal values: p50_ms_of[k] ms in interval k, default_ms elsewhere."""
    def record(k, rec, phase):
        record_all(rec, "latency", "default", [int(p50_ms_of.get(k, default_ms) * MS)] * 10)
    return load_run(write_run(tmp_path / "run", [("p", 0.0, 20.0, False)], record))


def test_suffering_ends_when_latency_first_comes_back_and_a_later_bump_does_not_stretch_it(tmp_path):
    # a model load (300 ms), two slow-ish seconds (14 ms: p50 above 1.2 × 10, max under 1.5 × 10), then a bump at 6 s
    (start,) = cold_starts(_one_phase_run(tmp_path, {0: 300, 1: 14, 2: 14, 6: 30}), first_n=10)
    assert start["cold"] is True and start["steady_ceiling_ms"] == round(1.2 * start["steady_p50_ms"], 3)
    assert start["slow_for_s"] == 1.0  # only interval 0's max is over 1.5 × the steady max
    assert start["suffered_s"] == 3.0 and start["affected_requests"] == 30  # p50 back under the ceiling at 3 s
    assert start["time_to_steady_s"] == 7.0  # "stays steady" waits out the bump at 6 s


def test_a_noisy_steady_state_raises_the_ceiling_to_its_own_worst_window(tmp_path):
    # steady windows alternate 10 and 20 ms: a 14 ms window is as steady as they are
    noisy = {k: 20.0 for k in range(10, 20, 2)}
    (start,) = cold_starts(_one_phase_run(tmp_path, {0: 300, 1: 14, 2: 14, **noisy}), first_n=10)
    assert start["steady_ceiling_ms"] == hdr_ms([20 * MS])["p50_ms"]
    assert start["cold"] is True and start["slow_for_s"] == 1.0 and start["suffered_s"] == 1.0
    assert start["time_to_steady_s"] == 1.0


def busy_start(peers_too: bool):
    """A replica first seen at 5 s whose first 20 requests took 20 ms, then 10 ms; its peer, there from
    the start at 10 ms, took 20 ms over the same two seconds too when `peers_too` (the machine was busy
    starting the new replica), else stayed at 10 ms."""
    def record(k, rec, phase):
        slow = k in (5, 6)
        record_all(rec, REPLICA_METRIC, "r0", [(20 if slow and peers_too else 10) * MS] * 10, phase.warmup)
        record_all(rec, REPLICA_METRIC, "r1", [(20 if slow else 10) * MS] * 10 if k >= 5 else [], phase.warmup)
        record_all(rec, "latency", "default", [10 * MS] * 20, phase.warmup)
    return record


@pytest.mark.parametrize("peers_too, shared, cold_by", [
    (False, 1.0, "p50"),  # only the new replica was slow: its own cold start
    (True, 2.0, None),    # every replica was twice as slow then: the machine's slowdown, not the replica's
])
def test_a_slowdown_its_peers_shared_is_not_a_replicas_cold_start(tmp_path, peers_too, shared, cold_by):
    path = write_run(tmp_path / "run", [("main", 0.0, 12.0, False)], busy_start(peers_too),
                     events=[{"event": "replica_first_seen", "t_s": 0.0, "replica": "r0"},
                             {"event": "replica_first_seen", "t_s": 5.0, "replica": "r1"}])
    new = {s["label"]: s for s in cold_starts(load_run(path), first_n=20)}["r1"]
    assert new["first_p50_ms"] == hdr_ms([20 * MS])["p50_ms"] and new["slowdown_p50"] == 2.0
    assert new["peers_slowdown_p50"] == shared
    assert (new["cold_by"], new["cold"]) == (cold_by, cold_by is not None)


def test_a_wake_that_was_not_cold_is_told_only_for_a_target_that_can_scale():
    """"scale from zero after idle … not cold" means something only for a target that has replicas to
    scale (it kept its capacity); against one that names none it says nothing and is left out. A cold
    first request after idle is told either way: the slowdown speaks for itself."""
    from latscope.analysis.coldstart import can_scale, capacity_events

    steady = {"first_count": 20, "first_max_ms": 30.0, "steady_p50_ms": 25.0, "steady_max_ms": 60.0, "suffered_s": 0.0,
              "affected_requests": 0}
    wake = {"phase": "wake", "at_s": 20.0, "idle_gap_s": 6.0, "first_latency_ms": 30.0, "replica": None, **steady,
            "cold": False}
    plain = {"target_launch": None, "restarts": [], "scale_up": [], "scale_from_zero": [wake], "starts": [
        {"kind": "run_start", "label": "p"}, {"kind": "phase", "label": "wake"}]}
    assert not can_scale(plain) and capacity_events(plain) == []
    cold_wake = {**wake, "first_latency_ms": 400.0, "cold": True}
    assert [e["kind"] for e in capacity_events({**plain, "scale_from_zero": [cold_wake]})] == ["scale_from_zero"]
    for replicas in ({"scale_from_zero": [{**wake, "replica": "r0"}]},
                     {"starts": [*plain["starts"], {"kind": "replica", "label": "r0"}]}):
        shown = {**plain, **replicas}
        assert can_scale(shown) and [e["kind"] for e in capacity_events(shown)] == ["scale_from_zero"]
