"""The shipped protocol scenarios run as written (shortened, on free ports): each launches the
reference server, and what it is for shows in its summary."""

from __future__ import annotations

from pathlib import Path

from latscope.run import run_scenario
from latscope.scenario import load_scenario

from conftest import REPO, free_port


def _run(name: str, tmp_path: Path, *overrides: str, grpc: bool = False, command_sub: tuple[str, str] = ("", "")) -> dict:
    """`command_sub`: (old, new) text replaced in the scenario's launch command too."""
    port, grpc_port = free_port(), free_port()
    scenario = REPO / "scenarios" / f"{name}.yaml"
    command = load_scenario(scenario).target.launch.command.replace("8765", str(port)).replace("8766", str(grpc_port))
    command = command.replace(*command_sub) if command_sub[0] else command
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


def _all_completed(summary: dict, **at_least: int) -> dict[str, int]:
    """Every request the plan scheduled outside warm-up completed, none failed; the classes' counts,
    each at least as many as given (the scenarios are seeded: their plans are the same every run)."""
    assert summary["requests"]["errors"] == 0, summary["error_examples"]
    by_class = summary["requests_by_class"]
    done = {c: by_class[c]["completed"] for c in at_least}
    assert all(by_class[c]["completed"] == by_class[c]["scheduled"] >= n for c, n in at_least.items()), by_class
    return done


def test_reasoning_chat_times_the_answer_after_the_reasoning(tmp_path):
    """48 reasoning tokens before the answer for `think`, none for `quick` (the same server): think's
    first output token comes a reasoning span after its first token; quick's is its first token."""
    s = _run("reasoning_chat", tmp_path, "phases.0.duration=1s", "phases.1.duration=6s", "phases.1.arrival.rate=3",
             "slos=[]")
    done = _all_completed(s, think=15, quick=2)  # the seeded plan: 19 and 3
    m, tokens = s["metrics"], s["tokens"]
    assert m["reasoning_time"]["think"]["count"] == done["think"]  # every think stream reasoned, then answered
    assert m["reasoning_time"].get("quick", {"count": 0})["count"] == 0
    assert m["ttfot"]["quick"] == m["ttft"]["quick"]  # no reasoning: the first token is the answer's
    # 47 gaps between 48 reasoning tokens lie between think's first token and its first answer token
    assert m["ttfot"]["think"]["min_ms"] > m["ttft"]["think"]["min_ms"] + 47 * m["itl"]["think"]["min_ms"]
    assert tokens["think"]["reasoning_tokens"] == 48 * done["think"]  # the server's usage says it
    assert tokens["think"]["output_tokens"] == 80 * done["think"] and tokens["quick"]["output_tokens"] == 32 * done["quick"]


def _reasons_then_answers(name: str, tmp_path) -> tuple[dict, int]:
    """Scenario `name`'s `ask` class, 5 s at 3/s: at least 10 streams done, every one with the usage's 48
    output tokens, 16 of them reasoning, timed: its first output token more than 15 gaps after its first
    token. The summary's metrics and how many were done."""
    s = _run(name, tmp_path, "phases.0.duration=1s", "phases.1.duration=5s", "phases.1.arrival.rate=3", "slos=[]")
    done = _all_completed(s, ask=10)["ask"]
    t = s["tokens"]["ask"]
    assert t["output_count_source"] == "usage" and t["output_tokens"] == 48 * done and t["reasoning_tokens"] == 16 * done
    m = s["metrics"]
    assert m["reasoning_time"]["ask"]["count"] == done
    assert m["ttfot"]["ask"]["min_ms"] > m["ttft"]["ask"]["min_ms"] + 15 * m["itl"]["ask"]["min_ms"]
    return m, done


def test_responses_streams_reasoning_then_the_answer_with_usage(tmp_path):
    m, done = _reasons_then_answers("responses", tmp_path)  # the seeded plan: 13 done
    assert m["ttft"]["ask"]["count"] == m["ttfot"]["ask"]["count"] == done


def test_messages_streams_thinking_then_text(tmp_path):
    # The API says no reasoning count: the 16 thinking_delta chunks are counted.
    _reasons_then_answers("messages", tmp_path)  # the seeded plan: 12 done


def test_embeddings_sends_batches_and_counts_inputs(tmp_path):
    s = _run("embeddings", tmp_path, "phases.0.duration=1s", "phases.1.duration=6s", "workload.classes.1.weight=4",
             "slos=[]")
    done = _all_completed(s, query=14, ingest=5)  # the seeded plan: 18 and 7
    query, ingest = s["batch"]["query"], s["batch"]["ingest"]
    assert query["unit"] == "inputs" and query["items"] == query["completed"] == done["query"]
    assert ingest["completed"] == done["ingest"] and 4 <= ingest["items_per_request"] <= 16
    # each input of a request has one length in [32, 128] words, one token each on the reference server,
    # whose usage counts them
    assert 32 * ingest["items"] <= ingest["input_tokens"] <= 128 * ingest["items"]
    assert 8 * query["items"] <= query["input_tokens"] <= 32 * query["items"]


def test_rerank_sends_eight_documents_a_request(tmp_path):
    s = _run("rerank", tmp_path, "phases.0.duration=1s", "phases.1.duration=6s", "slos=[]")
    done = _all_completed(s, rerank=12)["rerank"]  # the seeded plan: 17
    r = s["batch"]["rerank"]
    assert r["completed"] == done and r["unit"] == "documents" and r["items"] == 8 * done
    assert s["metrics"]["latency"]["rerank"]["count"] == r["completed"]


def test_adapter_mix_groups_by_model_and_names_the_costly_adapter(tmp_path):
    """Equal weights here (the scenario gives tenant-a 82 %), so each adapter has some requests in 14 s;
    tenant-c's adapter 8x as costly (the scenario's: 4x) and 16-token answers, so that its cost stands out
    of a busy box's noise in a few requests."""
    s = _run("adapter_mix", tmp_path, "phases.0.duration=2s", "phases.1.duration=14s", "phases.1.arrival.rate=1.5",
             *(f"workload.classes.{i}.{field}" for i in range(4) for field in ("weight=1", "output_tokens=16")),
             "slos=[]", command_sub=("tenant-c=4", "tenant-c=8"))
    done = _all_completed(s, **{"tenant-a-chat": 8, "tenant-a-rag": 8, "tenant-b": 3, "tenant-c": 4})  # plan: 10, 11, 4, 5
    models = s["models"]
    assert models["by_model"]["tenant-a"]["classes"] == ["tenant-a-chat", "tenant-a-rag"]
    assert {m: g["requests"]["completed"] for m, g in models["by_model"].items()} == {
        "tenant-a": done["tenant-a-chat"] + done["tenant-a-rag"], "tenant-b": done["tenant-b"], "tenant-c": done["tenant-c"]}
    fairness = {f["metric"]: f for f in models["fairness"]}
    assert set(fairness) == {"ttft", "latency"}
    # A tenant-c token takes 8 of its batch's decode steps, a tenant-a token 1 (generation.py, cost factors).
    # Each model's fastest stream decoded alone, or nearly (1.5 req/s, 16-token answers): its TPOT is 8 and
    # 1 batch-of-one steps, ~8x (measured 5.1-10.5x in six runs). The p50s are not compared: tenant-a's
    # streams meet other requests' prefills (300-token RAG prompts) between their steps more often than
    # the few tenant-c ones, and their ratio was 2.7-6.4x (CI saw 2.85x).
    fastest = {m: g["metrics"]["tpot"]["min_ms"] for m, g in models["by_model"].items()}
    assert fastest["tenant-c"] > 3 * fastest["tenant-a"], fastest
    assert fairness["latency"]["worst"] == "tenant-c" and fairness["latency"]["ratio"] > 2


def test_agents_runs_jobs_whose_hit_rate_climbs_by_round(tmp_path):
    """The shipped agent scenario, shortened: jobs complete with their tool calls, fan-outs and job
    times, and the prefix cache's hit rate climbs from round 1 to round 3, the fan-out's (every job has four
    rounds or more)."""
    s = _run("agents", tmp_path, "phases.0.duration=8s", "phases.0.arrival.rate=1", "phases.1.duration=10s")
    assert s["requests"]["errors"] == 0
    coder = s["agents"]["coder"]
    assert coder["jobs"]["completed"] >= 4 and coder["jobs"]["completed"] == coder["jobs"]["started"]
    assert coder["job_time"]["count"] == coder["jobs"]["completed"] and 4 <= coder["rounds_mean"] <= 6
    assert coder["tool_calls"]["count"] > 0 and coder["tool_calls"]["invalid_json"] == 0
    rounds = s["sessions"]["coder"]["by_turn"]
    assert rounds["1"]["hit_rate"] < rounds["2"]["hit_rate"] < rounds["3"]["hit_rate"]
    assert s["slo"] and all(v["passed"] for v in s["slo"]), s["slo"]


def test_agents_replay_sends_the_traces_jobs(tmp_path):
    """The shipped agent trace replayed four times faster: all 26 jobs complete, with the trace's rounds."""
    import json

    jobs = [json.loads(line) for line in (REPO / "data" / "agent_jobs.jsonl").read_text().splitlines()]
    s = _run("agents_replay", tmp_path, "phases.0.arrival.speedup=4", "phases.1.duration=10s")
    assert s["requests"]["errors"] == 0
    coder = s["agents"]["coder"]
    assert coder["jobs"]["completed"] == coder["jobs"]["started"] == len(jobs) == 26
    assert coder["rounds_mean"] == round(sum(len(j["rounds"]) for j in jobs) / len(jobs), 3)
