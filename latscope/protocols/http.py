"""Plain HTTP/JSON over aiohttp: one session per worker, keep-alive connections, no redirects.

Each workload class is turned into a ready-to-send request (method, URL, headers, body bytes) once,
when the client opens, so the per-request path does no encoding.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp
from yarl import URL

from latscope import __version__
from latscope.records import Outcome, Request
from latscope.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    method: str
    url: URL
    headers: dict[str, str]
    body: bytes | None


def prepare_requests(scenario: Scenario) -> list[PreparedRequest]:
    """One prepared request per workload class, in class order."""
    target, workload = scenario.target, scenario.workload
    prepared = []
    for cls in workload.effective_classes():
        body_value = cls.body if cls.body is not None else workload.body
        headers = {"User-Agent": f"latscope/{__version__}", **target.headers, **cls.headers}
        body: bytes | None
        if body_value is None:
            body = None
        elif isinstance(body_value, (dict, list)):
            body = json.dumps(body_value, separators=(",", ":")).encode()
            headers.setdefault("Content-Type", workload.content_type or "application/json")
        else:
            body = str(body_value).encode()
            if workload.content_type:
                headers.setdefault("Content-Type", workload.content_type)
        path = cls.path if cls.path is not None else target.path
        url = URL(target.url.rstrip("/") + path) if path else URL(target.url)
        prepared.append(PreparedRequest((cls.method or target.method).upper(), url, headers, body))
    return prepared


def classify(exc: BaseException) -> tuple[str, str]:
    """(error kind, reason) for an exception raised while sending. Never raises."""
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError and aiohttp.ServerTimeoutError
        return "timeout", "no complete response within target.timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect", f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        return "connect", f"connection lost: {exc}"
    return "protocol", f"{type(exc).__name__}: {exc}"


class HttpClient:
    def __init__(self, scenario: Scenario, max_connections: int):
        self._prepared = prepare_requests(scenario)
        self._timeout = aiohttp.ClientTimeout(total=scenario.target.timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, request: Request) -> Outcome:
        prepared = self._prepared[request.cls]
        sent = time.perf_counter_ns()
        try:
            async with self._session.request(
                prepared.method, prepared.url, headers=prepared.headers, data=prepared.body, allow_redirects=False
            ) as response:
                payload = await response.read()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure of the target becomes an error record, never a crash
            kind, reason = classify(exc)
            return Outcome(sent, time.perf_counter_ns(), error=kind, reason=reason)
        end = time.perf_counter_ns()
        status = response.status
        outcome = Outcome(sent, end, status=status, bytes_in=len(payload), bytes_out=len(prepared.body or b""))
        if status >= 400:
            outcome.error = "http_4xx" if status < 500 else "http_5xx"
            outcome.reason = f"HTTP {status} {response.reason or ''}".strip()
        return outcome
