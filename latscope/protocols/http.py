"""Plain HTTP/1.1 (JSON or anything else) over the event loop's own transports.

Why not aiohttp's client here: a load generator's per-request cost decides how much load one worker
can offer on time. aiohttp's `ClientSession.request` spends ~250 µs of Python per request (URL
handling, cookies, tracing hooks, response objects), which capped one open-loop worker at ~2,500
req/s. This client keeps a pool of keep-alive connections, writes each workload class's request as
bytes prepared once, and lets httptools (llhttp, the parser of Node.js) parse responses; it does
nothing per request beyond that. See benchmarks/RESULTS.md for the numbers.

One request per connection at a time (no pipelining); the pool opens a new connection whenever no
idle one is left, so it never holds more connections than requests in flight, which the engine caps.

Timeouts: one sweep per pool every TIMEOUT_SWEEP_S fails the requests past target.timeout, instead of
a timer per request (asyncio.timeout makes five objects per request — a Timeout, its handle, a
timer, a context, a bound method — that live as long as the request, and a worker holding 1,000
streams is mostly such objects, which the garbage collector walks; see engine.GC_THRESHOLDS). A
request times out at most TIMEOUT_SWEEP_S after its timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import httptools

from latscope import __version__
from latscope.protocols.server_timing import parse_server_timing
from latscope.records import Outcome, Request
from latscope.request_ids import id_prefix, run_tag
from latscope.scenario import Endpoint, Scenario, encoded_body
from latscope.workload import text_seed


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One workload class's request, as it goes on the wire: `prefix` (request line and headers),
    then `rest` (the body-length header, the blank line, the body). A request id goes between them."""

    head: bool  # a HEAD request: the response has headers only, whatever Content-Length says
    prefix: bytes
    rest: bytes
    data: bytes  # prefix + rest: the whole request when it carries no id
    body_len: int
    request_id: bytes | None = None  # target.request_id_header and the run's id prefix, as bytes (request_id_name)
    refused: str | None = None  # why this class's request cannot be written (unsafe_head): each one is an error
    sends: str | None = None  # what it carries beyond the plain request, in words (what_it_sends)


def prepare_requests(scenario: Scenario) -> list[PreparedRequest]:
    """One ready-to-write request per workload class, in class order."""
    workload = scenario.workload
    prepared = []
    for i, cls in enumerate(workload.effective_classes()):
        endpoint = scenario.endpoint(i)
        body_value = cls.body if cls.body is not None else workload.body
        body = b"" if body_value is None else encoded_body(body_value)
        content_type = workload.content_type
        if isinstance(body_value, (dict, list)):
            content_type = content_type or "application/json"
        prefix, refused = prefix_or_refusal(endpoint, content_type)
        rest = request_head(b"", endpoint, len(body)) + body
        prepared.append(PreparedRequest(endpoint.method == "HEAD", prefix, rest, prefix + rest, len(body),
                                        request_id_name(endpoint, scenario), refused, what_it_sends(endpoint)))
    return prepared


def request_id_name(endpoint: Endpoint, scenario: Scenario) -> bytes | None:
    """The start of the header line that carries each request's id (target.request_id_header): its
    name and the run's part of the UUID (latscope/request_ids.py), or None when none is asked for."""
    if not endpoint.request_id_header:
        return None
    return b"%s: %s" % (endpoint.request_id_header.encode("latin-1"), id_prefix(request_id_tag(scenario)).encode())


def request_id_tag(scenario: Scenario) -> int:
    """The run's part of its request ids (request_ids.run_tag), from its salted text key."""
    return run_tag(text_seed(scenario))


def request_id_line(start: bytes | None, seq: int) -> bytes:
    """The header line `name: <UUID of seq>` (`start` from request_id_name), or nothing when the
    scenario asks for no request id."""
    return b"%s%012x\r\n" % (start, seq) if start else b""


TIMEOUT_SWEEP_S = 0.01  # how often a pool fails the requests past target.timeout


class Failure(Exception):
    """A request failed: `kind` is one of results.schema.ERROR_KINDS."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    end_ns: int  # perf_counter_ns when the last byte was read
    body_len: int
    body: bytes | None  # the body, when asked for (keep_body)
    headers: dict[str, str]  # the headers of WANTED_HEADERS that came, by lower-case name
    first_ns: int = 0  # perf_counter_ns when the response's first bytes were read (the status line)
    connection: int = -1  # which connection of the pool carried it (numbered as opened)


def too_large(limit: int) -> str:
    """The reason of a response cut at `limit` bytes (limits.max_response_bytes)."""
    return f"response larger than limits.max_response_bytes ({limit:,} bytes)"


def refused_outcome(reason: str) -> Outcome:
    """The outcome of a request that was never written because it could not be written safely."""
    now = time.perf_counter_ns()
    return Outcome(now, now, error="protocol", reason=reason)


BodySink = Callable[[bytes, int], None]  # (a piece of the body, perf_counter_ns of the read it came in)
# The only response headers kept (parsing every header of every response costs a load generator).
WANTED_HEADERS = frozenset({"server-timing", "x-replica-id", "content-type", "inference-header-content-length"})


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `send` writes a request and resolves once its whole response is in."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int):
        self.loop = loop
        self.limit = limit  # bytes one response may take, head and body (limits.max_response_bytes)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.read_ns = 0  # when the data being parsed was read: streamed pieces are stamped with it
        self.deadline_ns = 0  # when the request in flight times out (HttpPool._sweep)
        self.id = -1  # its number in the pool, in the order connections were opened
        self._reset(False, False, None)

    def _reset(self, head: bool, keep_body: bool, sink: BodySink | None) -> None:
        self.head, self.sink = head, sink
        self.pieces: list[bytes] | None = [] if keep_body else None
        self.body_len, self.reason, self.end_ns, self.keep_alive = 0, "", 0, False
        self.received = 0  # bytes read of this response (whatever the parser makes of them)
        self.first_ns = 0  # when its first bytes were read
        self.headers: dict[str, str] = {}

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.read_ns = time.perf_counter_ns()
        if not self.received:
            self.first_ns = self.read_ns
        self.received += len(data)
        if self.received > self.limit:  # an endless or enormous response: nothing more is read or kept
            self._fail(Failure("protocol", f"{too_large(self.limit)}: cut, connection dropped"))
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Failure("protocol", f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(Failure("connect", f"connection lost: {exc or 'closed by the server'}"))

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in WANTED_HEADERS and key not in self.headers:
            self.headers[key] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body_len += len(body)
        if self.sink is not None:
            self.sink(body, self.read_ns)
        elif self.pieces is not None:
            self.pieces.append(body)

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
    def expire(self) -> None:
        """The request took longer than target.timeout: it fails, and the connection is dropped."""
        self._fail(Failure("timeout", "no complete response within target.timeout"))
        self.close()

    def _fail(self, failure: Failure) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)

    def send(self, data: bytes, head: bool, keep_body: bool, sink: BodySink | None) -> asyncio.Future:
        """Write the request; the future gets the status code once the whole response is in."""
        self.waiter = self.loop.create_future()
        self._reset(head, keep_body, sink)
        self.transport.write(data)
        return self.waiter

    def response(self, status: int) -> Response:
        body = b"".join(self.pieces) if self.pieces is not None else None
        return Response(status, self.reason, self.end_ns, self.body_len, body, self.headers, self.first_ns, self.id)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpPool:
    """Keep-alive HTTP/1.1 connections to one origin, one request per connection at a time. Opens a
    connection whenever none is idle, so it never holds more than the requests in flight (which the
    engine caps). Open it inside the worker's event loop."""

    def __init__(self, url: str, timeout_s: float, max_response_bytes: int):
        parts = urlsplit(url)
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._timeout_ns = int(timeout_s * 1e9)
        self._limit = max_response_bytes
        self._idle: deque[_Connection] = deque()
        self._all: set[_Connection] = set()
        self._busy: set[_Connection] = set()  # with a request in flight
        self._opened = 0  # connections opened so far (each one's id: the per-request records' `connection`)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task | None = None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = self._loop.create_task(self._sweep())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in self._all:
            connection.close()
        self._all.clear()
        self._idle.clear()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(TIMEOUT_SWEEP_S)
            now = time.perf_counter_ns()
            for connection in [c for c in self._busy if c.deadline_ns <= now]:
                connection.expire()

    async def _connection(self, deadline_ns: int) -> _Connection:
        while self._idle:
            connection = self._idle.pop()  # most recently used first: warm, and not about to time out
            if not connection.closed:
                return connection
            self._all.discard(connection)
        try:
            async with asyncio.timeout((deadline_ns - time.perf_counter_ns()) / 1e9):  # a new connection only
                _, connection = await self._loop.create_connection(
                    lambda: _Connection(self._loop, self._limit), self._host, self._port, ssl=self._ssl
                )
        except TimeoutError:
            raise Failure("timeout", "no complete response within target.timeout") from None
        except OSError as exc:
            raise Failure("connect", f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}") from None
        self._all.add(connection)
        connection.id, self._opened = self._opened, self._opened + 1
        return connection

    def _discard(self, connection: _Connection | None) -> None:
        if connection is not None:
            connection.close()
            self._all.discard(connection)

    async def request(self, data: bytes, *, head: bool = False, keep_body: bool = False,
                      sink: BodySink | None = None) -> Response:
        """Send one request (`data`: head and body as they go on the wire) and read its whole
        response within the timeout. A connect counts as part of the request. Raises Failure."""
        deadline = time.perf_counter_ns() + self._timeout_ns
        connection = None
        try:
            connection = await self._connection(deadline)
            connection.deadline_ns = deadline
            self._busy.add(connection)
            status = await connection.send(data, head, keep_body, sink)
        except (Failure, asyncio.CancelledError):
            self._discard(connection)
            raise
        finally:
            self._busy.discard(connection)
        response = connection.response(status)
        if connection.keep_alive and not connection.closed:
            self._idle.append(connection)
        else:
            self._discard(connection)
        return response


_LINE_BREAKING = re.compile(r"[\r\n\x00]")


def unsafe_head(method: str, target: str, headers: dict[str, str]) -> str | None:
    """Why a request line and headers cannot be written as they are ("not sent: ..."), None when they
    can: a CR, LF or NUL in the method, the URL or a header would end a line early, i.e. inject
    another header or request (the scenario refuses them at validation; this is the client's own
    check, made once per class, since values also come from ${ENV} and the scenario may be built in
    code). Names, never values, go into the reason: a value may be a secret."""
    places = [("the method", method), ("the URL", target)]
    for name, value in headers.items():
        places += [("a header name", name), (f"the value of header {name}", value)]
    for place, text in places:
        if _LINE_BREAKING.search(text):
            return f"not sent: {place} holds a CR, LF or NUL, which would inject a line into the request"
    return None


def prefix_or_refusal(endpoint: Endpoint, content_type: str | None = None,
                      own: tuple[str, ...] = ()) -> tuple[bytes, str | None]:
    """(request_prefix, None), or (b"", why) when the request cannot be written safely: every request
    of that class is then a `protocol` error (refused_outcome), never a byte on the wire."""
    try:
        return request_prefix(endpoint, content_type, own), None
    except Failure as failure:
        return b"", failure.reason


def request_prefix(endpoint: Endpoint, content_type: str | None = None, own: tuple[str, ...] = ()) -> bytes:
    """The request line and headers for `endpoint`, without Content-Length and the blank line that
    ends the head: a client that builds a body per request appends those (the scenario's own
    Content-Length, and headers named in `own`, are left out: the client writes them). Raises
    Failure("protocol") when they cannot be written safely (unsafe_head): not one byte is sent then."""
    url = urlsplit(endpoint.url)
    headers = {"Host": url.netloc, "User-Agent": f"latscope/{__version__}", "Accept": "*/*"}
    if content_type:
        headers["Content-Type"] = content_type
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    skip = {"content-length", *(name.lower() for name in own)}
    headers.update((k, v) for k, v in endpoint.headers.items() if k.lower() not in skip)
    path = url.path.rstrip("/") + endpoint.path
    target_path = (path or "/") + (f"?{url.query}" if url.query and "?" not in path else "")
    refused = unsafe_head(endpoint.method, target_path, headers)
    if refused is not None:
        raise Failure("protocol", refused)
    head = f"{endpoint.method} {target_path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1")


def request_head(prefix: bytes, endpoint: Endpoint, body_len: int) -> bytes:
    """The whole head (request_prefix, Content-Length, the blank line that ends it) for a body of
    `body_len` bytes."""
    length = b"Content-Length: %d\r\n" % body_len if body_len or endpoint.method in ("POST", "PUT", "PATCH") else b""
    return prefix + length + b"\r\n"


def with_server_headers(outcome: Outcome, response: Response) -> Outcome:
    """`outcome` with the Server-Timing parts and the replica id the response carried, and when its
    first bytes came on which connection (the per-request records')."""
    outcome.first_byte_ns, outcome.connection = response.first_ns, response.connection
    timing = response.headers.get("server-timing")
    if timing:
        outcome.server_timing = parse_server_timing(timing)
    outcome.replica = response.headers.get("x-replica-id")
    return outcome


ERROR_MESSAGE_CHARS = 200  # how much of a server's error message goes into a reason


def error_message(body: bytes | None) -> str:
    """The server's error message from an error response: `{"error": ...}` (a string, or an object with
    a `message`, as OpenAI-style and KServe servers send), else the body's text; cut to ERROR_MESSAGE_CHARS."""
    if not body:
        return ""
    text = None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            text = error
    if text is None:
        text = body[:ERROR_MESSAGE_CHARS * 4].decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= ERROR_MESSAGE_CHARS else text[:ERROR_MESSAGE_CHARS - 1] + "…"


EMPTY_BODY = " with an empty body"  # how the reason of a 4xx that says nothing ends (refused_what)


def http_error(outcome: Outcome, response: Response, body: bytes | None = None) -> Outcome:
    """`outcome` marked http_4xx / http_5xx when the response says so, with the server's error message
    from `body` (when the client kept it) in the reason, or, for a 4xx, that its body was empty."""
    if response.status >= 400:
        outcome.error = "http_4xx" if response.status < 500 else "http_5xx"
        outcome.reason = f"HTTP {response.status} {response.reason}".strip()
        message = error_message(body)
        if message:
            outcome.reason = f"{outcome.reason}: {message}"
        elif response.status < 500 and (response.body_len == 0 if body is None else not body.strip()):
            outcome.reason += EMPTY_BODY
    return outcome


EXTRA_BODY = {"openai": "openai", "openai-responses": "openai", "anthropic-messages": "anthropic",  # protocol -> its extra_body's section
              "openai-embeddings": "embeddings", "rerank": "rerank"}


def what_it_sends(endpoint: Endpoint) -> str | None:
    """What a class's requests carry beyond the protocol's plain request, in words (None: nothing):
    the request id, the scenario's headers (names only; credentials aside), an OpenAI class's
    extra_body fields. A server that refuses one of them may say only "400"."""
    parts = []
    if endpoint.request_id_header:
        parts.append(f"{endpoint.request_id_header} (a UUID, target.request_id_header)")
    headers = [name for name in endpoint.headers if name.lower() != "authorization"]
    if headers:
        parts.append(("the headers " if len(headers) > 1 else "the header ") + ", ".join(headers))
    section = EXTRA_BODY.get(endpoint.protocol)
    extra = list(getattr(endpoint, section).extra_body) if section else []
    if extra:
        parts.append(("the body fields " if len(extra) > 1 else "the body field ") + ", ".join(extra) + f" ({section}.extra_body)")
    return ", ".join(parts) or None


def refused_what(outcome: Outcome, sends: str | None) -> Outcome:
    """A 4xx with an empty body says nothing of why: its reason then names what this class sends
    beyond the plain request (what_it_sends), which the server may have refused."""
    if sends and outcome.error == "http_4xx" and outcome.reason and outcome.reason.endswith(EMPTY_BODY):
        outcome.reason += f"; this run sends {sends}: the server may refuse one of them"
    return outcome


class HttpClient:
    """Generic HTTP: each class's request is prepared once; the response body is counted, not parsed."""

    def __init__(self, scenario: Scenario, classes: list[int]):
        self._pool = HttpPool(scenario.endpoint(classes[0]).url, scenario.target.timeout,
                              scenario.limits.max_response_bytes)
        prepared = prepare_requests(scenario)
        self._prepared = {c: prepared[c] for c in classes}

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    def prepare(self, request: Request) -> None:
        """The class's prepared bytes (with the request id, when asked for): nothing to encode."""
        prepared = self._prepared[request.cls]
        if prepared.request_id:
            request.wire = b"".join((prepared.prefix, request_id_line(prepared.request_id, request.seq), prepared.rest))
        else:
            request.wire = prepared.data
        request.wire_bytes, request.prepared_ns = len(request.wire), time.perf_counter_ns()

    async def send(self, request: Request) -> Outcome:
        """Send one request; `sent_ns` is stamped before a connection is taken or opened, so a
        connect is part of service_time (the target's side), not of send_lag (the generator's)."""
        prepared = self._prepared[request.cls]
        if prepared.refused:
            return refused_outcome(prepared.refused)
        if request.wire is None:
            self.prepare(request)
        sent = time.perf_counter_ns()
        try:
            response = await self._pool.request(request.wire, head=prepared.head)
        except Failure as failure:
            return Outcome(sent, time.perf_counter_ns(), error=failure.kind, reason=failure.reason)
        outcome = Outcome(sent, response.end_ns, status=response.status, bytes_in=response.body_len,
                          bytes_out=prepared.body_len)
        return refused_what(http_error(with_server_headers(outcome, response), response), prepared.sends)
