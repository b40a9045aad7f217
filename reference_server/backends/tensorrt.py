"""TensorRT backend: a native FP16 engine built from the same ONNX file, cached on disk.

Building an engine takes tens of seconds to minutes, which would make every start a cold start; the
serialized engine is therefore cached under a key that changes whenever the engine could differ:
the ONNX file's bytes, the GPU model and compute capability, the TensorRT version, the precision and
the optimization profile. A hit deserializes in about a second.

The profile spans every variable dimension: batch from 1 to --max-batch-size (optimised for a
quarter of it, what a busy dynamic batcher typically forms) and, for a declared sequence limit,
sequence from 1 to that limit (optimised for 128).

Status: this path needs the `tensorrt` package and an NVIDIA GPU. The GPU machines this project can
reach have neither TensorRT nor a way to install it, so engine build/run below has NOT been executed
anywhere yet; the cache key, the profile and backend selection are tested on CPU.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from pathlib import Path

import numpy as np

from reference_server.backends.base import Backend
from reference_server.signature import Signature

log = logging.getLogger(__name__)

OPT_SEQUENCE = 128
Shape = tuple[int, ...]


def tensorrt_unavailable() -> str | None:
    """Why TensorRT cannot run here, or None when it can (package importable and a CUDA GPU visible)."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT not installed"
    if importlib.util.find_spec("torch") is None:
        return "TensorRT is installed but PyTorch (used for GPU buffers) is not"
    import torch

    if not torch.cuda.is_available():
        return "TensorRT is installed but no CUDA GPU is visible"
    return None


def optimization_profile(signature: Signature, max_batch: int) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shape per input. Fixed dimensions stay as they are; the batch dimension spans
    1..max_batch; a dimension with a declared limit spans 1..limit; any other variable dimension
    cannot be bounded and is refused, since TensorRT needs a finite range."""
    profile = {}
    for spec in signature.inputs:
        low, opt, high = [], [], []
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int):
                bounds = (dim, dim, dim)
            elif axis == 0 and dim == signature.batch_dim:
                bounds = (1, max(1, max_batch // 4), max_batch)
            elif isinstance(dim, str) and dim in signature.dim_limits:
                limit = signature.dim_limits[dim]
                bounds = (1, min(OPT_SEQUENCE, limit), limit)
            else:
                raise ValueError(f"input {spec.name} axis {axis} ({dim}) has no upper bound; TensorRT needs one "
                                 f"(declare it in the model metadata as max_dim:{dim})")
            for target, value in zip((low, opt, high), bounds):
                target.append(value)
        profile[spec.name] = (tuple(low), tuple(opt), tuple(high))
    return profile


def engine_cache_key(model_bytes: bytes, gpu: str, compute_capability: tuple[int, int], trt_version: str,
                     fp16: bool, profile: dict[str, tuple[Shape, Shape, Shape]]) -> str:
    """A hex digest naming the cached engine; any input that changes the engine changes the key."""
    parts = {
        "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "gpu": gpu,
        "compute_capability": list(compute_capability),
        "tensorrt": trt_version,
        "fp16": fp16,
        "profile": {name: [list(s) for s in shapes] for name, shapes in sorted(profile.items())},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class TensorRTBackend(Backend):
    name = "tensorrt"
    platform = "tensorrt_plan"

    def __init__(self, model_path: Path, threads: int | None = None, *, max_batch: int = 32,
                 cache_dir: Path = Path("~/.cache/latscope-ref/engines")) -> None:
        super().__init__(model_path, threads)
        self.max_batch = max_batch
        self.cache_dir = cache_dir.expanduser()
        self.profile = optimization_profile(self.signature, max_batch)
        self.engine_path: Path | None = None
        self._context = None
        self._stream = None

    def load(self) -> None:
        import tensorrt as trt
        import torch

        device = torch.cuda.get_device_properties(0)
        key = engine_cache_key(self.model_path.read_bytes(), device.name, (device.major, device.minor),
                               trt.__version__, True, self.profile)
        self.engine_path = self.cache_dir / f"{key}.plan"
        trt_logger = trt.Logger(trt.Logger.WARNING)
        if self.engine_path.is_file():
            log.info("tensorrt: engine cache hit %s", self.engine_path)
            plan = self.engine_path.read_bytes()
        else:
            log.info("tensorrt: engine cache miss; building FP16 engine for %s (this takes a while)", device.name)
            plan = self._build(trt, trt_logger)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.engine_path.with_suffix(".tmp")
            tmp.write_bytes(plan)
            tmp.replace(self.engine_path)
        engine = trt.Runtime(trt_logger).deserialize_cuda_engine(plan)
        self._context = engine.create_execution_context()
        self._stream = torch.cuda.Stream()

    def _build(self, trt, trt_logger) -> bytes:
        builder = trt.Builder(trt_logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, trt_logger)
        if not parser.parse(self.model_path.read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT cannot parse {self.model_path}: {errors}")
        config = builder.create_builder_config()
        config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in self.profile.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError("TensorRT failed to build an engine (see its log above)")
        return bytes(plan)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        context, keep = self._context, []
        for name, array in inputs.items():
            tensor = torch.from_numpy(np.ascontiguousarray(array)).cuda(non_blocking=True)
            context.set_input_shape(name, tuple(array.shape))
            context.set_tensor_address(name, tensor.data_ptr())
            keep.append(tensor)
        outputs = {}
        for spec in self.signature.outputs:
            shape = tuple(context.get_tensor_shape(spec.name))
            outputs[spec.name] = torch.empty(shape, dtype=getattr(torch, str(spec.dtype)), device="cuda")
            context.set_tensor_address(spec.name, outputs[spec.name].data_ptr())
        context.execute_async_v3(self._stream.cuda_stream)
        self._stream.synchronize()
        return {name: tensor.cpu().numpy() for name, tensor in outputs.items()}

    def describe(self) -> str:
        return f"tensorrt fp16 engine {self.engine_path} profile={self.profile}"
