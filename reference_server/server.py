"""Starting and stopping the server: model -> backend -> batcher -> HTTP and gRPC front ends.

Startup logs one line per fact (model, backend and why, batching, address) and prints
`ready http://HOST:PORT` on stdout once connections are accepted (then `ready-grpc HOST:PORT` when
the gRPC front end is on; it starts first, so it already accepts connections by then). SIGTERM or
SIGINT stops accepting, lets in-flight requests finish, stops the inference thread and returns (exit
status 0).

Its parts live beside it: what it is given is config.py (ServerConfig, and resolve_model for the ONNX
file), the backend choice backends/, the model's lifecycle (prewarm, lazy load, idle unload) lifecycle.py,
and running it as one of several replica processes supervisor.py (which imports this module, never the
other way round: the replica's side of that protocol, ReplicaRole, is in lifecycle.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time
from pathlib import Path

from aiohttp import web

from reference_server import client_errors
from reference_server.backends import choose_backend
from reference_server.backends.base import Backend, BackendUnavailable
from reference_server.batcher import Batcher
from reference_server.config import ServerConfig, resolve_model
from reference_server.embeddings_api import mount_embeddings
from reference_server.errors import StartupError
from reference_server.generation_api import mount_generator
from reference_server.grpc_server import bind_grpc
from reference_server.http_server import ServedModel, make_app
from reference_server.infer_path import InferSite
from reference_server.lifecycle import ReplicaRole, managed_model
from reference_server.metrics import Metrics

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0  # in-flight requests still running after this are cancelled
# How long a thread waiting for the GIL lets the holder run before asking for it (Python's default: 5 ms).
# When ONNX Runtime returns, the inference thread needs the GIL for a few microseconds (split the outputs,
# hand them over, take the next batch) while the event loop holds it parsing requests: at 5 ms the model
# stood idle that long with a batch waiting. Measured by benchmarks/handoff.py (8 tokens, 300 req/s, one
# core): p50 / p99 15.5 / 45.5 ms at 5 ms, 13.7 / 38.3 ms at 0.5 ms.
GIL_SWITCH_S = 0.0005


def load_backend(backend_class: type[Backend], why: str, config: ServerConfig, model_path: Path) -> tuple[Backend, float]:
    """The backend with the model loaded, and the load time in seconds."""
    try:
        extra = {"max_batch": config.max_batch_size, "cache_dir": config.cache_dir / "engines"} \
            if backend_class.name == "tensorrt" else {}
        backend = backend_class(model_path, config.threads, **extra)
    except Exception as exc:  # noqa: BLE001 - onnx/protobuf raise many types for a file that is not a model
        raise StartupError(f"cannot read model {model_path}: {exc}") from None
    started = time.perf_counter()
    try:
        backend.load()
    except Exception as exc:  # noqa: BLE001 - same: report which file and backend, then stop
        raise StartupError(f"{backend.name} cannot load {model_path}: {exc}") from None
    load_s = time.perf_counter() - started
    log.info("backend %s (%s): %s; loaded in %.2f s", backend.name, why, backend.describe(), load_s)
    return backend, load_s


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind now so a taken port fails before the model loads; listening starts only when the app is ready.
    `reuse_port`: SO_REUSEPORT, so that every replica listens on the same port (the kernel spreads connections)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port} (--host/--http-port): {exc}") from None
    return sock


async def serve(config: ServerConfig, replica: ReplicaRole | None = None) -> None:
    """Run until SIGTERM/SIGINT, then drain and return. `replica`: run as one replica under the supervisor
    (supervisor.py): SO_REUSEPORT on the shared port, its id in X-Replica-Id, state reported on stdout."""
    try:
        backend_class, why = choose_backend(config.backend)
    except BackendUnavailable as exc:
        raise StartupError(str(exc)) from None
    sock = _bind(config.host, config.http_port, reuse_port=replica is not None)
    try:
        grpc_front = bind_grpc(config.host, config.grpc_port, max_body_bytes=config.max_body_bytes,
                               reuse_port=replica is not None)
    except OSError as exc:
        raise StartupError(f"{exc} (--host/--grpc-port)") from None
    model_path = resolve_model(config)
    metrics = Metrics()
    # Loaded and warmed up here with --prewarm; else by the first request (and again after --idle-unload).
    backend = managed_model(config, backend_class, lambda: load_backend(backend_class, why, config, model_path),
                            model_path, metrics, replica)
    batcher = Batcher(backend.run, backend.signature, max_batch_size=config.max_batch_size,
                      max_queue_delay_us=config.max_queue_delay_us, max_queue=config.max_queue,
                      on_batch=metrics.on_batch, batch_policy=config.batch_policy)
    metrics.queue_depth.set_function(batcher.depth)
    log.info("batching: max %d rows per run, max queue delay %d us, queue bound %d, batch policy %s", batcher.max_rows,
             config.max_queue_delay_us, config.max_queue, config.batch_policy)

    served = ServedModel(config.model_name, backend.platform, backend.signature, batcher)
    if grpc_front:
        grpc_front.serve_model(served, metrics, extra_latency_ms=config.extra_latency_ms,
                               replica_id=replica.id if replica else None)
    app = make_app(served, metrics,
                   max_body_bytes=config.max_body_bytes, extra_latency_ms=config.extra_latency_ms,
                   replica_id=replica.id if replica else None)
    mount_embeddings(app, config, served)  # /v1/embeddings, /v1/rerank: the built-in encoder only
    generator = mount_generator(app, config, metrics)  # None with --no-generator
    if config.extra_latency_ms:
        log.info("extra latency: %.1f ms added to every infer request (--extra-latency-ms)", config.extra_latency_ms)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, logger=client_errors.LOG,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)
    batcher.start()
    if generator:
        generator.start()
    metrics.gc.install()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if grpc_front:
            await grpc_front.start()
            log.info("grpc listening on %s (inference.GRPCInferenceService)", grpc_front.address)
        await InferSite(runner, sock, drain_timeout=SHUTDOWN_TIMEOUT_S).start()  # aiohttp's SockSite + lean infer path
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        log.info("listening on %s", url)
        print(f"ready {url}", flush=True)
        if grpc_front:
            print(f"ready-grpc {grpc_front.address}", flush=True)
        backend.on_listening(replica)  # ready timestamp metric, idle-unload watcher, tells the supervisor
        await stop.wait()
        log.info("shutting down: finishing in-flight requests")
    finally:
        await asyncio.gather(runner.cleanup(), *([grpc_front.stop(SHUTDOWN_TIMEOUT_S)] if grpc_front else []))
        await asyncio.to_thread(batcher.stop)
        if generator:
            await asyncio.to_thread(generator.stop)
        backend.stop()
        metrics.gc.uninstall()
        sys.setswitchinterval(switch_interval)
    log.info("stopped")
