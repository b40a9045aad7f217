"""Merges the workers' interval reports into the run's histograms, counters and time series.

Workers send one report per interval (even an empty one), so interval k is complete once every
worker has reported it. A complete interval is merged losslessly across workers, written to the
interval log, turned into time-series rows, and — for requests outside warm-up phases — added to
the run's totals. Memory stays flat: only incomplete intervals are held.

The collector knows reports, not workers: whatever sends `IntervalReport`s for `workers` senders
(local worker processes today, remote engines in a distributed run) can feed it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from latscope.plan import Plan
from latscope.records import IntervalReport, Probe
from latscope.recorder import from_sparse, new_histogram, summarize
from latscope.results.hlog import HlogWriter
from latscope.results.schema import ALL, COUNTERS, ERROR_INDEX, ROW_STATS, TURN_COUNTERS, add_counters, of_workload_classes


@dataclass(frozen=True)
class Pace:
    """Where the run is, as of the latest complete interval (the live display and live metrics)."""

    phase: str
    offered_rps: float  # scheduled requests per second over that interval, all classes
    achieved_rps: float  # completed requests per second over it
    in_flight: int  # at its end


def with_all(by_class: dict[str, HdrHistogram]) -> dict[str, HdrHistogram]:
    """Per-class histograms plus their lossless merge under "all" (a metric recorded only under
    "all", like loop_lag, is kept as is)."""
    if set(by_class) == {ALL}:
        return dict(by_class)
    merged = new_histogram()
    for h in by_class.values():
        merged.add(h)
    return {**by_class, ALL: merged}


class Collector:
    def __init__(self, workers: int, plan: Plan, interval_s: float, hlog: HlogWriter | None):
        self.live = set(range(workers))  # the senders whose reports complete an interval (drop() removes one)
        self.plan = plan
        self.interval_s = interval_s
        self.hlog = hlog
        self.totals: dict[str, dict[str, HdrHistogram]] = defaultdict(dict)  # metric -> class -> histogram
        self.counters: dict[tuple[str, bool], np.ndarray] = defaultdict(lambda: np.zeros(len(COUNTERS), np.int64))
        # (class, turn) -> TURN_COUNTERS of a session turn's requests, outside warm-up
        self.turn_counters: dict[tuple[str, int], np.ndarray] = defaultdict(lambda: np.zeros(len(TURN_COUNTERS), np.int64))
        self.clamped: dict[str, int] = defaultdict(int)
        self.rows: list[dict] = []
        self.completed_intervals = 0
        self.last_in_flight = 0
        self.last_interval: dict[str, int] = {}  # counters of the latest complete interval, all classes
        # merged histograms of the latest complete interval, metric -> class -> histogram, warm-up
        # included, with "all" as written to the interval log (none for replica_latency)
        self.last_histograms: dict[str, dict[str, HdrHistogram]] = {}
        # replica id -> (perf_counter_ns, latency µs; None for an error) of its first response
        self.replicas: dict[str, tuple[int, int | None]] = {}
        self.new_replicas: list[tuple[str, int, int | None]] = []  # first seen since the run last took them
        self.first_ok: tuple[int, int] | None = None  # (end ns, latency µs) of the run's first successful response
        self.new_first_ok = False  # first_ok was set since the run last looked
        self.new_probes: list[Probe] = []  # probe outcomes (intervals.py) since the run last took them
        self._pending: dict[int, list[IntervalReport]] = defaultdict(list)
        # Scheduled requests per (interval, class, warmup), for the offered rate over time.
        self._scheduled: dict[tuple[int, str, bool], int] = {}
        if len(plan):
            width = 2 * len(plan.class_names)
            key = (plan.offsets_s // interval_s).astype(np.int64) * width + plan.cls * 2 + plan.warmup
            for code in np.flatnonzero(counts := np.bincount(key)):
                k, rest = divmod(int(code), width)
                self._scheduled[(k, plan.class_names[rest // 2], bool(rest % 2))] = int(counts[code])

    def add(self, report: IntervalReport) -> None:
        """One worker's report for one interval."""
        self._pending[report.interval].append(report)
        self._complete_ready()

    def drop(self, sender: int) -> None:
        """Stop waiting for `sender` (a distributed run's lost machine, with on_node_loss continue):
        the intervals it has reported keep its reports, later ones complete without it."""
        self.live.discard(sender)
        self._complete_ready()

    def _complete_ready(self) -> None:
        while self.live <= {r.worker for r in self._pending.get(self.completed_intervals, ())}:
            if self.completed_intervals not in self._pending and not self.live:
                return
            self._complete(self.completed_intervals)

    def finish(self) -> None:
        """Complete every interval still pending (a worker that died never reports its last ones)."""
        for k in sorted(self._pending):
            if k >= self.completed_intervals:
                self._complete(k)

    def _complete(self, k: int) -> None:
        reports = self._pending.pop(k, [])
        self.completed_intervals = k + 1
        interval: dict[str, dict[str, HdrHistogram]] = defaultdict(dict)  # warm-up included
        counts: dict[tuple[str, bool], np.ndarray] = defaultdict(lambda: np.zeros(len(COUNTERS), np.int64))
        for report in reports:
            for (metric, cls, warmup), sparse in report.histograms.items():
                h = from_sparse(*sparse)
                _add(interval[metric], cls, h)
                if not warmup:
                    _add(self.totals[metric], cls, h)
            for metric, n in report.clamped.items():
                self.clamped[metric] += n
            for (ci, warmup), row in report.counters.items():
                key = (self.plan.class_names[ci], warmup)
                row = np.asarray(row, np.int64)
                counts[key] = add_counters(counts[key], row)  # summed, a few taken as the larger (schema)
                self.counters[key] = add_counters(self.counters[key], row)
            for (ci, turn, warmup), row in report.turns.items():
                if not warmup:
                    self.turn_counters[(self.plan.class_names[ci], turn)] += row
            self.new_probes.extend(report.probes)
        # Workers report in no particular order: the earliest response wins, whichever worker saw it.
        firsts = [r.first_ok for r in reports if r.first_ok]
        if firsts and self.first_ok is None:
            self.first_ok = min(map(tuple, firsts))
            self.new_first_ok = True
        seen: dict[str, tuple[int, int | None]] = {}
        for report in reports:
            for replica, first in report.replicas.items():
                if replica not in self.replicas and (replica not in seen or first[0] < seen[replica][0]):
                    seen[replica] = tuple(first)
        for replica, first in sorted(seen.items(), key=lambda item: item[1][0]):
            self.replicas[replica] = first
            self.new_replicas.append((replica, *first))
        self.last_in_flight = sum(r.in_flight for r in reports)
        self._write(k, interval, counts)

    def _write(self, k: int, interval: dict, counts: dict) -> None:
        start = k * self.interval_s
        phase = self.phase_at(start)
        per_class: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(len(COUNTERS), np.int64))
        scheduled: dict[str, int] = defaultdict(int)
        for name in self.plan.class_names:
            for warmup in (False, True):
                if (name, warmup) in counts:
                    per_class[name] = add_counters(per_class[name], counts[(name, warmup)])
                scheduled[name] += self._scheduled.get((k, name, warmup), 0)
        every = np.zeros(len(COUNTERS), np.int64)
        for row in list(per_class.values()):
            every = add_counters(every, row)
        per_class[ALL] = every
        scheduled[ALL] = sum(scheduled.values())
        self.last_interval = {"scheduled": scheduled[ALL], **{n: int(per_class[ALL][i]) for i, n in enumerate(COUNTERS)}}
        interval.setdefault("latency", {})  # one latency row per class even when nothing completed
        self.last_histograms = {}
        for metric, by_class in interval.items():
            if not of_workload_classes(metric):  # classes are replica ids or class#turn: no "all"
                classes, names = by_class, sorted(by_class)
            else:
                classes, names = (with_all(by_class) if by_class else {}), (*self.plan.class_names, ALL)
            self.last_histograms[metric] = classes
            for name in names:
                if metric != "latency" and name not in classes:
                    continue
                h = classes.get(name)
                if h is not None and self.hlog is not None:
                    self.hlog.write(f"{metric}/{name}", start, self.interval_s, h)
                # a replica's or a turn's row has no counters of its own (they are per workload class): zeros
                own = name in per_class and of_workload_classes(metric)
                c = per_class[name] if own else np.zeros(len(COUNTERS), np.int64)
                stats = summarize(h) if h is not None else {"count": 0}
                self.rows.append(
                    {
                        "interval_start_s": start,
                        "interval_s": self.interval_s,
                        "phase": phase,
                        "metric": metric,
                        "class": name,
                        **{key: stats.get(key) for key in ROW_STATS},
                        "scheduled": scheduled.get(name, 0),
                        **{counter: int(c[i]) for i, counter in enumerate(COUNTERS)},
                        "errors": int(sum(c[i] for i in ERROR_INDEX.values())),
                        "in_flight": self.last_in_flight if name == ALL else None,
                    }
                )

    def pace(self, elapsed_s: float) -> Pace:
        """The run's pace as of the latest complete interval, in the phase of `elapsed_s`."""
        last = self.last_interval
        return Pace(self.phase_at(max(0.0, elapsed_s - 1e-9)), last.get("scheduled", 0) / self.interval_s,
                    last.get("completed", 0) / self.interval_s, self.last_in_flight)

    def phase_at(self, t: float) -> str:
        for p in self.plan.phases:
            if p.start_s <= t < p.start_s + p.duration_s:
                return p.name
        return ""

    def totals_with_all(self) -> dict[str, dict[str, HdrHistogram]]:
        return {
            metric: with_all(by_class) if of_workload_classes(metric) else dict(by_class)
            for metric, by_class in self.totals.items()
        }

    def latency_so_far(self) -> dict:
        """Latency over all classes so far (for live progress)."""
        return summarize(with_all(self.totals["latency"])[ALL]) if self.totals.get("latency") else {"count": 0}



def _add(by_class: dict[str, HdrHistogram], cls: str, h: HdrHistogram) -> None:
    if cls not in by_class:
        by_class[cls] = new_histogram()
    by_class[cls].add(h)
