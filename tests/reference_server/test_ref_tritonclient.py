"""The reference server checked by an independent client: NVIDIA's official `tritonclient`, over gRPC and
HTTP (JSON and binary tensors). Every output must equal what a plain REST JSON request returns."""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pytest

import refserver
from refserver import HIDDEN, MODEL, Server, embedding, http, json_body, running_with_grpc, token_inputs

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed (dev extra)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed (dev extra)")
from tritonclient.utils import InferenceServerException  # noqa: E402

# The shared module-scoped fixtures (refserver.py), bound here so that pytest finds them by name.
cache, logs = refserver.cache, refserver.logs


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[Server]:
    with running_with_grpc(cache, logs) as s:
        yield s


@pytest.fixture(scope="module")
def grpc_client(server) -> Iterator:
    client = grpcclient.InferenceServerClient(url=server.grpc)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(server) -> Iterator:
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield client
    client.close()


def rest_embedding(server: Server, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    status, headers, body = http("POST", server.infer_url, json_body(ids, mask))
    assert status == 200
    return embedding(headers, body)


def _inputs(module, ids: np.ndarray, mask: np.ndarray, **binary) -> list:
    inputs = []
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        tensor = module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, **binary)
        inputs.append(tensor)
    return inputs


def test_tritonclient_grpc_infer_equals_rest_json(server, grpc_client):
    ids, mask = token_inputs(rows=3, seq=10, seed=3, pad=4)
    expected = rest_embedding(server, ids, mask)
    result = grpc_client.infer(MODEL, _inputs(grpcclient, ids, mask),
                               outputs=[grpcclient.InferRequestedOutput("embedding")], request_id="t-1")
    got = result.as_numpy("embedding")
    assert got.shape == (3, HIDDEN) and got.dtype == np.float32
    assert np.array_equal(got, expected)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "t-1")
    # No outputs named: every output comes back.
    assert np.array_equal(grpc_client.infer(MODEL, _inputs(grpcclient, ids, mask)).as_numpy("embedding"), expected)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_infer_equals_rest_json(server, http_client, binary):
    ids, mask = token_inputs(rows=2, seq=7, seed=5, pad=2)
    expected = rest_embedding(server, ids, mask)
    result = http_client.infer(MODEL, _inputs(httpclient, ids, mask, binary_data=binary),
                               outputs=[httpclient.InferRequestedOutput("embedding", binary_data=binary)],
                               request_id="t-2")
    got = result.as_numpy("embedding")
    assert got.shape == (2, HIDDEN) and np.array_equal(got.astype(np.float32), expected)
    response = result.get_response()
    assert response["model_name"] == MODEL and response["id"] == "t-2"
    assert ("parameters" in response["outputs"][0]) == binary  # binary_data_size only for binary outputs


def test_tritonclient_health_and_metadata(server, grpc_client, http_client):
    rest = json.loads(http("GET", f"{server.url}/v2/models/{MODEL}")[2])
    for client in (grpc_client, http_client):
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert client.get_server_metadata(**({"as_json": True} if client is grpc_client else {}))["name"] \
            == "latscope-ref"
    http_meta = http_client.get_model_metadata(MODEL)
    assert http_meta == rest
    grpc_meta = grpc_client.get_model_metadata(MODEL, as_json=True)  # protobuf JSON: int64 shapes as strings
    assert (grpc_meta["name"], grpc_meta["platform"], grpc_meta["versions"]) == (MODEL, rest["platform"], ["1"])
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc_meta["inputs"]] \
        == [(t["name"], t["datatype"], t["shape"]) for t in rest["inputs"]]
    assert [int(d) for d in grpc_meta["outputs"][0]["shape"]] == [-1, HIDDEN]


def test_tritonclient_sees_not_found_and_invalid_argument(grpc_client, http_client):
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.get_model_metadata("nope")
    assert "NOT_FOUND" in caught.value.status() and "'nope'" in caught.value.message()

    wrong = grpcclient.InferInput("input_ids", [1, 4], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 4), np.float32))
    mask = grpcclient.InferInput("attention_mask", [1, 4], "INT64")
    mask.set_data_from_numpy(np.ones((1, 4), np.int64))
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer(MODEL, [wrong, mask])
    assert "INVALID_ARGUMENT" in caught.value.status() and "input_ids" in caught.value.message()

    wrong = httpclient.InferInput("input_ids", [1, 4], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 4), np.float32))
    mask = httpclient.InferInput("attention_mask", [1, 4], "INT64")
    mask.set_data_from_numpy(np.ones((1, 4), np.int64))
    with pytest.raises(InferenceServerException) as caught:
        http_client.infer(MODEL, [wrong, mask])
    assert "input_ids" in caught.value.message()


def test_server_messages_and_tritonclient_stubs_coexist_in_one_process():
    # Both define inference.ModelInferRequest; the server's live in a private descriptor pool, so importing
    # both (as this test session does) works, and the bytes are interchangeable.
    from tritonclient.grpc import service_pb2

    from reference_server import proto

    ours = proto.ModelInferRequest(model_name=MODEL, raw_input_contents=[b"\x01\x02"])
    ours.inputs.add(name="input_ids", datatype="INT64", shape=[1, 2])
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.model_name == MODEL and list(theirs.inputs[0].shape) == [1, 2]
    assert proto.ModelInferRequest.FromString(theirs.SerializeToString()) == ours
