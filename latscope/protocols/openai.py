"""OpenAI-compatible text generation: /v1/chat/completions and /v1/completions, SSE streaming or not.

Works with any server that speaks the OpenAI wire format (vLLM, TGI, SGLang, llama.cpp, Ollama, the
reference server, OpenAI itself). Per request the client builds the JSON body from the class's
endpoint and the request's payload (`prepare`, timed: `encode`; ahead of the send, see engine.py),
posts it on the shared keep-alive pool (http.py) and, for a stream, parses the Server-Sent Events
*as the body pieces arrive*, inside the connection's read callback:

- every chunk that carries generated text is a token event stamped with the `perf_counter_ns` of the
  socket read it came in (`token_ns`) — the engine turns these into ttft / itl / tpot; a role-only
  first chunk (`delta: {role, content: ""}`) is not a token. A token chunk is of one of two kinds:
  *content* (the answer itself: `choices[0].text` for completions, `delta.content` or
  `delta.tool_calls` for chat) or *reasoning* (a reasoning model's thinking before it answers:
  `delta.reasoning_content` as DeepSeek and vLLM write it, or `delta.reasoning`, with no content).
  A chunk with both is content (the answer has begun). `reasoning_chunks` counts the reasoning ones;
  `content_ns` is the read time of the first content chunk (0: the stream had none), from which
  intervals.py takes ttfot, reasoning_time and content_tpot;
- a chunk with `usage` gives the output (and prompt) token counts, and the reasoning tokens among the
  output (`completion_tokens_details.reasoning_tokens`: `reasoning_tokens`, -1 when not said);
  without one the token chunks are counted (`tokens_from_usage` False); `prompt_from_usage` says the
  prompt count is the server's (`usage.prompt_tokens`), not the plan's;
- `data: [DONE]` ends the stream; the CPU time spent parsing events is `decode`.

An empty answer is an answer: a stream that ends with `[DONE]` without a single token chunk (a model
whose first token ended it), or a whole answer with empty text, completes with 0 output tokens
(`token_ns` an empty list for the stream; intervals.py counts it `empty` and records no ttft).

Tool calls (`delta.tool_calls`, `message.tool_calls`) are accumulated and counted, and an agent class
sends its `tools` (tools.py).

Sessions (`history: carry`): the answer the server gave joins the history the next turn sends, as an
`assistant` message (chat, with its tool calls: the next turn's text answers them as `tool` messages,
tools.py) or appended text (completions). Its reasoning is left out, as OpenAI,
DeepSeek and vLLM recommend (a server may even refuse it back); `session.carry_reasoning: true`
keeps it, on the assistant message under the field the server streamed it in (`reasoning_content`
or `reasoning`). A completions answer has no separate reasoning: its text is carried whole.

Everything a stream can get wrong is a `protocol` error whose reason names it (status stays as
received): a non-SSE content type, an event that is not JSON, an error event (with the server's
message), a connection lost after the response started ("stream truncated after N tokens"), a stream
that ends without `[DONE]`. HTTP >= 400 is http_4xx / http_5xx with the OpenAI error message from the
body when it has one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from latscope.protocols.http import (Failure, HttpPool, Response, http_error, prefix_or_refusal, refused_outcome,
                                     refused_what, request_id_line, request_id_name, what_it_sends,
                                     with_server_headers)
from latscope.protocols.json_text import (clip, dumps, error_message, escaped, loads, lone_surrogate, parse_json,
                                            tokens_text)
from latscope.protocols.stream_sink import SseSink, failed_outcome, stream_outcome
from latscope.protocols.tools import CHAT, ToolCall, declared, into, split_words, whole_chat, with_reports
from latscope.records import Outcome, Request
from latscope.scenario import Endpoint, Scenario
from latscope.workload import Payloads

_pc = time.perf_counter_ns


class _Stream(SseSink):
    """The body sink of one streamed request (stream_sink.py): chat and completions chunks, tokens
    stamped with read times, the reasoning's pieces too (carry_reasoning, workload.tokenizer)."""

    END = "data: [DONE]"
    __slots__ = ("thought", "thought_key")

    def __init__(self, keep_text: bool = False, keep_reasoning: bool = False) -> None:
        SseSink.__init__(self, keep_text)
        self.thought: list[str] | None = [] if keep_reasoning else None  # the reasoning's pieces (carry_reasoning)
        self.thought_key = "reasoning_content"  # the delta field the reasoning came in

    def _events(self, events: list[tuple[bytes, bytes]], read_ns: int) -> None:
        for kind, data in events:
            self.events += 1
            if data == b"[DONE]":
                self.done = True
                return
            try:
                chunk = parse_json(data)
            except (ValueError, RecursionError):
                if data.strip() == b"[DONE]":
                    self.done = True
                    return
                self.error = f"malformed SSE event after {tokens_text(len(self.token_ns))} (not JSON): {clip(data)}"
                return
            if type(chunk) is not dict:
                self.error = (f"malformed SSE event after {tokens_text(len(self.token_ns))} (not a JSON object): "
                              f"{clip(data)}")
                return
            error = chunk.get("error")
            if error or kind == b"error":
                self.error = f"error event after {tokens_text(len(self.token_ns))}: {error_message(error or chunk)}"
                return
            choices = chunk.get("choices")
            if choices and type(choices) is list:
                choice = choices[0]
                if type(choice) is dict:
                    text = choice.get("text")
                    thought = None
                    if not text:
                        delta = choice.get("delta")
                        if type(delta) is dict:
                            text = delta.get("content")
                            if (calls := delta.get("tool_calls")) and type(calls) is list:
                                self.calls.chat_items(calls)
                                text = text or calls
                            thought = delta.get("reasoning_content")
                            if not thought and (thought := delta.get("reasoning")):
                                self.thought_key = "reasoning"
                    if text:
                        self.token_ns.append(read_ns)
                        if not self.content_ns:
                            self.content_ns = read_ns
                        if self.text is not None and type(text) is str:
                            self.text.append(text)
                    elif thought:
                        self.token_ns.append(read_ns)
                        self.reasoning_chunks += 1
                    if thought and self.thought is not None and type(thought) is str:
                        self.thought.append(thought)
            usage = chunk.get("usage")
            if usage and type(usage) is dict:
                self.usage = usage


def _usage_into(outcome: Outcome, usage: Any) -> bool:
    """Token counts from an OpenAI `usage` object; False when it has no completion count."""
    if type(usage) is not dict:
        return False
    prompt = usage.get("prompt_tokens")
    if type(prompt) is int and prompt >= 0:
        outcome.prompt_tokens, outcome.prompt_from_usage = prompt, True
    details = usage.get("prompt_tokens_details")
    if type(details) is dict and type(cached := details.get("cached_tokens")) is int and cached >= 0:
        outcome.cached_tokens = cached
    details = usage.get("completion_tokens_details")
    if type(details) is dict and type(reasoning := details.get("reasoning_tokens")) is int and reasoning >= 0:
        outcome.reasoning_tokens = reasoning
    completion = usage.get("completion_tokens")
    if type(completion) is int and completion >= 0:
        outcome.output_tokens, outcome.tokens_from_usage = completion, True
        return True
    return False


def _answer_text(choice: Any) -> str:
    """The text of a whole answer's first choice: `message.content` (chat) or `text` (completions)."""
    if type(choice) is not dict:
        return ""
    message = choice.get("message")
    text = message.get("content") if type(message) is dict else choice.get("text")
    return text if type(text) is str else ""


def _answer_reasoning(choice: Any) -> tuple[str, str]:
    """A whole chat answer's reasoning and the field it came in (`message.reasoning_content` or
    `message.reasoning`); ("", …) when it has none."""
    message = choice.get("message") if type(choice) is dict else None
    if type(message) is dict:
        for key in ("reasoning_content", "reasoning"):
            if type(text := message.get(key)) is str and text:
                return text, key
    return "", "reasoning_content"


@dataclass(frozen=True, slots=True)
class _ClassRequest:
    """What every request of one workload class shares."""

    chat: bool
    stream: bool
    head: bytes  # the body's start: `{"model":"m",` (or `{`)
    tail: bytes  # its fields after the prompt and max_tokens (stream, options, tools, extra_body), serialized once
    max_tokens: bool  # the request's max_tokens is sent (False: extra_body gives one)
    prefix: bytes  # request line and headers without Content-Length
    request_id: bytes | None  # target.request_id_header and the run's id prefix (http.request_id_name)
    refused: str | None = None  # why the request cannot be written (http.unsafe_head): each one is an error
    sends: str | None = None  # what it carries beyond the plain request (http.what_it_sends)
    carry_reasoning: bool = False  # session.carry_reasoning: a carried answer keeps its reasoning (chat)


def _class_request(endpoint: Endpoint, scenario: Scenario, cls: int = 0, tools: list[str] | None = None) -> _ClassRequest:
    """`tools`: an agent class's tools' descriptions (Payloads.tool_descriptions), sent as `tools`."""
    options = endpoint.openai
    session = scenario.workload.effective_classes()[cls].conversation
    rest: dict[str, Any] = {"stream": options.stream}
    if options.stream and options.include_usage:
        rest["stream_options"] = {"include_usage": True}
    if tools is not None:
        rest["tools"] = declared(CHAT, tools)
    rest.update(options.extra_body)
    stream = bool(rest.get("stream"))
    model = endpoint.model if "model" not in rest else None
    head = b'{"model":%s,' % dumps(model).encode() if model is not None else b"{"
    prefix, refused = prefix_or_refusal(endpoint, "application/json")
    return _ClassRequest(options.api == "chat", stream, head, dumps(rest).encode()[1:-1], "max_tokens" not in rest, prefix,
                         request_id_name(endpoint, scenario), refused, what_it_sends(endpoint),
                         session is not None and session.carry_reasoning)


class OpenAIClient:
    """OpenAI-compatible requests for some workload classes of one (protocol, URL)."""

    def __init__(self, scenario: Scenario, classes: list[int], payloads: Payloads) -> None:
        self._pool = HttpPool(scenario.endpoint(classes[0]).url, scenario.target.timeout,
                              scenario.limits.max_response_bytes)
        self._payloads = payloads
        self._classes = {c: _class_request(scenario.endpoint(c), scenario, c, payloads.tool_descriptions(c))
                         for c in classes}

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    def prepare(self, request: Request) -> None:
        """The request's bytes: its JSON body built from the payload (timed: `encode`)."""
        cls = self._classes[request.cls]
        if cls.refused:
            return
        started = _pc()
        payload = self._payloads.get(request)
        prompt = payload.prompt if payload.prompt is not None else ""
        fields = cls.tail
        if payload.max_tokens and cls.max_tokens:
            fields = b'"max_tokens":%d,%s' % (payload.max_tokens, fields) if fields else b'"max_tokens":%d' % payload.max_tokens
        if request.session is not None:
            text = self._session_body(cls, request, prompt)
        elif cls.chat:
            text = b'"messages":[{"role":"user","content":%s}]' % dumps(prompt).encode()
        else:
            text = b'"prompt":%s' % dumps(prompt).encode()
        body = b"%s%s%s%s}" % (cls.head, text, b"," if fields else b"", fields)
        request.wire = b"%s%sContent-Length: %d\r\n\r\n%s" % (cls.prefix, request_id_line(cls.request_id, request.seq),
                                                               len(body), body)
        request.wire_bytes = len(request.wire)
        request.prepared_ns = _pc()
        request.encode_ns = request.prepared_ns - started

    def _session_body(self, cls: _ClassRequest, request: Request, text: str) -> bytes:
        """A session turn's prompt field: the shared prefix, the history so far (carried), the new text.
        The history is kept serialized on the conversation and only appended to: the new text here (a
        failed turn ends its session, so its text is never carried), the answer by `_remember`; a long
        history costs a copy per turn, not a JSON encode.

        chat:        "messages": [system prefix, user 1, assistant 1, …, user k]
        completions: "prompt": "prefix\n" + user 1 + answer 1 + "\n" + … + user k
        (JSON escaping works character by character, so the escaped pieces concatenate.)"""
        conv = request.session
        text = with_reports(conv, text)
        if conv.history is None:
            prefix = self._payloads.prefix(conv.cls, conv.prefix) if conv.prefix >= 0 else None
            if cls.chat:
                conv.history = bytearray(b'{"role":"system","content":%s}' % dumps(prefix).encode() if prefix else b"")
            else:
                conv.history = bytearray(escaped(prefix + "\n") if prefix else b"")
        if conv.calls:  # an agent's round: its tool result answers each call the model made (tools.py)
            parts = split_words(text, len(conv.calls))
            turn = b"".join(b',{"role":"tool","tool_call_id":%s,"content":%s}' % (dumps(call_id).encode(), dumps(part).encode())
                            for (call_id, _), part in zip(conv.calls, parts))
            conv.calls = ()
        elif cls.chat:
            turn = b'%s{"role":"user","content":%s}' % (b"," if conv.history else b"", dumps(text).encode())
        else:
            turn = escaped(text)
        if conv.carry:
            conv.history += turn
            history, turn = conv.history, b""
        else:
            history = conv.history
        conv.carried = len(conv.history)
        if cls.chat:
            return b'"messages":[%s%s]' % (history, turn)
        return b'"prompt":"%s%s"' % (history, turn)

    @staticmethod
    def _remember(cls: _ClassRequest, request: Request, answer: str, reasoning: tuple[str, str] | None = None,
                  calls: list[ToolCall] | None = None) -> str | None:
        """After a session turn's answer: the answer, as the server gave it, joins the history the next
        turn carries (after the turn's own text, added when it was built), with the tool calls it made
        (tools.py; the next round answers them); its reasoning (text, the field it came in) only with
        session.carry_reasoning (the module docstring). Returns why it cannot (the answer's `protocol`
        error): text that is not valid Unicode, which no request can carry."""
        conv = request.session
        if not cls.chat:
            try:
                piece = escaped(answer + "\n")
            except UnicodeEncodeError as exc:  # UTF-8 refuses only surrogates, which json.loads lets through
                return lone_surrogate(exc, answer)
        else:
            message: dict[str, Any] = {"role": "assistant", "content": answer or (None if calls else "")}
            if reasoning and reasoning[0]:
                message[reasoning[1]] = reasoning[0]
            if calls:
                message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                         for i, n, a in calls]
            try:
                piece = b",%s" % dumps(message).encode()
            except UnicodeEncodeError as exc:  # in the answer, its reasoning or a call's arguments
                return lone_surrogate(exc, answer, reasoning[0] if reasoning else "", *(a for *_, a in calls or ()))
            conv.calls = tuple((i, n) for i, n, _ in calls or ())
        conv.history += piece
        conv.carried = len(conv.history)
        return None

    async def send(self, request: Request) -> Outcome:
        """One request, prepared already (or now); `sent_ns` is stamped before a connection is taken
        (a connect is service time). Never raises for a failed request: the Outcome says what went wrong."""
        cls = self._classes[request.cls]
        if cls.refused:
            return refused_outcome(cls.refused)
        if request.wire is None:
            self.prepare(request)
        data, encode_ns = request.wire, request.encode_ns
        body_len = len(data) - data.index(b"\r\n\r\n") - 4
        conv = request.session
        # a later turn carries this answer, or the job a sub-agent reports to
        keep = conv is not None and conv.carry and (request.turn < conv.turns or conv.reports_to is not None)
        counts = self._payloads.counts_output  # workload.tokenizer counts an answer that came without usage
        sent = _pc()
        stream = _Stream(keep or counts, (keep and cls.carry_reasoning) or counts) if cls.stream else None
        try:
            response = await self._pool.request(data, keep_body=stream is None, sink=stream)
        except Failure as failure:
            return failed_outcome(failure, sent, body_len, encode_ns, stream)
        outcome = Outcome(sent, response.end_ns, status=response.status, bytes_out=body_len,
                          bytes_in=response.body_len, encode_ns=encode_ns)
        with_server_headers(outcome, response)
        reasoning = None
        if stream is None:
            outcome, answer, reasoning, calls = self._whole(outcome, response, keep or counts)
        else:
            outcome = self._streamed(outcome, response, stream)
            calls = stream.calls.done()
            answer = "".join(stream.text) if keep or counts else None
            if stream.thought:
                reasoning = "".join(stream.thought), stream.thought_key
        if counts:  # all it generated: usage's completion_tokens count the reasoning too
            self._payloads.count_output(outcome, (reasoning[0] if reasoning else "") + (answer or ""))
        refused_what(outcome, cls.sends)
        if (keep and outcome.error is None and (problem := self._remember(
                cls, request, answer or "", reasoning if cls.carry_reasoning else None, calls)) is not None):
            outcome.error, outcome.reason = "protocol", problem
        elif keep and conv.reports_to is not None:
            conv.answer = answer or ""
        return outcome

    @staticmethod
    def _streamed(outcome: Outcome, response: Response, stream: _Stream) -> Outcome:
        if stream_outcome(outcome, response, stream) and not _usage_into(outcome, stream.usage):
            outcome.output_tokens = len(stream.token_ns)
        return outcome

    @staticmethod
    def _whole(outcome: Outcome, response: Response,
               keep: bool) -> tuple[Outcome, str | None, tuple[str, str] | None, list[ToolCall]]:
        """A whole (not streamed) answer and its tool calls; with `keep`, its text and reasoning too (for a
        session's history)."""
        body = response.body or b""
        if response.status >= 400:
            return http_error(outcome, response, body), None, None, []
        started = _pc()
        try:
            doc = loads(body)
        except (ValueError, RecursionError):
            doc = None
        outcome.decode_ns = _pc() - started
        if type(doc) is not dict:
            outcome.error, outcome.reason = "protocol", f"response is not a JSON object: {clip(body)}"
        elif doc.get("error"):
            outcome.error = "protocol"
            outcome.reason = f"error in a {response.status} response: {error_message(doc['error'])}"
        elif not doc.get("choices") or type(doc["choices"]) is not list:
            outcome.error, outcome.reason = "protocol", f"response has no choices: {clip(body)}"
        else:
            _usage_into(outcome, doc.get("usage"))
            choice = doc["choices"][0]
            calls = whole_chat(choice.get("message") if type(choice) is dict else None)
            into(outcome, calls)
            if keep:
                return outcome, _answer_text(choice), _answer_reasoning(choice), calls
            return outcome, None, None, calls
        return outcome, None, None, []
