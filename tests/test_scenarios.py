"""The shipped protocol scenarios run as written (shortened, on free ports): each launches the
reference server, and what it is for shows in its summary."""

from __future__ import annotations

from pathlib import Path

from latscope.run import run_scenario
from latscope.scenario import load_scenario

from conftest import REPO, free_port


def _run(name: str, tmp_path: Path, *overrides: str, grpc: bool = False) -> dict:
    port, grpc_port = free_port(), free_port()
    scenario = REPO / "scenarios" / f"{name}.yaml"
    command = load_scenario(scenario).target.launch.command.replace("8765", str(port)).replace("8766", str(grpc_port))
    sets = [f"target.url=http://127.0.0.1:{port}", f"target.launch.command={command}",
            f"target.launch.ready_url=http://127.0.0.1:{port}/v2/health/ready", f"output.dir={tmp_path}",
            "output.report=false", *overrides]  # these tests read summaries, never the report
    if grpc:
        sets.append(f"workload.classes.2.url=grpc://127.0.0.1:{grpc_port}")
    return run_scenario(load_scenario(scenario, sets), workers=1).summary


def test_prompt_mix_gives_per_class_percentiles_and_ttft_grows_with_the_prompt(tmp_path):
    s = _run("prompt_mix", tmp_path, "phases.0.duration=2s", "phases.1.duration=12s", "phases.1.arrival.rate=4",
             "slos=[]")
    assert s["requests"]["errors"] == 0 and s["requests"]["completed"] > 30
    ttft = {c: s["metrics"]["ttft"][c]["p50_ms"] for c in ("chat", "rag", "summarize")}
    for metric in ("ttft", "itl", "tpot", "latency"):
        assert {"all", "chat", "rag", "summarize"} <= set(s["metrics"][metric])
    # Prefill cost grows with the prompt (~50, ~400 and ~800 tokens): each class's median TTFT is above the last.
    assert ttft["chat"] < ttft["rag"] < ttft["summarize"], ttft
    assert s["tokens"]["all"]["output_count_source"] == "usage"
    assert s["tokens"]["summarize"]["output_tokens"] == 64 * s["requests_by_class"]["summarize"]["completed"]


def test_trace_replay_sends_the_traces_lengths(tmp_path):
    s = _run("trace_replay", tmp_path, "phases.0.duration=6s")
    assert s["requests"]["errors"] == 0 and s["requests"]["completed"] >= 20
    assert s["tokens"]["all"]["output_count_source"] == "usage"
    import pandas as pd

    schedule = pd.read_parquet(next(tmp_path.glob("trace_replay-*")) / "schedule.parquet")
    assert schedule["prompt_tokens"].nunique() > 10 and schedule["prompt_tokens"].max() <= 768
    assert s["tokens"]["all"]["output_tokens"] == schedule["output_tokens"].sum()  # the server returns max_tokens


def test_serialization_compares_json_binary_and_grpc(tmp_path):
    s = _run("serialization", tmp_path, "phases.1.duration=3s", "phases.2.duration=3s", "phases.3.duration=3s",
             grpc=True)
    assert s["requests"]["errors"] == 0
    m = s["metrics"]
    for cls in ("json", "binary", "grpc"):
        for metric in ("encode", "decode", "network", "server.deser", "server.ser", "server.compute", "server.queue"):
            assert m[metric][cls]["count"] > 10, (metric, cls)
    client = {c: m["encode"][c]["p50_ms"] + m["decode"][c]["p50_ms"] for c in ("json", "binary", "grpc")}
    # 12,288 floats as JSON text cost ~1 µs each to write or read; as raw bytes, a copy.
    assert client["json"] > 20 * max(client["binary"], client["grpc"]), client


def test_chat_sessions_shows_the_prefix_cache_by_turn(tmp_path):
    """Sessions with a shared 256-token system prompt against the reference server (cache on): every
    turn reuses at least the system prompt's blocks, so the hit rate of every turn is over half."""
    s = _run("chat_sessions", tmp_path, "phases.0.duration=6s", "phases.0.arrival.rate=2", "phases.1.duration=6s",
             "workload.classes.0.session.think_time=0.5s")
    chat = s["sessions"]["chat"]
    assert chat["completed"] >= 8 and chat["abandoned"] == 0 and set(chat["by_turn"]) == {"1", "2", "3", "4"}
    assert all(turn["hit_rate"] > 0.5 for turn in chat["by_turn"].values())
    assert s["tokens"]["chat"]["prefix_cache"]["cached_tokens"] > 0


def test_mooncake_replay_sends_the_traces_blocks(tmp_path):
    s = _run("mooncake_replay", tmp_path, "phases.0.duration=8s")
    assert s["requests"]["errors"] == 0 and s["requests"]["completed"] >= 30
    assert s["tokens"]["trace"]["prefix_cache"]["prompt_tokens"] == s["tokens"]["trace"]["prompt_tokens"]
    import pandas as pd

    schedule = pd.read_parquet(next(tmp_path.glob("mooncake_replay-*")) / "schedule.parquet")
    assert schedule["prompt_tokens"].max() <= 512 and schedule["output_tokens"].max() <= 32
