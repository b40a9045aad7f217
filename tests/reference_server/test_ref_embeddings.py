"""The reference server's /v1/embeddings (through the official `openai` client) and /v1/rerank, /rerank, as a real
process: the encoder's pooled output, batched in runs of --max-batch-size, and cosine relevance scores.
One server for the module: a 1-layer encoder, no decoder, at most 4 rows per batch."""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pytest

import refserver
from refserver import HIDDEN, MODEL, embedding, http, json_body, post_json, running_server
from reference_server.text_api import encode

openai = pytest.importorskip("openai")

cache, logs = refserver.cache, refserver.logs

TEXTS = ["the cat sat on the mat", "a b", "one two three four five six seven eight nine ten eleven twelve",
         "x", "mats are for cats and dogs", "seventeen words " * 8]


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[str]:
    with running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--layers", "1", "--no-generator",
                        "--max-batch-size", "4", "--max-body-bytes", "65536", "--cache-dir", str(cache)) as s:
        yield s.url


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def v2_embedding(url: str, text: str) -> np.ndarray:
    """The encoder's output for one text over KServe v2, tokenized as the server does (one token per word)."""
    ids = np.array([encode(text, 8192)], np.int64)
    status, headers, body = http("POST", f"{url}/v2/models/{MODEL}/infer", json_body(ids, np.ones_like(ids)))
    assert status == 200, body
    return embedding(headers, body)[0]


def test_embeddings_are_the_encoders_pooled_output_in_input_order(server, oai):
    """Six inputs of different lengths go to the batcher as two runs of at most 4 rows (sorted by length, each
    padded to its longest); each vector is the one the encoder gives that text alone (padding is masked out,
    so only float summation order differs: float32 rounding)."""
    answer = oai.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in answer.data] == list(range(len(TEXTS)))
    vectors = np.array([d.embedding for d in answer.data], np.float32)
    assert vectors.shape == (len(TEXTS), HIDDEN)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(len(t.split()) for t in TEXTS)
    for text, vector in zip(TEXTS, vectors):
        np.testing.assert_allclose(vector, v2_embedding(server, text), rtol=1e-5, atol=1e-6)
    as_floats = oai.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert np.array_equal(np.array([d.embedding for d in as_floats.data], np.float32), vectors)  # the same float32s


def test_one_input_and_token_id_inputs(oai):
    one = oai.embeddings.create(model=MODEL, input="the cat sat on the mat")
    assert len(one.data) == 1 and one.usage.prompt_tokens == 6
    ids = encode("the cat sat on the mat", 8192)
    by_ids = oai.embeddings.create(model=MODEL, input=[ids, ids[:2]])
    assert by_ids.usage.prompt_tokens == 8
    # Batched with another input here, alone before: the same vector up to float32 summation order.
    np.testing.assert_allclose(by_ids.data[0].embedding, one.data[0].embedding, rtol=1e-5, atol=1e-6)


def test_rerank_scores_are_cosines_of_the_embeddings_sorted_best_first(server, oai):
    query, documents = "where do cats sit", TEXTS[:5]
    status, _, body = post_json(f"{server}/v1/rerank", {"model": MODEL, "query": query, "documents": documents,
                                                        "top_n": 3})
    assert status == 200, body
    doc = json.loads(body)
    vectors = np.array([d.embedding for d in oai.embeddings.create(model=MODEL, input=[query, *documents]).data],
                       np.float64)
    cosines = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    best = list(np.argsort(-cosines)[:3])
    assert [r["index"] for r in doc["results"]] == best
    # The server embeds the query and documents in one batch, the check in another: float32 rounding apart.
    np.testing.assert_allclose([r["relevance_score"] for r in doc["results"]], cosines[best], rtol=1e-5)
    assert [r["document"]["text"] for r in doc["results"]] == [documents[i] for i in best]
    assert doc["usage"]["prompt_tokens"] == len(query.split()) + sum(len(d.split()) for d in documents)

    status, _, body = post_json(f"{server}/rerank", {"model": MODEL, "query": query, "return_documents": False,
                                                     "documents": [{"text": d} for d in documents]})
    results = json.loads(body)["results"]
    assert status == 200 and [r["index"] for r in results] == list(np.argsort(-cosines))  # no top_n: every one
    assert all("document" not in r for r in results)


@pytest.mark.parametrize("path, doc, status, says", [
    ("embeddings", {"model": "other", "input": "x"}, 404, "does not exist"),
    ("embeddings", {"model": MODEL, "input": ""}, 400, "empty"),
    ("embeddings", {"model": MODEL, "input": "w " * 513}, 400, "at most 512"),
    ("embeddings", {"model": MODEL, "input": ["x"] * 2049}, 400, "at most 2048"),
    ("embeddings", {"model": MODEL, "input": "x", "dimensions": 10}, 400, "dimensions"),
    ("embeddings", {"model": MODEL, "input": [[9000]]}, 400, "[0, 8192)"),
    ("rerank", {"model": MODEL, "query": "q", "documents": []}, 400, "documents"),
    ("rerank", {"model": MODEL, "query": "q", "documents": ["d"], "top_n": 0}, 400, "top_n"),
    ("rerank", {"model": "other", "query": "q", "documents": ["d"]}, 404, "does not exist"),
])
def test_bad_requests_get_openai_shaped_errors(server, path, doc, status, says):
    got, _, body = post_json(f"{server}/v1/{path}", doc)
    error = json.loads(body)["error"]
    assert got == status and says in error["message"], (got, body)
    assert error["type"] == "invalid_request_error"


def test_a_body_over_the_limit_is_413(server):
    status, _, body = post_json(f"{server}/v1/embeddings", {"model": MODEL, "input": ["word " * 500] * 30})
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
