"""Does an SLO hold with confidence? Each SLO statistic of a run with a confidence interval, and a
verdict that waits for the interval to clear the limit (what `latscope capacity` decides each step by).

For a limit that the value must stay under (`bound: max`), with [low, high] the statistic's two-sided
interval at level `confidence`:

    high ≤ limit  → pass        (even the upper confidence bound is within the limit)
    low  > limit  → fail        (even the lower confidence bound is over it)
    otherwise     → undecided   (the data cannot tell; more of it can)

and the mirror image for a floor (`bound: min`). A statistic with no data fails, as in the run's
own SLO verdicts (analysis/verdicts.py). Each side of a two-sided interval at 1 − a misses with
probability at most a/2, so a pass or a fail is wrong at most (1 − confidence)/2 of the time per SLO.

The intervals, per statistic:
- percentiles p50 … p99.9: analysis/quantile_ci.py (exact binomial order statistics, widened by a
  moving-block bootstrap over the run's intervals for autocorrelation), from the measured
  (non-warm-up) intervals of histograms.hlog. Too few values beyond the percentile leave the upper
  bound infinite: undecided, never a pass.
- `mean`: the normal interval mean ± z·sd/√n from the merged histogram (values are close to
  independent at a fixed load; a run's mean moves far less than its tail).
- `error_rate` and goodput's `fraction` (of requests, or an agent class's jobs: `job_goodput`): the Wilson
  score interval for a binomial proportion
  (Wilson 1927), which keeps its coverage near 0 and 1, where an error rate lives.
- `max`, `throughput` and goodput's `rps`: the point value decides (no sampling model gives an upper
  bound for a maximum; an achieved rate is counted, not estimated); they are never undecided.

A step judged in looks (sequential extension, `latscope capacity`): a step that is undecided is
extended by another run at the same rate, and judged again on the POOLED measured intervals of all
its runs so far (`pool`: the evidence accumulates; the intervals of every run, side by side, are
what one longer run would have given, less the seams). At most K = LOOKS = 3 looks, of T, then
+T (2T pooled), then +2T (4T pooled). Every look, the first too, uses the two-sided level

    1 − (1 − confidence) / K                                        (`look_confidence`)

so each side of each look's interval misses with probability ≤ (1 − confidence) / (2K), and by the
union bound over the K looks the probability that ANY look of the sequence gives a wrong pass or a
wrong fail is ≤ K · (1 − confidence) / (2K) = (1 − confidence) / 2 per SLO side: the error the
single-look verdict had (Bonferroni alpha-splitting; an alpha-spending rule would spend less early,
but this one is exact to state and costs little at K = 3: z 1.96 → 2.39 at 95 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from latscope.analysis.gate import GateRun, gate_run
from latscope.analysis.quantile_ci import quantile_ci
from latscope.analysis.verdicts import goodput_view, slo_value
from latscope.scenario.gate_file import PERCENTILE_OF
from latscope.scenario.settings import Slo

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
LOOKS = 3  # the most looks of one step: the run, then two extensions
CURVE_PERCENTILES = ("p50", "p99", "p99.9")  # the latency–throughput curve's


@dataclass(frozen=True)
class SloInterval:
    """One SLO statistic of one run, its interval and verdict (in the statistic's unit)."""

    name: str  # e.g. "latency/all p99"
    value: float | None
    low: float | None  # None: no bound (too few values)
    high: float | None
    limit: float
    bound: str  # "max" | "min"
    unit: str  # "ms" | "fraction" | "req/s"
    verdict: str  # PASS | FAIL | UNDECIDED


def slo_name(slo: Slo) -> str:
    """How an SLO is named everywhere a person reads it: "latency/all p99", "run error_rate"."""
    return f"run {slo.stat}" if slo.stat in ("error_rate", "throughput") else f"{slo.metric}/{slo.class_} {slo.stat}"


def slo_unit(slo: Slo) -> str:
    if slo.limit_ms is not None:
        return "ms"
    return "fraction" if slo.stat in ("error_rate", "fraction") else "req/s"


def judge(value: float | None, low: float | None, high: float | None, limit: float, bound: str) -> str:
    """PASS, FAIL or UNDECIDED for an interval against a limit (the module docstring's rule)."""
    if value is None:
        return FAIL
    low = -math.inf if low is None else low
    high = math.inf if high is None else high
    if bound == "max":
        return PASS if high <= limit else FAIL if low > limit else UNDECIDED
    return PASS if low >= limit else FAIL if high < limit else UNDECIDED


def look_confidence(confidence: float, looks: int = LOOKS) -> float:
    """The two-sided level of each of `looks` looks at one step (the module docstring)."""
    return 1 - (1 - confidence) / looks


def wilson(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval for a proportion successes / n at two-sided `confidence`."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _interval(run: GateRun, slo: Slo, confidence: float) -> tuple[float | None, float | None, float | None]:
    """(value, low, high) of one SLO statistic of `run`, in its own unit."""
    summary = run.summary
    if slo.stat in PERCENTILE_OF:
        data = run.intervals.get((slo.metric, slo.class_))
        if data is None or not data[0].size or not data[0].sum():
            return None, None, None
        q = quantile_ci(*data, PERCENTILE_OF[slo.stat], confidence)
        return q.value_us / 1000, _finite(q.low_us / 1000), _finite(q.high_us / 1000)
    goodput = goodput_view(summary)
    value = slo_value(summary.get("metrics", {}), slo, summary.get("requests"),
                      summary.get("throughput", {}).get("achieved_rps"), goodput)
    if value is None:
        return None, None, None
    if slo.stat == "mean":
        stats = summary["metrics"][slo.metric][slo.class_]
        data = run.intervals.get((slo.metric, slo.class_))
        n = int(stats.get("count") or 0)
        if data is None or n < 2:
            return value, None, None
        counts, lowest, highest = data
        mids = (lowest + highest) / 2 / 1000
        totals = counts.sum(axis=0)
        sd = math.sqrt(max(0.0, float((totals * (mids - value) ** 2).sum()) / (n - 1)))
        half = NormalDist().inv_cdf(1 - (1 - confidence) / 2) * sd / math.sqrt(n)
        return value, value - half, value + half
    if slo.stat == "error_rate":
        r = summary.get("requests", {})
        return (value, *wilson(r.get("errors", 0), r.get("completed", 0) + r.get("errors", 0), confidence))
    if slo.stat == "fraction":
        g = (goodput["job_goodput"] if slo.metric == "job_goodput" else goodput).get(slo.class_, {})
        return (value, *wilson(g.get("good", 0), g.get("total", 0), confidence))
    return value, value, value  # max, throughput, goodput rps: the point value decides


def slo_intervals(run: GateRun, slos: list[Slo], confidence: float) -> list[SloInterval]:
    """Every SLO of a run with its interval and verdict. `run` must hold the intervals of every
    metric an SLO is on (`load(path, slos)`)."""
    out = []
    for slo in slos:
        value, low, high = _interval(run, slo, confidence)
        out.append(SloInterval(slo_name(slo), value, low, high, slo.threshold, slo.bound, slo_unit(slo),
                               judge(value, low, high, slo.threshold, slo.bound)))
    return out


def curve_keys(slos: list[Slo]) -> list[tuple[str, str]]:
    """The (metric, class) pairs a latency–throughput curve is drawn for: latency/all, then every
    metric and class a percentile SLO is on."""
    keys = [("latency", "all")]
    for slo in slos:
        if slo.limit_ms is not None and (slo.metric, slo.class_) not in keys:
            keys.append((slo.metric, slo.class_))
    return keys


def curve_stats(slos: list[Slo]) -> list[str]:
    """The percentiles of the curve: p50, p99, p99.9 and any other an SLO is on, in order."""
    stats = set(CURVE_PERCENTILES) | {s.stat for s in slos if s.stat in PERCENTILE_OF}
    return sorted(stats, key=PERCENTILE_OF.get)


def curve_points(run: GateRun, keys: list[tuple[str, str]], stats: list[str], confidence: float) -> dict[str, dict]:
    """{"metric/class": {"p50": {"value_ms", "low_ms", "high_ms"}, "p99": ..., ...}} of a run, for `stats`."""
    out: dict[str, dict] = {}
    for metric, cls in keys:
        data = run.intervals.get((metric, cls))
        if data is None or not data[0].size or not data[0].sum():
            continue
        points = {}
        for stat in stats:
            q = quantile_ci(*data, PERCENTILE_OF[stat], confidence)
            points[stat] = {"value_ms": round(q.value_us / 1000, 3), "low_ms": _round(_finite(q.low_us / 1000)),
                            "high_ms": _round(_finite(q.high_us / 1000))}
        out[f"{metric}/{cls}"] = points
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def load(path, slos: list[Slo]) -> GateRun:
    """A results directory with the measured intervals of every metric the SLOs and curves need."""
    return gate_run(path, {m for m, _ in curve_keys(slos)} | {s.metric for s in slos if s.stat == "mean"})


def _pool_intervals(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compact per-interval counts of several runs (each over its own used buckets) as one matrix
    over the union of their buckets: the runs' intervals one after the other."""
    lowest = np.unique(np.concatenate([p[1] for p in parts]))
    highest = np.empty_like(lowest)
    counts = np.zeros((sum(p[0].shape[0] for p in parts), lowest.size), np.int64)
    row = 0
    for c, lo, hi in parts:
        columns = np.searchsorted(lowest, lo)
        highest[columns] = hi
        counts[row:row + c.shape[0], columns] = c
        row += c.shape[0]
    return counts, lowest, highest


def _pool_summary(summaries: list[dict]) -> dict:
    """What the SLO intervals read of summary.json, for runs pooled: counts add up, a mean is the
    count-weighted mean, a max the max, a rate the total over the total measured window."""
    windows = [float(s.get("throughput", {}).get("measured_window_s") or 0.0) for s in summaries]
    window = sum(windows)

    def per_second(values: list[float | None]) -> float | None:
        if window <= 0 or any(v is None for v in values):
            return None
        return sum(v * w for v, w in zip(values, windows)) / window

    requests: dict = {}
    for s in summaries:
        for k, v in (s.get("requests") or {}).items():
            if isinstance(v, (int, float)):
                requests[k] = requests.get(k, 0) + v
    metrics: dict = {}
    for s in summaries:
        for metric, classes in (s.get("metrics") or {}).items():
            for cls, st in classes.items():
                into = metrics.setdefault(metric, {}).setdefault(cls, {"count": 0, "mean_ms": None, "max_ms": None})
                n = int(st.get("count") or 0)
                if n and st.get("mean_ms") is not None:
                    total = (into["mean_ms"] or 0.0) * into["count"] + st["mean_ms"] * n
                    into["count"] += n
                    into["mean_ms"] = total / into["count"]
                if st.get("max_ms") is not None:
                    into["max_ms"] = max(into["max_ms"] or 0.0, st["max_ms"])
    def pooled(of: list[dict]) -> dict:  # goodput by class, of requests or of an agent class's jobs
        out: dict = {}
        for cls in {c for g in of for c in g}:
            entries = [g.get(cls) or {} for g in of]
            good, total = sum(e.get("good", 0) for e in entries), sum(e.get("total", 0) for e in entries)
            out[cls] = {"good": good, "total": total, "fraction": good / total if total else None,
                        "rps": per_second([e.get("rps") for e in entries])}
        return out

    goodput = pooled([s.get("goodput") or {} for s in summaries])
    jobs = pooled([{c: a["goodput"] for c, a in (s.get("agents") or {}).items() if "goodput" in a} for s in summaries])
    return {"requests": requests, "metrics": metrics, "goodput": goodput,
            "agents": {cls: {"goodput": g} for cls, g in jobs.items()},
            "throughput": {"measured_window_s": window,
                           "offered_rps": per_second([s.get("throughput", {}).get("offered_rps") for s in summaries]),
                           "achieved_rps": per_second([s.get("throughput", {}).get("achieved_rps") for s in summaries])}}


def pool(runs: list[GateRun]) -> GateRun:
    """Several runs of the same step as one: their measured intervals side by side (a percentile's
    interval is then that of the pooled values, its bootstrap resampling blocks of all the runs'
    intervals), and their summaries pooled as one run's (`_pool_summary`). One run is itself."""
    if len(runs) == 1:
        return runs[0]
    keys = {k for r in runs for k in r.intervals}
    intervals = {k: _pool_intervals([r.intervals[k] for r in runs if k in r.intervals]) for k in keys}
    return GateRun(runs[-1].path, _pool_summary([r.summary for r in runs]), intervals, runs[-1].slos)
