"""Anthropic's Messages API: POST /v1/messages, streamed as typed events or answered whole.

The request: headers `anthropic-version` (the class's `anthropic.version`, 2023-06-01 by default) and
`x-api-key` (target.api_key goes there, not into `Authorization: Bearer`; either is left alone when
the scenario's headers give it); the body `{"model", "messages": [{"role": "user", "content": the
prompt}], "max_tokens": the planned answer length, else anthropic.max_tokens (the API requires one),
"stream", ...anthropic.extra_body}` (e.g. `thinking: {type: enabled, budget_tokens: 1024}`).

A stream (stream_events.py: parsed as it arrives, each token chunk stamped with its socket read's
perf_counter_ns) is read by each event's `type`:

| event | what latscope takes |
| --- | --- |
| `message_start` | `message.usage`: the prompt's counts |
| `content_block_delta` | `delta.type` `text_delta` (`text`, the answer's text) and `input_json_delta` (`partial_json`, a tool's input, not text a session carries): a content token chunk; `thinking_delta` (`thinking`): a reasoning token chunk; an empty one is no token; other delta types (`signature_delta`, `citations_delta`) are none |
| `message_delta` | `usage.output_tokens` (the running total: the last one counts) |
| `message_stop` | the end |
| `error` | a `protocol` error: "error event after N tokens: <error.message>" |
| `content_block_start` | a `tool_use` block starts a tool call (tools.py); others nothing |
| `ping`, `content_block_stop`, anything new | nothing (the API may add event types) |

The usage: prompt_tokens = `input_tokens` + `cache_creation_input_tokens` + `cache_read_input_tokens`
(Anthropic counts the cached part apart, OpenAI's prompt_tokens include it), cached_tokens =
`cache_read_input_tokens`, output_tokens = `output_tokens` (thinking included), reasoning_tokens =
`output_tokens_details.thinking_tokens` where the server says it (recent API versions do; else -1, and
intervals.py counts the reasoning chunks). A stream that ends without `message_stop` is a `protocol`
error, so is a `content_block_delta` without a delta object or with a text field that is not a string,
or a `message_start` without a message.

A whole answer: `{"type": "message", "content": [blocks], "usage"}`; its text is its `text` blocks (its
`thinking` and `tool_use` blocks are what a tokenizer counts besides); one that says `"type": "error"`
is a `protocol` error with its message, a `content` that is not a list too.

Sessions carry their messages (stream_events.py; a shared prefix is the `system` field). An empty
answer is not carried: the API refuses an assistant message without content.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from latscope.protocols.http import prefix_or_refusal, request_id_name, what_it_sends
from latscope.protocols.json_text import clip, dumps, error_message
from latscope.protocols.stream_events import (ANSWER, REASONING, TOOL, ClassRequest, EventClient, EventStream,
                                              class_request, count, output_into)
from latscope.protocols.tools import MESSAGES, ToolCall, arguments_object, declared, split_words
from latscope.records import Outcome
from latscope.scenario import Endpoint, Scenario

DELTA_TEXT = {"text_delta": ("text", ANSWER), "input_json_delta": ("partial_json", TOOL),
              "thinking_delta": ("thinking", REASONING)}  # delta type -> (its text field, what it carries)
PROMPT_COUNTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class MessagesStream(EventStream):
    END = "message_stop"
    __slots__ = ()

    def on_event(self, event: str, doc: dict, data: bytes, read_ns: int) -> None:
        if event == "content_block_delta":
            delta = doc.get("delta")
            if type(delta) is not dict:
                return self.malformed("content_block_delta without a delta object", data)
            kind = DELTA_TEXT.get(delta.get("type"))
            if kind is not None:
                text = delta.get(kind[0])
                if type(text) is not str:
                    return self.malformed(f"{delta['type']} without a string {kind[0]}", data)
                if text:
                    self.token(read_ns, text, kind[1])
                    if kind[1] == TOOL:
                        self.calls.add(doc.get("index"), text)
        elif event == "content_block_start":
            block = doc.get("content_block")
            if type(block) is dict and block.get("type") == "tool_use":
                self.calls.start(doc.get("index"), block.get("id"), block.get("name"))
        elif event == "message_delta":
            if type(usage := doc.get("usage")) is dict:
                self.usage.update(usage)
        elif event == "message_start":
            message = doc.get("message")
            if type(message) is not dict:
                return self.malformed("message_start without a message", data)
            if type(usage := message.get("usage")) is dict:  # its output_tokens is a start value, not the count
                self.usage.update((k, v) for k, v in usage.items() if k != "output_tokens")
        elif event == "message_stop":
            self.done = True
        elif event == "error":
            self.failed("error event", doc.get("error") or doc)


def _headers(endpoint: Endpoint) -> Endpoint:
    """The endpoint with the API's headers: anthropic-version, and target.api_key as x-api-key (the
    scenario's own headers win)."""
    given = {name.lower() for name in endpoint.headers}
    headers = {} if "anthropic-version" in given else {"anthropic-version": endpoint.anthropic.version}
    if endpoint.api_key and "x-api-key" not in given:
        headers["x-api-key"] = endpoint.api_key
    return replace(endpoint, api_key=None, headers={**headers, **endpoint.headers})


class MessagesClient(EventClient):
    """Anthropic Messages API requests for some workload classes of one (protocol, URL)."""

    Stream = MessagesStream
    MESSAGES = b'"messages"'
    SYSTEM = b'"system"'
    CARRY_EMPTY = False

    def _class_request(self, scenario: Scenario, cls: int, tools: list[str] | None) -> ClassRequest:
        endpoint = scenario.endpoint(cls)
        options = endpoint.anthropic
        rest: dict[str, Any] = {"stream": options.stream, **options.extra_body}
        if tools is not None:
            rest["tools"] = declared(MESSAGES, tools)
        prefix, refused = prefix_or_refusal(_headers(endpoint), "application/json")
        return class_request(bool(rest.get("stream")), endpoint.model, rest, "max_tokens", options.max_tokens, prefix,
                             request_id_name(endpoint, scenario), refused, what_it_sends(endpoint))

    def prompt(self, text: str) -> bytes:
        return b'"messages":[{"role":"user","content":%s}]' % dumps(text).encode()

    @staticmethod
    def called(answer: str, calls: list[ToolCall]) -> bytes:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": answer}] if answer else []
        blocks += [{"type": "tool_use", "id": i, "name": n, "input": arguments_object(a) or {}} for i, n, a in calls]
        return b",%s" % dumps({"role": "assistant", "content": blocks}).encode()

    @staticmethod
    def answered(calls: tuple[tuple[str, str], ...], text: str) -> bytes:
        results = [{"type": "tool_result", "tool_use_id": i, "content": part}
                   for (i, _), part in zip(calls, split_words(text, len(calls)))]
        return b",%s" % dumps({"role": "user", "content": results}).encode()

    @staticmethod
    def whole_calls(doc: dict[str, Any]) -> list[ToolCall]:
        return [(b.get("id") if type(b.get("id")) is str else "", b.get("name") if type(b.get("name")) is str else "",
                 dumps(b.get("input")))
                for b in doc.get("content") or () if type(b) is dict and b.get("type") == "tool_use"]

    @staticmethod
    def usage_into(outcome: Outcome, usage: dict[str, Any]) -> bool:
        if type(usage) is not dict:
            return False
        counts = [count(usage.get(name)) for name in PROMPT_COUNTS]
        if counts[0] is not None:
            outcome.prompt_tokens, outcome.prompt_from_usage = sum(c or 0 for c in counts), True
        if counts[2] is not None:
            outcome.cached_tokens = counts[2]
        return output_into(outcome, usage, "thinking_tokens")

    @staticmethod
    def whole(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any], str, str]:
        if doc.get("type") == "error" or doc.get("error"):
            return f"error in the response: {error_message(doc.get('error') or doc)}", {}, "", ""
        content = doc.get("content")
        if type(content) is not list:
            return f"response has no content list: {clip(doc)}", {}, "", ""
        text, rest = [], []
        for block in (b for b in content if type(b) is dict):
            if block.get("type") == "text" and type(block.get("text")) is str:
                text.append(block["text"])
            elif block.get("type") == "thinking" and type(block.get("thinking")) is str:
                rest.append(block["thinking"])
            elif block.get("type") == "tool_use" and block.get("input") is not None:
                rest.append(dumps(block["input"]))
        return None, doc.get("usage") or {}, "".join(text), "".join(rest)
