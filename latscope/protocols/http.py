"""Plain HTTP/1.1 (JSON or anything else) over the event loop's own transports.

Why not aiohttp's client here: a load generator's per-request cost decides how much load one worker
can offer on time. aiohttp's `ClientSession.request` spends ~250 µs of Python per request (URL
handling, cookies, tracing hooks, response objects), which capped one open-loop worker at ~2,500
req/s. This client keeps a pool of keep-alive connections, writes each workload class's request as
bytes prepared once, and lets httptools (llhttp, the parser of Node.js) parse responses; it does
nothing per request beyond that. See benchmarks/RESULTS.md for the numbers.

One request per connection at a time (no pipelining); the pool opens a new connection whenever no
idle one is left, so it never holds more connections than requests in flight, which the engine caps.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from latscope import __version__
from latscope.records import Outcome, Request
from latscope.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    head: bool  # a HEAD request: the response has headers only, whatever Content-Length says
    data: bytes  # the whole request, head and body, as it goes on the wire
    body_len: int


def prepare_requests(scenario: Scenario) -> list[PreparedRequest]:
    """One ready-to-write request per workload class, in class order."""
    target, workload = scenario.target, scenario.workload
    url = urlsplit(target.url)
    prepared = []
    for cls in workload.effective_classes():
        body_value = cls.body if cls.body is not None else workload.body
        headers = {"Host": url.netloc, "User-Agent": f"latscope/{__version__}", "Accept": "*/*",
                   **target.headers, **cls.headers}
        body = b""
        if isinstance(body_value, (dict, list)):
            body = json.dumps(body_value, separators=(",", ":")).encode()
            headers.setdefault("Content-Type", workload.content_type or "application/json")
        elif body_value is not None:
            body = str(body_value).encode()
            if workload.content_type:
                headers.setdefault("Content-Type", workload.content_type)
        method = (cls.method or target.method).upper()
        if body or method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        path = url.path.rstrip("/") + (cls.path if cls.path is not None else target.path)
        target_path = (path or "/") + (f"?{url.query}" if url.query and "?" not in path else "")
        head = f"{method} {target_path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        prepared.append(PreparedRequest(method == "HEAD", head.encode("latin-1") + b"\r\n" + body, len(body)))
    return prepared


class _Failure(Exception):
    """A request failed: `kind` is one of records.ERROR_KINDS."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `exchange` sends a request and waits for its whole response."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.head = False
        self.body_len = 0
        self.reason = ""
        self.end_ns = 0
        self.keep_alive = False

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_Failure("protocol", f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(_Failure("connect", f"connection lost: {exc or 'closed by the server'}"))

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body_len += len(body)

    def on_headers_complete(self) -> None:
        if self.head:  # llhttp would wait for a body; there is none, and the next response needs a fresh parser
            self.on_message_complete()
            self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.end_ns = time.perf_counter_ns()
        self.keep_alive = self.parser.should_keep_alive()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self.parser.get_status_code())

    # use
    def _fail(self, failure: _Failure) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)

    def send(self, prepared: PreparedRequest) -> asyncio.Future:
        """Write the request; the future gets the status code once the whole response is in."""
        self.waiter = self.loop.create_future()
        self.head, self.body_len, self.reason = prepared.head, 0, ""
        self.transport.write(prepared.data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    def __init__(self, scenario: Scenario, max_connections: int):
        url = urlsplit(scenario.target.url)
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._prepared = prepare_requests(scenario)
        self._timeout_s = scenario.target.timeout
        self._idle: deque[_Connection] = deque()
        self._all: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        for connection in self._all:
            connection.close()
        self._all.clear()
        self._idle.clear()

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()  # most recently used first: warm, and not about to time out
            if not connection.closed:
                return connection
            self._all.discard(connection)
        try:
            _, connection = await self._loop.create_connection(
                lambda: _Connection(self._loop), self._host, self._port, ssl=self._ssl
            )
        except OSError as exc:
            raise _Failure("connect", f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}") from None
        self._all.add(connection)
        return connection

    def _discard(self, connection: _Connection | None) -> None:
        if connection is not None:
            connection.close()
            self._all.discard(connection)

    async def send(self, request: Request) -> Outcome:
        """Send one request; `sent_ns` is stamped before a connection is taken or opened, so a
        connect is part of service_time (the target's side), not of send_lag (the generator's)."""
        prepared = self._prepared[request.cls]
        connection = None
        sent = time.perf_counter_ns()
        try:
            async with asyncio.timeout(self._timeout_s):
                connection = await self._connection()
                status = await connection.send(prepared)
        except TimeoutError:
            self._discard(connection)
            return Outcome(sent, time.perf_counter_ns(), error="timeout", reason="no complete response within target.timeout")
        except _Failure as failure:
            self._discard(connection)
            return Outcome(sent, time.perf_counter_ns(), error=failure.kind, reason=failure.reason)
        except asyncio.CancelledError:
            self._discard(connection)
            raise
        outcome = Outcome(sent, connection.end_ns, status=status, bytes_in=connection.body_len, bytes_out=prepared.body_len)
        if status >= 400:
            outcome.error = "http_4xx" if status < 500 else "http_5xx"
            outcome.reason = f"HTTP {status} {connection.reason}".strip()
        if connection.keep_alive and not connection.closed:
            self._idle.append(connection)
        else:
            self._discard(connection)
        return outcome
