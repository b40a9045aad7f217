"""Recorded agent sessions in the WEKA KV-cache-tester format (the one SemiAnalysis's coding-agent corpora
and aiperf's agentic replay use; its fields as aiperf's adapter documents them) turned into an agent trace,
and replayed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent_server import make_agent_app
from conftest import REPO, serve
from helpers import read_summary
from latscope.errors import ScenarioError
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict
from latscope.weka_trace import convert

SESSION = {
    "id": "s1", "models": ["m"], "block_size": 4, "hash_id_scope": "local", "tool_tokens": 0, "system_tokens": 0,
    "requests": [
        {"t": 0.0, "type": "n", "model": "m", "in": 10, "out": 3, "hash_ids": [1, 2, 3], "api_time": 0.5},
        {"t": 0.6, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "status": "completed",
         "models": ["m"], "requests": [
             {"t": 0.6, "type": "s", "model": "m", "in": 5, "out": 2, "hash_ids": [9, 10]},
             {"t": 1.5, "type": "s", "model": "m", "in": 9, "out": 2, "hash_ids": [9, 10, 11], "think_time": 0.5},
             {"t": 1.9, "type": "subagent", "agent_id": "agent_002", "subagent_type": "x", "status": "completed",
              "models": ["m"], "requests": []}]},
        {"t": 0.6, "type": "subagent", "agent_id": "agent_003", "subagent_type": "x", "status": "async_launched",
         "models": ["m"], "requests": [{"t": 0.7, "type": "n", "model": "m", "in": 3, "out": 1}]},
        {"t": 5.0, "type": "s", "model": "m", "in": 20, "out": 4, "hash_ids": [1, 2, 3, 4, 5], "think_time": 1.5,
         "api_time": 1.0},
        {"t": 8.0, "type": "n", "model": "m", "in": 30, "out": 4, "hash_ids": [1, 2, 3, 4, 5, 6, 7]},
    ]}
GLOBAL = {"id": "s2", "models": ["m"], "block_size": 4, "hash_id_scope": "global",
          "requests": [{"t": 0.0, "type": "n", "model": "m", "in": 6, "out": 2, "hash_ids": [1, 2]}]}


def test_a_weka_session_becomes_a_job_of_its_calls_and_its_sub_agents(tmp_path):
    """Each call a round (new tokens: what the context grew by besides the answer; tool wait: think_time,
    else the gap after the last call's api_time; blocks: the input's ids past the last call's, renumbered
    as first met), the sub-agents between calls 1 and 2 a fan-out after round 1, with the
    async one, the sub-agent's own sub-agent left out and counted."""
    third = {**GLOBAL, "requests": [{**GLOBAL["requests"][0], "hash_ids": [1, 3]}]}
    (tmp_path / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in (SESSION, GLOBAL, third)))
    lines, dropped = convert(tmp_path / "sessions.jsonl", rate=2.0, seed=1)
    first, second, last = (json.loads(line) for line in lines)
    assert first == {"job": "s1", "start_s": 0.0, "block_tokens": 4, "rounds": [  # ids renumbered as first met
        {"new_tokens": 10, "output_tokens": 3, "blocks": [0, 1, 2]},
        {"new_tokens": 7, "output_tokens": 4, "tool_s": 1.5, "blocks": [3, 4]},
        {"new_tokens": 6, "output_tokens": 4, "tool_s": 2.0, "blocks": [5, 6]}],
        "sub_agents": {"at_round": 1, "jobs": [{"rounds": [
            {"new_tokens": 5, "output_tokens": 2, "blocks": [7, 8]},
            {"new_tokens": 2, "output_tokens": 2, "tool_s": 0.5, "blocks": [9]}]}]}}
    assert second["rounds"] == [{"new_tokens": 6, "output_tokens": 2, "blocks": [10, 11]}]  # another scope: other ids
    assert last["rounds"][0]["blocks"] == [10, 12]  # global id 1 is the same block in every session
    assert 0 < second["start_s"] < last["start_s"]
    assert dropped.counts == {"async_launched sub-agents (the parent did not wait for them)": 1,
                              "sub-agents of sub-agents": 1}


def test_the_command_writes_a_trace_that_replays(tmp_path):
    """`latscope weka-trace` writes the trace and says what it left out; replayed against the scripted
    agent server, the session's job completes with its three rounds and its sub-agent's two."""
    (tmp_path / "s1.json").write_text(json.dumps(SESSION))
    out = subprocess.run([sys.executable, "-m", "latscope.cli", "weka-trace", str(tmp_path / "s1.json"),
                          str(tmp_path / "jobs.jsonl")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "1 agent jobs" in out.stdout and "left out: 1 async_launched sub-agents" in out.stdout
    log: list[dict] = []
    with serve(make_agent_app(log, ttft_ms=1)) as url:
        data = {"name": "weka", "seed": 1,
                "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5},
                "workload": {"classes": [{"name": "coder", "agent": {"rounds": 1}}]},
                "phases": [{"name": "replay", "arrival": {"type": "trace", "format": "agents", "file": str(tmp_path / "jobs.jsonl")}},
                           {"name": "tail", "duration": 6, "arrival": {"type": "idle"}}],
                "output": {"dir": str(tmp_path / "results"), "report": False}}
        result = run_scenario(scenario_from_dict(data), workers=1)
    coder = read_summary(result.run_dir)["agents"]["coder"]
    assert coder["jobs"]["completed"] == 1 and coder["requests_mean"] == 3 + 2 and len(log) == 5
    assert [e["body"]["max_tokens"] for e in sorted(log, key=lambda e: e["arrived_ns"])] == [3, 2, 2, 4, 4]


@pytest.mark.parametrize("session, expected", [
    ({"requests": [{"type": "x"}], "block_size": 4}, "requests[0]: `type` must be n, s or subagent, got 'x'"),
    ({"requests": [{"type": "n", "t": 0, "in": -1, "out": 1}], "block_size": 4}, "`in` must be a number ≥ 0, got -1"),
    ({"requests": "no"}, "not a session (an object with a `requests` list)"),
])
def test_a_broken_session_names_its_file_and_field(tmp_path, session, expected):
    (tmp_path / "s.json").write_text(json.dumps(session))
    with pytest.raises(ScenarioError) as info:
        convert(tmp_path / "s.json", 1.0)
    assert f"WEKA trace {tmp_path / 's.json'}" in str(info.value) and expected in str(info.value), str(info.value)
