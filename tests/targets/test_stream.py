"""latscope.targets.stream, run as a real subprocess and read at the byte level: OpenAI SSE shape, one
event per chunk, token times (`t_ns`) against the requested schedule, fault modes, limits, shutdown."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from latscope.targets.stream import MAX_BODY_BYTES, StreamProtocol, Ticker, Timing

DEFAULTS = ["--ttft-ms", "20", "--itl-ms", "5", "--tokens", "5"]


def start(*args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "latscope.targets.stream", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.fullmatch(r"ready http://127\.0\.0\.1:(\d+)\n", line)
    assert m, f"unexpected first line {line!r}"
    return proc, int(m.group(1))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc, port = start(*DEFAULTS)
    yield proc, port
    proc.kill()
    proc.wait(5)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    t_send: int
    chunks: list[tuple[int, bytes]] = field(default_factory=list)  # (arrival perf_counter_ns, data)
    terminated: bool = False  # the zero-length chunk arrived
    body: bytes = b""

    def events(self) -> list[dict[str, Any] | str]:
        """The SSE events, one per chunk (asserted), as JSON objects, or strings where not JSON."""
        out: list[dict[str, Any] | str] = []
        for _, data in self.chunks:
            assert data.startswith(b"data: ") and data.endswith(b"\n\n") and data.count(b"\n\n") == 1, data
            text = data[6:-2].decode()
            try:
                out.append(json.loads(text))
            except ValueError:
                out.append(text)
        return out

    def tokens(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if isinstance(e, dict) and "t_ns" in e]


def fetch(port: int, path: str, body: Any = None, method: str = "POST", raw: bytes | None = None,
          extra: str = "") -> Reply:
    """One request on a fresh connection (`Connection: close`); reads to EOF, stamping each recv."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}Content-Length: {len(data)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        t_send = time.perf_counter_ns()
        sock.sendall(head.encode() + data)
        recvs: list[tuple[int, bytes]] = []
        while chunk := sock.recv(1 << 16):
            recvs.append((time.perf_counter_ns(), chunk))
    return parse(recvs, t_send)


def parse(recvs: list[tuple[int, bytes]], t_send: int) -> Reply:
    buf = b"".join(c for _, c in recvs)
    ends, total = [], 0
    for t, c in recvs:
        total += len(c)
        ends.append((total, t))
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    reply = Reply(int(lines[0].split()[1]), headers, t_send)
    if headers.get("transfer-encoding") != "chunked":
        reply.body = rest
        return reply
    pos = len(head) + 4
    while (eol := buf.find(b"\r\n", pos)) >= 0:
        size = int(buf[pos:eol], 16)
        if size == 0:
            reply.terminated = True
            break
        end = eol + 2 + size
        if end + 2 > len(buf):
            break  # cut off mid-chunk
        arrived = next(t for n, t in ends if n >= end)
        reply.chunks.append((arrived, buf[eol + 2:end]))
        pos = end + 2
    return reply


def completion(port: int, **fields: Any) -> Reply:
    return fetch(port, "/v1/completions", {"model": "m", "prompt": "one two three", "stream": True, **fields})


def test_health_models_unknown_route_and_headers(server: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = server
    r = fetch(port, "/health", method="GET")
    assert (r.status, json.loads(r.body)) == (200, {"status": "ready"})
    assert r.headers["x-replica-id"] == f"stream-{proc.pid}"
    assert re.fullmatch(r"queue;dur=0\.000, compute;dur=\d+\.\d{3}", r.headers["server-timing"])
    models = json.loads(fetch(port, "/v1/models", method="GET").body)
    assert [m["id"] for m in models["data"]] == ["latscope-stream"]
    r = fetch(port, "/v2/nope", method="GET")
    assert r.status == 404 and json.loads(r.body)["error"]["type"] == "not_found_error"
    assert fetch(port, "/v1/completions", method="GET").status == 405
    assert fetch(port, "/v1/completions", raw=b"{not json").status == 400
    assert fetch(port, "/v1/completions", {"max_tokens": 0}).status == 400


def test_keep_alive_serves_requests_in_turn(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 2, "ttft_ms": 1, "itl_ms": 1}).encode()
    req = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(req + req)  # pipelined: the second waits for the first
        buf = b""
        while buf.count(b'"finish_reason":"length"') < 2:
            buf += sock.recv(1 << 16)
    assert buf.count(b"HTTP/1.1 200 OK") == 2 and buf.count(b" tok0 tok1") == 2


def test_streamed_completion_shape_usage_and_done(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    r = completion(port, max_tokens=6, stream_options={"include_usage": True})
    assert r.status == 200 and r.terminated
    assert (r.headers["content-type"], r.headers["cache-control"]) == ("text/event-stream", "no-cache")
    events = r.events()
    assert len(events) == 6 + 2 and events[-1] == "[DONE]"
    tokens = r.tokens()
    assert [t["choices"][0]["text"] for t in tokens] == [f" tok{i}" for i in range(6)]
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 5 + ["length"]
    assert {(t["object"], t["model"], t["id"]) for t in tokens} == {("text_completion", "m", tokens[0]["id"])}
    assert events[6]["choices"] == [] and events[6]["usage"] == {"prompt_tokens": 3, "completion_tokens": 6,
                                                                  "total_tokens": 9}
    assert all(arrived >= t["t_ns"] for (arrived, _), t in zip(r.chunks, tokens))


def test_streamed_chat_role_first_then_tokens(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say four words"}]
    r = fetch(port, "/v1/chat/completions", {"model": "c", "messages": messages, "stream": True,
                                             "max_completion_tokens": 4, "ttft_ms": 40})
    events = r.events()
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and "t_ns" not in events[0]
    tokens = r.tokens()
    assert r.chunks[0][0] < tokens[0]["t_ns"]  # the role chunk arrived before the first token was written
    assert [t["choices"][0]["delta"] for t in tokens] == [{"content": f" tok{i}"} for i in range(4)]
    assert tokens[-1]["choices"][0]["finish_reason"] == "length" and tokens[0]["object"] == "chat.completion.chunk"
    assert len(events) == 1 + 4 + 1 and events[-1] == "[DONE]" and r.terminated  # no usage unless asked


def test_default_token_count_and_token_times(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    assert len(completion(port).tokens()) == 5  # --tokens
    seen = []
    for _ in range(3):  # a busy machine can delay a wakeup now and then; a wrong schedule fails every time
        r = completion(port, ttft_ms=30, itl_ms=20, max_tokens=10)
        t = [tok["t_ns"] for tok in r.tokens()]
        assert len(t) == 10
        for k, t_k in enumerate(t):  # never early (the server read the request after t_send)
            assert t_k - r.t_send >= (30 + 20 * k) * 1e6 - 60_000
        first, gaps = (t[0] - r.t_send) / 1e6, [(b - a) / 1e6 for a, b in zip(t, t[1:])]
        seen.append((first, gaps))
        if first < 30 + 5 and all(abs(g - 20) < 2.0 for g in gaps):
            break
    else:
        pytest.fail(f"first token (ms after send) and gaps off schedule in 3 tries: {seen}")


def test_stats_report_the_timers_lateness_since_the_last_call(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    fetch(port, "/stats", method="GET")  # start afresh
    assert len(completion(port, ttft_ms=5, itl_ms=5, max_tokens=6).tokens()) == 6
    stats = json.loads(fetch(port, "/stats", method="GET").body)
    assert stats["tokens_timed"] >= 6  # each token is one timer callback (plus the final chunk's)
    assert 0 <= stats["late_p50_us"] <= stats["late_p99_us"] <= stats["late_max_us"]
    assert json.loads(fetch(port, "/stats", method="GET").body) == {"tokens_timed": 0}  # read resets


def test_irregular_gaps(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], ttft_ms=5, token_gaps_ms=[2, 30, 8])
    offsets = [(tok["t_ns"] - r.t_send) / 1e6 for tok in r.tokens()]
    assert len(offsets) == 4
    for got, want in zip(offsets, [5, 7, 37, 45]):
        assert want - 0.06 <= got <= want + 15  # never early; late only by the machine's scheduling delays


@pytest.mark.parametrize("chat", [False, True])
def test_non_streaming(server: tuple[subprocess.Popen[str], int], chat: bool) -> None:
    _, port = server
    body = {"model": "m", "max_tokens": 3, "ttft_ms": 10, "itl_ms": 10}
    body.update({"messages": [{"role": "user", "content": "a b"}]} if chat else {"prompt": "a b"})
    r = fetch(port, "/v1/chat/completions" if chat else "/v1/completions", body)
    out = json.loads(r.body)
    choice = out["choices"][0]
    assert (choice["message"]["content"] if chat else choice["text"]) == " tok0 tok1 tok2"
    assert choice["finish_reason"] == "length" and out["usage"]["total_tokens"] == 5
    assert out["t_ns"] - r.t_send >= 30e6 - 60_000
    assert float(r.headers["server-timing"].rsplit("=", 1)[1]) >= 29.9


def test_fault_malformed_second_event(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], model="fault-malformed", max_tokens=4)
    events = r.events()
    assert events[1] == "{not json" and len(r.tokens()) == 3 and events[-1] == "[DONE]" and r.terminated


def test_fault_truncate_after_two_tokens(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], model="fault-truncate", max_tokens=6)
    assert len(r.tokens()) == 2 and len(r.chunks) == 2 and not r.terminated


def test_fault_no_done(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], model="fault-no-done", max_tokens=3, stream_options={"include_usage": True})
    assert len(r.tokens()) == 3 and "[DONE]" not in r.events() and r.terminated


def test_fault_error_event(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], model="fault-error-event", max_tokens=6)
    events = r.events()
    assert len(r.tokens()) == 1 and r.terminated
    assert events[1:] == [{"error": {"message": "boom <script>", "type": "server_error"}}, "[DONE]"]


def test_fault_500(server: tuple[subprocess.Popen[str], int]) -> None:
    r = completion(server[1], model="fault-500")
    assert r.status == 500 and json.loads(r.body)["error"]["type"] == "server_error"


def test_limits(server: tuple[subprocess.Popen[str], int]) -> None:
    _, port = server
    assert fetch(port, "/v1/completions", raw=b" " * (MAX_BODY_BYTES + 1)).status == 413
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # chunked, no Content-Length
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        part = b" " * 65536
        for _ in range(MAX_BODY_BYTES // len(part) + 1):
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 413 ")
    assert fetch(port, "/health", method="GET", extra=f"X-Big: {'a' * 40_000}\r\n").status == 431
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # headers that never end
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n")
        for i in range(5):
            sock.sendall(b"X-%d: %s\r\n" % (i, b"a" * 10_000))
            time.sleep(0.01)
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 431 ")


def test_sigterm_stops_the_server_mid_stream() -> None:
    proc, port = start("--itl-ms", "100", "--tokens", "100")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 15\r\n\r\n{"stream":true}')
            assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200 OK")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(5) == 0
            rest = b""
            while chunk := sock.recv(1 << 16):  # the stream's connection is closed, unfinished
                rest += chunk
            assert not rest.endswith(b"0\r\n\r\n")
    finally:
        proc.kill()
        proc.wait(5)


def test_disconnect_cancels_the_streams_timer() -> None:
    """In process, to look inside: a client that leaves mid-stream leaves no live deadline behind."""
    import uvloop

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ticker, conns = Ticker(loop), set()
        server = await loop.create_server(lambda: StreamProtocol(Timing(1, 5, 1000), conns, ticker), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
        writer.write(b'POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 15\r\n\r\n{"stream":true}')
        while b"tok1" not in await reader.read(1 << 16):
            pass
        assert [e for e in ticker.heap if e[2] is not None]  # the stream's next token is pending
        writer.close()
        await asyncio.sleep(0.05)
        assert not conns and all(e[2] is None for e in ticker.heap)
        server.close()
        ticker.close()

    uvloop.run(scenario())
