"""A remote machine's monotonic clock, measured from here by pings (NTP's rule, min-filtered).

A ping leaves here at t1 (this machine's perf_counter_ns), the remote stamps t2 on its own clock
and answers, the answer arrives at t4. If the remote clock reads θ ahead of ours,

    t2 = t1 + θ + d_out,   t4 = t2 − θ + d_back   (d_out, d_back ≥ 0: the two one-way delays)

so θ̂ = t2 − (t1 + t4)/2 = θ + (d_out − d_back)/2, and |θ̂ − θ| ≤ (d_out + d_back)/2 = (t4 − t1)/2
whatever the asymmetry. The sample with the shortest round trip has the smallest bound: it is the
estimate. Drift is the least-squares slope of the per-window best samples (one window per `WINDOW`
samples, e.g. the initial burst, then each re-measure), in parts per million, once the windows
span DRIFT_SPAN_NS: over a shorter span the bounds' noise (bound / span) would pass for drift. Only
windows whose best round trip is near the shortest seen count (GOOD_RTT): on a busy machine a window
of four slow round trips has a bound of tens of ms, and one such window would tilt the fit by as much.

The offset a node starts from is the estimate when its start goes out (`freeze`): later, shorter
round trips refine what is reported as drift, never the t0 the node was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 4  # samples per drift window: each re-measure sends this many pings
DRIFT_SPAN_NS = 30_000_000_000


def good_rtt(rtt_ns: int, rtt_min_ns: int) -> bool:
    """A window's best round trip is within twice the shortest seen, plus 0.2 ms."""
    return rtt_ns <= 2 * rtt_min_ns + 200_000


@dataclass
class ClockEstimate:
    samples: int = 0
    best: tuple[int, int, int] | None = None  # (t1, t2, t4) of the shortest round trip so far
    windows: list[tuple[int, int, int]] = field(default_factory=list)  # the best sample of each window
    _window: list[tuple[int, int, int]] = field(default_factory=list)
    used: tuple[int, int, int] | None = None  # the sample the node's t0 was computed from (freeze)

    def freeze(self) -> int:
        """The offset the node is given its t0 with, from now on what the summary reports."""
        self.used = self.best
        return self.offset_ns

    def add(self, t1: int, t2: int, t4: int) -> None:
        if t4 < t1:
            return  # not a round trip on one clock: ignored
        sample = (t1, t2, t4)
        self.samples += 1
        if self.best is None or t4 - t1 < self.best[2] - self.best[0]:
            self.best = sample
        self._window.append(sample)
        if len(self._window) >= WINDOW:
            self.windows.append(min(self._window, key=lambda s: s[2] - s[0]))
            self._window = []

    @property
    def offset_ns(self) -> int:
        """θ̂: what to add to a time on our clock to get the remote's reading of it."""
        t1, t2, t4 = self.used or self.best
        return t2 - (t1 + t4) // 2

    @property
    def bound_ns(self) -> int:
        """The estimate is within this of the true offset (half the best round trip)."""
        t1, _, t4 = self.used or self.best
        return (t4 - t1 + 1) // 2

    @property
    def rtt_min_ns(self) -> int:
        t1, _, t4 = self.used or self.best
        return t4 - t1

    def drift_ppm(self) -> float | None:
        """The remote clock's rate against ours, minus one, in ppm, from the windows with a good
        round trip; None before those span DRIFT_SPAN_NS."""
        good = [w for w in self.windows if good_rtt(w[2] - w[0], self.best[2] - self.best[0])]
        if len(good) < 2 or good[-1][0] - good[0][0] < DRIFT_SPAN_NS:
            return None
        xs = [(t1 + t4) / 2 for t1, _, t4 in good]
        ys = [t2 - (t1 + t4) / 2 for t1, t2, t4 in good]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx * 1e6

    def summary(self, run_s: float) -> dict:
        """summary.json generator.nodes[].clock; max_error_ms adds the drift over the run to the bound."""
        drift = self.drift_ppm()
        bound_ms = self.bound_ns / 1e6
        return {
            "offset_ms": round(self.offset_ns / 1e6, 4),
            "bound_ms": round(bound_ms, 4),
            "rtt_min_ms": round(self.rtt_min_ns / 1e6, 4),
            "drift_ppm": None if drift is None else round(drift, 3),
            "max_error_ms": round(bound_ms + abs(drift or 0.0) * 1e-6 * run_s * 1e3, 4),
            "samples": self.samples,
        }
