"""The TensorRT backend's CPU-testable parts: optimization profile, engine cache key, backend choice.

Building and running an engine needs TensorRT and an NVIDIA GPU; `test_engine_builds_and_matches_onnxruntime`
runs only there and is skipped, with the reason, everywhere else (CI included).
"""

from __future__ import annotations

import numpy as np
import pytest

from reference_server.backends import choose_backend
from reference_server.backends.base import BackendUnavailable
from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.backends.tensorrt import TensorRTBackend, engine_cache_key, optimization_profile, tensorrt_unavailable
from reference_server.model import EncoderConfig, cached_encoder
from reference_server.signature import Signature, TensorSpec, read_signature

PROFILE = {"input_ids": ((1, 1), (8, 128), (32, 512))}
KEY_ARGS = dict(model_bytes=b"onnx", gpu="NVIDIA H100", compute_capability=(9, 0), trt_version="10.3.0",
                fp16=True, profile=PROFILE)


@pytest.fixture(scope="module")
def encoder_path(tmp_path_factory):
    path, _ = cached_encoder(EncoderConfig(layers=1), tmp_path_factory.mktemp("cache"))
    return path


def test_profile_spans_batch_and_declared_sequence_limit(encoder_path):
    profile = optimization_profile(read_signature(encoder_path), max_batch=32)
    assert profile == {
        "input_ids": ((1, 1), (8, 128), (32, 512)),
        "attention_mask": ((1, 1), (8, 128), (32, 512)),
    }


def test_profile_keeps_fixed_dims_and_refuses_unbounded_ones():
    fixed = Signature(inputs=(TensorSpec("x", "FP32", ("batch", 384)),), outputs=(TensorSpec("y", "FP32", ("batch", 1)),))
    assert optimization_profile(fixed, max_batch=4) == {"x": ((1, 384), (1, 384), (4, 384))}
    unbounded = Signature(inputs=(TensorSpec("x", "INT64", ("batch", "tokens")),),
                          outputs=(TensorSpec("y", "FP32", ("batch", 8)),))
    with pytest.raises(ValueError, match="max_dim:tokens"):
        optimization_profile(unbounded, max_batch=4)


def test_engine_cache_key_is_stable_and_changes_with_everything_that_changes_the_engine():
    key = engine_cache_key(**KEY_ARGS)
    assert key == engine_cache_key(**KEY_ARGS) and len(key) == 32
    changes = [
        {"model_bytes": b"onnx2"}, {"gpu": "NVIDIA H200"}, {"compute_capability": (8, 0)},
        {"trt_version": "10.4.0"}, {"fp16": False}, {"profile": {"input_ids": ((1, 1), (8, 128), (64, 512))}},
    ]
    keys = {engine_cache_key(**{**KEY_ARGS, **change}) for change in changes}
    assert len(keys) == len(changes) and key not in keys


@pytest.mark.skipif(tensorrt_unavailable() is None, reason="TensorRT and a GPU are present: selection differs")
def test_without_tensorrt_auto_picks_onnxruntime_and_says_why_and_tensorrt_is_refused():
    backend, why = choose_backend("auto")
    assert backend is OnnxRuntimeBackend and tensorrt_unavailable() in why
    with pytest.raises(BackendUnavailable, match="use --backend onnxruntime"):
        choose_backend("tensorrt")


@pytest.mark.skipif(tensorrt_unavailable() is not None, reason=f"needs TensorRT on a GPU: {tensorrt_unavailable()}")
def test_engine_builds_and_matches_onnxruntime(encoder_path, tmp_path):
    backend, _ = choose_backend("auto")
    assert backend is TensorRTBackend
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, 8192, (4, 64)), "attention_mask": np.ones((4, 64), np.int64)}
    trt = TensorRTBackend(encoder_path, max_batch=8, cache_dir=tmp_path)
    trt.load()
    reference = OnnxRuntimeBackend(encoder_path)
    reference.load()
    np.testing.assert_allclose(trt.run(inputs)["embedding"], reference.run(inputs)["embedding"], atol=2e-2)
    assert trt.engine_path.is_file(), "the engine is cached for the next start"
