"""Model and adapter mixes: a run's classes grouped by the model they name, and how fairly the models
were served under the same load.

A class names its model with `model:` (an adapter on a shared server, or one of several models
behind one endpoint), else it takes the target's. When the classes of a run name two or more
different models, summary.json gets `models` (else {}):

    classes   class -> model, every class that named one
    by_model  model -> {classes, requests: {sent, completed, errors}, metrics: {metric: ROW_STATS}}
    fairness  one entry per metric every model measured (ttft, ttfot, latency)

ttfot, reasoning_time and content_tpot are grouped only when some stream of the run reasoned (without
reasoning they repeat ttft and tpot).

Per-model statistics are those of the lossless sum of its classes' HDR histograms (recorder.merge,
as class `all` is made), never an average of per-class percentiles.

Fairness: the p99 of each model; `worst` and `best` are the models with the highest and the lowest,
`ratio` = worst p99 / best p99 and `difference_ms` = worst − best. The models ran side by side, so
the load each saw was the same; what differs is what the server gave each. `ratio_low`/`ratio_high`:
a 95 % interval for the ratio, from each model's distribution-free binomial interval of its p99
(quantile_ci.binomial_ranks) combined by MOVER (quantile_ci.ratio_ci); `clear` when its low end is
above 1, i.e. the worst model is slower beyond what its and the best's sample sizes could give by
chance. A p99 has an upper confidence bound only from 368 requests on (1 − 0.99^n ≥ 0.975): with fewer
requests of the best model, `ratio_low` is 0 and `clear` false whatever the p99s; with fewer of the
worst, `ratio_high` is unbounded (null).
The binomial intervals assume independent requests. Requests of a run whose level moved (a stall, a
burst) are not, and then the interval is too narrow: `clear` screens one run's numbers, it is not the
verdict `latscope gate` gives between runs (whose intervals also resample the run's intervals).
"""

from __future__ import annotations

import math
from typing import Mapping

from hdrh.histogram import HdrHistogram

from latscope.analysis.quantile_ci import QuantileCI, quantile_ci, ratio_ci
from latscope.recorder import bucket_bounds, merge, summarize, to_sparse
from latscope.results.schema import metric_label

# The metrics grouped per model (whichever of them the run recorded), in this order.
MODEL_METRICS = ("latency", "ttft", "ttfot", "reasoning_time", "itl", "tpot", "content_tpot", "service_time")
# The metrics fairness is judged on, when every model measured them.
FAIRNESS_METRICS = ("ttft", "ttfot", "latency")
# Kept only when some stream reasoned: without reasoning they repeat ttft and tpot.
REASONING_METRICS = ("ttfot", "reasoning_time", "content_tpot")
FAIRNESS_PERCENTILE = 99.0
CONFIDENCE = 0.95


def model_mix(totals: Mapping[str, Mapping[str, HdrHistogram]], class_models: Mapping[str, str | None],
              requests_by_class: Mapping[str, Mapping[str, int]]) -> dict:
    """summary.json's `models` (see the module docstring): `totals` metric -> class -> histogram
    (outside warm-up; a class `all` is ignored), `class_models` each class's model (None: it names
    none), `requests_by_class` summary.json's requests_by_class. {} unless two or more models."""
    named = {cls: model for cls, model in class_models.items() if model is not None}
    models = list(dict.fromkeys(named.values()))
    if len(models) < 2:
        return {}
    reasoned = any(h.total_count for h in totals.get("reasoning_time", {}).values())
    metrics = [m for m in MODEL_METRICS if m in totals and (reasoned or m not in REASONING_METRICS)]
    by_model, merged = {}, {}
    for model in models:
        classes = [cls for cls, m in named.items() if m == model]
        counts = [requests_by_class.get(cls, {}) for cls in classes]
        merged[model] = {metric: merge(totals[metric][cls] for cls in classes if cls in totals[metric])
                         for metric in metrics}
        by_model[model] = {
            "classes": classes,
            "requests": {k: sum(int(c.get(k, 0)) for c in counts) for k in ("sent", "completed", "errors")},
            "metrics": {metric: summarize(h) for metric, h in merged[model].items()},
        }
    fairness = [f for metric in FAIRNESS_METRICS
                if (f := _fairness(metric, {model: merged[model].get(metric) for model in models})) is not None]
    return {"classes": named, "by_model": by_model, "fairness": fairness}


def _p99(h: HdrHistogram) -> QuantileCI:
    indices, counts = to_sparse(h)
    lowest, highest = bucket_bounds(h)
    return quantile_ci(counts, lowest[indices], highest[indices], FAIRNESS_PERCENTILE, CONFIDENCE, bootstrap=False)


def _fairness(metric: str, histograms: Mapping[str, HdrHistogram | None]) -> dict | None:
    """The fairness entry of `metric`, None unless every model has a value of it."""
    if not all(h is not None and h.total_count for h in histograms.values()):
        return None
    p99 = {model: _p99(h) for model, h in histograms.items()}
    worst = max(p99, key=lambda m: p99[m].value_us)
    best = min(p99, key=lambda m: p99[m].value_us)
    ratio = ratio_ci(p99[worst], p99[best])
    return {
        "metric": metric, "stat": "p99",
        "worst": worst, "worst_ms": round(p99[worst].value_us / 1000, 3), "worst_count": p99[worst].n,
        "best": best, "best_ms": round(p99[best].value_us / 1000, 3), "best_count": p99[best].n,
        "ratio": round(ratio.ratio, 3), "difference_ms": round((p99[worst].value_us - p99[best].value_us) / 1000, 3),
        "ratio_low": round(ratio.low, 3), "ratio_high": round(ratio.high, 3) if math.isfinite(ratio.high) else None,
        "clear": ratio.low > 1.0,
    }


def fairness_lines(models: Mapping) -> list[str]:
    """A line per fairness entry of summary.json's `models`, for the console and the report (plain
    text; model names come from the scenario: escape them for HTML). [] for a run without a mix."""
    lines = []
    for f in (models or {}).get("fairness", []):
        if f["worst"] == f["best"] or f["difference_ms"] <= 0:
            lines.append(f"model fairness, {metric_label(f['metric'])} p99: every model {f['best_ms']:,.2f} ms")
            continue
        if not f["ratio_low"] and f.get("ratio_high") is None:
            why = "too few requests for a 95 % interval (a p99 needs 368): not a clear difference"
        else:
            interval = (f"at least {f['ratio_low']:.2f}×" if f.get("ratio_high") is None else
                        f"{f['ratio_low']:.2f}–{f['ratio_high']:.2f}×")
            verdict = "beyond chance" if f.get("clear") else "not a clear difference at these sample sizes"
            why = f"95 % interval {interval}, {verdict}"
        lines.append(f"model fairness, {metric_label(f['metric'])} p99: {f['worst']} {f['worst_ms']:,.2f} ms is "
                     f"{f['ratio']:.2f}× (+{f['difference_ms']:,.2f} ms) {f['best']}'s {f['best_ms']:,.2f} ms under the same "
                     f"load ({why})")
    return lines
