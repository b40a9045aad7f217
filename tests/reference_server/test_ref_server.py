"""The reference server as a real process, over the wire only: KServe v2 REST (JSON and binary tensors),
Server-Timing, dynamic batching, bad input, overload, metrics, model cache and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import aiohttp
import numpy as np
import pytest

from conftest import free_port
import refserver
from refserver import (HIDDEN, MODEL, Server, binary_body, embedding, http, json_body, running_server, server_timing,
                       token_inputs)

BINARY_OUT = {"binary_data_output": True}

# The shared module-scoped fixtures (refserver.py), bound here so that pytest finds them by name.
cache, logs = refserver.cache, refserver.logs


@contextmanager
def running(cache: Path, logs: Path, *flags: str) -> Iterator[Server]:
    """Start `python -m reference_server serve` on a free port, wait until ready; SIGTERM must exit 0."""
    port = free_port()
    with running_server(logs, "--http-port", str(port), "--cache-dir", str(cache), "--layers", "2", *flags) as server:
        assert server.url == f"http://127.0.0.1:{port}"
        yield server


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[Server]:
    with running(cache, logs, "--max-queue-delay-us", "5000") as s:
        yield s


@pytest.fixture(scope="module")
def unbatched(cache, logs) -> Iterator[Server]:
    with running(cache, logs, "--max-batch-size", "1") as s:
        yield s


@pytest.fixture(scope="module")
def strict(cache, logs) -> Iterator[Server]:
    with running(cache, logs, "--max-queue", "2", "--max-batch-size", "1", "--extra-latency-ms", "0",
                 "--max-body-bytes", "65536") as s:
        yield s


# --- requests ------------------------------------------------------------------------------------------

async def _post_all(url: str, bodies: list[bytes]) -> list[tuple[int, dict, bytes]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def post(body: bytes):
            async with session.post(url, data=body) as response:
                return response.status, response.headers, await response.read()

        return await asyncio.gather(*(post(b) for b in bodies))


def post_concurrently(url: str, bodies: list[bytes]) -> list[tuple[int, dict, bytes]]:
    return asyncio.run(_post_all(url, bodies))


def assert_healthy(server: Server) -> None:
    assert http("GET", f"{server.url}/v2/health/ready")[0] == 200


# --- tests ---------------------------------------------------------------------------------------------

def test_json_and_binary_tensors_give_identical_embeddings(server):
    ids, mask = token_inputs(rows=2, seq=12, pad=5)
    status, headers, body = http("POST", server.infer_url, json_body(ids, mask))
    assert status == 200 and headers["Content-Type"] == "application/json"
    from_json = embedding(headers, body)
    assert from_json.shape == (2, HIDDEN) and np.isfinite(from_json).all()

    status, headers, body = http("POST", server.infer_url, *binary_body(ids, mask, **BINARY_OUT))
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    np.testing.assert_array_equal(embedding(headers, body), from_json)

    # JSON in, binary out asked per output.
    doc = json.loads(json_body(ids, mask))
    doc["outputs"] = [{"name": "embedding", "parameters": {"binary_data": True}}]
    status, headers, body = http("POST", server.infer_url, json.dumps(doc).encode())
    assert status == 200 and "Inference-Header-Content-Length" in headers
    np.testing.assert_array_equal(embedding(headers, body), from_json)


def test_metadata_and_health(server):
    status, _, body = http("GET", f"{server.url}/v2/models/{MODEL}")
    assert status == 200
    meta = json.loads(body)
    assert meta["name"] == MODEL and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                              {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, HIDDEN]}]
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready", "/v2"):
        status, headers, _ = http("GET", server.url + path)
        assert status == 200 and headers["X-Replica-Id"]
    assert json.loads(http("GET", f"{server.url}/v2/models")[2]) == {"models": [MODEL]}
    assert json.loads(http("POST", f"{server.url}/v2/repository/index", b"{}")[2]) == [
        {"name": MODEL, "version": "1", "state": "READY"}]


def test_server_timing_parts_fit_in_the_client_measured_time(server):
    ids, mask = token_inputs(rows=1, seq=64)
    for body, headers in ((json_body(ids, mask), {}), binary_body(ids, mask, **BINARY_OUT)):
        started = time.perf_counter()
        status, response_headers, _ = http("POST", server.infer_url, body, headers)
        elapsed_ms = (time.perf_counter() - started) * 1000
        assert status == 200
        parts = server_timing(response_headers["Server-Timing"])
        assert parts["batch"] == "1"
        durations = [float(parts[name]) for name in ("queue", "deser", "compute", "ser")]
        assert all(d >= 0 for d in durations) and float(parts["compute"]) > 0
        assert sum(durations) <= elapsed_ms
        assert response_headers["X-Replica-Id"]


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server):
    # Lengths 9..16 share one bucket, so they are padded together; each answer must match the request alone.
    inputs = [token_inputs(rows=1, seq=9 + i % 8, seed=i) for i in range(16)]
    alone = [embedding(*http("POST", server.infer_url, json_body(*x))[1:]) for x in inputs]
    answers = post_concurrently(server.infer_url, [json_body(*x) for x in inputs])
    assert [status for status, _, _ in answers] == [200] * 16
    assert max(int(server_timing(headers["Server-Timing"])["batch"]) for _, headers, _ in answers) > 1
    for (_, headers, body), expected in zip(answers, alone):
        np.testing.assert_allclose(embedding(headers, body), expected, atol=1e-5)


def test_batch_size_one_turns_batching_off(unbatched):
    answers = post_concurrently(unbatched.infer_url, [json_body(*token_inputs(1, 16, seed=i)) for i in range(16)])
    assert [status for status, _, _ in answers] == [200] * 16
    assert {server_timing(headers["Server-Timing"])["batch"] for _, headers, _ in answers} == {"1"}
    status, _, body = http("POST", unbatched.infer_url, json_body(*token_inputs(rows=2, seq=8)))
    assert status == 400 and "at most 1 rows" in json.loads(body)["error"]


def test_longer_sequences_cost_more_compute(server):
    def median_compute_ms(seq: int) -> float:
        body, headers = binary_body(*token_inputs(rows=1, seq=seq))
        return statistics.median(
            float(server_timing(http("POST", server.infer_url, body, headers)[1]["Server-Timing"])["compute"])
            for _ in range(5))

    assert median_compute_ms(256) > median_compute_ms(16)


def _request(**overrides) -> bytes:
    """A valid JSON infer request (1x4 tokens) with its first input's fields replaced by `overrides`."""
    doc = json.loads(json_body(*token_inputs(rows=1, seq=4)))
    doc["inputs"][0].update(overrides)
    return json.dumps(doc).encode()


def _binary_with_size(size: int) -> tuple[bytes, dict[str, str]]:
    body, headers = binary_body(*token_inputs(rows=1, seq=4))
    return body.replace(b'"binary_data_size": 32', f'"binary_data_size": {size}'.encode(), 1), headers


@pytest.mark.parametrize("body, headers, status, words", [
    pytest.param(b'{"inputs": [', {}, 400, ["malformed JSON"], id="malformed-json"),
    pytest.param(b"[1, 2]", {}, 400, ["JSON object"], id="not-an-object"),
    pytest.param(b"[" * 100_000, {}, 400, ["nested too deeply"], id="deep-nesting"),
    pytest.param(_request(datatype="FP32"), {}, 400, ["input_ids", "FP32", "INT64"], id="wrong-datatype"),
    pytest.param(_request(datatype="FLOAT"), {}, 400, ["input_ids", "known datatypes"], id="unknown-datatype"),
    pytest.param(_request(data=[1, 2, 3]), {}, 400, ["input_ids", "4 elements", "has 3"], id="data-length"),
    pytest.param(_request(shape=[4]), {}, 400, ["input_ids", "dimensions"], id="wrong-rank"),
    pytest.param(_request(shape=[1, 2], data=[1, 2]), {}, 400, ["input_ids", "attention_mask", "agree"],
                 id="inputs-disagree"),
    pytest.param(_request(shape=[1, 600], data=[1] * 600), {}, 400, ["input_ids", "at most 512"], id="too-long"),
    pytest.param(_request(data=[1.5, 2, 3, 4]), {}, 400, ["input_ids", "floating-point", "integers"],
                 id="floats-for-int64"),
    pytest.param(_request(data=[[1, 2], [3]]), {}, 400, ["input_ids", "regular"], id="ragged-data"),
    pytest.param(_request(name="token_ids"), {}, 400, ["token_ids", "input_ids"], id="unknown-input"),
    pytest.param(_request(name="attention_mask"), {}, 400, ["attention_mask", "twice"], id="duplicate-input"),
    pytest.param(*_binary_with_size(24), 400, ["input_ids", "binary_data_size", "32 bytes"], id="binary-size"),
    pytest.param(b"{}", {"Inference-Header-Content-Length": "99"}, 400, ["Inference-Header-Content-Length"],
                 id="header-length"),
])
def test_bad_requests_get_400_with_a_message(server, body, headers, status, words):
    got, response_headers, answer = http("POST", server.infer_url, body, headers)
    assert got == status and response_headers["Content-Type"].startswith("application/json")
    message = json.loads(answer)["error"]
    assert all(w in message for w in words), message
    assert_healthy(server)


def test_unknown_model_route_and_method_get_json_errors(server):
    status, _, body = http("POST", f"{server.url}/v2/models/nope/infer", _request())
    assert status == 404 and "'nope'" in json.loads(body)["error"]
    assert http("GET", f"{server.url}/v2/models/nope")[0] == 404
    status, _, body = http("GET", server.infer_url)
    assert status == 405 and json.loads(body)["error"]
    assert http("GET", f"{server.url}/no/such/path")[0] == 404
    assert_healthy(server)


def test_oversized_body_gets_413(strict):
    body, headers = binary_body(*token_inputs(rows=1, seq=8192 // 2))  # 64 KiB of tokens + header > 65536
    status, _, answer = http("POST", strict.infer_url, body, headers)
    assert status == 413 and "--max-body-bytes" in json.loads(answer)["error"]
    assert_healthy(strict)


def test_overload_is_shed_with_429_while_accepted_requests_complete(strict):
    bodies = [json_body(*token_inputs(rows=1, seq=512, seed=i)) for i in range(50)]
    answers = post_concurrently(strict.infer_url, bodies)
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 429}, statuses
    for status, headers, body in answers:
        if status == 429:
            assert headers["Retry-After"] == "1" and "overloaded" in json.loads(body)["error"]
        else:
            assert embedding(headers, body).shape == (1, HIDDEN)
    assert_healthy(strict)


def test_metrics_are_exposed_in_prometheus_text(server):
    http("POST", server.infer_url, json_body(*token_inputs(rows=1, seq=8)))
    status, headers, body = http("GET", f"{server.url}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    assert 'latscope_ref_requests_total{endpoint="/v2/models/{name}/infer",status="200"}' in text
    for name in ("latscope_ref_batch_size_bucket", "latscope_ref_request_duration_seconds_bucket",
                 "latscope_ref_queue_duration_seconds_bucket", "latscope_ref_compute_duration_seconds_bucket",
                 "latscope_ref_in_flight_requests", "latscope_ref_queue_depth", "latscope_ref_gc_pause_seconds",
                 'latscope_ref_model_load_seconds{backend="onnxruntime",model="encoder"}'):
        assert name in text, name


def test_second_start_reuses_the_cached_model(server, unbatched, cache):
    texts = [server.log.read_text(), unbatched.log.read_text()]
    assert sum("reused cached" in t for t in texts) >= 1
    assert len(list(cache.glob("*.onnx"))) == 1


def test_sigterm_lets_in_flight_requests_finish(cache, tmp_path):
    with running(cache, tmp_path, "--extra-latency-ms", "1500") as slow:
        answer: list = []
        client = threading.Thread(target=lambda: answer.append(
            http("POST", slow.infer_url, json_body(*token_inputs(rows=1, seq=8)))))
        client.start()
        time.sleep(0.5)  # the request is inside its handler, sleeping
    # `running` sent SIGTERM and checked exit status 0; the request still got its answer.
    client.join(10)
    assert answer and answer[0][0] == 200


# --- the lean infer path (reference_server/infer_path.py) and aiohttp on one connection ----------------

def _read_answer(stream) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length from a socket's file: (status, headers by lower-case name, body)."""
    status = int(stream.readline().split(b" ", 2)[1])
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, stream.read(int(headers["content-length"]))


def _raw_requests(server: Server, data: bytes, answers: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`data` written at once on one keep-alive connection; the first `answers` answers, in order."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock, sock.makefile("rb") as stream:
        sock.sendall(data)
        return [_read_answer(stream) for _ in range(answers)]


def _infer_bytes(body: bytes, model: str = MODEL, extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (model.encode(), extra, len(body), body))


def _same_answer(lean: tuple[int, dict[str, str], bytes], other: tuple[int, dict[str, str], bytes]) -> None:
    """Two answers to the same request are the same: status, body, and every header but the clock's."""
    assert lean[0] == other[0] and lean[2] == other[2]
    varying = {"date", "server-timing"}
    assert {k: v for k, v in lean[1].items() if k not in varying} == \
        {k: v for k, v in other[1].items() if k not in varying}
    assert ("server-timing" in lean[1]) == ("server-timing" in other[1])


def test_pipelined_requests_are_answered_in_order_and_the_same_by_the_lean_path_and_aiohttp(server):
    """Infer requests start on the lean path; the first other request on a connection goes to aiohttp with every
    byte after it. Six requests written at once (infer, unknown model, infer, GET, infer, unknown model) get
    their answers in order, and each infer or 404 answered by aiohttp after the hand-over equals the lean
    path's answer to the same request in status, body and headers (Date and Server-Timing values aside)."""
    body = json_body(*token_inputs(rows=1, seq=8))
    infer, unknown = _infer_bytes(body), _infer_bytes(body, model="nope")
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"
    answers = _raw_requests(server, infer + unknown + infer + ready + infer + unknown, 6)
    assert [a[0] for a in answers] == [200, 404, 200, 200, 200, 404]
    assert "'nope'" in json.loads(answers[1][2])["error"]
    assert answers[0][1]["content-type"] == "application/json" and answers[0][1]["x-replica-id"]
    assert set(server_timing(answers[0][1]["server-timing"])) == {"queue", "deser", "compute", "ser", "batch"}
    _same_answer(answers[0], answers[2])  # both lean
    _same_answer(answers[0], answers[4])  # lean, then aiohttp's handler after the hand-over
    _same_answer(answers[1], answers[5])
    assert json.loads(answers[3][2]) == {"ready": True}


def test_infer_requests_the_lean_path_leaves_to_aiohttp_get_the_same_answers(server):
    """A chunked body, a gzip body, an HTTP/1.0 request and a percent-encoded model name are aiohttp's to
    read; each is answered as the lean path answers the plain request (binary tensors in and out)."""
    import gzip

    body, headers = binary_body(*token_inputs(rows=1, seq=8, seed=3), **BINARY_OUT)
    extra = b"Inference-Header-Content-Length: %s\r\n" % headers["Inference-Header-Content-Length"].encode()
    (lean,) = _raw_requests(server, _infer_bytes(body, extra=extra), 1)
    assert lean[0] == 200 and lean[1]["content-type"] == "application/octet-stream"
    chunked = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\n%sTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (MODEL.encode(), extra, 10, body[:10], len(body) - 10, body[10:]))
    packed = gzip.compress(body)
    zipped = _infer_bytes(packed, extra=extra + b"Content-Encoding: gzip\r\n")
    escaped = _infer_bytes(body, model="%65ncoder", extra=extra)
    http10 = _infer_bytes(body, extra=extra).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    for request in (chunked, zipped, escaped):
        _same_answer(lean, _raw_requests(server, request, 1)[0])
    (old,) = _raw_requests(server, http10, 1)  # HTTP/1.0 without keep-alive: closed after, says nothing more
    assert old[0] == 200 and old[2] == lean[2]


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    return int(head.split(b" ", 2)[1]), await reader.readexactly(length)


def test_infer_connections_reach_aiohttp_only_from_their_first_other_request(tmp_path):
    """InferSite (reference_server/infer_path.py), in process on the identity model: a keep-alive connection
    that sends only infer requests never reaches aiohttp (its server holds no connection), and the first
    other request hands the connection to aiohttp at that request's first byte; the infer request written
    with it in the same packet is then answered by aiohttp, with the same values."""
    from aiohttp import web

    from reference_server.backends.onnxruntime import OnnxRuntimeBackend
    from reference_server.batcher import Batcher
    from reference_server.http_server import ServedModel, make_app
    from reference_server.infer_path import InferSite
    from reference_server.metrics import Metrics
    from reference_server.model import IdentityConfig, cached_identity

    backend = OnnxRuntimeBackend(cached_identity(IdentityConfig(), tmp_path)[0], 1)
    backend.load()
    x = np.arange(HIDDEN, dtype=np.float32).reshape(1, HIDDEN) / 7
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, HIDDEN], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    infer = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async def main() -> None:
        batcher = Batcher(backend.run, backend.signature, max_batch_size=8, max_queue_delay_us=0, max_queue=16)
        app = make_app(ServedModel("identity", backend.platform, backend.signature, batcher), Metrics(),
                       max_body_bytes=1 << 20, extra_latency_ms=0)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = InferSite(runner, sock, drain_timeout=5)
        batcher.start()
        await site.start()
        try:
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            answers = []
            for _ in range(3):
                writer.write(infer)
                answers.append(await _answer(reader))
            assert runner.server.connections == [] and len(site.connections) == 1
            writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" + infer)
            answers += [await _answer(reader), await _answer(reader)]
            assert len(runner.server.connections) == 1 and not site.connections
            assert [status for status, _ in answers] == [200] * 5 and json.loads(answers[3][1]) == {"ready": True}
            for _, answer in answers[:3] + answers[4:]:
                (out,) = json.loads(answer)["outputs"]
                np.testing.assert_array_equal(np.array(out["data"], np.float32), x.ravel())
            writer.close()
        finally:
            await runner.cleanup()
            await asyncio.to_thread(batcher.stop)

    asyncio.run(main())
