"""The KServe v2 gRPC client: against the real reference server (a process) for its error statuses, a dead
port, and a small in-process grpc.aio server for what the reference server never does (typed contents,
deadlines, garbage, INTERNAL) and to see what the client puts on the wire (message, metadata)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from latscope.protocols.kserve import InvalidResponse
from latscope.protocols.kserve_grpc import (ERROR_KINDS_BY_CODE, KServeGrpcClient, decode_infer_response,
                                            encode_infer_request)
from latscope.records import Request
from latscope.request_ids import request_row
from latscope.scenario import scenario_from_dict
from latscope.workload import Payloads, Tensor
from reference_server import proto

from conftest import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402

cache, logs, identity = refserver.cache, refserver.logs, refserver.identity  # module-scoped fixtures, bound here so pytest finds them

X = {"name": "x", "datatype": "FP32", "shape": [2, 384], "low": -1, "high": 1}


def grpc_scenario(address: str, classes: list[dict], **target):
    return scenario_from_dict({
        "target": {"url": f"grpc://{address}", "protocol": "kserve-v2-grpc", "model": "identity", "timeout": 10, **target},
        "workload": {"classes": classes},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
    })


async def send_all(scenario, order: list[int]):
    """(outcome, outputs) of each class in `order`, one after another, through one client."""
    client = KServeGrpcClient(scenario, list(range(len(scenario.workload.classes))), Payloads(scenario))
    await client.open()
    try:
        return [await client.infer(Request(i, time.perf_counter_ns(), cls, False, item=i)) for i, cls in enumerate(order)]
    finally:
        await client.close()


def test_reference_server_statuses_become_error_kinds(identity):
    scenario = grpc_scenario(identity.grpc, [
        {"name": "ok", "tensors": [X]},
        {"name": "wrong-model", "model": "nope", "tensors": [X]},
        {"name": "wrong-input", "tensors": [{**X, "name": "z"}]},
        {"name": "wrong-version", "kserve": {"version": "7"}, "tensors": [X]},
    ])
    (ok, outputs), (model, _), (tensor, _), (version, _) = asyncio.run(send_all(scenario, [0, 1, 2, 3]))
    assert ok.error is None and ok.status == 0 and outputs["y"].shape == (2, 384)
    assert ok.encode_ns > 0 and ok.decode_ns > 0 and {"queue", "compute"} <= ok.server_timing.keys()
    assert ok.bytes_out > 2 * 384 * 4 and ok.bytes_in > 2 * 384 * 4
    assert (model.error, model.status) == ("http_4xx", grpc.StatusCode.NOT_FOUND.value[0])
    assert model.reason == "gRPC NOT_FOUND: unknown model 'nope'; this server serves 'identity'"
    assert model.replica == ok.replica and ok.replica.startswith("r0-")  # trailing metadata of a failed call too
    assert (tensor.error, tensor.status) == ("http_4xx", grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert tensor.reason.startswith("gRPC INVALID_ARGUMENT: unknown input 'z'"), tensor.reason
    assert version.error == "http_4xx" and "has no version '7'" in version.reason


def test_dead_port_is_a_connect_error():
    scenario = grpc_scenario(f"127.0.0.1:{free_port()}", [{"name": "c", "tensors": [X]}])
    started = time.monotonic()
    results = asyncio.run(send_all(scenario, [0, 0, 0]))
    assert time.monotonic() - started < 5, "a refused connection fails fast, not at the deadline"
    for outcome, outputs in results:
        assert outputs is None
        assert (outcome.error, outcome.status) == ("connect", grpc.StatusCode.UNAVAILABLE.value[0])
        assert outcome.reason.startswith("gRPC UNAVAILABLE"), outcome.reason
        assert outcome.encode_ns > 0 and outcome.sent_ns < outcome.end_ns


# --- an in-process server doing what the reference server does not -----------------------------------------

class FakeServer:
    """ModelInfer by model name: 'typed' answers x back as typed fp32_contents, 'slow' misses the deadline,
    'garbage' answers bytes that are no protobuf, 'short' a raw output too short for its shape, 'boom' and
    'busy' fail with INTERNAL and RESOURCE_EXHAUSTED. Keeps every request and its metadata."""

    def __init__(self):
        self.seen: list[tuple[object, dict]] = []

    async def infer(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = proto.ModelInferRequest.FromString(body)
        self.seen.append((request, dict(context.invocation_metadata())))
        model = request.model_name
        context.set_trailing_metadata((("server-timing", "queue;dur=0.25, compute;dur=2"), ("x-replica-id", "fake-1")))
        if model == "slow":
            await asyncio.sleep(2)
        if model == "garbage":
            return b"\xff\xff\xff\xff"
        if model == "boom":
            await context.abort(grpc.StatusCode.INTERNAL, "backend crashed")
        if model == "busy":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        response = proto.ModelInferResponse(model_name=model)
        x = np.frombuffer(request.raw_input_contents[0], "<f4")
        if model == "short":
            response.outputs.add(name="y", datatype="FP32", shape=[2, 384])
            response.raw_output_contents.append(x[:10].tobytes())
        else:
            out = response.outputs.add(name="y", datatype="FP32", shape=request.inputs[0].shape)
            out.contents.fp32_contents.extend(x.tolist())
        return response.SerializeToString()

    async def start(self) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(self.infer)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(proto.SERVICE, {"ModelInfer": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port


def test_fake_server_answers_metadata_and_deadlines():
    fake = FakeServer()
    names = ["typed", "slow", "garbage", "short", "boom", "busy"]

    async def main():
        server, port = await fake.start()
        try:
            scenario = grpc_scenario(f"127.0.0.1:{port}", [
                {"name": n, "model": n, "tensors": [X], "kserve": {"outputs": ["y"]}, "headers": {"X-Team": n}}
                for n in names], timeout=0.5, api_key="k3y", request_id_header="X-Request-Id")
            return await send_all(scenario, list(range(len(names)))), Payloads(scenario)
        finally:
            await server.stop(0)

    results, payloads = asyncio.run(main())
    by_name = dict(zip(names, results))

    typed, outputs = by_name["typed"]
    assert typed.error is None, typed.reason
    x = payloads.get(Request(0, 0, 0, False, item=0)).tensors[0].array
    np.testing.assert_array_equal(outputs["y"], x)
    assert typed.server_timing == {"queue": 0.25, "compute": 2.0} and typed.replica == "fake-1"
    assert typed.decode_ns > 0 and typed.encode_ns > 0

    slow = by_name["slow"][0]
    assert slow.error == "timeout" and slow.reason.startswith("gRPC DEADLINE_EXCEEDED")
    assert 0.4e9 < slow.end_ns - slow.sent_ns < 1.5e9
    assert by_name["garbage"][0].error == "protocol"
    assert by_name["garbage"][0].reason.startswith("invalid tensor response: not a ModelInferResponse")
    assert by_name["short"][0].error == "protocol"
    assert by_name["short"][0].reason == ("invalid tensor response: output 'y': 40 bytes of binary data, "
                                          "shape [2, 384] of FP32 needs 3072")
    assert (by_name["boom"][0].error, by_name["boom"][0].reason) == ("http_5xx", "gRPC INTERNAL: backend crashed")
    assert (by_name["busy"][0].error, by_name["busy"][0].status) == ("http_4xx", 8)

    # What went on the wire: the model, the input's raw little-endian bytes, the output asked for, metadata.
    request, metadata = fake.seen[0]
    assert (request.model_name, request.model_version) == ("typed", "")
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [("x", "FP32", [2, 384])]
    assert request.raw_input_contents[0] == x.astype("<f4").tobytes()
    assert [o.name for o in request.outputs] == ["y"]
    assert metadata["x-team"] == "typed" and metadata["authorization"] == "Bearer k3y"
    assert [m["x-team"] for _, m in fake.seen] == names
    assert [request_row(m["x-request-id"]) for _, m in fake.seen] == list(range(len(names)))  # each call's seq


def test_messages_round_trip_and_bad_responses_are_named():
    tensors = [Tensor("ids", "INT64", np.arange(6, dtype=np.int64).reshape(2, 3)),
               Tensor("half", "FP16", np.array([0.5, 1.5], np.float16))]
    request = proto.ModelInferRequest.FromString(encode_infer_request("m", "2", tensors, []))
    assert (request.model_name, request.model_version, len(request.outputs)) == ("m", "2", 0)
    assert [list(i.shape) for i in request.inputs] == [[2, 3], [2]]
    assert request.raw_input_contents[1] == np.array([0.5, 1.5], "<f2").tobytes()

    response = proto.ModelInferResponse()
    for t in tensors:
        response.outputs.add(name=t.name, datatype=t.datatype, shape=t.array.shape)
        response.raw_output_contents.append(t.array.tobytes())
    out = decode_infer_response(response.SerializeToString())
    assert list(out) == ["ids", "half"]
    for t in tensors:
        np.testing.assert_array_equal(out[t.name], t.array)
        assert out[t.name].dtype == t.array.dtype

    response.raw_output_contents.pop()
    with pytest.raises(InvalidResponse, match="1 raw_output_contents for 2 outputs"):
        decode_infer_response(response.SerializeToString())
    with pytest.raises(InvalidResponse, match="no outputs"):
        decode_infer_response(proto.ModelInferResponse(model_name="m").SerializeToString())
    typed = proto.ModelInferResponse()
    half = typed.outputs.add(name="h", datatype="FP16", shape=[1])
    with pytest.raises(InvalidResponse, match="output 'h' has neither contents nor raw_output_contents"):
        decode_infer_response(typed.SerializeToString())
    half.contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidResponse, match="output 'h': FP16 has no typed contents field"):
        decode_infer_response(typed.SerializeToString())
    typed = proto.ModelInferResponse()
    typed.outputs.add(name="b", datatype="BOOL", shape=[1, 2]).contents.bool_contents.extend([True, False])
    typed.outputs.add(name="s", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b""])
    typed.outputs.add(name="u", datatype="UINT8", shape=[2]).contents.uint_contents.extend([7, 255])
    out = decode_infer_response(typed.SerializeToString())
    assert out["b"].tolist() == [[True, False]] and out["s"].tolist() == [b"ab", b""]
    assert out["u"].dtype == np.uint8 and out["u"].tolist() == [7, 255]
    typed = proto.ModelInferResponse()
    typed.outputs.add(name="i", datatype="INT64", shape=[3]).contents.int64_contents.extend([1, 2])
    with pytest.raises(InvalidResponse, match=r"output 'i': shape \[3\] needs 3 elements, contents.int64_contents has 2"):
        decode_infer_response(typed.SerializeToString())


def test_status_codes_map_to_error_kinds():
    kinds = {code.name: kind for code, kind in ERROR_KINDS_BY_CODE.items()}
    assert kinds["UNAVAILABLE"] == "connect" and kinds["DEADLINE_EXCEEDED"] == "timeout"
    assert {kinds[c] for c in ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNAUTHENTICATED",
                               "PERMISSION_DENIED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED")} == {"http_4xx"}
    assert {kinds[c] for c in ("INTERNAL", "UNKNOWN", "UNIMPLEMENTED", "DATA_LOSS", "ABORTED", "CANCELLED")} == {"http_5xx"}
    assert "OK" not in kinds
