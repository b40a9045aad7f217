"""Agent jobs (a class's `agent:`), from a results directory.

A job is a session whose turns are rounds and whose think times are tool waits; at its fan-out round
it may start sub-agents, each a session of its own, and its next round goes when the last of them
ended (chat.py). What each function computes, all read from the files a run wrote, nothing measured
again:

- `agent_table`: per agent class (summary.json `agents`: the jobs that started outside warm-up), its
  jobs by how they ended — started, completed, abandoned (a round, or a sub-agent's round, failed or
  was dropped at the in-flight cap), cut (the run ended first), history_limit — and the rounds those
  did not send; the completed jobs' job time (round 1's intended time → the last answer's end) p50,
  p95 and p99; the model's and the tools' shares of their critical path (mean job_model_time and mean
  job_tool_time, each over the two means' sum: a job's two parts add up to its time); their mean
  rounds, mean requests (their sub-agents' included), mean context at the last round (prompt tokens) and cached share (cached ÷ cache-reported
  prompt tokens of their rounds, 0…1; None when the server never said); the tool calls of every
  answer and how many of them had arguments that were no JSON object; the jobs' goodput (summary.json
  agents.<class>.goodput: the share of the jobs that ended that met every objective, and good jobs
  per second; None without it).
- `round_table`: sessions.turn_table's rows of the agent classes, its `turn` column named `round`:
  each round's completed and errors, hit rate and p50/p99 of latency, TTFT, ITL and TPOT (summary.json
  `sessions.<class>.by_turn`: a job's own rounds; its sub-agents' rounds are not among them).
- `job_time_cdf`: per agent class, the completed jobs' job times as an empirical CDF: every distinct
  value of the `job_time` histogram (histograms.hlog, warm-up intervals left out, 3 significant
  digits, each value the highest of its bucket as summary.json's percentiles are), how many jobs had
  it, and the share of jobs at or below it.
- `completed_jobs`: per completed job of a class whose round 1 went outside warm-up, from
  requests.parquet: its id, start (round 1's intended time, µs on the run clock), end (its last
  round's end), job time (end − start, ms), rounds and sub-agents. Completed here means every round is
  in the file, once, answered (error null) — as many as it planned (schedule.parquet's rows of the
  job; else the scenario's fixed `rounds`; a closed-loop job of drawn rounds without either: all its
  rounds answered, so a job the run cut after an answer counts too) — and, for a job that fanned out
  (scenario.yaml `fan_out`, or sub-agent rows in the file), its fan-out whole: sub-agents (as many as a
  fixed `agents` says) whose rounds (as many as a fixed `rounds` says) are all there and answered, the
  first starting at the fan-out round's end and the last ending at the next round's intended time
  (a run replaying an agent trace: its jobs' shapes are the trace's, so only the file's rows say). A
  sampled file (summary.json `request_records.sampled`) keeps some rows of a job only: the jobs it
  kept whole are these.
- `job_timelines`: of a class's completed jobs ranked by job time (ties by id), the one at the median
  and the one at the p99 (nearest rank: the ⌈q·n⌉-th), each with its critical path as segments (ms
  from the job's start): every round as a model segment (intended → end, with its first token), every
  tool wait (an answer's end → the next round's intended time) as a tool segment, on lane 0 for the
  job and lane i for its sub-agent i (from 1), those running at once. The critical path is the job's
  own lane and, during the fan-out, the lane of the sub-agent that ended last; its segments tile the
  job's time exactly (each starts where the one before ended), so they sum to it to the µs.

Sub-agents in requests.parquet: `session` = SUB_AGENT_BASE + job · MAX_FAN_OUT + (i − 1), `turn` its round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from latscope.analysis.run_data import RunData, metric_intervals
from latscope.analysis.sessions import number, turn_table
from latscope.errors import ResultsError
from latscope.recorder import bucket_bounds, new_histogram, to_sparse
from latscope.results.reading import read_scenario
from latscope.results.schema import REQUESTS, SCHEDULE, SUB_AGENT_BASE
from latscope.scenario.workload import MAX_FAN_OUT

JOB_COUNTERS = ("started", "completed", "abandoned", "cut", "history_limit", "turns_not_sent")
AGENT_COLUMNS = ("class", *JOB_COUNTERS, "job_count", "job_p50_ms", "job_p95_ms", "job_p99_ms", "model_share",
                 "tool_share", "rounds_mean", "requests_mean", "context_tokens_mean", "cached_share", "tool_calls",
                 "invalid_json", "good_jobs_fraction", "good_jobs_per_s")
CDF_COLUMNS = ("class", "value_ms", "count", "fraction")
JOB_COLUMNS = ("job", "start_us", "end_us", "job_time_ms", "rounds", "sub_agents")
SEGMENT_COLUMNS = ("lane", "kind", "round", "start_ms", "end_ms", "ttft_ms", "critical")
TIMELINE_QUANTILES = (("p50", 50.0), ("p99", 99.0))
_READ = ("session", "turn", "warmup", "intended_us", "first_token_us", "end_us", "error")
_HIGHEST = bucket_bounds(new_histogram())[1]  # each counts-array index's highest value (µs)


@dataclass(frozen=True)
class JobTimeline:
    """One job's critical path: `which` ("p50", "p99") of `of` completed jobs, the `rank`-th by job time."""

    which: str
    job: int
    start_s: float  # round 1's intended time on the run clock
    job_time_ms: float
    rank: int
    of: int
    segments: pd.DataFrame  # SEGMENT_COLUMNS, lane by lane, in time order within a lane


def agents_of(summary: dict) -> dict[str, dict]:
    """summary.json `agents` ({} for a run without agent jobs, or one written before they existed)."""
    agents = summary.get("agents")
    return {c: a for c, a in agents.items() if isinstance(a, dict)} if isinstance(agents, dict) else {}


def agent_table(run: RunData) -> pd.DataFrame:
    """One row per agent class (AGENT_COLUMNS); empty (same columns) without agent jobs."""
    rows = []
    for cls, a in agents_of(run.summary).items():
        jobs, job_time = a.get("jobs") or {}, a.get("job_time") or {}
        model, tool = number((a.get("job_model_time") or {}).get("mean_ms")), number((a.get("job_tool_time") or {}).get("mean_ms"))
        path = (model or 0.0) + (tool or 0.0)
        calls = a.get("tool_calls") or {}
        rows.append({
            "class": cls, **{k: int(jobs.get(k) or 0) for k in JOB_COUNTERS}, "job_count": int(job_time.get("count") or 0),
            **{f"job_{s}_ms": number(job_time.get(f"{s}_ms")) for s in ("p50", "p95", "p99")},
            "model_share": model / path if model is not None and path else None,
            "tool_share": tool / path if tool is not None and path else None,
            "rounds_mean": number(a.get("rounds_mean")), "requests_mean": number(a.get("requests_mean")),
            "context_tokens_mean": number(a.get("context_tokens_mean")),
            "cached_share": number(a.get("cached_share")),
            "tool_calls": int(calls.get("count") or 0), "invalid_json": int(calls.get("invalid_json") or 0),
            "good_jobs_fraction": number((a.get("goodput") or {}).get("fraction")),
            "good_jobs_per_s": number((a.get("goodput") or {}).get("rps")),
        })
    return pd.DataFrame(rows, columns=list(AGENT_COLUMNS))


def round_table(run: RunData) -> pd.DataFrame:
    """sessions.turn_table's rows of the agent classes, `turn` renamed `round`; empty without agents."""
    turns = turn_table(run)
    return turns[turns["class"].isin(list(agents_of(run.summary)))].rename(columns={"turn": "round"}).reset_index(drop=True)


def job_time_cdf(run: RunData) -> pd.DataFrame:
    """One row per agent class × distinct job time (CDF_COLUMNS), each class's in ascending order;
    empty (same columns) when no job completed outside warm-up."""
    frames = []
    intervals = metric_intervals(run, "job_time") if agents_of(run.summary) else {}
    for cls in agents_of(run.summary):
        by_interval = intervals.get(cls)
        if by_interval is None:
            continue
        index, counts = to_sparse(by_interval.merged(~run.is_warmup(by_interval.start_s)))
        if not len(counts):
            continue
        counts = counts.astype(np.int64)
        frames.append(pd.DataFrame({"class": cls, "value_ms": _HIGHEST[index] / 1000, "count": counts,
                                    "fraction": np.cumsum(counts) / counts.sum()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({c: [] for c in CDF_COLUMNS})


# -- requests.parquet ----------------------------------------------------------------------------

def _read(path: Path, columns: tuple[str, ...], cls: str) -> pd.DataFrame:
    """`columns` of the rows of class `cls` that belong to a session (`session` ≥ 0). ResultsError
    naming the file when it is unreadable or lacks a column."""
    try:
        missing = [c for c in (*columns, "class") if c not in pq.read_schema(path).names]
        if missing:
            raise ResultsError(f"{path}: missing columns {', '.join(missing)}")
        table = pq.read_table(path, columns=list(columns), filters=(pc.field("class") == cls) & (pc.field("session") >= 0))
    except ResultsError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise ResultsError(f"{path}: unreadable ({exc})") from None
    return table.to_pandas()


def _rows(run: RunData, cls: str) -> pd.DataFrame | None:
    """The class's session rows of requests.parquet (_READ), None when the run kept none."""
    path = run.path / REQUESTS
    return _read(path, _READ, cls) if path.is_file() else None


def _fixed(length: object) -> int | None:
    """A scenario length's value when it is fixed ({dist: fixed, value: N} or N), else None."""
    if isinstance(length, dict):
        length = length.get("value") if length.get("dist") == "fixed" else None
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def _plan(run: RunData, cls: str) -> tuple[int | None, int | None, int | None, int | None]:
    """(rounds, fan-out round, sub-agents, their rounds) of the class as its scenario.yaml fixes them
    (None: drawn, or unknown; fan-out round None: no fan-out, or no scenario.yaml). A run that replays
    an agent trace (a phase's arrival `format: agents`) took its jobs' shapes from the trace: all None."""
    scenario = read_scenario(run.path)
    if any(isinstance(p, dict) and isinstance(p.get("arrival"), dict) and p["arrival"].get("format") == "agents"
           for p in scenario.get("phases") or []):
        return None, None, None, None
    for spec in ((scenario.get("workload") or {}).get("classes") or []):
        if isinstance(spec, dict) and spec.get("name") == cls and isinstance(spec.get("agent"), dict):
            agent = spec["agent"]
            fan_out = agent.get("fan_out") if isinstance(agent.get("fan_out"), dict) else {}
            return (_fixed(agent.get("rounds")), _fixed(fan_out.get("at_round")), _fixed(fan_out.get("agents")),
                    _fixed(fan_out.get("rounds")))
    return None, None, None, None


def _planned_rounds(run: RunData, cls: str) -> pd.Series:
    """Each open-loop job's planned rounds (schedule.parquet: a row per planned round); empty without the file."""
    path = run.path / SCHEDULE
    if not path.is_file():
        return pd.Series(dtype="float64")
    return _read(path, ("session", "turn"), cls).groupby("session")["turn"].max()


def _sessions(frame: pd.DataFrame) -> pd.DataFrame:
    """Per session of `frame` (one kind's rows: jobs', or sub-agents'): its rounds, whether they are
    rounds 1…n each once and all answered (`whole`), round 1's intended time and warm-up flag, the last
    round's end."""
    by = frame.sort_values(["session", "turn"], kind="stable").groupby("session", sort=True)
    out = pd.DataFrame({"rounds": by.size(), "first": by["turn"].min(), "last": by["turn"].max(),
                        "distinct": by["turn"].nunique(), "failed": by["error"].count(),
                        "start_us": by["intended_us"].first(), "warmup": by["warmup"].first(), "end_us": by["end_us"].last()})
    out["whole"] = ((out["first"] == 1) & (out["last"] == out["rounds"]) & (out["distinct"] == out["rounds"])
                    & (out["failed"] == 0))
    return out


def _fan_outs(own: pd.DataFrame, subs: pd.DataFrame, agents: int | None, sub_rounds: int | None) -> pd.DataFrame:
    """Per job with sub-agent rows: how many (`sub_agents`), its fan-out round (`at`: the job's round
    that ended when the first of them started) and whether the fan-out is whole (`whole`: each
    sub-agent whole, as many as fixed, of the fixed rounds, and the job's next round intended when
    the last one ended)."""
    children = _sessions(subs)
    children["job"] = (children.index.to_numpy(np.int64) - SUB_AGENT_BASE) // MAX_FAN_OUT
    if sub_rounds is not None:
        children["whole"] &= children["rounds"] == sub_rounds
    fan = children.groupby("job").agg(sub_agents=("whole", "size"), whole=("whole", "all"),
                                      first_us=("start_us", "min"), last_us=("end_us", "max"))
    at = own.merge(fan.reset_index(), left_on=["session", "end_us"], right_on=["job", "first_us"])
    fan["at"] = at.groupby("job")["turn"].min().reindex(fan.index)
    resumed = own.assign(at=own["turn"] - 1).merge(fan.reset_index(), left_on=["session", "at", "intended_us"],
                                                   right_on=["job", "at", "last_us"])
    fan["whole"] &= fan.index.isin(resumed["job"]) & (agents is None or fan["sub_agents"] == agents)
    return fan


def _completed(run: RunData, cls: str, rows: pd.DataFrame) -> pd.DataFrame:
    """completed_jobs from the class's rows (the module docstring), sorted by job time, then id."""
    rounds, at_round, agents, sub_rounds = _plan(run, cls)
    own, subs = rows[rows["session"] < SUB_AGENT_BASE], rows[rows["session"] >= SUB_AGENT_BASE]
    jobs = _sessions(own)
    planned = _planned_rounds(run, cls).reindex(jobs.index)
    if rounds is not None:
        planned = planned.fillna(rounds)
    jobs = jobs[jobs["whole"] & ~jobs["warmup"].astype(bool) & (planned.isna() | (planned == jobs["rounds"]))]
    fan = _fan_outs(own, subs, agents, sub_rounds).reindex(jobs.index)
    fanned = fan["sub_agents"].notna()
    if at_round is None:  # no fan-out planned (or no scenario.yaml): one in the file must be whole
        keep = ~fanned | fan["whole"].fillna(False).astype(bool)
    else:
        keep = fanned & fan["whole"].fillna(False).astype(bool) & (fan["at"] == at_round)
    jobs, fan = jobs[keep], fan[keep]
    out = pd.DataFrame({"job": jobs.index.to_numpy(np.int64), "start_us": jobs["start_us"].to_numpy(np.int64),
                        "end_us": jobs["end_us"].to_numpy(np.int64), "rounds": jobs["rounds"].to_numpy(np.int64),
                        "sub_agents": fan["sub_agents"].fillna(0).to_numpy(np.int64)})
    out["job_time_ms"] = (out["end_us"] - out["start_us"]) / 1000
    return out.sort_values(["job_time_ms", "job"], kind="stable").reset_index(drop=True)[list(JOB_COLUMNS)]


def completed_jobs(run: RunData, cls: str) -> pd.DataFrame:
    """The class's completed jobs (JOB_COLUMNS) by job time, then id; empty without requests.parquet."""
    rows = _rows(run, cls)
    return pd.DataFrame({c: [] for c in JOB_COLUMNS}) if rows is None else _completed(run, cls, rows)


# -- the critical path ---------------------------------------------------------------------------

def _lane(rows: pd.DataFrame, lane: int, start_us: int, critical: bool, fan_out: int = 0) -> list[dict]:
    """One session's rounds (model segments) and the tool waits between them, ms from `start_us`;
    none after round `fan_out` (the sub-agents were that wait)."""
    out: list[dict] = []
    previous = None
    for r in rows.sort_values("turn").itertuples():
        if previous is not None and previous.turn != fan_out:
            out.append({"lane": lane, "kind": "tool", "round": int(r.turn), "start_ms": (previous.end_us - start_us) / 1000,
                        "end_ms": (r.intended_us - start_us) / 1000, "ttft_ms": math.nan, "critical": critical})
        out.append({"lane": lane, "kind": "model", "round": int(r.turn), "start_ms": (r.intended_us - start_us) / 1000,
                    "end_ms": (r.end_us - start_us) / 1000,
                    "ttft_ms": math.nan if pd.isna(r.first_token_us) else (r.first_token_us - start_us) / 1000,
                    "critical": critical})
        previous = r
    return out


def _segments(rows: pd.DataFrame, job: int, start_us: int) -> pd.DataFrame:
    """The job's segments (SEGMENT_COLUMNS): its own lane, then each sub-agent's (lane = its index + 1),
    the last to end (the highest index among equals) on the critical path."""
    base = SUB_AGENT_BASE + job * MAX_FAN_OUT
    own = rows[rows["session"] == job]
    children = rows[(rows["session"] >= base) & (rows["session"] < base + MAX_FAN_OUT)]
    if not len(children):
        return pd.DataFrame(_lane(own, 0, start_us, True), columns=list(SEGMENT_COLUMNS))
    fan_out = int(own.loc[own["end_us"] == children["intended_us"].min(), "turn"].min())
    ends = children.groupby("session")["end_us"].max()
    critical = int(ends[ends == ends.max()].index.max())
    segments = _lane(own, 0, start_us, True, fan_out)
    for session, sub in children.groupby("session", sort=True):
        segments += _lane(sub, int(session) - base + 1, start_us, int(session) == critical)
    return pd.DataFrame(segments, columns=list(SEGMENT_COLUMNS))


def job_timelines(run: RunData, cls: str) -> list[JobTimeline]:
    """The class's median and p99 completed jobs (TIMELINE_QUANTILES order; the same job twice when
    they coincide) with their critical paths; [] without requests.parquet or a completed job."""
    rows = _rows(run, cls)
    jobs = _completed(run, cls, rows) if rows is not None else None
    if jobs is None or not len(jobs):
        return []
    out = []
    for which, q in TIMELINE_QUANTILES:
        rank = max(1, math.ceil(q / 100 * len(jobs)))
        job = jobs.iloc[rank - 1]
        start = int(job["start_us"])
        out.append(JobTimeline(which, int(job["job"]), start / 1e6, float(job["job_time_ms"]), rank, len(jobs),
                               _segments(rows, int(job["job"]), start)))
    return out
