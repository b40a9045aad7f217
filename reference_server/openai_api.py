"""OpenAI-compatible text generation (aiohttp): POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Backed by the built-in decoder and the continuous-batching generator (generation.py), with what every
generation front end shares in text_api.py (toy tokenizer, models and adapters, reasoning, errors).
Streaming answers are Server-Sent Events, one `data: {chunk}` per token, an optional usage chunk
(`stream_options.include_usage`), then `data: [DONE]`. Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`.

A prompt string is one token per word (text_api.py); a completions prompt may also be a list of token
ids. Decoding is greedy with no end-of-sequence token, so every answer is exactly `max_tokens` tokens
(finish_reason "length"); sampling parameters are accepted and ignored.

Reasoning (chat only; completions never reason): the first R tokens of a chat answer are reasoning, R =
the body's `reasoning_tokens` (an extension field; the openai client sends it in `extra_body`) else
`--reasoning-tokens`, at most max_tokens. Streamed as `delta.reasoning_content` chunks (DeepSeek's and
vLLM's field) before the `delta.content` ones; a whole answer has `message.reasoning_content` beside
`message.content`. `usage.completion_tokens` counts them too, and chat's usage always carries
`completion_tokens_details.reasoning_tokens` (R), as OpenAI's does.

Tools (chat only; tools.py): `tools` is a list of `{"type": "function", "function": {"name", "description",
"parameters"}}` (`tool_choice` and `parallel_tool_calls` are accepted and ignored). With tools, an answer may be
a call (--tool-call-rate): whole, `message: {"role": "assistant", "content": null, "tool_calls": [{"id":
"call_<hex>", "type": "function", "function": {"name", "arguments"}}]}` (and `reasoning_content` when R > 0),
finish_reason "tool_calls"; streamed, after the role chunk and any reasoning chunks, one chunk per token with
`delta: {"tool_calls": [{"index": 0, "id", "type": "function", "function": {"name", "arguments": PIECE}}]}` on
the first and `delta: {"tool_calls": [{"index": 0, "function": {"arguments": PIECE}}]}` after, the last with
finish_reason "tool_calls". Carried-back history: an assistant message's `tool_calls` (each `{"id", "type":
"function", "function": {"name", "arguments"}}`, strings; its `content` may be null) render after its content
in its line, `assistant: CONTENT NAME ARGUMENTS`; a `{"role": "tool", "tool_call_id", "content"}` message is a
`tool: CONTENT` line.

Server-Timing (ms): non-streaming answers carry deser (parsing and tokenizing the body already read),
queue (submission to the start of its prefill run), prefill (that run, shared by the prompts prefilled
with it), decode (first token to last token) and ser (encoding the answer). A streaming answer sends
its headers with its first token, so they carry deser, queue and prefill only: aiohttp cannot send
HTTP trailers, so decode and ser are not reported for streams. Both also carry `cached;desc="N"`: the
prompt tokens taken from the prefix cache (prefix_cache.py), also sent as
usage.prompt_tokens_details.cached_tokens (as OpenAI and vLLM report it).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from reference_server.text_api import (ApiError, Job, TextRequest, TextRoutes, chat_prompt, check_context, encode,
                                       is_int, max_tokens_of, object_body, reasoning_of, render, stream_flag)
from reference_server.tools import Tool, arguments, arguments_piece, chat_tools, new_id, with_calls, with_tools


# --- request parsing -----------------------------------------------------------------------------------

def _text_of(content: Any, index: int) -> str:
    """A message's content: a string, or a list of parts whose text parts are joined (others are rejected)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts", param="messages")


def _calls_of(calls: Any, index: int) -> list[tuple[str, str]]:
    """An assistant message's `tool_calls` as (name, arguments) pairs."""
    if not isinstance(calls, list):
        raise ApiError(400, f"messages[{index}].tool_calls must be a list", param="messages")
    pairs = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(call.get("id"), str)
                and call.get("type", "function") == "function" and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments"), str)):
            raise ApiError(400, f"messages[{index}].tool_calls[{j}] must be {{\"id\", \"type\": \"function\", "
                                f"\"function\": {{\"name\", \"arguments\"}}}} with string id, name and arguments",
                           param="messages")
        pairs.append((function["name"], function["arguments"]))
    return pairs


def _chat_line(m: Any, index: int) -> dict[str, str]:
    """One message as a transcript line: its role, and its content followed by any tool calls it carries."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"messages[{index}] must be an object with a string 'role'", param="messages")
    if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise ApiError(400, f"messages[{index}].tool_call_id is required in a tool message (a string)",
                       param="messages")
    content = _text_of(m.get("content"), index)
    if m.get("tool_calls") is not None:
        content = with_calls(content, _calls_of(m["tool_calls"], index))
    return {"role": m["role"], "content": content}


def _prompt_ids(body: dict[str, Any], chat: bool, vocab: int, tools: list[Tool]) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' is required: a non-empty list of {role, content}", param="messages")
        return encode(with_tools(tools, chat_prompt([_chat_line(m, i) for i, m in enumerate(messages)])), vocab)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        ids = encode(prompt, vocab)
    elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError(400, f"token ids in 'prompt' must be in [0, {vocab})", param="prompt")
        ids = prompt
    elif prompt is None:
        raise ApiError(400, "'prompt' is required: a string or a list of token ids", param="prompt")
    else:
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
                       param="prompt")
    if not ids:
        raise ApiError(400, "'prompt' is empty (no tokens)", param="prompt")
    return ids


# --- responses -----------------------------------------------------------------------------------------

def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Answer:
    """The OpenAI objects for one request (completion or chat), sharing id, created and model."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _envelope(self, kind: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False,
              reasoning: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, str] = ({"role": "assistant", "content": ""} if role else
                                     {"reasoning_content": text or ""} if reasoning else {"content": text or ""})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return _sse(self._envelope("chat.completion.chunk", [choice]))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return _sse(self._envelope("text_completion", [choice]))

    def call_chunk(self, call: dict[str, Any], finish_reason: str | None) -> bytes:
        """A chat chunk of the tool call `call` (`{"index": 0, ...}`, the delta's one entry)."""
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": finish_reason}
        return _sse(self._envelope("chat.completion.chunk", [choice]))

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        return _sse(self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage=usage))

    def complete(self, text: str, usage: dict[str, Any], reasoning: str = "",
                 call: dict[str, Any] | None = None) -> dict[str, Any]:
        """The whole answer; a chat answer with `call` (a tool_calls entry) has it instead of content."""
        if self.chat:
            message = {"role": "assistant", "content": None if call else text,
                       **({"reasoning_content": reasoning} if reasoning else {}),
                       **({"tool_calls": [call]} if call else {})}
            choice = {"index": 0, "message": message, "logprobs": None,
                      "finish_reason": "tool_calls" if call else "length"}
            return self._envelope("chat.completion", [choice], usage=usage)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return self._envelope("text_completion", [choice], usage=usage)


def _usage(job: Job, completion_tokens: int) -> dict[str, Any]:
    prompt_tokens = len(job.request.prompt)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens,
             "prompt_tokens_details": {"cached_tokens": job.generation.cached_tokens}}
    if job.request.extra["chat"]:
        usage["completion_tokens_details"] = {"reasoning_tokens": min(job.request.reasoning, completion_tokens)}
    return usage


class OpenAIRoutes(TextRoutes):
    """/v1/completions and /v1/chat/completions (one instance each: `chat`), and /v1/models."""

    def __init__(self, *args: Any, chat: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat = chat
        self.api = "chat" if chat else "completions"
        self.created = int(time.time())

    async def models_list(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "latscope-ref",
             **({} if name == self.models.base else {"parent": self.models.base, "root": self.models.base})}
            for name in self.models.names()]})

    def parse(self, body: Any) -> TextRequest:
        """Validate one request body (already JSON-decoded); raises ApiError (400, or 404 for another model)."""
        body = object_body(body)
        chat, config = self.chat, self.generator.config
        model = body.get("model")
        self.models.factor(model)  # 400 without a model, 404 for one not served
        tools = chat_tools(body.get("tools")) if chat else []
        prompt = _prompt_ids(body, chat, config.vocab, tools)
        field = "max_completion_tokens" if chat and body.get("max_tokens") is None else "max_tokens"
        max_tokens = max_tokens_of(body.get(field), field, self.max_tokens_limit)
        check_context(prompt, max_tokens, config.max_context, "messages" if chat else "prompt")
        n = body.get("n", 1)
        if n is not None and n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        stream = stream_flag(body)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}",
                           param="stream_options")
        reasoning = reasoning_of(body.get("reasoning_tokens"), "reasoning_tokens", self.reasoning_tokens,
                                 max_tokens) if chat else 0
        return TextRequest(model, prompt, max_tokens, reasoning, stream,
                           {"chat": chat, "include_usage": bool(options.get("include_usage"))},
                           self.choose_tool(tools, prompt, max_tokens - reasoning))

    def answer(self, job: Job, ids: list[int]) -> dict[str, Any]:
        r, tool = job.request.reasoning, job.request.tool
        texts = [render(i) for i in ids[r:]]
        call = None
        if tool is not None:
            call = {"id": new_id("call"), "type": "function",
                    "function": {"name": tool.name, "arguments": arguments(tool.key, texts)}}
        return _Answer(self.chat, job.request.model).complete("".join(texts), _usage(job, len(ids)),
                                                              "".join(map(render, ids[:r])), call)

    async def stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        answer = _Answer(self.chat, job.request.model)
        last, reasoning, tool = job.request.max_tokens - 1, job.request.reasoning, job.request.tool
        call_id = new_id("call")

        def piece(index: int, token_id: int) -> bytes:
            if tool is None or index < reasoning:
                return answer.chunk(render(token_id), "length" if index == last else None, reasoning=index < reasoning)
            part = arguments_piece(tool.key, index - reasoning, render(token_id), index == last)
            call = ({"index": 0, "id": call_id, "type": "function", "function": {"name": tool.name, "arguments": part}}
                    if index == reasoning else {"index": 0, "function": {"arguments": part}})
            return answer.call_chunk(call, "tool_calls" if index == last else None)

        def closing(count: int) -> bytes:
            usage = answer.usage_chunk(_usage(job, count)) if job.request.extra["include_usage"] else b""
            return usage + b"data: [DONE]\n\n"

        def failure(message: str) -> bytes:  # no [DONE] after it
            return _sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})

        return await self.stream_tokens(request, job, content_type="text/event-stream",
                                        opening=answer.chunk(None, role=True) if self.chat else b"",
                                        piece=piece, closing=closing, failure=failure)


def add_routes(app: web.Application, completions: OpenAIRoutes, chat: OpenAIRoutes) -> None:
    app.router.add_get("/v1/models", chat.models_list)
    app.router.add_post("/v1/completions", completions.handle)
    app.router.add_post("/v1/chat/completions", chat.handle)
