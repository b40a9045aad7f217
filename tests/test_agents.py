"""Agent jobs end to end: real runs (worker processes) against a scripted agent endpoint that records
every request body and answers with tool calls (tests/agent_server.py), on loopback."""

from __future__ import annotations

import copy
import json
import signal
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from agent_server import make_agent_app
from conftest import serve
from helpers import cache_counters, read_summary, reference_server, run_cli_until, server_counters
from latscope.plan import build_plan
from latscope.request_ids import request_row
from latscope.results.schema import SUB_AGENT_BASE
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

PROTOCOLS = {"chat": "openai", "responses": "openai-responses", "messages": "anthropic-messages"}
AGENT = {"rounds": 4, "tool_latency": {"dist": "uniform", "min": "0.1s", "max": "0.3s"}, "tool_result_tokens": 9,
         "tools": {"count": 2, "schema_tokens": 20}}


def agent_scenario(url: str, tmp_path, phases: list[dict], api: str = "chat", agent: dict | None = None) -> dict:
    return {
        "name": "agents", "seed": 3,
        "target": {"protocol": PROTOCOLS[api], "url": url, "model": "m", "timeout": 5, "request_id_header": "X-Request-Id"},
        "workload": {"classes": [{"name": "coder", "prompt_tokens": 12, "output_tokens": 3,
                                  "agent": copy.deepcopy(agent or AGENT)}]},
        "phases": phases,
        "limits": {"timer": "precise"},
        "output": {"dir": str(tmp_path / "results"), "report": False},
    }


def by_job(log: list[dict], run_dir) -> dict[int, list[tuple[dict, float]]]:
    """Each job's logged requests in round order, with the tool latency drawn for each (schedule.parquet's
    think_s: row = X-Request-Id)."""
    schedule = pd.read_parquet(run_dir / "schedule.parquet")
    jobs = defaultdict(list)
    for entry in log:
        row = schedule.iloc[request_row(entry["request_id"])]
        jobs[int(row["session"])].append((int(row["turn"]), entry, float(row["think_s"])))
    return {j: [(e, think) for _, e, think in sorted(rounds, key=lambda r: r[0])] for j, rounds in jobs.items()}


def context(api: str, body: dict) -> list:
    return body["input"] if api == "responses" else body["messages"]


def answer_and_result(api: str, entry: dict, result: str) -> list[dict]:
    """What round k + 1 must add to round k's context: the answer as the API represents it (the call
    the server streamed, its arguments put together) and the tool result answering it."""
    call_id, name, arguments = entry["call"]
    if api == "chat":
        return [{"role": "assistant", "content": None,
                 "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call_id, "content": result}]
    if api == "responses":
        return [{"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments},
                {"type": "function_call_output", "call_id": call_id, "output": result}]
    return [{"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name,
                                               "input": json.loads(arguments)}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}]}]


def result_text(api: str, item: dict) -> str:
    return item["output"] if api == "responses" else item["content"] if api == "chat" else item["content"][0]["content"]


def check_job_times(run_dir, jobs: list[list[dict]], job_time: dict) -> None:
    """Each job's time on latscope's clock (requests.parquet: its last round's end − round 1's intended,
    µs) against its critical path in the server's log (`jobs`: each job's own rounds as logged, round 1's
    arrival → the last round's last bytes). latscope's view holds a little more: round 1's send and
    transport before the server stamps it, and the last bytes' way back after; so it is never shorter, and
    at the median within 2 ms (measured here 0.4-0.8 ms, the run's first job ~1.5 ms with its connect; a
    single job up to ~6 ms on this 2-CPU box under other load, the test server's thread waiting for the
    GIL). summary.json's job_time is the same values to the histogram's precision (1/1024)."""
    rows = pd.read_parquet(run_dir / "requests.parquet").set_index("row")
    mine = [rows.loc[[request_row(e["request_id"]) for e in job]] for job in jobs]
    times = sorted((job["end_us"].max() - job["intended_us"].min()) / 1000 for job in mine)
    diffs = [(job["end_us"].max() - job["intended_us"].min()) / 1000 - (rounds[-1]["ended_ns"] - rounds[0]["arrived_ns"]) / 1e6
             for job, rounds in zip(mine, jobs)]
    assert min(diffs) >= 0 and statistics.median(diffs) < 2, diffs
    assert job_time["count"] == len(jobs)
    assert job_time["min_ms"] == pytest.approx(times[0], rel=1 / 1024) and job_time["max_ms"] == pytest.approx(times[-1], rel=1 / 1024)


def replay(tmp_path, jobs: list[dict], tail_s: float) -> tuple[list[dict], Path]:
    """`jobs` written as an agent trace and replayed against the scripted server (the class's tools sent),
    then `tail_s` idle: the server's log and the run's directory."""
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    log: list[dict] = []
    with serve(make_agent_app(log)) as url:
        data = agent_scenario(url, tmp_path, [{"name": "replay", "arrival": {"type": "trace", "format": "agents",
                                                                            "file": str(tmp_path / "jobs.jsonl")}},
                                              {"name": "tail", "duration": tail_s, "arrival": {"type": "idle"}}],
                              agent={"rounds": 1})
        return log, run_scenario(scenario_from_dict(data), workers=1).run_dir


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_each_round_carries_the_context_the_models_tool_call_and_the_result_after_the_tool_wait(tmp_path, api):
    """Four-round jobs, tool waits drawn uniform in 0.1-0.3 s, 9-token tool results, two declared tools.
    Round k + 1's context is exactly round k's, then the tool call the server streamed (its id, name and
    arguments put together from three pieces) as the API represents it, then a tool result of 9 new
    words answering it; every round declares the same two tools; round k + 1 reaches the server its drawn
    tool latency after the server wrote round k's last bytes, never before and at the median within 1 ms
    (the client reads those bytes after the server wrote them: the wait is counted from the client's
    end, so the server sees it a little longer), and on latscope's clock exactly. The job time is the
    job's critical path in the server's log (check_job_times), and the model and tool parts add up to it."""
    log: list[dict] = []
    with serve(make_agent_app(log)) as url:
        data = agent_scenario(url, tmp_path, [
            {"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 4}},
            {"name": "tail", "duration": 2.5, "arrival": {"type": "idle"}}], api, agent={**AGENT, "max_job_time": "10s"})
        data["slos"] = [{"metric": "job_goodput", "class": "coder", "stat": "fraction", "min": 1.0},
                        {"metric": "job_time", "class": "coder", "stat": "p95", "max": 10_000}]
        result = run_scenario(scenario_from_dict(data), workers=1)
    jobs = by_job(log, result.run_dir)
    assert len(jobs) == 4 and all(len(rounds) == 4 for rounds in jobs.values())
    tools, waits = set(), []
    for rounds in jobs.values():
        first = context(api, rounds[0][0]["body"])
        assert len(first) == 1 and len(first[0]["content"].split()) == 12
        for (before, _), (entry, think) in zip(rounds, rounds[1:]):
            added = context(api, entry["body"])[len(context(api, before["body"])):]
            assert context(api, entry["body"])[:-2] == context(api, before["body"])
            result_words = result_text(api, added[1])
            assert added == answer_and_result(api, before, result_words)
            assert len(result_words.split()) == 9
            waits.append((entry["arrived_ns"] - before["ended_ns"]) / 1e6 - think * 1000)
        for entry, _ in rounds:
            tools.add(json.dumps(entry["body"]["tools"], sort_keys=True))
    assert len(tools) == 1 and len(json.loads(tools.pop())) == 2
    assert min(waits) >= 0 and statistics.median(waits) < 1.0, sorted(waits)
    # on latscope's own clock the wait is exact: round k + 1 intended its drawn latency after round k's end
    rows = pd.read_parquet(result.run_dir / "requests.parquet").sort_values(["session", "turn"])
    think = pd.read_parquet(result.run_dir / "schedule.parquet")["think_s"].to_numpy()
    for _, job in rows.groupby("session"):
        gaps = job["intended_us"].to_numpy()[1:] - job["end_us"].to_numpy()[:-1]
        assert (abs(gaps - think[job["row"].to_numpy()[1:]] * 1e6) <= 1).all(), gaps  # µs, truncated from ns
    summary = read_summary(result.run_dir)
    coder = summary["agents"]["coder"]
    assert coder["jobs"]["started"] == coder["jobs"]["completed"] == 4
    check_job_times(result.run_dir, [[e for e, _ in rounds] for rounds in jobs.values()], coder["job_time"])
    # each job's two parts sum to its time (to the µs); the histograms keep 3 significant digits, each
    # value within 1/1024 of itself, so the means agree within that share of what they add up
    parts = coder["job_model_time"]["mean_ms"] + coder["job_tool_time"]["mean_ms"]
    assert abs(parts - coder["job_time"]["mean_ms"]) <= (parts + coder["job_time"]["mean_ms"]) / 1024, (parts, coder)
    assert coder["rounds_mean"] == 4
    assert coder["tool_calls"] == {"count": 16, "invalid_json": 0}
    assert summary["sessions"]["coder"]["by_turn"]["4"]["completed"] == 4
    assert coder["goodput"]["good"] == coder["goodput"]["total"] == 4 and coder["goodput"]["fraction"] == 1.0
    assert [v["passed"] for v in summary["slo"]] == [True, True]


def test_garbled_tool_calls_are_counted_and_a_text_answer_gets_the_result_as_a_user_message(tmp_path):
    """The server garbles the arguments of answers 2 and 5 and answers round 3 with text: the summary
    counts 2 invalid of the calls made, and round 4 carries the text answer as an assistant message
    and the tool result as a user message. With a latency objective no round can meet, no completed
    job is good."""
    log: list[dict] = []
    with serve(make_agent_app(log, garble=frozenset({2, 5}), text_after=frozenset({3}))) as url:
        data = agent_scenario(url, tmp_path, [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 4}},
                                              {"name": "tail", "duration": 2.5, "arrival": {"type": "idle"}}])
        data["workload"]["classes"][0]["goodput"] = {"latency_ms": 0.001}  # no round meets it: no job is good
        result = run_scenario(scenario_from_dict(data), workers=1)
    jobs = by_job(log, result.run_dir)
    calls = sum(1 for e in log if e["call"])
    assert calls == len(log) - len(jobs)  # every round but the third made a call
    for rounds in jobs.values():
        third, fourth = rounds[2][0], rounds[3][0]
        added = fourth["body"]["messages"][len(third["body"]["messages"]):]
        assert added[0] == {"role": "assistant", "content": third["text"]}
        assert added[1]["role"] == "user" and len(added[1]["content"].split()) == 9
    summary = read_summary(result.run_dir)
    assert summary["agents"]["coder"]["tool_calls"] == {"count": calls, "invalid_json": 2}
    assert summary["agents"]["coder"]["jobs"]["completed"] == 2 and summary["agents"]["coder"]["goodput"]["good"] == 0


def test_a_failed_round_abandons_its_job_and_the_run_goes_on(tmp_path):
    """The server refuses every round 2: each job is abandoned after it, rounds 3 and 4 never go, and
    the counts add up (started = completed + abandoned + cut; rounds not sent = 2 a job)."""
    log: list[dict] = []
    with serve(make_agent_app(log, fail_round=2)) as url:
        result = run_scenario(scenario_from_dict(agent_scenario(url, tmp_path, [
            {"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 4}},
            {"name": "tail", "duration": 1, "arrival": {"type": "idle"}}])), workers=1)
    assert sorted(e["round"] for e in log) == [1] * 4 + [2] * 4
    summary = read_summary(result.run_dir)
    jobs = summary["agents"]["coder"]["jobs"]
    assert (jobs["started"], jobs["abandoned"], jobs["completed"], jobs["cut"], jobs["turns_not_sent"]) == (4, 4, 0, 0, 8)
    assert summary["errors"]["http_5xx"] == 4 and not summary["partial"]
    assert summary["agents"]["coder"]["job_time"]["count"] == 0
    assert summary["agents"]["coder"]["goodput"] == {"good": 0, "total": 4, "fraction": 0.0, "rps": 0.0}


def test_job_starts_keep_their_schedule_and_sigint_mid_job_leaves_every_job_counted(tmp_path):
    """Open-loop job starts at 5 a second with 1 s tool waits, SIGINT after 2.5 s: the round-1 requests
    arrived on their schedule (0.2 s apart, whatever the jobs in flight), the results directory is
    complete and partial, and started = completed + abandoned + cut, the cut ones' unsent rounds counted."""
    log: list[dict] = []
    with serve(make_agent_app(log)) as url:
        data = agent_scenario(url, tmp_path, [{"name": "p", "duration": 20, "arrival": {"type": "constant", "rate": 5}}],
                              agent={**AGENT, "tool_latency": "1s"})
        path = tmp_path / "agents.yaml"
        path.write_text(yaml.safe_dump(data))
        out = tmp_path / "run"
        code, output = run_cli_until(path, out, 2.5, signal.SIGINT)
    assert code == 1, output
    summary = read_summary(out)
    assert summary["partial"] and (out / "schedule.parquet").is_file() and (out / "timeseries.parquet").is_file()
    starts = sorted(e["arrived_ns"] for e in log if e["round"] == 1)
    gaps = [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]
    assert len(starts) >= 10 and statistics.median(gaps) == pytest.approx(200, abs=2), gaps
    jobs = summary["agents"]["coder"]["jobs"]
    assert jobs["started"] == jobs["completed"] + jobs["abandoned"] + jobs["cut"] + jobs["history_limit"]
    assert jobs["cut"] >= 5 and jobs["started"] == len(starts)
    assert jobs["turns_not_sent"] == 4 * jobs["started"] - summary["requests"]["sent"]
    assert summary["requests"]["sent"] == len(log)


def test_a_fan_out_runs_its_sub_agents_at_once_and_the_job_goes_on_after_the_last(tmp_path):
    """Three-round jobs that fan out after round 1 into three two-round sub-agents (0.1 s tool waits;
    the server answers every round 2 with text). The sub-agents' first rounds reach the server together,
    right after the job's round 1 ended, each with a context of its own (its 5-token task); the job's
    round 2 goes only after the last sub-agent ended, at once (the sub-agents were its tool), and
    carries their final answers before its tool result. The job time is its critical path in the server's
    log (check_job_times), and its tool time is the 0.1 s of its own round 3 plus the 0.1 s of the
    sub-agent on its critical path, exactly (to the histogram's 3 digits)."""
    log: list[dict] = []
    agent = {**AGENT, "rounds": 3, "tool_latency": "0.1s", "max_job_time": "0.2s",  # less than its tool time
             "fan_out": {"at_round": 1, "agents": 3, "rounds": 2, "prompt_tokens": 5}}
    with serve(make_agent_app(log, text_after=frozenset({2}))) as url:
        result = run_scenario(scenario_from_dict(agent_scenario(url, tmp_path, [
            {"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 4}},
            {"name": "tail", "duration": 2, "arrival": {"type": "idle"}}], agent=agent)), workers=1)
    base = SUB_AGENT_BASE  # a sub-agent's request number is base + (job · 16 + i) · 64 + round − 1
    jobs: dict[int, list[dict]] = defaultdict(list)
    subs: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for entry in sorted(log, key=lambda e: e["arrived_ns"]):
        seq = request_row(entry["request_id"])
        if seq < base:
            jobs[len(jobs) if entry["round"] == 1 else max(jobs)].append(entry)  # one job at a time (0.25 s apart)
        else:
            subs[(seq - base) // 64 // 16][(seq - base) // 64 % 16].append(entry)
    assert len(jobs) == len(subs) == 2
    for (_, rounds), children in zip(sorted(jobs.items()), [subs[k] for k in sorted(subs)]):
        assert [e["round"] for e in rounds] == [1, 2, 3] and len(children) == 3
        starts = [c[0]["arrived_ns"] for c in children.values()]
        assert 0 <= min(starts) - rounds[0]["ended_ns"] and (max(starts) - rounds[0]["ended_ns"]) / 1e6 < 10
        for child in children.values():
            assert [e["round"] for e in child] == [1, 2]
            assert [m["role"] for m in child[0]["body"]["messages"]] == ["user"]
            assert len(child[0]["body"]["messages"][0]["content"].split()) == 5
        last_end = max(c[-1]["ended_ns"] for c in children.values())
        assert 0 <= (rounds[1]["arrived_ns"] - last_end) / 1e6 < 5
        reported = rounds[1]["body"]["messages"][-1]["content"].split("\n")
        assert sorted(reported[:3]) == sorted(c[-1]["text"] for c in children.values())
        assert len(reported[3].split()) == 9
    summary = read_summary(result.run_dir)
    coder = summary["agents"]["coder"]
    assert coder["jobs"]["completed"] == 2
    check_job_times(result.run_dir, list(jobs.values()), coder["job_time"])
    assert coder["job_tool_time"]["min_ms"] == pytest.approx(200, rel=1 / 1024)
    assert coder["job_tool_time"]["max_ms"] == pytest.approx(200, rel=1 / 1024)
    assert set(summary["sessions"]["coder"]["by_turn"]) == {"1", "2", "3"}  # the sub-agents' rounds are not the job's
    assert summary["sessions"]["coder"]["by_turn"]["2"]["completed"] == 2
    assert summary["requests"]["sent"] == len(log) == 2 * (3 + 3 * 2)
    assert coder["goodput"]["good"] == 0 and coder["goodput"]["total"] == 2  # each took more than 0.2 s
    assert coder["requests_mean"] == 3 + 3 * 2  # its own rounds and its sub-agents'
    assert summary["sessions"]["coder"]["by_turn"]["3"]["ttfot"]["count"] == 2  # round 3 answered text: a content chunk


def reference_run(url: str, tmp_path) -> dict:
    """Four-round jobs against the reference server's decoder, 2 a second for 3 s: three tools of 60
    schema tokens, a 24-token task, 8-token answers (tool calls), 24-token tool results, 50 ms tool waits."""
    data = agent_scenario(url, tmp_path, [{"name": "p", "duration": 3, "arrival": {"type": "constant", "rate": 2}},
                                          {"name": "tail", "duration": 3, "arrival": {"type": "idle"}}],
                          agent={"rounds": 4, "tool_latency": "50ms", "tool_result_tokens": 24,
                                 "tools": {"count": 3, "schema_tokens": 60}})
    data["target"].update(model="decoder", timeout=30)
    data["workload"]["classes"][0].update(prompt_tokens=24, output_tokens=8)
    return run_scenario(scenario_from_dict(data), workers=1).summary


def test_against_the_reference_server_the_hit_rate_climbs_by_round_and_matches_its_counters(tmp_path):
    """With its prefix cache on, a round re-sends the whole context before it, so the hit rate rises
    round by round; the cached and looked-up prompt tokens latscope reports are the server's own
    /metrics counts, and so are the tool calls (every answer one, well-formed: the server's tool-call
    rate is 1). With --prefix-cache-mb 0 every round's hit rate is 0 and the server cached nothing."""
    with reference_server() as url:
        before, calls_before = cache_counters(url), server_counters(url, "latscope_ref_tool_calls_total")
        on = reference_run(url, tmp_path / "on")
        after, calls_after = cache_counters(url), server_counters(url, "latscope_ref_tool_calls_total")
    rounds = on["sessions"]["coder"]["by_turn"]
    rates = [rounds[str(k)]["hit_rate"] for k in range(1, 5)]
    # round k finds the context up to round k − 1's end in whole 16-token blocks (round 1: the tools, which
    # every job declares alike) and computes the last ~40 tokens anew: a share that falls as the context grows
    assert 0 < rates[0] < rates[1] < rates[2] < rates[3], rates
    cache = on["tokens"]["coder"]["prefix_cache"]
    assert (cache["cached_tokens"], cache["prompt_tokens"]) == (after[0] - before[0], after[1] - before[1])
    coder = on["agents"]["coder"]
    assert coder["jobs"]["completed"] == 6 and coder["rounds_mean"] == 4
    served = sum(calls_after.values()) - sum(calls_before.values())
    assert coder["tool_calls"] == {"count": served, "invalid_json": 0} and served == on["requests"]["completed"] == 24
    with reference_server("--prefix-cache-mb", "0") as url:
        off = reference_run(url, tmp_path / "off")
        assert cache_counters(url)[0] == 0
    assert [off["sessions"]["coder"]["by_turn"][str(k)]["hit_rate"] for k in range(1, 5)] == [0.0] * 4


@pytest.mark.parametrize("change, where, expected", [
    (lambda d: d["target"].update(openai={"api": "completions"}), "workload.classes[0].agent",
     "agents call tools: they need protocol openai (api: chat)"),
    (lambda d: d["target"].update(protocol="kserve-v2"), "workload.classes[0].agent", "not kserve-v2"),
    (lambda d: d["workload"]["classes"][0].update(session={"turns": 2}), "workload.classes[0]", "give agent or session"),
    (lambda d: d["workload"]["classes"][0]["agent"].update(rounds=65), "rounds", "at most 64 rounds"),
    (lambda d: d["workload"]["classes"][0]["agent"].update(fan_out={"at_round": 4, "agents": 2, "rounds": 2}),
     "workload.classes[0].agent", "fan_out.at_round 4: the sub-agents report to the round after it"),
    (lambda d: d["workload"]["classes"][0]["agent"].update(fan_out={"at_round": 1, "agents": 17, "rounds": 2}),
     "agents", "at most 16 sub-agents"),
    (lambda d: d["workload"]["classes"][0]["agent"].update(tools={"count": 129}), "count", "less than or equal to 128"),
    (lambda d: d.update(slos=[{"metric": "job_goodput", "class": "coder", "stat": "p99", "limit_ms": 5}]), "slos[0]",
     "metric job_goodput takes stat fraction (good / measured jobs) or rps"),
])
def test_a_broken_agent_class_names_its_field(tmp_path, change, where, expected):
    from latscope.errors import ScenarioError

    data = agent_scenario("http://127.0.0.1:9", tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}])
    change(data)
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert where in str(info.value) and expected in str(info.value), str(info.value)


def test_an_agent_trace_written_from_a_scenario_replays_its_jobs_round_for_round(tmp_path):
    """`latscope agent-trace` writes the jobs a fan-out agent scenario would send; replaying that file
    (`arrival: {type: trace, format: agents}`) against the scripted server sends exactly its structure:
    each job's round 1 at its start_s (0.25 s apart: exactly on latscope's clock; at the server as latscope
    sent them, within 1 ms at the median), as many rounds as it has, each asking
    for its output_tokens and adding its new_tokens of text (the task, then each tool result), the tool
    waits honoured (exactly on latscope's clock; from the server's last bytes to the next arrival never
    less), and the recorded sub-agents, as many as the trace says, with their rounds."""
    from latscope.trace_writer import trace_lines

    agent = {"rounds": {"dist": "uniform", "min": 2, "max": 4}, "tool_result_tokens": {"dist": "uniform", "min": 5, "max": 12},
             "tool_latency": {"dist": "uniform", "min": "50ms", "max": "150ms"}, "tools": {"count": 1},
             "fan_out": {"at_round": 1, "agents": {"dist": "uniform", "min": 1, "max": 3}, "rounds": {"dist": "uniform", "min": 1, "max": 2}}}
    source = agent_scenario("http://127.0.0.1:9", tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 4}}],
                            agent=agent)
    trace = [json.loads(line) for line in trace_lines(scenario_from_dict(source))]
    assert len(trace) == 4 and {len(j["rounds"]) for j in trace} <= {2, 3, 4}
    log, run_dir = replay(tmp_path, trace, tail_s=2.5)
    base = SUB_AGENT_BASE
    schedule = pd.read_parquet(run_dir / "schedule.parquet")
    jobs: dict[int, list[dict]] = defaultdict(list)
    subs: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for entry in sorted(log, key=lambda e: e["arrived_ns"]):
        seq = request_row(entry["request_id"])
        if seq < base:
            jobs[int(schedule.iloc[seq]["session"])].append(entry)
        else:
            subs[(seq - base) // 64 // 16][(seq - base) // 64 % 16].append(entry)
    assert sorted(jobs) == [0, 1, 2, 3]
    rows = pd.read_parquet(run_dir / "requests.parquet").set_index("row")
    firsts = rows.query("turn == 1 and session < @base").sort_values("session")
    assert (np.diff(firsts["intended_us"].to_numpy()) == 250_000).all()  # on latscope's clock: the trace's starts, exactly
    # At the server, as latscope sent them: a late send is latscope's own, recorded as send lag (a loaded CI box put
    # the arrival gaps 3.1, 2.1 and 2.1 ms off 250 ms), and what is left between two sends and their arrivals is the
    # way over loopback (0.02-0.3 ms here), plus the first connection's set-up in the first gap (0.45-0.87 ms here),
    # which the median of the three leaves out.
    server_gaps_us = np.diff([jobs[j][0]["arrived_ns"] for j in range(4)]) / 1e3
    sent_gaps_us = np.diff(firsts["sent_us"].to_numpy())
    assert statistics.median(abs(server_gaps_us - sent_gaps_us)) < 1000, (server_gaps_us, sent_gaps_us)
    waits = []
    for j, recorded in enumerate(trace):
        sent = jobs[j]
        assert len(sent) == len(recorded["rounds"])
        for k, (entry, planned) in enumerate(zip(sent, recorded["rounds"])):
            assert entry["body"]["max_tokens"] == planned["output_tokens"]
            new_text = entry["body"]["messages"][-1]["content"].split("\n")[-1]  # after a fan-out: the reports first
            assert len(new_text.split()) == planned["new_tokens"]
            if k >= 2:  # round 2 follows the fan-out: no tool wait of its own
                waits.append((entry["arrived_ns"] - sent[k - 1]["ended_ns"]) / 1e6 - planned["tool_s"] * 1000)
                mine, before = rows.loc[request_row(entry["request_id"])], rows.loc[request_row(sent[k - 1]["request_id"])]
                assert abs(mine["intended_us"] - before["end_us"] - planned["tool_s"] * 1e6) <= 1  # exactly, on latscope's clock
        recorded_subs = recorded["sub_agents"]["jobs"]
        assert len(subs[j]) == len(recorded_subs)
        assert sorted(len(rounds) for rounds in subs[j].values()) == sorted(len(s["rounds"]) for s in recorded_subs)
    assert waits and min(waits) >= 0, waits  # at the server: never less (the way back and forth adds to it)
    coder = read_summary(run_dir)["agents"]["coder"]
    assert coder["jobs"]["completed"] == 4 and coder["rounds_mean"] == statistics.mean(len(j["rounds"]) for j in trace)


@pytest.mark.parametrize("line, expected", [
    ('{"start_s": 0, "rounds": []}', "line 2: rounds: List should have at least 1 item"),
    ('{"start_s": -1, "rounds": [{"new_tokens": 5, "output_tokens": 2}]}', "line 2: start_s: Input should be greater than or equal to 0"),
    ('{"start_s": 0, "rounds": [{"new_tokens": 5, "output_tokens": 2, "tool_s": 4000}]}', "line 2: rounds.0.tool_s"),
    ('{"start_s": 0, "rounds": [{"new_tokens": 5, "output_tokens": 2}], "sub_agents": {"at_round": 1, "jobs": [{"rounds": '
     '[{"new_tokens": 1, "output_tokens": 1}]}]}}', "line 2: sub_agents.at_round 1: the sub-agents report to the round after it"),
    ('{"start_s": 0, "block_tokens": 4, "rounds": [{"new_tokens": 9, "output_tokens": 2, "blocks": [1, 2]}]}',
     "line 2: rounds.0: new_tokens 9 is more than its 2 blocks of 4 tokens hold"),
    ('{"start_s": 0, "block_tokens": 1, "rounds": [{"new_tokens": 1, "output_tokens": 2, "blocks": [99999999]}]}',
     "line 2: rounds.0.blocks: ids must be in [0, "),
    ("{not json", "line 2: not JSON"),
])
def test_a_broken_agent_trace_names_its_line_and_field(tmp_path, line, expected):
    from latscope.errors import ScenarioError

    good = '{"start_s": 0, "rounds": [{"new_tokens": 5, "output_tokens": 2}]}'
    (tmp_path / "jobs.jsonl").write_text(f"{good}\n{line}\n")
    data = agent_scenario("http://127.0.0.1:9", tmp_path, [{"name": "replay", "arrival": {
        "type": "trace", "format": "agents", "file": str(tmp_path / "jobs.jsonl")}}])
    with pytest.raises(ScenarioError) as info:
        build_plan(scenario_from_dict(data))
    assert f"agent trace {tmp_path / 'jobs.jsonl'}: {expected}" in str(info.value), str(info.value)


def test_an_agent_trace_phase_sends_agent_jobs_only(tmp_path):
    from latscope.errors import ScenarioError

    data = agent_scenario("http://127.0.0.1:9", tmp_path, [{"name": "replay", "arrival": {
        "type": "trace", "format": "agents", "file": "jobs.jsonl"}}])
    data["workload"]["classes"].append({"name": "chat", "prompt_tokens": 5})
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert "phases[0].classes: an agent trace's arrivals are agent jobs" in str(info.value)
    data["phases"][0]["classes"] = ["coder"]
    scenario_from_dict(data)  # the phase limited to the agent class: fine


def test_closed_loop_agents_run_job_after_job(tmp_path):
    """Three agents for 2 s (`arrival: users`), 2-round jobs with 20 ms tool waits: each agent starts its
    next job when the last ended, so the server never has more than three requests at once, every agent
    runs several jobs, and the counts add up."""
    log: list[dict] = []
    with serve(make_agent_app(log, ttft_ms=10)) as url:
        data = agent_scenario(url, tmp_path, [{"name": "agents", "duration": 2, "arrival": {"type": "users", "users": 3}}],
                              agent={**AGENT, "rounds": 2, "tool_latency": "20ms"})
        summary = run_scenario(scenario_from_dict(data), workers=1).summary
    assert summary["load"]["model"] == "closed" and summary["load"]["users"] == 3
    jobs = summary["agents"]["coder"]["jobs"]
    assert jobs["completed"] > 3 * 5 and jobs["started"] == jobs["completed"] + jobs["cut"] + jobs["abandoned"]
    assert summary["requests"]["sent"] == len(log) and sorted({e["round"] for e in log}) == [1, 2]
    assert max(e["in_flight"] for e in log) <= 3


def test_an_agent_traces_blocks_are_shared_text_across_jobs(tmp_path):
    """Two replayed jobs whose tasks have blocks [1, 2, 3] and [1, 2, 4] (4 tokens a block, 10-token tasks),
    and whose round 2 results reuse block 3 and a new one: the server sees the two tasks' first 8 words
    equal and their last 2 different, and job 2's round 2 result opens with job 1's third block."""
    jobs = [{"start_s": 0, "block_tokens": 4, "rounds": [{"new_tokens": 10, "output_tokens": 2, "blocks": [1, 2, 3]},
                                                          {"new_tokens": 4, "output_tokens": 2, "blocks": [5]}]},
            {"start_s": 0.2, "block_tokens": 4, "rounds": [{"new_tokens": 10, "output_tokens": 2, "blocks": [1, 2, 4]},
                                                            {"new_tokens": 6, "output_tokens": 2, "blocks": [3, 6]}]}]
    log, _ = replay(tmp_path, jobs, tail_s=1)
    tasks = [e["body"]["messages"][0]["content"].split() for e in sorted(log, key=lambda e: e["arrived_ns"]) if e["round"] == 1]
    results = {e["body"]["messages"][0]["content"]: e["body"]["messages"][-1]["content"].split() for e in log if e["round"] == 2}
    assert [len(t) for t in tasks] == [10, 10] and tasks[0][:8] == tasks[1][:8] and tasks[0][8:] != tasks[1][8:]
    first, second = results[" ".join(tasks[0])], results[" ".join(tasks[1])]
    assert len(first) == 4 and len(second) == 6 and second[:2] == tasks[0][8:]  # block 3, as job 1's task had it
    assert first != second[:4]
