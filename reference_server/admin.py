"""Admin API, served by the supervisor on its own port (--admin-port): list, add and remove replicas.

Every request needs `Authorization: Bearer <token>` (--admin-token / LATSCOPE_REF_ADMIN_TOKEN),
compared in constant time, byte for byte; anything else (missing, wrong, not even UTF-8) is 401. Without a
token the API is not served at all.

    GET    /admin/replicas          {"replicas": [{id, index, pid, state, prewarm, model_loaded,
                                                   started_at, ready_at, ready_after_s}, ...]}
    POST   /admin/replicas          body optional: {"prewarm": true|false}; 202 with the new replica
                                    (state "starting"): it takes traffic once ready, or at once with
                                    prewarm false (and loads its model on its first request)
    DELETE /admin/replicas/{id}     202: graceful stop (finishes in-flight requests); id `r1-12345` or `r1`
    GET    /metrics                 the supervisor's own Prometheus metrics (replicas by state, starts, deaths)

Times are unix seconds. Errors are JSON `{"error": "..."}`.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from reference_server import client_errors
from reference_server.client_errors import BodyTooLarge, BodyUnreadable, read_body
from reference_server.config import MAX_REPLICAS
from reference_server.errors import StartupError
from reference_server.metrics import PREFIX

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

log = logging.getLogger(__name__)

STATES = ("starting", "loading", "warming", "ready", "stopping")
MAX_BODY_BYTES = 64 * 1024


class ReplicaView(Protocol):
    """What the admin API reads of one replica (supervisor.Replica)."""

    @property
    def state(self) -> str: ...

    def as_json(self) -> dict: ...


R = TypeVar("R", bound=ReplicaView)


class Replicas(Protocol[R]):
    """What the admin API needs of the supervisor (supervisor.Supervisor, which serves it). Written
    here rather than imported: supervisor.py imports this module, and this one never imports it back."""

    @property
    def replicas(self) -> Mapping[str, R]: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def starts(self) -> int: ...

    @property
    def unexpected_exits(self) -> int: ...

    def list(self) -> list[dict]: ...

    def find(self, replica_id: str) -> R | None: ...

    async def add(self, prewarm: bool | None = None) -> R: ...

    def remove(self, replica: R) -> None: ...


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class _SupervisorCollector(Collector):
    def __init__(self, supervisor: Replicas[Any]) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        replicas = GaugeMetricFamily(f"{PREFIX}_replicas", "Replica processes by state", labels=["state"])
        for state in STATES:
            replicas.add_metric([state], sum(r.state == state for r in self.supervisor.replicas.values()))
        yield replicas
        yield CounterMetricFamily(f"{PREFIX}_replica_starts", "Replica processes started",
                                  value=self.supervisor.starts)
        yield CounterMetricFamily(f"{PREFIX}_replica_deaths", "Replicas that exited without being asked to",
                                  value=self.supervisor.unexpected_exits)


def _auth(token: str):
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # aiohttp decodes header bytes as UTF-8 with surrogateescape: this gives back the bytes that were sent.
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            log.warning("admin: refused %s %s from %s (bad or missing token)", request.method, request.path,
                        request.remote)
            return _error(401, "unauthorized: send 'Authorization: Bearer <token>' (--admin-token)",
                          **{"WWW-Authenticate": 'Bearer realm="latscope-ref admin"'})
        try:
            return await handler(request)
        except web.HTTPException as exc:
            return _error(exc.status, f"{exc.reason}: {request.method} {request.path}")

    return middleware


def make_app(supervisor: Replicas[Any], token: str) -> web.Application:
    registry = CollectorRegistry()
    registry.register(_SupervisorCollector(supervisor))

    async def list_replicas(request: web.Request) -> web.Response:
        return web.json_response({"replicas": supervisor.list()})

    async def add_replica(request: web.Request) -> web.Response:
        prewarm = None
        try:
            body = await read_body(request, MAX_BODY_BYTES)
        except BodyTooLarge:
            return _error(413, f"body is over {MAX_BODY_BYTES} bytes")
        except BodyUnreadable as exc:
            return _error(400, str(exc))
        if body.strip():
            try:
                options = json.loads(body)
            except (ValueError, RecursionError) as exc:
                return _error(400, f"body is not JSON: {exc}")
            if not isinstance(options, dict) or set(options) - {"prewarm"}:
                return _error(400, 'body must be a JSON object with at most {"prewarm": true|false}')
            prewarm = options.get("prewarm")
            if prewarm is not None and not isinstance(prewarm, bool):
                return _error(400, '"prewarm" must be true or false')
        if supervisor.stopping:
            return _error(503, "server is shutting down")
        if len(supervisor.replicas) >= MAX_REPLICAS:
            return _error(409, f"already {len(supervisor.replicas)} replicas (at most {MAX_REPLICAS})")
        replica = await supervisor.add(prewarm)
        return web.json_response(replica.as_json(), status=202)

    async def remove_replica(request: web.Request) -> web.Response:
        replica = supervisor.find(request.match_info["id"])
        if replica is None:
            return _error(404, f"no replica {request.match_info['id']!r}; GET /admin/replicas lists them")
        supervisor.remove(replica)
        return web.json_response(replica.as_json(), status=202)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[_auth(token)], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/admin/replicas", list_replicas)
    app.router.add_post("/admin/replicas", add_replica)
    app.router.add_delete("/admin/replicas/{id}", remove_replica)
    app.router.add_get("/metrics", metrics)
    return app


async def start(supervisor: Replicas[Any], host: str, port: int, token: str) -> tuple[web.AppRunner, str]:
    """Serve the admin API on (host, port); port 0 picks a free one. Returns the runner and the URL."""
    runner = web.AppRunner(make_app(supervisor, token), handle_signals=False, access_log=None,
                           logger=client_errors.LOG)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise StartupError(f"cannot serve the admin API on {host}:{port} (--admin-port): {exc}") from None
    bound_host, bound_port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    return runner, f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
