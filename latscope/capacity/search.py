"""The search for the highest rate that meets the SLOs: double until a step fails, then bisect.

State: the bracket [low, high], `low` the highest rate that passed (None before any did), `high`
the lowest rate that failed (None before any did). Every step is run at `next_rate`:

    no fail yet:   2 · low, capped at max_rate        (the rate grows geometrically: few steps to a
                                                       fail whatever the starting point)
    bracketed:     (low + high) / 2                   (halves the bracket each step)

and the search is done when the bracket is narrower than the precision asked, relative to its
lower end: (high − low) / low ≤ precision, or when low has reached max_rate. From a first fail at
2ᵏ times the start it takes ⌈log₂(1 / precision)⌉ more steps to get there (5 for 5 %), so k + 1 + 5
steps in all; MLPerf LoadGen bisects its Server QPS the same way. The capacity found is `low`: a
rate that passed; the truth is somewhere in [low, high).

Stop reasons (capacity.json's `stopped`, named in results/schema.py), and the `latscope capacity`
exit code each one gives:
"""

from __future__ import annotations

from latscope.results.schema import CAPACITY_STOPS as STOPS

__doc__ += "".join(f"\n    {name:<26} exit {code}: {what}" for name, (code, what) in STOPS.items()) + "\n"


def narrow_enough(low: float | None, high: float | None, precision: float) -> bool:
    """Whether the bracket [low, high] is within `precision` of its lower end."""
    return low is not None and high is not None and (high - low) / low <= precision


def next_rate(low: float | None, high: float | None, precision: float, max_rate: float | None) -> float | None:
    """The rate of the next step, or None when the search is done (precision or max_rate reached).
    Needs a pass or a fail to go from: the first step's rate is the caller's."""
    if low is None:
        raise ValueError("the search cannot go on without a passing rate (the first step failed)")
    if high is None:
        if max_rate is not None and low >= max_rate:
            return None
        return min(2 * low, max_rate) if max_rate is not None else 2 * low
    if narrow_enough(low, high, precision):
        return None
    return (low + high) / 2


def steps_left(low: float | None, high: float | None, precision: float) -> int | None:
    """Bisection steps still needed once bracketed (not counting undecided reruns); None before."""
    if low is None or high is None:
        return None
    n = 0
    while (high - low) / low > precision:
        high = (low + high) / 2  # the worst case: every bisection fails, the bracket keeps its low end
        n += 1
    return n
