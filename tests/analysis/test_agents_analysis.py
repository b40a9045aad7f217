"""latscope.analysis.agents over a real results directory: a 2 s run (one worker process) of four
three-round jobs against the scripted agent endpoint (tests/agent_server.py, every request logged with
its X-Request-Id), each job fanning out after round 1 into three two-round sub-agents, every tool wait
a fixed 100 ms; copies of it with rows failed or lost; a run written before agents existed; and
`latscope compare` and `gate` over the new job metrics. (Not test_agents.py: tests/test_agents.py has
that module name.)"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent_server import agent_run, make_agent_app
from conftest import REPO, serve
from latscope.analysis import agents
from latscope.analysis.compare import percentile_deltas
from latscope.analysis.gate import gate
from latscope.analysis.run_data import load_run
from latscope.results.schema import SUB_AGENT_BASE
from latscope.report.compare import delta_table
from latscope.request_ids import request_row
from latscope.scenario.gate_file import GateFile

OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
TOOL_MS = 100.0
AGENT = {"rounds": 3, "tool_latency": "0.1s", "tool_result_tokens": 9, "tools": {"count": 2, "schema_tokens": 20},
         "fan_out": {"at_round": 1, "agents": 3, "rounds": 2, "prompt_tokens": 5}}


@pytest.fixture(scope="module")
def fan(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The run's directory and the server's log (the sub-agents' last rounds answer with text)."""
    log: list[dict] = []
    with serve(make_agent_app(log, text_after=frozenset({2}))) as url:
        return agent_run(url, tmp_path_factory.mktemp("fan"), AGENT, rate=8), log


def server_spans(log: list[dict], run_dir: Path) -> dict[int, float]:
    """Each job's span in the server's log (ms): its round 1's arrival → its last round's last bytes."""
    schedule = pd.read_parquet(run_dir / "schedule.parquet")
    rounds = defaultdict(list)
    for entry in log:
        row = request_row(entry["request_id"])
        if row < SUB_AGENT_BASE:
            rounds[int(schedule.iloc[row]["session"])].append(entry)
    return {job: (max(e["ended_ns"] for e in es) - min(e["arrived_ns"] for e in es)) / 1e6 for job, es in rounds.items()}


def test_agent_table_reads_the_jobs_of_summary_json(fan):
    run = load_run(fan[0])
    coder = run.summary["agents"]["coder"]
    table = agents.agent_table(run)
    assert list(table.columns) == list(agents.AGENT_COLUMNS) and list(table["class"]) == ["coder"]
    row = table.iloc[0]
    assert (row["started"], row["completed"], row["abandoned"], row["cut"], row["history_limit"], row["turns_not_sent"]) == (
        4, 4, 0, 0, 0, 0)
    assert row["job_count"] == 4
    assert (row["job_p50_ms"], row["job_p95_ms"], row["job_p99_ms"]) == tuple(coder["job_time"][f"{s}_ms"] for s in ("p50", "p95", "p99"))
    model, tool = coder["job_model_time"]["mean_ms"], coder["job_tool_time"]["mean_ms"]
    assert row["model_share"] == pytest.approx(model / (model + tool)) and row["model_share"] + row["tool_share"] == pytest.approx(1)
    # the critical path's tool time is the job's own round-3 wait and its last sub-agent's: 200 ms a job
    assert tool == pytest.approx(2 * TOOL_MS, rel=1 / 1024)
    assert row["rounds_mean"] == 3 and row["cached_share"] is None  # the endpoint says nothing of a cache
    # per job: rounds 1 and 3 a call (round 2 answers text), each sub-agent's round 1 a call
    assert (row["tool_calls"], row["invalid_json"]) == (4 * (2 + 3), 0)


def test_round_table_is_the_jobs_own_rounds(fan):
    rounds = agents.round_table(load_run(fan[0]))
    assert list(rounds["class"]) == ["coder"] * 3 and list(rounds["round"]) == [1, 2, 3]
    assert list(rounds["completed"]) == [4, 4, 4] and list(rounds["errors"]) == [0, 0, 0]
    assert (rounds["ttft_count"] == 4).all() and (rounds["ttft_p50_ms"] > 0).all()


def test_completed_jobs_are_the_jobs_spans_in_the_servers_log(fan):
    run_dir, log = fan
    jobs = agents.completed_jobs(load_run(run_dir), "coder")
    assert list(jobs.columns) == list(agents.JOB_COLUMNS)
    assert sorted(jobs["job"]) == [0, 1, 2, 3] and (jobs["rounds"] == 3).all() and (jobs["sub_agents"] == 3).all()
    assert jobs["job_time_ms"].is_monotonic_increasing
    spans = server_spans(log, run_dir)
    # A job's time runs from its round 1's intended time to the client's end stamp: latscope's own send lag for
    # round 1 (recorded), then the way to the server (a new connection: its connect too), the server's span, and the
    # way back after the server wrote its last bytes. Loopback leaves under 5 ms beside the send lag (a loaded CI box
    # put job 0, the run's first request, 5.4 ms over its span, send lag included).
    rows = pd.read_parquet(run_dir / "requests.parquet")
    firsts = rows.query("turn == 1 and session < @SUB_AGENT_BASE").set_index("session")
    for job, ms in zip(jobs["job"], jobs["job_time_ms"]):
        lag_ms = firsts.loc[job, "send_lag_us"] / 1e3
        assert 0 <= ms - lag_ms - spans[job] < 5, (job, ms, lag_ms, spans[job])
    # each a tool wait of 100 ms and a sub-agent's (100 ms more) on its critical path, and five model rounds
    assert (jobs["job_time_ms"] > 2 * TOOL_MS).all() and (jobs["job_time_ms"] < 2 * TOOL_MS + 150).all()


def test_job_time_cdf_is_the_histograms_jobs(fan):
    run = load_run(fan[0])
    cdf = agents.job_time_cdf(run)
    assert list(cdf.columns) == list(agents.CDF_COLUMNS) and set(cdf["class"]) == {"coder"}
    assert cdf["count"].sum() == 4 and cdf["fraction"].iloc[-1] == 1.0 and cdf["value_ms"].is_monotonic_increasing
    assert cdf["value_ms"].iloc[-1] == run.summary["agents"]["coder"]["job_time"]["max_ms"]
    # each job's time, to the histogram's 3 significant digits (the highest value of its bucket)
    times = np.sort(agents.completed_jobs(run, "coder")["job_time_ms"].to_numpy())
    values = np.repeat(cdf["value_ms"].to_numpy(), cdf["count"].to_numpy())
    assert np.all(values >= times - 0.001) and np.all(values - times <= times / 1024 + 0.001)


def test_the_median_and_p99_jobs_critical_paths(fan):
    run = load_run(fan[0])
    jobs = agents.completed_jobs(run, "coder")
    timelines = agents.job_timelines(run, "coder")
    assert [(t.which, t.rank, t.of) for t in timelines] == [("p50", 2, 4), ("p99", 4, 4)]
    assert [t.job for t in timelines] == [int(jobs["job"].iloc[1]), int(jobs["job"].iloc[3])]
    p99 = timelines[1]
    assert p99.job_time_ms == jobs["job_time_ms"].max()
    summary_max = run.summary["agents"]["coder"]["job_time"]["max_ms"]
    assert 0 <= summary_max - p99.job_time_ms <= p99.job_time_ms / 1024 + 0.001
    for t in timelines:
        s = t.segments
        assert list(s.columns) == list(agents.SEGMENT_COLUMNS)
        critical = s[s["critical"]].sort_values("start_ms")
        # the critical path tiles the job: from 0, each segment where the last ended, to the job time
        assert critical["start_ms"].iloc[0] == 0
        assert np.allclose(critical["start_ms"].to_numpy()[1:], critical["end_ms"].to_numpy()[:-1], atol=1e-9)
        assert abs((critical["end_ms"] - critical["start_ms"]).sum() - t.job_time_ms) < 1e-6
        assert critical["end_ms"].iloc[-1] == pytest.approx(t.job_time_ms, abs=1e-9)
        # every tool wait is the scenario's fixed 100 ms, to the µs
        tools = s[s["kind"] == "tool"]
        assert len(tools) == 1 + 3 and np.allclose(tools["end_ms"] - tools["start_ms"], TOOL_MS, atol=1e-6)
        job = s[s["lane"] == 0]
        assert list(zip(job["kind"], job["round"])) == [("model", 1), ("model", 2), ("tool", 3), ("model", 3)]
        # the three sub-agents start together when round 1 ended and run at once; round 2 goes when the last ended
        subs = s[s["lane"] > 0]
        assert sorted(set(subs["lane"])) == [1, 2, 3]
        starts, ends = subs.groupby("lane")["start_ms"].min(), subs.groupby("lane")["end_ms"].max()
        assert (starts == job["end_ms"].iloc[0]).all() and starts.max() < ends.min()
        assert ends.max() == job["start_ms"].iloc[1]
        assert subs.groupby("lane")["critical"].first().sum() == 1 and subs[subs["critical"]]["end_ms"].max() == ends.max()
        for lane in (1, 2, 3):
            assert list(subs[subs["lane"] == lane]["kind"]) == ["model", "tool", "model"]
        model = s[s["kind"] == "model"]
        assert ((model["ttft_ms"] > model["start_ms"]) & (model["ttft_ms"] <= model["end_ms"])).all()


def _edited(run_dir: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(run_dir, copy)
    rows = pd.read_parquet(copy / "requests.parquet")
    edit(rows).to_parquet(copy / "requests.parquet", index=False)
    return copy


def test_a_job_with_a_failed_or_lost_row_is_not_among_the_completed(fan, tmp_path):
    """One job's sub-agent round failed, another's round 3 and a third's off-path sub-agent round lost
    (a sampled file): only the fourth is whole, and it is both the median and the p99 job."""
    run_dir = fan[0]
    jobs = list(agents.completed_jobs(load_run(run_dir), "coder")["job"])
    base = SUB_AGENT_BASE

    def edit(rows: pd.DataFrame) -> pd.DataFrame:
        rows.loc[(rows["session"] == base + jobs[0] * 16 + 1) & (rows["turn"] == 2), "error"] = "http_5xx"
        return rows[~((rows["session"] == jobs[1]) & (rows["turn"] == 3))
                    & ~((rows["session"] == base + jobs[2] * 16 + 2) & (rows["turn"] == 1))]

    run = load_run(_edited(run_dir, tmp_path, edit))
    assert list(agents.completed_jobs(run, "coder")["job"]) == [jobs[3]]
    assert [(t.which, t.job, t.rank, t.of) for t in agents.job_timelines(run, "coder")] == [("p50", jobs[3], 1, 1),
                                                                                          ("p99", jobs[3], 1, 1)]


def test_a_run_without_agents_has_no_rows():
    run = load_run(OLD_RUN)
    assert agents.agent_table(run).empty and list(agents.agent_table(run).columns) == list(agents.AGENT_COLUMNS)
    assert agents.round_table(run).empty and agents.job_time_cdf(run).empty
    assert agents.job_timelines(run, "chat") == [] and agents.completed_jobs(run, "chat").empty  # no requests.parquet


def test_compare_and_gate_know_the_job_metrics(fan, tmp_path):
    """compare's deltas and table list job_time, job_model_time and job_tool_time under "Agents (jobs)";
    the gate holds an SLO on job_time and gates its percentiles against a baseline (four jobs are too few
    to decide p50: inconclusive, with the count, never "no data")."""
    run = load_run(fan[0])
    deltas = percentile_deltas(run, run)
    for metric in ("job_time", "job_model_time", "job_tool_time"):
        rows = deltas[(deltas["metric"] == metric) & (deltas["class"] == "coder")]
        assert len(rows) and (rows["delta_ms"] == 0).all()
    table = delta_table(deltas)
    assert "Agents (jobs)" in table and "<td>job time</td><td>coder</td>" in table
    p95 = run.summary["agents"]["coder"]["job_time"]["p95_ms"]
    gate_file = GateFile.model_validate({"slos": [{"metric": "job_time", "class": "coder", "stat": "p95", "limit_ms": 10000}],
                                         "regression": {"checks": [{"metric": "job_time", "class": "coder", "stat": "p50"}]}})
    result = gate(fan[0], fan[0], gate_file)
    slo = next(c for c in result.checks if c.kind == "slo")
    assert slo.status == "pass" and slo.details["value"] == p95
    regression = next(c for c in result.checks if c.kind == "regression")
    assert regression.status == "inconclusive" and "too few samples in the new run for p50: n = 4" in regression.message
    assert json.loads(json.dumps(regression.details))["metric"] == "job_time"
