"""`latscope capacity`, end to end: run steps of the scaled scenario, judge each, search, write.

    DIR/steps/NNN-<rate>/   an ordinary results directory per step (report, compare and gate work on it)
    DIR/capacity.json       the answer, the bracket, why the search stopped, and every step (written
                            after each step, so an interrupted search leaves what it found)
    DIR/capacity.html       the page (report/capacity_page.py)

Each step runs the whole scenario scaled by one factor (shape.py): warm-up phases first, then the
measured phases at the step's rate. Its verdict comes from its SLOs with confidence
(analysis/slo_confidence.py): every SLO passes → pass; any fails → fail; otherwise undecided, and the
step is run once more, twice as long (more values narrow the intervals); undecided again counts as
a fail — conservative, as MLPerf LoadGen's early stopping is — and says so. A step whose generator
was not `valid` (it fell behind its schedule, or hit its in-flight cap) stops the search: past that
point the limit is the generator's, and it is never reported as the target's.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from latscope import results
from latscope.analysis.slo_confidence import (FAIL, PASS, UNDECIDED, curve_keys, curve_points, curve_stats, load,
                                             slo_intervals, slo_name, slo_unit)
from latscope.capacity.search import STOPS, next_rate, steps_left
from latscope.capacity.shape import measured_rate, measured_seconds, scaled
from latscope.errors import RunError, ScenarioError
from latscope.results.schema import CAPACITY, CAPACITY_SCHEMA_VERSION, STEPS_DIR
from latscope.run import Progress, run_scenario
from latscope.scenario import Scenario

MIN_INTERVALS = 20
STEP_OVERHEAD_S = 3.0  # starting workers, writing and judging a step, before any step has been timed


@dataclass(frozen=True)
class CapacityOptions:
    """The search's knobs (`latscope capacity` flags)."""

    precision: float = 0.05  # the bracket's width relative to its lower end, when to stop
    min_rate: float | None = None  # the first step's rate (default: the scenario's own)
    max_rate: float | None = None  # no step above it
    max_steps: int = 12
    step_duration_s: float | None = None  # the measured phases' duration per step (default: as written)
    confidence: float = 0.95  # two-sided, of each SLO statistic's interval
    price_per_hour: float | None = None  # the endpoint's price: cost per request at the capacity found
    workers: int | None = None


@dataclass
class StepStart:
    """Progress: a step is about to run."""

    index: int
    rate_rps: float
    longer: bool
    low: float | None  # the bracket so far
    high: float | None
    steps_left_max: int  # steps --max-steps still allows, this one included
    steps_expected: int | None  # bisection steps still needed once bracketed, this one included
    time_left_max_s: float  # at most, at the longest step seen so far


@dataclass
class Search:
    """What the search knows so far; `document()` is capacity.json."""

    scenario: Scenario
    options: CapacityOptions
    out: Path
    base_rate: float
    started_wall: float = field(default_factory=time.time)
    steps: list[dict] = field(default_factory=list)
    low: float | None = None
    high: float | None = None
    limiting: str | None = None
    stopped: str | None = None
    message: str = ""

    @property
    def exit_code(self) -> int:
        return STOPS[self.stopped][0] if self.stopped else 4

    def cost(self) -> dict | None:
        """Cost per 1,000 requests and per 1M output tokens at the capacity found (the passing step at
        it: what it achieved), from the endpoint's price per hour."""
        price = self.options.price_per_hour
        at = next((s for s in reversed(self.steps) if s["counted_as"] == PASS and s["rate_rps"] == self.low), None)
        if price is None or at is None or not at["achieved_rps"]:
            return None
        tokens = at.get("output_tokens_per_s")
        return {"price_per_hour": price, "at_rate_rps": self.low, "achieved_rps": at["achieved_rps"],
                "per_1k_requests": _sig(price / 3600 / at["achieved_rps"] * 1000),
                "per_1m_output_tokens": _sig(price / 3600 / tokens * 1e6) if tokens else None}

    def document(self) -> dict:
        o = self.options
        return {
            "schema_version": CAPACITY_SCHEMA_VERSION,
            "scenario": self.scenario.name,
            "started_at": results.utc_stamp(self.started_wall),
            "duration_s": round(time.time() - self.started_wall, 3),
            "precision": o.precision,
            "confidence": o.confidence,
            "options": {"min_rate": o.min_rate, "max_rate": o.max_rate, "max_steps": o.max_steps,
                        "step_duration_s": o.step_duration_s, "price_per_hour": o.price_per_hour},
            "base_rate_rps": round(self.base_rate, 6),
            "max_rate_rps": self.low,
            "bracket": {"low_rps": self.low, "high_rps": self.high},
            "limiting_slo": self.limiting,
            "stopped": self.stopped,
            "message": self.message,
            "exit_code": self.exit_code,
            "slos": [{"name": slo_name(s), "metric": s.metric, "class": s.class_, "stat": s.stat, "limit": s.threshold,
                      "unit": slo_unit(s), "bound": s.bound} for s in self.scenario.slos],
            "cost": self.cost(),
            "steps": self.steps,
        }

    def write(self) -> None:
        results.write_json(self.out / CAPACITY, self.document())


def find_capacity(scenario: Scenario, out: Path, options: CapacityOptions = CapacityOptions(),
                  on_step: Callable[[StepStart | dict], None] | None = None,
                  on_progress: Callable[[Progress], None] | None = None) -> dict:
    """Search the highest rate at which every SLO of `scenario` holds with confidence; write `out`
    (capacity.json, steps/, capacity.html) and return capacity.json. `on_step` gets a StepStart
    before each step and the step's record after it; `on_progress` is each step's run progress.
    ScenarioError for a scenario or options it cannot search with."""
    base = _check(scenario, out, options)
    search = Search(scenario, options, out, base)
    rate = options.min_rate or (min(base, options.max_rate) if options.max_rate else base)
    longer = False
    seconds = options.step_duration_s or measured_seconds(scenario)
    warmup = sum(p.duration or 0.0 for p in scenario.phases if p.warmup)
    overhead = STEP_OVERHEAD_S  # a step's wall time beyond its planned phases, the most seen so far
    with _terminate_as_interrupt():
        try:
            while True:
                if len(search.steps) >= options.max_steps:
                    search.stopped = "max_steps"
                    break
                if on_step:
                    left = options.max_steps - len(search.steps)
                    expected = steps_left(search.low, search.high, options.precision)
                    longest = 2 * seconds + warmup + overhead  # a step run again is twice as long
                    on_step(StepStart(len(search.steps) + 1, rate, longer, search.low, search.high, left,
                                      None if expected is None else max(1, expected), left * longest))
                started = time.monotonic()
                step = _run_step(search, rate, seconds * (2 if longer else 1), longer, on_progress)
                overhead = max(overhead, time.monotonic() - started - step["duration_s"] - warmup)
                search.steps.append(step)
                stop = _account(search, step, rate, longer)
                if on_step:
                    on_step(step)
                search.write()
                if stop:
                    break
                if step["verdict"] == UNDECIDED and not longer:
                    longer = True  # the same rate again, twice as long
                    continue
                longer = False
                nxt = next_rate(search.low, search.high, options.precision, options.max_rate)
                if nxt is None:
                    search.stopped = "max_rate" if search.high is None else "precision"
                    break
                rate = nxt
        except KeyboardInterrupt:
            search.stopped = "interrupted"
    search.message = _message(search)
    search.write()
    _write_page(out)
    return search.document()


def _check(scenario: Scenario, out: Path, o: CapacityOptions) -> float:
    """The scenario's own measured rate; ScenarioError when the search cannot start."""
    if not scenario.slos:
        raise ScenarioError(f"scenario {scenario.name!r} has no slos: capacity is the highest rate that meets them — "
                            "add e.g. `slos: [{metric: latency, stat: p99, limit_ms: 200}]`")
    if scenario.limits.max_requests is not None:
        raise ScenarioError("limits.max_requests would cut the faster steps short and bend their rate: a capacity "
                            "search is bounded by --max-steps and --max-rate instead (--set limits.max_requests=null)")
    if (out / CAPACITY).exists():
        raise ScenarioError(f"{out} already holds a capacity search (capacity.json); choose another --out")
    if any(p.arrival.type == "users" for p in scenario.phases):
        raise ScenarioError(f"scenario {scenario.name!r} has a closed-loop phase (arrival: users): its load follows the "
                            "server, so there is no rate to search; give its phases open-loop arrivals (poisson, ...)")
    base = measured_rate(scenario)
    if not base > 0:
        raise ScenarioError(f"scenario {scenario.name!r} sends nothing in its measured (non-warm-up) phases: "
                            "there is no traffic shape to scale")
    if o.min_rate is not None and o.max_rate is not None and o.min_rate > o.max_rate:
        raise ScenarioError(f"--min-rate {o.min_rate:g} is above --max-rate {o.max_rate:g}")
    if not 0 < o.precision < 1:
        raise ScenarioError(f"--precision {o.precision:g} must be between 0 and 1 (0.05: within 5 %)")
    return base


def _run_step(search: Search, rate: float, seconds: float, longer: bool,
              on_progress: Callable[[Progress], None] | None) -> dict:
    """Run one step at `rate` and judge it: the step's record in capacity.json."""
    index = len(search.steps) + 1
    name = f"{index:03d}-{rate:.6g}"
    factor = rate / search.base_rate
    step_scenario = scaled(search.scenario, factor, seconds)
    # At least MIN_INTERVALS reporting intervals per step: the tail's confidence interval resamples
    # whole intervals (quantile_ci's block bootstrap), and four of them would leave it wide open.
    step_scenario.output.interval = max(0.1, min(step_scenario.output.interval, seconds / MIN_INTERVALS))
    run_dir = search.out / STEPS_DIR / name
    step = {"index": index, "dir": f"{STEPS_DIR}/{name}", "rate_rps": rate, "factor": round(factor, 6),
            "duration_s": round(seconds, 3), "longer": longer}
    try:
        summary = run_scenario(step_scenario, out=run_dir, workers=search.options.workers, on_progress=on_progress).summary
    except RunError as exc:
        return {**step, "verdict": "partial", "counted_as": None, "note": str(exc)}
    slos = search.scenario.slos
    run = load(run_dir, slos)
    judged = slo_intervals(run, slos, search.options.confidence)
    tokens = summary.get("tokens", {}).get("all", {})
    step.update({
        "offered_rps": summary["throughput"]["offered_rps"],
        "achieved_rps": summary["throughput"]["achieved_rps"],
        "validity": summary["validity"],
        "validity_reasons": summary["validity_reasons"],
        "partial": summary["partial"],
        "requests": {k: summary["requests"][k] for k in ("sent", "completed", "errors", "dropped", "late")},
        "slos": [{"name": j.name, "value": _round(j.value), "low": _round(j.low), "high": _round(j.high),
                  "limit": j.limit, "bound": j.bound, "unit": j.unit, "verdict": j.verdict} for j in judged],
        "percentiles": curve_points(run, curve_keys(slos), curve_stats(slos), search.options.confidence),
        "goodput": (summary.get("goodput") or {}).get("all"),
        "output_tokens_per_s": tokens.get("output_tokens_per_s"),
        "report": f"{STEPS_DIR}/{name}/{results.REPORT}" if (run_dir / results.REPORT).exists() else None,
    })
    verdicts = {j.verdict for j in judged}
    step["verdict"] = ("partial" if summary["partial"] else "invalid" if summary["validity"] != "valid"
                       else FAIL if FAIL in verdicts else UNDECIDED if UNDECIDED in verdicts else PASS)
    step["counted_as"], step["note"] = None, summary["abort_reason"] or ""  # "interrupted by SIGINT", "target ..."
    return step


def _account(search: Search, step: dict, rate: float, longer: bool) -> bool:
    """Count a judged step into the bracket (and its `counted_as`, `note`); True when it stops the search."""
    verdict = step["verdict"]
    if verdict == "partial":
        search.stopped = "interrupted" if step["note"].startswith("interrupted") else "run_failed"
        return True
    if verdict == "invalid":
        search.stopped = "generator_limit"
        step["note"] = "the generator was " + step["validity"] + ": " + "; ".join(step["validity_reasons"])
        return True
    if verdict == UNDECIDED and not longer:
        step["note"] = "undecided: run again, twice as long"
        return False
    passed = verdict == PASS
    step["counted_as"] = PASS if passed else FAIL
    if verdict == UNDECIDED:
        step["note"] = "undecided twice: counted as a fail (conservative)"
    if passed:
        search.low = rate if search.low is None else max(search.low, rate)
        return False
    if search.high is None or rate <= search.high:
        search.high = rate
        failing = [s["name"] for s in step["slos"] if s["verdict"] == FAIL] or \
                  [s["name"] for s in step["slos"] if s["verdict"] == UNDECIDED]
        search.limiting = failing[0] if failing else None
    if search.low is None:  # the first rate already fails
        search.stopped = "inconclusive" if verdict == UNDECIDED else "slo_fails_at_lowest_rate"
        return True
    return False


def _message(search: Search) -> str:
    """Why the search stopped and what it found, in words."""
    low, high, o = search.low, search.high, search.options
    why = STOPS[search.stopped][1] if search.stopped else "stopped"
    limit = f"; {search.limiting} is the SLO that gives out" if search.limiting else ""
    if search.stopped == "precision":
        return f"capacity {low:.4g} req/s (the SLOs fail at {high:.4g}; within {o.precision:.0%}){limit}"
    if search.stopped == "max_rate":
        return f"capacity at least {low:.4g} req/s: {why}"
    if search.stopped == "slo_fails_at_lowest_rate":
        return f"{why} ({high:.4g} req/s){limit}: try a lower --min-rate"
    if search.stopped == "inconclusive":
        return f"{why} ({high:.4g} req/s): use longer steps (--step-duration) or a higher rate"
    if search.stopped == "generator_limit":
        last = search.steps[-1]
        return (f"{why} at {last['rate_rps']:.4g} req/s ({'; '.join(last['validity_reasons'])}); "
                + (f"the target met the SLOs up to {low:.4g} req/s — " if low else "")
                + "add worker processes (--workers) or load-generating machines, or raise the validity thresholds")
    found = f"; so far the SLOs hold at {low:.4g} req/s" if low else ""
    bracket = f" and fail at {high:.4g}" if high else ""
    return f"no answer: {why}{found}{bracket}" + (f" — {search.steps[-1]['note']}" if search.stopped == "run_failed" else "")


def _sig(x: float) -> float:
    """Six significant figures (a cost per request can be a millionth of a dollar)."""
    return float(f"{x:.6g}")


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 6)


def _write_page(out: Path) -> None:
    """capacity.html; a page that cannot be written is a warning, never a lost search."""
    import logging

    try:
        from latscope.report import write_capacity_page

        write_capacity_page(out)
    except Exception as exc:  # noqa: BLE001 - capacity.json is complete without the page
        logging.getLogger("latscope.report").warning("capacity.html not written (%s: %s)", type(exc).__name__, exc)


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM between steps ends the search like Ctrl-C (during a step the run handles both, and
    ends its step partial, which stops the search)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
