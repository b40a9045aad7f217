"""Backends: what actually runs the model, and the choice between them (`--backend`).

    base.py         Backend (the interface: load() once, then run() batches from one thread), BackendUnavailable
    onnxruntime.py  OnnxRuntimeBackend: CPU, or the best execution provider onnxruntime has
    tensorrt.py     TensorRTBackend: a native FP16 engine, cached on disk; needs TensorRT and a CUDA GPU

choose_backend(choice) -> (class, why):
    onnxruntime -> OnnxRuntimeBackend
    tensorrt    -> TensorRTBackend when tensorrt_unavailable() is None, else BackendUnavailable (says why)
    auto        -> TensorRTBackend when tensorrt_unavailable() is None, else OnnxRuntimeBackend (why says why not)
    other       -> BackendUnavailable
It needs no model, so a backend that cannot run here fails before any model is built.

The implementations import the interface from base.py, never from this package, so this module may
import them all without an import cycle.
"""

from __future__ import annotations

from reference_server.backends.base import Backend, BackendUnavailable
from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.backends.tensorrt import TensorRTBackend, tensorrt_unavailable

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def choose_backend(choice: str) -> tuple[type[Backend], str]:
    """The backend class for `choice` (one of BACKENDS) and why it was picked; needs no model yet, so a
    backend that cannot run here fails before any model is built."""
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
