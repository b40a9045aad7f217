"""Backends: what actually runs the model. One small interface, so TensorRT can slot in beside ONNX Runtime.

A backend is driven by exactly one thread (the batcher's inference thread for its model instance),
so implementations need not be thread-safe.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import onnxruntime as ort

from reference_server.signature import Signature, read_signature

log = logging.getLogger(__name__)

BACKENDS = ("auto", "onnxruntime", "tensorrt")
# Execution providers in the order we prefer them when onnxruntime reports them available.
_PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine; the message says why and what to use instead."""


class Backend(ABC):
    """Runs one model: load() once, then run() batches from a single thread."""

    name: str
    platform: str  # the model platform as KServe v2 metadata names it

    def __init__(self, model_path: Path, threads: int | None = None) -> None:
        """`threads`: CPU threads the backend may use for one run (None: one per core)."""
        self.model_path = model_path
        self.threads = threads or os.cpu_count() or 1
        self.signature: Signature = read_signature(model_path)

    @abstractmethod
    def load(self) -> None:
        """Make the model ready to run (allocate sessions/engines); the expensive, cold-start part."""

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: every input present with the signature's dtype; returns every output by name."""

    @abstractmethod
    def describe(self) -> str:
        """One line for the startup log: what runs the model and where."""


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platform = "onnxruntime_onnx"

    def __init__(self, model_path: Path, threads: int | None = None) -> None:
        super().__init__(model_path, threads)
        self._session = None
        self._output_names = [t.name for t in self.signature.outputs]

    def load(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1  # one batch at a time per instance; parallelism is inside ops
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        available = set(ort.get_available_providers())
        providers = [p for p in _PREFERRED_PROVIDERS if p in available]
        self._session = ort.InferenceSession(str(self.model_path), options, providers=providers)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is None:
            raise RuntimeError("OnnxRuntimeBackend.run() called before load()")
        return dict(zip(self._output_names, self._session.run(self._output_names, inputs)))

    def describe(self) -> str:
        providers = self._session.get_providers() if self._session else []
        return f"onnxruntime providers={','.join(providers)} intra_op_threads={self.threads}"


def choose_backend(choice: str) -> tuple[type[Backend], str]:
    """The backend class for `choice` (one of BACKENDS) and why it was picked; needs no model yet, so a
    backend that cannot run here fails before any model is built."""
    from reference_server.tensorrt_backend import TensorRTBackend, tensorrt_unavailable

    if choice == "onnxruntime":
        return OnnxRuntimeBackend, "requested with --backend onnxruntime"
    if choice not in ("tensorrt", "auto"):
        raise BackendUnavailable(f"unknown backend {choice!r}; choose one of {', '.join(BACKENDS)}")
    why_not = tensorrt_unavailable()
    if why_not is None:
        return TensorRTBackend, "TensorRT and a CUDA GPU are available" + (" (auto)" if choice == "auto" else "")
    if choice == "tensorrt":
        raise BackendUnavailable(f"--backend tensorrt: {why_not}; use --backend onnxruntime")
    return OnnxRuntimeBackend, f"auto: tensorrt skipped ({why_not})"
