"""An OpenAI-compatible token streamer whose token write times are known exactly.

    python -m latscope.targets.stream --port 0 --ttft-ms 50 --itl-ms 20 --tokens 16

It exists to check latscope's streaming client. Every token event carries `"t_ns"`: the server's
`time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux, one clock for all processes on the machine)
taken just before the chunk goes to the socket, so a client on the same host can compare its own
arrival stamps with the true write times. It is cheap per chunk (a raw asyncio.Protocol on uvloop,
httptools parsing, one pending deadline per stream, no task per token), to hold 1,000+ streams.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /health, GET /v1/models, and GET /stats:
how late the server's own timer sent tokens since the last /stats (p50, p99, max in µs), so that a
test can tell the server's jitter from the client's. The first token
leaves `ttft_ms` after the request is read, then one every `itl_ms`; the request body may override
`ttft_ms` and `itl_ms`, and give `token_gaps_ms` (the gap before each token after the first; without
`max_tokens` it also sets the count, to len + 1). Faults, by `model`, for streams of >= 2 tokens:
fault-malformed (2nd event is not JSON), fault-truncate (connection closed after 2 tokens),
fault-no-done (no `data: [DONE]`), fault-error-event (an error event after 1 token), fault-500.
Binds 127.0.0.1 by default, prints `ready http://HOST:PORT` once listening, stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import heapq
import itertools
import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import httptools

MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 32 << 10
MAX_TOKENS = 100_000
MAX_QUEUED = 8  # pipelined requests waiting behind a response before the socket stops being read
MAX_LATE_SAMPLES = 1_000_000  # timer lateness kept between two `GET /stats`
EARLY_NS = 50_000  # deadlines this close are run together: fewer wakeups, no token more than 50 µs early
REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
           413: b"Payload Too Large", 431: b"Request Header Fields Too Large", 500: b"Internal Server Error"}
DONE, END = b"e\r\ndata: [DONE]\n\n\r\n", b"0\r\n\r\n"  # the [DONE] event and the last chunk, chunk-framed


@dataclass(frozen=True)
class Timing:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    tokens: int = 16


class Reject(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _sse(obj: Any) -> bytes:
    """One SSE event as one chunk of the chunked encoding."""
    data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def prompt_words(value: Any) -> int:
    """Prompt tokens: whitespace-separated words of a prompt, a list of prompts or chat messages."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(1 if isinstance(v, int) else prompt_words(v) for v in value)
    if isinstance(value, dict):
        return prompt_words(value["content"] if "content" in value else value.get("text"))
    return 0


class Ticker:
    """Runs callbacks at absolute `perf_counter_ns` times. uvloop's timers count whole milliseconds and
    fire up to 1 ms late, so on Linux one timerfd (CLOCK_MONOTONIC, µs precision), armed at the earliest
    deadline of a heap, drives them all. Elsewhere it falls back to `loop.call_at`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.heap, self.seq, self.firing, self.fd = loop, [], itertools.count(), False, -1
        self.late_us: list[int] = []  # how late each callback ran, since the last `GET /stats` (bounded)
        if sys.platform == "linux":
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.spec = (ctypes.c_long * 4)()  # struct itimerspec: interval 0, then the deadline
            self.fd = self.libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if self.fd >= 0:
                loop.add_reader(self.fd, self._fire)

    def at(self, t_ns: int, callback: Callable[[], None]) -> Any:
        """Run `callback` at `t_ns`; returns a handle for `cancel`."""
        if self.fd < 0:
            delay = (t_ns - time.perf_counter_ns()) / 1e9 + 0.001  # whole-ms ticks: 1 ms more, never early
            return self.loop.call_at(self.loop.time() + delay, callback)
        entry = [t_ns, next(self.seq), callback]
        heapq.heappush(self.heap, entry)
        if not self.firing and self.heap[0] is entry:  # while firing, _fire re-arms at its end
            self._arm(t_ns)
        return entry

    @staticmethod
    def cancel(handle: Any) -> None:
        if isinstance(handle, list):
            handle[2] = None  # dropped from the heap when its time comes
        elif handle is not None:
            handle.cancel()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1

    def _arm(self, t_ns: int) -> None:  # re-arming also resets the fd's readiness; 0 disarms
        self.spec[2], self.spec[3] = divmod(t_ns, 1_000_000_000)
        self.libc.timerfd_settime(self.fd, 1, self.spec, None)  # 1: TFD_TIMER_ABSTIME

    def _fire(self) -> None:
        heap, self.firing = self.heap, True
        while heap and heap[0][0] <= time.perf_counter_ns() + EARLY_NS:
            due_ns, _, callback = heapq.heappop(heap)
            if callback is not None:
                if len(self.late_us) < MAX_LATE_SAMPLES:
                    self.late_us.append(max(0, time.perf_counter_ns() - due_ns) // 1000)
                try:
                    callback()
                except Exception as exc:  # the timer must be re-armed, whatever happens
                    self.loop.call_exception_handler({"message": "token callback failed", "exception": exc})
        self.firing = False
        self._arm(heap[0][0] if heap else 0)


class StreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; answers its requests one after the other."""

    def __init__(self, timing: Timing, conns: set[asyncio.Transport], ticker: Ticker) -> None:
        self.timing, self.conns, self.ticker = timing, conns, ticker
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.queue: deque[tuple[bytes, bytes, bytes, bool]] = deque()
        self.busy = self.draining = self.in_headers = self.eof = False
        self.handle: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.conns.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conns.discard(self.transport)
        Ticker.cancel(self.handle)  # the client left mid-stream: no deadline left behind
        self.handle = self.transport = None
        self.queue.clear()

    def eof_received(self) -> bool:
        self.eof = True
        return self.busy or bool(self.queue)  # half-closed: answer what was asked, then close

    def data_received(self, data: bytes) -> None:
        if self.draining:
            return
        try:
            self.parser.feed_data(data)
            if self.in_headers:  # a header block still unfinished: bound what the parser holds
                self.raw_head += len(data)
                if self.raw_head > 2 * MAX_HEADER_BYTES:
                    raise Reject(431)
        except Exception as exc:  # httptools wraps what its callbacks raise
            reject = exc if isinstance(exc, Reject) else exc.__context__
            return self._fail(reject.status if isinstance(reject, Reject) else 400)
        if len(self.queue) >= MAX_QUEUED:
            self.transport.pause_reading()
        self._next()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body, self.body_size, self.head_bytes, self.raw_head, self.in_headers = b"", [], 0, 0, 0, True

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEADER_BYTES:
            raise Reject(431)
        if name.lower() == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
            raise Reject(413)

    def on_headers_complete(self) -> None:
        self.in_headers = False

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > MAX_BODY_BYTES:
            raise Reject(413)
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.queue.append((self.parser.get_method(), self.url, b"".join(self.body), self.parser.should_keep_alive()))

    # requests and whole responses
    def _next(self) -> None:
        if self.busy or not self.queue or self.transport is None:
            return
        if len(self.queue) == MAX_QUEUED:
            self.transport.resume_reading()
        method, url, body, self.keep_alive = self.queue.popleft()
        self.busy, self.t_read = True, time.perf_counter_ns()
        path = url.split(b"?", 1)[0]
        if path == b"/stats" and method == b"GET":
            self._respond(200, self._stats())
        elif path in (b"/health", b"/v1/models") and method == b"GET":
            self._respond(200, {"status": "ready"} if path == b"/health" else {"object": "list", "data": [
                {"id": "latscope-stream", "object": "model", "created": 0, "owned_by": "latscope"}]})
        elif path in (b"/v1/completions", b"/v1/chat/completions") and method == b"POST":
            self._start(body, chat=path == b"/v1/chat/completions")
        elif path in (b"/health", b"/v1/models", b"/v1/completions", b"/v1/chat/completions"):
            self._respond(405, _error(f"method {method.decode('latin-1')} not allowed"))
        else:
            self._respond(404, _error(f"no route {path.decode('latin-1')}", "not_found_error"))

    def _stats(self) -> dict:
        """How late this server sent its tokens (its timer's lateness) since the last call: the server's
        own share of any gap error, which a client's measurement can then be judged without."""
        late, self.ticker.late_us = sorted(self.ticker.late_us), []
        if not late:
            return {"tokens_timed": 0}
        return {"tokens_timed": len(late), "late_p50_us": late[len(late) // 2],
                "late_p99_us": late[min(len(late) - 1, int(0.99 * len(late)))], "late_max_us": late[-1]}

    def _head(self, status: int, ctype: bytes, framing: bytes) -> bytes:
        return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s\r\nServer-Timing: queue;dur=0.000, compute;dur=%.3f\r\n"
                b"X-Replica-Id: stream-%d\r\n%s\r\n") % (
            status, REASONS[status], ctype, framing, (time.perf_counter_ns() - self.t_read) / 1e6, os.getpid(),
            b"" if self.keep_alive else b"Connection: close\r\n")

    def _respond(self, status: int, obj: Any, done: bool = True) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.transport.write(self._head(status, b"application/json", b"Content-Length: %d" % len(data)) + data)
        if done:
            self._done()

    def _done(self) -> None:
        self.busy, self.handle = False, None
        if self.transport is not None and (not self.keep_alive or (self.eof and not self.queue)):
            self.transport.close()
        elif self.queue:
            asyncio.get_running_loop().call_soon(self._next)  # not recursion: a pipeline may be long

    def _fail(self, status: int) -> None:
        """Answer a bad request, then half-close and discard the input, so the client reads the answer."""
        Ticker.cancel(self.handle)
        self.queue.clear()
        self.draining, self.keep_alive, self.t_read = True, False, time.perf_counter_ns()
        self._respond(status, _error(f"{status} {REASONS[status].decode()}"), done=False)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(5.0, self.transport.close)

    # completions
    def _start(self, raw: bytes, chat: bool) -> None:
        try:
            req = json.loads(raw)
            if not isinstance(req, dict):
                raise ValueError("the body must be a JSON object")
            gaps = [float(g) for g in req.get("token_gaps_ms") or []]
            given = [req.get(k) for k in (("max_completion_tokens", "max_tokens") if chat else ("max_tokens",))]
            count = next((v for v in given if v is not None), len(gaps) + 1 if gaps else self.timing.tokens)
            if type(count) is not int or not 1 <= count <= MAX_TOKENS:
                raise ValueError(f"max_tokens must be an integer in 1..{MAX_TOKENS}")
            ttft, itl = float(req.get("ttft_ms", self.timing.ttft_ms)), float(req.get("itl_ms", self.timing.itl_ms))
            if not all(0 <= t < 3.6e6 for t in (ttft, itl, *gaps)):
                raise ValueError("ttft_ms, itl_ms and token_gaps_ms must be in [0, 3600000)")
            self.prompt_tokens = prompt_words(req.get("messages") if chat else req.get("prompt"))
            self.stream = bool(req.get("stream"))
            self.usage = not self.stream or bool((req.get("stream_options") or {}).get("include_usage"))
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            return self._respond(400, _error(str(exc)))
        self.model, self.count, self.i, self.chat = str(req.get("model", "latscope-stream")), count, 0, chat
        if self.model == "fault-500":
            return self._respond(500, _error("injected fault", "server_error"))
        gaps = gaps[:count - 1] + [itl] * (count - 1 - len(gaps))  # the gap before tokens 1 .. count-1
        self.gaps = [round(g * 1e6) for g in gaps]
        self.due = self.t_read + round(ttft * 1e6)
        self.meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{os.getpid()}-{self.t_read}",
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": self.model}
        if not self.stream:
            self.handle = self.ticker.at(self.due + sum(self.gaps), self._whole)
            return
        # Each token event is these bytes around its index, finish_reason and t_ns: no json.dumps per token.
        self.before = json.dumps(self.meta, separators=(",", ":"))[:-1].encode() + (
            b',"choices":[{"index":0,"delta":{"content":" tok' if chat else b',"choices":[{"index":0,"text":" tok')
        self.after = b'"},"finish_reason":' if chat else b'","finish_reason":'
        head = self._head(200, b"text/event-stream", b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked")
        if chat:  # as vLLM does: the role chunk leaves as soon as the request is read
            head += _sse({**self.meta, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]})
        self.transport.write(head)
        self.handle = self.ticker.at(self.due, self._emit)

    def _emit(self) -> None:
        """Write token `self.i` as one SSE event in one chunk, then schedule the next one."""
        i, last, fault, transport = self.i, self.i == self.count - 1, self.model, self.transport
        if transport is None or transport.is_closing():
            return
        if fault == "fault-error-event" and i == 1:
            transport.write(_sse({"error": {"message": "boom <script>", "type": "server_error"}}) + DONE + END)
            return self._done()
        truncate = fault == "fault-truncate" and (i == 1 or last)
        tail = b""
        if last and not truncate:
            tail = _sse({**self.meta, "choices": [], "usage": self._usage()}) if self.usage else b""
            tail += END if fault == "fault-no-done" else DONE + END
        t_ns = time.perf_counter_ns()
        if fault == "fault-malformed" and i == 1:
            event = b"data: {not json\n\n"
        else:
            event = b'data: %s%d%s%s}],"t_ns":%d}\n\n' % (self.before, i, self.after,
                                                         b'"length"' if last else b"null", t_ns)
        transport.write(b"%x\r\n%s\r\n%s" % (len(event), event, tail))
        if truncate:
            self.keep_alive = False  # _done closes mid-body: no last chunk, no [DONE]
        if last or truncate:
            return self._done()
        self.due += self.gaps[i]
        self.i = i + 1
        self.handle = self.ticker.at(self.due, self._emit)

    def _whole(self) -> None:
        if self.model == "fault-truncate":
            self.keep_alive = False
            return self._done()  # closes without an answer
        text = "".join(f" tok{i}" for i in range(self.count))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if self.chat else {"index": 0, "text": text, "finish_reason": "length"})
        self._respond(200, {**self.meta, "object": "chat.completion" if self.chat else "text_completion",
                            "choices": [choice], "usage": self._usage(), "t_ns": time.perf_counter_ns()})

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.count,
                "total_tokens": self.prompt_tokens + self.count}


async def serve(host: str = "127.0.0.1", port: int = 0, timing: Timing = Timing()) -> None:
    """Serve until SIGTERM or SIGINT; prints `ready http://HOST:PORT` once listening."""
    loop = asyncio.get_running_loop()
    conns: set[asyncio.Transport] = set()
    ticker = Ticker(loop)
    server = await loop.create_server(lambda: StreamProtocol(timing, conns, ticker), host, port, backlog=4096)
    gc.freeze()  # what exists now is never garbage: keep it out of the collector's pauses
    print(f"ready http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    for transport in list(conns):
        transport.abort()
    await server.wait_closed()
    ticker.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=50.0, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=20.0, help="gap between tokens")
    parser.add_argument("--tokens", type=int, default=16, help="tokens when the request sets no max_tokens")
    args = parser.parse_args(argv)
    try:
        import uvloop
        runner: Any = uvloop.run
    except ImportError:  # no uvloop (Windows): asyncio's own loop
        runner = asyncio.run
    runner(serve(args.host, args.port, Timing(args.ttft_ms, args.itl_ms, args.tokens)))


if __name__ == "__main__":
    main()
