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


async def _tokens(out: _Answer, events: list[tuple[str, bytes]], ttft_ms: float, gap_ms: float) -> None:
    """Token events at ttft, then one every gap_ms, each in a write of its own."""
    await asyncio.sleep(ttft_ms / 1000)
    for i, (kind, data) in enumerate(events):
        if i:
            await asyncio.sleep(gap_ms / 1000)
        await out.write(data, kind)


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
    if model in broken:
        tokens[thoughts + 1:] = [("broken", broken[model])]
    if model == "truncate":
        tokens = tokens[:2]
    await _tokens(out, tokens, ttft_ms, gap_ms)
    if model in broken or model == "truncate":
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
    if model in broken:
        tokens[thoughts + 1:] = [("broken", broken[model])]
    if model == "truncate":
        tokens = tokens[:2]
    await _tokens(out, tokens, ttft_ms, gap_ms)
    if model in broken or model == "truncate":
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


# --- what both clients' tests share -----------------------------------------------------------------------
# (latscope is imported inside: the server, run as a process by benchmarks/wire_truth.py, needs aiohttp alone)

MS = 1_000_000
DELIVERY_MS = 1.0  # the promise: each token stamped within 1 ms of the server's write (loopback delivery)


def scenario(url: str, protocol: str, classes: list[dict], workload: dict | None = None, **target: Any) -> Any:
    from latscope.scenario import scenario_from_dict

    return scenario_from_dict({
        "name": protocol, "seed": 3,
        "target": {"url": url, "protocol": protocol, "model": "m", "timeout": 5, **target},
        "workload": {"classes": classes, **(workload or {})},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
    })


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


def request(seq: int, cls: int = 0, prompt_tokens: int = 6, output_tokens: int = 5, **fields: Any) -> Any:
    from latscope.records import Request

    return Request(seq, time.perf_counter_ns(), cls, False, prompt_tokens, output_tokens, seq, **fields)


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
