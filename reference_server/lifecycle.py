"""The model's lifecycle inside one server process: loaded and warmed up before traffic (prewarm), or
loaded by the first request that needs it (--no-prewarm), and unloaded after --idle-unload seconds
without a request, to be reloaded by the next one (scale from zero). This is what makes cold starts
real; server.serve() puts a ManagedModel where the backend would be.

Also the replica's side of the supervisor protocol (ReplicaRole): when serve() runs as one replica
under the supervisor (supervisor.py), state changes go to the supervisor as `@replica {json}` lines on
stdout (starting -> loading -> warming -> ready, model loaded/unloaded), which it reads.

Apart from supervisor.py (which starts and stops replica processes from outside) because server.serve()
needs this module and the supervisor needs server.serve() (replica_main runs it): together in one module
they were an import cycle. Now supervisor.py -> server.py -> lifecycle.py, and this module imports neither.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from reference_server.errors import StartupError
from reference_server.signature import Signature, read_signature

if TYPE_CHECKING:
    from reference_server.backends.base import Backend
    from reference_server.config import ServerConfig
    from reference_server.metrics import Metrics

log = logging.getLogger(__name__)

EVENT_PREFIX = "@replica "  # a replica's stdout line carrying a JSON event for the supervisor
# Warm-up runs (rows, sequence length), capped by --max-batch-size and the model's declared limits.
WARMUP_SHAPES = ((1, 16), (4, 32), (2, 64), (1, 128))
MASK_INPUT = "attention_mask"


class ReplicaRole:
    """What server.serve() needs when it runs as one replica under the supervisor: its id and a way to
    tell the supervisor about state changes (lines on stdout, which the supervisor reads)."""

    def __init__(self, index: int, spawned_at: float) -> None:
        self.index = index
        self.id = f"r{index}-{os.getpid()}"
        self.spawned_at = spawned_at  # unix time the supervisor started this process
        self._lock = threading.Lock()

    def report(self, **event: object) -> None:
        line = EVENT_PREFIX + json.dumps(event)
        with self._lock:
            try:
                print(line, flush=True)
            except (OSError, ValueError):  # the supervisor is gone; PR_SET_PDEATHSIG ends this process
                pass


def warmup_inputs(signature: Signature, rows: int, seq: int) -> dict[str, np.ndarray]:
    """Inputs of `rows` x `seq` for any model: the batch axis gets `rows` (1 when the model cannot
    batch), every other variable axis `seq` (capped by a declared limit), fixed axes their size. Token
    ids are 0 and an attention mask is all ones."""
    batch_dim = signature.batch_dim
    arrays = {}
    for spec in signature.inputs:
        shape = []
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int):
                shape.append(dim)
            elif axis == 0:
                shape.append(rows if batch_dim is not None else 1)
            else:
                shape.append(min(seq, signature.dim_limits.get(dim, seq)) if isinstance(dim, str) else seq)
        fill = np.ones if spec.name == MASK_INPUT else np.zeros
        arrays[spec.name] = fill(shape, dtype=spec.dtype)
    return arrays


class ManagedModel:
    """The model behind the batcher, with a lifecycle: loaded before traffic and warmed up (`prewarm`),
    or loaded by the first request that needs it (`--no-prewarm`), and unloaded after `--idle-unload`
    seconds without a request, to be reloaded by the next one (scale from zero).

    It stands in for the backend: `run` is what the batcher calls, from its inference thread, so lazy
    loads happen there while the requests behind the first one queue. A lock keeps the idle watcher
    from unloading in the middle of a run."""

    def __init__(self, load: Callable[[], tuple[Backend, float]], backend_class: type[Backend],
                 signature: Signature | None, metrics: Metrics, config: ServerConfig,
                 report: Callable[..., None] | None = None) -> None:
        self.name = backend_class.name
        self.platform = backend_class.platform
        self.signature = signature  # None until the first load (prewarm reads it from the loaded backend)
        self._load = load
        self._metrics = metrics
        self._model_name = config.model_name
        self._max_batch_size = config.max_batch_size
        self._idle_s = config.idle_unload
        self._report = report or (lambda **_: None)
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self._next_reason = "first_request"
        self._last_used = time.monotonic()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        metrics.model_loaded.labels(self._model_name).set(0)

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def prewarm(self) -> None:
        """Load and warm up now, before the replica accepts connections."""
        self._report(state="loading")
        with self._lock:
            self._load_locked("prewarm")
        self._report(state="warming")
        self.warm_up()

    def warm_up(self) -> float:
        """A few runs over several batch sizes and sequence lengths, so that the first real requests do not
        pay first-run costs (allocations, kernel selection). A shape the model rejects is logged and skipped."""
        started = time.perf_counter()
        max_rows = self._max_batch_size if self.signature.batch_dim is not None else 1
        shapes = sorted({(min(rows, max_rows), seq) for rows, seq in WARMUP_SHAPES})
        done = []
        with self._lock:
            backend = self._backend
            if backend is None:
                raise RuntimeError("warm_up() before load")
            for rows, seq in shapes:
                try:
                    backend.run(warmup_inputs(self.signature, rows, seq))
                    done.append(f"{rows}x{seq}")
                except Exception as exc:  # noqa: BLE001 - a user model may reject made-up inputs; warm-up is best effort
                    log.warning("warm-up run %dx%d failed, skipped: %s", rows, seq, exc)
            self._last_used = time.monotonic()
        seconds = time.perf_counter() - started
        self._metrics.model_warmup_seconds.labels(self._model_name, self.name).set(seconds)
        log.info("warm-up: %d runs (rows x sequence: %s) in %.3f s", len(done), ", ".join(done) or "none", seconds)
        return seconds

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            if self._backend is None:
                reason = self._next_reason
                log.info("%s: loading model %s now, this request waits for it",
                         "first request (--no-prewarm)" if reason == "first_request"
                         else "request after idle unload (scale from zero)", self._model_name)
                self._load_locked(reason)
            try:
                return self._backend.run(inputs)
            finally:
                self._last_used = time.monotonic()

    def _load_locked(self, reason: str) -> None:
        started = time.perf_counter()
        backend, _ = self._load()
        seconds = time.perf_counter() - started
        self._backend = backend
        self.signature = self.signature or backend.signature
        self._last_used = time.monotonic()
        m = self._metrics
        m.model_load_seconds.labels(self._model_name, self.name).set(seconds)
        m.model_loads.labels(self._model_name, reason).inc()
        m.model_loaded.labels(self._model_name).set(1)
        log.info("model %s loaded (%s) in %.3f s", self._model_name, reason, seconds)
        self._report(model_loaded=True, reason=reason, load_s=round(seconds, 4))

    def unload_if_idle(self) -> bool:
        """Unload when no request ran for --idle-unload seconds; True if it did."""
        if not self._idle_s:
            return False
        with self._lock:
            idle = time.monotonic() - self._last_used
            if self._backend is None or idle < self._idle_s:
                return False
            self._backend = None  # the last reference: the backend's session and its memory go with it
            self._next_reason = "idle_reload"
        self._metrics.model_unloads.labels(self._model_name).inc()
        self._metrics.model_loaded.labels(self._model_name).set(0)
        log.info("idle for %.1f s (--idle-unload %g): model %s unloaded; the next request reloads it",
                 idle, self._idle_s, self._model_name)
        self._report(model_loaded=False, reason="idle_unload")
        return True

    def start(self) -> None:
        """Start the idle watcher (with --idle-unload)."""
        if self._idle_s and self._watcher is None:
            period = min(max(self._idle_s / 10, 0.02), 1.0)
            self._watcher = threading.Thread(target=self._watch, args=(period,), name="idle-unload", daemon=True)
            self._watcher.start()

    def _watch(self, period: float) -> None:
        while not self._stop.wait(period):
            self.unload_if_idle()

    def stop(self) -> None:
        self._stop.set()

    def on_listening(self, replica: ReplicaRole | None) -> None:
        """The replica accepts connections from now on: record when, start the idle watcher, tell the supervisor."""
        replica_id = replica.id if replica else f"{socket.gethostname()}-{os.getpid()}"  # as http_server names it
        self._metrics.replica_ready_time.labels(replica_id).set(time.time())
        if replica:
            self._metrics.replica_start_time.labels(replica_id).set(replica.spawned_at)
            log.info("accepting connections %.2f s after process start%s", time.time() - replica.spawned_at,
                     "" if self.loaded else "; the model loads on the first request (--no-prewarm)")
        if self._idle_s:
            log.info("idle unload: the model is unloaded after %g s without a request", self._idle_s)
        self.start()
        self._report(state="ready")


def managed_model(config: ServerConfig, backend_class: type[Backend], load: Callable[[], tuple[Backend, float]],
                  model_path: Path, metrics: Metrics, replica: ReplicaRole | None) -> ManagedModel:
    """The model for server.serve(): loaded and warmed up now with config.prewarm, else left for the first request."""
    report = replica.report if replica else None
    if config.prewarm:
        model = ManagedModel(load, backend_class, None, metrics, config, report)
        model.prewarm()
        return model
    try:
        signature = read_signature(model_path)
    except Exception as exc:  # noqa: BLE001 - onnx/protobuf raise many types for a file that is not a model
        raise StartupError(f"cannot read model {model_path}: {exc}") from None
    log.info("no prewarm: the model loads when the first request needs it (the cold-start trap)")
    return ManagedModel(load, backend_class, signature, metrics, config, report)

