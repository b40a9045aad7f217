"""Model mixes from histograms (analysis/models.py): a model's statistics are its classes' histograms
added up exactly, and the fairness entry's ratio, difference and interval are what the p99s say."""

from __future__ import annotations

import numpy as np

from latscope.analysis.models import fairness_lines, model_mix
from latscope.analysis.quantile_ci import binomial_ranks
from latscope.recorder import counts_from_values, from_sparse, summarize


def _hist(values_us) -> object:
    counts = counts_from_values(np.asarray(values_us))
    nz = np.flatnonzero(counts)
    return from_sparse(nz, counts[nz])


def _requests(completed: int) -> dict:
    return {"sent": completed + 1, "completed": completed, "errors": 1}


def test_a_models_statistics_are_its_classes_values_together_and_the_fairness_ratio_is_their_p99s():
    rng = np.random.default_rng(4)
    # adapter a: two classes, exact integer µs values; adapter b: one class, 3x slower
    a1, a2 = rng.integers(1_000, 5_000, 3_000), rng.integers(2_000, 9_000, 1_000)
    b = rng.integers(10_000, 27_000, 2_000)
    totals = {"latency": {"a1": _hist(a1), "a2": _hist(a2), "b": _hist(b)}}
    mix = model_mix(totals, {"a1": "adapter-a", "a2": "adapter-a", "b": "adapter-b", "plain": None},
                    {"a1": _requests(3_000), "a2": _requests(1_000), "b": _requests(2_000)})
    assert mix["classes"] == {"a1": "adapter-a", "a2": "adapter-a", "b": "adapter-b"}  # "plain" names none
    a = mix["by_model"]["adapter-a"]
    assert a["classes"] == ["a1", "a2"] and a["requests"] == {"sent": 4_002, "completed": 4_000, "errors": 2}
    # lossless: the merged histogram's summary is that of all 4,000 values recorded into one histogram
    assert a["metrics"]["latency"] == summarize(_hist(np.concatenate([a1, a2])))
    assert mix["by_model"]["adapter-b"]["metrics"]["latency"] == summarize(_hist(b))
    [f] = mix["fairness"]  # no ttft recorded: latency only
    worst_ms, best_ms = summarize(_hist(b))["p99_ms"], a["metrics"]["latency"]["p99_ms"]
    assert (f["metric"], f["worst"], f["best"], f["worst_ms"], f["best_ms"]) == ("latency", "adapter-b", "adapter-a",
                                                                                worst_ms, best_ms)
    assert f["ratio"] == round(worst_ms / best_ms, 3) and f["difference_ms"] == round(worst_ms - best_ms, 3)
    assert (f["worst_count"], f["best_count"]) == (2_000, 4_000)
    # b's p99 (~26.8 ms) is far above a's (~8.9 ms): the interval is narrow around the ratio and above 1
    assert 1 < f["ratio_low"] < f["ratio"] < f["ratio_high"] < 1.1 * f["ratio"] and f["clear"]
    [line] = fairness_lines(mix)
    assert line.startswith(f"model fairness, latency p99: adapter-b {worst_ms:,.2f} ms is {f['ratio']:.2f}× "
                           f"(+{f['difference_ms']:,.2f} ms) adapter-a's {best_ms:,.2f} ms under the same load")
    assert line.endswith(f"(95 % interval {f['ratio_low']:.2f}–{f['ratio_high']:.2f}×, beyond chance)")


def test_few_requests_give_no_clear_verdict_and_one_model_gives_no_mix():
    # 30 requests a model: p99 is the slowest request, and the binomial interval of the p99 has no upper end
    assert binomial_ranks(30, 0.99, 0.95)[1] == 31
    fast, slow = np.arange(1_000, 31_000, 1_000), np.arange(1_000, 31_000, 1_000) + 500
    totals = {"latency": {"f": _hist(fast), "s": _hist(slow)}, "ttft": {"f": _hist(fast // 2), "s": _hist(slow // 2)}}
    mix = model_mix(totals, {"f": "m1", "s": "m2"}, {})
    assert [f["metric"] for f in mix["fairness"]] == ["ttft", "latency"]
    f = mix["fairness"][1]
    assert f["worst"] == "m2" and f["ratio_high"] is None and not f["clear"]
    assert f["ratio_low"] == 0  # the best model's p99 has no upper bound either
    assert fairness_lines(mix)[1].endswith("(too few requests for a 95 % interval (a p99 needs 368): not a clear difference)")
    assert model_mix(totals, {"f": "m1", "s": "m1"}, {}) == {}
    assert model_mix(totals, {"f": "m1", "s": None}, {}) == {}


def test_a_model_that_recorded_no_ttft_leaves_ttft_out_of_fairness():
    totals = {"latency": {"f": _hist([1_000] * 200), "s": _hist([3_000] * 200)}, "ttft": {"f": _hist([500] * 200)}}
    mix = model_mix(totals, {"f": "m1", "s": "m2"}, {})
    assert [f["metric"] for f in mix["fairness"]] == ["latency"]
    assert mix["by_model"]["m2"]["metrics"]["ttft"] == {"count": 0} and mix["by_model"]["m1"]["metrics"]["ttft"]["count"] == 200


def test_ttfot_and_the_reasoning_metrics_are_grouped_only_when_a_stream_reasoned():
    ttft = {"f": _hist([500] * 200), "s": _hist([900] * 200)}
    plain = {"ttft": ttft, "ttfot": ttft, "content_tpot": ttft, "reasoning_time": {"f": _hist([])}}
    mix = model_mix(plain, {"f": "m1", "s": "m2"}, {})
    assert [f["metric"] for f in mix["fairness"]] == ["ttft"] and set(mix["by_model"]["m1"]["metrics"]) == {"ttft"}
    reasoned = {**plain, "ttfot": {"f": _hist([400] * 200), "s": _hist([1_400] * 200)},
                "reasoning_time": {"s": _hist([6_000] * 200)}}
    mix = model_mix(reasoned, {"f": "m1", "s": "m2"}, {})
    assert set(mix["by_model"]["m2"]["metrics"]) == {"ttft", "ttfot", "reasoning_time", "content_tpot"}
    ttfot = mix["fairness"][1]
    assert (ttfot["metric"], ttfot["worst"], ttfot["ratio"]) == ("ttfot", "m2", 3.5)  # 1.4 ms / 0.4 ms: exact below 2,048 µs


def test_a_clear_verdict_needs_368_requests_of_the_best_model():
    """A p99's upper confidence bound needs 1 − 0.99^n ≥ 0.975, n ≥ 368: one request fewer of the fast
    model and even a 10x slower model is no clear difference."""
    slow = {"latency": {"s": _hist([20_000] * 100)}}
    for n, clear in ((367, False), (368, True)):
        totals = {"latency": {**slow["latency"], "f": _hist([1_000] * n)}}
        mix = model_mix(totals, {"f": "fast", "s": "slow"}, {})
        [f] = mix["fairness"]
        assert (f["best_count"], f["clear"], f["ratio_low"] > 1) == (n, clear, clear), f
        # 100 slow requests bound their p99 from below, not above: "at least"
        assert fairness_lines(mix)[0].endswith(f"(95 % interval at least {f['ratio_low']:.2f}×, beyond chance)" if clear else
                                               "(too few requests for a 95 % interval (a p99 needs 368): not a clear difference)")
