"""ONNX Runtime backend: the default, and the only one that runs on CPU.

The session uses the best execution provider onnxruntime reports available (TensorRT, then CUDA, then
CPU), `threads` intra-op threads and one inter-op thread: the batcher hands it one batch at a time, so
the parallelism is inside the ops.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from reference_server.backends.base import Backend

# Execution providers in the order we prefer them when onnxruntime reports them available.
_PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def io_binding(session: ort.InferenceSession, inputs: dict[str, np.ndarray],
               outputs: dict[str, np.ndarray]) -> ort.IOBinding:
    """A binding of `session` that feeds `inputs` as they are and writes the outputs named in `outputs` into those
    arrays (C-contiguous, exactly the output's shape and dtype: one may be an input's own array, which the
    decoder's decode step updates in place), the other outputs into memory ONNX Runtime allocates."""
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_cpu_input(name, array)
    for output in session.get_outputs():
        if output.name in outputs:
            array = outputs[output.name]
            binding.bind_output(output.name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        else:
            binding.bind_output(output.name, "cpu")
    return binding


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

    def run_into(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Like run(), but the outputs named in `outputs` are written into those arrays (C-contiguous, exactly
        the output's shape and dtype; io_binding) instead of new ones: the generator's decode step updates its
        KV cache in place (generation.py). Returns the other outputs."""
        if self._session is None:
            raise RuntimeError("OnnxRuntimeBackend.run_into() called before load()")
        binding = io_binding(self._session, inputs, outputs)
        self._session.run_with_iobinding(binding)
        names = [output.name for output in self._session.get_outputs()]  # the order io_binding bound them in
        return {name: value.numpy() for name, value in zip(names, binding.get_outputs()) if name not in outputs}

    def describe(self) -> str:
        providers = self._session.get_providers() if self._session else []
        return f"onnxruntime providers={','.join(providers)} intra_op_threads={self.threads}"
