"""Cold starts: how much slower the first requests are after the run starts, after each phase
change, and on each replica the target added (first seen through its replica id header), against
the steady state that follows, and how long it took to get there.

Semantics (all at the run's reporting-interval granularity: histograms are per interval, not
per request):

- A *start* is the run's start (the first phase, kind "run_start"), each later phase's start
  (kind "phase"; both from summary.json's phases, on latency of class "all"), and each replica's
  first response (kind "replica", at the `replica_first_seen` event; on that replica's own
  `replica_latency` histograms, which the engine records from the X-Replica-Id header).
- Its *segment* is the stretch it opens: the phase (the last phase's runs on to the end of the
  run, so that requests still completing then count) or, for a replica, its life within the run
  (its first to its last interval with data). The segment's intervals are those that end after
  `at_s`: the interval holding `at_s` is the first one, even if it started a little before.
- The *first N requests* are the segment's earliest intervals, merged until they hold at least N
  values (so: at least N, the whole of the last interval taken).
- The *steady state* is the second half of the segment, by time, never overlapping the first-N
  intervals: late enough for a warm-up to be over, measured on the same traffic. No steady state
  (None) when nothing is left for it.
- *Time to steady* runs from `at_s` to the start of the first window from which every later
  window of the segment has a p50 no more than 20% above the steady p50 (0 when that holds from
  the first window on; None when the segment's last window is still above). Windows, not single
  intervals: the segment's intervals are grouped, in order, into runs holding at least N values
  each (the first window is the first N's), so that each p50 rests on as many requests as the
  first N's does. Only "above" counts: a cold start is a slowdown, and a fast window is no sign
  of one.
- *Cold*: the first N's p50 more than 1.5 × the steady p50 (a slow first stretch), or their max more
  than 1.5 × the steady max (a few requests that waited for a model load, slower than anything the
  steady state came near: often only the first one or two requests pay a load, and the p50 of
  the first N then hides it). If the first N and the M steady requests were alike (exchangeable),
  the first N would hold the largest of all of them with probability N / (N + M), and exceed it by
  half again far more rarely; `cold_by` says which rule fired.

Warm-up phases are analysed too, and their starts (and replicas first seen during one) are
flagged "warmup": True.
"""

from __future__ import annotations

import math

import numpy as np

from latscope.analysis.run_data import ClassIntervals, RunData, metric_intervals
from latscope.engine import OTHER_REPLICAS, REPLICA_METRIC, replica_class
from latscope.recorder import summarize

FIRST_N = 20  # requests that count as "first" after a start
COLD_RATIO = 1.5  # first p50 above this many times the steady p50 is a cold start
STEADY_BAND = 0.2  # an interval p50 within 20% above the steady p50 is steady


def cold_starts(run: RunData, first_n: int = FIRST_N) -> list[dict]:
    """One dict per start, in time order:
    {"kind": "run_start" | "phase" | "replica", "label": str (phase name or replica id),
     "at_s": float (run clock), "first_count": int, "first_p50_ms", "first_p99_ms", "first_max_ms",
     "steady_count": int, "steady_p50_ms", "steady_p99_ms",
     "slowdown_p50": first_p50 / steady_p50 (None without a steady state),
     "time_to_steady_s": seconds from at_s until the interval p50 stays within 20% of steady (None if never;
                         "interval": a window of at least N requests, see the module docstring),
     "cold": bool (first p50 > 1.5 × steady p50, or first max > 1.5 × steady max), "cold_by": "p50" | "max" | None}
    Warm-up phases are analysed too (cold starts often happen there) and flagged "warmup": True.
    Also: "metric", "class", "warmup", "first_until_s" (end of the first-N intervals),
    "steady_from_s" (start of the steady intervals, None without a steady state) and, for a
    replica, "replica": its id as the server sent it (the label is its tag-safe class)."""
    starts = []
    phases = run.summary.get("phases", [])
    latency = metric_intervals(run, "latency").get("all")
    if latency is not None and len(latency):
        for i, phase in enumerate(phases):
            end = phase["start_s"] + phase["duration_s"] if i + 1 < len(phases) else math.inf
            entry = _analyse(latency, phase["start_s"], end, first_n)
            if entry is not None:
                starts.append({"kind": "run_start" if i == 0 else "phase", "label": phase["name"],
                               "metric": "latency", "class": "all", "warmup": bool(phase.get("warmup")), **entry})
    first_seen: dict[str, tuple[float, str]] = {}  # replica class -> (first seen, id as sent)
    for event in run.events:
        if event.get("event") == "replica_first_seen" and None not in (event.get("replica"), event.get("t_s")):
            first_seen.setdefault(replica_class(str(event["replica"])), (float(event["t_s"]), str(event["replica"])))
    for replica, intervals in metric_intervals(run, REPLICA_METRIC).items():
        if replica == OTHER_REPLICAS or not len(intervals):
            continue
        at_s, sent_as = first_seen.get(replica, (float(intervals.start_s[0]), replica))
        entry = _analyse(intervals, at_s, math.inf, first_n)
        if entry is not None:
            phase = run.phase_at(at_s)
            starts.append({"kind": "replica", "label": replica, "metric": REPLICA_METRIC, "class": replica,
                           "warmup": bool(phase and phase.get("warmup")), "replica": sent_as, **entry})
    starts.sort(key=lambda s: (s["at_s"], s["kind"] != "run_start"))
    return starts


def _analyse(intervals: ClassIntervals, at_s: float, end_s: float, first_n: int) -> dict | None:
    """The cold-start numbers of the segment [at_s, end_s) of `intervals` (None when it holds no value)."""
    ends = intervals.start_s + intervals.length_s
    positions = np.flatnonzero((ends > at_s) & (intervals.start_s < end_s))
    totals = intervals.totals[positions]
    positions, totals = positions[totals > 0], totals[totals > 0]  # empty intervals carry nothing
    if not len(positions):
        return None
    n_first = int(min(np.searchsorted(np.cumsum(totals), first_n, side="left") + 1, len(positions)))
    first = summarize(intervals.merged(positions[:n_first]))
    first_until = float(ends[positions[n_first - 1]])
    segment_end = min(end_s, float(ends[positions[-1]]))
    middle = at_s + (segment_end - at_s) / 2
    later = positions[n_first:]
    steady_positions = later[intervals.start_s[later] >= middle]
    steady = summarize(intervals.merged(steady_positions)) if len(steady_positions) else {"count": 0}
    entry = {
        "at_s": round(float(at_s), 6),
        "first_count": first["count"],
        "first_p50_ms": first["p50_ms"],
        "first_p99_ms": first["p99_ms"],
        "first_max_ms": first["max_ms"],
        "first_until_s": round(first_until, 6),
        "steady_count": steady["count"],
        "steady_p50_ms": steady.get("p50_ms"),
        "steady_p99_ms": steady.get("p99_ms"),
        "steady_max_ms": steady.get("max_ms"),
        "steady_from_s": round(float(intervals.start_s[steady_positions[0]]), 6) if steady["count"] else None,
        "slowdown_p50": None,
        "time_to_steady_s": None,
        "cold": False,
        "cold_by": None,
    }
    if steady["count"] and steady["p50_ms"] > 0:
        steady_p50 = steady["p50_ms"]
        entry["slowdown_p50"] = round(first["p50_ms"] / steady_p50, 3)
        if first["p50_ms"] > COLD_RATIO * steady_p50:
            entry["cold_by"] = "p50"
        elif first["max_ms"] > COLD_RATIO * steady["max_ms"]:
            entry["cold_by"] = "max"
        entry["cold"] = entry["cold_by"] is not None
        windows = _windows(totals, first_n)
        p50_ms = np.array([intervals.span_percentile(50.0, positions[a], positions[b - 1]) for a, b in windows]) / 1000
        above = np.flatnonzero(p50_ms > (1 + STEADY_BAND) * steady_p50)
        if not len(above):
            entry["time_to_steady_s"] = 0.0
        elif above[-1] + 1 < len(windows):
            settled = float(intervals.start_s[positions[windows[above[-1] + 1][0]]])
            entry["time_to_steady_s"] = round(max(0.0, settled - at_s), 6)
    return entry


def _windows(totals: np.ndarray, first_n: int) -> list[tuple[int, int]]:
    """Consecutive runs [a, b) of intervals holding at least first_n values each (a short tail
    joins the window before it): the p50 of a window of N values is as steady a statistic as the
    first N's, where a single short interval's p50 would swing with two or three requests."""
    windows, a, held = [], 0, 0
    for i, n in enumerate(totals.tolist()):
        held += n
        if held >= first_n:
            windows.append((a, i + 1))
            a, held = i + 1, 0
    if a < len(totals):
        if windows:
            windows[-1] = (windows[-1][0], len(totals))
        else:
            windows.append((a, len(totals)))
    return windows
