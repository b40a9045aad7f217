"""A Prometheus histogram between two scrapes: the buckets' increase, its quantiles and its mean.

An engine's TTFT or queue-time histogram is cumulative since it started, so a scrape says nothing
about *this* moment of the run; the difference of two scrapes does: the observations made between
them. From that difference a quantile is interpolated the way Prometheus's `histogram_quantile`
does it (promql/quantile.go: `bucketQuantile`), so the numbers agree with what the user's Grafana
shows for the same window:

- rank = q × (observations in the window); the quantile is in the first bucket whose cumulative
  count reaches the rank;
- inside that bucket, linearly: lower bound + (upper − lower) × (rank − count below) / (count in
  the bucket), the lower bound of the first bucket being 0;
- a rank in the +Inf bucket gives the highest finite bound (nothing above it is known).

The error: the true quantile is somewhere in the bucket the rank falls in, so the interpolated
value is off by at most that bucket's width (upper − lower), and exactly right only when the
observations in it are spread evenly. vLLM's TTFT buckets (…, 0.1, 0.25, 0.5, …) s make that up to
150 ms at 100–250 ms, and 250 ms at 250–500 ms. The mean (_sum/_count) has no such error. A window
without new observations has no quantile and no mean (None): no sample, not a 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Histogram:
    """One histogram's cumulative state at a scrape, its series merged: {upper bound: cumulative
    count} (with +Inf), the _sum and the _count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def add(self, part: str, value: float, le: str | None = None) -> None:
        """Add one sample of a series: part "bucket" (with its `le`), "sum" or "count"."""
        if part == "bucket" and le is not None:
            bound = float(le)  # "+Inf" parses to inf
            self.buckets[bound] = self.buckets.get(bound, 0.0) + value
        elif part == "sum":
            self.sum += value
        elif part == "count":
            self.count += value

    def since(self, before: Histogram) -> Histogram | None:
        """The observations made between `before` and this scrape; None when a bucket or the count
        went down (the server restarted: its counters began again) or the bounds changed."""
        if set(before.buckets) - set(self.buckets):
            return None
        delta = Histogram({b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()},
                          self.sum - before.sum, self.count - before.count)
        if delta.count < 0 or any(c < 0 for c in delta.buckets.values()):
            return None
        return delta

    def observations(self) -> float:
        """How many observations: the +Inf bucket, or the _count where the page had no +Inf bucket."""
        return self.buckets.get(math.inf, self.count)


def bucket_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile (0 < q < 1) of {upper bound: cumulative count}, interpolated like Prometheus's
    histogram_quantile; None without observations or without a +Inf bucket (as Prometheus: NaN)."""
    bounds = sorted(buckets)
    if len(bounds) < 2 or bounds[-1] != math.inf:
        return None
    counts, highest = [], 0.0
    for b in bounds:  # a scrape read between two bucket updates can be non-monotonic: fix as Prometheus does
        highest = max(highest, buckets[b])
        counts.append(highest)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    i = next(k for k, c in enumerate(counts) if c >= rank)
    if i == len(bounds) - 1:
        return bounds[-2]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    lower = 0.0 if i == 0 else bounds[i - 1]
    below = 0.0 if i == 0 else counts[i - 1]
    return lower + (bounds[i] - lower) * (rank - below) / (counts[i] - below)


def window_value(delta: Histogram, quantile: float | None) -> float | None:
    """A window's quantile (`quantile` set) or mean (None); None when it had no observations."""
    if delta.observations() <= 0:
        return None
    if quantile is not None:
        return bucket_quantile(quantile, delta.buckets)
    return delta.sum / delta.count if delta.count > 0 else None
