"""What the SSE-streamed text protocols share about a stream: openai.py's sink (chat and completions
chunks) and stream_events.py's `EventStream` (typed events: the Responses and Messages APIs).

`SseSink` is the body sink of one streamed request, called in the connection's read callback with
each body piece and the `perf_counter_ns` of the socket read it came in. It keeps the body (up to
MAX_ERROR_BODY bytes) until the first event, for an error body or one that is not an event stream;
feeds the pieces to an SseParser until the stream's end (`done`) or its first problem (`error`), and
`finish` takes an unterminated last event; the CPU time of it all is `decode_ns`. A protocol's
subclass reads the events (`_events`: token chunks into `token_ns`, `reasoning_chunks`, `content_ns`,
`usage`, `done`, `error`) and names its end (END, in the reason of a stream that lacks it).

The Outcome of a streamed request, for the protocol's client:

- `stream_outcome`: an HTTP error (>= 400, with the kept body's message: http.http_error), else the
  stream's token_ns, decode_ns, reasoning_chunks, content_ns and tool calls (`calls`, tools.py), and as a `protocol` error the first
  of: a Content-Type that is not text/event-stream (with the error a JSON body says), the stream's
  own error, a stream that ends without its end (with the body when not one event came);
- `failed_outcome`: a request whose connection failed (http.Failure); once the response had started,
  a lost connection is a `protocol` error ("stream truncated after N tokens: ..."), and a timeout keeps
  its kind and says where the stream was cut.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from latscope.protocols.http import Failure, Response, http_error
from latscope.protocols.json_text import MAX_ERROR_BODY, clip, error_message, loads, tokens_text
from latscope.protocols.sse import SseParser
from latscope.protocols.tools import ToolCalls, into
from latscope.records import Outcome

_pc = time.perf_counter_ns


class SseSink:
    """The body sink of one streamed request (the module docstring); a protocol subclasses it with its
    `_events` and END."""

    END: ClassVar[str] = ""
    __slots__ = ("parser", "token_ns", "reasoning_chunks", "content_ns", "done", "error", "usage", "decode_ns", "raw",
                 "raw_len", "events", "text", "calls")

    def __init__(self, keep_text: bool = False) -> None:
        self.parser = SseParser()
        self.token_ns: list[int] = []
        self.reasoning_chunks = 0  # token chunks of reasoning, not of the answer
        self.content_ns = 0  # read time of the first content chunk (0: none yet)
        self.done = False  # the end came
        self.error: str | None = None  # the first problem found (a protocol error's reason)
        self.usage: dict[str, Any] | None = None  # the usage the stream gave
        self.decode_ns = 0
        self.raw: list[bytes] | None = []  # the body, kept until the first event (an error body has none)
        self.raw_len = 0
        self.events = 0
        self.text: list[str] | None = [] if keep_text else None  # the answer's pieces, for a session's history
        self.calls = ToolCalls()  # the tool calls it streamed (tools.py)

    def __call__(self, piece: bytes, read_ns: int) -> None:
        started = _pc()
        raw = self.raw
        if raw is not None and self.raw_len < MAX_ERROR_BODY:
            raw.append(piece)
            self.raw_len += len(piece)
        if self.error is None and not self.done:
            events = self.parser.feed(piece)
            if events:
                self.raw = None
                self._events(events, read_ns)
        self.decode_ns += _pc() - started

    def finish(self, end_ns: int) -> None:
        """The body ended (its last byte read at `end_ns`): take an unterminated last event too."""
        if self.error is None and not self.done:
            started = _pc()
            events = self.parser.finish()
            if events:
                self.raw = None
                self._events(events, end_ns)
            self.decode_ns += _pc() - started

    def _events(self, events: list[tuple[bytes, bytes]], read_ns: int) -> None:
        raise NotImplementedError

    def body(self) -> bytes:
        return b"".join(self.raw) if self.raw else b""


def failed_outcome(failure: Failure, sent_ns: int, body_len: int, encode_ns: int, stream: SseSink | None) -> Outcome:
    """The Outcome of a request whose connection failed (`stream`: its sink, None when not streamed); a
    stream's token_ns and decode_ns come with it."""
    outcome = Outcome(sent_ns, _pc(), error=failure.kind, reason=failure.reason, bytes_out=body_len,
                      encode_ns=encode_ns)
    if stream is not None:
        outcome.token_ns, outcome.decode_ns = stream.token_ns, stream.decode_ns
        tokens = len(stream.token_ns)
        if failure.kind == "connect" and (stream.events or stream.raw_len):  # the response had started
            outcome.error = "protocol"
            outcome.reason = f"stream truncated after {tokens_text(tokens)}: {failure.reason}"
        elif failure.kind == "timeout" and (stream.events or stream.raw_len):
            outcome.reason = f"{failure.reason} (stream cut after {tokens_text(tokens)})"
    return outcome


def stream_outcome(outcome: Outcome, response: Response, stream: SseSink) -> bool:
    """A streamed response's `outcome` (the module docstring); False for an HTTP error, which has no
    stream to count."""
    if response.status >= 400:
        outcome.decode_ns = stream.decode_ns
        http_error(outcome, response, stream.body())
        return False
    stream.finish(response.end_ns)
    outcome.token_ns, outcome.decode_ns = stream.token_ns, stream.decode_ns
    outcome.reasoning_chunks, outcome.content_ns = stream.reasoning_chunks, stream.content_ns
    if stream.calls:
        into(outcome, stream.calls.done())
    content_type = response.headers.get("content-type", "")
    if content_type and not content_type.lower().startswith("text/event-stream"):
        detail = ""
        if stream.raw:  # e.g. a JSON answer that ignored "stream": true, or a JSON error with 200
            try:
                doc = loads(stream.body())
                if isinstance(doc, dict) and doc.get("error"):
                    detail = f": {error_message(doc['error'])}"
            except (ValueError, RecursionError):
                pass
        outcome.error = "protocol"
        outcome.reason = (f"stream asked for, got Content-Type {clip(content_type, 80)} instead of "
                          f"text/event-stream{detail}")
    elif stream.error is not None:
        outcome.error, outcome.reason = "protocol", stream.error
    elif not stream.done:
        outcome.error = "protocol"
        outcome.reason = f"stream ended without {stream.END} after {tokens_text(len(stream.token_ns))}"
        if not stream.events and stream.raw:  # no event at all: say what the body was
            outcome.reason += f"; the body: {clip(stream.body())}"
    return True
