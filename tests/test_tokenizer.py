"""workload.tokenizer (latscope/tokenizer.py) and the token counts a run reports (intervals.py,
run/token_counts.py): with a tokenizer.json trained here (tests/helpers.build_tokenizer, never
downloaded), dataset prompts' planned lengths are exactly what a server counting with the same
tokenizer counts; against servers on loopback that add a template's tokens, stop answers early or
send no usage, summary.json's count sources and differences are exactly what the server did (its
own log, request by request, joined to the plan by X-Request-Id)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from aiohttp import web
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HfTokenizer

from conftest import serve
from helpers import TEST_CHAT_TEMPLATE, build_tokenizer
from latscope.errors import ScenarioError
from latscope.plan import build_plan
from latscope.records import Request
from latscope.request_ids import request_row
from latscope.run import run_scenario
from latscope.run.token_counts import count_lines
from latscope.scenario import load_scenario
from latscope.tokenizer import load_tokenizer
from latscope.workload import Payloads

PROMPTS = ["What is the time?", "Tell me about the world, and its people.", "Hi", "Write a poem about the old man.",
           "Why did they come back here after all these years, when nobody else would ever go there again?",
           "Zebra zebra ünïcode ✓ …", "Explain how a state could be both good and very little, more or less.",
           "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d / "tokenizer.json", TEST_CHAT_TEMPLATE)
    build_tokenizer(d / "plain.json")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    return d


def hf(path: Path) -> HfTokenizer:
    """The test tokenizer as a server would load it, without latscope."""
    doc = json.loads(path.read_text())
    doc.pop("chat_template", None)
    return HfTokenizer.from_str(json.dumps(doc))


def rendered(text: str) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEST_CHAT_TEMPLATE).render(messages=[{"role": "user", "content": text}],
                                                      add_generation_prompt=True, bos_token="", eos_token="")


def scenario(files: Path, url: str = "http://127.0.0.1:9", *, classes: list[dict], tokenizer: dict | None = None,
             rate: float = 30, duration: float = 1.0, **options) -> dict:
    data = {"name": "tok", "seed": 3, "base_dir": str(files),
            "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5, "request_id_header": "X-Request-Id",
                       "openai": options or {}},
            "workload": {"classes": classes},
            "phases": [{"name": "p", "duration": duration, "arrival": {"type": "constant", "rate": rate}}],
            "output": {"dir": str(files / "results"), "report": False}}
    if tokenizer is not None:
        data["workload"]["tokenizer"] = tokenizer
    return data


def load(data: dict):
    """The scenario written as a YAML file in the files' folder and loaded: its relative paths (the
    dataset, the tokenizer) resolve against that folder, as a user's do."""
    path = Path(data["base_dir"]) / "scenario.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if k != "base_dir"}))
    return load_scenario(path)


# -- the tokenizer and the plan -------------------------------------------------------------------


def test_a_dataset_class_plans_each_prompt_at_its_exact_count_picked_and_cut_by_length(files):
    """Plan row i's prompt_tokens is the count of the very text Payloads sends for it: BOS + tokens
    (completions), the rendered template (chat). min/max_tokens leave prompts out; `cut` cuts them."""
    tok = hf(files / "tokenizer.json")
    for api, count in (("completions", lambda t: len(tok.encode(t).ids)),
                       ("chat", lambda t: len(tok.encode(rendered(t), add_special_tokens=False).ids))):
        counts = {p: count(p) for p in PROMPTS}
        low, high = sorted(counts.values())[2], sorted(counts.values())[-3]
        for dataset, check in (({"min_tokens": low, "max_tokens": high}, lambda n: low <= n <= high),
                               ({"max_tokens": low, "cut": True}, lambda n: n <= low)):
            s = load(scenario(files, classes=[{"name": "d", "output_tokens": 4,
                                               "dataset": {"file": "prompts.jsonl", **dataset}}],
                              tokenizer={"file": "tokenizer.json", "chat_template": True}, api=api))
            plan, payloads = build_plan(s), Payloads(s)
            sent = set()
            for i in range(len(plan)):
                text = payloads.get(Request(i, 0, 0, False, int(plan.prompt_tokens[i]), 4, int(plan.item[i]))).prompt
                assert count(text) == plan.prompt_tokens[i] and check(int(plan.prompt_tokens[i]))
                sent.add(text)
            if "cut" in dataset:  # every prompt kept; the long ones a prefix of themselves, at the limit or under
                assert len(sent) == len(PROMPTS) and all(any(p.startswith(t) for p in PROMPTS) for t in sent)
                assert any(t not in PROMPTS for t in sent)
            else:
                assert sent == {p for p, n in counts.items() if low <= n <= high}


def test_a_tokenizer_problem_names_the_scenario_field(files, monkeypatch):
    base = {"classes": [{"name": "d", "dataset": {"file": "prompts.jsonl", "min_tokens": 3}}]}
    with pytest.raises(ScenarioError, match=r"workload\.classes\[0\]\.dataset\.min_tokens: .*needs a tokenizer"):
        load(scenario(files, classes=base["classes"]))
    with pytest.raises(ScenarioError, match=r"workload\.tokenizer\.file: tokenizer file .*missing\.json: not found"):
        load_tokenizer(load(scenario(files, classes=base["classes"], tokenizer={"file": "missing.json"})))
    with pytest.raises(ScenarioError, match=r"workload\.tokenizer\.chat_template: .*carries no `chat_template`"):
        load_tokenizer(load(scenario(files, classes=base["classes"], tokenizer={"file": "plain.json", "chat_template": True})))
    with pytest.raises(ScenarioError, match=r"dataset\.max_tokens: no prompt of prompts\.jsonl is between 0 and 1 tokens"):
        build_plan(load(scenario(files, classes=[{"name": "d", "dataset": {"file": "prompts.jsonl", "max_tokens": 1}}],
                                 tokenizer={"file": "plain.json"})))
    (files / "fresh.json").write_text((files / "plain.json").read_text())  # not loaded yet in this process
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)  # as if the extra were not installed
    with pytest.raises(ScenarioError, match=r"workload\.tokenizer\.file: .*pip install 'latscope\[tokenizer\]'"):
        load_tokenizer(load(scenario(files, classes=base["classes"], tokenizer={"file": "fresh.json"})))


# -- runs against servers that count with the same tokenizer --------------------------------------


def counting_app(tokenizer_path: Path, log: list[dict], *, overhead=lambda n: 0, stop=lambda n, asked: asked,
                 usage: bool = True) -> web.Application:
    """An OpenAI chat server counting prompts as vLLM does (the template rendered, its tokens counted),
    plus `overhead(n)` tokens (n: the request's number); its answer is `stop(n, max_tokens)` tokens
    of text, streamed or whole, with usage or without. Logs each request's counts."""
    tok = hf(tokenizer_path)
    words = [t for t in ("the", " of", " and", " to", " in", " is", " that", " for")
             if len(tok.encode(t, add_special_tokens=False).ids) == 1]  # one token each
    state = {"n": 0}

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = state["n"] = state["n"] + 1
        if "messages" in body:
            prompt = len(tok.encode(rendered(body["messages"][-1]["content"]), add_special_tokens=False).ids)
        else:
            prompt = len(tok.encode(body["prompt"]).ids)
        prompt += overhead(n)
        generated = stop(n, body.get("max_tokens") or 8)
        pieces = [words[i % len(words)] for i in range(generated)]
        text = "".join(pieces)
        log.append({"n": n, "row": request_row(request.headers["X-Request-Id"]), "prompt": prompt, "generated": generated,
                    "counted": len(tok.encode(text, add_special_tokens=False).ids), "asked": body.get("max_tokens")})
        counts = {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
        if not body.get("stream"):
            doc = {"choices": [{"message": {"role": "assistant", "content": text}}], **({"usage": counts} if usage else {})}
            return web.json_response(doc)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(b"data: %s\n\n" % json.dumps({"choices": [{"delta": {"content": piece}}]}).encode())
            await asyncio.sleep(0)
        if usage:
            await response.write(b"data: %s\n\n" % json.dumps({"choices": [], "usage": counts}).encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


def run(files: Path, app_log: list, data: dict, app: web.Application, workers: int = 1) -> tuple[dict, pd.DataFrame]:
    with serve(app) as url:
        data["target"]["url"] = url
        result = run_scenario(load(data), workers=workers)
    schedule = pd.read_parquet(result.run_dir / "schedule.parquet")
    log = pd.DataFrame(app_log)
    log["planned_prompt"] = schedule["prompt_tokens"].to_numpy()[log["row"]]
    log["class"] = schedule["class"].to_numpy()[log["row"]]
    records = pd.read_parquet(result.run_dir / "requests.parquet").set_index("row")
    at = records.index.get_indexer(log["row"])
    log["prompt_count"] = records["prompt_count"].astype(object).to_numpy()[at]
    log["output_count"] = records["output_count"].astype(object).to_numpy()[at]
    return result.summary, log


def test_dataset_prompts_planned_lengths_equal_the_servers_counts_exactly(files):
    """Chat with the model's template: the server's count of every request equals the plan's, so the
    summary says usage, 0 differences; answers of every token asked: none short, no hint."""
    log: list[dict] = []
    data = scenario(files, classes=[{"name": "d", "output_tokens": 6, "dataset": {"file": "prompts.jsonl"}}],
                    tokenizer={"file": "tokenizer.json", "chat_template": True})
    summary, frame = run(files, log, data, counting_app(files / "tokenizer.json", log))
    assert len(frame) >= 30 and (frame["prompt"] == frame["planned_prompt"]).all()
    assert set(frame["prompt_count"]) == set(frame["output_count"]) == {"usage"}  # requests.parquet, row by row
    counts = summary["tokens"]["d"]["counts"]
    assert counts["prompt"] == {"source": "usage", "from_usage": len(frame), "from_plan": 0, "checked": len(frame),
                                "differ": 0, "mean_difference": 0.0, "worst_difference": 0}
    assert counts["output"]["source"] == "usage" and counts["output"]["checked"] == len(frame)
    assert counts["output"]["short"] == 0 and counts["output"]["hint"] is None
    assert summary["tokens"]["d"]["prompt_tokens"] == int(frame["prompt"].sum())


def test_a_template_overhead_and_early_stops_are_reported_as_the_server_did_them(files):
    """A server that counts K more tokens than the plan (a template the scenario did not give; more on
    some requests, fewer on others) and ends some answers early, with two workers (their counters
    merged: the worst difference is a maximum, not a sum): mean and worst difference, the short
    answers and their mean shortfall are exactly the server's log's."""
    log: list[dict] = []
    data = scenario(files, classes=[{"name": "d", "output_tokens": 5, "dataset": {"file": "prompts.jsonl"}},
                                    {"name": "s", "prompt_tokens": 9, "output_tokens": 7}],
                    tokenizer={"file": "tokenizer.json"}, rate=40, duration=1.5)
    app = counting_app(files / "tokenizer.json", log, overhead=lambda n: -2 if n % 3 == 0 else 5 + n % 4,
                       stop=lambda n, asked: asked - n % 3)
    summary, frame = run(files, log, data, app, workers=2)
    for name in ("d", "s", "all"):
        mine = frame if name == "all" else frame[frame["class"] == name]
        diff = mine["prompt"] - mine["planned_prompt"]
        short = mine[mine["generated"] < mine["asked"]]
        counts = summary["tokens"][name]["counts"]
        worst = int(diff.max()) if diff.max() >= -diff.min() else int(diff.min())
        assert counts["prompt"] == {"source": "usage", "from_usage": len(mine), "from_plan": 0, "checked": len(mine),
                                    "differ": int((diff != 0).sum()), "mean_difference": round(diff.mean(), 3),
                                    "worst_difference": worst}
        assert worst == diff.max() > 3 and counts["output"]["checked"] == len(mine)  # the 3 template tokens, + 2..8
        assert counts["output"]["short"] == len(short) > 0 and counts["output"]["long"] == 0
        assert counts["output"]["mean_shortfall"] == round((short["asked"] - short["generated"]).mean(), 3)
        assert "ignore_eos" in counts["output"]["hint"]
    p, o = summary["tokens"]["d"]["counts"]["prompt"], summary["tokens"]["d"]["counts"]["output"]
    lines = count_lines(summary["tokens"])
    at = lines.index(next(line for line in lines if line.startswith("token counts d:")))
    assert lines[at:at + 2] == [
        f"token counts d: prompt from the server's usage (server vs plan: mean {p['mean_difference']:+g}, worst "
        f"{p['worst_difference']:+d} tokens, {p['differ']:,} of {p['checked']:,} differ); output from the server's usage "
        f"({o['short']:,} of {o['checked']:,} shorter than max_tokens, {o['mean_shortfall']:g} tokens short on average)",
        f"  hint: {o['hint']}"]


def test_without_usage_prompts_come_from_the_plan_and_answers_from_the_tokenizer(files):
    """No usage, streamed and whole answers: the prompt source is the tokenizer (dataset) or the plan
    (synthetic), never passed off as the server's; every answer's count is the tokenizer's count of
    its text, the same as the server's own count of what it sent."""
    log: list[dict] = []
    data = scenario(files, classes=[{"name": "d", "output_tokens": 6, "dataset": {"file": "prompts.jsonl"}},
                                    {"name": "s", "prompt_tokens": 9, "output_tokens": 4, "openai": {"stream": False}}],
                    tokenizer={"file": "tokenizer.json"})
    summary, frame = run(files, log, data, counting_app(files / "tokenizer.json", log, usage=False))
    for name, prompt_source in (("d", "tokenizer"), ("s", "plan")):
        mine = frame[frame["class"] == name]
        counts = summary["tokens"][name]["counts"]
        assert counts["prompt"]["source"] == prompt_source and counts["prompt"]["from_plan"] == len(mine) > 5
        assert counts["prompt"]["checked"] == 0 and counts["prompt"]["mean_difference"] is None
        assert counts["output"]["source"] == "tokenizer" and counts["output"]["by_tokenizer"] == len(mine)
        assert summary["tokens"][name]["output_tokens"] == int(mine["counted"].sum())
        assert summary["tokens"][name]["output_count_source"] == "tokenizer"
    assert summary["tokens"]["all"]["counts"]["prompt"]["source"] == "mixed"
    assert set(frame["prompt_count"]) == {"plan"} and set(frame["output_count"]) == {"tokenizer"}
    checked = summary["tokens"]["d"]["counts"]["output"]["checked"]
    assert f"token counts d: prompt from workload.tokenizer (the server sent no usage); output from workload.tokenizer " \
           f"(the server sent no usage) (0 of {checked} shorter than max_tokens)" in count_lines(summary["tokens"])


def test_without_a_tokenizer_a_whole_answer_without_usage_is_not_counted_and_says_so(files):
    log: list[dict] = []
    data = scenario(files, classes=[{"name": "s", "prompt_tokens": 9, "output_tokens": 4}], stream=False)
    summary, frame = run(files, log, data, counting_app(files / "tokenizer.json", log, usage=False))
    counts = summary["tokens"]["s"]["counts"]
    assert counts["prompt"]["source"] == "plan" and counts["output"]["source"] == "none"
    assert counts["output"]["uncounted"] == len(frame) > 5
    assert set(frame["prompt_count"]) == {"plan"} and frame["output_count"].isna().all()  # null: not counted
    assert np.all(frame["planned_prompt"] == 9)


# -- the counters on their own ------------------------------------------------------------------


def test_a_sessions_turn_counts_its_source_but_is_not_compared_and_worst_differences_merge_by_the_larger():
    """A turn sends its history besides its planned text: counted as the server's, not compared. The
    worst-difference counters of two rows merge as the larger (summed they would say 12, not 7)."""
    from latscope.intervals import IntervalRecorder
    from latscope.records import Conversation, Outcome
    from latscope.results import schema

    recorder = IntervalRecorder(["c"])
    turn = Request(0, 0, 0, False, prompt_tokens=10, output_tokens=4, turn=2,
                   session=Conversation(id=0, cls=0, carry=True, prefix=-1, turns=3, started_ns=0))
    recorder.record(turn, Outcome(1000, 2000, status=200, prompt_tokens=90, prompt_from_usage=True, output_tokens=4,
                                  tokens_from_usage=True, token_ns=[1500]))
    for above in (5, 7):
        recorder.record(Request(1, 0, 0, False, prompt_tokens=10, output_tokens=4),
                        Outcome(1000, 2000, status=200, prompt_tokens=10 + above, prompt_from_usage=True,
                                output_tokens=3, tokens_from_usage=True, token_ns=[1500]))
    row = np.asarray(recorder.take(0, 0).counters[(0, False)], np.int64)
    assert [int(row[i]) for i in (schema.PROMPT_FROM_USAGE, schema.PROMPT_CHECKED, schema.PROMPT_ABOVE,
                                  schema.PROMPT_ABOVE_MAX, schema.OUTPUT_SHORT, schema.OUTPUT_SHORT_TOKENS)] == [3, 2, 12, 7, 2, 2]
    other = row.copy()
    other[schema.PROMPT_ABOVE_MAX] = 5
    merged = schema.add_counters(other, row)
    assert merged[schema.PROMPT_ABOVE_MAX] == 7 and merged[schema.PROMPT_ABOVE] == 24
