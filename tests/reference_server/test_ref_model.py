"""The built-in encoder is generated deterministically and cached; any ONNX file's signature is read from its graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from reference_server.model import EncoderConfig, IdentityConfig, build_encoder, cached_encoder, cached_identity
from reference_server.signature import TensorSpec, read_signature

SMALL = EncoderConfig(layers=1)


def test_building_twice_gives_byte_identical_onnx(tmp_path):
    first, reused_first = cached_encoder(SMALL, tmp_path / "a")
    second, reused_second = cached_encoder(SMALL, tmp_path / "b")
    assert not reused_first and not reused_second
    assert first.read_bytes() == second.read_bytes()
    assert build_encoder(SMALL).SerializeToString() == first.read_bytes()


def test_cache_is_keyed_by_parameters_and_reused(tmp_path):
    path, _ = cached_encoder(SMALL, tmp_path)
    mtime = path.stat().st_mtime_ns
    again, reused = cached_encoder(SMALL, tmp_path)
    assert reused and again == path and again.stat().st_mtime_ns == mtime
    other, reused_other = cached_encoder(EncoderConfig(layers=2), tmp_path)
    assert other != path and not reused_other
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, other.name])  # no temp files left


def test_encoder_signature_and_outputs(tmp_path):
    path, _ = cached_encoder(SMALL, tmp_path)
    sig = read_signature(path)
    assert sig.inputs == (TensorSpec("input_ids", "INT64", ("batch", "sequence")),
                          TensorSpec("attention_mask", "INT64", ("batch", "sequence")))
    assert sig.outputs == (TensorSpec("embedding", "FP32", ("batch", 384)),)
    assert sig.dim_limits == {"sequence": 512} and sig.batch_dim == "batch"

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[5, 9000, -3, 7], [1, 2, 0, 0]], np.int64)  # out-of-vocabulary ids are taken modulo vocab
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int64)
    (emb,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert emb.shape == (2, 384) and emb.dtype == np.float32 and np.isfinite(emb).all()
    # Padding is invisible: row 2 alone, unpadded, gives the same embedding.
    (alone,) = session.run(None, {"input_ids": ids[1:, :2], "attention_mask": mask[1:, :2]})
    np.testing.assert_allclose(alone[0], emb[1], atol=1e-5)
    # An all-zero mask gives finite output, not NaN.
    (empty,) = session.run(None, {"input_ids": ids[:1], "attention_mask": np.zeros_like(ids[:1])})
    assert np.isfinite(empty).all()


def test_user_model_signature_is_read_from_its_graph(tmp_path):
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], [0.5] * 8)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "user",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 2])],  # an initializer listed as input
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        initializer=[weight])
    path = tmp_path / "user.onnx"
    onnx.save_model(helper.make_model(graph), str(path))
    sig = read_signature(path)
    assert sig.inputs == (TensorSpec("x", "FP32", ("n", 4)),)
    assert sig.outputs == (TensorSpec("y", "FP32", ("n", 2)),)
    assert sig.batch_dim == "n" and sig.dim_limits == {}
    assert sig.inputs[0].v2_shape() == [-1, 4]


def test_identity_model_returns_its_input_and_is_cached(tmp_path):
    path, reused = cached_identity(IdentityConfig(), tmp_path)
    assert not reused and cached_identity(IdentityConfig(), tmp_path) == (path, True)
    x = np.random.default_rng(0).standard_normal((32, 384)).astype(np.float32)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(x, y)
