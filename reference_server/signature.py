"""What a model takes and returns, read from its ONNX graph, in KServe v2 terms.

Every front end (REST today, gRPC later) validates requests against this, and the batcher uses
the symbolic dimension names to know which axis is the batch and which inputs it may pad, so
the signature is read once, from the graph itself, independent of the backend that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

# KServe v2 datatype name -> little-endian numpy dtype (the wire byte order of the binary extension).
V2_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

_ONNX_TO_V2: dict[int, str] = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
}

# Model metadata key prefix declaring an upper bound for a symbolic dimension, e.g.
# "max_dim:sequence" = "512": requests past it are rejected up front instead of failing inside the backend.
MAX_DIM_PREFIX = "max_dim:"

Dim = int | str | None
"""A fixed size, a symbolic name (variable, shared by every axis with that name), or None (variable, unnamed)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 name, a key of V2_DTYPES
    dims: tuple[Dim, ...]

    @property
    def dtype(self) -> np.dtype:
        return V2_DTYPES[self.datatype]

    def v2_shape(self) -> list[int]:
        """The shape as v2 metadata writes it: -1 for every variable dimension."""
        return [d if isinstance(d, int) else -1 for d in self.dims]


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dim_limits: dict[str, int] = field(default_factory=dict)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    @property
    def batch_dim(self) -> str | None:
        """The symbolic name that every input and output starts with, if any: requests can then be
        concatenated along axis 0. None means the model cannot be batched across requests."""
        firsts = {t.dims[0] if t.dims else None for t in self.inputs + self.outputs}
        if len(firsts) == 1:
            (first,) = firsts
            if isinstance(first, str):
                return first
        return None


def _dims(value_info: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    dims: list[Dim] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _spec(value_info: onnx.ValueInfoProto, path: Path) -> TensorSpec:
    if not value_info.type.HasField("tensor_type"):
        raise ValueError(f"{path}: '{value_info.name}' is not a tensor; only tensor inputs and outputs can be served")
    elem = value_info.type.tensor_type.elem_type
    if elem not in _ONNX_TO_V2:
        name = onnx.TensorProto.DataType.Name(elem)
        raise ValueError(f"{path}: '{value_info.name}' has type {name}, which this server cannot serve "
                         f"(supported: {', '.join(V2_DTYPES)})")
    return TensorSpec(value_info.name, _ONNX_TO_V2[elem], _dims(value_info))


def read_signature(path: Path) -> Signature:
    """Read inputs, outputs and declared dimension limits from an ONNX file's graph (weights not loaded)."""
    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    limits = {p.key[len(MAX_DIM_PREFIX):]: int(p.value)
              for p in model.metadata_props if p.key.startswith(MAX_DIM_PREFIX)}
    return Signature(
        inputs=tuple(_spec(v, path) for v in model.graph.input if v.name not in initializers),
        outputs=tuple(_spec(v, path) for v in model.graph.output),
        dim_limits=limits,
    )
