"""KServe v2 REST front end (aiohttp): health, metadata, infer (JSON and binary tensors), /metrics.

Every answer is JSON (`{"error": "..."}` for failures) and carries X-Replica-Id; infer answers carry
Server-Timing. Client mistakes are 4xx with a message, overload is 429 + Retry-After; a 500 means a
bug or a backend failure, never bad input.

Infer requests usually arrive through infer_path.py's lean HTTP path (server.py listens with its
InferSite), which hands every other request to this app; both answer with `V2Routes.answer_infer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from reference_server import __version__, v2
from reference_server.batcher import Batcher, InferenceFailed, Overloaded, RequestTooLarge
from reference_server.client_errors import BodyTooLarge, BodyUnreadable, ClientGone, read_body
from reference_server.metrics import Metrics, server_timing
from reference_server.signature import Signature

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler, Middleware

log = logging.getLogger(__name__)

SERVER_NAME = "latscope-ref"
RETRY_AFTER_S = 1
CLIENT_GONE = 499  # the status a request whose client went away mid-body is counted under (never sent)
REPLICA_ID = web.AppKey("replica_id", str)  # what X-Replica-Id says, for routes mounted later
INFER_ENDPOINT = "/v2/models/{name}/infer"
JSON_ERROR_TYPE = "application/json; charset=utf-8"  # the Content-Type web.json_response writes

Answer = tuple[int, bytes, dict[str, str]]
"""An answer before any HTTP framing: status, body, headers (X-Replica-Id and the framing headers aside)."""


@dataclass
class ServedModel:
    name: str
    platform: str  # as v2 metadata names it, e.g. "onnxruntime_onnx"
    signature: Signature
    batcher: Batcher


def _error(status: int, message: str, **headers: str) -> web.Response:
    _, body, answer_headers = error_answer(status, message, **headers)
    return web.Response(status=status, body=body, headers=answer_headers)


def error_answer(status: int, message: str, **headers: str) -> Answer:
    """An error's answer as bytes, for both HTTP paths: the body and Content-Type web.json_response writes."""
    return status, json.dumps({"error": message}).encode(), {"Content-Type": JSON_ERROR_TYPE, **headers}


class V2Routes:
    def __init__(self, model: ServedModel, metrics: Metrics, max_body_bytes: int, extra_latency_ms: float) -> None:
        self.model = model
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.extra_latency_s = extra_latency_ms / 1000
        self.queue_seconds = metrics.queue_seconds

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": SERVER_NAME, "version": __version__, "extensions": ["binary_tensor_data"]})

    async def models(self, request: web.Request) -> web.Response:
        """The models served: `GET /v2/models` ({"models": [...]}, as KServe's model servers answer) and
        Triton's repository index (`POST /v2/repository/index`), so a client (`latscope init`) can
        find the model's name without being told it."""
        if request.method == "POST":
            return web.json_response([{"name": self.model.name, "version": v2.MODEL_VERSION, "state": "READY"}])
        return web.json_response({"models": [self.model.name]})

    def _unknown(self, request: web.Request) -> web.Response | None:
        name = request.match_info["name"]
        if name == self.model.name:
            return None
        return _error(404, f"unknown model {name!r}; this server serves {self.model.name!r}")

    async def model_metadata(self, request: web.Request) -> web.Response:
        return self._unknown(request) or web.json_response(
            v2.model_metadata(self.model.name, self.model.platform, self.model.signature))

    async def model_ready(self, request: web.Request) -> web.Response:
        return self._unknown(request) or web.json_response({"name": self.model.name, "ready": True})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _too_large(self) -> web.Response:
        return _error(413, f"request body is over {self.max_body_bytes} bytes (--max-body-bytes); "
                           f"send fewer rows per request or use binary tensors")

    async def infer(self, request: web.Request) -> web.Response:
        """aiohttp's infer handler: the connections infer_path.py hands over (and any app run without its
        InferSite) come here; the answer is `answer_infer`'s, as on the lean path."""
        if unknown := self._unknown(request):
            return unknown
        try:
            body = await read_body(request, self.max_body_bytes)
        except BodyTooLarge:
            return self._too_large()
        except BodyUnreadable as exc:
            return _error(400, str(exc))
        status, payload, headers = await self.answer_infer(self.model.name, body, request.headers.get(v2.HEADER_LENGTH))
        return web.Response(status=status, body=payload, headers=headers)

    async def answer_infer(self, name: str, body: bytes, header_length: str | None) -> Answer:
        """The answer to an infer request for model `name` whose whole body is `body` (`header_length`: its
        Inference-Header-Content-Length header). The one place both HTTP paths get their answers from."""
        if name != self.model.name:
            return error_answer(404, f"unknown model {name!r}; this server serves {self.model.name!r}")
        started = time.perf_counter_ns()
        try:
            decoded = v2.decode_request(body, header_length, self.model.signature)
        except v2.BadRequest as exc:
            return error_answer(400, str(exc))
        deser_ns = time.perf_counter_ns() - started

        if self.extra_latency_s:  # simulated slowdown (--extra-latency-ms): not part of any Server-Timing entry
            await asyncio.sleep(self.extra_latency_s)
        try:
            result = await self.model.batcher.submit(decoded.inputs)
        except Overloaded as exc:
            return error_answer(429, f"server overloaded: {exc}; retry after {RETRY_AFTER_S} s",
                                **{"Retry-After": str(RETRY_AFTER_S)})
        except RequestTooLarge as exc:
            return error_answer(400, str(exc))
        except InferenceFailed as exc:
            return error_answer(500, str(exc))
        self.queue_seconds.observe(result.queue_ns / 1e9)

        started = time.perf_counter_ns()
        payload, headers = v2.encode_response(self.model.name, decoded, result.outputs, self.model.signature)
        headers["Server-Timing"] = server_timing(queue_ns=result.queue_ns, deser_ns=deser_ns,
                                                 compute_ns=result.compute_ns,
                                                 ser_ns=time.perf_counter_ns() - started, batch=result.batch_size)
        return 200, payload, headers


INFER_ROUTES = web.AppKey("infer_routes", V2Routes)  # for infer_path.InferSite, which answers with them


def _observe(metrics: Metrics, replica_id: str) -> Middleware:
    """Count and time every request, turn aiohttp's own HTTP errors (404 route, 405) into JSON, tag the replica."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource else "unmatched"
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
            response = _error(exc.status, f"{exc.reason}: {request.method} {request.path}", **allow)
        except ClientGone as exc:  # no one to answer; counted as 499 (nginx's "client closed request")
            log.info("client went away: %s", exc)
            response = _error(CLIENT_GONE, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must still answer, and be logged with its traceback
            log.exception("unhandled error for %s %s", request.method, request.path)
            response = _error(500, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            metrics.in_flight.dec()
        response.headers["X-Replica-Id"] = replica_id
        metrics.on_request(endpoint, response.status, time.perf_counter() - started)
        return response

    return middleware


def make_app(model: ServedModel, metrics: Metrics, *, max_body_bytes: int, extra_latency_ms: float,
             replica_id: str | None = None) -> web.Application:
    """The aiohttp application for one model; `max_body_bytes` over -> 413. Responses name the replica
    (`replica_id`, e.g. `r1-12345` under the supervisor; else `<hostname>-<pid>` of the calling process)."""
    routes = V2Routes(model, metrics, max_body_bytes, extra_latency_ms)
    replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_observe(metrics, replica_id)])
    app[REPLICA_ID] = replica_id
    app[INFER_ROUTES] = routes
    app.router.add_get("/v2/health/live", routes.live)
    app.router.add_get("/v2/health/ready", routes.ready)
    app.router.add_get("/v2", routes.server_metadata)
    app.router.add_get("/v2/models", routes.models)
    app.router.add_post("/v2/repository/index", routes.models)
    app.router.add_get("/v2/models/{name}", routes.model_metadata)
    app.router.add_get("/v2/models/{name}/ready", routes.model_ready)
    app.router.add_post(INFER_ENDPOINT, routes.infer)
    app.router.add_get("/metrics", routes.metrics_text)
    return app
