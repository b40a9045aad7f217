"""Cold starts: how much slower the first requests are after the run starts, after each phase
change, and on each replica the target added (first seen through its replica id header), against
the steady state that follows, and how long it took to get there."""

from __future__ import annotations

from latscope.analysis.run_data import RunData

FIRST_N = 20  # requests that count as "first" after a start


def cold_starts(run: RunData, first_n: int = FIRST_N) -> list[dict]:
    """One dict per start, in time order:
    {"kind": "run_start" | "phase" | "replica", "label": str (phase name or replica id),
     "at_s": float (run clock), "first_count": int, "first_p50_ms", "first_p99_ms", "first_max_ms",
     "steady_count": int, "steady_p50_ms", "steady_p99_ms",
     "slowdown_p50": first_p50 / steady_p50 (None without a steady state),
     "time_to_steady_s": seconds from at_s until the interval p50 stays within 20% of steady (None if never),
     "cold": bool (first_p50 > 1.5 × steady_p50)}
    Warm-up phases are analysed too (cold starts often happen there) and flagged "warmup": True."""
    raise NotImplementedError
