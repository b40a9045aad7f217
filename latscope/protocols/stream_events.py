"""What the typed-event text protocols share: OpenAI's Responses API (openai_responses.py) and Anthropic's
Messages API (anthropic_messages.py). Both stream Server-Sent Events whose JSON data says its own `type`
(`response.output_text.delta`, `content_block_delta`, ...), both answer whole as a JSON document, both
take a conversation as a list of `{"role", "content"}` messages plus a top-level system text. A client
module says only what differs: the body's field names, which events carry which text, the usage.

Per stream (`EventStream`, the body sink of one request, parsed as the pieces arrive in the
connection's read callback, as openai.py does; what the two share is stream_sink.py's):

- each event's type is its data's `type` field, else its SSE `event:` name; its data must be a JSON
  object. The protocol's `on_event` sees every event and calls `token(read_ns, text, kind)` for each
  one that carries generated text: it is stamped with the `perf_counter_ns` of the socket read it came
  in (`token_ns`, which the engine turns into ttft / itl / tpot). Its kind is ANSWER (the answer's
  text), TOOL (a tool call's input: content, not text a session carries) or REASONING (counted in
  `reasoning_chunks`); the first ANSWER or TOOL chunk's read time is `content_ns`;
- the protocol's end event sets `done`; anything after it is not read. A `data: [DONE]` (which neither
  API sends, and some servers add) is skipped: it does not end the answer;
- the first problem found is `error`, and parsing stops there: `malformed SSE event after N tokens
  (WHY): DATA` (not JSON, not a JSON object, no event type, a field of the wrong type), or the
  protocol's own (an error event with the server's message; an untyped `{"error": ...}` too).

`EventClient` is the client both protocols are: the class's request built once (`prepare` adds the
prompt, the answer length and, for a session, the history), sent on the shared keep-alive pool
(http.py), then the Outcome: token times, `reasoning_chunks`, `content_ns`, and from the server's
usage `prompt_tokens` + `prompt_from_usage`, `cached_tokens`, `output_tokens` + `tokens_from_usage`,
`reasoning_tokens`; without a usage output count the token chunks are counted. An empty answer (a
stream that ends properly without a token chunk, a whole answer without text) completes with 0
output tokens. Protocol errors (status as received): a non-SSE content type, the stream's error,
a connection lost after the response started ("stream truncated after N tokens"), a stream that
ends without its end event; a whole answer that is not a JSON object, says an error, or lacks its
output. HTTP >= 400 is http_4xx / http_5xx with the server's message (http.http_error).

Without usage (a server that leaves it out) and with workload.tokenizer, the output is counted by the
tokenizer on all the generated text, reasoning and tool input included (Payloads.count_output).

Sessions carry their input: each turn sends the system text (a shared prefix) and every earlier turn
and answer as messages, like chat (openai.py), never a server-side id (`previous_response_id`):
every server that speaks the API can answer it, nothing depends on what a server chose to store,
and the request grows turn by turn exactly as a chat session's does, so the two compare. The history
is kept serialized on the conversation (`_History`) and only appended to; an answer's tool calls and the
next round's tool results join it as each API represents them (tools.py). Reasoning is never carried:
both APIs carry it only as items the server signed or encrypted, which the streamed text cannot rebuild.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from latscope.protocols.http import (Failure, HttpPool, Response, http_error, refused_outcome, refused_what,
                                     request_id_line, with_server_headers)
from latscope.protocols.json_text import clip, dumps, error_message, loads, lone_surrogate, parse_json, tokens_text
from latscope.protocols.stream_sink import SseSink, failed_outcome, stream_outcome
from latscope.protocols.tools import ToolCall, into, with_reports
from latscope.records import Outcome, Request
from latscope.scenario import Scenario
from latscope.workload import Payloads

_pc = time.perf_counter_ns
ANSWER, TOOL, REASONING = 0, 1, 2  # what a token chunk carries (EventStream.token)


class EventStream(SseSink):
    """The body sink of one streamed request (the module docstring; stream_sink.py); a protocol subclasses
    it with its `on_event` and END (its end event's type, named in the reason of a stream that lacks it)."""

    __slots__ = ("rest",)

    def __init__(self, keep_text: bool = False, keep_rest: bool = False) -> None:
        SseSink.__init__(self, keep_text)
        self.usage: dict[str, Any] = {}  # the usage the events gave, merged (the protocol's own fields)
        self.rest: list[str] | None = [] if keep_rest else None  # the reasoning's and tool inputs' (to count them)

    def _events(self, events: list[tuple[bytes, bytes]], read_ns: int) -> None:
        for kind, data in events:
            self.events += 1
            if data == b"[DONE]":
                continue
            try:
                doc = parse_json(data)
            except (ValueError, RecursionError):
                self.malformed("not JSON", data)
                return
            if type(doc) is not dict:
                self.malformed("not a JSON object", data)
                return
            event = doc.get("type") or kind.decode("utf-8", "replace")
            if not event and doc.get("error"):  # an OpenAI-style error object without a type (vLLM writes them)
                self.failed("error event", doc["error"])
                return
            if not event or type(event) is not str:
                self.malformed("no event type", data)
                return
            self.on_event(event, doc, data, read_ns)
            if self.error is not None or self.done:
                return

    def on_event(self, event: str, doc: dict, data: bytes, read_ns: int) -> None:
        raise NotImplementedError

    def token(self, read_ns: int, text: str, kind: int) -> None:
        """A chunk of generated text read at `read_ns`: ANSWER, TOOL or REASONING."""
        self.token_ns.append(read_ns)
        if kind == REASONING:
            self.reasoning_chunks += 1
        elif not self.content_ns:
            self.content_ns = read_ns
        if kind == ANSWER:
            if self.text is not None:
                self.text.append(text)
        elif self.rest is not None:
            self.rest.append(text)

    def malformed(self, why: str, data: bytes) -> None:
        self.error = f"malformed SSE event after {tokens_text(len(self.token_ns))} ({why}): {clip(data)}"

    def failed(self, what: str, error: Any) -> None:
        """The server said the answer failed (`what`: "error event", ...), with its message."""
        self.error = f"{what} after {tokens_text(len(self.token_ns))}: {error_message(error)}"


def count(value: Any) -> int | None:
    """A usage count: an integer >= 0, else None."""
    return value if type(value) is int and value >= 0 else None


def output_into(outcome: Outcome, usage: dict[str, Any], reasoning: str) -> bool:
    """A usage's output counts into `outcome`: `output_tokens` (output_tokens, tokens_from_usage) and the
    reasoning tokens among them (`output_tokens_details.<reasoning>`); False when it says no output count."""
    details = usage.get("output_tokens_details")
    if type(details) is dict and (thinking := count(details.get(reasoning))) is not None:
        outcome.reasoning_tokens = thinking
    if (output := count(usage.get("output_tokens"))) is not None:
        outcome.output_tokens, outcome.tokens_from_usage = output, True
        return True
    return False


@dataclass(frozen=True, slots=True)
class ClassRequest:
    """What every request of one workload class shares."""

    stream: bool
    head: bytes  # the body's start: `{"model":"m",` (or `{`)
    tail: bytes  # the body's fields after the prompt, serialized without braces: `"stream":true,...` (or b"")
    max_field: bytes  # the answer length's field name, quoted: b'"max_output_tokens"' (b"": extra_body gives it)
    max_default: int  # sent when the request plans no answer length (0: the field is left out)
    prefix: bytes  # request line and headers without Content-Length
    request_id: bytes | None  # target.request_id_header and the run's id prefix (http.request_id_name)
    refused: str | None = None  # why the request cannot be written (http.unsafe_head): each one is an error
    sends: str | None = None  # what it carries beyond the plain request (http.what_it_sends)


class _History:
    """A session's history as the body carries it: the system field (`"system":"...",`, or nothing)
    and the messages so far, serialized, comma-separated."""

    __slots__ = ("system", "messages")

    def __init__(self, system: bytes) -> None:
        self.system, self.messages = system, bytearray()

    def size(self) -> int:
        """Its bytes (Conversation.carried)."""
        return len(self.system) + len(self.messages)


def class_request(stream: bool, model: str | None, rest: dict[str, Any], max_field: str, max_default: int,
                  prefix: bytes, request_id: bytes | None, refused: str | None, sends: str | None) -> ClassRequest:
    """A ClassRequest from the class's settings: `rest` are the body's fields after the prompt and the
    answer length (stream, extra_body, ...); an answer length in `rest` (extra_body) is the only one sent."""
    if max_field in rest:
        max_field, max_default = "", 0
    head = b'{"model":%s,' % dumps(model).encode() if model is not None else b"{"
    quoted = dumps(max_field).encode() if max_field else b""
    return ClassRequest(stream, head, dumps(rest).encode()[1:-1], quoted, max_default, prefix, request_id, refused, sends)


class EventClient:
    """A typed-event protocol's client for some workload classes of one (protocol, URL). A protocol
    subclass gives the field names and `_class_request`, `Stream`, `usage_into`, `whole`, and how its
    context carries tool calls (`called`, `answered`)."""

    Stream: ClassVar[type[EventStream]]
    MESSAGES: ClassVar[bytes]  # the field that carries the messages (a session's)
    SYSTEM: ClassVar[bytes]  # the top-level field that carries a session's system text
    CARRY_EMPTY: ClassVar[bool] = True  # an empty answer joins a session's history (False: left out)

    def __init__(self, scenario: Scenario, classes: list[int], payloads: Payloads) -> None:
        self._pool = HttpPool(scenario.endpoint(classes[0]).url, scenario.target.timeout,
                              scenario.limits.max_response_bytes)
        self._payloads = payloads
        self._classes = {c: self._class_request(scenario, c, payloads.tool_descriptions(c)) for c in classes}

    def _class_request(self, scenario: Scenario, cls: int, tools: list[str] | None) -> ClassRequest:
        """`tools`: an agent class's tools' descriptions (Payloads.tool_descriptions), sent as `tools`."""
        raise NotImplementedError

    @staticmethod
    def called(answer: str, calls: list[ToolCall]) -> bytes:
        """The context's pieces for an answer with tool calls (tools.py), each after a comma."""
        raise NotImplementedError

    @staticmethod
    def answered(calls: tuple[tuple[str, str], ...], text: str) -> bytes:
        """The context's pieces for a round's tool result answering `calls` (tools.py), each after a comma."""
        raise NotImplementedError

    def prompt(self, text: str) -> bytes:
        """The body's prompt field of a request outside a session, serialized: `"input":"..."`."""
        raise NotImplementedError

    @staticmethod
    def usage_into(outcome: Outcome, usage: dict[str, Any]) -> bool:
        """The usage's counts into `outcome`; False when it says no output count."""
        raise NotImplementedError

    @staticmethod
    def whole(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any], str, str]:
        """A whole answer's JSON object: (why it is not an answer, or None; its usage; its text; the rest of
        what it generated: reasoning, tool input)."""
        raise NotImplementedError

    @staticmethod
    def whole_calls(doc: dict[str, Any]) -> list[ToolCall]:
        """A whole answer's tool calls (tools.py)."""
        raise NotImplementedError

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
        answer = (payload.max_tokens or cls.max_default) if cls.max_field else 0
        fields = b"%s:%d" % (cls.max_field, answer) if answer else b""
        if cls.tail:
            fields = b"%s,%s" % (fields, cls.tail) if fields else cls.tail
        if request.session is not None:
            text = self._session_messages(request, prompt)
        else:
            text = self.prompt(prompt)
        body = b"%s%s%s%s}" % (cls.head, text, b"," if fields else b"", fields)
        request.wire = b"%s%sContent-Length: %d\r\n\r\n%s" % (cls.prefix, request_id_line(cls.request_id, request.seq),
                                                               len(body), body)
        request.wire_bytes = len(request.wire)
        request.prepared_ns = _pc()
        request.encode_ns = request.prepared_ns - started

    def _session_messages(self, request: Request, text: str) -> bytes:
        """A session turn's system and messages fields: `"system":"prefix","messages":[user 1, assistant 1,
        ..., user k]`. The turn's text joins the carried history here (a failed turn ends its session,
        so its text is never carried), the answer in `_remember`."""
        conv = request.session
        text = with_reports(conv, text)
        if conv.history is None:
            prefix = self._payloads.prefix(conv.cls, conv.prefix) if conv.prefix >= 0 else None
            conv.history = _History(b'%s:%s,' % (self.SYSTEM, dumps(prefix).encode()) if prefix else b"")
        history: _History = conv.history
        if conv.calls:  # an agent's round: its tool result answers the calls the model made
            turn, conv.calls = self.answered(conv.calls, text), ()
        else:
            turn = b'%s{"role":"user","content":%s}' % (b"," if history.messages else b"", dumps(text).encode())
        if conv.carry:
            history.messages += turn
            turn = b""
        conv.carried = history.size()
        return b"%s%s:[%s%s]" % (history.system, self.MESSAGES, history.messages, turn)

    def _remember(self, request: Request, answer: str, calls: list[ToolCall]) -> str | None:
        """After a session turn's answer: the answer joins the history the next turn carries, as an
        assistant message, with the tool calls it made (`called`; the next round answers them). Returns
        why it cannot (the answer's `protocol` error): text that is not valid Unicode, which no request
        can carry."""
        if not answer and not self.CARRY_EMPTY and not calls:
            return None
        conv = request.session
        try:
            piece = (self.called(answer, calls) if calls
                     else b',{"role":"assistant","content":%s}' % dumps(answer).encode())
        except UnicodeEncodeError as exc:  # UTF-8 refuses only surrogates, which json.loads lets through
            return lone_surrogate(exc, answer, *(a for *_, a in calls))
        conv.calls = tuple((i, n) for i, n, _ in calls)
        conv.history.messages += piece
        conv.carried = conv.history.size()
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
        counts = self._payloads.counts_output  # workload.tokenizer counts an answer without usage
        sent = _pc()
        stream = self.Stream(keep or counts, counts) if cls.stream else None
        try:
            response = await self._pool.request(data, keep_body=stream is None, sink=stream)
        except Failure as failure:
            outcome = failed_outcome(failure, sent, body_len, encode_ns, stream)
            if stream is not None:
                outcome.reasoning_chunks, outcome.content_ns = stream.reasoning_chunks, stream.content_ns
            return outcome
        outcome = Outcome(sent, response.end_ns, status=response.status, bytes_out=body_len,
                          bytes_in=response.body_len, encode_ns=encode_ns)
        with_server_headers(outcome, response)
        if stream is None:
            answer, rest, calls = self._whole(outcome, response)
        else:
            self._streamed(outcome, response, stream)
            answer = "".join(stream.text) if stream.text is not None else ""
            rest = "".join(stream.rest) if stream.rest is not None else ""
            calls = stream.calls.done()
        if counts:
            self._payloads.count_output(outcome, rest + answer)
        refused_what(outcome, cls.sends)
        if keep and outcome.error is None and (problem := self._remember(request, answer, calls)) is not None:
            outcome.error, outcome.reason = "protocol", problem
        elif keep and conv.reports_to is not None:
            conv.answer = answer
        return outcome

    def _streamed(self, outcome: Outcome, response: Response, stream: EventStream) -> None:
        if stream_outcome(outcome, response, stream) and not self.usage_into(outcome, stream.usage):
            outcome.output_tokens = len(stream.token_ns)

    def _whole(self, outcome: Outcome, response: Response) -> tuple[str, str, list[ToolCall]]:
        """A whole (not streamed) answer's outcome; returns its text (for a session's history), the rest
        of what it generated (to count it) and its tool calls."""
        body = response.body or b""
        if response.status >= 400:
            http_error(outcome, response, body)
            return "", "", []
        started = _pc()
        try:
            doc = loads(body)
        except (ValueError, RecursionError):
            doc = None
        outcome.decode_ns = _pc() - started
        if type(doc) is not dict:
            outcome.error, outcome.reason = "protocol", f"response is not a JSON object: {clip(body)}"
            return "", "", []
        problem, usage, text, rest = self.whole(doc)
        if problem is not None:
            outcome.error, outcome.reason = "protocol", problem
            return "", "", []
        self.usage_into(outcome, usage)
        calls = self.whole_calls(doc)
        into(outcome, calls)
        return text, rest, calls
