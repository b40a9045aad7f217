"""The HTTP/1.1 client against a real aiohttp server: what goes on the wire and how responses end."""

from __future__ import annotations

import asyncio
import time
import uuid

from aiohttp import web

from latscope.protocols import make_client
from latscope.records import Request
from latscope.request_ids import request_row, request_run
from latscope.scenario import scenario_from_dict

from conftest import serve


def _echo_app(seen: list[dict]) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append({"method": request.method, "path": request.path_qs, "headers": dict(request.headers),
                     "body": body, "peer": request.transport.get_extra_info("peername")})
        if request.path == "/chunked":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for _ in range(3):
                await response.write(b"x" * 1000)
            await response.write_eof()
            return response
        if request.path == "/hang":  # past any client timeout here (0.3 s + a 10 ms sweep), and short:
            await asyncio.sleep(1.5)  # the server's cleanup waits for this handler
        if request.path == "/close":
            return web.Response(text="bye", headers={"Connection": "close"})
        return web.Response(body=b"0123456789")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _send_all(url: str, classes: list[dict], order: list[int], **target) -> list:
    scenario = scenario_from_dict({
        "target": {"url": url, "timeout": 5, **target},
        "workload": {"classes": classes},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
    })

    async def main() -> list:
        client = make_client(scenario)
        await client.open()
        try:
            return [await client.send(Request(i, time.perf_counter_ns(), cls, False)) for i, cls in enumerate(order)]
        finally:
            await client.close()

    return asyncio.run(main())


def test_requests_go_out_as_prepared_and_reuse_one_connection():
    seen: list[dict] = []
    with serve(_echo_app(seen)) as url:
        classes = [{"name": "json", "method": "POST", "path": "/infer?v=2", "body": {"a": [1, 2]},
                    "headers": {"X-Class": "json"}}]
        outcomes = _send_all(url, classes, [0] * 20, headers={"Authorization": "Bearer t"})
    assert [o.status for o in outcomes] == [200] * 20 and all(o.error is None for o in outcomes)
    assert {o.bytes_in for o in outcomes} == {10} and {o.bytes_out for o in outcomes} == {len(b'{"a":[1,2]}')}
    assert all(o.sent_ns < o.end_ns for o in outcomes)
    first = seen[0]
    assert (first["method"], first["path"], first["body"]) == ("POST", "/infer?v=2", b'{"a":[1,2]}')
    assert first["headers"]["Host"] == url.removeprefix("http://")
    assert first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["Authorization"] == "Bearer t" and first["headers"]["X-Class"] == "json"
    assert len({s["peer"] for s in seen}) == 1, "sequential requests must share one keep-alive connection"


def test_chunked_head_and_connection_close_responses_end_where_they_should():
    seen: list[dict] = []
    with serve(_echo_app(seen)) as url:
        classes = [{"name": "chunked", "path": "/chunked"}, {"name": "head", "method": "HEAD", "path": "/"},
                   {"name": "close", "path": "/close"}, {"name": "plain", "path": "/"}]
        outcomes = _send_all(url, classes, [0, 1, 3, 2, 3, 1, 0])
    assert [o.status for o in outcomes] == [200] * 7, [o.reason for o in outcomes]
    assert [o.bytes_in for o in outcomes] == [3000, 0, 10, 3, 10, 0, 3000]
    peers = [s["peer"] for s in seen]
    # Chunked and HEAD responses leave the connection usable; "Connection: close" does not.
    assert peers[0] == peers[1] == peers[2] == peers[3] != peers[4] == peers[5] == peers[6]


def test_each_request_carries_its_seq_in_the_request_id_header_whatever_the_protocol():
    """target.request_id_header: every request says its position in the plan, so that server logs and
    packet captures can be matched to latscope's records (benchmarks/wire_truth.py does)."""
    seen: list[dict] = []
    with serve(_echo_app(seen)) as url:
        classes = [{"name": "plain", "path": "/", "headers": {"X-Class": "plain"}},
                   {"name": "chat", "protocol": "openai", "model": "m", "prompt_tokens": 3, "headers": {"X-Class": "chat"}},
                   {"name": "tensor", "protocol": "kserve-v2", "model": "m", "headers": {"X-Class": "tensor"},
                    "tensors": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}]}]
        _send_all(url, classes, [0, 1, 2, 0, 1, 2], request_id_header="X-Request-Id")
        _send_all(url, classes[:1], [0])
    headers = [{name.lower(): value for name, value in s["headers"].items()} for s in seen]  # aiohttp spells it X-Request-ID
    # a UUID (servers such as llama.cpp's accept nothing else there) that says the request's row
    assert [(h["x-class"], request_row(h["x-request-id"])) for h in headers[:6]] == [
        ("plain", 0), ("chat", 1), ("tensor", 2), ("plain", 3), ("chat", 4), ("tensor", 5)]
    ids = [uuid.UUID(h["x-request-id"]) for h in headers[:6]]
    assert {i.version for i in ids} == {4} and {i.variant for i in ids} == {uuid.RFC_4122}
    assert len({request_run(str(i)) for i in ids}) == 1  # one run, one prefix
    assert "x-request-id" not in headers[6]  # none unless asked for


def test_a_request_past_the_timeout_fails_within_one_sweep_of_it():
    """Timeouts come from the pool's sweep (every TIMEOUT_SWEEP_S), not a timer per request: a server
    that never answers fails the request as a timeout between target.timeout and one sweep later
    (+ scheduling), and the next request on a fresh connection is answered."""
    from latscope.protocols.http import TIMEOUT_SWEEP_S

    with serve(_echo_app([])) as url:
        hung, ok = _send_all(url, [{"name": "hang", "path": "/hang"}, {"name": "ok", "path": "/"}], [0, 1], timeout=0.3)
    assert (hung.error, hung.reason) == ("timeout", "no complete response within target.timeout")
    assert 0.3e9 <= hung.end_ns - hung.sent_ns < (0.3 + TIMEOUT_SWEEP_S + 0.02) * 1e9
    assert ok.error is None and ok.status == 200
