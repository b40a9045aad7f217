"""The openai-embeddings client against an aiohttp server on loopback that records every request body:
the bodies field by field, the batch and token counts exactly, every malformed answer a `protocol`
error with its reason, the scenario's checks, and a short real run's inputs/s in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from events_server import PHASE, batch_scenario, send
from events_server import request as planned
from latscope.console import batch_lines
from latscope.errors import ScenarioError
from latscope.records import Request
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict
from latscope.workload import VOCABULARY

from conftest import serve
from helpers import read_summary


def _scenario(url: str, classes: list[dict], tmp_path: Path | None = None, phases: list[dict] | None = None,
              **target) -> object:
    target = {"url": url, "protocol": "openai-embeddings", "model": "e5", "timeout": 5, **target}
    return batch_scenario("embed", 5, target, classes, tmp_path, phases)


def _request(seq: int, cls: int = 0, prompt_tokens: int = 6, item: int = 1000) -> Request:
    return planned(seq, cls, prompt_tokens, 0, item=item)


def _app(seen: list[dict]) -> web.Application:
    """Embeds each input as [words, 1.0, 2.0]; usage counts 2 tokens per input beyond its words (a
    BERT-style [CLS] ... [SEP]). The model names a way to answer wrongly."""

    async def handle(request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        seen.append({"path": request.path, "headers": dict(request.headers), "body": doc})
        inputs, model = doc["input"], doc.get("model")
        data = [{"object": "embedding", "index": i, "embedding": [float(len(t.split())), 1.0, 2.0]}
                for i, t in enumerate(inputs)]
        usage = {"prompt_tokens": sum(len(t.split()) + 2 for t in inputs)}
        usage["total_tokens"] = usage["prompt_tokens"]
        answer: object = {"object": "list", "data": data, "model": model, "usage": usage}
        match model:
            case "short":
                answer["data"] = data[:-1]
            case "twice":
                data[-1]["index"] = 0
            case "ragged":
                data[1]["embedding"] = [1.0]
            case "empty-vector":
                data[2]["embedding"] = []
            case "no-data":
                answer = {"object": "list", "model": model}
            case "error-200":
                answer = {"error": {"message": "model is loading"}}
            case "no-usage":
                del answer["usage"]
            case "base64":
                for entry in data:
                    entry["embedding"] = "AACAPwAAAEA="
            case "not-json":
                return web.Response(text="<html>busy</html>", content_type="text/html")
            case "http-400":
                return web.json_response({"error": {"message": "input is too long for the model"}}, status=400)
            case "http-400-empty":
                return web.Response(status=400)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/embeddings", handle)
    return app


def test_request_bodies_counts_and_usage(tmp_path):
    seen: list[dict] = []
    dataset_rows = [f"row {i} " + "word " * i for i in range(10)]
    tmp = tmp_path / "rows.jsonl"
    tmp.write_text("".join(json.dumps({"text": r}) + "\n" for r in dataset_rows))
    classes = [{"name": "fixed", "batch": 4, "embeddings": {"encoding_format": "float", "extra_body": {"dimensions": 3}}},
               {"name": "drawn", "batch": {"dist": "uniform", "min": 2, "max": 9}, "model": "no-usage"},
               {"name": "rows", "batch": 3, "dataset": {"file": str(tmp)}, "model": "base64"}]
    # one request of class 0; 12 of class 1 with items 77..88 and again item 77; one of class 2 from row 8
    requests = [_request(0, 0), *(_request(1 + k, 1, 5, item=77 + k) for k in range(12)), _request(13, 1, 5, item=77),
                _request(14, 2, 0, item=8)]
    with serve(_app(seen)) as url:
        outcomes = send(_scenario(url, classes, api_key="sk-embed"), requests)
    assert all(o.error is None for o in outcomes), [o.reason for o in outcomes]
    first = seen[0]
    assert first["path"] == "/v1/embeddings"
    assert first["headers"]["Authorization"] == "Bearer sk-embed" and first["headers"]["Content-Type"] == "application/json"
    inputs = first["body"].pop("input")
    assert first["body"] == {"model": "e5", "encoding_format": "float", "dimensions": 3}  # nothing else, in this order
    assert list(seen[0]["body"]) == ["model", "encoding_format", "dimensions"]
    # 4 inputs of the request's 6 words each, every word one of the one-token vocabulary, disjoint slices
    assert [len(t.split()) for t in inputs] == [6] * 4 and len(set(inputs)) == 4
    assert all(w in VOCABULARY for t in inputs for w in t.split())
    o = outcomes[0]
    assert (o.items, o.prompt_tokens, o.prompt_from_usage) == (4, 4 * (6 + 2), True)
    assert requests[0].prompt_tokens == 24  # the plan's count of the whole batch: 4 inputs x 6
    assert o.output_tokens == 0 and o.token_ns is None and o.encode_ns > 0 and o.decode_ns > 0
    assert o.bytes_out == len(json.dumps({"model": "e5", "input": inputs, "encoding_format": "float", "dimensions": 3},
                                         separators=(",", ":")))

    # drawn batch sizes: each request's body holds exactly its Outcome.items inputs of 5 words; sizes vary
    # within [2, 9] and are a function of the plan's item (the same item, the same batch)
    drawn = list(zip(requests[1:14], outcomes[1:14], seen[1:14]))
    for request, outcome, got in drawn:
        assert got["body"]["model"] == "no-usage" and set(got["body"]) == {"model", "input"}
        assert len(got["body"]["input"]) == outcome.items and 2 <= outcome.items <= 9
        assert {len(t.split()) for t in got["body"]["input"]} == {5}
        assert request.prompt_tokens == 5 * outcome.items  # planned, no usage: not passed off as the server's
        assert (outcome.prompt_tokens, outcome.prompt_from_usage) == (0, False)
    sizes = [o.items for _, o, _ in drawn]
    assert len(set(sizes)) >= 3 and sizes[-1] == sizes[0] and seen[13]["body"]["input"] == seen[1]["body"]["input"]

    # dataset rows: 3 consecutive rows from the item on (8, 9, 0), no planned length; base64 vectors accepted
    rows = seen[14]["body"]["input"]
    assert rows == [dataset_rows[8], dataset_rows[9], dataset_rows[0]]
    assert outcomes[14].items == 3 and requests[14].prompt_tokens == 0
    assert outcomes[14].prompt_tokens == sum(len(r.split()) + 2 for r in rows) and outcomes[14].prompt_from_usage


@pytest.mark.parametrize("model, kind, words", [
    ("short", "protocol", "3 embeddings for a batch of 4 inputs"),
    ("twice", "protocol", "data[3] has index 0: each of 0..3 must come once"),
    ("ragged", "protocol", "data[1]'s embedding has 1 numbers, data[0]'s 3"),
    ("empty-vector", "protocol", "data[2] has no embedding"),
    ("no-data", "protocol", "response has no data list"),
    ("error-200", "protocol", "error in a 200 response: model is loading"),
    ("not-json", "protocol", "response is not JSON: <html>busy</html>"),
    ("http-400", "http_4xx", "HTTP 400 Bad Request: input is too long for the model"),
])
def test_malformed_answers_are_errors_that_say_why(model, kind, words):
    with serve(_app([])) as url:
        (outcome,) = send(_scenario(url, [{"name": "c", "batch": 4, "model": model}]), [_request(0)])
    assert outcome.error == kind and words in outcome.reason, outcome.reason
    assert outcome.items == 4 and not outcome.prompt_from_usage


@pytest.mark.parametrize("cls, field, words", [
    ({"batch": 4, "output_tokens": 8}, "output_tokens", "openai-embeddings generates no text"),
    ({"query_tokens": 4}, "query_tokens", "`query_tokens` is for protocol rerank, not openai-embeddings"),
    ({"batch": {"dist": "uniform", "min": 1, "max": 20000}}, "batch", "at most 16,384 items"),
    ({"batch": {"dist": "lognormal", "mean": 8, "std": 2}}, "batch", "give a max of at most 16,384"),
    ({"protocol": "openai", "batch": 4}, "batch", "`batch` is for protocol openai-embeddings or rerank, not openai"),
])
def test_scenario_checks_name_the_field(cls, field, words):
    with pytest.raises(ScenarioError) as err:
        _scenario("http://127.0.0.1:9", [{"name": "c", **cls}])
    assert f"workload.classes[0].{field}" in str(err.value) and words in str(err.value), str(err.value)


def test_a_run_reports_inputs_and_input_tokens_per_second(tmp_path):
    """50 requests a second for 1 s, 4 inputs of 7 words each: summary.json's batch.<class> counts
    exactly completed x 4 inputs and the server's usage (completed x 4 x 9 tokens), and its rates are
    those counts over the measured window (the same rounding as the summary: 3 decimals)."""
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        scenario = _scenario(url, [{"name": "docs", "batch": 4, "prompt_tokens": 7}], tmp_path,
                             phases=[{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 50}}])
        result = run_scenario(scenario, workers=1)
    summary = read_summary(result.run_dir)
    done = summary["requests"]["completed"]
    assert done == summary["requests"]["sent"] == len(seen) >= 45 and summary["requests"]["errors"] == 0
    window = summary["throughput"]["measured_window_s"]
    batch = summary["batch"]["docs"]
    assert (batch["protocol"], batch["unit"], batch["completed"]) == ("openai-embeddings", "inputs", done)
    assert (batch["items"], batch["items_per_request"], batch["input_tokens"]) == (4 * done, 4.0, 4 * 9 * done)
    assert batch["items_per_s"] == pytest.approx(4 * done / window, abs=2e-3)
    assert batch["input_tokens_per_s"] == pytest.approx(36 * done / window, abs=2e-3)
    assert all(len(s["body"]["input"]) == 4 for s in seen)
    assert batch_lines(summary) == [f"batch docs: {4 * done:,} inputs (4.0 a request) · {batch['items_per_s']:,.1f} inputs/s · "
                                    f"{batch['input_tokens_per_s']:,.1f} input tokens/s"]


def test_a_bare_400_names_what_the_class_sends_beyond_the_plain_request():
    with serve(_app([])) as url:
        scenario = _scenario(url, [{"name": "c", "model": "http-400-empty", "embeddings": {"extra_body": {"dimensions": 8}}}])
        (outcome,) = send(scenario, [_request(0)])
    assert outcome.error == "http_4xx" and outcome.reason == (
        "HTTP 400 Bad Request with an empty body; this run sends the body field dimensions (embeddings.extra_body): "
        "the server may refuse one of them"), outcome.reason


def test_a_header_that_would_inject_a_line_is_never_sent():
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        scenario = _scenario(url, [{"name": "c", "batch": 2}])
        scenario.target.headers["X-Evil"] = "a\r\nX-Injected: 1"  # past the scenario's own check (from code)
        (outcome,) = send(scenario, [_request(0)])
    assert seen == [] and outcome.error == "protocol" and outcome.reason.startswith("not sent: "), outcome.reason


def test_dataset_rows_planned_by_the_tokenizer(tmp_path):
    """With workload.tokenizer, a dataset batch's planned prompt count is its rows' token counts summed
    (what the server's usage should say), counted here independently with the tokenizers library."""
    from tokenizers import Tokenizer

    from helpers import build_tokenizer

    path = build_tokenizer(tmp_path / "tokenizer.json")
    rows = ["the state of the world", "one more time", "people made good work, and then some", "we see"]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        scenario = scenario_from_dict({
            "seed": 1, "target": {"url": url, "protocol": "openai-embeddings", "model": "e5"},
            "workload": {"tokenizer": {"file": str(path)}, "classes": [{"name": "c", "batch": 3, "dataset": {"file": str(data)}}]},
            "phases": [PHASE]})
        request = _request(0, 0, 0, item=3)
        (outcome,) = send(scenario, [request])
    assert outcome.error is None and seen[0]["body"]["input"] == [rows[3], rows[0], rows[1]]
    counts = Tokenizer.from_file(str(path))
    assert request.prompt_tokens == sum(len(counts.encode(r).ids) for r in (rows[3], rows[0], rows[1]))


def test_an_empirical_batch_comes_from_its_file_and_a_missing_file_is_named(tmp_path):
    from latscope.plan import build_plan

    sizes = tmp_path / "sizes.txt"
    sizes.write_text("3\n5\n")
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        scenario = _scenario(url, [{"name": "c", "batch": {"dist": "empirical", "file": str(sizes)}}])
        outcomes = send(scenario, [_request(i, item=i * 1_000_003) for i in range(12)])
    assert {o.items for o in outcomes} == {3, 5} and [len(s["body"]["input"]) for s in seen] == [o.items for o in outcomes]
    missing = _scenario("http://127.0.0.1:9", [{"name": "c", "batch": {"dist": "empirical", "file": str(tmp_path / "no.txt")}}])
    with pytest.raises(ScenarioError, match=r"workload.classes\[0\].batch.file: length file .*no.txt: not found"):
        build_plan(missing)  # the parent's plan, before any worker starts
