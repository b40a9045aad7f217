"""A loopback aiohttp server speaking OpenAI's Responses API (POST /v1/responses) and Anthropic's Messages
API (POST /v1/messages), for the typed-event clients' tests. It records every request (path, headers by
lower-case name, body) and, for each token event it streams, the `time.perf_counter_ns()` taken just
before that event's write (the same clock the client stamps its reads with), so a test can hold each
client stamp against the server's own write time.

An answer is `reasoning` reasoning deltas (" think<i>") then `content` content deltas (" r<n>w<i>": text
no other answer has, so a session test can find each answer in a later turn's history), the first
`ttft_ms` after the request was read, then one every `gap_ms`; `max_output_tokens` / `max_tokens` caps
them all, reasoning first (both APIs count reasoning in it). Usage: prompt = the words of every text of
the input (instructions / system included), output = reasoning + content; Responses says the reasoning
tokens and 2 cached tokens; Messages splits the prompt as input_tokens + 1 cache_creation + 2 cache_read
(so the client's sum is the word count), and says the thinking tokens (output_tokens_details) only when
the body has `thinking`. Each token event also carries `"t_ns"`, its write time (as
latscope.targets.stream's do). The request's `model` picks a fault instead (FAULTS).

As a process (benchmarks/wire_truth.py runs it so, on a CPU of its own; the log is then not kept):

    python tests/protocols/events_server.py --port 0 --ttft-ms 20 --itl-ms 10 --tokens 32 --reasoning 0

prints `ready http://127.0.0.1:PORT` once listening and serves until it is terminated.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

# model -> what goes wrong instead of a plain answer (a broken event comes after the first content token)
FAULTS = {
    "bad-json": "an event whose data is not JSON", "not-object": "an event whose data is not a JSON object",
    "no-type": "an event with neither a `type` nor an `event:` line",
    "bad-delta": "a text delta that is not a string (Responses) / a content_block_delta without a delta object",
    "bad-end": "response.completed without a response (Responses) / a text_delta without text; whole: no output",
    "error": "an `error` event", "failed": "response.failed (Responses) / message_start without a message; whole: an error",
    "no-end": "the stream ends without its end event", "truncate": "the connection closes after 2 tokens",
    "empty": "an answer without a token", "json-200": "a whole JSON answer to a stream request",
    "no-usage": "an answer without usage",
    "http-400": "HTTP 400 with the API's error body",
}


def words(value: Any) -> int:
    """Prompt words of an input: a string, a list of messages (string content or text parts)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(words(v.get("content") if isinstance(v, dict) and "content" in v else
                         v.get("text") if isinstance(v, dict) else v) for v in value)
    return 0


def _sse(event: str, doc: dict) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), json.dumps(doc).encode())


class _Answer:
    """One streamed answer: writes events, stamping each token event's write."""

    def __init__(self, response: web.StreamResponse, entry: dict) -> None:
        self.response, self.entry = response, entry
        entry["writes"] = []  # (kind, perf_counter_ns before the write) of each token event

    async def write(self, data: bytes, kind: str | None = None) -> None:
        if kind is not None:
            t_ns = time.perf_counter_ns()
            self.entry["writes"].append((kind, t_ns))
            data = data.replace(b'"t_ns": -1', b'"t_ns": %d' % t_ns)  # the token event says when it was written
        await self.response.write(data)


def make_events_app(log: list[dict], *, ttft_ms: float = 20, gap_ms: float = 10, reasoning: int = 3,
                    content: int = 5) -> web.Application:
    state = {"n": 0}

    async def handle(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        raw = await request.read()
        body = json.loads(raw)
        n = state["n"] = state["n"] + 1
        headers = {k.lower(): v for k, v in request.headers.items()}
        entry = {"n": n, "path": request.path, "headers": headers, "body": body, "arrived_ns": arrived}
        log.append(entry)
        messages = request.path == "/v1/messages"
        model = body.get("model")
        if model == "http-400":
            error = ({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}
                     if messages else
                     {"error": {"message": "max_output_tokens: too large", "type": "invalid_request_error"}})
            return web.json_response(error, status=400)
        limit = body.get("max_tokens" if messages else "max_output_tokens")
        limit = limit if isinstance(limit, int) else reasoning + content
        thoughts = 0 if model == "empty" else min(reasoning, limit)
        count = 0 if model == "empty" else min(content, limit - thoughts)
        answer = [f" r{n}w{i}" for i in range(count)]
        entry["answer"] = "".join(answer)
        prompt = (words(body.get("messages")) + words(body.get("system"))) if messages else (
            words(body.get("input")) + words(body.get("instructions")))
        if not body.get("stream") or model == "json-200":
            await asyncio.sleep((ttft_ms + gap_ms * max(0, thoughts + count - 1)) / 1000)
            whole = _messages_whole if messages else _responses_whole
            return web.json_response(whole(model, n, answer, thoughts, prompt, body))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Replica-Id": "events-1"})
        await response.prepare(request)
        script = _messages_stream if messages else _responses_stream
        await script(_Answer(response, entry), model, n, answer, thoughts, prompt, ttft_ms, gap_ms)
        if model == "truncate":
            request.transport.close()
            return response
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_post("/v1/responses", handle)
    app.router.add_post("/v1/messages", handle)
    app.router.add_get("/health", health)
    return app


async def _tokens(out: _Answer, events: list[tuple[str, bytes]], ttft_ms: float, gap_ms: float, model: str,
                  broken: dict[str, bytes], thoughts: int) -> bool:
    """Token events at ttft, then one every gap_ms, each in a write of its own. A `model` of `broken`
    writes its broken event in place of every event after the first content token, `truncate` stops after
    2 tokens: True when the answer ends so (no end events to write)."""
    if model in broken:
        events[thoughts + 1:] = [("broken", broken[model])]
    if model == "truncate":
        events = events[:2]
    await asyncio.sleep(ttft_ms / 1000)
    for i, (kind, data) in enumerate(events):
        if i:
            await asyncio.sleep(gap_ms / 1000)
        await out.write(data, kind)
    return model in broken or model == "truncate"


# --- OpenAI Responses -------------------------------------------------------------------------------------

def _responses_usage(thoughts: int, answer: list[str], prompt: int) -> dict:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 2},
            "output_tokens": thoughts + len(answer), "output_tokens_details": {"reasoning_tokens": thoughts},
            "total_tokens": prompt + thoughts + len(answer)}


def _response(n: int, status: str, output: list, usage: dict | None, error: dict | None = None) -> dict:
    return {"id": f"resp_{n}", "object": "response", "created_at": 0, "status": status, "model": "m",
            "output": output, "usage": usage, "error": error, "incomplete_details": None}


def _reasoning_item(thoughts: int, done: bool) -> dict:
    text = "".join(f" think{i}" for i in range(thoughts))
    return {"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if done else []}


def _message_item(answer: list[str], done: bool) -> dict:
    return {"type": "message", "id": "msg_1", "status": "completed" if done else "in_progress", "role": "assistant",
            "content": [{"type": "output_text", "text": "".join(answer), "annotations": []}] if done else []}


async def _responses_stream(out: _Answer, model: str, n: int, answer: list[str], thoughts: int, prompt: int,
                            ttft_ms: float, gap_ms: float) -> None:
    """The events OpenAI sends, in its order: created, in_progress, each output item added (its parts
    added), its deltas, its parts and item done, completed (with the whole response and its usage)."""
    seq = iter(range(1_000_000))

    def ev(kind: str, **fields: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    await out.write(ev("response.created", response=_response(n, "in_progress", [], None))
                    + ev("response.in_progress", response=_response(n, "in_progress", [], None)))
    at = 1 if thoughts else 0  # the message's output index
    tokens = [("reasoning", (ev("response.output_item.added", output_index=0, item=_reasoning_item(0, False))
                             if i == 0 else b"")
               + ev("response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta=f" think{i}",
                    t_ns=-1))
              for i in range(thoughts)]
    tokens += [("content", (ev("response.output_item.added", output_index=at, item=_message_item([], False))
                            + ev("response.content_part.added", item_id="msg_1", output_index=at, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": []}) if i == 0 else b"")
                + ev("response.output_text.delta", item_id="msg_1", output_index=at, content_index=0, delta=word,
                     t_ns=-1))
               for i, word in enumerate(answer)]
    broken = {"bad-json": b"data: {not json\n\n", "not-object": b"data: [1, 2]\n\n",
              "no-type": b'data: {"delta": " x"}\n\n',
              "bad-delta": _sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": 5}),
              "bad-end": _sse("response.completed", {"type": "response.completed", "response": None}),
              "error": _sse("error", {"type": "error", "code": "server_error", "message": "The server had an error",
                                      "param": None, "sequence_number": 99}),
              "failed": _sse("response.failed", {"type": "response.failed", "response": _response(
                  n, "failed", [], None, {"code": "server_error", "message": "the model crashed"})})}
    if await _tokens(out, tokens, ttft_ms, gap_ms, model, broken, thoughts):
        return
    items, end = [], b""
    if thoughts:
        items.append(_reasoning_item(thoughts, True))
        end += ev("response.output_item.done", output_index=0, item=items[-1])
    items.append(_message_item(answer, True))
    if answer:
        text = "".join(answer)
        end += (ev("response.output_text.done", item_id="msg_1", output_index=at, content_index=0, text=text)
                + ev("response.content_part.done", item_id="msg_1", output_index=at, content_index=0,
                     part=items[-1]["content"][0])
                + ev("response.output_item.done", output_index=at, item=items[-1]))
    else:
        items.pop()
    if model != "no-end":
        usage = _responses_usage(thoughts, answer, prompt) if model != "no-usage" else None
        end += ev("response.completed", response=_response(n, "completed", items, usage))
    await out.write(end)


def _responses_whole(model: str, n: int, answer: list[str], thoughts: int, prompt: int, body: dict) -> dict:
    if model == "failed":
        return _response(n, "failed", [], None, {"code": "server_error", "message": "the model crashed"})
    if model == "bad-end":
        return {"id": f"resp_{n}", "object": "response", "status": "completed"}
    items = ([_reasoning_item(thoughts, True)] if thoughts else []) + ([_message_item(answer, True)] if answer else [])
    return _response(n, "completed", items, _responses_usage(thoughts, answer, prompt) if model != "no-usage" else None)


# --- Anthropic Messages -----------------------------------------------------------------------------------

def _messages_usage(prompt: int, output: int, thinking: int | None = None) -> dict:
    """The prompt split as Anthropic counts it; `output_tokens_details.thinking_tokens` when thinking is
    on (the body has `thinking`), as the API says it then."""
    details = {"output_tokens_details": {"thinking_tokens": thinking}} if thinking is not None else {}
    return {"input_tokens": prompt - 3, "cache_creation_input_tokens": 1, "cache_read_input_tokens": 2,
            "output_tokens": output, **details}


async def _messages_stream(out: _Answer, model: str, n: int, answer: list[str], thoughts: int, prompt: int,
                           ttft_ms: float, gap_ms: float) -> None:
    def ev(kind: str, **fields: Any) -> bytes:
        return _sse(kind, {"type": kind, **fields})

    thinking = thoughts if "thinking" in out.entry["body"] else None

    message = {"id": f"msg_{n}", "type": "message", "role": "assistant", "content": [], "model": "m",
               "stop_reason": None, "stop_sequence": None, "usage": _messages_usage(prompt, 1)}
    if model == "no-usage":
        del message["usage"]
    await out.write(ev("message_start", message=message) + ev("ping"))
    tokens = []
    if thoughts:
        tokens = [("reasoning", (ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})
                                 if i == 0 else b"")
                   + ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": f" think{i}"}, t_ns=-1))
                  for i in range(thoughts)]
    text = [("content", ev("content_block_delta", index=1, delta={"type": "text_delta", "text": word}, t_ns=-1))
            for word in answer]
    if text:  # the thinking block's end and the text block's start come with the first text
        head = (ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "c2ln"})
                 + ev("content_block_stop", index=0) if thoughts else b"")
        head += ev("content_block_start", index=1, content_block={"type": "text", "text": ""})
        text[0] = ("content", head + text[0][1])
    tokens += text
    broken = {"bad-json": b"event: content_block_delta\ndata: {not json\n\n",
              "not-object": b"event: content_block_delta\ndata: \"x\"\n\n",
              "no-type": b'data: {"index": 1, "delta": {"type": "text_delta", "text": " x"}}\n\n',
              "bad-delta": ev("content_block_delta", index=1, delta="oops"),
              "bad-end": ev("content_block_delta", index=1, delta={"type": "text_delta", "text": None}),
              "error": ev("error", error={"type": "overloaded_error", "message": "Overloaded"}),
              "failed": ev("message_start", message=None)}
    if await _tokens(out, tokens, ttft_ms, gap_ms, model, broken, thoughts):
        return
    usage = {k: v for k, v in _messages_usage(prompt, thoughts + len(answer), thinking).items() if "input" not in k}
    end = (ev("content_block_stop", index=1) if text else b"") + ev(
        "message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None},
        **({"usage": usage} if model != "no-usage" else {}))
    if model != "no-end":
        end += ev("message_stop")
    await out.write(end)


def _messages_whole(model: str, n: int, answer: list[str], thoughts: int, prompt: int, body: dict) -> dict:
    if model == "failed":
        return {"type": "error", "error": {"type": "api_error", "message": "the model crashed"}}
    if model == "bad-end":
        return {"id": f"msg_{n}", "type": "message", "role": "assistant"}
    content = ([{"type": "thinking", "thinking": "".join(f" think{i}" for i in range(thoughts)), "signature": "c2ln"}]
               if thoughts else []) + [{"type": "text", "text": "".join(answer)}]
    usage = {"usage": _messages_usage(prompt, thoughts + len(answer), thoughts if "thinking" in body else None)}
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "content": content, "model": "m",
            "stop_reason": "max_tokens", "stop_sequence": None, **(usage if model != "no-usage" else {})}


# --- what both clients' tests share (send, request, v1_app, batch_scenario: the other protocols' too) ---
# (latscope is imported inside: the server, run as a process by benchmarks/wire_truth.py, needs aiohttp alone)

MS = 1_000_000
OPTIONS = {"openai-responses": "openai", "anthropic-messages": "anthropic"}  # a class's options of each protocol
PHASE = {"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}
DELIVERY_MS = 1.0  # the promise: each token stamped within 1 ms of the server's write (loopback delivery)


def scenario(url: str, protocol: str, classes: list[dict], workload: dict | None = None, **target: Any) -> Any:
    from latscope.scenario import scenario_from_dict

    return scenario_from_dict({
        "name": protocol, "seed": 3,
        "target": {"url": url, "protocol": protocol, "model": "m", "timeout": 5, **target},
        "workload": {"classes": classes, **(workload or {})},
        "phases": [PHASE],
    })


def batch_scenario(name: str, seed: int, target: dict, classes: list[dict], tmp_path: Any = None,
                   phases: list[dict] | None = None) -> Any:
    """The embeddings and rerank tests' scenario: no prompt salt, `phases` (PHASE alone unless given), its
    results under tmp_path/results when tmp_path is given."""
    from latscope.scenario import scenario_from_dict

    data = {"name": name, "seed": seed, "prompt_salt": "none", "target": target, "workload": {"classes": classes},
            "phases": phases or [PHASE]}
    if tmp_path is not None:
        data["output"] = {"dir": str(tmp_path / "results")}
    return scenario_from_dict(data)


def send(scn: Any, requests: list[Any]) -> list[Any]:
    """Send `requests` (latscope Requests) one after the other on one client, on uvloop as workers do."""
    import uvloop

    from latscope.protocols import make_client

    async def main() -> list[Any]:
        client = make_client(scn)
        await client.open()
        try:
            return [await client.send(r) for r in requests]
        finally:
            await client.close()

    return uvloop.run(main())


def request(seq: int, cls: int = 0, prompt_tokens: int = 6, output_tokens: int = 5, item: int | None = None,
            **fields: Any) -> Any:
    """A latscope Request planned now, of pool item `item` (its seq unless given)."""
    from latscope.records import Request

    return Request(seq, time.perf_counter_ns(), cls, False, prompt_tokens, output_tokens,
                   seq if item is None else item, **fields)


def v1_app(handle: Any) -> web.Application:
    """An app that answers every POST under /v1/ with `handle`."""
    app = web.Application()
    app.router.add_post("/v1/{tail:.*}", handle)
    return app


def requests_seen(protocol: str, classes: list[dict], requests: list[Any], **target: Any) -> list[dict]:
    """What a fresh events server (answers 1 ms after the request and 1 ms apart) logged of `requests`
    sent as `classes` (the scenario's target `target` besides)."""
    from conftest import serve

    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1)) as url:
        send(scenario(url, protocol, classes, **target), requests)
    return log


def one_answer(protocol: str, cls: dict, req: Any, log: list[dict] | None = None, **app: Any) -> Any:
    """The outcome of `req` sent as the one class `cls` to a fresh events server (make_events_app's `app`
    options; answers 1 ms after the request and 1 ms apart unless they say otherwise)."""
    from conftest import serve

    with serve(make_events_app([] if log is None else log, **{"ttft_ms": 1, "gap_ms": 1, **app})) as url:
        (outcome,) = send(scenario(url, protocol, [cls]), [req])
    return outcome


def check_stamped_stream(protocol: str, options: dict | None = None) -> None:
    """3 reasoning deltas then 5 content deltas, the first 20 ms after the request, then one every 10 ms,
    asked for as 6 prompt and 8 output tokens (the class's API `options` besides): each token stamped at
    the server's write (timing_miss, within 3 tries), one event per read, the usage's counts (the output's
    8 with its 3 reasoning tokens, the prompt's 6 words with the server's 2 cached) and the replica."""
    from conftest import serve

    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=20, gap_ms=10, reasoning=3, content=5)) as url:
        cls = {"name": "s", "prompt_tokens": 6, "output_tokens": 8, **({OPTIONS[protocol]: options} if options else {})}
        scn = scenario(url, protocol, [cls])

        def attempt() -> str | None:
            log.clear()
            (outcome,) = send(scn, [request(0, 0, 6, 8)])
            assert outcome.error is None and outcome.status == 200, outcome.reason
            writes = log[0]["writes"]
            assert [kind for kind, _ in writes] == ["reasoning"] * 3 + ["content"] * 5
            assert outcome.reasoning_chunks == 3 and outcome.content_ns == outcome.token_ns[3]
            assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.reasoning_tokens) == (8, True, 3)
            assert (outcome.prompt_tokens, outcome.prompt_from_usage, outcome.cached_tokens) == (6, True, 2)
            assert outcome.replica == "events-1" and outcome.decode_ns > 0 and outcome.encode_ns > 0
            assert outcome.sent_ns < outcome.token_ns[0] and outcome.token_ns[-1] <= outcome.end_ns
            gaps = [(b - a) / MS for a, b in zip(outcome.token_ns, outcome.token_ns[1:])]
            assert all(g > 5 for g in gaps), gaps  # one event per read: no two stamped together
            return timing_miss(outcome, writes)

        within(3, attempt)


R, M = "openai-responses", "anthropic-messages"
# The broken answers (a fault of FAULTS, streamed or not): the error kind, and what each client's reason says.
BROKEN = [
    ("bad-json", True, "protocol", {R: "malformed SSE event after 4 tokens (not JSON): {not json",
                                    M: "malformed SSE event after 4 tokens (not JSON): {not json"}),
    ("not-object", True, "protocol", {R: "malformed SSE event after 4 tokens (not a JSON object): [1, 2]",
                                      M: 'malformed SSE event after 4 tokens (not a JSON object): "x"'}),
    ("no-type", True, "protocol", {R: 'malformed SSE event after 4 tokens (no event type): {"delta": " x"}',
                                   M: "malformed SSE event after 4 tokens (no event type)"}),
    ("bad-delta", True, "protocol", {R: "malformed SSE event after 4 tokens (response.output_text.delta without a text delta)",
                                     M: "malformed SSE event after 4 tokens (content_block_delta without a delta object)"}),
    ("bad-end", True, "protocol", {R: "malformed SSE event after 4 tokens (response.completed without a response object)",
                                   M: "malformed SSE event after 4 tokens (text_delta without a string text)"}),
    ("error", True, "protocol", {R: "error event after 4 tokens: The server had an error",
                                 M: "error event after 4 tokens: Overloaded"}),
    ("failed", True, "protocol", {R: "response failed after 4 tokens: the model crashed",
                                  M: "malformed SSE event after 4 tokens (message_start without a message)"}),
    ("no-end", True, "protocol", {R: "stream ended without response.completed after 8 tokens",
                                  M: "stream ended without message_stop after 8 tokens"}),
    ("truncate", True, "protocol", {R: "stream truncated after 2 tokens: connection lost",
                                    M: "stream truncated after 2 tokens: connection lost"}),
    ("json-200", True, "protocol", {R: "stream asked for, got Content-Type application/json",
                                    M: "stream asked for, got Content-Type application/json"}),
    ("http-400", True, "http_4xx", {R: "HTTP 400 Bad Request: max_output_tokens: too large",
                                    M: "HTTP 400 Bad Request: max_tokens: too large"}),
    ("http-400", False, "http_4xx", {R: "HTTP 400 Bad Request: max_output_tokens: too large",
                                     M: "HTTP 400 Bad Request: max_tokens: too large"}),
    ("failed", False, "protocol", {R: "response failed: the model crashed",
                                   M: "error in the response: the model crashed"}),
    ("bad-end", False, "protocol", {R: "response has no output list",
                                    M: "response has no content list"}),
]


class AnswersAlike:
    """The tests both typed-event clients pass alike, for a test module's subclass (TestAnswersAlike) that
    names its PROTOCOL. (pytest parametrizes them here: this module imports no pytest.)"""

    PROTOCOL: str

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "reason" in metafunc.fixturenames:
            metafunc.parametrize("model, stream, kind, reason",
                                 [(model, stream, kind, says[self.PROTOCOL]) for model, stream, kind, says in BROKEN])
        else:
            metafunc.parametrize("stream", [True, False])

    def test_each_broken_answer_is_an_error_that_says_why(self, model: str, stream: bool, kind: str,
                                                         reason: str) -> None:
        """An error of `kind` whose reason, under 300 characters, says `reason`."""
        outcome = one_answer(self.PROTOCOL, {"name": "c", "model": model, OPTIONS[self.PROTOCOL]: {"stream": stream}},
                             request(0, 0, 6, 8))
        assert outcome.error == kind and reason in outcome.reason, outcome.reason
        assert len(outcome.reason) < 300

    def test_an_empty_answer_completes_with_no_tokens(self, stream: bool) -> None:
        """No error, 0 output tokens by the usage, no token stamps."""
        outcome = one_answer(self.PROTOCOL, {"name": "c", "model": "empty", OPTIONS[self.PROTOCOL]: {"stream": stream}},
                             request(0))
        assert outcome.error is None, outcome.reason
        assert (outcome.output_tokens, outcome.tokens_from_usage) == (0, True)
        assert outcome.token_ns == ([] if stream else None) and outcome.content_ns == 0


def session_of_three(protocol: str, stream: bool) -> tuple[list[dict], Any]:
    """Three turns of one session (a 4-token shared prefix, 5-token turns asking for 5 tokens), each
    answered with 2 reasoning and 3 content tokens, every one without an error: the server's log and the
    session's Conversation."""
    from latscope.records import Conversation

    from conftest import serve

    log: list[dict] = []
    session = {"turns": 3, "shared_prefix": {"tokens": 4}}
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=2, content=3)) as url:
        scn = scenario(url, protocol, [{"name": "c", "prompt_tokens": 5, "output_tokens": 5, "session": session,
                                        OPTIONS[protocol]: {"stream": stream}}])
        conv = Conversation(0, 0, True, 0, 3, 0)
        outcomes = send(scn, [request(k - 1, 0, 5, 5, turn=k, session=conv) for k in (1, 2, 3)])
    assert all(o.error is None for o in outcomes), [o.reason for o in outcomes]
    return log, conv


def check_carried(log: list[dict], prefix: str, history: str) -> tuple[list[dict], str]:
    """session_of_three's bodies: each sends the shared prefix (4 words) as `prefix`, then in `history`
    every earlier turn (5 words each, no two alike) and the answer the server gave to it (reasoning left
    out), then its own text. The bodies and the prefix."""
    bodies = [entry["body"] for entry in log]
    shared = bodies[0][prefix]
    assert len(shared.split()) == 4 and all(b[prefix] == shared for b in bodies)
    users = [b[history][-1]["content"] for b in bodies]
    assert all(len(u.split()) == 5 for u in users) and len(set(users)) == 3
    assert bodies[2][history] == [
        {"role": "user", "content": users[0]}, {"role": "assistant", "content": log[0]["answer"]},
        {"role": "user", "content": users[1]}, {"role": "assistant", "content": log[1]["answer"]},
        {"role": "user", "content": users[2]}]
    assert bodies[1][history] == bodies[2][history][:3] and "think" not in str(bodies[2][history])
    return bodies, shared


def timing_miss(outcome: Any, writes: list[tuple[str, int]]) -> str | None:
    """None when every token stamp trails the server's write of that event by less than DELIVERY_MS (so TTFT
    and each ITL are within DELIVERY_MS of the server's), else what was off. A stamp before the write is
    impossible (same clock) and fails at once."""
    stamps = outcome.token_ns
    assert len(stamps) == len(writes), (stamps, writes)
    delivery = [(c - w) / MS for c, (_, w) in zip(stamps, writes)]
    assert min(delivery) >= 0, delivery
    if max(delivery) >= DELIVERY_MS:
        return f"delivery (ms) {delivery}"
    return None


def within(tries: int, attempt: Any) -> None:
    """Run `attempt` (None when its timing checks pass) up to `tries` times: the box running the tests is
    shared (2 cores), and a neighbour can keep the client or this server off the CPU for a few ms once,
    which says nothing about the client; a client that stamps wrongly is off on every attempt."""
    misses = []
    for _ in range(tries):
        if (miss := attempt()) is None:
            return
        misses.append(miss)
    raise AssertionError("timing off on every attempt:\n" + "\n".join(misses))


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="OpenAI Responses and Anthropic Messages streams at known times")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=32, help="content deltas (max_tokens caps them)")
    parser.add_argument("--reasoning", type=int, default=0, help="reasoning deltas before them")
    args = parser.parse_args(argv)

    class Forgetful(list):  # a long run keeps no log
        def append(self, item: Any) -> None:
            pass

    async def serve_forever() -> None:
        app = make_events_app(Forgetful(), ttft_ms=args.ttft_ms, gap_ms=args.itl_ms, reasoning=args.reasoning,
                              content=args.tokens)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port)
        await site.start()
        print(f"ready http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve_forever())


if __name__ == "__main__":
    main()
