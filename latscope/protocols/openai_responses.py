"""OpenAI's Responses API: POST /v1/responses, streamed as typed events or answered whole.

The body: `{"model", "input": the prompt, "max_output_tokens": the planned answer length (left out when
the class plans none), "stream", ...openai.extra_body}` (the class's `openai:` options: `stream` and
`extra_body`; `api` and `include_usage` do not apply, the final event always carries the usage).

A stream (stream_events.py: parsed as it arrives, each token chunk stamped with its socket read's
perf_counter_ns) is read by each event's `type`:

| event | what latscope takes |
| --- | --- |
| `response.output_text.delta`, `response.refusal.delta` | a content token chunk, the answer's text (`delta`, a string; an empty one is no token) |
| `response.function_call_arguments.delta` | a content token chunk: a piece of a tool call's arguments (tools.py) |
| `response.output_item.added` | a `function_call` item starts a tool call (tools.py) |
| `response.reasoning_text.delta`, `response.reasoning_summary_text.delta` | a reasoning token chunk |
| `response.completed`, `response.incomplete` | the end (an incomplete answer, cut at max_output_tokens, is an answer); `response.usage` |
| `response.failed` | a `protocol` error: "response failed after N tokens: <response.error.message>" |
| `error` | a `protocol` error: "error event after N tokens: <message>" |
| anything else (`response.created`, `*.added`, `*.done`, ...) | nothing |

The usage: `input_tokens` (prompt_tokens, prompt_from_usage), `input_tokens_details.cached_tokens`,
`output_tokens` (output_tokens, tokens_from_usage), `output_tokens_details.reasoning_tokens`. A stream
that ends without `response.completed` (or `.incomplete`, `.failed`) is a `protocol` error, so is a
delta whose `delta` is not a string.

A whole answer: `{"status", "output": [items], "usage", "error"}`; its text is the `output_text` parts of
its `message` items (its `reasoning` items' text and `function_call` arguments are what a tokenizer counts
besides); `"error"` not null, or `"status": "failed"`, is a `protocol` error with its message,
an `output` that is not a list too.

Sessions carry their input (stream_events.py: the history is sent as input messages, `instructions`
holds a shared prefix; `previous_response_id` is never used).
"""

from __future__ import annotations

from typing import Any

from latscope.protocols.http import prefix_or_refusal, request_id_name, what_it_sends
from latscope.protocols.json_text import clip, dumps, error_message
from latscope.protocols.stream_events import (ANSWER, REASONING, TOOL, ClassRequest, EventClient, EventStream,
                                              class_request, count, output_into)
from latscope.protocols.tools import RESPONSES, ToolCall, ToolCalls, declared, split_words
from latscope.records import Outcome
from latscope.scenario import Scenario

DELTAS = {"response.output_text.delta": ANSWER, "response.refusal.delta": ANSWER,
          "response.function_call_arguments.delta": TOOL, "response.reasoning_text.delta": REASONING,
          "response.reasoning_summary_text.delta": REASONING}  # event -> what its delta carries
ENDS = frozenset({"response.completed", "response.incomplete"})


class ResponsesStream(EventStream):
    END = "response.completed"
    __slots__ = ()

    def on_event(self, event: str, doc: dict, data: bytes, read_ns: int) -> None:
        kind = DELTAS.get(event)
        if kind is not None:
            delta = doc.get("delta")
            if type(delta) is not str:
                return self.malformed(f"{event} without a text delta", data)
            if delta:
                self.token(read_ns, delta, kind)
                if kind == TOOL:
                    self.calls.add(doc.get("output_index"), delta)
        elif event == "response.output_item.added":
            item = doc.get("item")
            if type(item) is dict and item.get("type") == "function_call":
                self.calls.start(doc.get("output_index"), item.get("call_id"), item.get("name"))
        elif event in ENDS:
            response = doc.get("response")
            if type(response) is not dict:
                return self.malformed(f"{event} without a response object", data)
            if type(usage := response.get("usage")) is dict:
                self.usage = usage
            self.done = True
        elif event == "response.failed":
            response = doc.get("response")
            error = response.get("error") if type(response) is dict else None
            self.failed("response failed", error or "(no message)")
        elif event == "error":
            self.failed("error event", doc.get("error") or doc)


class ResponsesClient(EventClient):
    """OpenAI Responses API requests for some workload classes of one (protocol, URL)."""

    Stream = ResponsesStream
    MESSAGES = b'"input"'
    SYSTEM = b'"instructions"'

    def _class_request(self, scenario: Scenario, cls: int, tools: list[str] | None) -> ClassRequest:
        endpoint = scenario.endpoint(cls)
        rest: dict[str, Any] = {"stream": endpoint.openai.stream, **endpoint.openai.extra_body}
        if tools is not None:
            rest["tools"] = declared(RESPONSES, tools)
        prefix, refused = prefix_or_refusal(endpoint, "application/json")
        return class_request(bool(rest.get("stream")), endpoint.model, rest, "max_output_tokens", 0, prefix,
                             request_id_name(endpoint, scenario), refused, what_it_sends(endpoint))

    def prompt(self, text: str) -> bytes:
        return b'"input":%s' % dumps(text).encode()

    @staticmethod
    def called(answer: str, calls: list[ToolCall]) -> bytes:
        said = b',{"role":"assistant","content":%s}' % dumps(answer).encode() if answer else b""
        return said + b"".join(b",%s" % dumps({"type": "function_call", "call_id": i, "name": n, "arguments": a}).encode()
                               for i, n, a in calls)

    @staticmethod
    def answered(calls: tuple[tuple[str, str], ...], text: str) -> bytes:
        return b"".join(b',{"type":"function_call_output","call_id":%s,"output":%s}' % (dumps(i).encode(), dumps(part).encode())
                        for (i, _), part in zip(calls, split_words(text, len(calls))))

    @staticmethod
    def whole_calls(doc: dict[str, Any]) -> list[ToolCall]:
        calls = ToolCalls()
        for k, item in enumerate(doc.get("output") or ()):
            if type(item) is dict and item.get("type") == "function_call":
                calls.start(k, item.get("call_id"), item.get("name"))
                calls.add(k, item["arguments"] if type(item.get("arguments")) is str else "")
        return calls.done()

    @staticmethod
    def usage_into(outcome: Outcome, usage: dict[str, Any]) -> bool:
        if type(usage) is not dict:
            return False
        if (prompt := count(usage.get("input_tokens"))) is not None:
            outcome.prompt_tokens, outcome.prompt_from_usage = prompt, True
        details = usage.get("input_tokens_details")
        if type(details) is dict and (cached := count(details.get("cached_tokens"))) is not None:
            outcome.cached_tokens = cached
        return output_into(outcome, usage, "reasoning_tokens")

    @staticmethod
    def whole(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any], str, str]:
        if doc.get("error") or doc.get("status") == "failed":
            return f"response failed: {error_message(doc.get('error') or '(no message)')}", {}, "", ""
        output = doc.get("output")
        if type(output) is not list:
            return f"response has no output list: {clip(doc)}", {}, "", ""
        text, rest = [], []
        for item in output:
            if type(item) is not dict:
                continue
            if item.get("type") == "function_call" and type(item.get("arguments")) is str:
                rest.append(item["arguments"])
            content = item.get("content")
            for part in content if type(content) is list else ():
                if type(part) is dict and type(part.get("text")) is str:
                    if item.get("type") == "message" and part.get("type") == "output_text":
                        text.append(part["text"])
                    elif item.get("type") == "reasoning":
                        rest.append(part["text"])
        return None, doc.get("usage") or {}, "".join(text), "".join(rest)
