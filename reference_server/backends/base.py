"""The backend interface: what actually runs the model. One small interface, so TensorRT can slot in beside
ONNX Runtime.

A backend is driven by exactly one thread (the batcher's inference thread for its model instance),
so implementations need not be thread-safe.

Its own module, apart from the chooser in backends/__init__.py, so that each implementation imports
the interface without importing the chooser that imports every implementation (no import cycle).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from reference_server.signature import Signature, read_signature


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine; the message says why and what to use instead."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one; else every core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Backend(ABC):
    """Runs one model: load() once, then run() batches from a single thread."""

    name: str
    platform: str  # the model platform as KServe v2 metadata names it

    def __init__(self, model_path: Path, threads: int | None = None) -> None:
        """`threads`: CPU threads the backend may use for one run (None: one per core this process
        may run on, so a server pinned to one core does not run two threads on it)."""
        self.model_path = model_path
        self.threads = threads or usable_cores()
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
