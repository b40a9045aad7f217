"""`latscope capacity`, end to end: run steps of the scaled scenario, judge each, search, write.

    DIR/steps/NNN-<rate>/        an ordinary results directory per step (report, compare and gate
    DIR/steps/NNN-<rate>-extK/   work on each), and one per extension of an undecided step
    DIR/capacity.json            the answer: the two confident ends, the undecided band between them,
                                 why the search stopped, and every look of every step (written after
                                 each, so an interrupted search leaves what it found)
    DIR/capacity.html            the page (report/capacity_page.py)

Each step runs the whole scenario scaled by one factor (shape.py): warm-up phases first, then the
measured phases at the step's rate. Its verdict comes from its SLOs with confidence
(analysis/slo_confidence.py): every SLO passes → pass; any fails → fail; otherwise undecided, and
the step is extended, up to two times, its looks judged on the pooled evidence with the confidence
held over the sequence (steps.py). A rate still undecided after its last look is neither a pass nor
a fail: it joins the undecided band (search.py), and the answer says so.

A look whose generator was not `valid` (it fell behind its schedule, or hit its in-flight cap) stops
the search: past that point the limit is the generator's, and it is never reported as the target's.
A look in which the target stopped answering stops it too (`target_down`): a dead target is not a
capacity. SIGINT and SIGTERM, once or twice, at any moment of the search, end it with capacity.json
and capacity.html written (exit 4): one StopRequest (latscope.interrupt), committed for the whole
search, is handed to every step's run, so a signal is always a request, never an exception.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from latscope import results
from latscope.analysis.slo_confidence import FAIL, LOOKS, PASS, UNDECIDED, slo_name, slo_unit
from latscope.analysis.verdicts import NO_SUCCESS
from latscope.capacity.search import STOPS, band, next_rate, steps_left, stop_reason
from latscope.capacity.shape import measured_rate, measured_seconds
from latscope.capacity.steps import LOOK_SECONDS, decide_s, judge_look, run_look, target_down
from latscope.errors import ScenarioError
from latscope.interrupt import Interrupted, StopRequest, guarded
from latscope.results.schema import CAPACITY, CAPACITY_SCHEMA_VERSION
from latscope.run import Progress
from latscope.scenario import Scenario

STEP_OVERHEAD_S = 3.0  # starting workers, writing and judging a step, before any step has been timed


@dataclass(frozen=True)
class CapacityOptions:
    """The search's knobs (`latscope capacity` flags)."""

    precision: float = 0.05  # the confident ends' distance relative to the lower end, when to stop
    min_rate: float | None = None  # the first step's rate (default: the scenario's own)
    max_rate: float | None = None  # no step above it
    max_steps: int = 12  # runs, extensions included
    step_duration_s: float | None = None  # the measured phases' duration of a step's first look (default: as written)
    confidence: float = 0.95  # two-sided, of each SLO statistic's interval over all of a step's looks
    price_per_hour: float | None = None  # the endpoint's price: cost per request at the capacity found
    workers: int | None = None


@dataclass
class StepStart:
    """Progress: a look of a step is about to run (look 1: the step; 2 and 3: its extensions)."""

    index: int
    rate_rps: float
    longer: bool  # an extension (look > 1)
    low: float | None  # the confident ends so far
    high: float | None
    steps_left_max: int  # runs --max-steps still allows, this one included
    steps_expected: int | None  # bisection steps still needed once bracketed, this one included
    time_left_max_s: float  # at most, at the longest run seen so far
    look: int = 1
    looks: int = LOOKS


@dataclass
class Search:
    """What the search knows so far; `document()` is capacity.json."""

    scenario: Scenario
    options: CapacityOptions
    out: Path
    base_rate: float
    started_wall: float = field(default_factory=time.time)
    steps: list[dict] = field(default_factory=list)  # every look of every step, in the order run
    passes: list[float] = field(default_factory=list)  # rates that passed with confidence
    fails: list[float] = field(default_factory=list)  # rates that failed with confidence
    undecided: list[float] = field(default_factory=list)  # rates undecided after their last look
    low: float | None = None
    high: float | None = None
    limiting: str | None = None
    stopped: str | None = None
    message: str = ""

    @property
    def exit_code(self) -> int:
        return STOPS[self.stopped][0] if self.stopped else 4

    def band(self) -> list[float]:
        """The undecided rates between the confident ends."""
        return band(self.low, self.high, self.undecided)

    def settle(self) -> None:
        """The confident ends from the verdicts so far: high the lowest fail, low the highest pass
        below it (a pass above a fail contradicts it, and is not the capacity)."""
        self.high = min(self.fails) if self.fails else None
        below = [r for r in self.passes if self.high is None or r < self.high]
        self.low = max(below) if below else None

    def final_look(self, rate: float) -> dict | None:
        """The last judged look of the step at `rate` (its pooled verdict)."""
        return next((s for s in reversed(self.steps) if s["rate_rps"] == rate and s.get("verdict") in (PASS, FAIL, UNDECIDED)),
                    None)

    def undecided_steps(self) -> list[dict]:
        """Per rate of the band: its pooled seconds and about how many would decide it."""
        out = []
        for rate in self.band():
            look = self.final_look(rate) or {}
            out.append({"rate_rps": rate, "pooled_s": look.get("pooled_s"), "decide_s": decide_s(look),
                        "slos": [s["name"] for s in look.get("slos", []) if s.get("verdict") == UNDECIDED]})
        return out

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
        inside = self.band()
        return {
            "schema_version": CAPACITY_SCHEMA_VERSION,
            "scenario": self.scenario.name,
            "started_at": results.utc_stamp(self.started_wall),
            "duration_s": round(time.time() - self.started_wall, 3),
            "precision": o.precision,
            "confidence": o.confidence,
            "looks": LOOKS,
            "options": {"min_rate": o.min_rate, "max_rate": o.max_rate, "max_steps": o.max_steps,
                        "step_duration_s": o.step_duration_s, "price_per_hour": o.price_per_hour},
            "base_rate_rps": round(self.base_rate, 6),
            "max_rate_rps": self.low,
            "bracket": {"low_rps": self.low, "high_rps": self.high,
                        "undecided_low_rps": inside[0] if inside else None,
                        "undecided_high_rps": inside[-1] if inside else None},
            "undecided_rps": sorted(self.undecided),
            "undecided": self.undecided_steps(),
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
    before each look and the look's record after it; `on_progress` is each look's run progress.
    ScenarioError for a scenario or options it cannot search with."""
    base = _check(scenario, out, options)
    search = Search(scenario, options, out, base)
    rate = options.min_rate or (min(base, options.max_rate) if options.max_rate else base)
    with guarded() as stop:
        stop.commit()  # from here a signal is a request the search (and each step's run) honours
        try:
            while True:
                outcome = _run_step(search, rate, stop, on_step, on_progress)
                if outcome is not None:
                    search.stopped = outcome
                    break
                nxt = next_rate(search.low, search.high, options.precision, options.max_rate, search.undecided)
                if nxt is None:
                    search.stopped = stop_reason(search.low, search.high, options.precision, options.max_rate,
                                                 search.undecided)
                    break
                rate = nxt
        except Interrupted:  # a signal in the instant a step's run was starting
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


def _run_step(search: Search, rate: float, stop: StopRequest, on_step: Callable[[StepStart | dict], None] | None,
              on_progress: Callable[[Progress], None] | None) -> str | None:
    """One step at `rate`: its looks until one decides or the last has run, counted into the search.
    The stop reason when the search must end here, else None."""
    o = search.options
    seconds = o.step_duration_s or measured_seconds(search.scenario)
    warmup = sum(p.duration or 0.0 for p in search.scenario.phases if p.warmup)
    index = 1 + len({s["index"] for s in search.steps})
    dirs: list[Path] = []
    pooled = 0.0
    for look in range(1, LOOKS + 1):
        if stop.reason:
            return "interrupted"
        if len(search.steps) >= o.max_steps:
            return "max_steps"
        run_s = seconds * LOOK_SECONDS[look - 1]
        if on_step:
            left = o.max_steps - len(search.steps)
            expected = steps_left(search.low, search.high, o.precision)
            longest = max(LOOK_SECONDS) * seconds + _overhead(search, warmup)
            on_step(StepStart(index, rate, look > 1, search.low, search.high, left,
                              None if expected is None else max(1, expected), left * longest, look, LOOKS))
        started = time.monotonic()
        record, summary = run_look(search.scenario, search.base_rate, search.out, index, rate, look, run_s,
                                   o.workers, stop, on_progress)
        record["wall_s"] = round(time.monotonic() - started, 3)
        search.steps.append(record)
        pooled += run_s
        stopped = _verdict(search, record, summary, dirs, pooled)
        if stopped is None and record["verdict"] == UNDECIDED and look < LOOKS:
            record["note"] = f"undecided after {record['pooled_s']:g} s: extending (look {look + 1} of {LOOKS})"
        elif stopped is None:
            stopped = _count(search, record)
        if on_step:
            on_step(record)
        search.write()
        if stopped or record["verdict"] != UNDECIDED:
            return stopped
    return None


def _overhead(search: Search, warmup: float) -> float:
    """A look's wall time beyond its measured phases (its warm-up included), the most seen so far."""
    return max([STEP_OVERHEAD_S + warmup, *(s["wall_s"] - s["duration_s"] for s in search.steps if "wall_s" in s)])


def _verdict(search: Search, record: dict, summary: dict | None, dirs: list[Path], pooled_s: float) -> str | None:
    """Judge a look that ran, on its step's pooled looks (its `verdict`); the stop reason when it
    cannot count: interrupted or failed, the target down, the generator not valid."""
    if summary is None:
        return "run_failed"
    run_dir = search.out / record["dir"]
    if summary["partial"] and record["note"].startswith("interrupted"):
        record["verdict"] = "partial"
        return "interrupted"
    if target_down(run_dir):
        record["verdict"] = "target_down"
        record["note"] = "the target stopped answering: no request of the run's last intervals completed, and they failed to connect"
        return "target_down"
    if summary["partial"]:
        record["verdict"] = "partial"
        return "run_failed"
    # a run in which no request succeeded is invalid as a latency measurement, but that is the target's
    # doing: its SLOs fail (no data, every request an error), and the search counts it so
    if record["validity"] != "valid" and any(not r.startswith(NO_SUCCESS) for r in record["validity_reasons"]):
        record["verdict"] = "invalid"
        record["note"] = "the generator was " + record["validity"] + ": " + "; ".join(record["validity_reasons"])
        return "generator_limit"
    dirs.append(run_dir)
    judge_look(record, dirs, search.scenario, search.options.confidence, pooled_s)
    return None


def _count(search: Search, record: dict) -> str | None:
    """Count a step's final look into the search (its `counted_as`, `note`); the stop reason when the
    first step gives no passing rate to go from."""
    rate, verdict = record["rate_rps"], record["verdict"]
    record["counted_as"] = verdict
    if verdict == PASS:
        search.passes.append(rate)
    elif verdict == FAIL:
        search.fails.append(rate)
    else:
        search.undecided.append(rate)
        need = decide_s(record)
        record["note"] = (f"undecided after {LOOKS} looks ({record['pooled_s']:g} s pooled): in the undecided band, "
                          "not a fail" + (f"; about {need:.3g} s would decide it" if need is not None else ""))
    search.settle()
    if verdict == PASS and search.high is not None and rate >= search.high:
        record["note"] = f"passed above the lowest confident fail ({search.high:.4g} req/s): contradicts it, not counted"
    if verdict == FAIL and rate == search.high:
        failing = [s["name"] for s in record["slos"] if s["verdict"] == FAIL]
        search.limiting = failing[0] if failing else None
    if search.low is None and verdict == FAIL:
        return "slo_fails_at_lowest_rate"
    if search.low is None and verdict == UNDECIDED:
        return "inconclusive"
    return None


def _rates(rates: list[float]) -> str:
    return "–".join(f"{r:.4g}" for r in ([rates[0], rates[-1]] if len(rates) > 1 else rates))


def _decide_words(search: Search) -> str:
    """"; measured steps of about 40 s (at 31.25 req/s) to 900 s (at 34 req/s) would decide it", or ""."""
    needs = [(u["rate_rps"], u["decide_s"]) for u in search.undecided_steps() if u["decide_s"] is not None]
    if not needs:
        return "; longer steps (--step-duration) would decide it" if search.band() else ""
    lo, hi = min(needs, key=lambda n: n[1]), max(needs, key=lambda n: n[1])
    span = f"about {lo[1]:.3g} s (at {lo[0]:.4g} req/s)" + (f" to {hi[1]:.3g} s (at {hi[0]:.4g} req/s)" if hi != lo else "")
    return f"; measured steps of {span} would decide it (--step-duration)"


def _ends(search: Search) -> str:
    """What the search showed with confidence, in words."""
    parts = [f"the SLOs pass with confidence at {search.low:.4g} req/s" if search.low is not None
             else "no rate passed with confidence"]
    inside = search.band()
    if inside:
        parts.append(f"are undecided at {_rates(inside)} req/s")
    parts.append(f"fail with confidence at {search.high:.4g}" if search.high is not None else "no rate failed with confidence")
    return ", ".join(parts)


def _message(search: Search) -> str:
    """Why the search stopped and what it found, in words."""
    low, high, o = search.low, search.high, search.options
    why = STOPS[search.stopped][1] if search.stopped else "stopped"
    limit = f"; {search.limiting} is the SLO that gives out" if search.limiting else ""
    inside = search.band()
    if search.stopped == "precision":
        return f"capacity {low:.4g} req/s (the SLOs fail with confidence at {high:.4g}; within {o.precision:.0%}){limit}"
    if search.stopped == "undecided_band":
        pooled = max((u["pooled_s"] or 0 for u in search.undecided_steps()), default=0)
        return (f"capacity at least {low:.4g} req/s: the SLOs are undecided between {inside[0]:.4g} and {inside[-1]:.4g} "
                f"req/s after {pooled:g} s per rate ({LOOKS} looks)"
                + (f" and fail with confidence at {high:.4g}" if high is not None else f", up to --max-rate {o.max_rate:g}")
                + _decide_words(search) + limit)
    if search.stopped == "max_rate":
        return f"capacity at least {low:.4g} req/s: {why}"
    if search.stopped == "slo_fails_at_lowest_rate":
        return f"{why} ({high:.4g} req/s){limit}: try a lower --min-rate"
    if search.stopped == "inconclusive":
        rate = search.undecided[0]
        need = decide_s(search.final_look(rate) or {})
        return (f"{why} ({rate:.4g} req/s, undecided after {LOOKS} looks): use longer steps"
                + (f" (--step-duration about {need:.3g} s)" if need is not None else " (--step-duration)") + " or a higher rate")
    if search.stopped == "target_down":
        last = search.steps[-1]
        return (f"the target stopped answering at {last['rate_rps']:.4g} req/s ({last['requests']['errors']:,} of "
                f"{last['requests']['sent']:,} requests failed, {last['errors'].get('connect', 0):,} to connect): a dead "
                "target is not a capacity" + (f"; before it {_ends(search)}" if low is not None or high is not None else ""))
    if search.stopped == "generator_limit":
        last = search.steps[-1]
        return (f"{why} at {last['rate_rps']:.4g} req/s ({'; '.join(last['validity_reasons'])}); "
                + (f"the target met the SLOs up to {low:.4g} req/s — " if low else "")
                + "add worker processes (--workers) or load-generating machines, or raise the validity thresholds")
    found = f"; so far {_ends(search)}" if low is not None or high is not None or inside else ""
    last = search.steps[-1] if search.steps else {}
    cut = ""
    if last.get("verdict") == UNDECIDED and last.get("counted_as") is None:  # stopped between a step's looks
        need = decide_s(last)
        cut = (f"; the step at {last['rate_rps']:.4g} req/s was undecided after {last['pooled_s']:g} s"
               + (f" (about {need:.3g} s would decide it)" if need is not None else ""))
    return (f"no answer: {why}{found}{cut}" + (_decide_words(search) if inside else "")
            + (f" — {search.steps[-1]['note']}" if search.stopped == "run_failed" else ""))


def _sig(x: float) -> float:
    """Six significant figures (a cost per request can be a millionth of a dollar)."""
    return float(f"{x:.6g}")


def _write_page(out: Path) -> None:
    """capacity.html; a page that cannot be written is a warning, never a lost search."""
    import logging

    try:
        from latscope.report import write_capacity_page

        write_capacity_page(out)
    except Exception as exc:  # noqa: BLE001 - capacity.json is complete without the page
        logging.getLogger("latscope.report").warning("capacity.html not written (%s: %s)", type(exc).__name__, exc)
