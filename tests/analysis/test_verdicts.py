"""Validity stamps and SLO verdicts from summary metrics."""

from __future__ import annotations

from latscope.analysis.verdicts import slo_verdicts, validity
from latscope.scenario import Slo, Validity

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
