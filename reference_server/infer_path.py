"""A lean HTTP/1.1 path for the one hot route, `POST /v2/models/{name}/infer`, in front of aiohttp.

Why: at 8 tokens a request's share of the model's core is ~1.85 ms of compute, and every 0.1 ms the event
loop spends on it is ~5 % of capacity. aiohttp's own handling (request and response objects, routing,
middleware, its writer) was about half of the loop's 0.23 ms per request; here a request costs one
httptools parse of its head, one task, the same `V2Routes.answer_infer` and one `transport.write`.

Contract (what a client sees is what aiohttp's infer handler answers, byte for byte in status and body):
- Every accepted connection starts here (`InferSite`). A request is served here only when all of these
  hold: it starts `POST /v2/models/`, its head parses (httptools, the llhttp that aiohttp uses too), it is
  HTTP/1.1, its path (before '?') is `/v2/models/NAME/infer` with NAME plain ASCII (no '%', '/'), its
  Content-Length is at most --max-body-bytes (none: an empty body), and it has no Transfer-Encoding,
  Content-Encoding, Expect or Upgrade header.
- The first request that fails any of these, and everything after it on that connection, goes to
  aiohttp: the connection is handed to aiohttp's own protocol at that request's first byte (the bytes
  held here are replayed into it), so every other route, chunked or compressed bodies, 413 (with
  aiohttp's drain of the body), and requests the parser refuses (400 + one INFO line) are answered
  exactly as before. Nothing is consumed before the decision, so the hand-over is always possible.
- The answer is `V2Routes.answer_infer`'s, the function aiohttp's infer handler calls too: status, JSON
  body, Content-Type, Server-Timing, Retry-After; plus X-Replica-Id, Content-Length, Date and Server as
  aiohttp writes them, and `Connection: close` when the request did not keep the connection alive.
  Metrics are counted as the middleware counts them: in flight from head parsed to answer ready,
  requests by endpoint and status, duration over the same span.
- One request at a time per connection, in order (as aiohttp): pipelined bytes wait in the buffer, and
  reading pauses once more than a whole request (head + largest body) is held, or while the transport's
  write buffer is over its high-water mark.
- A client that ends its connection before its body is all here: one INFO line ("client went away: ...",
  the middleware's words) and status 499 counted.
- Keep-alive: a connection idle for KEEPALIVE_S (aiohttp's default, 75 s) is closed.
- Shutdown (`InferSite.stop`, called by the runner's cleanup before aiohttp's own connections are shut
  down): stop listening, close idle connections, let requests already read finish and be answered (up to
  `drain_timeout`), then close the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from http import HTTPStatus
from typing import Any

import httptools
from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.tcp_helpers import tcp_keepalive

from reference_server.http_server import CLIENT_GONE, INFER_ENDPOINT, INFER_ROUTES, REPLICA_ID, V2Routes, error_answer

log = logging.getLogger("reference_server.http_server")  # the middleware's logger: same lines, same place

KEEPALIVE_S = 75.0
MAX_HEAD_BYTES = 32768  # a head still unfinished past this goes to aiohttp (which refuses lines over 8190)
_START = b"POST /v2/models/"
# A model name aiohttp's router would take as is (no '%' to decode, no '.' or '..' segment to resolve).
_PATH = re.compile(rb"/v2/models/([A-Za-z0-9_-][A-Za-z0-9_.-]*)/infer")
_NOT_HERE = frozenset((b"transfer-encoding", b"content-encoding", b"expect", b"upgrade"))
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_SERVER_LINE = f"Server: {SERVER_SOFTWARE}\r\n"


class InferConnection(asyncio.Protocol):
    """One client connection while its requests are infer requests (see the module docstring)."""

    def __init__(self, site: InferSite) -> None:
        self.site = site
        self.transport: Any = None
        self.buf: bytes | bytearray = b""
        self.head_end = 0  # > 0: the head of the request at buf[0] is parsed; its body starts here
        self.task: asyncio.Task | None = None  # the request being answered
        self.last = 0.0  # time.monotonic() of the last bytes in or answer out
        self.eof = self.closing = self.read_paused = self.write_paused = False

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        tcp_keepalive(transport)  # as aiohttp's RequestHandler does
        self.last = time.monotonic()
        self.site.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.site.connections.discard(self)
        if self.head_end and self.task is None:
            self._client_gone()
        self.transport = None
        self.buf = b""

    def eof_received(self) -> bool:
        self.eof = True
        if self.head_end and self.task is None:  # its body will never be complete
            self._client_gone()
            return False
        return self.task is not None  # half-closed while answering: answer, then close

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._next()

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if not self.buf:
            self.buf = data
        else:
            if type(self.buf) is bytes:
                self.buf = bytearray(self.buf)  # amortized appends for a body in many reads
            self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > self.site.max_body_bytes + MAX_HEAD_BYTES and not self.read_paused:
            self.read_paused = True  # pipelined requests: hold at most about one whole request
            self.transport.pause_reading()

    # --- httptools callbacks (one parser per request head) ---
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.length = value
        elif name == b"inference-header-content-length":
            if self.header_length is None:  # the first, as aiohttp's headers.get gives
                self.header_length = value.decode("utf-8", "surrogateescape")
        elif name in _NOT_HERE:
            self.plain = False

    # --- requests ---
    def _next(self) -> None:
        """Start the request at the front of the buffer when it is here, or hand the connection over."""
        if self.task is not None or self.write_paused or self.transport is None or (self.closing and not self.head_end):
            return
        buf = self.buf
        if not self.head_end:
            if not buf:
                return
            if not buf.startswith(_START[:len(buf)]):
                return self._hand_over()
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._hand_over()
                return
            if not self._parse_head(buf[:end + 4]):
                return self._hand_over()
            self.head_end = end + 4
            self.started = time.perf_counter()
            self.site.in_flight.inc()
        need = self.head_end + self.body_length
        if len(buf) < need:
            return
        body = bytes(memoryview(buf)[self.head_end:need]) if need > self.head_end else b""
        self.buf = buf[need:] if len(buf) > need else b""
        self.head_end = 0
        if self.read_paused and len(self.buf) <= self.site.max_body_bytes + MAX_HEAD_BYTES:
            self.read_paused = False
            self.transport.resume_reading()
        self.task = asyncio.get_running_loop().create_task(self._answer(body))

    def _parse_head(self, head: bytes | bytearray) -> bool:
        """Whether the request whose head this is is one served here; sets its name, length, keep-alive."""
        self.url, self.length, self.header_length, self.plain = b"", None, None, True
        parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(head)
        except Exception:  # noqa: BLE001 - any parse error or upgrade: aiohttp answers it as it always has
            return False
        if not self.plain or parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return False
        match = _PATH.fullmatch(self.url.split(b"?", 1)[0])
        if match is None:
            return False
        length = int(self.length) if self.length is not None else 0  # llhttp accepted it: digits only
        if length > self.site.max_body_bytes:
            return False  # aiohttp answers 413 and drains the body before the next request
        self.name, self.path = match[1].decode("ascii"), self.url.split(b"?", 1)[0].decode("ascii")
        self.body_length, self.keep_alive = length, parser.should_keep_alive()
        return True

    async def _answer(self, body: bytes) -> None:
        site = self.site
        try:
            status, payload, headers = await site.routes.answer_infer(self.name, body, self.header_length)
        except Exception as exc:  # noqa: BLE001 - a bug must still answer, and be logged with its traceback
            log.exception("unhandled error for POST %s", self.path)
            status, payload, headers = error_answer(500, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            site.in_flight.dec()
        site.count(status, time.perf_counter() - self.started)
        keep_alive = self.keep_alive and not self.closing
        head = "".join([f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n",
                        *[f"{name}: {value}\r\n" for name, value in headers.items()],
                        site.replica_line, f"Content-Length: {len(payload)}\r\nDate: {rfc822_formatted_time()}\r\n",
                        _SERVER_LINE, "" if keep_alive else "Connection: close\r\n", "\r\n"]).encode("latin-1")
        self.task = None
        self.last = time.monotonic()
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # the client left while its request ran: nobody to answer
        if len(payload) < 65536:
            transport.write(head + payload)
        else:
            transport.write(head)
            transport.write(payload)
        if not keep_alive:
            transport.close()
            return
        if self.buf:
            self._next()  # a pipelined request: started, handed over, or still incomplete
        if self.eof and self.task is None and self.transport is not None:  # half-closed: nothing more comes
            if self.head_end:
                self._client_gone()
            self.transport.close()

    def _client_gone(self) -> None:
        """The client ended the connection with the body of a request whose head came still owed."""
        came = len(self.buf) - self.head_end
        log.info("client went away: %s", f"the client closed the connection while sending its request body "
                 f"(POST {self.path}, {came} of {self.body_length} bytes came)")
        self.site.in_flight.dec()
        self.site.count(CLIENT_GONE, time.perf_counter() - self.started)
        self.head_end = 0
        self.buf = b""

    def _hand_over(self) -> None:
        """From this request on, the connection is aiohttp's: its protocol takes the transport and the bytes."""
        transport, data = self.transport, bytes(self.buf)
        self.transport, self.buf = None, b""
        self.site.connections.discard(self)
        handler = self.site.aiohttp_server()  # aiohttp's RequestHandler for one connection
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.data_received(data)
        if self.read_paused:
            transport.resume_reading()

    def close_if_idle(self, idle_before: float | None = None) -> bool:
        """Close the connection when no request is being read or answered (and, with `idle_before`, it has
        been quiet since before that monotonic time); whether it is closed or closing."""
        if self.transport is None:
            return True
        if self.task is None and not self.head_end and (idle_before is None or self.last < idle_before):
            self.transport.close()
            return True
        return False


class InferSite(web.BaseSite):
    """aiohttp's SockSite, with every connection starting on `InferConnection` (see the module docstring).

    `routes`: the app's V2Routes (`make_app` stores them under `INFER_ROUTES`); the runner's server takes
    the connections handed over."""

    __slots__ = ("_sock", "_name", "routes", "connections", "aiohttp_server", "max_body_bytes", "in_flight",
                 "replica_line", "_drain_timeout", "_sweeper")

    def __init__(self, runner: web.BaseRunner, sock: Any, *, drain_timeout: float) -> None:
        super().__init__(runner)
        self._sock = sock
        host, port = sock.getsockname()[:2]
        self._name = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        app = runner.app if isinstance(runner, web.AppRunner) else None
        assert app is not None, "InferSite needs an AppRunner of make_app's application"
        self.routes: V2Routes = app[INFER_ROUTES]
        self.aiohttp_server = runner.server
        self.max_body_bytes = self.routes.max_body_bytes
        self.in_flight = self.routes.metrics.in_flight
        self.replica_line = f"X-Replica-Id: {app[REPLICA_ID]}\r\n"
        self.connections: set[InferConnection] = set()
        self._drain_timeout = drain_timeout
        self._sweeper: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self._name

    def count(self, status: int, seconds: float) -> None:
        """The middleware's two metrics for one infer request."""
        self.routes.metrics.on_request(INFER_ENDPOINT, status, seconds)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: InferConnection(self), sock=self._sock, backlog=self._backlog)
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S / 8)
            idle_before = time.monotonic() - KEEPALIVE_S
            for connection in list(self.connections):
                connection.close_if_idle(idle_before)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + self._drain_timeout
        for connection in list(self.connections):
            connection.closing = True  # answers in progress say Connection: close and close after
        while True:
            busy = [c for c in self.connections if not c.close_if_idle()]
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.01)
        for connection in busy:
            if connection.task is not None:
                connection.task.cancel()
            if connection.transport is not None:
                connection.transport.close()
        await super().stop()
