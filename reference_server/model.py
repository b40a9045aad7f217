"""The built-in model: a sentence-embedding-shaped transformer encoder, generated as ONNX.

Generated rather than downloaded so the server starts on a machine with no network and every
run measures the same graph. Weights are seeded random (std 0.02): the arithmetic, and so the
latency, is that of a real encoder (token + position embeddings, masked multi-head self-attention,
LayerNorm, GELU FFN, mean pooling), while the embeddings themselves mean nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reference_server.signature import MAX_DIM_PREFIX

# Bump when the graph built below changes, so caches keyed on the parameters are not reused wrongly.
BUILD_VERSION = 1
OPSET = 17  # first opset with LayerNormalization
IR_VERSION = 8  # an IR that onnxruntime 1.18 (our lower bound: the first with GroupQueryAttention on CPU) loads
DEFAULT_CACHE = Path("~/.cache/latscope-ref")  # the CLI's --cache-dir / $LATSCOPE_REF_CACHE override it
BATCH, SEQUENCE = "batch", "sequence"


@dataclass(frozen=True)
class EncoderConfig:
    layers: int = 6
    hidden: int = 384
    heads: int = 6
    ffn: int = 1536
    vocab: int = 8192
    max_seq: int = 512
    seed: int = 0


class _Graph:
    """Accumulates nodes and seeded weights; names are generated so the layer code reads like the math."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self._name(prefix)
        self.weights.append(numpy_helper.from_array(value, name))
        return name

    def random(self, *shape: int) -> str:
        return self.const((self.rng.standard_normal(shape) * 0.02).astype(np.float32), "w")

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.random(n_in, n_out)),
                       self.const(np.zeros(n_out, np.float32), "b"))

    def layer_norm(self, x: str, hidden: int) -> str:
        return self.op("LayerNormalization", x, self.const(np.ones(hidden, np.float32), "gamma"),
                       self.const(np.zeros(hidden, np.float32), "beta"), axis=-1, epsilon=1e-12)

    def gelu(self, x: str) -> str:
        """Exact GELU, 0.5·x·(1 + erf(x/√2)): the pattern ONNX Runtime fuses into one Gelu kernel."""
        erf = self.op("Erf", self.op("Mul", x, self.const(np.array(1 / np.sqrt(2), np.float32))))
        one_plus = self.op("Add", erf, self.const(np.array(1.0, np.float32)))
        return self.op("Mul", self.op("Mul", x, one_plus), self.const(np.array(0.5, np.float32)))


def _attention(g: _Graph, x: str, mask_bias: str, cfg: EncoderConfig) -> str:
    head_dim = cfg.hidden // cfg.heads
    split_heads = g.const(np.array([0, 0, cfg.heads, head_dim], np.int64))  # 0 keeps batch and sequence
    q, k, v = (g.op("Reshape", g.linear(x, cfg.hidden, cfg.hidden), split_heads) for _ in range(3))
    q = g.op("Transpose", q, perm=[0, 2, 1, 3])  # [B, heads, S, head_dim]
    k = g.op("Transpose", k, perm=[0, 2, 3, 1])  # [B, heads, head_dim, S]
    v = g.op("Transpose", v, perm=[0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", q, k), g.const(np.array(1 / np.sqrt(head_dim), np.float32)))
    probs = g.op("Softmax", g.op("Add", scores, mask_bias), axis=-1)
    context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    merged = g.op("Reshape", context, g.const(np.array([0, 0, cfg.hidden], np.int64)))
    return g.linear(merged, cfg.hidden, cfg.hidden)


def build_encoder(cfg: EncoderConfig) -> onnx.ModelProto:
    """The encoder graph: input_ids, attention_mask int64 [batch, sequence] -> embedding float32 [batch, hidden]."""
    if cfg.hidden % cfg.heads:
        raise ValueError(f"hidden size {cfg.hidden} is not divisible by {cfg.heads} heads")
    g = _Graph(cfg.seed)
    # Token ids are taken modulo the vocabulary, so any int64 is a valid id and Gather never fails.
    ids = g.op("Mod", "input_ids", g.const(np.array(cfg.vocab, np.int64)), fmod=0)
    tokens = g.op("Gather", g.random(cfg.vocab, cfg.hidden), ids)
    seq_len = g.op("Gather", g.op("Shape", "input_ids"), g.const(np.array(1, np.int64)), axis=0)
    positions = g.op("Range", g.const(np.array(0, np.int64)), seq_len, g.const(np.array(1, np.int64)))
    x = g.layer_norm(g.op("Add", tokens, g.op("Gather", g.random(cfg.max_seq, cfg.hidden), positions)), cfg.hidden)

    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [B, S]
    # Additive bias: 0 where attended, -1e9 where masked, broadcast to [B, 1, 1, S] over heads and queries.
    masked = g.op("Sub", g.const(np.array(1.0, np.float32)), mask)
    bias = g.op("Unsqueeze", g.op("Mul", masked, g.const(np.array(-1e9, np.float32))),
                g.const(np.array([1, 2], np.int64)))

    for _ in range(cfg.layers):
        x = g.layer_norm(g.op("Add", x, _attention(g, x, bias, cfg)), cfg.hidden)
        ffn = g.linear(g.gelu(g.linear(x, cfg.hidden, cfg.ffn)), cfg.ffn, cfg.hidden)
        x = g.layer_norm(g.op("Add", x, ffn), cfg.hidden)

    # Mean over attended tokens; the count is clamped to 1 so an all-zero mask gives zeros, not NaN.
    mask3 = g.op("Unsqueeze", mask, g.const(np.array([2], np.int64)))
    summed = g.op("ReduceSum", g.op("Mul", x, mask3), g.const(np.array([1], np.int64)), keepdims=0)
    count = g.op("Max", g.op("ReduceSum", mask, g.const(np.array([1], np.int64)), keepdims=1),
                 g.const(np.array(1.0, np.float32)))
    g.nodes.append(helper.make_node("Div", [summed, count], ["embedding"]))

    token_input = [BATCH, SEQUENCE]
    graph = helper.make_graph(
        g.nodes, "latscope_ref_encoder",
        inputs=[helper.make_tensor_value_info("input_ids", TensorProto.INT64, token_input),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, token_input)],
        outputs=[helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [BATCH, cfg.hidden])],
        initializer=g.weights,
    )
    return finish_model(graph, SEQUENCE, cfg.max_seq, cfg)


def finish_model(graph: onnx.GraphProto, limited_dim: str, limit: int, cfg: Any,
                 extra_domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    """The checked model around `graph`, pinned to OPSET / IR_VERSION (and version 1 of each of `extra_domains`,
    ONNX Runtime's contrib operators), declaring the upper bound of its variable dimension `limited_dim` (requests
    past it are refused up front) and the config it was built from."""
    opsets = [helper.make_opsetid("", OPSET), *(helper.make_opsetid(domain, 1) for domain in extra_domains)]
    model = helper.make_model(graph, producer_name="latscope-ref", opset_imports=opsets)
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {f"{MAX_DIM_PREFIX}{limited_dim}": str(limit),
                                   "latscope_ref.config": json.dumps(asdict(cfg), sort_keys=True)})
    onnx.checker.check_model(model)
    return model


def cached_model(kind: str, cfg: Any, build_version: int, build: Callable[[], onnx.ModelProto],
                 cache_dir: Path) -> tuple[Path, bool]:
    """Path of `cache_dir`/KIND-KEY.onnx, calling `build` when absent; also whether it was reused. KEY
    hashes the build parameters (`cfg`, a dataclass) and the builder's version.

    The file is written to a temporary name and renamed, so concurrent starts never read half a model."""
    params = json.dumps({**asdict(cfg), "build_version": build_version}, sort_keys=True)
    path = cache_dir / f"{kind}-{hashlib.sha256(params.encode()).hexdigest()[:16]}.onnx"
    if path.exists():
        return path, True
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    onnx.save_model(build(), str(tmp))
    os.replace(tmp, path)
    return path, False


def cached_encoder(cfg: EncoderConfig, cache_dir: Path) -> tuple[Path, bool]:
    """Path of the encoder for `cfg` in `cache_dir`, building it when absent; also whether it was reused."""
    return cached_model("encoder", cfg, BUILD_VERSION, lambda: build_encoder(cfg), cache_dir)


@dataclass(frozen=True)
class IdentityConfig:
    """The identity model: FP32 x [batch, width] -> y, the same values. With no compute at all, every
    millisecond a request takes is transport and (de)serialization: the model for comparing JSON,
    binary tensors and gRPC."""

    width: int = 384
    max_batch: int = 4096


def build_identity(cfg: IdentityConfig) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", cfg.width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", cfg.width])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return finish_model(graph, "batch", cfg.max_batch, cfg)


def cached_identity(cfg: IdentityConfig, cache_dir: Path) -> tuple[Path, bool]:
    """Path of the identity model for `cfg` in `cache_dir`, building it when absent; also whether it was reused."""
    return cached_model("identity", cfg, BUILD_VERSION, lambda: build_identity(cfg), cache_dir)
