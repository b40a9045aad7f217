"""Anthropic's Messages API over the built-in decoder: POST /v1/messages, streaming and not.

Request: `model` (the decoder or an adapter), `max_tokens` (required, at most --max-tokens-limit; thinking
included, as Anthropic counts it), `messages` (non-empty; `role` a string, `content` a string or a list of
blocks: `text` blocks are read, `tool_use` and `tool_result` blocks as below, `thinking` / `redacted_thinking`
blocks a client carries back are skipped, others refused), `system` (a string or a list of text blocks: a
system line first), `tools` (a list of `{"name", "description", "input_schema"}`; `tool_choice` is accepted
and ignored), `stream`, `thinking`
(`{"type": "enabled", "budget_tokens": N}`: exactly N thinking tokens, N >= 1 and < max_tokens as
Anthropic requires; `{"type": "disabled"}`: none; absent: --reasoning-tokens, at most max_tokens);
`temperature`, `metadata` and the like are accepted and ignored, as are the `x-api-key` and
`anthropic-version` headers (neither is required). The prompt is the chat transcript of
text_api.chat_prompt, after the tools line (tools.py). A message is its lines: each `tool_result` block
(`{"tool_use_id", "content"}`, content a string or a list of text blocks) a `tool: CONTENT` line, then, unless
the message holds only tool results, its `role: ` line: its text blocks joined, then each `tool_use` block's
(`{"id", "name", "input": {...}}`) `NAME INPUT` (INPUT compact JSON).

Answer: `content` is a `thinking` block (when R > 0; its `signature` is a digest of its text) then a `text`
block (absent when every token was thinking); `stop_reason` "max_tokens" (the toy model has no end token);
`usage` = {input_tokens, output_tokens (thinking included), cache_creation_input_tokens 0,
cache_read_input_tokens}: as Anthropic's, input_tokens counts only the prompt tokens *not* read from the
cache, so the whole prompt is input_tokens + cache_read_input_tokens.

Stream (`event: TYPE` and `data: {"type": TYPE, ...}` per event): message_start (the message with empty
content, usage.input_tokens and output_tokens 1, as Anthropic sends it), ping; with thinking:
content_block_start (thinking), one content_block_delta `thinking_delta` per token, a `signature_delta`,
content_block_stop; then content_block_start (text), one `text_delta` per token, content_block_stop;
message_delta (`delta.stop_reason`, `usage.output_tokens`: the whole count), message_stop. A model failure
after the headers went out is an `error` event, and the stream ends.

Errors are Anthropic-shaped, `{"type": "error", "error": {"type", "message"}}`, the type by status: 400
invalid_request_error, 404 not_found_error (a model not served), 413 request_too_large, 429
rate_limit_error (queue full, with Retry-After), 500 api_error.

Tool calls (--tool-call-rate, tools.py): the answer's `content` is the thinking block (when R > 0) then
`{"type": "tool_use", "id": "toolu_<hex>", "name", "input": {KEY: TEXT}}`, `stop_reason` "tool_use". Streamed:
content_block_start `{"index", "content_block": {"type": "tool_use", "id", "name", "input": {}}}`, one
content_block_delta `{"type": "input_json_delta", "partial_json": PIECE}` per token, content_block_stop, then
message_delta with `stop_reason: "tool_use"`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from aiohttp import web

from reference_server.text_api import (ApiError, Job, TextRequest, TextRoutes, chat_prompt, check_context, encode,
                                       is_int, max_tokens_of, object_body, reasoning_of, render, stream_flag)
from reference_server.tools import arguments_piece, messages_tools, new_id, with_calls, with_tools

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}
_SKIPPED_BLOCKS = ("thinking", "redacted_thinking")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def _text_blocks(content: Any, where: str) -> str:
    """A string, or the text of a list of text blocks (the system prompt, a tool result's content)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
                raise ApiError(400, f"{where}.{i}: only text blocks are supported")
            texts.append(block["text"])
        return "".join(texts)
    raise ApiError(400, f"{where}: must be a string or a list of text blocks")


def _tool_use(block: dict[str, Any], where: str) -> tuple[str, str]:
    """A tool_use block as (name, its input as compact JSON)."""
    if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
            and isinstance(block.get("input"), dict)):
        raise ApiError(400, f"{where}: a tool_use block needs a string id and name and an object input")
    return block["name"], json.dumps(block["input"], separators=(",", ":"))


def _tool_result(block: dict[str, Any], where: str) -> str:
    if not isinstance(block.get("tool_use_id"), str):
        raise ApiError(400, f"{where}: a tool_result block needs a string tool_use_id")
    return _text_blocks(block.get("content"), f"{where}.content")


def _lines(role: str, content: Any, where: str) -> list[dict[str, str]]:
    """One message as transcript lines: a `tool` line per tool_result block, then the role's line (text blocks
    joined, then each tool_use block's name and input) unless the message holds only tool results."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: must be a string or a list of content blocks")
    texts: list[str] = []
    calls: list[tuple[str, str]] = []
    lines = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _SKIPPED_BLOCKS:
            continue
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_use(block, f"{where}.{i}"))
        elif kind == "tool_result":
            lines.append({"role": "tool", "content": _tool_result(block, f"{where}.{i}")})
        else:
            raise ApiError(400, f"{where}.{i}: only text, tool_use and tool_result blocks (and thinking blocks, "
                                f"skipped) are supported")
    if texts or calls or not lines:
        lines.append({"role": role, "content": with_calls("".join(texts), calls)})
    return lines


def _signature(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


class MessagesRoutes(TextRoutes):
    api = "messages"

    def error_response(self, exc: ApiError) -> web.Response:
        return web.json_response(error_body(exc.status, exc.message), status=exc.status, headers=exc.headers)

    def parse(self, body: Any) -> TextRequest:
        body = object_body(body)
        model = body.get("model")
        self.models.factor(model)
        if body.get("max_tokens") is None:
            raise ApiError(400, "max_tokens: Field required")
        max_tokens = max_tokens_of(body["max_tokens"], "max_tokens", self.max_tokens_limit)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: a non-empty list of {role, content} is required")
        system = body.get("system")
        lines = [] if system is None else [{"role": "system", "content": _text_blocks(system, "system")}]
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, f"messages.{i}: an object with a string 'role' is required")
            lines += _lines(m["role"], m.get("content"), f"messages.{i}.content")
        tools = messages_tools(body.get("tools"))
        config = self.generator.config
        prompt = encode(with_tools(tools, chat_prompt(lines)), config.vocab)
        check_context(prompt, max_tokens, config.max_context, "messages")
        thinking = self._thinking(body.get("thinking"), max_tokens)
        return TextRequest(model, prompt, max_tokens, thinking, stream_flag(body),
                           tool=self.choose_tool(tools, prompt, max_tokens - thinking))

    def _thinking(self, thinking: Any, max_tokens: int) -> int:
        if thinking is None:
            return reasoning_of(None, "thinking", self.reasoning_tokens, max_tokens)
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind == "disabled":
            return 0
        if kind != "enabled":
            raise ApiError(400, "thinking: expected {\"type\": \"enabled\", \"budget_tokens\": N} or "
                                "{\"type\": \"disabled\"}")
        budget = thinking.get("budget_tokens")
        if not is_int(budget) or not 1 <= budget < max_tokens:
            raise ApiError(400, f"thinking.budget_tokens: must be an integer >= 1 and less than max_tokens "
                                f"({max_tokens})")
        return budget

    def _message(self, job: Job, content: list[dict[str, Any]], output_tokens: int, message_id: str,
                 stop_reason: str | None) -> dict[str, Any]:
        cached = job.generation.cached_tokens
        return {"id": message_id, "type": "message", "role": "assistant", "model": job.request.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": len(job.request.prompt) - cached, "output_tokens": output_tokens,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}}

    def answer(self, job: Job, ids: list[int]) -> dict[str, Any]:
        r, tool = job.request.reasoning, job.request.tool
        content = []
        if r:
            thought = "".join(map(render, ids[:r]))
            content.append({"type": "thinking", "thinking": thought, "signature": _signature(thought)})
        if len(ids) > r:
            text = "".join(map(render, ids[r:]))
            content.append({"type": "text", "text": text} if tool is None else
                           {"type": "tool_use", "id": new_id("toolu"), "name": tool.name, "input": {tool.key: text}})
        return self._message(job, content, len(ids), new_id("msg"), "max_tokens" if tool is None else "tool_use")

    async def stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        r, tool, last = job.request.reasoning, job.request.tool, job.request.max_tokens - 1
        stop_reason = "max_tokens" if tool is None else "tool_use"
        thought: list[str] = []

        def event(kind: str, **fields: Any) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n".encode()

        def end_thinking() -> bytes:
            return (event("content_block_delta", index=0,
                          delta={"type": "signature_delta", "signature": _signature("".join(thought))})
                    + event("content_block_stop", index=0))

        def piece(index: int, token_id: int) -> bytes:
            word = render(token_id)
            if index < r:
                thought.append(word)
                return event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": word})
            head = b""
            if index == r:
                block = ({"type": "text", "text": ""} if tool is None else
                         {"type": "tool_use", "id": new_id("toolu"), "name": tool.name, "input": {}})
                head = (end_thinking() if r else b"") + event("content_block_start", index=1 if r else 0,
                                                              content_block=block)
            delta = ({"type": "text_delta", "text": word} if tool is None else
                     {"type": "input_json_delta",
                      "partial_json": arguments_piece(tool.key, index - r, word, index == last)})
            return head + event("content_block_delta", index=1 if r else 0, delta=delta)

        def closing(count: int) -> bytes:
            if count > r:
                stop = event("content_block_stop", index=1 if r else 0)
            else:
                stop = end_thinking() if r else b""
            return (stop + event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": None},
                                 usage={"output_tokens": count})
                    + event("message_stop"))

        def failure(message: str) -> bytes:
            return event("error", error={"type": "api_error", "message": message})

        opening = (event("message_start", message=self._message(job, [], 1, new_id("msg"), None))
                   + event("ping"))
        if r:
            opening += event("content_block_start", index=0,
                             content_block={"type": "thinking", "thinking": "", "signature": ""})
        return await self.stream_tokens(request, job, content_type="text/event-stream", opening=opening, piece=piece,
                                        closing=closing, failure=failure)


def add_routes(app: web.Application, routes: MessagesRoutes) -> None:
    app.router.add_post("/v1/messages", routes.handle)
