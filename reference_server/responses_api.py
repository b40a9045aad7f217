"""OpenAI's Responses API over the built-in decoder: POST /v1/responses, streaming and not.

Request: `model` (the decoder or an adapter), `input` (a string: one user message; or a list of message
items `{"role", "content"}` with `content` a string or a list of `input_text` / `output_text` / `text`
parts; `reasoning` items, as a client carrying its history sends them back, are skipped; a `function_call`
item `{"call_id", "name", "arguments"}` is the line `assistant: NAME ARGUMENTS`, a `function_call_output` item
`{"call_id", "output"}` (a string or text parts) the line `tool: OUTPUT`), `tools` (below), `instructions`
(a system line before the input), `max_output_tokens` (default 16, at most --max-tokens-limit; reasoning
included), `stream`, `previous_response_id`, `store` (default true), `reasoning_tokens` (this server's
extension: R, else --reasoning-tokens; the openai client sends it in `extra_body`); `reasoning`,
`temperature`, `tool_choice` and other sampling fields are accepted and ignored. The prompt is the chat
transcript of text_api.chat_prompt ('role: content' lines, then 'assistant:'), after the tools line (tools.py).

Sessions: a stored response (the last STORED_RESPONSES of this replica, at most STORED_CHARS characters in
all, oldest dropped first) keeps its transcript (input messages and its answer's text, not its reasoning
and not the instructions or tools, which OpenAI does not carry over either; a tool call as its
`NAME ARGUMENTS` line); a request naming it in
`previous_response_id` continues that transcript. An id not stored here: 400 (param previous_response_id).

Answer: `output` is a `reasoning` item (when R > 0: `content: [{"type": "reasoning_text", "text"}]`) and a
`message` item (`content: [{"type": "output_text", "text"}]`; absent when all max_output_tokens were
reasoning); `usage` = {input_tokens, input_tokens_details.cached_tokens, output_tokens (reasoning included),
output_tokens_details.reasoning_tokens, total_tokens}. Every answer stops at max_output_tokens (no
end-of-sequence token); OpenAI would mark that `incomplete`, this server answers `completed` so a stream
reads like a finished answer.

Stream (`event: TYPE` and `data: {... "type": TYPE, "sequence_number": n}` per event, no [DONE]):
response.created, response.in_progress; with reasoning: response.output_item.added (the reasoning item),
one response.reasoning_text.delta per token, response.reasoning_text.done, response.output_item.done; then
response.output_item.added (the message), response.content_part.added, one response.output_text.delta per
token, response.output_text.done, response.content_part.done, response.output_item.done; last
response.completed with the whole response and its usage. A model failure after the headers went out is an
`error` event, and the stream ends. Errors before it are OpenAI-shaped (text_api.ApiError).

Tools: `tools` is a list of `{"type": "function", "name", "description", "parameters"}` (echoed in the
response's `tools`). An answer that calls one (--tool-call-rate, tools.py) has, in place of the message item, the
item `{"type": "function_call", "id": "fc_<hex>", "call_id": "call_<hex>", "name", "arguments", "status"}`.
Streamed, after any reasoning item: response.output_item.added (that item, `arguments` "", status
in_progress), one response.function_call_arguments.delta `{item_id, output_index, delta: PIECE}` per token,
response.function_call_arguments.done `{item_id, output_index, arguments}`, response.output_item.done (the
item with its whole arguments, status completed), response.completed (its `output` holding the item).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

from aiohttp import web

from reference_server.text_api import (ApiError, Job, TextRequest, TextRoutes, chat_prompt, check_context, encode,
                                       max_tokens_of, object_body, reasoning_of, render, stream_flag)
from reference_server.tools import arguments, arguments_piece, new_id, responses_tools, with_calls, with_tools

STORED_RESPONSES = 1024
STORED_CHARS = 64 * 2**20
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseStore:
    """Transcripts of stored responses by id, LRU-bounded by count and by characters."""

    def __init__(self, max_responses: int = STORED_RESPONSES, max_chars: int = STORED_CHARS) -> None:
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, tuple[list[dict[str, str]], int]] = OrderedDict()
        self.chars = 0

    def get(self, response_id: str) -> list[dict[str, str]] | None:
        item = self._items.get(response_id)
        if item is None:
            return None
        self._items.move_to_end(response_id)
        return item[0]

    def put(self, response_id: str, transcript: list[dict[str, str]]) -> None:
        size = sum(len(m["role"]) + len(m["content"]) for m in transcript)
        if size > self.max_chars:
            return
        self._items[response_id] = (transcript, size)
        self.chars += size
        while len(self._items) > self.max_responses or self.chars > self.max_chars:
            _, (_, dropped) = self._items.popitem(last=False)
            self.chars -= dropped


def _content_text(content: Any, where: str) -> str:
    """A string, or the text of a list of text parts; `where` names the field in the error."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}: only text parts ({', '.join(_TEXT_PARTS)}) are supported",
                               param="input")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"{where} must be a string or a list of text parts", param="input")


def _function_call(item: dict[str, Any], index: int) -> dict[str, str]:
    if not all(isinstance(item.get(key), str) for key in ("call_id", "name", "arguments")):
        raise ApiError(400, f"input[{index}]: a function_call item needs string call_id, name and arguments",
                       param="input")
    return {"role": "assistant", "content": with_calls("", [(item["name"], item["arguments"])])}


def _function_call_output(item: dict[str, Any], index: int) -> dict[str, str]:
    if not isinstance(item.get("call_id"), str):
        raise ApiError(400, f"input[{index}]: a function_call_output item needs a string call_id", param="input")
    return {"role": "tool", "content": _content_text(item.get("output"), f"input[{index}].output")}


def _messages(value: Any) -> list[dict[str, str]]:
    """The `input` as messages: a string is one user message; a list holds message items (reasoning skipped),
    function_call items (assistant lines) and function_call_output items (tool lines)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'input' is required: a string or a non-empty list of message items", param="input")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ApiError(400, f"input[{i}] must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "reasoning":
            continue
        if kind == "function_call":
            messages.append(_function_call(item, i))
        elif kind == "function_call_output":
            messages.append(_function_call_output(item, i))
        elif kind == "message" and isinstance(item.get("role"), str):
            content = _content_text(item.get("content"), f"input[{i}].content")
            messages.append({"role": item["role"], "content": content})
        else:
            raise ApiError(400, f"input[{i}]: only message items with a string 'role', function_call, "
                                f"function_call_output and reasoning items are supported, not type {kind!r}",
                           param="input")
    return messages


class ResponsesRoutes(TextRoutes):
    api = "responses"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = ResponseStore()

    def parse(self, body: Any) -> TextRequest:
        body = object_body(body)
        model = body.get("model")
        self.models.factor(model)
        messages = _messages(body.get("input"))
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            previous = self.store.get(previous_id) if isinstance(previous_id, str) else None
            if previous is None:
                raise ApiError(400, f"Previous response with id {previous_id!r} not found (this server keeps the "
                                    f"last {STORED_RESPONSES} stored responses of this replica)",
                               param="previous_response_id")
            messages = previous + messages
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string", param="instructions")
        store = body.get("store", True)
        if not isinstance(store, bool):
            raise ApiError(400, "'store' must be a boolean", param="store")
        if not isinstance(body.get("reasoning") or {}, dict):
            raise ApiError(400, "'reasoning' must be an object like {\"effort\": \"low\"}", param="reasoning")
        system = [{"role": "system", "content": instructions}] if instructions else []
        tools = responses_tools(body.get("tools"))
        config = self.generator.config
        prompt = encode(with_tools(tools, chat_prompt(system + messages)), config.vocab)
        max_tokens = max_tokens_of(body.get("max_output_tokens"), "max_output_tokens", self.max_tokens_limit)
        check_context(prompt, max_tokens, config.max_context, "input")
        reasoning = reasoning_of(body.get("reasoning_tokens"), "reasoning_tokens", self.reasoning_tokens, max_tokens)
        return TextRequest(model, prompt, max_tokens, reasoning, stream_flag(body),
                           {"messages": messages, "instructions": instructions, "store": store,
                            "previous_response_id": previous_id, "tools": body.get("tools") or []},
                           self.choose_tool(tools, prompt, max_tokens - reasoning))

    # --- the answer's objects ---

    def _response(self, job: Job, response_id: str, created: int, output: list[dict], usage: dict | None,
                  status: str) -> dict[str, Any]:
        extra = job.request.extra
        return {"id": response_id, "object": "response", "created_at": created, "status": status, "error": None,
                "incomplete_details": None, "instructions": extra["instructions"],
                "max_output_tokens": job.request.max_tokens, "model": job.request.model, "output": output,
                "parallel_tool_calls": True, "previous_response_id": extra["previous_response_id"],
                "reasoning": {"effort": None, "summary": None}, "store": extra["store"], "temperature": 1.0,
                "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": extra["tools"], "top_p": 1.0,
                "truncation": "disabled", "usage": usage, "metadata": {}}

    @staticmethod
    def _usage(job: Job, output_tokens: int) -> dict[str, Any]:
        prompt = len(job.request.prompt)
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": job.generation.cached_tokens},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": min(job.request.reasoning, output_tokens)},
                "total_tokens": prompt + output_tokens}

    @staticmethod
    def _reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}

    @staticmethod
    def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_output_text(text)]
        return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    @staticmethod
    def _item_ids(job: Job) -> tuple[str, str, str]:
        """Ids of an answer's items: the reasoning item, the message or function_call item, the call."""
        return new_id("rs"), new_id("msg" if job.request.tool is None else "fc"), new_id("call")

    def _answer_item(self, job: Job, ids: tuple[str, str, str], text: str | None, status: str) -> dict[str, Any]:
        """The message item (`text`: its text, None while in progress), or with a tool call the function_call
        item (`text`: its arguments)."""
        tool = job.request.tool
        if tool is None:
            return self._message_item(ids[1], text, status)
        return {"type": "function_call", "id": ids[1], "call_id": ids[2], "name": tool.name,
                "arguments": text or "", "status": status}

    def _output(self, job: Job, ids: tuple[str, str, str], reasoning: str | None,
                text: str | None) -> list[dict[str, Any]]:
        return [*([self._reasoning_item(ids[0], reasoning, "completed")] if reasoning is not None else []),
                *([self._answer_item(job, ids, text, "completed")] if text is not None else [])]

    def _remember(self, job: Job, response_id: str, text: str | None) -> None:
        """Store the transcript: the input, then the answer's text or `NAME ARGUMENTS` (`text`: the arguments)."""
        if job.request.extra["store"]:
            tool = job.request.tool
            said = with_calls("", [(tool.name, text or "")]) if tool is not None else text or ""
            self.store.put(response_id, [*job.request.extra["messages"], {"role": "assistant", "content": said}])

    # --- serving ---

    def answer(self, job: Job, ids: list[int]) -> dict[str, Any]:
        r, n, tool = job.request.reasoning, len(ids), job.request.tool
        reasoning = "".join(map(render, ids[:r])) if r else None
        texts = [render(i) for i in ids[r:]]
        text = None if n <= r else arguments(tool.key, texts) if tool is not None else "".join(texts)
        response_id = new_id("resp")
        output = self._output(job, self._item_ids(job), reasoning, text)
        doc = self._response(job, response_id, int(time.time()), output, self._usage(job, n), "completed")
        self._remember(job, response_id, text)
        return doc

    async def stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        response_id, created = new_id("resp"), int(time.time())
        r, tool, last = job.request.reasoning, job.request.tool, job.request.max_tokens - 1
        item_ids = self._item_ids(job)
        message_index = 1 if r else 0
        sequence = 0
        thought: list[str] = []
        said: list[str] = []  # the answer's words, or with a tool call its arguments' pieces

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal sequence
            data = json.dumps({"type": kind, "sequence_number": sequence, **fields}, separators=(",", ":"))
            sequence += 1
            return f"event: {kind}\ndata: {data}\n\n".encode()

        def end_reasoning() -> bytes:
            text = "".join(thought)
            return (event("response.reasoning_text.done", item_id=item_ids[0], output_index=0, content_index=0,
                          text=text)
                    + event("response.output_item.done", output_index=0,
                            item=self._reasoning_item(item_ids[0], text, "completed")))

        def start_answer() -> bytes:
            added = event("response.output_item.added", output_index=message_index,
                          item=self._answer_item(job, item_ids, None, "in_progress"))
            if tool is not None:
                return added
            return added + event("response.content_part.added", item_id=item_ids[1], output_index=message_index,
                                 content_index=0, part=_output_text(""))

        def delta(index: int, word: str) -> bytes:
            if tool is not None:
                said.append(arguments_piece(tool.key, index - r, word, index == last))
                return event("response.function_call_arguments.delta", item_id=item_ids[1], output_index=message_index,
                             delta=said[-1])
            said.append(word)
            return event("response.output_text.delta", item_id=item_ids[1], output_index=message_index,
                         content_index=0, delta=word, logprobs=[])

        def end_answer(text: str) -> bytes:
            if tool is not None:
                out = event("response.function_call_arguments.done", item_id=item_ids[1], output_index=message_index,
                            arguments=text)
            else:
                out = (event("response.output_text.done", item_id=item_ids[1], output_index=message_index,
                             content_index=0, text=text, logprobs=[])
                       + event("response.content_part.done", item_id=item_ids[1], output_index=message_index,
                               content_index=0, part=_output_text(text)))
            return out + event("response.output_item.done", output_index=message_index,
                               item=self._answer_item(job, item_ids, text, "completed"))

        def piece(index: int, token_id: int) -> bytes:
            word = render(token_id)
            if index < r:
                thought.append(word)
                return event("response.reasoning_text.delta", item_id=item_ids[0], output_index=0, content_index=0,
                             delta=word)
            head = (end_reasoning() if r else b"") + start_answer() if index == r else b""
            return head + delta(index, word)

        def closing(count: int) -> bytes:
            out = []
            text = "".join(said) if count > r else None
            if text is None:  # all reasoning (or cut short inside it): no message item
                out.append(end_reasoning() if r else b"")
            else:
                out.append(end_answer(text))
            reasoning = "".join(thought) if r else None
            whole = self._response(job, response_id, created, self._output(job, item_ids, reasoning, text),
                                   self._usage(job, count), "completed")
            self._remember(job, response_id, text)
            out.append(event("response.completed", response=whole))
            return b"".join(out)

        def failure(message: str) -> bytes:
            return event("error", code="server_error", message=message, param=None)

        opening_doc = self._response(job, response_id, created, [], None, "in_progress")
        opening = event("response.created", response=opening_doc) + event("response.in_progress", response=opening_doc)
        if r:
            opening += event("response.output_item.added", output_index=0,
                             item=self._reasoning_item(item_ids[0], None, "in_progress"))
        return await self.stream_tokens(request, job, content_type="text/event-stream", opening=opening, piece=piece,
                                        closing=closing, failure=failure)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def add_routes(app: web.Application, routes: ResponsesRoutes) -> None:
    app.router.add_post("/v1/responses", routes.handle)
