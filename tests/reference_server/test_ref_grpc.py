"""The reference server's KServe v2 gRPC front end, as a real process over the wire: the same outputs as
REST JSON and REST binary, the same validation (INVALID_ARGUMENT naming the input), NOT_FOUND,
RESOURCE_EXHAUSTED, Server-Timing and replica id in trailing metadata, metrics, graceful shutdown.
Messages come from `reference_server.proto` (its private descriptor pool), calls from plain grpcio."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Iterator

import grpc
import numpy as np
import pytest

from reference_server import grpc_server, proto, v2
from reference_server.signature import Signature, TensorSpec
import refserver
from refserver import (HIDDEN, MODEL, Server, binary_body, embedding, http, json_body, running_with_grpc, scrape,
                       server_timing, token_inputs)

INPUTS = ("input_ids", "attention_mask")

# The shared module-scoped fixtures (refserver.py), bound here so that pytest finds them by name.
cache, logs = refserver.cache, refserver.logs


# --- calling the gRPC front end ------------------------------------------------------------------------

class Client:
    """Unary calls to inference.GRPCInferenceService with the message classes of reference_server.proto."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)

    def method(self, name: str):
        request, response = proto.METHODS[name]
        return self.channel.unary_unary(proto.method_path(name), request_serializer=request.SerializeToString,
                                        response_deserializer=response.FromString)

    def call(self, name: str, request, timeout: float = 30):
        """(response, trailing metadata as a dict)."""
        response, call = self.method(name).with_call(request, timeout=timeout)
        return response, dict(call.trailing_metadata())

    def error(self, name: str, request) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            self.method(name).with_call(request, timeout=30)
        return caught.value

    def raw_error(self, name: str, body: bytes) -> grpc.RpcError:
        """Send `body` as is (no protobuf encoding)."""
        with pytest.raises(grpc.RpcError) as caught:
            self.channel.unary_unary(proto.method_path(name)).with_call(body, timeout=30)
        return caught.value

    def close(self) -> None:
        self.channel.close()


def infer_request(ids: np.ndarray, mask: np.ndarray, *, typed: bool = False, request_id: str = "", outputs=()):
    """A ModelInferRequest for the encoder: raw_input_contents, or typed int64_contents."""
    request = proto.ModelInferRequest(model_name=MODEL, id=request_id)
    for name, array in zip(INPUTS, (ids, mask)):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=array.shape)
        if typed:
            tensor.contents.int64_contents.extend(array.ravel().tolist())
        else:
            request.raw_input_contents.append(array.astype("<i8").tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def grpc_embedding(response) -> np.ndarray:
    (out,) = response.outputs
    assert out.name == "embedding" and out.datatype == "FP32"
    (blob,) = response.raw_output_contents
    return np.frombuffer(blob, "<f4").reshape(tuple(out.shape))


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[Server]:
    with running_with_grpc(cache, logs) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> Iterator[Client]:
    c = Client(server.grpc)
    yield c
    c.close()


def assert_ready(client: Client) -> None:
    assert client.call("ServerReady", proto.ServerReadyRequest())[0].ready


# --- same answers as REST ------------------------------------------------------------------------------

def test_rest_json_rest_binary_and_grpc_give_identical_embeddings(server, client):
    ids, mask = token_inputs(rows=2, seq=12, pad=5)
    status, headers, body = http("POST", server.infer_url, json_body(ids, mask))
    assert status == 200
    from_json = embedding(headers, body)
    status, headers, body = http("POST", server.infer_url, *binary_body(ids, mask, binary_data_output=True))
    assert status == 200 and "Inference-Header-Content-Length" in headers
    from_binary = embedding(headers, body)

    response, _ = client.call("ModelInfer", infer_request(ids, mask, request_id="req-7"))
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "req-7")
    from_raw = grpc_embedding(response)
    from_typed = grpc_embedding(client.call("ModelInfer", infer_request(ids, mask, typed=True,
                                                                        outputs=["embedding"]))[0])

    assert from_json.shape == (2, HIDDEN) and np.isfinite(from_json).all()
    for other in (from_binary, from_raw, from_typed):
        assert np.array_equal(other, from_json)
    # Byte for byte what the REST binary extension sends.
    assert response.raw_output_contents[0] == body[int(headers["Inference-Header-Content-Length"]):]


def test_metadata_rpcs_answer_like_rest(server, client):
    rest_replica = http("GET", f"{server.url}/v2/health/ready")[1]["X-Replica-Id"]
    live, trailing = client.call("ServerLive", proto.ServerLiveRequest())
    assert live.live and trailing["x-replica-id"] == rest_replica
    assert client.call("ServerReady", proto.ServerReadyRequest())[0].ready
    assert client.call("ModelReady", proto.ModelReadyRequest(name=MODEL))[0].ready
    assert client.call("ModelReady", proto.ModelReadyRequest(name=MODEL, version="1"))[0].ready

    meta = client.call("ServerMetadata", proto.ServerMetadataRequest())[0]
    rest_meta = json.loads(http("GET", f"{server.url}/v2")[2])
    assert (meta.name, meta.version, list(meta.extensions)) == (rest_meta["name"], rest_meta["version"],
                                                                rest_meta["extensions"])

    model = client.call("ModelMetadata", proto.ModelMetadataRequest(name=MODEL))[0]
    rest_model = json.loads(http("GET", f"{server.url}/v2/models/{MODEL}")[2])
    def tensors(items) -> list[dict]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    assert {"name": model.name, "versions": list(model.versions), "platform": model.platform,
            "inputs": tensors(model.inputs), "outputs": tensors(model.outputs)} == rest_model


def test_server_timing_and_replica_id_are_in_trailing_metadata(server, client):
    request = infer_request(*token_inputs(rows=1, seq=64))
    started = time.perf_counter()
    _, trailing = client.call("ModelInfer", request)
    elapsed_ms = (time.perf_counter() - started) * 1000
    parts = server_timing(trailing["server-timing"])
    assert set(parts) == {"queue", "deser", "compute", "ser", "batch"} and parts["batch"] == "1"
    durations = [float(parts[name]) for name in ("queue", "deser", "compute", "ser")]
    assert all(d >= 0 for d in durations) and float(parts["compute"]) > 0
    assert sum(durations) <= elapsed_ms
    assert trailing["x-replica-id"] == http("GET", f"{server.url}/v2")[1]["X-Replica-Id"]


# --- bad input -----------------------------------------------------------------------------------------

def _valid(**changes):
    """A valid 1x4 raw request with `changes` applied to its first input (or, for raw=..., its raw contents)."""
    request = infer_request(*token_inputs(rows=1, seq=4))
    raw = changes.pop("raw", None)
    if raw is not None:
        del request.raw_input_contents[:]
        request.raw_input_contents.extend(raw)
    for key, value in changes.items():
        if key == "shape":
            del request.inputs[0].shape[:]
            request.inputs[0].shape.extend(value)
        else:
            setattr(request.inputs[0], key, value)
    return request


def _typed(field: str, values: list, shape=(1, 4)):
    request = infer_request(*token_inputs(rows=1, seq=4), typed=True)
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend(shape)
    request.inputs[0].contents.Clear()
    getattr(request.inputs[0].contents, field).extend(values)
    return request


def _edit(request, fn):
    fn(request)
    return request


_MASK = np.ones((1, 4), "<i8").tobytes()
_IDS = np.arange(4, dtype="<i8").tobytes()


@pytest.mark.parametrize("request_, words", [
    pytest.param(_valid(datatype="FP32"), ["input_ids", "FP32", "INT64"], id="wrong-datatype"),
    pytest.param(_valid(datatype="FLOAT"), ["input_ids", "known datatypes"], id="unknown-datatype"),
    pytest.param(_valid(raw=[_IDS[:24], _MASK]), ["input_ids", "raw_input_contents[0]", "24 bytes", "32 bytes"],
                 id="raw-size"),
    pytest.param(_valid(raw=[_IDS]), ["raw_input_contents", "1 entries", "2 inputs"], id="raw-count"),
    pytest.param(_valid(shape=[4]), ["input_ids", "dimensions"], id="wrong-rank"),
    pytest.param(_valid(shape=[1, 2], raw=[_IDS[:16], _MASK]), ["attention_mask", "input_ids", "agree"],
                 id="inputs-disagree"),
    pytest.param(_valid(shape=[1, 600], raw=[bytes(4800), _MASK]), ["input_ids", "at most 512"], id="too-long"),
    pytest.param(_valid(shape=[1, 0], raw=[b"", _MASK]), ["input_ids", "dimension 1 is 0"], id="empty-dim"),
    pytest.param(_valid(name="token_ids"), ["token_ids", "input_ids"], id="unknown-input"),
    pytest.param(_valid(name="attention_mask"), ["attention_mask", "twice"], id="duplicate-input"),
    pytest.param(_edit(_valid(raw=[_IDS]), lambda r: r.inputs.pop()), ["missing input", "attention_mask"],
                 id="missing-input"),
    pytest.param(_typed("fp32_contents", [1.0, 2.0, 3.0, 4.0]), ["input_ids", "int64_contents", "fp32_contents"],
                 id="typed-wrong-field"),
    pytest.param(_typed("int64_contents", [1, 2, 3]), ["input_ids", "4 elements", "has 3"], id="typed-count"),
    pytest.param(_edit(_valid(), lambda r: r.inputs[0].contents.int64_contents.extend([1, 2, 3, 4])),
                 ["input_ids", "raw_input_contents", "one or the other"], id="raw-and-typed"),
    pytest.param(_valid(raw=[]), ["input_ids", "neither"], id="no-data"),
    pytest.param(_edit(_valid(), lambda r: r.outputs.add(name="logits")), ["unknown output", "logits", "embedding"],
                 id="unknown-output"),
    pytest.param(_edit(_valid(), lambda r: r.inputs[0].parameters["shared_memory_region"].CopyFrom(
        proto.InferParameter(string_param="region0"))), ["input_ids", "shared memory"], id="shared-memory"),
    pytest.param(infer_request(*token_inputs(rows=33, seq=4)), ["batch size 33", "at most 32", "split"],
                 id="too-many-rows"),
    pytest.param(proto.ModelInferRequest(model_name=MODEL), ["'inputs'", "non-empty"], id="no-inputs"),
])
def test_bad_requests_get_invalid_argument_naming_the_problem(client, request_, words):
    error = client.error("ModelInfer", request_)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert all(w in error.details() for w in words), error.details()
    assert dict(error.trailing_metadata())["x-replica-id"]
    assert_ready(client)


def test_bytes_that_are_not_protobuf_get_invalid_argument_not_internal(client):
    for name in ("ModelInfer", "ModelMetadata"):
        error = client.raw_error(name, b"\xff\xff\xff\xff")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in error.details()
    assert_ready(client)


def test_unknown_model_or_version_is_not_found(client):
    request = infer_request(*token_inputs(rows=1, seq=4))
    request.model_name = "nope"
    for name, message in (("ModelInfer", request), ("ModelMetadata", proto.ModelMetadataRequest(name="nope")),
                          ("ModelReady", proto.ModelReadyRequest(name="nope"))):
        error = client.error(name, message)
        assert error.code() == grpc.StatusCode.NOT_FOUND and "'nope'" in error.details(), name
    error = client.error("ModelMetadata", proto.ModelMetadataRequest(name=MODEL, version="7"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "version '7'" in error.details()


def test_message_over_max_body_bytes_is_resource_exhausted(client):
    request = infer_request(*token_inputs(rows=1, seq=4))
    request.raw_input_contents[0] = bytes(16 * 1024 * 1024 + 1)  # the default --max-body-bytes is 16 MiB
    error = client.error("ModelInfer", request)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert_ready(client)


def test_grpc_requests_are_counted_in_the_prometheus_metrics(server, client):
    client.call("ModelInfer", infer_request(*token_inputs(rows=1, seq=8)))
    client.error("ModelInfer", _valid(datatype="FP32"))
    text = scrape(server.url)
    endpoint = 'endpoint="/inference.GRPCInferenceService/ModelInfer"'
    for line in (f'latscope_ref_requests_total{{{endpoint},status="OK"}}',
                 f'latscope_ref_requests_total{{{endpoint},status="INVALID_ARGUMENT"}}',
                 f'latscope_ref_request_duration_seconds_count{{{endpoint}}}'):
        assert line in text, line


# --- overload and shutdown (servers of their own) ------------------------------------------------------

def test_overload_is_resource_exhausted_with_retry_after_while_accepted_requests_complete(cache, tmp_path):
    with running_with_grpc(cache, tmp_path, "--max-queue", "1", "--max-batch-size", "1") as strict:
        c = Client(strict.grpc)
        try:
            method = c.method("ModelInfer")
            futures = [method.future(infer_request(*token_inputs(rows=1, seq=512, seed=i)), timeout=60)
                       for i in range(30)]
            codes = []
            for future in futures:
                try:
                    response = future.result()
                except grpc.RpcError as error:
                    codes.append(error.code())
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
                    assert "overloaded" in error.details()
                    assert dict(error.trailing_metadata())["retry-after"] == "1"
                else:
                    codes.append(grpc.StatusCode.OK)
                    assert grpc_embedding(response).shape == (1, HIDDEN)
            assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
            assert_ready(c)
        finally:
            c.close()


def test_sigterm_lets_in_flight_grpc_requests_finish(cache, tmp_path):
    answer: list = []
    with running_with_grpc(cache, tmp_path, "--extra-latency-ms", "1500") as slow:
        c = Client(slow.grpc)
        thread = threading.Thread(target=lambda: answer.append(
            c.call("ModelInfer", infer_request(*token_inputs(rows=1, seq=8)))))
        thread.start()
        time.sleep(0.5)  # the request is inside its handler, sleeping
    # running_with_grpc sent SIGTERM and checked exit status 0; the request still got its answer.
    thread.join(10)
    c.close()
    assert answer and grpc_embedding(answer[0][0]).shape == (1, HIDDEN)


# --- without a server ----------------------------------------------------------------------------------

def test_grpc_port_flag_semantics(monkeypatch):
    async def check() -> None:
        assert grpc_server.bind_grpc("127.0.0.1", grpc_server.OFF, max_body_bytes=1024) is None
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match="cannot listen"):  # asked for explicitly: an error
                grpc_server.bind_grpc("127.0.0.1", port, max_body_bytes=1024)
            monkeypatch.setattr(grpc_server, "DEFAULT_PORT", port)  # the default: off, with a warning
            assert grpc_server.bind_grpc("127.0.0.1", None, max_body_bytes=1024) is None
        front = grpc_server.bind_grpc("127.0.0.1", 0, max_body_bytes=1024)
        assert front is not None and front.port > 0 and front.address == f"127.0.0.1:{front.port}"
        await front.stop(0)

    asyncio.run(check())


def test_typed_contents_of_other_datatypes_are_checked_like_json_data():
    signature = Signature(inputs=(TensorSpec("x", "FP32", ("batch", 2)), TensorSpec("b", "INT8", ("batch", 2))),
                          outputs=(TensorSpec("y", "FP32", ("batch", 2)),))

    def request(x_field="fp32_contents", x=(1.5, 2.0), b=(1, -3)):
        message = proto.ModelInferRequest(model_name="m")
        for name, datatype, field, values in (("x", "FP32", x_field, x), ("b", "INT8", "int_contents", b)):
            tensor = message.inputs.add(name=name, datatype=datatype, shape=[1, 2])
            getattr(tensor.contents, field).extend(values)
        return message

    decoded = grpc_server.decode_infer_request(request(), signature)
    assert decoded.inputs["x"].dtype == np.float32 and decoded.inputs["x"].tolist() == [[1.5, 2.0]]
    assert decoded.inputs["b"].dtype == np.int8 and decoded.inputs["b"].tolist() == [[1, -3]]
    assert decoded.outputs == [("y", True)] and decoded.id is None
    with pytest.raises(v2.BadRequest, match="'b': data has values outside the INT8 range"):
        grpc_server.decode_infer_request(request(b=(1, 300)), signature)
    with pytest.raises(v2.BadRequest, match="'x': FP32 data goes in contents.fp32_contents alone"):
        grpc_server.decode_infer_request(request(x_field="fp64_contents"), signature)


def test_fp16_travels_only_in_raw_input_contents():
    signature = Signature(inputs=(TensorSpec("h", "FP16", ("batch", 2)),),
                          outputs=(TensorSpec("y", "FP16", ("batch", 2)),))
    message = proto.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="h", datatype="FP16", shape=[1, 2])
    message.raw_input_contents.append(np.array([[0.5, 2.0]], "<f2").tobytes())
    decoded = grpc_server.decode_infer_request(message, signature)
    assert decoded.inputs["h"].dtype == np.float16 and decoded.inputs["h"].tolist() == [[0.5, 2.0]]
    del message.raw_input_contents[:]
    tensor.contents.fp32_contents.extend([0.5, 2.0])
    with pytest.raises(v2.BadRequest, match="'h': FP16 has no typed contents field"):
        grpc_server.decode_infer_request(message, signature)


def test_checked_in_descriptor_matches_the_proto():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) compiles the .proto")
    from reference_server.proto import _descriptor, generate

    assert generate.compile_proto() == _descriptor.SERIALIZED_FILE, \
        "reference_server/proto/_descriptor.py is stale: run python reference_server/proto/generate.py"
