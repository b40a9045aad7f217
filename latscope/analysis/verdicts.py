"""Verdicts over a run's summary: is the measurement valid, and were the SLOs met?

Validity is about the generator, not the target: latency always runs from the intended send time,
so a client that falls behind cannot flatter the server, but it does change the load that was
actually offered. A run is
- `valid`    when requests went out on time (send-lag p99 and event-loop-lag p99 under the
             "degraded" thresholds) and none waited for, or was dropped at, the in-flight cap;
- `degraded` when one of those is exceeded (the numbers are still honest, the offered load was
             not quite the planned one);
- `invalid`  when send lag or loop lag passes the "invalid" thresholds: the generator, not the
             target, shaped the traffic.

The thresholds are judged against what the lateness can change (`validity: {relative: true}`, the
default). A request sent L late has its latency counted from its intended time, so L can only make
the target look worse, and by at most L; a late event loop also delays reading the answer, which
again only adds to the time measured (and delays sends, which send lag shows). Lateness matters
when it is a share of one of two things:
- R, the tightest time limit the run is judged by: the smallest `limit_ms` of its SLOs (any metric,
  any class; a lateness of a share of it can flip that verdict) and of its goodput objectives (a
  request within L of its objective can be pushed over it). Without one, the run's measured p99 of
  `ttft` (or `latency` when there is no ttft): the headline number lateness would blur. That p99
  holds the lateness itself, but cannot hide it: a lag that made up most of it is over 25 % of it.
- S, the mean spacing of the planned arrivals, 1 / the planned rate of the busiest measured phase
  (at least the run's offered rate, so a burst phase is not averaged away): lateness comparable to
  the spacing turns the planned arrivals into clumps, and the target then queues differently.
Each threshold is then

    degraded = max(fixed degraded, min(5 % of R, 0.5 × S))
    invalid  = max(fixed invalid,  min(25 % of R, 2 × S))

for send lag and loop lag alike (LIMIT_SHARE, SPACING_SHARE). The fixed thresholds of `validity:`
(send lag 1 / 10 ms, loop lag 5 / 50 ms) are the floor: lateness under them never stamps a run, so
no run the fixed rule calls valid is called anything else. Why these shares:
- 5 % of R: the most the lateness can add to the limited statistic is then within the capacity
  search's default precision (5 %) and well inside a tail percentile's own confidence interval on
  a short run (±10–30 %): what it can do is below what the measurement resolves. 25 % of R: a
  quarter of the limit can turn a clear pass into a fail; the generator, not the target, would be
  deciding the verdict.
- 0.5 × S: each request moves by less than half the mean gap to its neighbours, so the target sees
  the planned sequence with its gaps changed by less than their own spread (a Poisson gap's spread
  equals its mean). 2 × S: a stall that long releases about two planned requests at once, at the
  p99: clumps the plan does not have, and the queueing the target sees is the generator's.
With `relative: false` the fixed thresholds alone apply, exactly as before they were relative.
`lag_thresholds` works out the thresholds and why (summary.json `validity_thresholds`); the reasons
of a stamp name the threshold and its basis. A distributed run's node clock errors (an unmeasured
send lag of the node's whole share) are judged against the same send-lag thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latscope.scenario.settings import SLO_TIME_STATS

RANK = {"valid": 0, "degraded": 1, "invalid": 2}
LAGS = (("send_lag", "send lag"), ("loop_lag", "event-loop lag"))  # (metric, in words)
LEVELS = ("degraded", "invalid")
LIMIT_SHARE = {"degraded": 0.05, "invalid": 0.25}  # of R, the tightest time limit (module docstring: why)
SPACING_SHARE = {"degraded": 0.5, "invalid": 2.0}  # of S, the planned arrivals' mean spacing


def _p99(metrics: dict, metric: str) -> float | None:
    return metrics.get(metric, {}).get("all", {}).get("p99_ms")


@dataclass(frozen=True)
class LagThresholds:
    """The lateness thresholds (ms, at the p99) a run is judged by, named as in `validity:`, and
    each one's basis in words (empty for the fixed rule, whose reasons read as they always did)."""

    degraded_send_lag_p99_ms: float
    invalid_send_lag_p99_ms: float
    degraded_loop_lag_p99_ms: float
    invalid_loop_lag_p99_ms: float
    basis: dict[str, str] = field(default_factory=dict)  # field name -> why it is that number
    relative: bool = False

    @classmethod
    def fixed(cls, settings: Any) -> LagThresholds:
        """The `validity:` thresholds as written, alone (`relative: false`, or a caller without the run's facts)."""
        return cls(*(float(getattr(settings, _name(m, level))) for m, _ in LAGS for level in LEVELS))

    def get(self, metric: str, level: str) -> float:
        return getattr(self, _name(metric, level))

    def why(self, metric: str, level: str) -> str:
        """" (basis)" to put after the threshold in a reason; "" for the fixed rule."""
        basis = self.basis.get(_name(metric, level))
        return f" ({basis})" if basis else ""

    def record(self) -> dict:
        """summary.json's `validity_thresholds`: per lag, the thresholds applied and why."""
        out: dict[str, Any] = {"relative": self.relative}
        for metric, _ in LAGS:
            names = {level: _name(metric, level) for level in LEVELS}
            out[f"{metric}_p99_ms"] = {**{level: getattr(self, name) for level, name in names.items()},
                                       "basis": {level: self.basis.get(name, f"validity.{name}") for level, name in names.items()}}
        return out


def _name(metric: str, level: str) -> str:
    return f"{level}_{metric}_p99_ms"


def tightest_limit(slos: list[Any], goodput_objectives: list[dict[str, float] | None] = ()) -> tuple[float, str] | None:
    """(R in ms, what it is) from the scenario: the smallest time limit of its SLOs and goodput
    objectives, None when it has neither."""
    limits = [(slo.limit_ms, f"the SLO {slo.metric}/{slo.class_} {slo.stat} {'≤' if slo.bound == 'max' else '≥'} "
                             f"{slo.limit_ms:g} ms") for slo in slos if slo.stat in SLO_TIME_STATS and slo.limit_ms]
    limits += [(ms, f"the goodput objective {name} {ms:g} ms") for objectives in goodput_objectives if objectives
               for name, ms in objectives.items()]
    return min(limits, key=lambda x: x[0]) if limits else None


def lag_thresholds(settings: Any, metrics: dict, limit: tuple[float, str] | None,
                   busiest_rps: float | None) -> LagThresholds:
    """The thresholds a run is judged by (module docstring): the scenario's `validity:` settings,
    raised by the relative rule unless `relative: false`. `limit` is tightest_limit's answer (None:
    the measured p99 stands in for it), `busiest_rps` the planned rate of the busiest measured phase."""
    fixed = LagThresholds.fixed(settings)
    if not getattr(settings, "relative", False):
        return fixed
    if limit is None:
        headline = "ttft" if _p99(metrics, "ttft") else "latency"
        p99 = _p99(metrics, headline)
        limit = (p99, f"the measured {headline} p99 ({p99:g} ms; no time SLO)") if p99 else None
    values, basis = {}, {}
    for metric, _ in LAGS:
        for level in LEVELS:
            name, floor = _name(metric, level), fixed.get(metric, level)
            if limit is None or not busiest_rps:
                missing = "latency was measured" if limit is None else "arrivals were planned"
                values[name], basis[name] = floor, f"validity.{name}: no {missing} to judge the lateness against"
                continue
            share, times = LIMIT_SHARE[level], SPACING_SHARE[level]
            spacing_ms = 1000 / busiest_rps
            by_limit = (round(share * limit[0], 3), f"{share * 100:g} % of {limit[1]}")
            by_spacing = (round(times * spacing_ms, 3), f"{times:g} × the mean arrival spacing "
                                                        f"({spacing_ms:.3g} ms at {busiest_rps:,.4g} req/s)")
            raised = min(by_limit, by_spacing, key=lambda x: x[0])
            if raised[0] > floor:
                values[name], basis[name] = raised
            else:
                values[name], basis[name] = floor, f"validity.{name}, the floor: {raised[1]} is {raised[0]:g} ms"
    return LagThresholds(**values, basis=basis, relative=True)


def validity(metrics: dict, requests: dict, thresholds: Any, max_in_flight: int,
             nodes: list[dict] | None = None) -> tuple[str, list[str]]:
    """(stamp, reasons) from the summary's metrics and request counts and the lateness thresholds:
    a LagThresholds (lag_thresholds), or the scenario's `validity` settings taken as fixed
    thresholds. Reasons explain every stamp other than `valid`, naming the threshold and its basis.
    A distributed run's `nodes` (summary.json generator.nodes) add each machine's verdict
    (node_validity)."""
    applied = thresholds if isinstance(thresholds, LagThresholds) else LagThresholds.fixed(thresholds)
    verdict, reasons = "valid", []

    def flag(stamp: str, reason: str) -> None:
        nonlocal verdict
        reasons.append(reason)
        if RANK[stamp] > RANK[verdict]:
            verdict = stamp

    for metric, what in LAGS:
        p99 = _p99(metrics, metric)
        if p99 is None:
            continue
        degraded, invalid = applied.get(metric, "degraded"), applied.get(metric, "invalid")
        if p99 > invalid:
            flag("invalid", f"{what} p99 {p99:.3f} ms > {invalid:g} ms{applied.why(metric, 'invalid')}: "
                            "the generator could not keep to the schedule")
        elif p99 > degraded:
            flag("degraded", f"{what} p99 {p99:.3f} ms > {degraded:g} ms{applied.why(metric, 'degraded')}")
    if requests.get("sent") == 0:
        flag("invalid", "nothing was sent: there is no measurement")
    if requests.get("unaccounted"):
        flag("invalid", f"{requests['unaccounted']} sent requests were counted neither completed nor failed (a latscope bug)")
    if requests.get("late"):
        flag("degraded", f"{requests['late']} requests waited for a free slot (limits.max_in_flight={max_in_flight})")
    if requests.get("dropped"):
        flag("degraded", f"{requests['dropped']} requests dropped at the in-flight cap (limits.max_in_flight={max_in_flight})")
    for node in nodes or ():
        for stamp, why in node_validity(node, applied):
            flag(stamp, why)
    return verdict, reasons


NO_SUCCESS = "no request succeeded"  # how no_success_reason's reason starts (the gate tells it apart by it)


def measured_nothing(requests: dict) -> bool:
    """Whether a run measured no successful request outside warm-up (summary.json `requests`): it
    measured no latency, whatever else it did, so `latscope run` exits 1."""
    return not requests.get("completed")


def no_success_reason(requests: dict, errors: dict[str, int], examples: dict[str, list[str]]) -> str | None:
    """The validity reason (invalid) of a run that sent requests and had none succeed, None otherwise:
    how many were sent, the errors by kind and one example message, so the console and the report
    say what the target answered. A run that sent nothing has its own reason ("nothing was sent")."""
    if not requests.get("sent") or not measured_nothing(requests):
        return None
    kinds = ", ".join(f"{k} {n:,}" for k, n in errors.items() if n)
    parts = [f"{requests['sent']:,} sent", f"{requests.get('errors', 0):,} errors" + (f" ({kinds})" if kinds else "")]
    if requests.get("cancelled"):
        parts.append(f"{requests['cancelled']:,} cancelled (the run ended before their answer)")
    example = next((f'{kind}: "{messages[0][:200]}"' for kind, messages in examples.items() if messages), None)
    return f"{NO_SUCCESS}: " + ", ".join(parts) + ": no latency was measured" + (f"; e.g. {example}" if example else "")


def node_validity(node: dict, thresholds: Any) -> list[tuple[str, str]]:
    """[(stamp, reason)] of one machine of a distributed run (summary.json generator.nodes[i]): a
    node lost or failed mid-run (its share was not sent) is invalid; its clock error (the offset's
    bound plus its drift over the run: an unmeasured send lag of its whole share) is judged against
    the send-lag thresholds (a LagThresholds, or `validity` settings taken as fixed)."""
    applied = thresholds if isinstance(thresholds, LagThresholds) else LagThresholds.fixed(thresholds)
    name = f"node {node['node']} ({node['host']})"
    out = []
    if node["status"] != "ok":
        out.append(("invalid", f"{name} {node['status']}" + (f" at {node['lost_at_s']} s" if node.get("lost_at_s") is not None
                                                             else "") + ": its share of the schedule was not sent"))
    clock = node.get("clock")
    if clock:
        error = clock["max_error_ms"]
        for level in reversed(LEVELS):
            limit = applied.get("send_lag", level)
            if error > limit:
                out.append((level, f"{name}: clock error up to {error:.3f} ms > {limit:g} ms{applied.why('send_lag', level)}"))
                break
    return out


def node_stamp(node: dict, thresholds: Any) -> str:
    """One machine's own stamp (summary.json generator.nodes[i].validity): the worst of node_validity."""
    return max((stamp for stamp, _ in node_validity(node, thresholds)), key=RANK.__getitem__, default="valid")


def error_rate(requests: dict) -> float | None:
    """Errors over answered requests (completed + errors); None when none was answered."""
    answered = requests.get("completed", 0) + requests.get("errors", 0)
    return requests.get("errors", 0) / answered if answered else None


def goodput_view(summary: dict) -> dict:
    """What goodput SLOs read of a summary.json: its `goodput` by class, and its agent classes' job goodput
    (agents[class].goodput) under "job_goodput"."""
    jobs = {cls: entry["goodput"] for cls, entry in (summary.get("agents") or {}).items() if "goodput" in entry}
    return {**(summary.get("goodput") or {}), "job_goodput": jobs}


def slo_value(metrics: dict, slo: Any, requests: dict | None = None, achieved_rps: float | None = None,
              goodput: dict | None = None) -> float | None:
    """The value an SLO is about: a metric statistic in ms, the run's error rate or its achieved
    req/s, or a goodput statistic (summary.json's goodput[class][fraction | rps]; a job goodput one, its
    agents[class].goodput, handed in as goodput["job_goodput"][class])."""
    if slo.stat == "error_rate":
        return error_rate(requests) if requests is not None else None
    if slo.stat == "throughput":
        return achieved_rps
    if slo.metric == "goodput":
        return (goodput or {}).get(slo.class_, {}).get(slo.stat)
    if slo.metric == "job_goodput":  # goodput's `job_goodput` entry: summary.json agents.<class>.goodput
        return (goodput or {}).get("job_goodput", {}).get(slo.class_, {}).get(slo.stat)
    return metrics.get(slo.metric, {}).get(slo.class_, {}).get(f"{slo.stat}_ms")


def slo_verdicts(metrics: dict, slos: list[Any], requests: dict | None = None, achieved_rps: float | None = None,
                 goodput: dict | None = None) -> list[dict]:
    """One verdict per SLO: the statistic's value against its limit (at most the limit, or at least
    it for `direction: min`). No data is a failure. Error-rate and throughput SLOs need the run's
    `requests` counts and `achieved_rps`; goodput SLOs the summary's `goodput`."""
    verdicts = []
    for slo in slos:
        value = slo_value(metrics, slo, requests, achieved_rps, goodput)
        limit = slo.threshold
        within = value is not None and (value <= limit if slo.bound == "max" else value >= limit)
        verdict = {
            "metric": slo.metric if slo.stat not in ("error_rate", "throughput") else "run",
            "class": slo.class_,
            "stat": f"{slo.stat}_ms" if slo.limit_ms is not None else slo.stat,
            "limit": limit,
            "value": value,
            "passed": within,
        }
        if slo.bound == "min":
            verdict["direction"] = "min"
        if value is None:
            verdict["reason"] = ("no goodput for this class (the run's scenario set no goodput objectives for it, "
                                 "or no request was measured)" if slo.metric == "goodput"
                                 else "no job goodput for this class (it is no agent, or no job ended)"
                                 if slo.metric == "job_goodput" else "no data for this metric and class")
        verdicts.append(verdict)
    return verdicts
