"""Goodput (DistServe's): each request judged against its class's objectives as it completes
(intervals.py), counted exactly, against real loopback servers whose per-request latencies are known;
and the recorder's rule at its edges, one request at a time."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from latscope.intervals import IntervalRecorder
from latscope.records import Outcome, Request
from latscope.results.schema import COUNTERS, GOOD, GOOD_OUTPUT_TOKENS
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

from conftest import scenario_dict, serve, stream_target_process
from helpers import read_timeseries

MS = 1_000_000  # ns


def _slow_every_4th_per_class(slow_ms: float, fast_ms: float) -> web.Application:
    """Answers in `fast_ms`, except the 1st, 5th, 9th, ... request of each class (the body's "c"),
    by arrival, which takes `slow_ms`: of n requests of a class exactly ceil(n / 4) are slow."""
    seen: dict[str, int] = {}

    async def handle(request: web.Request) -> web.Response:
        cls = (await request.json())["c"]
        n = seen[cls] = seen.get(cls, 0) + 1
        await asyncio.sleep((slow_ms if n % 4 == 1 else fast_ms) / 1000)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/infer", handle)
    return app


def test_good_requests_are_counted_exactly_per_class_with_overrides_and_warm_up_apart(tmp_path):
    """40 req/s (nothing queues) for 2 s after a warm-up of class w. Top-level objective: latency
    ≤ 150 ms; class b overrides it with 1 s. Every 4th request of a class takes 300 ms, the rest
    1 ms (wide margins: the server shares a process with the run's parent): so a's good requests
    are exactly its fast ones, all of b's are good, and w (warm-up only) is measured on none."""
    with serve(_slow_every_4th_per_class(slow_ms=300, fast_ms=1)) as url:
        data = scenario_dict(
            url, tmp_path,
            [{"name": "warm", "duration": 0.5, "warmup": True, "classes": ["w"], "arrival": {"type": "constant", "rate": 40}},
             {"name": "main", "duration": 2, "classes": ["a", "b"], "arrival": {"type": "constant", "rate": 40}}],
            workload={"classes": [{"name": "a", "body": {"c": "a"}}, {"name": "b", "body": {"c": "b"}, "goodput": {"latency_ms": 1000}},
                                  {"name": "w", "body": {"c": "w"}}]},
            goodput={"latency_ms": 150},
            slos=[{"metric": "goodput", "class": "b", "stat": "fraction", "min": 1.0},
                  {"metric": "goodput", "class": "a", "stat": "fraction", "min": 0.9},
                  {"metric": "goodput", "stat": "rps", "min": 1}],
        )
        result = run_scenario(scenario_from_dict(data), workers=1)
    s = result.summary
    by_class, g = s["requests_by_class"], s["goodput"]
    n_a, n_b = by_class["a"]["sent"], by_class["b"]["sent"]
    assert n_a + n_b == s["requests"]["sent"] == s["requests"]["completed"] == 80 and min(n_a, n_b) > 10
    slow_a = -(-n_a // 4)
    window = s["throughput"]["measured_window_s"]
    assert g["a"] == {"objectives": {"latency_ms": 150.0}, "good": n_a - slow_a, "total": n_a,
                      "fraction": round((n_a - slow_a) / n_a, 6), "rps": round((n_a - slow_a) / window, 3),
                      "output_tokens_per_s": 0.0}
    assert g["b"]["objectives"] == {"latency_ms": 1000.0} and g["b"]["good"] == g["b"]["total"] == n_b
    assert g["w"] == {"objectives": {"latency_ms": 150.0}, "good": 0, "total": 0, "fraction": None, "rps": 0.0,
                      "output_tokens_per_s": 0.0}  # warm-up requests are not measured
    assert g["all"] == {"good": n_a - slow_a + n_b, "total": 80, "fraction": round((n_a - slow_a + n_b) / 80, 6),
                        "rps": round((n_a - slow_a + n_b) / window, 3), "output_tokens_per_s": 0.0}
    assert list(g) == ["a", "b", "w", "all"]
    # The SLOs read those numbers: b's 100 % meets ≥ 100 %, a's 75 % breaches ≥ 90 %.
    assert [(v["metric"], v["class"], v["stat"], v["passed"], v["direction"]) for v in s["slo"]] == [
        ("goodput", "b", "fraction", True, "min"), ("goodput", "a", "fraction", False, "min"),
        ("goodput", "all", "rps", True, "min")]
    assert s["slo"][1]["value"] == g["a"]["fraction"] and s["slo"][2]["value"] == g["all"]["rps"]
    # The counters are timeseries columns too, warm-up included (w's good requests are there).
    ts = read_timeseries(result.run_dir)
    rows = ts[(ts.metric == "latency")]
    assert rows[rows["class"] == "a"]["good"].sum() == n_a - slow_a
    assert rows[rows["class"] == "w"]["good"].sum() == 15  # 20 warm-up requests, 5 of them slow
    assert rows[rows["class"] == "all"]["good"].sum() == n_a - slow_a + n_b + 15


def test_itl_objective_is_each_requests_worst_gap_not_its_mean(tmp_path):
    """The stream target spaces tokens as each class's body says (token_gaps_ms). `even`: 9 gaps of
    8 ms; `stall`: 8 gaps of 1 ms then one of 150 ms — a time per output token of 8 and 17.6 ms, both
    inside tpot ≤ 30 ms, but one long stall, past itl ≤ 60 ms. `stall_ok` overrides itl_ms with
    300 ms and keeps the rest; `late` sends its first token after 150 ms (ttft ≤ 60 ms)."""
    even, stall = [8] * 9, [1] * 8 + [150]
    with stream_target_process(ttft_ms=5, itl_ms=8, tokens=10) as url:
        data = scenario_dict(
            url, tmp_path, [{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 40}}],
            target={"url": url, "protocol": "openai", "model": "m", "timeout": 5},
            workload={"classes": [
                {"name": "even", "openai": {"extra_body": {"token_gaps_ms": even}}},
                {"name": "stall", "openai": {"extra_body": {"token_gaps_ms": stall}}},
                {"name": "stall_ok", "openai": {"extra_body": {"token_gaps_ms": stall}}, "goodput": {"itl_ms": 300}},
                {"name": "late", "openai": {"extra_body": {"token_gaps_ms": even, "ttft_ms": 150}}},
            ]},
            goodput={"ttft_ms": 60, "tpot_ms": 30, "itl_ms": 60},
        )
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    g, by_class = s["goodput"], s["requests_by_class"]
    assert s["requests"]["completed"] == 80
    assert s["metrics"]["tpot"]["stall"]["max_ms"] < 30  # the mean would call every stalled stream good
    assert g["even"]["good"] == g["even"]["total"] == by_class["even"]["sent"] > 0
    assert g["stall"]["good"] == 0 and g["stall"]["total"] == by_class["stall"]["sent"] > 0
    assert g["stall_ok"]["objectives"] == {"ttft_ms": 60.0, "tpot_ms": 30.0, "itl_ms": 300.0}
    assert g["stall_ok"]["good"] == g["stall_ok"]["total"] > 0
    assert g["late"]["good"] == 0 and g["late"]["total"] > 0
    good = g["even"]["good"] + g["stall_ok"]["good"]
    window = s["throughput"]["measured_window_s"]
    assert g["all"]["good"] == good and g["all"]["total"] == 80
    assert g["all"]["output_tokens_per_s"] == round(10 * good / window, 3)  # 10 tokens each, from the usage report


# -- the rule at its edges: one IntervalRecorder, outcomes made by hand -------------------------------


def _good(objectives: dict, outcome: Outcome, warmup: bool = False) -> tuple[int, int]:
    """(good, good_output_tokens) after recording one request intended at t = 0 of class 0."""
    recorder = IntervalRecorder(["c"], goodput=[objectives])
    recorder.record(Request(0, 0, 0, warmup), outcome)
    row = recorder.take(0, 0).counters.get((0, warmup), [0] * len(COUNTERS))
    return row[GOOD], row[GOOD_OUTPUT_TOKENS]


def test_an_objective_is_met_up_to_its_whole_microsecond():
    assert _good({"latency_ms": 40}, Outcome(0, 40_000_999)) == (1, 0)  # 40,000 µs: met
    assert _good({"latency_ms": 40}, Outcome(0, 40_001_000)) == (0, 0)
    assert _good({"latency_ms": 1.005}, Outcome(0, 1_005_000)) == (1, 0)  # 1.005 × 1000 is 1004.99… in floats
    assert _good({"latency_ms": 40}, Outcome(0, 1 * MS, error="http_5xx", reason="HTTP 500")) == (0, 0)
    assert _good({"latency_ms": 40}, Outcome(0, 1 * MS), warmup=True) == (1, 0)  # counted apart, as warm-up


def test_a_response_without_token_chunks_has_its_latency_as_ttft_and_no_gaps():
    whole = Outcome(0, 50 * MS, output_tokens=200, tokens_from_usage=True)
    assert _good({"ttft_ms": 60, "tpot_ms": 0.001, "itl_ms": 0.001}, whole) == (1, 200)
    assert _good({"ttft_ms": 40}, whole) == (0, 0)


def test_tpot_and_itl_of_a_stream():
    # first token at 10 ms, then 20, 30, 100 ms; end at 100 ms; 4 tokens: tpot 30 ms, worst gap 70 ms.
    def stream() -> Outcome:
        return Outcome(0, 100 * MS, token_ns=[10 * MS, 20 * MS, 30 * MS, 100 * MS])

    assert _good({"ttft_ms": 10, "tpot_ms": 30, "itl_ms": 70}, stream()) == (1, 4)
    assert _good({"tpot_ms": 29.999}, stream()) == (0, 0)
    assert _good({"itl_ms": 69.999}, stream()) == (0, 0)
    assert _good({"ttft_ms": 9.999}, stream()) == (0, 0)
    one = Outcome(0, 100 * MS, token_ns=[10 * MS])  # one chunk: tpot and itl are met, whatever they are
    assert _good({"tpot_ms": 0.001, "itl_ms": 0.001}, one) == (1, 1)


def test_a_class_without_objectives_counts_no_good_requests():
    recorder = IntervalRecorder(["a", "b"], goodput=[None, {"latency_ms": 40}])
    for cls in (0, 1):
        recorder.record(Request(cls, 0, cls, False), Outcome(0, 1 * MS))
    counters = recorder.take(0, 0).counters
    assert counters[(0, False)][GOOD] == 0 and counters[(1, False)][GOOD] == 1


@pytest.mark.parametrize("goodput", [None, []])
def test_no_objectives_at_all(goodput):
    recorder = IntervalRecorder(["a"], goodput=goodput)
    recorder.record(Request(0, 0, 0, False), Outcome(0, 1 * MS))
    assert recorder.take(0, 0).counters[(0, False)][GOOD] == 0
