"""The built-in text generator: a small decoder-only transformer with a KV cache, generated as ONNX.

Like the encoder (model.py) it is built deterministically from seeded random weights (std 0.02), so
the server needs no download and every run measures the same graph: the arithmetic of prefill and
decode is real (token + learned position embeddings, pre-LayerNorm blocks of causal multi-head
self-attention and a GELU FFN, a final LayerNorm and an LM head), the text it produces means nothing.

Two graphs, the same weights. The *prefill* graph computes any number of new tokens against a past:
  inputs   input_ids       int64 [batch, sequence]          new tokens (the prompt, or 1 when decoding)
           position_ids    int64 [batch, sequence]          their positions (taken modulo max_context)
           attention_mask  int64 [batch, total_sequence]    1 = attend, 0 = padding; total = past + sequence
           past_key_i, past_value_i  float32 [batch, heads, past_sequence, head_dim], per layer i
  outputs  logits          float32 [batch, vocab]           for the *last* new position only
           present_key_i, present_value_i  float32 [batch, heads, total_sequence, head_dim]
A prompt feeds empty past tensors (past_sequence = 0), a later chunk the presents of the earlier ones. New
tokens attend to every unmasked past position and causally to each other. Only the last position's logits
are computed, so callers that pad a batch must pad on the *left*.

The *decode step* graph (build_decode_step) gives each row one token, its KV cache updated in place:
  inputs   input_ids, position_ids  int64 [batch, 1]
           seqlens_k               int32 [batch]                 tokens already in each row's cache
           total_sequence_length   int32 scalar                  max(seqlens_k) + 1
           past_key_i, past_value_i  float32 [batch, heads, capacity, head_dim]: row b's tokens in its first
                                   seqlens_k[b] columns, in position order; the columns after are not read
  outputs  logits, and present_key_i, present_value_i bound to the very buffers of the pasts
Its attention is ONNX Runtime's GroupQueryAttention (com.microsoft; as many key/value heads as query heads):
with past and present in one buffer it writes each row's new key and value at column seqlens_k[b] and
attends to that row's own seqlens_k[b] + 1 columns. Why a second graph: the prefill graph's Concat writes
the whole cache anew every step, padded to the batch's longest row, which cost a decode step 20-40 % at the
widths continuous batching runs at (benchmarks/RESULTS.md, issue 34); this one touches one column per row
and attends to each row's own length. The two agree to float rounding (tests/reference_server/test_ref_decoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from reference_server.model import _Graph, cached_model, finish_model

# Bump when the graphs built below change, so caches keyed on the parameters are not reused wrongly.
BUILD_VERSION = 1
STEP_BUILD_VERSION = 1
BATCH, SEQUENCE, PAST, TOTAL, CAPACITY = "batch", "sequence", "past_sequence", "total_sequence", "capacity"
NEG_INF = -1e9  # additive attention bias for masked positions: exp() underflows to exactly 0


@dataclass(frozen=True)
class DecoderConfig:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    ffn: int = 1024
    vocab: int = 8192
    max_context: int = 1024  # positions (prompt + generated tokens) per sequence
    seed: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def past_names(layers: int) -> list[str]:
    """Input names of the KV cache, in the order the presents come out: key_0, value_0, key_1, ..."""
    return [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]


def _named(g: _Graph, op_type: str, inputs: list[str], output: str, **attrs) -> str:
    g.nodes.append(helper.make_node(op_type, inputs, [output], **attrs))
    return output


def _scalar(g: _Graph, value: float | int, dtype) -> str:
    return g.const(np.array(value, dtype))


def _attention_bias(g: _Graph) -> str:
    """[batch, 1, sequence, total]: 0 where a new token may attend, NEG_INF elsewhere (padding or future)."""
    shape_ids, shape_mask = g.op("Shape", "input_ids"), g.op("Shape", "attention_mask")
    one = g.const(np.array(1, np.int64))
    seq = g.op("Gather", shape_ids, one, axis=0)  # scalar S
    total = g.op("Gather", shape_mask, one, axis=0)  # scalar T = past + S
    past = g.op("Sub", total, seq)
    # New token i sits at cache position past + i and may see cache positions k <= past + i.
    query_pos = g.op("Unsqueeze", g.op("Range", past, total, one), g.const(np.array([1], np.int64)))  # [S, 1]
    key_pos = g.op("Unsqueeze", g.op("Range", g.const(np.array(0, np.int64)), total, one),
                   g.const(np.array([0], np.int64)))  # [1, T]
    visible = g.op("Cast", g.op("LessOrEqual", key_pos, query_pos), to=TensorProto.FLOAT)  # [S, T]
    neg = _scalar(g, NEG_INF, np.float32)
    one_f = _scalar(g, 1.0, np.float32)
    causal = g.op("Mul", g.op("Sub", one_f, visible), neg)  # [S, T]
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [B, T]
    padding = g.op("Unsqueeze", g.op("Mul", g.op("Sub", one_f, mask), neg), g.const(np.array([1, 2], np.int64)))
    return g.op("Add", padding, causal)  # [B, 1, 1, T] + [S, T] -> [B, 1, S, T]


def _self_attention(g: _Graph, x: str, bias: str | None, layer: int, cfg: DecoderConfig) -> str:
    """One attention block; `bias` None: the decode step's in-place GroupQueryAttention (module docstring)."""
    h, d = cfg.heads, cfg.head_dim
    qkv = g.linear(x, cfg.hidden, 3 * cfg.hidden)  # one MatMul for q, k and v
    if bias is None:
        out = g._name("attention")
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [*_split3(g, qkv, cfg.hidden), f"past_key_{layer}", f"past_value_{layer}",
                                    "seqlens_k", "total_sequence_length"],
            [out, f"present_key_{layer}", f"present_value_{layer}"], domain="com.microsoft", num_heads=h,
            kv_num_heads=h))
        return g.linear(out, cfg.hidden, cfg.hidden)
    split_heads = g.const(np.array([0, 0, h, d], np.int64))  # 0 keeps batch and sequence
    q, k, v = (g.op("Transpose", g.op("Reshape", part, split_heads), perm=[0, 2, 1, 3])  # [B, H, S, D]
               for part in _split3(g, qkv, cfg.hidden))
    keys = _named(g, "Concat", [f"past_key_{layer}", k], f"present_key_{layer}", axis=2)  # [B, H, T, D]
    values = _named(g, "Concat", [f"past_value_{layer}", v], f"present_value_{layer}", axis=2)
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", keys, perm=[0, 1, 3, 2])),
                  _scalar(g, 1 / np.sqrt(d), np.float32))  # [B, H, S, T]
    probs = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
    context = g.op("Transpose", g.op("MatMul", probs, values), perm=[0, 2, 1, 3])  # [B, S, H, D]
    merged = g.op("Reshape", context, g.const(np.array([0, 0, cfg.hidden], np.int64)))
    return g.linear(merged, cfg.hidden, cfg.hidden)


def _split3(g: _Graph, x: str, width: int) -> tuple[str, str, str]:
    names = tuple(g._name("split") for _ in range(3))
    g.nodes.append(helper.make_node("Split", [x, g.const(np.array([width] * 3, np.int64))], list(names), axis=-1))
    return names  # type: ignore[return-value]


def build_decoder(cfg: DecoderConfig) -> onnx.ModelProto:
    """The prefill graph described in the module docstring."""
    return _build(cfg, step=False)


def build_decode_step(cfg: DecoderConfig) -> onnx.ModelProto:
    """The decode step graph described in the module docstring: the prefill graph's weights (drawn in the same
    order from the same seed), GroupQueryAttention in place of the Concat and the explicit attention."""
    return _build(cfg, step=True)


def _build(cfg: DecoderConfig, step: bool) -> onnx.ModelProto:
    if cfg.hidden % cfg.heads:
        raise ValueError(f"hidden size {cfg.hidden} is not divisible by {cfg.heads} heads")
    g = _Graph(cfg.seed)
    # Ids and positions are taken modulo their tables, so any int64 is valid and Gather never fails.
    ids = g.op("Mod", "input_ids", g.const(np.array(cfg.vocab, np.int64)), fmod=0)
    positions = g.op("Mod", "position_ids", g.const(np.array(cfg.max_context, np.int64)), fmod=0)
    x = g.op("Add", g.op("Gather", g.random(cfg.vocab, cfg.hidden), ids),
             g.op("Gather", g.random(cfg.max_context, cfg.hidden), positions))  # [B, S, hidden]
    bias = None if step else _attention_bias(g)

    for layer in range(cfg.layers):  # pre-LayerNorm blocks (GPT-2 style)
        x = g.op("Add", x, _self_attention(g, g.layer_norm(x, cfg.hidden), bias, layer, cfg))
        ffn = g.linear(g.gelu(g.linear(g.layer_norm(x, cfg.hidden), cfg.hidden, cfg.ffn)), cfg.ffn, cfg.hidden)
        x = g.op("Add", x, ffn)

    last = g.op("Gather", g.layer_norm(x, cfg.hidden), g.const(np.array(-1, np.int64)), axis=1)  # [B, hidden]
    _named(g, "MatMul", [last, g.random(cfg.hidden, cfg.vocab)], "logits")  # untied LM head

    past, total = (CAPACITY, CAPACITY) if step else (PAST, TOTAL)
    cache_in = [BATCH, cfg.heads, past, cfg.head_dim]
    cache_out = [BATCH, cfg.heads, total, cfg.head_dim]
    lengths = ([helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [BATCH]),
                helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])] if step else
               [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [BATCH, TOTAL])])
    graph = helper.make_graph(
        g.nodes, "latscope_ref_decode_step" if step else "latscope_ref_decoder",
        inputs=[helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQUENCE]),
                helper.make_tensor_value_info("position_ids", TensorProto.INT64, [BATCH, SEQUENCE]),
                *lengths,
                *(helper.make_tensor_value_info(n, TensorProto.FLOAT, cache_in) for n in past_names(cfg.layers))],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, cfg.vocab]),
                 *(helper.make_tensor_value_info(n, TensorProto.FLOAT, cache_out)
                   for n in present_names(cfg.layers))],
        initializer=g.weights,
    )
    return finish_model(graph, total, cfg.max_context, cfg, extra_domains=("com.microsoft",) if step else ())


def cached_decoder(cfg: DecoderConfig, cache_dir: Path) -> tuple[Path, bool]:
    """Path of the decoder (prefill graph) for `cfg` in `cache_dir`, building it when absent; also whether it
    was reused."""
    return cached_model("decoder", cfg, BUILD_VERSION, lambda: build_decoder(cfg), cache_dir)


def cached_decode_step(cfg: DecoderConfig, cache_dir: Path) -> tuple[Path, bool]:
    """As cached_decoder, for the decode step graph."""
    return cached_model("decode-step", cfg, STEP_BUILD_VERSION, lambda: build_decode_step(cfg), cache_dir)


def empty_cache(cfg: DecoderConfig, batch: int) -> dict[str, np.ndarray]:
    """Past inputs for a prefill: one [batch, heads, 0, head_dim] array per past_* name."""
    empty = np.zeros((batch, cfg.heads, 0, cfg.head_dim), np.float32)
    return {name: empty for name in past_names(cfg.layers)}
