"""The CI gate: is this run good enough to ship? Pure checks over results, one record per check.

Three kinds of check, and the order in which they decide the outcome:

1. **validity** — a run stamped `invalid` (the generator fell behind) or `partial` (cut short), new
   or baseline, is not a measurement of the target: outcome `invalid` (exit 4), never a pass.
   `degraded` passes, with the reasons in the message.
2. **slo** — absolute limits (scenario `slos` or the gate file's): a breach is outcome `slo_breach`.
3. **regression** — each gated percentile against the baseline; a regression is outcome
   `regression`; a check that cannot decide makes the outcome `inconclusive` (exit 4).
4. **tail_cause** — only with the gate file's `fail_on_generator_tail`: when `latscope explain`'s
   top cause of the tail is the load generator itself, the tail is latscope's, not the target's:
   outcome `invalid` (exit 4), with the generator's evidence in the message.

Regression decision rule (per check, percentile p, tolerance τ, minimum effect δ < τ)
-------------------------------------------------------------------------------------
Let r = q_new / q_base (point estimates, HDR semantics) and [L, U] the MOVER interval for the ratio
from the two runs' intervals (analysis/quantile_ci.py: on each side the wider of the exact binomial
order-statistic interval and the moving-block-bootstrap interval), each run's interval at two-sided
level 1 − 2a with a = alpha / (number of regression checks).

* **inconclusive** when either run has n·(1 − p) < 10: fewer than ten values are expected beyond the
  percentile, so it is not measured (p99 needs n ≥ 1,000, p99.9 n ≥ 10,000).
* **fail** when r > 1 + τ (over the budget) AND L > 1 + δ (beyond the noise, by a minimum effect).
* **inconclusive** otherwise when U > 1 + 2τ: the runs are too noisy to rule out a regression of
  twice the budget, so a pass would mean nothing. Run longer or at a higher rate. (The factor 2 is
  the gate file's `inconclusive_factor`; p99 over a 10 % budget needs a few dozen values beyond it.)
* **pass** otherwise: no regression over the budget was detected, and one of twice the budget would
  have been ruled out.

Why this rule:
* *False failures (same build twice, true r = 1).* A failure needs L > 1 + δ ≥ 1, i.e. the lower
  confidence bound above the true ratio, which has probability ≤ a per check, so ≤ alpha over all
  checks (Bonferroni). With the default alpha = 0.02 the whole gate flakes on noise at most 2 % of
  the time; requiring r > 1 + τ as well only lowers that. The bound rests on the intervals' coverage:
  the binomial one is exact (conservative) for independent samples, and the block bootstrap —
  with a Student-t multiplier for the number of independent blocks — keeps it when the level wanders
  over the run (tests/analysis/test_quantile_ci.py measures both).
* *Power (20 % p99 shift, n = 20,000 a run, τ = 10 %).* With 200 values beyond p99 the log p99 of
  a lognormal-ish latency has a standard error of about 0.013–0.026 a run, so L sits 0.04–0.09
  below log 1.2 = 0.18 and clears log(1 + δ) = 0.02, while r > 1.1 holds with margin: the shift is
  caught essentially always (measured: ≥ 99 %).
* *A real change smaller than τ* passes (that is the budget); a noisy one larger than τ that the
  data cannot confirm does not fail the build, but does not pass silently either when the noise
  is large (the inconclusive clause).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from latscope import results
from latscope.analysis import run_data
from latscope.analysis.explain import explanation, generator_caused
from latscope.analysis.quantile_ci import QuantileCI, RatioCI, quantile_ci, ratio_ci
from latscope.analysis.verdicts import NO_SUCCESS, slo_verdicts
from latscope.errors import ResultsError
from latscope.results.reading import read_scenario
from latscope.scenario.gate_file import GateFile, RegressionPolicy
from latscope.scenario.settings import Slo

MIN_TAIL = 10  # values expected beyond a percentile, n·(1 − p), for it to be gated at all
WIDE_FACTOR = 2.0  # default: inconclusive when the ratio's upper bound exceeds 1 + WIDE_FACTOR·τ (gate file: inconclusive_factor)

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
TAIL_CAUSE = "tail_cause"  # the check kind of the gate file's fail_on_generator_tail
OUTCOMES = ("pass", "slo_breach", "regression", "inconclusive", "invalid")


@dataclass
class Check:
    """One line of the gate's verdict: what was checked, the status, and why in words."""

    kind: str  # "validity" | "slo" | "regression"
    name: str  # e.g. "latency/all p99"
    status: str  # "pass" | "fail" | "inconclusive"
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateRun:
    """What the gate needs from one results directory (or a saved baseline)."""

    path: Path
    summary: dict
    intervals: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]  # (metric, class) -> compact counts
    slos: list[Slo]


@dataclass
class GateResult:
    checks: list[Check]
    outcome: str  # one of OUTCOMES


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def gate_run(run_dir: str | Path, metrics: set[str]) -> GateRun:
    """Summary, measured (non-warm-up) per-interval counts of `metrics`, and the scenario's SLOs of
    a results directory or a baseline saved by `latscope baseline save`. Warm-up intervals are told
    apart as the rest of the analysis does (analysis/run_data.py)."""
    run = run_data.load_run(run_dir)
    intervals = {}
    for metric in metrics:
        for cls, by_interval in run_data.metric_intervals(run, metric).items():
            intervals[(metric, cls)] = by_interval.compact_counts(~run.is_warmup(by_interval.start_s))
    return GateRun(run.path, run.summary, intervals, scenario_slos(run.path))


def scenario_slos(run_dir: Path) -> list[Slo]:
    """The SLOs of the scenario a run ran (its scenario.yaml); [] without the file. ResultsError
    naming the file when they are not a list of SLOs."""
    slos = read_scenario(run_dir).get("slos") or []
    where = run_dir / results.SCENARIO
    if not isinstance(slos, list):
        raise ResultsError(f"{where}: slos is not a list")
    checked = []
    for i, slo in enumerate(slos):
        try:
            checked.append(Slo.model_validate(slo))
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in (i, *error["loc"]))
            raise ResultsError(f"{where}: slos.{field}: {error['msg']}") from None
    return checked


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def validity_check(summary: dict, role: str) -> Check:
    """`invalid` or `partial` → inconclusive (not a measurement of the target); else pass."""
    stamp, reasons = summary.get("validity", "valid"), summary.get("validity_reasons", [])
    name = f"{role} run validity"
    if summary.get("partial"):
        return Check("validity", name, INCONCLUSIVE, f"{role} run was cut short ({summary.get('abort_reason') or 'partial'}): not a complete measurement",
                     {"validity": stamp, "partial": True})
    if stamp == "invalid":
        why = ("" if any(str(r).startswith(NO_SUCCESS) for r in reasons)  # the reason says it: no latency measured
               else " — the load generator fell behind, so it measured itself, not the target")
        return Check("validity", name, INCONCLUSIVE, f"{role} run is invalid{why}: " + "; ".join(reasons),
                     {"validity": stamp, "reasons": reasons})
    text = f"{role} run is {stamp}" + (f" ({'; '.join(reasons)})" if reasons else "")
    return Check("validity", name, PASS, text, {"validity": stamp, "reasons": reasons})


def _fmt_value(stat: str, value: float | None) -> str:
    if value is None:
        return "no data"
    if stat == "error_rate":
        return f"{value:.2%}"
    if stat == "fraction":  # of requests that met every goodput objective
        return f"{value:.1%}"
    if stat in ("throughput", "rps"):
        return f"{value:.1f} req/s"
    return f"{value:g} ms"


def slo_checks(summary: dict, slos: list[Slo]) -> list[Check]:
    """Each SLO against the run's summary (values as summary.json reports them; a run written
    before goodput existed has none, so its goodput SLOs have no data)."""
    checks = []
    tput = summary.get("throughput", {}).get("achieved_rps")
    verdicts = slo_verdicts(summary.get("metrics", {}), slos, summary.get("requests"), tput, summary.get("goodput"))
    for slo, v in zip(slos, verdicts):
        subject = "error rate" if slo.stat == "error_rate" else "throughput" if slo.stat == "throughput" else f"{slo.metric}/{slo.class_} {slo.stat}"
        op = "≤" if slo.bound == "max" else "≥"
        limit = _fmt_value(slo.stat, slo.threshold)
        if v["value"] is None:
            message = f"{subject}: no data (SLO {op} {limit})"
        elif v["passed"]:
            message = f"{subject} {_fmt_value(slo.stat, v['value'])} meets the SLO ({op} {limit})"
        else:
            message = f"{subject} {_fmt_value(slo.stat, v['value'])} breaches the SLO ({op} {limit})"
        checks.append(Check("slo", f"SLO {subject}", PASS if v["passed"] else FAIL, message, v))
    return checks


def decide(new: QuantileCI, base: QuantileCI, tolerance: float, min_effect: float,
           inconclusive_factor: float = WIDE_FACTOR) -> tuple[str, RatioCI | None, str]:
    """(status, ratio interval, reason) for one percentile — the rule in the module docstring."""
    for ci, role in ((new, "new"), (base, "baseline")):
        if ci.tail_count < MIN_TAIL:
            return INCONCLUSIVE, None, (f"too few samples in the {role} run for p{ci.p:g}: n = {ci.n:,}, "
                                        f"{ci.tail_count:.1f} expected beyond it (need ≥ {MIN_TAIL}: n ≥ {math.ceil(MIN_TAIL / (1 - ci.p / 100)):,})")
    r = ratio_ci(new, base)
    if r.ratio > 1 + tolerance and r.low > 1 + min_effect:
        return FAIL, r, f"over the {tolerance:.0%} budget and beyond the noise (lower confidence bound {r.low - 1:+.1%})"
    if r.high > 1 + inconclusive_factor * tolerance:
        return INCONCLUSIVE, r, (f"too noisy to decide: the ratio could be up to {r.high - 1:+.0%}, so a regression of "
                                 f"{inconclusive_factor:g}× the {tolerance:.0%} budget cannot be ruled out — run longer or at a higher rate")
    if r.ratio > 1 + tolerance:
        return PASS, r, f"over the {tolerance:.0%} budget but within the noise (lower confidence bound {r.low - 1:+.1%})"
    return PASS, r, f"within the {tolerance:.0%} budget"


def _ms(us: float) -> str:
    if not math.isfinite(us):
        return "∞"
    ms = us / 1000
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def regression_checks(new: GateRun, base: GateRun, policy: RegressionPolicy) -> list[Check]:
    """Each gated percentile of `new` against `base` (see the module docstring for the rule)."""
    a = policy.alpha / len(policy.checks)
    confidence = 1 - 2 * a
    checks = []
    for c in policy.checks:
        name = f"{c.metric}/{c.class_} {c.stat}"
        tol = c.tolerance or policy.tolerance
        data_new, data_base = new.intervals.get((c.metric, c.class_)), base.intervals.get((c.metric, c.class_))
        if data_new is None or data_base is None or not data_new[0].size or not data_base[0].size:
            missing = "new run" if data_new is None or not data_new[0].size else "baseline"
            checks.append(Check("regression", name, INCONCLUSIVE, f"{name}: no data in the {missing}", {"metric": c.metric, "class": c.class_, "stat": c.stat}))
            continue
        q_new = quantile_ci(*data_new, c.percentile, confidence)
        q_base = quantile_ci(*data_base, c.percentile, confidence)
        status, r, why = decide(q_new, q_base, tol, policy.min_effect, policy.inconclusive_factor)
        level = f"{confidence:.0%}"
        text = (f"{name} {_ms(q_new.value_us)} ms [{level} CI {_ms(q_new.low_us)}–{_ms(q_new.high_us)}] vs baseline "
                f"{_ms(q_base.value_us)} [{_ms(q_base.low_us)}–{_ms(q_base.high_us)}]")
        if r is not None:
            text += f": {r.ratio - 1:+.1%}"
        details = {
            "metric": c.metric, "class": c.class_, "stat": c.stat, "tolerance": tol, "min_effect": policy.min_effect,
            "confidence": confidence, "new": _ci_dict(q_new), "baseline": _ci_dict(q_base),
            "ratio": None if r is None else {"value": r.ratio, "low": r.low, "high": r.high},
        }
        checks.append(Check("regression", name, status, f"{text}, {why}", details))
    return checks


def _ci_dict(q: QuantileCI) -> dict:
    def ms(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x / 1000, 3)

    return {"n": q.n, "value_ms": ms(q.value_us), "low_ms": ms(q.low_us), "high_ms": ms(q.high_us),
            "binomial_ms": [ms(x) for x in q.binomial], "bootstrap_ms": None if q.bootstrap is None else [ms(x) for x in q.bootstrap],
            "block_len": q.block_len}


def outcome(checks: list[Check]) -> str:
    """invalid (a run is not a measurement, or the generator made its tail) > slo_breach > regression >
    inconclusive > pass."""
    if any(c.kind == "validity" and c.status != PASS for c in checks):
        return "invalid"
    if any(c.kind == TAIL_CAUSE and c.status == FAIL for c in checks):
        return "invalid"
    if any(c.kind == "slo" and c.status == FAIL for c in checks):
        return "slo_breach"
    if any(c.kind == "regression" and c.status == FAIL for c in checks):
        return "regression"
    if any(c.status == INCONCLUSIVE for c in checks):
        return "inconclusive"
    return "pass"


def evaluate(new: GateRun, base: GateRun | None, gate_file: GateFile) -> GateResult:
    """All checks of one gate: validity of both runs, SLOs of the new one, regressions vs the baseline."""
    checks = [validity_check(new.summary, "new")]
    if base is not None:
        checks.append(validity_check(base.summary, "baseline"))
    slos = gate_file.slos if gate_file.slos is not None else new.slos
    checks += slo_checks(new.summary, slos)
    if base is not None:
        checks += regression_checks(new, base, gate_file.regression)
    return GateResult(checks, outcome(checks))


def tail_cause_check(run_dir: str | Path) -> Check:
    """The gate file's `fail_on_generator_tail`: fail when explain's top cause of the tail is the load
    generator (analysis/explain.py; explain.json when the run wrote one, else computed now)."""
    name = "tail cause"
    try:
        doc = explanation(run_data.load_run(run_dir))
    except ResultsError as exc:
        return Check(TAIL_CAUSE, name, INCONCLUSIVE, f"cannot tell what made the tail: {exc}")
    if doc is None:
        return Check(TAIL_CAUSE, name, INCONCLUSIVE, "cannot tell what made the tail: the run kept no requests.parquet "
                     "(fail_on_generator_tail needs `output.requests` on)")
    details = {"verdict": doc.get("verdict"), "metric": doc.get("metric"), "quantile": doc.get("quantile")}
    cause = generator_caused(doc)
    if cause is not None:
        return Check(TAIL_CAUSE, name, FAIL, f"the load generator made this tail, not the target: {cause['evidence']} "
                     f"(effect {cause['effect']:.2f}); give latscope more CPU or fewer requests per worker and run again",
                     {**details, "cause": cause["name"], "effect": cause["effect"]})
    if doc.get("verdict") == "not_enough_data":
        return Check(TAIL_CAUSE, name, PASS, f"too few requests to tell what made the tail ({doc.get('reason')})", details)
    top = next((c for c in doc.get("causes", []) if c.get("stands_out")), None)
    said = f"its top cause is {top['label']}" if top else "nothing in it stands out"
    return Check(TAIL_CAUSE, name, PASS, f"the load generator did not make the tail: {said}", details)


def gate(results_dir: str | Path, baseline_dir: str | Path | None, gate_file: GateFile) -> GateResult:
    """Load the run (and the baseline) and evaluate the gate."""
    metrics = {c.metric for c in gate_file.regression.checks} if baseline_dir is not None else set()
    new = gate_run(results_dir, metrics)
    base = gate_run(baseline_dir, metrics) if baseline_dir is not None else None
    result = evaluate(new, base, gate_file)
    if gate_file.fail_on_generator_tail:
        result.checks.append(tail_cause_check(new.path))
        result.outcome = outcome(result.checks)
    return result
