"""The OpenAI-compatible client against real servers on loopback: latscope's stream target (token write
times known to the nanosecond), an aiohttp server scripting awkward SSE byte by byte, and the reference
server. Token times, the request on the wire, every way a stream can fail, and whole runs."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import urllib.request
import time
from pathlib import Path
from typing import Iterator

import pytest
import uvloop
from aiohttp import web

from events_server import v1_app
from latscope.protocols import make_client
from latscope.protocols import openai as openai_protocol
from latscope.protocols.sse import SseParser
from latscope.records import Outcome, Request
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

from conftest import serve, stream_target_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402

MS = 1_000_000
ITL_TOLERANCE_MS = 1.0  # what the client promises: every gap within 1 ms of the server's

cache, logs = refserver.cache, refserver.logs


# --- helpers ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stream_target() -> Iterator[str]:
    """`python -m latscope.targets.stream` as a process: ttft 40 ms, itl 15 ms, 10 tokens by default."""
    with stream_target_process(ttft_ms=40, itl_ms=15, tokens=10) as url:
        yield url


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _scenario(url: str, classes: list[dict], tmp_path: Path | None = None, phases: list[dict] | None = None,
              **target) -> object:
    data = {
        "name": "openai",
        "seed": 3,
        "target": {"url": url, "protocol": "openai", "model": "m", "timeout": 5, **target},
        "workload": {"classes": classes},
        "phases": phases or [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
    }
    if tmp_path is not None:
        data["output"] = {"dir": str(tmp_path / "results")}
    return scenario_from_dict(data)


def _send(scenario, order: list[int], prompt_tokens: int = 5, output_tokens: int = 10) -> list[Outcome]:
    """Send requests of the classes in `order` one after the other on one client (uvloop, as workers do)."""

    async def main() -> list[Outcome]:
        client = make_client(scenario)
        await client.open()
        try:
            return [await client.send(Request(i, time.perf_counter_ns(), cls, False, prompt_tokens, output_tokens, i))
                    for i, cls in enumerate(order)]
        finally:
            await client.close()

    return uvloop.run(main())


def _gaps_ms(times: list[int]) -> list[float]:
    return [(b - a) / MS for a, b in zip(times, times[1:])]


@pytest.fixture
def server_t_ns(monkeypatch) -> list[int]:
    """The `t_ns` (server write times) of the stream target's token events, as the client parses them."""
    seen: list[int] = []
    parse = openai_protocol.parse_json

    def spy(data: bytes):
        value = parse(data)
        if isinstance(value, dict) and "t_ns" in value:
            seen.append(value["t_ns"])
        return value

    monkeypatch.setattr(openai_protocol, "parse_json", spy)
    return seen


# --- the SSE parser on its own ---------------------------------------------------------------------------

def test_sse_parser_gives_the_same_events_however_the_bytes_are_split():
    stream = (b": comment\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: error\ndata: x\ndata: y\n\n\n\ndata:z\rdata: w\r\r"
              b"id: 3\nretry: 5\n\ndata\n\nevent: ping\n\ndata: [DONE]\n\n")
    expected = [(b"", b'{"a":1}'), (b"error", b"x\ny"), (b"", b"z\nw"), (b"", b"[DONE]")]
    rng = random.Random(5)
    for _ in range(500):
        parser, events, i = SseParser(), [], 0
        while i < len(stream):
            j = i + rng.randint(1, 9)
            events += parser.feed(stream[i:j])
            i = j
        assert events + parser.finish() == expected
    # An unterminated last event is kept by finish(), not by feed().
    parser = SseParser()
    assert parser.feed(b"data: a\n\ndata: b") == [(b"", b"a")] and parser.finish() == [(b"", b"b")]


# --- token timing against the stream target --------------------------------------------------------------

def _within(tries: int, attempt) -> None:
    """Run `attempt` (returns None when its timing checks pass, else what was off) up to `tries` times.
    The box running the tests is shared (2 cores, other test runs beside this one): a neighbour can keep
    the client or the server off the CPU for a few ms and delay one read, which says nothing about the
    client. A client that stamped tokens wrongly (at parse time of the whole body, at the end, ...) is off
    on every attempt and still fails."""
    misses = []
    for _ in range(tries):
        miss = attempt()
        if miss is None:
            return
        misses.append(miss)
    pytest.fail("timing off on every attempt:\n" + "\n".join(misses))


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_token_times_follow_the_servers_writes(stream_target, server_t_ns, api):
    """TTFT 40 ms then 9 gaps of 15 ms. Each client stamp is the read time of its chunk, so it must trail the
    server's own write time (`t_ns`, same clock) by no more than the loopback delivery (< 1 ms), and every
    ITL must be 15 ms within 1 ms. The TTFT bound: the target starts its 40 ms when it has read the request,
    so TTFT = 40 ms + (send -> server read) + (write -> client read) <= 40 + allowance + 1 ms, where the
    allowance is the slowest of 5 measured zero-delay round trips on the same warm connection (it covers
    the client's encode, the write, the server's read and parse, and the answer back)."""
    classes = [{"name": "s", "openai": {"api": api, "stream": True, "extra_body": {"ttft_ms": 40, "itl_ms": 15}}},
               {"name": "rtt", "openai": {"api": api, "stream": False, "extra_body": {"ttft_ms": 0, "itl_ms": 0}}}]
    scenario = _scenario(stream_target, classes)

    def attempt() -> str | None:
        server_t_ns.clear()
        outcomes = _send(scenario, [1] * 6 + [0])  # warm the connection, 5 round trips, then the stream
        rtts, outcome = outcomes[1:6], outcomes[6]
        assert all(o.error is None and o.status == 200 and o.token_ns is None for o in rtts)
        assert outcome.error is None and outcome.status == 200, outcome.reason
        assert len(outcome.token_ns) == 10 and len(server_t_ns) == 10
        assert outcome.sent_ns < outcome.token_ns[0] and outcome.token_ns[-1] <= outcome.end_ns
        # The usage chunk was asked for and counted: 10 tokens, 5 prompt words.
        assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.prompt_tokens) == (10, True, 5)
        assert outcome.encode_ns > 0 and outcome.decode_ns > 0 and outcome.bytes_out > 0 and outcome.bytes_in > 1000
        assert outcome.server_timing is not None and "compute" in outcome.server_timing
        assert outcome.replica and outcome.replica.startswith("stream-")
        allowance_ms = max((o.end_ns - o.sent_ns) / MS for o in rtts)
        delivery_ms = [(c - t) / MS for c, t in zip(outcome.token_ns, server_t_ns)]
        gaps, server_gaps = _gaps_ms(outcome.token_ns), _gaps_ms(server_t_ns)
        ttft_ms = (outcome.token_ns[0] - outcome.sent_ns) / MS
        assert min(delivery_ms) >= 0, delivery_ms  # a token stamped before the server wrote it: impossible
        if (max(delivery_ms) >= ITL_TOLERANCE_MS or allowance_ms >= 5
                or any(abs(g - t) > ITL_TOLERANCE_MS or abs(g - 15) > ITL_TOLERANCE_MS for g, t in zip(gaps, server_gaps))
                or not 40 - 0.1 <= ttft_ms <= 40 + ITL_TOLERANCE_MS + allowance_ms):
            return f"ttft {ttft_ms:.3f} (allowance {allowance_ms:.3f}), delivery {delivery_ms}, gaps {gaps}"
        return None

    _within(3, attempt)


def test_irregular_gaps_and_counted_chunks(stream_target, server_t_ns):
    """token_gaps_ms reproduced gap by gap; without include_usage the token chunks are counted."""
    gaps = [5, 30, 2, 12, 20, 1, 8]
    classes = [{"name": "g", "openai": {"api": "completions", "stream": True, "include_usage": False,
                                        "extra_body": {"ttft_ms": 10, "token_gaps_ms": gaps}}}]
    scenario = _scenario(stream_target, classes)

    def attempt() -> str | None:
        server_t_ns.clear()
        warm, outcome = _send(scenario, [0, 0], output_tokens=len(gaps) + 1)
        assert warm.error is None and outcome.error is None, outcome.reason
        assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.prompt_tokens) == (len(gaps) + 1, False, 0)
        measured, server = _gaps_ms(outcome.token_ns), _gaps_ms(server_t_ns[len(gaps) + 1:])
        assert len(measured) == len(server) == len(gaps)
        if any(abs(m - g) > ITL_TOLERANCE_MS or abs(m - t) > ITL_TOLERANCE_MS for m, g, t in zip(measured, gaps, server)):
            return f"gaps {measured}, server's {server}"
        return None

    _within(3, attempt)


# --- the request on the wire and awkward SSE, from a scripted aiohttp server -----------------------------

def _token(text: str, field: str = "content") -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {field: text}}]}).encode() + b"\n\n"


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _script_app(seen: list[dict], marks: dict[str, int]) -> web.Application:
    """Answers by `model`: each script is the body pieces of one answer, written 5 ms apart."""
    scripts: dict[str, list[bytes]] = {
        "split": [ROLE, b'data: {"choices":[{"index":0,"delta":{"con', b'tent":"Hel"}}]}\r',
                  b'\n\r\n: keep-alive\r\n\r\n' + _token("think", "reasoning_content").replace(b"\n", b"\r\n"),
                  b'data: {"choices":[{"index":0,"delta":\ndata: {"content":"lo"}}]}\n\n',
                  b'event: ping\ndata: {"choices":[],"usage":null}\n\n',
                  b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n' + DONE],
        "error-event": [_token("a"), b'event: error\ndata: {"message":"' + b"overloaded " * 40 + b'"}\n\n'],
    }

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        doc = json.loads(body)
        seen.append({"path": request.path, "headers": dict(request.headers), "body": doc})
        model = doc["model"]
        if model == "http-400":
            return web.json_response({"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}},
                                     status=400)
        if model == "json-200":
            return web.json_response({"choices": [{"text": "x"}]})
        if not doc.get("stream"):
            if model == "not-json":
                return web.Response(text="<html>oops</html>", content_type="text/html")
            if model == "no-choices":
                return web.json_response({"object": "text_completion"})
            return web.json_response({"choices": [{"index": 0, "text": "a b c"}],
                                      "usage": {"prompt_tokens": 4, "completion_tokens": 3}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Replica-Id": "script-1",
                                               "Server-Timing": "queue;dur=1.5, prefill;dur=2"})
        await response.prepare(request)
        for i, piece in enumerate(scripts[model]):
            await asyncio.sleep(0.005)
            marks[f"{model}{i}"] = time.perf_counter_ns()
            await response.write(piece)
        await response.write_eof()
        return response

    return v1_app(handle)


def test_request_bodies_and_awkward_sse():
    seen: list[dict] = []
    marks: dict[str, int] = {}
    with serve(_script_app(seen, marks)) as url:
        classes = [{"name": "split", "model": "split"},
                   {"name": "whole", "model": "whole", "openai": {"api": "completions", "stream": False,
                                                                  "extra_body": {"temperature": 0}}}]
        split, whole = _send(_scenario(url, classes, api_key="sk-test",
                                       openai={"api": "chat", "extra_body": {"ignore_eos": True}}), [0, 1],
                             prompt_tokens=6, output_tokens=12)
    chat, completions = seen
    assert chat["path"] == "/v1/chat/completions" and completions["path"] == "/v1/completions"
    assert chat["headers"]["Authorization"] == "Bearer sk-test"
    assert chat["headers"]["Content-Type"] == "application/json"
    (message,) = chat["body"].pop("messages")
    assert message["role"] == "user" and len(message["content"].split()) == 6
    assert chat["body"] == {"model": "split", "max_tokens": 12, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert len(completions["body"].pop("prompt").split()) == 6
    assert completions["body"] == {"model": "whole", "max_tokens": 12, "stream": False, "temperature": 0}

    # The split stream: the role chunk is no token; the first token is stamped by the read that completed
    # its event (the 4th piece, after a \r\n cut in two); the reasoning token came in the same read; the
    # third token's data spans two data: lines; the usage chunk's counts win over the 3 chunks counted.
    assert split.error is None, split.reason
    assert len(split.token_ns) == 3
    assert split.token_ns[0] == split.token_ns[1] >= marks["split3"] > marks["split2"]
    assert split.token_ns[2] >= marks["split4"] > split.token_ns[1]
    assert split.reasoning_chunks == 1 and split.content_ns == split.token_ns[0]  # "Hel" is content; "think" reasoning
    assert (split.output_tokens, split.tokens_from_usage, split.prompt_tokens) == (3, True, 7)
    assert split.server_timing == {"queue": 1.5, "prefill": 2.0} and split.replica == "script-1"
    assert split.decode_ns > 0 and split.encode_ns > 0
    assert whole.error is None and whole.token_ns is None, whole.reason
    assert (whole.output_tokens, whole.tokens_from_usage, whole.prompt_tokens) == (3, True, 4)
    assert whole.decode_ns > 0


@pytest.mark.parametrize("model, stream, kind, words", [
    ("error-event", True, "protocol", "error event after 1 token: overloaded overloaded"),
    ("json-200", True, "protocol", "Content-Type application/json"),
    ("http-400", True, "http_4xx", "HTTP 400 Bad Request: max_tokens is too large"),
    ("http-400", False, "http_4xx", "HTTP 400 Bad Request: max_tokens is too large"),
    ("not-json", False, "protocol", "not a JSON object: <html>oops</html>"),
    ("no-choices", False, "protocol", "no choices"),
])
def test_bad_answers_are_errors_that_say_why(model, stream, kind, words):
    with serve(_script_app([], {})) as url:
        (outcome,) = _send(_scenario(url, [{"name": "c", "model": model}], openai={"stream": stream}), [0])
    assert outcome.error == kind and words in outcome.reason, outcome.reason
    assert len(outcome.reason) < 300  # a server's message is cut to ~200 characters


# --- whole runs against the stream target ----------------------------------------------------------------

def _options(api: str, **extra) -> dict:
    return {"api": api, "stream": True, "extra_body": {"ttft_ms": 40, "itl_ms": 15, **extra}}


def test_run_records_ttft_itl_tpot_and_tokens(stream_target, tmp_path):
    """A whole run, one worker: ttft / itl / tpot per class and "all", the ITL within 1 ms of the 15 ms the
    target keeps (p50 per class, p99 over all 760 gaps) and the token totals with where their counts came
    from. The worker reports every second meanwhile (default `output.interval`): that report must not
    stall the event loop, or every token that arrives during it would be read late."""
    classes = [{"name": "chat", "openai": _options("chat"), "prompt_tokens": 5, "output_tokens": 20},
               {"name": "comp", "openai": _options("completions"), "prompt_tokens": 8, "output_tokens": 20},
               {"name": "counted", "openai": {**_options("completions"), "include_usage": False},
                "prompt_tokens": 3, "output_tokens": 20}]
    phases = [{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 20}}]
    scenario = _scenario(stream_target, classes, tmp_path, phases)

    def attempt() -> str | None:
        _get_json(f"{stream_target}/stats")  # the server's own lateness from here on
        s = run_scenario(scenario, workers=1).summary
        # A token the server's timer sent late lengthens its gap by that lateness, so the client is
        # judged on the gaps less the server's own lateness (its p99 bounds the p99 of the excess).
        server_late_ms = _get_json(f"{stream_target}/stats").get("late_p99_us", 0) / 1000
        assert s["requests"]["completed"] == s["requests"]["sent"] == 40, s["error_examples"]
        done = {name: s["requests_by_class"][name]["completed"] for name in ("chat", "comp", "counted")}
        assert all(done.values())
        metrics, misses = s["metrics"], []
        for name in ("all", "chat", "comp", "counted"):
            count = sum(done.values()) if name == "all" else done[name]
            assert metrics["ttft"][name]["count"] == metrics["tpot"][name]["count"] == count
            assert metrics["itl"][name]["count"] == 19 * count
            assert metrics["encode"][name]["count"] == metrics["decode"][name]["count"] == count
            assert metrics["server.compute"][name]["count"] == count
            itl, tpot, ttft = metrics["itl"][name], metrics["tpot"][name], metrics["ttft"][name]
            if (abs(itl["p50_ms"] - 15) > ITL_TOLERANCE_MS or abs(tpot["p50_ms"] - 15) > ITL_TOLERANCE_MS
                    or (name == "all" and abs(itl["p99_ms"] - 15) > ITL_TOLERANCE_MS + server_late_ms)
                    or not 40 <= ttft["p50_ms"] < 45):
                misses.append(f"{name}: itl {itl}, tpot {tpot}, ttft {ttft}, server timer late p99 {server_late_ms} ms")
        tokens = s["tokens"]
        assert tokens["chat"] == {**tokens["chat"], "prompt_tokens": 5 * done["chat"],
                                  "output_tokens": 20 * done["chat"], "output_count_source": "usage"}
        assert tokens["comp"]["prompt_tokens"] == 8 * done["comp"] and tokens["comp"]["output_count_source"] == "usage"
        # No usage chunk: tokens counted from the chunks (the planned prompt length stands in for the
        # prompt count the server did not report).
        assert tokens["counted"]["output_tokens"] == 20 * done["counted"]
        assert tokens["counted"]["output_count_source"] == "chunks"
        assert tokens["all"]["output_tokens"] == 20 * sum(done.values())
        assert tokens["all"]["output_count_source"] == "mixed" and tokens["all"]["output_tokens_per_s"] > 0
        return "\n".join(misses) or None

    _within(2, attempt)


def test_run_reports_each_broken_stream_and_goes_on(stream_target, tmp_path):
    fast = {"ttft_ms": 5, "itl_ms": 5}
    faults = ["fault-malformed", "fault-truncate", "fault-no-done", "fault-error-event"]
    classes = [{"name": "ok", "openai": {"extra_body": fast}, "output_tokens": 4},
               *({"name": f, "model": f, "openai": {"extra_body": fast}, "output_tokens": 4} for f in faults),
               {"name": "fault-500", "model": "fault-500", "output_tokens": 4}]
    phases = [{"name": "p", "duration": 1.5, "arrival": {"type": "constant", "rate": 40}}]
    s = run_scenario(_scenario(stream_target, classes, tmp_path, phases), workers=1).summary
    by_class = s["requests_by_class"]
    assert s["requests"]["sent"] == 60 and all(by_class[c["name"]]["sent"] for c in classes)
    assert by_class["ok"]["completed"] == by_class["ok"]["sent"] and by_class["ok"]["errors"] == 0
    assert s["metrics"]["ttft"]["ok"]["count"] == by_class["ok"]["sent"]
    assert all(by_class[f]["errors"] == by_class[f]["sent"] for f in [*faults, "fault-500"])
    assert s["errors"]["protocol"] == sum(by_class[f]["sent"] for f in faults)
    assert s["errors"]["http_5xx"] == by_class["fault-500"]["sent"] and s["errors"]["connect"] == 0
    assert sorted(s["error_examples"]["protocol"]) == [
        "error event after 1 token: boom <script>",
        "malformed SSE event after 1 token (not JSON): {not json",
        "stream ended without data: [DONE] after 4 tokens",
        "stream truncated after 2 tokens: connection lost: closed by the server",
    ]
    assert s["error_examples"]["http_5xx"] == ["HTTP 500 Internal Server Error: injected fault"]


# --- the reference server --------------------------------------------------------------------------------

def test_reference_server_streams_and_whole_answers(cache, logs, tmp_path):
    classes = [{"name": "chat", "openai": {"api": "chat"}, "prompt_tokens": 12, "output_tokens": 8},
               {"name": "comp", "openai": {"api": "completions"}, "prompt_tokens": 20, "output_tokens": 6},
               {"name": "whole", "openai": {"api": "completions", "stream": False}, "prompt_tokens": 10,
                "output_tokens": 5}]
    phases = [{"name": "p", "duration": 1.5, "arrival": {"type": "constant", "rate": 12}}]
    with refserver.running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--layers", "2",
                                  "--decoder-layers", "2", "--cache-dir", str(cache)) as server:
        scenario = _scenario(server.url, classes, tmp_path, phases, model="decoder")
        direct = _send(scenario, [0, 1, 2], prompt_tokens=12, output_tokens=8)
        s = run_scenario(scenario, workers=1)
    summary = s.summary
    for outcome in direct:
        assert outcome.error is None and outcome.status == 200, outcome.reason
        assert outcome.output_tokens == 8 and outcome.tokens_from_usage
        assert outcome.replica and outcome.replica.startswith("r0-")
        assert {"queue", "prefill"} <= outcome.server_timing.keys()
    chat, comp, whole = direct
    assert len(chat.token_ns) == len(comp.token_ns) == 8 and whole.token_ns is None
    assert chat.prompt_tokens > comp.prompt_tokens == whole.prompt_tokens == 12  # chat adds "user:", "assistant:"

    assert summary["requests"]["completed"] == summary["requests"]["sent"] == 18, summary["error_examples"]
    done = {name: summary["requests_by_class"][name]["completed"] for name in ("chat", "comp", "whole")}
    metrics, tokens = summary["metrics"], summary["tokens"]
    for name in ("chat", "comp"):
        assert metrics["ttft"][name]["count"] == done[name] > 0
        assert metrics["itl"][name]["count"] > 0 and metrics["tpot"][name]["count"] == done[name]
    assert "whole" not in metrics["ttft"] and metrics["decode"]["whole"]["count"] == done["whole"]
    for name in ("chat", "comp", "whole"):
        assert metrics["server.queue"][name]["count"] == metrics["server.prefill"][name]["count"] == done[name]
        assert tokens[name]["output_count_source"] == "usage"
    assert tokens["chat"]["output_tokens"] == 8 * done["chat"]
    assert tokens["comp"]["output_tokens"] == 6 * done["comp"] and tokens["comp"]["prompt_tokens"] == 20 * done["comp"]
    assert tokens["whole"]["output_tokens"] == 5 * done["whole"] and tokens["whole"]["prompt_tokens"] == 10 * done["whole"]
    assert tokens["chat"]["prompt_tokens"] > 12 * done["chat"]
    events = (s.run_dir / "events.jsonl").read_text()
    assert "replica_first_seen" in events and '"r0-' in events


def test_an_event_with_python_style_nan_or_infinity_is_still_a_token():
    """The fast JSON parser refuses NaN/Infinity literals, which Python servers write (a logprob of
    -inf); the standard library reads them, so such a chunk is a token, not a malformed event."""
    from latscope.protocols.openai import _Stream

    stream = _Stream()
    stream(b'data: {"choices":[{"text":" hi","logprobs":{"token_logprobs":[-Infinity, NaN]}}]}\n\n', 5)
    stream(b"data: {not json\n\n", 6)
    assert stream.token_ns == [5]
    assert stream.error == "malformed SSE event after 1 token (not JSON): {not json"
