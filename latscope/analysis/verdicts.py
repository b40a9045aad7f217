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
"""

from __future__ import annotations

from typing import Any

RANK = {"valid": 0, "degraded": 1, "invalid": 2}


def _p99(metrics: dict, metric: str) -> float | None:
    return metrics.get(metric, {}).get("all", {}).get("p99_ms")


def validity(metrics: dict, requests: dict, thresholds: Any, max_in_flight: int,
             nodes: list[dict] | None = None) -> tuple[str, list[str]]:
    """(stamp, reasons) from the summary's metrics and request counts and the scenario's
    `validity` thresholds. Reasons explain every stamp other than `valid`. A distributed run's
    `nodes` (summary.json generator.nodes) add each machine's verdict: its clock error (the offset's
    bound plus its drift over the run: an unmeasured send lag of its whole share) against the send-lag
    thresholds, and a node lost or failed mid-run (its share was not sent) as invalid."""
    verdict, reasons = "valid", []

    def flag(stamp: str, reason: str) -> None:
        nonlocal verdict
        reasons.append(reason)
        if RANK[stamp] > RANK[verdict]:
            verdict = stamp

    for metric, what, degraded, invalid in (
        ("send_lag", "send lag", thresholds.degraded_send_lag_p99_ms, thresholds.invalid_send_lag_p99_ms),
        ("loop_lag", "event-loop lag", thresholds.degraded_loop_lag_p99_ms, thresholds.invalid_loop_lag_p99_ms),
    ):
        p99 = _p99(metrics, metric)
        if p99 is None:
            continue
        if p99 > invalid:
            flag("invalid", f"{what} p99 {p99:.3f} ms > {invalid:g} ms: the generator could not keep to the schedule")
        elif p99 > degraded:
            flag("degraded", f"{what} p99 {p99:.3f} ms > {degraded:g} ms")
    if requests.get("sent") == 0:
        flag("invalid", "nothing was sent: there is no measurement")
    if requests.get("unaccounted"):
        flag("invalid", f"{requests['unaccounted']} sent requests were counted neither completed nor failed (a latscope bug)")
    if requests.get("late"):
        flag("degraded", f"{requests['late']} requests waited for a free slot (limits.max_in_flight={max_in_flight})")
    if requests.get("dropped"):
        flag("degraded", f"{requests['dropped']} requests dropped at the in-flight cap (limits.max_in_flight={max_in_flight})")
    for node in nodes or ():
        for stamp, why in node_validity(node, thresholds):
            flag(stamp, why)
    return verdict, reasons


def node_validity(node: dict, thresholds: Any) -> list[tuple[str, str]]:
    """[(stamp, reason)] of one machine of a distributed run (summary.json generator.nodes[i])."""
    name = f"node {node['node']} ({node['host']})"
    out = []
    if node["status"] != "ok":
        out.append(("invalid", f"{name} {node['status']}" + (f" at {node['lost_at_s']} s" if node.get("lost_at_s") is not None
                                                             else "") + ": its share of the schedule was not sent"))
    clock = node.get("clock")
    if clock:
        error = clock["max_error_ms"]
        if error > thresholds.invalid_send_lag_p99_ms:
            out.append(("invalid", f"{name}: clock error up to {error:.3f} ms > {thresholds.invalid_send_lag_p99_ms:g} ms"))
        elif error > thresholds.degraded_send_lag_p99_ms:
            out.append(("degraded", f"{name}: clock error up to {error:.3f} ms > {thresholds.degraded_send_lag_p99_ms:g} ms"))
    return out


def error_rate(requests: dict) -> float | None:
    """Errors over answered requests (completed + errors); None when none was answered."""
    answered = requests.get("completed", 0) + requests.get("errors", 0)
    return requests.get("errors", 0) / answered if answered else None


def slo_value(metrics: dict, slo: Any, requests: dict | None = None, achieved_rps: float | None = None,
              goodput: dict | None = None) -> float | None:
    """The value an SLO is about: a metric statistic in ms, the run's error rate or its achieved
    req/s, or a goodput statistic (summary.json's goodput[class][fraction | rps])."""
    if slo.stat == "error_rate":
        return error_rate(requests) if requests is not None else None
    if slo.stat == "throughput":
        return achieved_rps
    if slo.metric == "goodput":
        return (goodput or {}).get(slo.class_, {}).get(slo.stat)
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
                                 else "no data for this metric and class")
        verdicts.append(verdict)
    return verdicts
