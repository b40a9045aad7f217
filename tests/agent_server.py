"""A scripted agent endpoint for the agent tests, and a run against it (`agent_run`): chat completions, Responses and Messages, streamed, each
answer a tool call, and a log of every request it received.

Answer n (from 1) makes one tool call, id `call_n`, of the first tool the request declares, with the
arguments `{"query": "r<n>"}` streamed in three pieces (each a token chunk) after `ttft_ms`; when
`garble` says so (a set of answer numbers) the arguments are cut short (not JSON); when `text_after`
holds the round (the number of answers the request carries + 1) it answers two words of text instead
(" r<n> done", a chunk per word), no call. `fail_round`: a 500 to the request of that round. Every request is logged with its
body, its X-Request-Id, when its handler began (perf_counter_ns, the clock latscope's workers use),
when it began writing its last bytes, what it answered (`call`: (id, name, arguments), `text`) and how
many requests were in flight when it arrived (`in_flight`).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict


def _round(api: str, body: dict[str, Any]) -> int:
    """The round a request is: the answers its context carries + 1."""
    items = body["messages"] if api != "responses" else body["input"]
    if api == "responses":
        return 1 + sum(1 for m in items if m.get("type") == "function_call" or m.get("role") == "assistant")
    return 1 + sum(1 for m in items if m["role"] == "assistant")


def _tool_name(api: str, tool: dict[str, Any]) -> str:
    return tool["function"]["name"] if api == "chat" else tool["name"]


def _events(api: str, call: tuple[str, str, list[str]] | None, text: str) -> list[bytes]:
    """The answer's SSE events, one token chunk each where it generates, and its end."""
    def sse(doc: dict[str, Any]) -> bytes:
        return b"data: %s\n\n" % json.dumps(doc).encode()
    out = []
    if api == "chat":
        if call is None:
            out += [sse({"choices": [{"delta": {"content": " " + w}}]}) for w in text.split(" ")]
        else:
            call_id, name, pieces = call
            out += [sse({"choices": [{"delta": {"tool_calls": [
                {"index": 0, **({"id": call_id, "type": "function", "function": {"name": name, "arguments": p}}
                                if i == 0 else {"function": {"arguments": p}})}]}}]}) for i, p in enumerate(pieces)]
        return out + [sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}), b"data: [DONE]\n\n"]
    if api == "responses":
        if call is None:
            out += [sse({"type": "response.output_text.delta", "delta": " " + w}) for w in text.split(" ")]
        else:
            out.append(sse({"type": "response.output_item.added", "output_index": 0,
                            "item": {"type": "function_call", "call_id": call[0], "name": call[1], "arguments": ""}}))
            out += [sse({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": p}) for p in call[2]]
        return out + [sse({"type": "response.completed", "response": {"usage": {"input_tokens": 1, "output_tokens": 3}}})]
    if call is None:
        out += [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " " + w}})
                for w in text.split(" ")]
    else:
        out.append(sse({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "tool_use", "id": call[0], "name": call[1], "input": {}}}))
        out += [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}})
                for p in call[2]]
    return out + [sse({"type": "message_delta", "usage": {"output_tokens": 3}}), sse({"type": "message_stop"})]


def make_agent_app(log: list[dict], *, ttft_ms: float = 5.0, garble: frozenset[int] = frozenset(),
                   text_after: frozenset[int] = frozenset(), fail_round: int | None = None) -> web.Application:
    state = {"n": 0, "in_flight": 0}

    def handler(api: str):
        async def answer(request: web.Request) -> web.StreamResponse:
            arrived = time.perf_counter_ns()
            body = await request.json()
            n = state["n"] = state["n"] + 1
            entry = {"n": n, "api": api, "arrived_ns": arrived, "body": body,
                     "request_id": request.headers.get("X-Request-Id"), "round": _round(api, body)}
            log.append(entry)
            state["in_flight"] += 1
            entry["in_flight"] = state["in_flight"]
            try:
                return await reply(request, entry, body, n)
            finally:
                state["in_flight"] -= 1

        async def reply(request: web.Request, entry: dict, body: dict, n: int) -> web.StreamResponse:
            if entry["round"] == fail_round:
                entry["ended_ns"] = time.perf_counter_ns()
                return web.json_response({"error": {"message": "round refused"}}, status=500)
            call = text = None
            if entry["round"] in text_after or not body.get("tools"):
                text = f"r{n} done"
            else:
                arguments = json.dumps({"query": f"r{n}"})
                if n in garble:
                    arguments = arguments[:-3]
                cuts = (len(arguments) // 3, 2 * len(arguments) // 3)
                pieces = [arguments[:cuts[0]], arguments[cuts[0]:cuts[1]], arguments[cuts[1]:]]
                call = (f"call_{n}", _tool_name(api, body["tools"][0]), pieces)
            entry["call"] = (call[0], call[1], "".join(call[2])) if call else None
            entry["text"] = " " + text if text else None  # as the client puts it together
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(ttft_ms / 1000)
            events = _events(api, call, text or "")
            for event in events[:-1]:
                await response.write(event)
            entry["ended_ns"] = time.perf_counter_ns()  # before the last bytes: the client reads them later
            await response.write(events[-1])
            await response.write_eof()
            return response
        return answer

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler("chat"))
    app.router.add_post("/v1/responses", handler("responses"))
    app.router.add_post("/v1/messages", handler("messages"))
    return app


def agent_run(url: str, out: Path, agent: dict, rate: float) -> Path:
    """A run of one agent class `coder` (12-token tasks, 3-token answers) against `url`: jobs start at
    `rate` a second for 0.5 s, then an idle 1.5 s lets them finish; its results directory."""
    return run_scenario(scenario_from_dict({
        "name": "agents", "seed": 3,
        "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5, "request_id_header": "X-Request-Id"},
        "workload": {"classes": [{"name": "coder", "prompt_tokens": 12, "output_tokens": 3, "agent": agent}]},
        "phases": [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": rate}},
                   {"name": "tail", "duration": 1.5, "arrival": {"type": "idle"}}],
        "limits": {"timer": "precise"},
        "output": {"dir": str(out), "report": False},
    }), workers=1).run_dir
