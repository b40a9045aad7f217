"""The gate over a capacity directory (`latscope capacity`): is the endpoint's capacity enough, and
did it drop against a baseline search? And the one home where capacity.json is read (`read_capacity`).

A capacity search answers with two confidence statements: the SLOs passed with confidence at `low`
and failed with confidence at `high`, and between them may lie an undecided band (rates the data
could not tell apart from the limits, capacity.json schema 2). The true capacity is somewhere in
[low, high); the band is not a failure. The checks, and the outcome each decides:

- **search** — the search must have an answer: `slo_fails_at_lowest_rate` is an SLO breach (exit 1);
  `precision`, `max_rate` and `undecided_band` are answers (at least `low`), and so is `max_steps`
  once a rate passed with confidence (the search ran out of steps, but its confident ends stand); a
  search that stopped without one (generator limit, target down, interrupted, inconclusive, out of
  steps with no pass) is not a measurement of the target's capacity: `invalid` (exit 4), as for a run.
- **min_capacity_rps** (gate file) — fails when the confident upper end is at or below the minimum:
  the SLOs failed with confidence at a rate short of it, so the capacity certainly is (exit 1). It
  passes when the confident lower end reaches the minimum. A minimum in between: a pass when the
  two ends are within the search's precision (no band wider than it), else inconclusive (the data
  cannot tell; longer steps can), never a fail.
- **regression** against a baseline capacity directory — fails only when the new confident upper end
  is at or below the baseline's confident lower end (exit 3): the new search failed with confidence
  where the old one passed with confidence. Overlapping brackets, bands included, never fail a build.

Old capacity.json files (schema_version 1) counted a rate undecided twice as a fail, so their
`high_rps` may be such a rate, not a confident fail: `confident_ends` takes their upper end from the
steps that did fail with confidence (verdict "fail"), and the undecided-twice ones as their band.

`read_capacity` refuses a file it cannot trust, with one line naming it and what is wrong
(ResultsError, exit 2): not JSON, NaN or Infinity anywhere (JSON has neither; Python's json writes
and reads them), nested too deeply to read, a schema_version from a newer latscope, `steps` that is
not a list of objects, a bracket whose ends are not finite rates ≥ 0 in order.
"""

from __future__ import annotations

import math
from pathlib import Path

from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, Check, GateResult, outcome
from latscope.errors import ResultsError
from latscope.results.reading import read_json
from latscope.results.schema import CAPACITY, CAPACITY_SCHEMA_VERSION
from latscope.scenario.gate_file import GateFile


def is_capacity_dir(path: str | Path) -> bool:
    return (Path(path) / CAPACITY).is_file()


def _rate(value: object) -> bool:
    """A rate capacity.json may hold: None, or a finite number ≥ 0 (not a bool)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and value >= 0)


def _problem(capacity: object) -> str | None:
    """What makes a parsed capacity.json unusable, in words; None when it is fine."""
    if not isinstance(capacity, dict):
        return "expected a JSON object"
    version = capacity.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"schema_version {version!r} is not a version number"
    if version > CAPACITY_SCHEMA_VERSION:
        return (f"schema_version {version} is from a newer latscope (this one reads up to {CAPACITY_SCHEMA_VERSION}); "
                "upgrade latscope to read it")
    steps = capacity.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        return "`steps` must be a list of objects (one per step)"
    for s in steps:
        if not _rate(s.get("rate_rps")):
            return f"a step's rate_rps {s.get('rate_rps')!r} is not a rate"
    bracket = capacity.get("bracket", {})
    if not isinstance(bracket, dict):
        return "`bracket` must be an object"
    keys = ("low_rps", "high_rps", "undecided_low_rps", "undecided_high_rps")
    for key in keys:
        if not _rate(bracket.get(key)):
            return f"bracket.{key} {bracket.get(key)!r} is not a rate (a finite number ≥ 0, or null)"
    low, high = bracket.get("low_rps"), bracket.get("high_rps")
    if low is not None and high is not None and low >= high:
        return f"bracket.low_rps {low!r} is not below bracket.high_rps {high!r}"
    if not _rate(capacity.get("max_rate_rps")):
        return f"max_rate_rps {capacity.get('max_rate_rps')!r} is not a rate"
    undecided = capacity.get("undecided_rps", [])
    if not isinstance(undecided, list) or not all(_rate(r) and r is not None for r in undecided):
        return "`undecided_rps` must be a list of rates"
    stopped = capacity.get("stopped")
    if stopped is not None and not isinstance(stopped, str):
        return f"`stopped` {stopped!r} is not a stop reason"
    if not isinstance(capacity.get("message", ""), str):
        return "`message` must be text"
    return None


def read_capacity(path: str | Path) -> dict:
    """DIR/capacity.json (the gate and the capacity page read it); ResultsError naming the file and
    what is wrong when it is missing, not JSON, or not a capacity.json to trust (module docstring)."""
    directory = Path(path)
    source = directory / CAPACITY
    if not source.is_file():
        raise ResultsError(f"{source}: no such file; is {directory} a `latscope capacity` directory?")
    capacity = read_json(source)  # not JSON, NaN or Infinity, nested too deeply: ResultsError naming it
    problem = _problem(capacity)
    if problem:
        raise ResultsError(f"{source}: {problem}")
    return capacity


def confident_ends(cap: dict) -> tuple[float | None, float | None]:
    """(low, high): the highest rate that passed and the lowest that failed, with confidence. A
    schema 1 file's high_rps may be a rate undecided twice: its high is then the lowest step with a
    real fail verdict (and None when there is none)."""
    bracket = cap.get("bracket") or {}
    low, high = bracket.get("low_rps"), bracket.get("high_rps")
    if cap.get("schema_version", 1) < 2 and high is not None:
        fails = [s["rate_rps"] for s in cap.get("steps", []) if s.get("verdict") == "fail" and s.get("counted_as") == "fail"]
        high = min(fails) if fails else None
    return low, high


def band_wider_than_precision(cap: dict) -> bool:
    """Whether the two confident ends are further apart than the search's precision."""
    low, high = confident_ends(cap)
    precision = cap.get("precision")
    if low is None or high is None or not low:
        return True
    return not (isinstance(precision, (int, float)) and (high - low) / low <= precision)


def _rps(x: float | None) -> str:
    return "—" if x is None else f"{x:,.4g} req/s"


def search_check(cap: dict, role: str) -> Check:
    """Did the search find an answer?"""
    stopped, message = cap.get("stopped"), cap.get("message", "")
    name = f"{role} capacity search"
    if stopped in ("precision", "max_rate", "undecided_band"):
        return Check("validity", name, PASS, f"{role} search: {message}", {"stopped": stopped})
    if stopped == "max_steps" and confident_ends(cap)[0] is not None:
        # out of steps, but what it found is confident: the capacity is at least its lower end
        return Check("validity", name, PASS, f"{role} search (out of steps, its confident ends stand): {message}",
                     {"stopped": stopped})
    if stopped == "slo_fails_at_lowest_rate":
        return Check("slo", name, FAIL, f"{role} search: {message}", {"stopped": stopped})
    return Check("validity", name, INCONCLUSIVE, f"{role} search has no answer ({stopped}): {message}", {"stopped": stopped})


def minimum_check(cap: dict, minimum: float) -> Check:
    """The capacity found against the gate file's min_capacity_rps (the confident ends)."""
    low, high = confident_ends(cap)
    name = "capacity ≥ min_capacity_rps"
    details = {"low_rps": low, "high_rps": high, "min_capacity_rps": minimum}
    bracket = f"[{_rps(low)}, {_rps(high)})"
    if high is not None and high <= minimum:
        return Check("slo", name, FAIL, f"capacity {bracket} is below the minimum {_rps(minimum)}: the SLOs already fail "
                                        f"with confidence at {_rps(high)}", details)
    if low is not None and low >= minimum:
        return Check("slo", name, PASS, f"capacity {bracket} meets the minimum {_rps(minimum)}", details)
    if high is None and not cap.get("undecided_rps"):
        return Check("slo", name, INCONCLUSIVE, f"capacity {bracket}: the search never reached {_rps(minimum)}", details)
    if band_wider_than_precision(cap):
        return Check("slo", name, INCONCLUSIVE, f"capacity {bracket}: the SLOs were undecided around {_rps(minimum)} — "
                                                "longer steps (--step-duration) can tell", details)
    return Check("slo", name, PASS, f"capacity {bracket} reaches the minimum {_rps(minimum)} within the search's precision", details)


def regression_check(new: dict, base: dict) -> Check:
    """New confident ends against the baseline's: a regression only when the new search failed with
    confidence where the baseline passed with confidence."""
    (n_low, n_high), (b_low, b_high) = confident_ends(new), confident_ends(base)
    name = "capacity vs baseline"
    details = {"new": {"low_rps": n_low, "high_rps": n_high}, "baseline": {"low_rps": b_low, "high_rps": b_high}}
    text = f"capacity [{_rps(n_low)}, {_rps(n_high)}) vs baseline [{_rps(b_low)}, {_rps(b_high)})"
    if n_low is None or b_low is None:
        return Check("regression", name, INCONCLUSIVE, f"{text}: a search without a passing rate cannot be compared", details)
    if n_high is not None and n_high <= b_low:
        return Check("regression", name, FAIL, f"{text}: the new search fails with confidence where the baseline passed — "
                                               f"capacity dropped {1 - n_high / b_low:.0%} at least", details)
    return Check("regression", name, PASS, f"{text}: " + ("the brackets overlap (the same within what the data shows)"
                                                          if n_low < (b_high or float("inf")) else "higher"), details)


def capacity_gate(capacity_dir: str | Path, baseline_dir: str | Path | None, gate_file: GateFile) -> GateResult:
    """All checks of the gate over a capacity directory (and a baseline capacity directory)."""
    new = read_capacity(capacity_dir)
    checks = [search_check(new, "new")]
    base = None
    if baseline_dir is not None:
        if not is_capacity_dir(baseline_dir):
            raise ResultsError(f"{baseline_dir} is not a capacity directory (no {CAPACITY}); a capacity search is "
                               "compared with another capacity search")
        base = read_capacity(baseline_dir)
        checks.append(search_check(base, "baseline"))
    if gate_file.min_capacity_rps is not None and checks[0].status == PASS:
        checks.append(minimum_check(new, gate_file.min_capacity_rps))
    if base is not None and all(c.status == PASS for c in checks):
        checks.append(regression_check(new, base))
    return GateResult(checks, outcome(checks))
