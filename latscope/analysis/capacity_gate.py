"""The gate over a capacity directory (`latscope capacity`): is the endpoint's capacity enough, and
did it drop against a baseline search?

A capacity search answers with a bracket [low, high): the SLOs held at `low` and failed at `high`,
so the true capacity is somewhere in between. The checks, and the outcome each decides:

- **search** — the search must have an answer: `slo_fails_at_lowest_rate` is an SLO breach (exit 1);
  a search that stopped without one (generator limit, max steps, interrupted, inconclusive) is not a
  measurement of the target: `invalid` (exit 4), as for a run.
- **min_capacity_rps** (gate file) — fails when the bracket's upper end is below the minimum: even
  the rate that failed is short of it, so the capacity certainly is (exit 1). A bracket with no upper
  end (the SLOs held at --max-rate) passes when its lower end reaches the minimum.
- **regression** against a baseline capacity directory — fails only when the brackets do not overlap
  and the new one is below: new high ≤ baseline low (exit 3). Overlapping brackets are the same
  capacity within the searches' precision, and never fail a build.
"""

from __future__ import annotations

import json
from pathlib import Path

from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, Check, GateResult, outcome
from latscope.errors import ResultsError
from latscope.results.schema import CAPACITY
from latscope.scenario.gate_file import GateFile


def is_capacity_dir(path: str | Path) -> bool:
    return (Path(path) / CAPACITY).is_file()


def read_capacity(path: str | Path) -> dict:
    """DIR/capacity.json (the gate and the capacity page read it); ResultsError when it is missing,
    not JSON, or not a JSON object."""
    directory = Path(path)
    source = directory / CAPACITY
    try:
        capacity = json.loads(source.read_text())
    except OSError as exc:
        raise ResultsError(f"{source}: cannot read it ({exc.strerror or exc}); is {directory} a `latscope capacity` directory?") from exc
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(capacity, dict):
        raise ResultsError(f"{source}: expected a JSON object")
    return capacity


def _rps(x: float | None) -> str:
    return "—" if x is None else f"{x:,.4g} req/s"


def search_check(cap: dict, role: str) -> Check:
    """Did the search find an answer?"""
    stopped, message = cap.get("stopped"), cap.get("message", "")
    name = f"{role} capacity search"
    if stopped in ("precision", "max_rate"):
        return Check("validity", name, PASS, f"{role} search: {message}", {"stopped": stopped})
    if stopped == "slo_fails_at_lowest_rate":
        return Check("slo", name, FAIL, f"{role} search: {message}", {"stopped": stopped})
    return Check("validity", name, INCONCLUSIVE, f"{role} search has no answer ({stopped}): {message}", {"stopped": stopped})


def minimum_check(cap: dict, minimum: float) -> Check:
    """The capacity found against the gate file's min_capacity_rps."""
    low, high = cap["bracket"]["low_rps"], cap["bracket"]["high_rps"]
    name = "capacity ≥ min_capacity_rps"
    details = {"low_rps": low, "high_rps": high, "min_capacity_rps": minimum}
    bracket = f"[{_rps(low)}, {_rps(high)})"
    if high is not None and high <= minimum:
        return Check("slo", name, FAIL, f"capacity {bracket} is below the minimum {_rps(minimum)}: the SLOs already fail "
                                        f"at {_rps(high)}", details)
    if low is not None and low >= minimum:
        return Check("slo", name, PASS, f"capacity {bracket} meets the minimum {_rps(minimum)}", details)
    if high is None:
        return Check("slo", name, INCONCLUSIVE, f"capacity {bracket}: the search never reached {_rps(minimum)}", details)
    return Check("slo", name, PASS, f"capacity {bracket} reaches the minimum {_rps(minimum)} within the search's precision", details)


def regression_check(new: dict, base: dict) -> Check:
    """New bracket against the baseline's: a regression only when wholly below it."""
    n, b = new["bracket"], base["bracket"]
    name = "capacity vs baseline"
    details = {"new": n, "baseline": b}
    text = f"capacity [{_rps(n['low_rps'])}, {_rps(n['high_rps'])}) vs baseline [{_rps(b['low_rps'])}, {_rps(b['high_rps'])})"
    if n["low_rps"] is None or b["low_rps"] is None:
        return Check("regression", name, INCONCLUSIVE, f"{text}: a search without a passing rate cannot be compared", details)
    if n["high_rps"] is not None and n["high_rps"] <= b["low_rps"]:
        return Check("regression", name, FAIL, f"{text}: the brackets do not overlap — capacity dropped "
                                               f"{1 - n['high_rps'] / b['low_rps']:.0%} at least", details)
    return Check("regression", name, PASS, f"{text}: " + ("the brackets overlap (the same within precision)"
                                                          if n["low_rps"] < (b["high_rps"] or float("inf")) else "higher"), details)


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
