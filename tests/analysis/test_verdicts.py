"""Validity stamps and SLO verdicts from summary metrics."""

from __future__ import annotations

import itertools

from latscope.analysis.verdicts import RANK, lag_thresholds, node_validity, slo_verdicts, tightest_limit, validity
from latscope.scenario import Goodput, Slo, Validity

THRESHOLDS = Validity()  # degraded/invalid: send lag 1/10 ms, loop lag 5/50 ms
QUIET = {"late": 0, "dropped": 0}


def metrics(send_lag_p99: float, loop_lag_p99: float | None = 0.5) -> dict:
    m = {"send_lag": {"all": {"p99_ms": send_lag_p99}}, "latency": {"all": {"p99_ms": 12.0, "p50_ms": 3.0}}}
    if loop_lag_p99 is not None:
        m["loop_lag"] = {"all": {"p99_ms": loop_lag_p99}}
    return m


def test_on_time_run_is_valid_without_reasons():
    assert validity(metrics(0.8), QUIET, THRESHOLDS, 100) == ("valid", [])


def test_send_lag_between_thresholds_is_degraded_with_the_number():
    stamp, reasons = validity(metrics(2.5), QUIET, THRESHOLDS, 100)
    assert stamp == "degraded"
    assert reasons == ["send lag p99 2.500 ms > 1 ms"]


def test_send_or_loop_lag_past_invalid_threshold_is_invalid():
    assert validity(metrics(10.5), QUIET, THRESHOLDS, 100)[0] == "invalid"
    stamp, reasons = validity(metrics(0.5, loop_lag_p99=60.0), QUIET, THRESHOLDS, 100)
    assert stamp == "invalid" and "event-loop lag p99 60.000 ms > 50 ms" in reasons[0]


def test_worst_reason_wins_and_all_reasons_are_kept():
    stamp, reasons = validity(metrics(20.0, loop_lag_p99=6.0), {"late": 3, "dropped": 2}, THRESHOLDS, 7)
    assert stamp == "invalid"
    assert len(reasons) == 4
    assert "3 requests waited for a free slot (limits.max_in_flight=7)" in reasons
    assert "2 requests dropped at the in-flight cap (limits.max_in_flight=7)" in reasons


def test_cap_pressure_alone_degrades():
    assert validity(metrics(0.2), {"late": 1, "dropped": 0}, THRESHOLDS, 1)[0] == "degraded"


def judged(send_lag: float, slo_ms: float | None, rps: float, loop_lag: float = 0.5, settings: Validity = THRESHOLDS,
           extra: dict | None = None) -> tuple[str, list[str], dict]:
    """(stamp, reasons, summary.json validity_thresholds) of a run with these lags, a latency p99 SLO of
    `slo_ms` (None: none) and `rps` planned in its busiest phase, as run/summary.py judges it."""
    m = {**metrics(send_lag, loop_lag), **(extra or {})}
    applied = lag_thresholds(settings, m, tightest_limit([Slo(stat="p99", limit_ms=slo_ms)] if slo_ms else []), rps)
    return (*validity(m, QUIET, applied, 100), applied.record())


def test_lateness_a_small_share_of_a_loose_slo_leaves_the_run_valid():
    # The case: 1–2 ms late against a 100 ms SLO at 40 req/s (25 ms apart) cannot move the
    # verdict: degraded from 5 % of 100 ms (under 0.5 × 25 ms), invalid from 25 %.
    stamp, reasons, applied = judged(1.5, 100, 40)
    assert (stamp, reasons) == ("valid", [])
    assert applied["relative"] is True
    assert applied["send_lag_p99_ms"] == {"degraded": 5.0, "invalid": 25.0, "basis": {
        "degraded": "5 % of the SLO latency/all p99 ≤ 100 ms", "invalid": "25 % of the SLO latency/all p99 ≤ 100 ms"}}
    stamp, reasons, _ = judged(6.0, 100, 40)
    assert stamp == "degraded" and reasons == ["send lag p99 6.000 ms > 5 ms (5 % of the SLO latency/all p99 ≤ 100 ms)"]
    stamp, reasons, _ = judged(30.0, 100, 40)
    assert stamp == "invalid" and reasons[0].startswith("send lag p99 30.000 ms > 25 ms (25 % of the SLO")


def test_a_tight_slo_keeps_the_fixed_floor():
    # 5 % of 5 ms is 0.25 ms: the 1 ms floor holds, and the reason says it is the floor and why.
    stamp, reasons, applied = judged(1.5, 5, 40)
    assert stamp == "degraded"
    assert reasons == ["send lag p99 1.500 ms > 1 ms (validity.degraded_send_lag_p99_ms, the floor: "
                       "5 % of the SLO latency/all p99 ≤ 5 ms is 0.25 ms)"]
    assert applied["send_lag_p99_ms"]["degraded"] == 1.0 and applied["send_lag_p99_ms"]["invalid"] == 10.0


def test_lateness_near_the_arrival_spacing_clumps_the_load_whatever_the_slo():
    # 2,000 req/s are 0.5 ms apart: 1.5 ms late at the p99 sends clumps, even against a 10 s SLO.
    stamp, reasons, _ = judged(1.5, 10_000, 2000)
    assert stamp == "degraded" and "0.5 × the mean arrival spacing (0.5 ms at 2,000 req/s) is 0.25 ms" in reasons[0]
    # Between the two: 200 req/s (5 ms apart) against a 1 s SLO: the spacing sets both thresholds.
    stamp, reasons, applied = judged(3.0, 1000, 200)
    assert applied["send_lag_p99_ms"]["degraded"] == 2.5 and applied["send_lag_p99_ms"]["invalid"] == 10.0
    assert stamp == "degraded" and reasons == ["send lag p99 3.000 ms > 2.5 ms (0.5 × the mean arrival spacing "
                                               "(5 ms at 200 req/s))"]


def test_loop_lag_is_judged_by_the_same_rule():
    # A late loop delays reading answers (≤ its lateness more latency): 12 ms against a 1 s SLO at
    # 10 req/s is valid (degraded from 50 ms), 60 ms is degraded; at 5 ms SLO the 5 ms floor holds.
    assert judged(0.5, 1000, 10, loop_lag=12.0)[:2] == ("valid", [])
    stamp, reasons, _ = judged(0.5, 1000, 10, loop_lag=60.0)
    assert stamp == "degraded" and reasons == ["event-loop lag p99 60.000 ms > 50 ms (5 % of the SLO latency/all p99 ≤ 1000 ms)"]
    assert judged(0.5, 5, 10, loop_lag=6.0)[0] == "degraded"


def test_without_a_time_slo_the_measured_p99_stands_in():
    # No SLO: the run's latency p99 (12 ms in metrics()) is the headline: 5 % of it is 0.6 ms, under
    # the floor; a 400 ms p99 raises the threshold to 20 ms. A ttft p99, when there is one, comes first.
    stamp, _, applied = judged(1.5, None, 10)
    assert stamp == "degraded" and "the measured latency p99 (12 ms; no time SLO)" in applied["send_lag_p99_ms"]["basis"]["degraded"]
    slow = {"latency": {"all": {"p99_ms": 400.0}}}
    stamp, _, applied = judged(15.0, None, 10, extra=slow)
    assert stamp == "valid" and applied["send_lag_p99_ms"]["degraded"] == 20.0
    stamp, _, applied = judged(15.0, None, 10, extra={**slow, "ttft": {"all": {"p99_ms": 100.0}}})
    assert stamp == "degraded" and applied["send_lag_p99_ms"]["basis"]["degraded"] == \
        "5 % of the measured ttft p99 (100 ms; no time SLO)"
    # Nothing measured (every request failed): nothing to weigh the lateness against, the fixed thresholds.
    nothing = lag_thresholds(THRESHOLDS, {"send_lag": {"all": {"p99_ms": 1.5}}}, None, 10).record()["send_lag_p99_ms"]
    assert nothing == {"degraded": 1.0, "invalid": 10.0, "basis": {
        "degraded": "validity.degraded_send_lag_p99_ms: no latency was measured to judge the lateness against",
        "invalid": "validity.invalid_send_lag_p99_ms: no latency was measured to judge the lateness against"}}


def test_the_tightest_time_limit_counts_every_time_slo_and_goodput_objective():
    slos = [Slo(stat="p99", limit_ms=800), Slo(metric="ttft", class_="chat", stat="p90", limit_ms=300),
            Slo(stat="error_rate", limit=0.01), Slo(stat="throughput", limit=40)]
    assert tightest_limit(slos) == (300, "the SLO ttft/chat p90 ≤ 300 ms")
    objectives = [Goodput(ttft_ms=500, itl_ms=120).objectives(), None]
    assert tightest_limit(slos, objectives) == (120, "the goodput objective itl_ms 120 ms")
    assert tightest_limit([Slo(stat="error_rate", limit=0.01)]) is None


def test_relative_false_is_exactly_the_fixed_rule():
    fixed = Validity(relative=False)
    for lag, slo, rps, loop in itertools.product((0.5, 1.5, 6.0, 30.0), (5, 100, None), (40, 2000), (0.5, 6.0, 60.0)):
        stamp, reasons, applied = judged(lag, slo, rps, loop_lag=loop, settings=fixed)
        assert (stamp, reasons) == validity(metrics(lag, loop), QUIET, THRESHOLDS, 100)
        assert applied["send_lag_p99_ms"] == {"degraded": 1.0, "invalid": 10.0, "basis": {
            "degraded": "validity.degraded_send_lag_p99_ms", "invalid": "validity.invalid_send_lag_p99_ms"}}


def test_the_relative_rule_never_stamps_a_run_the_fixed_rule_calls_better():
    # The fixed thresholds are the floor: for any limit, rate and lateness, the relative stamp is at most
    # the fixed one (no run valid before is degraded now), and with them raised in the settings too.
    for settings in (THRESHOLDS, Validity(degraded_send_lag_p99_ms=3, invalid_send_lag_p99_ms=30)):
        for lag, slo, rps, loop in itertools.product((0.2, 1.5, 4.0, 12.0, 40.0), (2, 20, 100, 5000, None),
                                                     (1, 40, 400, 20_000), (1.0, 8.0, 80.0)):
            relative = judged(lag, slo, rps, loop_lag=loop, settings=settings)[0]
            fixed = validity(metrics(lag, loop), QUIET, settings, 100)[0]
            assert RANK[relative] <= RANK[fixed], (lag, slo, rps, loop, relative, fixed)


def test_a_nodes_clock_error_is_judged_by_the_runs_thresholds():
    node = {"node": 1, "host": "box-b", "status": "ok", "lost_at_s": None, "clock": {"max_error_ms": 3.0}}
    loose = lag_thresholds(THRESHOLDS, {}, (100.0, "the SLO latency/all p99 ≤ 100 ms"), 40)
    tight = lag_thresholds(THRESHOLDS, {}, (5.0, "the SLO latency/all p99 ≤ 5 ms"), 40)
    assert node_validity(node, loose) == [] and node_validity(node, THRESHOLDS)[0][0] == "degraded"
    assert node_validity(node, tight) == [("degraded", "node 1 (box-b): clock error up to 3.000 ms > 1 ms (validity."
                                                      "degraded_send_lag_p99_ms, the floor: 5 % of the SLO latency/all "
                                                      "p99 ≤ 5 ms is 0.25 ms)")]
    assert validity({}, {"sent": 10}, loose, 100, [node]) == ("valid", [])


def test_slo_verdicts_compare_the_named_statistic():
    slos = [Slo(metric="latency", stat="p99", limit_ms=15), Slo(metric="latency", stat="p50", limit_ms=2.5),
            Slo(metric="ttft", stat="p99", limit_ms=100)]
    v = slo_verdicts(metrics(0.1), slos)
    assert [x["passed"] for x in v] == [True, False, False]
    assert v[0] == {"metric": "latency", "class": "all", "stat": "p99_ms", "limit": 15, "value": 12.0, "passed": True}
    assert v[2]["value"] is None and v[2]["reason"] == "no data for this metric and class"


def test_error_rate_and_throughput_slos_use_the_run_counts():
    slos = [Slo(stat="error_rate", limit=0.01), Slo(stat="throughput", limit=40), Slo(stat="throughput", limit=60, direction="max")]
    v = slo_verdicts(metrics(0.1), slos, {"completed": 990, "errors": 10}, 50.0)
    assert [x["value"] for x in v] == [0.01, 50.0, 50.0]
    assert [x["passed"] for x in v] == [True, True, True]  # 1 % ≤ 1 %; 50 ≥ 40 (min by default); 50 ≤ 60
    assert v[1] == {"metric": "run", "class": "all", "stat": "throughput", "limit": 40, "value": 50.0, "passed": True, "direction": "min"}
    assert slo_verdicts(metrics(0.1), slos[:1], {"completed": 980, "errors": 20}, 50.0)[0]["passed"] is False
    assert slo_verdicts(metrics(0.1), slos[:1], {"completed": 0, "errors": 0}, 0.0)[0]["reason"] == "no data for this metric and class"


def test_slo_limit_must_fit_its_statistic():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="stat error_rate takes `limit`"):
        Slo(stat="error_rate", limit_ms=5)
    with pytest.raises(ValidationError, match="stat p99 takes `limit_ms`"):
        Slo(stat="p99", limit=5)
    with pytest.raises(ValidationError, match="fraction between 0 and 1"):
        Slo(stat="error_rate", limit=5)
    assert Slo(stat="p99", limit_ms=5).model_dump(by_alias=True) == {"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 5.0}


def test_goodput_slos_read_the_summarys_goodput():
    goodput = {"chat": {"objectives": {"ttft_ms": 500.0}, "good": 987, "total": 1000, "fraction": 0.987, "rps": 98.7,
                        "output_tokens_per_s": 1234.0},
               "all": {"good": 987, "total": 1000, "fraction": 0.987, "rps": 98.7, "output_tokens_per_s": 1234.0}}
    slos = [Slo.model_validate(s) for s in (
        {"metric": "goodput", "stat": "fraction", "min": 0.99},             # 98.7 % < 99 %: missed
        {"metric": "goodput", "class": "chat", "stat": "fraction", "limit": 0.98},  # min by default: met
        {"metric": "goodput", "stat": "rps", "min": 90},
        {"metric": "goodput", "stat": "rps", "max": 90},
        {"metric": "goodput", "class": "batch", "stat": "rps", "min": 1},   # a class without objectives: no data
    )]
    v = slo_verdicts(metrics(0.1), slos, {"completed": 1000, "errors": 0}, 100.0, goodput)
    assert [x["passed"] for x in v] == [False, True, True, False, False]
    assert v[0] == {"metric": "goodput", "class": "all", "stat": "fraction", "limit": 0.99, "value": 0.987,
                    "passed": False, "direction": "min"}
    assert v[3]["value"] == 98.7 and "direction" not in v[3]
    assert v[4]["value"] is None and v[4]["reason"].startswith("no goodput for this class")
    # A summary without goodput (a run written before it existed, or without objectives): no data, a failure.
    assert [x["passed"] for x in slo_verdicts(metrics(0.1), slos[:1], {}, 1.0)] == [False]
    assert slo_verdicts(metrics(0.1), slos[:1], {}, 1.0, {})[0]["value"] is None


def test_the_spacing_is_that_of_the_busiest_measured_phase(tmp_path):
    # A 1 s burst at 400 req/s after 4 s at 20 req/s: the whole run offers 96 req/s, but the burst's
    # arrivals are 2.5 ms apart, and that is what lateness is compared with. Warm-up does not count.
    from latscope.plan import build_plan
    from latscope.run.summary import RunFacts, _busiest_rate
    from latscope.scenario import scenario_from_dict

    phases = [{"name": "warm", "duration": 1, "warmup": True, "arrival": {"type": "constant", "rate": 1000}},
              {"name": "base", "duration": 4, "arrival": {"type": "constant", "rate": 20}},
              {"name": "burst", "duration": 1, "arrival": {"type": "constant", "rate": 400}}]
    scenario = scenario_from_dict({"name": "t", "target": {"url": "http://127.0.0.1:9"}, "phases": phases,
                                   "output": {"dir": str(tmp_path)}})
    facts = RunFacts(scenario=scenario, plan=build_plan(scenario), workers=1, collector=None, started_wall=0.0, t0_ns=0)
    assert _busiest_rate(facts) == 400
    # Stopped 0.2 s into the burst: a sliver of a phase gives no rate (its few requests would be noise).
    assert _busiest_rate(RunFacts(**{**facts.__dict__, "abort_ns": int(5.2e9)})) == 20
