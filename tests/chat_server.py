"""A small OpenAI-compatible chat server for session tests that records every request it receives.

Each request gets a numbered answer whose text no other answer has ("r<n>w<i>" words), streamed as
SSE after `ttft_ms`, one word every `itl_ms`, then a usage chunk whose `cached_tokens` is the longest
prefix (in words of the prompt) it shares with any earlier prompt. Every request is logged with its
body, its X-Request-Id, when its handler began (after the request arrived) and when it began writing
its last bytes (before the client could read them) (perf_counter_ns: the clock latscope's workers use), and how many requests were in flight when it arrived. `fail_turn`:
answer 500 to a chat request carrying that many user messages (a server that errors mid-session).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web


def prompt_words(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        return " ".join(m["content"] for m in body["messages"]).split()
    return body["prompt"].split()


def make_chat_app(log: list[dict], *, ttft_ms: float = 5.0, itl_ms: float = 1.0,
                  fail_turn: int | None = None) -> web.Application:
    state = {"in_flight": 0, "n": 0}

    async def complete(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        body = await request.json()
        state["in_flight"] += 1
        n = state["n"] = state["n"] + 1
        entry = {"n": n, "arrived_ns": arrived, "body": body, "request_id": request.headers.get("X-Request-Id"),
                 "in_flight": state["in_flight"]}
        log.append(entry)
        try:
            users = sum(1 for m in body.get("messages", []) if m["role"] == "user")
            if fail_turn is not None and users == fail_turn:
                entry["ended_ns"] = time.perf_counter_ns()
                return web.json_response({"error": {"message": "turn refused"}}, status=500)
            words = prompt_words(body)
            cached = max((_common(words, prompt_words(e["body"])) for e in log[:-1]), default=0)
            answer = [f"r{n}w{i}" for i in range(body.get("max_tokens") or 4)]
            entry["answer"] = " " + " ".join(answer)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(ttft_ms / 1000)
            chat = "messages" in body
            for i, word in enumerate(answer):
                piece = {"delta": {"content": " " + word}} if chat else {"text": " " + word}
                await response.write(b"data: %s\n\n" % json.dumps({"choices": [piece]}).encode())
                if i + 1 < len(answer):
                    await asyncio.sleep(itl_ms / 1000)
            usage = {"prompt_tokens": len(words), "completion_tokens": len(answer),
                     "prompt_tokens_details": {"cached_tokens": cached}}
            entry["ended_ns"] = time.perf_counter_ns()  # before the last bytes: the client reads them later
            await response.write(b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"choices": [], "usage": usage}).encode())
            await response.write_eof()
            return response
        finally:
            state["in_flight"] -= 1

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
