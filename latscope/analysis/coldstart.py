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
  window of the segment has a p50 at or under the *steady ceiling*: 20% above the steady p50, or,
  where the steady state's own windows spread wider (a noisy target, a load that still changes),
  the highest of their p50s — a window no worse than every steady window is as steady as they are
  (0 when that holds from the first window on; None without a steady state). Windows, not single
  intervals: the segment's intervals are grouped, in order, into runs holding at least N values
  each (the first window is the first N's), so that each p50 rests on as many requests as the
  first N's does. Only "above" counts: a cold start is a slowdown, and a fast window is no sign
  of one.
- *Slow for*: from `at_s` to the end of the leading run of intervals whose max is more than 1.5 ×
  the steady max (0 when the first interval's is not): the few requests that waited for a model
  load, which a window's p50 hides. *Suffered* runs from `at_s` to the later of the end of "slow
  for" and the start of the first window whose p50 is back under the steady ceiling (None when
  none is; 0 for a start that is not cold): how long users met a cold target. Unlike time to
  steady, a later bump (the load rising on a ramp, a noisy neighbour) does not stretch it; *affected requests* are those
  in the intervals that start within it.
- *Cold*: the first N's p50 more than 1.5 × the steady p50 (a slow first stretch), or the max of the
  start's own interval (its first with a value) more than 1.5 × the steady max (a few requests
  that waited for a model load, slower than anything the steady state came near: often only the
  first one or two requests pay a load, and the p50 of the first N then hides it). The start's own
  interval, because a load delays the first requests, while a busy box stalls one request now and
  then at any time: with a heavy tail the largest of the first N exceeds the largest of the M steady
  ones by half again far more often than if they were alike (a pre-warmed replica was once called
  cold for one 194 ms request 1.3 s after its first, against a steady max of 112 ms, while its peer
  had 136 ms ones). `cold_by` says which rule fired.
- *Peers*: a replica is judged against its peers. Starting a replica costs the machine CPU
  (imports, model load, warm-up) and slows every replica for a while; when the other replicas' p50
  over the new one's first window was s times their own p50 over its steady span
  (`peers_slowdown_p50`, s > 1), both rules above take 1.5 × s instead of 1.5: a slowdown its peers
  shared is the machine's, not the replica's cold start (a model load, many times the steady
  latency, still shows).

Warm-up phases are analysed too, and their starts (and replicas first seen during one) are
flagged "warmup": True.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from latscope.analysis.percentiles import interval_percentiles
from latscope.analysis.run_data import ClassIntervals, RunData, metric_intervals
from latscope.results.schema import OTHER_REPLICAS, REPLICA_METRIC, replica_class
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
     "slow_for_s", "suffered_s", "affected_requests" (see the module docstring),
     "cold": bool (first p50 > 1.5 × steady p50, or the start's own interval's max > 1.5 × steady max),
     "cold_by": "p50" | "max" | None}
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
    replicas = {r: iv for r, iv in metric_intervals(run, REPLICA_METRIC).items() if r != OTHER_REPLICAS and len(iv)}
    for replica, intervals in replicas.items():
        at_s, sent_as = first_seen.get(replica, (float(intervals.start_s[0]), replica))
        entry = _analyse(intervals, at_s, math.inf, first_n)
        if entry is not None:
            peers = [iv for r, iv in replicas.items() if r != replica]
            shared = _peers_slowdown(peers, at_s, entry["first_until_s"], entry["steady_from_s"], first_n)
            if entry["cold"] and shared is not None and shared > 1:
                entry = _analyse(intervals, at_s, math.inf, first_n, shared)
            entry["peers_slowdown_p50"] = None if shared is None else round(shared, 3)
            phase = run.phase_at(at_s)
            starts.append({"kind": "replica", "label": replica, "metric": REPLICA_METRIC, "class": replica,
                           "warmup": bool(phase and phase.get("warmup")), "replica": sent_as, **entry})
    starts.sort(key=lambda s: (s["at_s"], s["kind"] != "run_start"))
    return starts


def _analyse(intervals: ClassIntervals, at_s: float, end_s: float, first_n: int, shared: float = 1.0) -> dict | None:
    """The cold-start numbers of the segment [at_s, end_s) of `intervals` (None when it holds no value);
    `shared`: a slowdown the peers saw too, which the p50 rule allows for (see the module docstring)."""
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
        "steady_ceiling_ms": None,
        "slow_for_s": None,
        "suffered_s": None,
        "affected_requests": None,
        "cold": False,
        "cold_by": None,
    }
    if steady["count"] and steady["p50_ms"] > 0:
        steady_p50 = steady["p50_ms"]
        entry["slowdown_p50"] = round(first["p50_ms"] / steady_p50, 3)
        ratio = COLD_RATIO * max(1.0, shared)
        if first["p50_ms"] > ratio * steady_p50:
            entry["cold_by"] = "p50"
        elif intervals.span_percentile(100.0, positions[0], positions[0]) > ratio * steady["max_ms"] * 1000:
            entry["cold_by"] = "max"
        entry["cold"] = entry["cold_by"] is not None
        windows = _windows(totals, first_n)
        p50_ms = np.array([intervals.span_percentile(50.0, positions[a], positions[b - 1]) for a, b in windows]) / 1000
        # A window is steady when its p50 is within STEADY_BAND of the steady p50, or no higher than
        # the highest of the steady state's own windows (on a noisy target the steady windows spread
        # wider than the band; one no worse than all of them is as steady as they are).
        steady_windows = np.array([intervals.start_s[positions[a]] >= middle for a, _ in windows])
        ceiling = max((1 + STEADY_BAND) * steady_p50, float(np.nanmax(p50_ms[steady_windows], initial=0.0)))
        entry["steady_ceiling_ms"] = round(ceiling, 3)
        above = np.flatnonzero(p50_ms > ceiling)
        if not len(above):
            entry["time_to_steady_s"] = 0.0
        elif above[-1] + 1 < len(windows):
            settled = float(intervals.start_s[positions[windows[above[-1] + 1][0]]])
            entry["time_to_steady_s"] = round(max(0.0, settled - at_s), 6)
        # The p50 of a window hides a handful of requests that waited for a model load; the max of
        # each interval does not: the leading intervals whose max is over COLD_RATIO x the steady max.
        limit_us = COLD_RATIO * steady["max_ms"] * 1000
        slow = 0
        while slow < len(positions) and intervals.span_percentile(100.0, positions[slow], positions[slow]) > limit_us:
            slow += 1
        entry["slow_for_s"] = round(max(0.0, float(ends[positions[slow - 1]]) - at_s), 6) if slow else 0.0
        # Suffering ends when latency first comes back: the first window whose p50 is within the band
        # (unlike time to steady, a later bump under changing load does not stretch it).
        back = np.flatnonzero(p50_ms <= ceiling)
        back_s = None if not len(back) else max(0.0, float(intervals.start_s[positions[windows[back[0]][0]]]) - at_s)
        if not entry["cold"]:  # a warm start's later ups and downs are the load's, not a cold start's
            entry["suffered_s"], entry["affected_requests"] = 0.0, 0
        elif back_s is not None:
            suffered = round(max(back_s, entry["slow_for_s"]), 6)
            entry["suffered_s"] = suffered
            entry["affected_requests"] = int(totals[intervals.start_s[positions] < at_s + suffered].sum()) if suffered else 0
    return entry


def _peers_slowdown(peers: list[ClassIntervals], at_s: float, first_until_s: float, steady_from_s: float | None,
                    first_n: int) -> float | None:
    """The other replicas' p50 over a replica's first window [at_s, first_until_s) over their p50 from
    its steady_from_s on (None without peers, a steady span, or half of first_n values in either)."""
    if steady_from_s is None:
        return None

    def p50(span: Callable[[ClassIntervals], np.ndarray]) -> float | None:
        merged = None
        for peer in peers:
            chosen = np.flatnonzero(span(peer))
            if not len(chosen):
                continue
            if merged is None:
                merged = peer.merged(chosen)
            else:
                merged.add(peer.merged(chosen))
        summary = summarize(merged) if merged is not None else {"count": 0}
        return summary["p50_ms"] if summary["count"] >= first_n / 2 and summary["p50_ms"] > 0 else None

    first = p50(lambda iv: (iv.start_s + iv.length_s > at_s) & (iv.start_s < first_until_s))
    steady = p50(lambda iv: iv.start_s >= steady_from_s)
    return None if first is None or steady is None else first / steady


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


# -- summary.json's cold_start ---------------------------------------------------------------------

def cold_start_summary(run: RunData, first_n: int = FIRST_N) -> dict:
    """summary.json's `cold_start`: the capacity changes of the run, each measured against the
    steady state that followed it (see cold_starts for the rules).

    - "target_launch": the target latscope launched: process start -> ready (its readiness URL
      answered) -> first successful response -> latency back within STEADY_BAND of steady state,
      all in seconds since the process started; None when the scenario launched nothing.
    - "restarts": each restart of the launched target by an action: action issued -> ready again ->
      the first requests after it vs the steady state (ready_at_s None: the target did not come back).
    - "scale_up": each replica first seen (X-Replica-Id) after an action: action issued -> replica
      first seen (its first response ended; first_sent_s: that request's intended send) -> its very
      first response and its first N requests vs its own steady state -> time until its latency is
      steady. Its suffered_s counts from first_sent_s. A replica first seen after a restart belongs to the restart.
    - "scale_from_zero": each request that came after an idle stretch (an idle phase, or a gap of
      plan.IDLE_GAP_S in the schedule): its idle gap and latency against the steady state of the
      traffic after it; cold when it took more than COLD_RATIO x that steady state's max (a request
      slower than every steady request by half again: see the module docstring).
    - "starts": every start cold_starts() found (run, phases, replicas).
    Times are on the run's clock (seconds from its first intended send) unless a key says otherwise."""
    starts = cold_starts(run, first_n)
    actions = [e for e in run.events if e.get("event") == "action_start" and e.get("t_s") is not None]
    return {
        "first_n": first_n,
        "cold_ratio": COLD_RATIO,
        "steady_band": STEADY_BAND,
        "target_launch": _target_launch(run, starts),
        "restarts": _restarts(run, actions, first_n),
        "scale_up": _scale_ups(run, starts, actions),
        "scale_from_zero": _wakes(run, first_n),
        "starts": starts,
    }


_VERDICT_KEYS = ("first_count", "first_p50_ms", "first_max_ms", "steady_count", "steady_p50_ms", "steady_max_ms",
                 "slowdown_p50", "peers_slowdown_p50", "time_to_steady_s", "slow_for_s", "suffered_s", "affected_requests",
                 "cold", "cold_by")


def _verdict(entry: dict | None) -> dict:
    return {key: (entry or {}).get(key) for key in _VERDICT_KEYS}


def _event_before(events: list[dict], t_s: float) -> dict | None:
    before = [e for e in events if e["t_s"] <= t_s]
    return before[-1] if before else None


def _target_launch(run: RunData, starts: list[dict]) -> dict | None:
    generator = run.summary.get("generator", {})
    launched = generator.get("target_launched_at_s")
    if launched is None:
        return None
    first = next((e for e in run.events if e.get("event") == "first_response" and e.get("t_s") is not None), None)
    run_start = next((s for s in starts if s["kind"] == "run_start"), None)
    to_steady = (run_start or {}).get("suffered_s")
    ready = generator.get("target_ready_at_s")
    return {
        "launched_at_s": launched,
        "ready_s": None if ready is None else round(ready - launched, 6),
        "first_response_s": None if first is None else round(first["t_s"] - launched, 6),
        "first_response_latency_ms": None if first is None else first.get("latency_ms"),
        # run_start's settling (suffered_s) is measured from t=0, the first intended send
        "steady_s": None if to_steady is None else round(to_steady - launched, 6),
        **_verdict(run_start),
    }


def _restarts(run: RunData, actions: list[dict], first_n: int) -> list[dict]:
    """Each restart action with the target_ready that followed it (None: the target did not come back)."""
    restarts = [a for a in actions if a.get("kind") == "restart"]
    if not restarts:
        return []
    readies = [e for e in run.events if e.get("event") == "target_ready" and e.get("t_s") is not None]
    latency = metric_intervals(run, "latency").get("all")
    out = []
    for i, action in enumerate(restarts):
        issued = action["t_s"]
        until = restarts[i + 1]["t_s"] if i + 1 < len(restarts) else math.inf
        ready = next((e for e in readies if issued <= e["t_s"] < until), None)
        entry = None
        if ready is not None and latency is not None and len(latency):
            entry = _analyse(latency, ready["t_s"], until, first_n)
        out.append({
            "action": action.get("name"),
            "issued_at_s": issued,
            "ready_at_s": None if ready is None else ready["t_s"],
            "down_s": None if ready is None else round(ready["t_s"] - issued, 6),
            "errors_while_down": _errors_between(run, issued, until if ready is None else ready["t_s"]),
            **_verdict(entry),
        })
    return out


def _errors_between(run: RunData, start_s: float, end_s: float) -> int:
    """Errors (all classes) in the intervals that overlap [start_s, end_s]."""
    rows = interval_percentiles(run, "latency", "all")
    overlap = (rows["t_s"] + run.interval_s > start_s) & (rows["t_s"] <= end_s)
    return int(rows.loc[overlap, "errors"].fillna(0).sum())


def _scale_ups(run: RunData, starts: list[dict], actions: list[dict]) -> list[dict]:
    first_latency = {str(e["replica"]): e.get("latency_ms") for e in run.events
                     if e.get("event") == "replica_first_seen" and e.get("replica") is not None}
    out = []
    for start in starts:
        if start["kind"] != "replica":
            continue
        action = _event_before(actions, start["at_s"])
        if action is None or action.get("kind") == "restart":
            continue  # there from the start, or brought up by a restart
        first_ms = first_latency.get(start["replica"])
        steady_p50 = start.get("steady_p50_ms")
        settled = start.get("time_to_steady_s")
        # The replica is first seen when its first response ends; users met it when that request was sent.
        lead_s = (first_ms or 0.0) / 1000
        verdict = _verdict(start)
        if verdict["cold"] and verdict["suffered_s"] is not None:
            verdict["suffered_s"] = round(verdict["suffered_s"] + lead_s, 6)
        out.append({
            "action": action.get("name"),
            "issued_at_s": action["t_s"],
            "replica": start["replica"],
            "class": start["class"],
            "first_seen_s": start["at_s"],
            "first_sent_s": round(start["at_s"] - lead_s, 6),
            "seen_after_s": round(start["at_s"] - action["t_s"], 6),
            "first_latency_ms": first_ms,
            "slowdown_first": round(first_ms / steady_p50, 3) if first_ms is not None and steady_p50 else None,
            "steady_after_action_s": None if settled is None else round(start["at_s"] + settled - action["t_s"], 6),
            **verdict,
        })
    return out


def _wakes(run: RunData, first_n: int) -> list[dict]:
    probes = [e for e in run.events if e.get("event") == "first_after_idle"]
    if not probes:
        return []
    latency = metric_intervals(run, "latency").get("all")
    out = []
    for probe in probes:
        at = float(probe.get("intended_s", probe.get("t_s") or 0.0))
        phase = run.phase_at(at)
        phases = run.summary.get("phases", [])
        last = phase is None or phase is phases[-1]
        end = math.inf if last else phase["start_s"] + phase["duration_s"]
        entry = _analyse(latency, at, end, first_n) if latency is not None and len(latency) else None
        first_ms = probe.get("latency_ms")
        steady = _verdict(entry)
        cold = None
        if probe.get("error"):
            cold = True  # the target did not come back in time to answer it
        elif first_ms is not None and steady["steady_max_ms"]:
            cold = first_ms > COLD_RATIO * steady["steady_max_ms"]
        out.append({
            "phase": probe.get("phase"),
            "at_s": round(at, 6),
            "idle_gap_s": probe.get("idle_gap_s"),
            "first_latency_ms": first_ms,
            "error": probe.get("error"),
            "replica": probe.get("replica"),
            "slowdown_first": (round(first_ms / steady["steady_p50_ms"], 3)
                               if first_ms is not None and steady["steady_p50_ms"] else None),
            **{k: v for k, v in steady.items() if k not in ("cold", "cold_by")},
            "cold": cold,
        })
    return out


def capacity_events(cold: dict | None) -> list[dict]:
    """summary.json's cold_start as one flat list, in time order, for a report: each capacity
    change with what caused it and when, the series its latency is on, and how bad and how long.
    {"kind": "launch" | "restart" | "scale_up" | "scale_from_zero", "name": the action, replica or
     phase (text from the scenario or the target), "cause_at_s": when it was caused (process
     launched, action issued, idle stretch began), "at_s": when its measured segment starts,
     "metric", "class": its latency series, "first_latency_ms" (None where no single request was
     measured), "first_max_ms", "steady_p50_ms", "steady_max_ms", "suffered_s", "affected_requests", "cold"};
    a launch also has "ready_s", "first_response_s" and "steady_s" (seconds since the process started)."""
    if not cold:
        return []
    out = []

    def add(kind: str, name: object, cause: float | None, at: float, entry: dict, first_ms: float | None,
            metric: str = "latency", cls: str = "all") -> None:
        out.append({"kind": kind, "name": "" if name is None else str(name), "cause_at_s": at if cause is None else cause,
                    "at_s": at, "metric": metric, "class": cls, "first_latency_ms": first_ms,
                    **{k: entry.get(k) for k in ("first_max_ms", "steady_p50_ms", "steady_max_ms", "suffered_s",
                                                 "affected_requests", "cold")}})

    if (launch := cold.get("target_launch")) and launch.get("first_count"):
        add("launch", "target", launch.get("launched_at_s"), 0.0, launch, launch.get("first_response_latency_ms"))
        out[-1].update({k: launch.get(k) for k in ("ready_s", "first_response_s", "steady_s")})
    for r in cold.get("restarts", []):
        if r.get("ready_at_s") is not None:  # a target that never came back has no latency to show
            add("restart", r.get("action"), r.get("issued_at_s"), r["ready_at_s"], r, None)
    for u in cold.get("scale_up", []):
        add("scale_up", u.get("replica"), u.get("issued_at_s"), u.get("first_sent_s", u["first_seen_s"]), u, u.get("first_latency_ms"),
            "replica_latency", u.get("class") or u.get("replica"))
    scales = can_scale(cold)
    for w in cold.get("scale_from_zero", []):
        if scales or w.get("cold"):  # else "not cold after idle" says nothing of a target that has nothing to scale
            add("scale_from_zero", w.get("phase"), w["at_s"] - (w.get("idle_gap_s") or 0.0), w["at_s"], w, w.get("first_latency_ms"))
    return sorted(out, key=lambda e: e["at_s"])


def can_scale(cold: dict) -> bool:
    """Whether the run showed a target that can change its capacity: it named replicas (X-Replica-Id:
    a replica's start, one added by an action, the replica that answered after an idle stretch). Only
    then does a first request after idle that was not cold say something (the target kept its
    capacity); a cold one says it by itself, replicas or not."""
    return (any(s.get("kind") == "replica" for s in cold.get("starts") or [])
            or bool(cold.get("scale_up")) or any(w.get("replica") for w in cold.get("scale_from_zero") or []))


KIND_LABEL = {"launch": "target launch", "restart": "restart", "scale_up": "scale-up", "scale_from_zero": "scale from zero"}


def title(e: dict) -> str:
    """A capacity event (capacity_events) in a few words: what, and when on the run's clock."""
    name = {"launch": "", "restart": f" ({e['name']})", "scale_up": f" {e['name']}",
            "scale_from_zero": f" after idle, phase {e['name']}"}[e["kind"]]
    return f"{KIND_LABEL[e['kind']]}{name} @ {e['at_s']:.1f} s"


def describe(e: dict) -> str:
    """How long users suffered at a capacity event, and how badly, in one phrase (numbers only)."""
    worst = e.get("first_latency_ms") if e.get("first_latency_ms") is not None else e.get("first_max_ms")
    steady = e.get("steady_p50_ms")
    if worst is None or not steady:
        return "no steady state to compare with"
    timeline = ""
    if e["kind"] == "launch" and None not in (e.get("ready_s"), e.get("first_response_s")):
        steady_at = "" if e.get("steady_s") is None else f", steady {e['steady_s']:.1f} s"
        timeline = f" (after the process started: ready {e['ready_s']:.1f} s, first response {e['first_response_s']:.1f} s{steady_at})"
    if not e.get("cold"):
        return f"not cold: first requests up to {worst:,.0f} ms, steady p50 {steady:,.1f} ms{timeline}"
    suffered = e.get("suffered_s")
    how_long = ("latency never settled within the run" if suffered is None
                else f"for {suffered:.1f} s ({e.get('affected_requests') or 0:,} requests)")
    return f"users waited up to {worst:,.0f} ms, {worst / steady:,.0f}× the steady p50 of {steady:,.1f} ms, {how_long}{timeline}"

