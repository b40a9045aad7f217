"""The search for the highest rate that meets the SLOs, as pure functions of what is known so far.

What is known is two confidence statements and a band between them (runner.py keeps them):

    low          the highest rate that PASSED with confidence (None before any did)
    high         the lowest rate that FAILED with confidence (None before any did)
    undecided    the rates still undecided after every look of their step (steps.py: up to
                 K = 3 looks, the evidence pooled); they are neither a pass nor a fail

A rate that passed above the lowest fail contradicts it (one of the two statements is wrong, which
the confidence level allows now and then): `low` is the highest pass *below* `high`, so that always
low < high. The band is the undecided rates between them, [u₋, u₊] (its lowest and highest).

The next rate (`next_rate`):

    no fail yet:   2 · max(low, u₊), capped at max_rate   (the rate grows geometrically: few steps to
                                                         a fail whatever the start)
    both ends:     the midpoint of the wider of the two gaps that can still move an end,
                   [low, u₋] and [u₊, high] (or [low, high] with no band), wider relative to its
                   lower end; none when each is within the precision

and the search is done when

    (high − low) / low ≤ precision                      → `precision` (the two confident ends)
    each gap ≤ precision, the band wider than precision  → `undecided_band`: the SLOs cannot be
                                                           told apart from their limits between u₋
                                                           and u₊ at this step length
    low ≥ max_rate                                      → `max_rate`

From a first fail at 2ᵏ times the start, bisection takes ⌈log₂(1 / precision)⌉ more steps (5 for 5 %),
each with at most two extensions; MLPerf LoadGen bisects its Server QPS the same way.

How long a step would decide (`decide_seconds`): an undecided SLO with value v, its interval's
half-width w on the side facing its limit L, measured over s seconds: intervals shrink as 1/√n, so
a step s·(w / |v − L|)² long would have the half-width |v − L| and decide it (about: v itself moves).
Past MAX_DECIDE_FACTOR times the data (v within ~3 % of w from L) the value is at the limit for any
step worth running, and no length is given.

Stop reasons (capacity.json's `stopped`, named in results/schema.py), and the `latscope capacity`
exit code each one gives:
"""

from __future__ import annotations

import math

from latscope.results.schema import CAPACITY_STOPS as STOPS

MAX_DECIDE_FACTOR = 1000.0  # decide_seconds gives no length past this many times the data it has

__doc__ += "".join(f"\n    {name:<26} exit {code}: {what}" for name, (code, what) in STOPS.items()) + "\n"


def narrow_enough(low: float | None, high: float | None, precision: float) -> bool:
    """Whether the bracket [low, high] is within `precision` of its lower end."""
    return low is not None and high is not None and (high - low) / low <= precision


def band(low: float | None, high: float | None, undecided: list[float]) -> list[float]:
    """The undecided rates between the confident ends, sorted (above `low`; below `high` when there is one)."""
    return sorted(r for r in undecided if (low is None or r > low) and (high is None or r < high))


def gaps(low: float, high: float, undecided: list[float]) -> list[tuple[float, float]]:
    """The gaps a step can still narrow: [low, u₋] and [u₊, high], or [low, high] with no band."""
    inside = band(low, high, undecided)
    return [(low, inside[0]), (inside[-1], high)] if inside else [(low, high)]


def next_rate(low: float | None, high: float | None, precision: float, max_rate: float | None,
              undecided: list[float] = ()) -> float | None:
    """The rate of the next step, or None when the search is done (see `stop_reason`). Needs a
    confident pass to go from: the first step's rate is the caller's."""
    if low is None:
        raise ValueError("the search cannot go on without a passing rate (the first step failed or was undecided)")
    undecided = list(undecided)
    if high is None:
        top = max([low, *band(low, None, undecided)])
        if max_rate is not None and top >= max_rate:
            return None
        return min(2 * top, max_rate) if max_rate is not None else 2 * top
    if narrow_enough(low, high, precision):
        return None
    a, b = max(gaps(low, high, undecided), key=lambda g: (g[1] - g[0]) / g[0])
    return None if (b - a) / a <= precision else (a + b) / 2


def stop_reason(low: float | None, high: float | None, precision: float, max_rate: float | None,
                undecided: list[float] = ()) -> str:
    """Why `next_rate` said the search is done: "precision", "max_rate" or "undecided_band"."""
    if high is None:
        return "undecided_band" if band(low, None, list(undecided)) else "max_rate"
    return "precision" if narrow_enough(low, high, precision) else "undecided_band"


def steps_left(low: float | None, high: float | None, precision: float) -> int | None:
    """Bisection steps still needed once bracketed (not counting extensions); None before."""
    if low is None or high is None:
        return None
    n = 0
    while (high - low) / low > precision:
        high = (low + high) / 2  # the worst case: every bisection fails, the bracket keeps its low end
        n += 1
    return n


def decide_seconds(measured_s: float, value: float | None, low: float | None, high: float | None,
                   limit: float) -> float | None:
    """About how many measured seconds would decide an undecided SLO (the module docstring): None
    when its interval is open on the side facing the limit, or the value sits on the limit."""
    if value is None or not math.isfinite(value) or value == limit:
        return None
    edge = high if value < limit else low
    if edge is None or not math.isfinite(edge):
        return None
    factor = (abs(edge - value) / abs(value - limit)) ** 2
    return measured_s * factor if factor <= MAX_DECIDE_FACTOR else None
