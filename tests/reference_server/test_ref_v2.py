"""KServe v2 messages (reference_server/v2.py) as pure functions: what the response's JSON says, and which
request data is taken as is or checked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reference_server import v2
from reference_server.signature import Signature, TensorSpec

SIGNATURE = Signature(
    inputs=(TensorSpec("ids", "INT64", ("batch", "n")), TensorSpec("small", "INT32", ("batch", "n"))),
    outputs=(TensorSpec("f32", "FP32", ("batch", "n")), TensorSpec("i64", "INT64", ("batch", "n")),
             TensorSpec("flag", "BOOL", ("batch", "n")), TensorSpec("half", "FP16", ("batch", "n"))))


def encoded(outputs: dict[str, np.ndarray]) -> tuple[str, dict]:
    request = v2.InferRequest("req-1", {}, [(name, False) for name in outputs])
    body, headers = v2.encode_response("m", request, outputs, SIGNATURE)
    assert headers == {"Content-Type": "application/json"}
    return body.decode(), json.loads(body)


def test_json_outputs_are_the_arrays_values_with_float32_in_shortest_form():
    f32 = np.array([[0.1, 1 / 3, -2.5e-8], [3.4e38, 0.0, -1.0]], np.float32)
    columns = f32[:, :2]  # a cut, not contiguous: as the batcher cuts outputs back to a request's length
    text, doc = encoded({"f32": columns, "i64": np.array([[2**62, -7]]), "flag": np.array([[True, False]]),
                         "half": np.array([[0.5, 65504]], np.float16)})
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert doc["id"] == "req-1" and by_name["f32"]["shape"] == [2, 2]
    # float32 written as the shortest text that reads back to the same float32: "0.1", not Python's
    # 0.10000000149011612 for the same value widened to float64.
    assert "0.1," in text and "0.10000000149011612" not in text
    np.testing.assert_array_equal(np.array(by_name["f32"]["data"], np.float32), columns.ravel())
    assert by_name["i64"]["data"] == [2**62, -7] and by_name["flag"]["data"] == [True, False]
    assert by_name["half"]["data"] == [0.5, 65504.0]


def test_json_inputs_of_the_models_type_are_taken_as_is_others_are_checked():
    ids = v2.from_json(SIGNATURE.inputs[0], [[1, 2, 3]], (1, 3))
    assert ids.dtype == np.int64 and ids.tolist() == [[1, 2, 3]]
    small = v2.from_json(SIGNATURE.inputs[1], [[1, 2, 3]], (1, 3))  # int64 as read, narrowed to INT32
    assert small.dtype == np.int32
    with pytest.raises(v2.BadRequest, match="outside the INT32 range"):
        v2.from_json(SIGNATURE.inputs[1], [[2**40, 0, 0]], (1, 3))
    with pytest.raises(v2.BadRequest, match="floating-point numbers; INT64 needs integers"):
        v2.from_json(SIGNATURE.inputs[0], [[1.5, 2, 3]], (1, 3))
    with pytest.raises(v2.BadRequest, match="needs 3 elements, data has 2"):
        v2.from_json(SIGNATURE.inputs[0], [[1, 2]], (1, 3))
