"""The rerank client against aiohttp servers on loopback that record every request body (the Cohere /
vLLM / Jina shape at /v1/rerank, TEI's own at /rerank): the bodies field by field, the document and
token counts exactly, every malformed answer a `protocol` error with its reason, and a short real
run's documents/s in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from events_server import batch_scenario, send
from events_server import request as planned
from latscope.errors import ScenarioError
from latscope.records import Request
from latscope.run import run_scenario
from latscope.workload import VOCABULARY

from conftest import serve
from helpers import read_summary

SPECIAL = 3  # tokens a cross-encoder adds to each (query, document) pair: [CLS] q [SEP] d [SEP]


def _scenario(url: str, classes: list[dict], tmp_path: Path | None = None, phases: list[dict] | None = None,
              **target) -> object:
    target = {"url": url, "protocol": "rerank", "timeout": 5, **target}
    return batch_scenario("rerank", 9, target, classes, tmp_path, phases)


def _request(seq: int, cls: int = 0, prompt_tokens: int = 10, item: int = 500) -> Request:
    return planned(seq, cls, prompt_tokens, 0, item=item)


def _app(seen: list[dict]) -> web.Application:
    """Scores each document by its words; usage counts every pair's tokens (vLLM's total_tokens). The
    model names a way to answer wrongly. /rerank answers as TEI does."""

    async def cohere(request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        seen.append({"path": request.path, "headers": dict(request.headers), "body": doc})
        docs, q, model = doc["documents"], len(doc["query"].split()), doc.get("model")
        results = sorted(({"index": i, "relevance_score": 1 / (1 + len(d.split()))} for i, d in enumerate(docs)),
                         key=lambda r: -r["relevance_score"])[: doc.get("top_n") or len(docs)]
        answer: object = {"id": "r", "model": model, "results": results,
                          "usage": {"total_tokens": sum(q + len(d.split()) + SPECIAL for d in docs)}}
        match model:
            case "too-many":
                results.append({"index": 0, "relevance_score": 0.5})
            case "out-of-range":
                results[0]["index"] = len(docs)
            case "twice":
                results[1]["index"] = results[0]["index"]
            case "no-score":
                del results[0]["relevance_score"]
            case "no-results":
                answer = {"id": "r"}
            case "http-503":
                return web.json_response({"error": {"message": "queue is full"}}, status=503)
        return web.json_response(answer)

    async def tei(request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        seen.append({"path": request.path, "headers": dict(request.headers), "body": doc})
        return web.json_response([{"index": i, "score": 0.5} for i in range(len(doc["texts"]))])

    app = web.Application()
    app.router.add_post("/v1/rerank", cohere)
    app.router.add_post("/rerank", tei)
    return app


def test_request_bodies_counts_and_usage():
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        classes = [{"name": "top", "model": "bge-reranker", "batch": 5, "query_tokens": 4,
                    "rerank": {"top_n": 2, "return_documents": False, "extra_body": {"truncate": True}}},
                   {"name": "defaults"},
                   {"name": "tei", "path": "/rerank", "model": "ignored", "batch": 3, "rerank": {"api": "tei"}}]
        requests = [_request(0, 0), _request(1, 1, 6), _request(2, 2, 2)]
        top, defaults, tei = send(_scenario(url, classes, headers={"X-Tenant": "a"}), requests)
    assert all(o.error is None for o in (top, defaults, tei)), [o.reason for o in (top, defaults, tei)]
    body = seen[0]["body"]
    assert seen[0]["path"] == "/v1/rerank" and seen[0]["headers"]["X-Tenant"] == "a"
    query, documents = body.pop("query"), body.pop("documents")
    assert body == {"model": "bge-reranker", "top_n": 2, "return_documents": False, "truncate": True}
    assert len(query.split()) == 4 and [len(d.split()) for d in documents] == [10] * 5 and len(set(documents)) == 5
    assert all(w in VOCABULARY for t in (query, *documents) for w in t.split())
    assert query not in documents
    # 5 documents scored (2 returned: top_n); the server's total_tokens is every pair's tokens
    assert (top.items, top.prompt_tokens, top.prompt_from_usage) == (5, 5 * (4 + 10 + SPECIAL), True)
    assert requests[0].prompt_tokens == 5 * (4 + 10)  # planned: each document read with the query
    assert top.encode_ns > 0 and top.decode_ns > 0 and top.output_tokens == 0

    # defaults: 8 documents, a 16-word query, no model (rerank needs none), nothing optional sent
    body = seen[1]["body"]
    assert set(body) == {"query", "documents"} and len(body["query"].split()) == 16
    assert [len(d.split()) for d in body["documents"]] == [6] * 8 and defaults.items == 8
    assert requests[1].prompt_tokens == 8 * (16 + 6)

    # TEI: texts instead of documents, no model, a list of {index, score} back, no usage
    body = seen[2]["body"]
    assert seen[2]["path"] == "/rerank" and set(body) == {"query", "texts"} and len(body["texts"]) == 3
    assert (tei.items, tei.prompt_tokens, tei.prompt_from_usage) == (3, 0, False)


@pytest.mark.parametrize("model, kind, words", [
    ("too-many", "protocol", "9 results for 8 documents"),
    ("out-of-range", "protocol", "results[0] names no document of 0..7"),
    ("twice", "protocol", "scores document"),
    ("no-score", "protocol", "results[0] has no relevance_score (a number)"),
    ("no-results", "protocol", "response has no results list"),
    ("http-503", "http_5xx", "HTTP 503 Service Unavailable: queue is full"),
])
def test_malformed_answers_are_errors_that_say_why(model, kind, words):
    with serve(_app([])) as url:
        (outcome,) = send(_scenario(url, [{"name": "c", "model": model}]), [_request(0)])
    assert outcome.error == kind and words in outcome.reason, outcome.reason
    assert outcome.items == 8


def test_tei_answer_that_is_an_object_is_an_error():
    async def wrong(request: web.Request) -> web.Response:
        return web.json_response({"results": []})

    app = web.Application()
    app.router.add_post("/rerank", wrong)
    with serve(app) as url:
        (outcome,) = send(_scenario(url, [{"name": "c", "path": "/rerank", "rerank": {"api": "tei"}}]), [_request(0)])
    assert outcome.error == "protocol" and "response has no list of scores" in outcome.reason, outcome.reason


def test_query_tokens_are_for_rerank_only_and_outputs_refused():
    with pytest.raises(ScenarioError, match=r"workload.classes\[0\].output_tokens: protocol rerank generates no text"):
        _scenario("http://127.0.0.1:9", [{"name": "c", "output_tokens": 5}])


def test_a_run_reports_documents_per_second(tmp_path):
    """40 requests a second for 1 s of 6 documents of 12 words and a 5-word query: summary.json's
    batch.<class> has exactly completed x 6 documents and the server's count (each pair + 3)."""
    seen: list[dict] = []
    with serve(_app(seen)) as url:
        scenario = _scenario(url, [{"name": "rag", "batch": 6, "prompt_tokens": 12, "query_tokens": 5}], tmp_path,
                             phases=[{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 40}}])
        result = run_scenario(scenario, workers=1)
    summary = read_summary(result.run_dir)
    done = summary["requests"]["completed"]
    assert done == len(seen) >= 36 and summary["requests"]["errors"] == 0
    window = summary["throughput"]["measured_window_s"]
    batch = summary["batch"]["rag"]
    assert (batch["protocol"], batch["unit"], batch["items"]) == ("rerank", "documents", 6 * done)
    assert batch["input_tokens"] == 6 * (5 + 12 + SPECIAL) * done
    assert batch["items_per_s"] == pytest.approx(6 * done / window, abs=2e-3)
    assert batch["input_tokens_per_s"] == pytest.approx(6 * 20 * done / window, abs=2e-3)
