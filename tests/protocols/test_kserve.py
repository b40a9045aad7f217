"""KServe v2 REST (JSON and binary tensors) against the real reference server and against a misbehaving
one, plus the gRPC client side by side with REST (same outputs, same measurements). Real processes on
loopback: the reference server as a subprocess, runs through `run_scenario` (worker processes)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from latscope.protocols import make_client
from latscope.protocols.kserve import InvalidResponse, KServeClient, decode_response, encode_binary, encode_json
from latscope.protocols.kserve_grpc import KServeGrpcClient
from latscope.records import Request
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict
from latscope.workload import Payloads, Tensor

from conftest import serve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402
from refserver import running_with_grpc  # noqa: E402

cache, logs, identity = refserver.cache, refserver.logs, refserver.identity  # module-scoped fixtures, bound here so pytest finds them

PHASE = [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]


def three_ways(grpc_address: str, tensors: list[dict]) -> list[dict]:
    """The same tensors as KServe v2 JSON, binary and gRPC classes."""
    return [{"name": "json", "tensors": tensors},
            {"name": "binary", "kserve": {"binary": True}, "tensors": tensors},
            {"name": "grpc", "protocol": "kserve-v2-grpc", "url": f"grpc://{grpc_address}", "tensors": tensors}]


def kserve_scenario(url: str, model: str, classes: list[dict], phases=PHASE, **extra) -> dict:
    return {"name": "kserve", "seed": 3,
            "target": {"url": url, "protocol": "kserve-v2", "model": model, "timeout": 10},
            "workload": {"classes": classes}, "phases": phases, **extra}


def send_each(data: dict, order: list[tuple[int, int]]):
    """(outcome, outputs) for each (class, pool item) of `order`, sent one after another, each class by the
    client of its (protocol, URL) as make_client groups them; and the tensors each request carried."""
    scenario = scenario_from_dict(data)
    payloads = Payloads(scenario)
    n = len(scenario.workload.classes)
    groups: dict[tuple[str, str], list[int]] = {}
    for c in range(n):
        groups.setdefault((scenario.endpoint(c).protocol, scenario.endpoint(c).url), []).append(c)

    async def main():
        clients, by_class = [], {}
        for (protocol, _), classes in groups.items():
            kind = KServeGrpcClient if protocol == "kserve-v2-grpc" else KServeClient
            clients.append(kind(scenario, classes, payloads))
            by_class.update({c: clients[-1] for c in classes})
            await clients[-1].open()
        try:
            return [await by_class[cls].infer(Request(seq, time.perf_counter_ns(), cls, False, item=item))
                    for seq, (cls, item) in enumerate(order)]
        finally:
            for client in clients:
                await client.close()

    results = asyncio.run(main())
    return results, [payloads.get(Request(0, 0, cls, False, item=item)).tensors for cls, item in order]


# --- the reference server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def encoder(cache, logs):
    with running_with_grpc(cache, logs, "--max-queue-delay-us", "0", "--no-generator") as server:
        yield server


def test_json_binary_and_grpc_get_the_same_encoder_outputs(encoder, tmp_path):
    ids = np.random.default_rng(7).integers(0, 8192, size=(2, 16), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 12:] = 0  # the second row is padded
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask)
    tensors = [{"name": "input_ids", "npy": str(tmp_path / "ids.npy")},
               {"name": "attention_mask", "npy": str(tmp_path / "mask.npy")}]
    order = [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    results, sent = send_each(kserve_scenario(encoder.url, "encoder", three_ways(encoder.grpc, tensors)), order)
    for (outcome, outputs), tensors_sent in zip(results, sent):
        assert outcome.error is None, outcome.reason
        assert [t.array.tolist() for t in tensors_sent] == [ids.tolist(), mask.tolist()]
        assert outcome.encode_ns > 0 and outcome.decode_ns > 0
        assert outcome.sent_ns + outcome.decode_ns < outcome.end_ns  # the encode came before the send
        assert {"queue", "deser", "compute", "ser"} <= outcome.server_timing.keys()
        assert outcome.replica.startswith("r0-")
        assert outcome.bytes_in > 0 and outcome.bytes_out > 0
        assert list(outputs) == ["embedding"]
        assert outputs["embedding"].shape == (2, 384) and outputs["embedding"].dtype == np.float32
    first = results[0][1]["embedding"]
    assert np.isfinite(first).all() and first.std() > 0.01
    for _, outputs in results[1:]:
        np.testing.assert_array_equal(outputs["embedding"], first)  # JSON, binary and gRPC: bit for bit
    json_bytes, binary_bytes, grpc_bytes = (o.bytes_out for o, _ in results[:3])
    assert binary_bytes > 2 * ids.nbytes and grpc_bytes > 2 * ids.nbytes  # raw INT64: 8 bytes per id, whatever its value
    assert json_bytes < 2 * ids.nbytes  # in JSON a small id is a few digits


def test_identity_answers_are_the_inputs_bit_for_bit_and_named_outputs_are_asked_for(identity):
    tensors = [{"name": "x", "datatype": "FP32", "shape": [16, 384], "low": -1, "high": 1}]
    classes = three_ways(identity.grpc, tensors)
    classes += [{"name": "json-named", "kserve": {"outputs": ["y"]}, "tensors": tensors},
                {"name": "binary-named", "kserve": {"binary": True, "outputs": ["y"]}, "tensors": tensors},
                {"name": "grpc-named", "protocol": "kserve-v2-grpc", "url": f"grpc://{identity.grpc}",
                 "kserve": {"outputs": ["y"]}, "tensors": tensors},
                {"name": "unknown-output", "kserve": {"outputs": ["nope"]}, "tensors": tensors}]
    order = [(c, 1) for c in range(6)] + [(6, 0)]
    results, sent = send_each(kserve_scenario(identity.url, "identity", classes), order)
    for (outcome, outputs), tensors_sent in list(zip(results, sent))[:6]:
        assert outcome.error is None, outcome.reason
        # Service time (sent_ns is stamped once the request is prepared) covers the server's parts and the decode.
        server_ns = sum(outcome.server_timing.values()) * 1e6
        assert outcome.end_ns - outcome.sent_ns > server_ns + outcome.decode_ns
        (x,) = tensors_sent
        assert list(outputs) == ["y"]
        np.testing.assert_array_equal(outputs["y"], x.array)  # JSON floats round-trip exactly too
    json_body, binary_body = results[0][0], results[1][0]
    assert binary_body.bytes_out < 16 * 384 * 4 + 400 < json_body.bytes_out
    bad, _ = results[6]
    assert bad.error == "http_4xx" and bad.status == 400
    assert bad.reason.startswith("HTTP 400 Bad Request: unknown output 'nope'"), bad.reason


def test_run_compares_json_binary_and_grpc_serialization(identity, tmp_path):
    tensors = [{"name": "x", "datatype": "FP32", "shape": [32, 384], "low": -1, "high": 1}]
    data = kserve_scenario(identity.url, "identity", three_ways(identity.grpc, tensors),
                           phases=[{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 12}}],
                           output={"dir": str(tmp_path)}, limits={"timer": "coarse"})
    s = run_scenario(scenario_from_dict(data), workers=1).summary
    assert s["errors"] == {"connect": 0, "timeout": 0, "http_4xx": 0, "http_5xx": 0, "protocol": 0}, s["error_examples"]
    assert s["requests"]["completed"] == 24
    metrics = s["metrics"]
    for name in ("json", "binary", "grpc"):
        assert s["requests_by_class"][name]["completed"] > 0
        for metric in ("encode", "decode", "network", "server.queue", "server.compute", "server.deser", "server.ser"):
            assert metrics[metric][name]["count"] == s["requests_by_class"][name]["completed"], (metric, name)
    cost = {name: metrics["encode"][name]["p50_ms"] + metrics["decode"][name]["p50_ms"] for name in ("json", "binary", "grpc")}
    # 12,288 floats: JSON writes and parses each as text (ms); binary and gRPC copy 48 KiB (tens of µs).
    assert cost["binary"] * 10 < cost["json"], cost
    assert cost["grpc"] * 10 < cost["json"], cost
    assert metrics["server.deser"]["binary"]["p50_ms"] < metrics["server.deser"]["json"]["p50_ms"]


# --- a misbehaving server ------------------------------------------------------------------------------

def _misbehaving_app(seen: list[dict]) -> web.Application:
    """/v2/models/<name>/infer answers according to <name>; every request is kept in `seen`."""
    y = {"name": "y", "datatype": "FP32", "shape": [1, 2]}
    values = np.random.default_rng(1).uniform(-1, 1, 40_000).astype(np.float32)
    big = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [200, 200], "data": values.tolist()}]}).encode()

    def binary(doc: dict, raw: bytes) -> web.Response:
        header = json.dumps(doc).encode()
        return web.Response(body=header + raw, content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(len(header))})

    answers = {
        "ok": lambda: web.json_response({"model_name": "ok", "outputs": [{**y, "data": [1.5, 2.5]}]},
                                        headers={"Server-Timing": "queue;dur=0.5, compute;dur=1"}),
        "ok-binary": lambda: binary({"outputs": [{**y, "parameters": {"binary_data_size": 8}}]},
                                    np.array([1.5, 2.5], "<f4").tobytes()),
        "notjson": lambda: web.Response(text="<html>oops</html>", content_type="text/html"),
        "nooutputs": lambda: web.json_response({"model_name": "nooutputs"}),
        "badcount": lambda: web.json_response({"outputs": [{**y, "shape": [2, 3], "data": [1, 2, 3]}]}),
        "binsize": lambda: binary({"outputs": [{**y, "parameters": {"binary_data_size": 8}}]}, b"\0" * 4),
        "big": lambda: web.Response(body=big, content_type="application/json"),
        "error500": lambda: web.json_response({"error": "model exploded: out of memory"}, status=500),
        "error400": lambda: web.json_response({"error": "input 'x': expected FP16"}, status=400),
    }

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({"model": request.match_info["model"], "headers": dict(request.headers), "body": body})
        return answers[request.match_info["model"]]()

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


def test_misbehaving_server_answers_are_classified_and_the_run_goes_on(tmp_path):
    tensors = [{"name": "x", "datatype": "FP32", "shape": [1, 2]}, {"name": "ids", "datatype": "INT64", "shape": [1, 3],
                                                                   "low": 0, "high": 100}]
    names = ["ok", "ok-binary", "notjson", "nooutputs", "badcount", "binsize", "error500", "error400"]
    classes = [{"name": n, "model": n, "tensors": tensors, **({"kserve": {"binary": True}} if "bin" in n else {})}
               for n in names]
    seen: list[dict] = []
    with serve(_misbehaving_app(seen)) as url:
        data = kserve_scenario(url, "ok", classes, output={"dir": str(tmp_path)}, limits={"timer": "coarse"},
                               phases=[{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 80}}])
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    sent = {n: c["sent"] for n, c in s["requests_by_class"].items()}
    assert all(sent.values()) and sum(sent.values()) == 80, sent
    assert s["requests"]["completed"] == sent["ok"] + sent["ok-binary"]
    assert s["errors"]["protocol"] == sent["notjson"] + sent["nooutputs"] + sent["badcount"] + sent["binsize"]
    assert s["errors"]["http_5xx"] == sent["error500"] and s["errors"]["http_4xx"] == sent["error400"]
    assert s["metrics"]["decode"]["ok-binary"]["count"] == sent["ok-binary"]
    assert s["metrics"]["server.compute"]["ok"]["count"] == sent["ok"]
    examples = s["error_examples"]
    assert sorted(examples["protocol"]) == sorted([
        "invalid tensor response: body is not JSON (Expecting value: line 1 column 1 (char 0))",
        "invalid tensor response: no 'outputs' list",
        "invalid tensor response: output 'y': shape [2, 3] needs 6 elements, data has 3",
        "invalid tensor response: output 'y': binary_data_size 8 runs past the end of the body "
        "(4 bytes of binary data left)",
    ])
    assert examples["http_5xx"] == ["HTTP 500 Internal Server Error: model exploded: out of memory"]
    assert examples["http_4xx"] == ["HTTP 400 Bad Request: input 'x': expected FP16"]

    # What went on the wire: JSON tensors, or a JSON header and raw little-endian bytes.
    json_request = next(r for r in seen if r["model"] == "ok")
    assert json_request["headers"]["Content-Type"] == "application/json"
    doc = json.loads(json_request["body"])
    assert [(i["name"], i["shape"], i["datatype"]) for i in doc["inputs"]] == [("x", [1, 2], "FP32"), ("ids", [1, 3], "INT64")]
    assert len(doc["inputs"][0]["data"]) == 2 and all(isinstance(v, int) for v in doc["inputs"][1]["data"])
    assert "outputs" not in doc and "parameters" not in doc
    binary_request = next(r for r in seen if r["model"] == "ok-binary")
    assert binary_request["headers"]["Content-Type"] == "application/octet-stream"
    n = int(binary_request["headers"]["Inference-Header-Content-Length"])
    header, raw = json.loads(binary_request["body"][:n]), binary_request["body"][n:]
    assert [i["parameters"] for i in header["inputs"]] == [{"binary_data_size": 8}, {"binary_data_size": 24}]
    assert all("data" not in i for i in header["inputs"])
    assert header["parameters"] == {"binary_data_output": True}
    assert len(raw) == 32 and np.frombuffer(raw[8:], "<i8").max() < 100


# --- the codec, as pure functions ----------------------------------------------------------------------

def _binary(doc: dict, raw: bytes) -> tuple[bytes, str]:
    header = json.dumps(doc).encode()
    return header + raw, str(len(header))


def test_decode_mixed_json_binary_bytes_and_nested_outputs():
    body, n = _binary({"outputs": [
        {"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
        {"name": "b", "datatype": "FP16", "shape": [3], "parameters": {"binary_data_size": 6}},
        {"name": "c", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 11}},
        {"name": "d", "datatype": "BOOL", "shape": [1, 2], "data": [True, False]},
        {"name": "e", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
    ]}, np.array([0.5, 1, 2], "<f2").tobytes() + b"\x03\0\0\0abc" + b"\0\0\0\0")
    out = decode_response(body, n)
    assert list(out) == ["a", "b", "c", "d", "e"]
    np.testing.assert_array_equal(out["a"], np.array([[1, 2], [3, 4]], np.int32))
    assert out["a"].dtype == np.int32 and out["b"].dtype == np.float16
    np.testing.assert_array_equal(out["b"], [0.5, 1, 2])
    assert out["c"].tolist() == [b"abc", b""] and out["e"].tolist() == ["hi"]
    assert out["d"].tolist() == [[True, False]]


@pytest.mark.parametrize("body, header_length, why", [
    (b"[1, 2]", None, "body is JSON but not an object (list)"),
    (b'{"outputs": {}}', None, "'outputs' is not a list"),
    (b'{"outputs": []}', None, "'outputs' is empty"),
    (b'{"outputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}', None, "outputs[0] has no name"),
    (b'{"outputs": [{"name": "y", "datatype": "FP8", "shape": [1], "data": [1]}]}', None, "output 'y': unknown datatype 'FP8'"),
    (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": "1", "data": [1]}]}', None, "output 'y': shape must be a list"),
    (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}', None, "output 'y' has neither data nor"),
    (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "data": ["a", "b"]}]}', None,
     "output 'y': data holds strings, not FP32 values"),
    (b'{"outputs": [{"name": "y", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]}', None,
     "output 'y': data holds floating-point numbers, not INT64 values"),
    (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "data": [[1], [2, 3]]}]}', None,
     "output 'y': data is not a regular array"),
    (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [1]}, '
     b'{"name": "y", "datatype": "FP32", "shape": [1], "data": [2]}]}', None, "output 'y' appears twice"),
    (b'{"outputs": []}xx', "x", "Inference-Header-Content-Length is 'x', not a number"),
    (b'{"outputs": []}', "99", "Inference-Header-Content-Length is 99 but the body has 15 bytes"),
    (*_binary({"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}]},
              b"\0" * 4), "output 'y': 4 bytes of binary data, shape [2] of FP32 needs 8"),
    (*_binary({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]},
              b"\0" * 6), "2 bytes of binary data after the outputs' binary_data_size (4 bytes) are accounted for"),
])
def test_decode_rejects_what_is_not_a_tensor_response(body, header_length, why):
    with pytest.raises(InvalidResponse) as caught:
        decode_response(body, header_length)
    assert str(caught.value).startswith(why), str(caught.value)


def test_encode_json_and_binary_carry_the_same_tensors():
    x = np.arange(6, dtype=">f4").reshape(2, 3)  # big-endian in memory: the wire is little-endian anyway
    flags = np.array([True, False])
    tensors = [Tensor("x", "FP32", x), Tensor("flags", "BOOL", flags)]
    doc = json.loads(encode_json(tensors, ["y"]))
    assert doc == {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0, 1, 2, 3, 4, 5]},
                              {"name": "flags", "shape": [2], "datatype": "BOOL", "data": [True, False]}],
                   "outputs": [{"name": "y"}]}
    header, parts = encode_binary(tensors, ["y"])
    doc = json.loads(header)
    assert [i["parameters"] for i in doc["inputs"]] == [{"binary_data_size": 24}, {"binary_data_size": 2}]
    assert doc["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}] and "parameters" not in doc
    raw = b"".join(parts)
    np.testing.assert_array_equal(np.frombuffer(raw[:24], "<f4").reshape(2, 3), x)
    assert raw[24:] == b"\x01\x00"


def test_kserve_client_serves_several_models_on_one_url():
    """Classes on one URL share one client (one pool); each keeps its own path, headers and encoding."""
    seen: list[dict] = []
    with serve(_misbehaving_app(seen)) as url:
        tensors = [{"name": "x", "datatype": "FP32", "shape": [1, 2]}]
        data = kserve_scenario(url, "ok", [
            {"name": "a", "tensors": tensors, "headers": {"X-Class": "a"}},
            {"name": "b", "model": "ok-binary", "kserve": {"binary": True}, "tensors": tensors},
            {"name": "big", "model": "big", "tensors": tensors},
        ])
        data["target"]["api_key"] = "k3y"
        scenario = scenario_from_dict(data)
        assert isinstance(make_client(scenario), KServeClient)
        results, _ = send_each(data, [(0, 0), (1, 0), (0, 1), (2, 0)])
    assert [o.error for o, _ in results] == [None] * 4
    assert results[0][0].server_timing == {"queue": 0.5, "compute": 1.0}
    assert [r["model"] for r in seen] == ["ok", "ok-binary", "ok", "big"]
    assert seen[0]["headers"]["X-Class"] == "a" and "X-Class" not in seen[1]["headers"]
    assert {r["headers"]["Authorization"] for r in seen} == {"Bearer k3y"}
    np.testing.assert_array_equal(results[1][1]["y"], np.array([[1.5, 2.5]], np.float32))
    # A large JSON answer takes milliseconds to parse; the request ends after that, not when its last byte came.
    big, outputs = results[3]
    assert outputs["y"].shape == (200, 200) and big.decode_ns > 1_000_000
    assert big.end_ns - big.sent_ns > big.decode_ns
    assert isinstance(make_client(scenario_from_dict({**data, "target": {**data["target"], "url": "grpc://127.0.0.1:1",
                                                                         "protocol": "kserve-v2-grpc"}})),
                      KServeGrpcClient)
