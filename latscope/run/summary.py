"""The one writer of a run's summary.json and timeseries.parquet, at the end of the run.

    write_results: timeseries.parquet -> run_end (the last event) -> cold-start analysis -> summary.json

summary.json is written once, complete: the cold-start analysis (latscope.analysis.coldstart) reads
the results directory like any later reader, with this summary in hand instead of on disk. What the
summary is made of comes from the orchestrator as one record, `RunFacts`, so that anything that ran a
run (the orchestrator today, a distributed coordinator or a benchmark that synthesizes a run) writes
the same files the same way. The shape of summary.json is fixed (keys are added, never renamed);
results/schema.py names its parts.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from latscope import __version__, results
from latscope.analysis.coldstart import cold_start_summary
from latscope.analysis.models import model_mix
from latscope.analysis.run_data import load_run
from latscope.analysis.verdicts import (goodput_view, lag_thresholds, no_success_reason, node_stamp, slo_verdicts,
                                       tightest_limit, validity)
from latscope.plan import Plan
from latscope.recorder import summarize
from latscope.results.schema import (ALL, CACHE_REPORTED, CACHED_TOKENS, CANCELLED, COMPLETED, COUNTERS, DROPPED,
                                     EMPTY, ERROR_INDEX, REASONING_TOKENS, ERROR_KINDS, GOOD, GOOD_OUTPUT_TOKENS, LATE, OUTPUT_TOKENS,
                                     OUTPUT_TOKENS_USAGE, PROMPT_TOKENS, SENT, SESSION_COUNTERS, SESSIONS_STARTED,
                                     TIMESERIES_COLUMNS, TURN_CACHED, TURN_COUNTERS, TURN_METRICS, TURN_PREFIX,
                                     TURN_REPORTED, summary_order, turn_class)
from latscope.results.schema import ITEMS
from latscope.results.schema import (JOB_CACHED_TOKENS, JOB_CONTEXT_TOKENS, JOB_PROMPT_TOKENS, JOB_REQUESTS, JOB_ROUNDS,
                                     JOBS_GOOD, TOOL_CALLS, TOOL_CALLS_INVALID)
from latscope.results.schema import PROMPT_FROM_USAGE
from latscope.run.token_counts import token_counts
from latscope.run.collector import Collector
from latscope.scenario import Scenario
from latscope.scenario.protocols import BATCH_PROTOCOLS
from latscope.workload import salt_record


@dataclass
class RunFacts:
    """What is known when a run is over: everything summary.json is made of. Times are
    perf_counter_ns, None for a moment the run never reached."""

    scenario: Scenario
    plan: Plan
    workers: int
    collector: Collector | None  # None: the run ended before any worker sent
    started_wall: float  # time.time() when the run was started
    t0_ns: int | None = None  # the first intended send (t = 0 of the run's clock)
    t0_wall: float | None = None
    end_ns: int | None = None  # the last report was collected
    abort_ns: int | None = None
    abort_reason: str | None = None  # why the run was cut short
    launched: tuple[int, int] | None = None  # (started, ready) of the first launch of target.launch
    gpus: list[dict] = field(default_factory=list)  # summary.json environment.gpus
    error_examples: dict[str, list[str]] = field(default_factory=dict)  # error kind -> a few distinct messages
    unaccounted: int = 0  # sent, yet counted neither completed, an error nor cancelled (WorkerDone): a bug if not 0
    # a distributed run's machines (distributed/remote.py describe): generator.distributed and generator.nodes
    distributed: dict | None = None
    request_records: dict | None = None  # summary.json request_records (run/requests.py); None: not kept

    def run_clock(self, ns: int | None) -> float | None:
        """perf_counter_ns `ns` on the run's clock (seconds from t0), None when either is unknown."""
        return round((ns - self.t0_ns) / 1e9, 6) if ns is not None and self.t0_ns is not None else None

    def executed_s(self) -> float:
        """How much of the planned timeline was run (all of it unless cut short)."""
        if self.t0_ns is None:
            return 0.0
        if self.abort_ns is None:
            return self.plan.duration_s
        return min(self.plan.duration_s, max(0.0, (self.abort_ns - self.t0_ns) / 1e9))

    def measured_window_s(self) -> float:
        """The executed part of the phases outside warm-up: what rates are per."""
        executed = self.executed_s()
        return sum(
            max(0.0, min(p.start_s + p.duration_s, executed) - p.start_s) for p in self.plan.phases if not p.warmup
        )


def write_results(run_dir: Path, facts: RunFacts, events: results.EventLog) -> dict:
    """Write timeseries.parquet, log run_end and close events.jsonl, analyse the cold starts and write
    summary.json; the summary."""
    c = facts.collector
    results.write_rows(run_dir / results.TIMESERIES, c.rows if c else [], list(TIMESERIES_COLUMNS))
    summary = build_summary(facts)
    if facts.unaccounted:  # loud, everywhere: the counts of this run do not add up
        events.emit("accounting_mismatch", unaccounted=facts.unaccounted)
        logging.getLogger("latscope.run").warning(
            "%d request(s) were sent but counted neither completed, nor an error, nor cancelled: a latscope bug "
            "(summary.json requests.unaccounted)", facts.unaccounted)
    events.emit("run_end", partial=summary["partial"], validity=summary["validity"])
    events.close()
    summary["cold_start"] = _cold_start(run_dir, summary)
    results.write_json(run_dir / results.SUMMARY, summary)
    return summary


def build_summary(facts: RunFacts) -> dict:
    """summary.json without `cold_start` (which is analysed from the written directory)."""
    c, scenario, plan = facts.collector, facts.scenario, facts.plan
    metrics = {}
    if c is not None:
        totals = c.totals_with_all()
        metrics = {m: {cls: summarize(h) for cls, h in totals[m].items()} for m in summary_order(totals)}
    requests, by_class, errors, warmup = _request_counts(facts)
    # Every sent request ends completed, an error or cancelled; the workers count those that did not
    # (warm-up included): 0 unless latscope has a bug.
    requests["unaccounted"] = facts.unaccounted
    window = facts.measured_window_s()
    measured = ~plan.warmup & (plan.offsets_s < facts.executed_s())
    offered = int(plan.planned_requests[measured].sum())
    if plan.closed_loop:  # the users' load is what they sent (it follows the server)
        offered = max(offered, requests["sent"] + requests["dropped"])
    # The lateness thresholds follow what lateness can change here (verdicts.py): the tightest time
    # limit and the planned arrivals' spacing; a distributed run's nodes are stamped by the same ones.
    thresholds = lag_thresholds(scenario.validity, metrics, tightest_limit(scenario.slos, scenario.goodput_objectives()),
                                max(offered / window if window else 0.0, _busiest_rate(facts)))
    distributed = facts.distributed and {**facts.distributed, "nodes": [
        {**node, "validity": node_stamp(node, thresholds)} for node in facts.distributed.get("nodes", [])]}
    verdict, reasons = validity(metrics, requests, thresholds, scenario.limits.max_in_flight,
                                (distributed or {}).get("nodes"))
    if (nothing := no_success_reason(requests, errors, facts.error_examples)) is not None:
        verdict, reasons = "invalid", [*reasons, nothing]
    goodput = _goodput(facts, window)  # before the SLO verdicts, which may read it
    agents = _agents(facts, metrics, window)  # so are the jobs'
    launched = facts.launched
    return {
        "schema_version": results.SCHEMA_VERSION,
        "scenario": scenario.name,
        "started_at": results.utc_stamp(facts.t0_wall or facts.started_wall),
        "duration_s": round(((facts.end_ns or 0) - (facts.t0_ns or 0)) / 1e9, 3) if facts.t0_ns else 0.0,
        "partial": facts.abort_reason is not None,
        "abort_reason": facts.abort_reason,
        "validity": verdict,
        "validity_reasons": reasons,
        "validity_thresholds": thresholds.record(),
        "requests": requests,
        "requests_by_class": by_class,
        "warmup_requests": warmup,
        "throughput": {
            "offered_rps": round(offered / window, 3) if window else 0.0,
            "achieved_rps": round(requests["completed"] / window, 3) if window else 0.0,
            "measured_window_s": round(window, 3),
        },
        "metrics": metrics,
        "tokens": _tokens(facts, window),
        "batch": _batch(facts, window),
        "errors": errors,
        "error_examples": facts.error_examples,
        "goodput": goodput,
        "load": _load(plan),
        "prompt_salt": salt_record(scenario),
        "sessions": _sessions(facts, metrics),
        "agents": agents,
        "models": _models(facts, by_class),
        "slo": slo_verdicts(metrics, scenario.slos, requests, requests["completed"] / window if window else 0.0,
                            goodput_view({"goodput": goodput, "agents": agents})),
        "phases": [
            {"name": p.name, "start_s": p.start_s, "duration_s": p.duration_s, "warmup": p.warmup}
            for p in plan.phases
        ],
        "request_records": facts.request_records,
        "generator": {
            "workers": facts.workers,
            "interval_s": scenario.output.interval,
            "clamped_values": dict(c.clamped) if c else {},
            "target_ready_after_s": round((launched[1] - launched[0]) / 1e9, 4) if launched else None,
            # the launched target's start and readiness on the run's clock (negative: before t=0)
            "target_launched_at_s": facts.run_clock(launched and launched[0]),
            "target_ready_at_s": facts.run_clock(launched and launched[1]),
            **(distributed or {}),
        },
        "environment": {
            "latscope": __version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "host": socket.gethostname(),
            "cpus": os.cpu_count(),
            "gpus": facts.gpus,
        },
    }


def _busiest_rate(facts: RunFacts) -> float:
    """The planned rate (req/s) of the busiest measured phase, over the part of it that ran: the
    arrivals' spacing that validity compares lateness with (a burst phase is not averaged away)."""
    plan, executed, busiest = facts.plan, facts.executed_s(), 0.0
    measured = plan.offsets_s < executed
    for i, p in enumerate(plan.phases):
        span = min(p.start_s + p.duration_s, executed) - p.start_s
        if not p.warmup and span >= min(p.duration_s, 1.0):  # not a sliver cut short (a noisy rate)
            busiest = max(busiest, float(plan.planned_requests[measured & (plan.phase == i)].sum()) / span)
    return busiest


def _request_counts(facts: RunFacts) -> tuple[dict, dict, dict, dict]:
    """(requests, requests_by_class, errors by kind, warm-up requests), outside warm-up unless named."""
    counters = facts.collector.counters if facts.collector else {}
    plan = facts.plan

    def counts(rows: list[np.ndarray], scheduled: int) -> dict:
        total = sum(rows, np.zeros(len(COUNTERS), np.int64))
        sent, dropped = int(total[SENT]), int(total[DROPPED])
        if plan.closed_loop:  # closed-loop users plan nothing ahead: what they sent is what they scheduled
            scheduled = max(scheduled, sent + dropped)
        return {
            "scheduled": scheduled,
            "sent": sent,
            "completed": int(total[COMPLETED]),
            "empty": int(total[EMPTY]),  # completed answers with 0 output tokens (intervals.py)
            "errors": int(sum(total[ERROR_INDEX[k]] for k in ERROR_KINDS)),
            "dropped": dropped,
            "late": int(total[LATE]),
            "cancelled": int(total[CANCELLED]),
            "not_sent": scheduled - sent - dropped,
            "_errors": {k: int(total[ERROR_INDEX[k]]) for k in ERROR_KINDS},
        }

    measured, planned = ~plan.warmup, plan.planned_requests  # a session plans its turns
    requests = counts([v for (_, w), v in counters.items() if not w], int(planned[measured].sum()))
    by_class = {}
    for i, name in enumerate(plan.class_names):
        scheduled = int(planned[measured & (plan.cls == i)].sum())
        by_class[name] = counts([v for (n, w), v in counters.items() if n == name and not w], scheduled)
        del by_class[name]["_errors"]
    warmup = counts([v for (_, w), v in counters.items() if w], int(planned[plan.warmup].sum()))
    del warmup["_errors"]
    errors = requests.pop("_errors")
    return requests, by_class, errors, warmup


def _tokens(facts: RunFacts, window_s: float) -> dict:
    """Token totals outside warm-up, per class and "all": prompt and output tokens, output tokens
    per second of the measured window, and where the output counts came from ("usage": the
    server's usage report, "chunks": streamed chunks counted, "mixed"); `prefix_cache` (cached
    tokens, prompt tokens, hit rate) when the server reported cached tokens. {} when no request had tokens."""
    counters = facts.collector.counters if facts.collector else {}
    totals: dict[str, np.ndarray] = {}
    for (name, warmup), row in counters.items():
        if not warmup:
            totals[name] = totals.get(name, 0) + row[[PROMPT_TOKENS, OUTPUT_TOKENS, OUTPUT_TOKENS_USAGE, CACHED_TOKENS,
                                                      CACHE_REPORTED]]
    sources = {name: row for (name, warmup), row in counters.items() if not warmup}
    if not totals or not (any(int(t[1]) for t in totals.values())
                          or any(int(row[PROMPT_FROM_USAGE:].sum()) for row in sources.values())):
        return {}
    totals["all"] = sum(totals.values())
    out = {}
    for name, (prompt, output, from_usage, cached, reported) in totals.items():
        source = "usage" if from_usage == output else "chunks" if from_usage == 0 else "mixed"
        out[name] = {"prompt_tokens": int(prompt), "output_tokens": int(output),
                     "output_tokens_per_s": round(int(output) / window_s, 3) if window_s else 0.0,
                     "output_count_source": source}
        if reported:  # the server said how many prompt tokens its prefix cache served
            out[name]["prefix_cache"] = _hit_rate(int(cached), int(reported))
        if reasoning := _measured(counters, name, REASONING_TOKENS):  # of the output tokens (intervals.py)
            out[name]["reasoning_tokens"] = reasoning
    tokenizer = facts.scenario.workload.tokenizer is not None
    by_tokenizer = {c.name for c in facts.scenario.workload.effective_classes() if tokenizer and c.dataset is not None}
    for name, counts in token_counts(sources, by_tokenizer).items():  # where the counts came from (token_counts.py)
        out[name]["counts"] = counts
        out[name]["output_count_source"] = counts["output"]["source"]
    return out


def _measured(counters: dict, name: str, counter: int) -> int:
    """One counter outside warm-up, summed over a class's rows ("all": every class's)."""
    return int(sum(int(row[counter]) for (n, warmup), row in counters.items() if not warmup and name in (n, ALL)))


def _batch(facts: RunFacts, window_s: float) -> dict:
    """summary.json's `batch`, outside warm-up: per class of a batch protocol (openai-embeddings,
    rerank; scenario.protocols.BATCH_PROTOCOLS) that completed a request, the items its completed
    requests carried (`unit`: inputs, documents) and their input tokens (the server's usage where it
    said, else the plan's), in all and per second of the measured window. {} when there is none."""
    counters = facts.collector.counters if facts.collector else {}
    out = {}
    for i, name in enumerate(facts.plan.class_names):
        protocol = facts.scenario.endpoint(i).protocol
        if protocol not in BATCH_PROTOCOLS:
            continue
        row = sum((v for (n, w), v in counters.items() if n == name and not w), np.zeros(len(COUNTERS), np.int64))
        completed, items, tokens = int(row[COMPLETED]), int(row[ITEMS]), int(row[PROMPT_TOKENS])
        if completed:
            out[name] = {"protocol": protocol, "unit": BATCH_PROTOCOLS[protocol], "completed": completed,
                         "items": items, "items_per_request": round(items / completed, 3),
                         "items_per_s": round(items / window_s, 3) if window_s else 0.0,
                         "input_tokens": tokens, "input_tokens_per_s": round(tokens / window_s, 3) if window_s else 0.0}
    return out


def _goodput(facts: RunFacts, window_s: float) -> dict:
    """summary.json's `goodput` (results.schema.GOODPUT_STATS), outside warm-up: per class with
    objectives and "all" (those classes together); {} when no class has objectives. total = sent +
    dropped, every measured request that went out or was dropped at the cap (not_sent, planned
    after the run stopped, is not counted); only a completed request can be good."""
    objectives = facts.scenario.goodput_objectives()
    if not any(objectives):
        return {}
    counters = facts.collector.counters if facts.collector else {}
    rows: dict[str, np.ndarray] = {}
    for name, own in zip(facts.plan.class_names, objectives):
        if own is not None:
            rows[name] = sum((v for (n, w), v in counters.items() if n == name and not w), np.zeros(len(COUNTERS), np.int64))
    rows[ALL] = sum(rows.values(), np.zeros(len(COUNTERS), np.int64))

    def entry(row: np.ndarray) -> dict:
        good, total, tokens = int(row[GOOD]), int(row[SENT] + row[DROPPED]), int(row[GOOD_OUTPUT_TOKENS])
        return {"good": good, "total": total, "fraction": round(good / total, 6) if total else None,
                "rps": round(good / window_s, 3) if window_s else 0.0,
                "output_tokens_per_s": round(tokens / window_s, 3) if window_s else 0.0}

    out = {name: {"objectives": own, **entry(rows[name])} for name, own in zip(facts.plan.class_names, objectives) if own}
    out[ALL] = entry(rows[ALL])
    return out


CLOSED_LOOP_NOTE = ("closed loop: each user sends its next request only when the last one is answered, so the offered "
                    "load follows the server (a slow server lowers its own load: coordinated omission). Read achieved "
                    "throughput and service time; latency here is not open-loop latency.")


def _load(plan: Plan) -> dict:
    """summary.json's `load`: how the traffic was offered. open: arrivals from the plan, whatever the
    server does; closed: `users` concurrent users (arrival: users), each waiting for its answers."""
    if not plan.closed_loop:
        return {"model": "open"}
    users = int((plan.user >= 0).sum())
    return {"model": "closed" if users == len(plan) else "mixed", "users": users, "note": CLOSED_LOOP_NOTE}


def _models(facts: RunFacts, by_class: dict) -> dict:
    """summary.json's `models` (analysis/models.py): the classes grouped by the model each names (its
    own `model`, else the target's), when they name two or more; {} otherwise."""
    if facts.collector is None:
        return {}
    class_models = {name: facts.scenario.endpoint(i).model for i, name in enumerate(facts.plan.class_names)}
    return model_mix(facts.collector.totals, class_models, by_class)


def _sessions(facts: RunFacts, metrics: dict) -> dict:
    """summary.json's `sessions`, outside warm-up: {} when no session started; else per class that
    started one, its sessions by how they ended (results.schema.SESSION_COUNTERS), the prefix-cache
    hit rate (cached / cache-reported prompt tokens; null when the server never said), and per turn
    its counters (TURN_COUNTERS), hit rate and the ROW_STATS of latency, ttft, itl and tpot."""
    counters = facts.collector.counters if facts.collector else {}
    out: dict[str, dict] = {}
    for name in facts.plan.class_names:
        row = sum((v for (n, w), v in counters.items() if n == name and not w), np.zeros(len(COUNTERS), np.int64))
        if not row[SESSIONS_STARTED]:
            continue
        entry = {counter.removeprefix("sessions_"): int(row[COUNTERS.index(counter)]) for counter in SESSION_COUNTERS}
        entry["duration"] = metrics.get("session_duration", {}).get(name, {"count": 0})
        entry["prefix_cache"] = _hit_rate(int(row[CACHED_TOKENS]), int(row[CACHE_REPORTED]))
        by_turn = {}
        for (cls, turn), turn_row in sorted(facts.collector.turn_counters.items()):
            if cls == name:
                stats = {m: metrics.get(f"{TURN_PREFIX}{m}", {}).get(turn_class(name, turn), {"count": 0})
                         for m in TURN_METRICS}
                by_turn[str(turn)] = {**{c: int(v) for c, v in zip(TURN_COUNTERS, turn_row)},
                                      "hit_rate": _hit_rate(int(turn_row[TURN_CACHED]), int(turn_row[TURN_REPORTED]))["hit_rate"],
                                      **stats}
        entry["by_turn"] = by_turn
        out[name] = entry
    return out


def _agents(facts: RunFacts, metrics: dict, window: float) -> dict:
    """summary.json's `agents`, outside warm-up: {} without agent classes; else per agent class that
    started a job: its jobs by how they ended (as its sessions: SESSION_COUNTERS), the ROW_STATS of
    job_time, job_model_time and job_tool_time, the completed jobs' mean rounds, mean requests (their
    sub-agents' included) and mean context at
    their last round (tokens), their cached share (cached / cache-reported prompt tokens of their
    rounds; null when the server never said), the tool calls of all its answers (how many, and how
    many whose arguments were no JSON object), and the jobs' goodput: `good` (completed jobs that met
    every objective: agent.max_job_time, the class's goodput objectives in every round), `total` (jobs
    that ended: started − cut), `fraction` (good / total, null without one) and `rps` (good jobs per
    second of the measured window). Round by round: sessions.<class>.by_turn."""
    counters = facts.collector.counters if facts.collector else {}
    classes = facts.scenario.workload.effective_classes()
    out: dict[str, dict] = {}
    for c, name in enumerate(facts.plan.class_names):
        row = sum((v for (n, w), v in counters.items() if n == name and not w), np.zeros(len(COUNTERS), np.int64))
        if classes[c].agent is None or not row[SESSIONS_STARTED]:
            continue
        jobs = {counter.removeprefix("sessions_"): int(row[COUNTERS.index(counter)]) for counter in SESSION_COUNTERS}
        completed, ended = jobs["completed"], jobs["started"] - jobs["cut"]
        out[name] = {
            "jobs": jobs,
            **{metric: metrics.get(metric, {}).get(name, {"count": 0})
               for metric in ("job_time", "job_model_time", "job_tool_time")},
            "rounds_mean": round(int(row[JOB_ROUNDS]) / completed, 3) if completed else None,
            "requests_mean": round(int(row[JOB_REQUESTS]) / completed, 3) if completed else None,
            "context_tokens_mean": round(int(row[JOB_CONTEXT_TOKENS]) / completed, 1) if completed else None,
            "cached_share": _hit_rate(int(row[JOB_CACHED_TOKENS]), int(row[JOB_PROMPT_TOKENS]))["hit_rate"],
            "tool_calls": {"count": int(row[TOOL_CALLS]), "invalid_json": int(row[TOOL_CALLS_INVALID])},
            "goodput": {"good": int(row[JOBS_GOOD]), "total": ended,
                        "fraction": round(int(row[JOBS_GOOD]) / ended, 6) if ended else None,
                        "rps": round(int(row[JOBS_GOOD]) / window, 6) if window else 0.0},
        }
    return out


def _hit_rate(cached: int, reported: int) -> dict:
    return {"cached_tokens": cached, "prompt_tokens": reported,
            "hit_rate": round(cached / reported, 6) if reported else None}


def _cold_start(run_dir: Path, summary: dict) -> dict | None:
    """summary.json's `cold_start`, analysed from the results just written (the analysis reads a
    results directory, as the report does). A failed analysis is a warning, never a lost run."""
    try:
        return cold_start_summary(load_run(run_dir, summary=summary))
    except Exception as exc:  # noqa: BLE001 - the measurements are written; only this key is missing
        logging.getLogger("latscope.run").warning("cold-start analysis failed (%s: %s); summary.json has no cold_start",
                                                  type(exc).__name__, exc)
        return None
