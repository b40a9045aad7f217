"""An incremental Server-Sent Events parser (the WHATWG `text/event-stream` rules), for bytes.

`feed(piece)` takes body pieces as they come off the socket — split anywhere, even inside a `\\r\\n` —
and returns the events that the piece completed, as `(event type, data)`: the type is `b""` unless an
`event:` field set it; several `data:` lines of one event are joined with `\\n`. Comments (`:` lines),
`id:`, `retry:` and unknown fields are ignored; an event without data is not dispatched. `finish()`
returns what an unterminated last event held (the spec drops it; an OpenAI-compatible server that
forgets the last blank line still said what it said).

Cost: one buffer concatenation only when an event spans pieces, one `bytes.split` per piece, and for
the usual block `data: {...}` no per-line work at all (no regex, nothing per byte in Python).
"""

from __future__ import annotations

__all__ = ["SseParser"]

Event = tuple[bytes, bytes]  # (event type, data)


class SseParser:
    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""  # what came after the last complete event, with \n line ends only
        self._cr = False  # the last piece ended in \r: maybe the first half of a \r\n

    def feed(self, piece: bytes) -> list[Event]:
        if self._cr:
            piece, self._cr = b"\r" + piece, False
        if piece.find(b"\r") >= 0:  # the buffer is normalised already; only the new piece may need it
            if piece[-1:] == b"\r":
                piece, self._cr = piece[:-1], True
            piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        old = self._buf
        buf = old + piece if old else piece
        end = buf.rfind(b"\n\n", max(0, len(old) - 1))  # the buffer held no blank line: look at the new part
        if end < 0:
            self._buf = buf
            return []
        if end + 2 == len(buf):
            self._buf = b""
            if buf.find(b"\n") == end and buf[:5] == b"data:":  # the usual piece: one event, one data line
                data = buf[6:end] if buf[5:6] == b" " else buf[5:end]
                return [(b"", data)] if data else []
        else:
            self._buf = buf[end + 2 :]
        return _events(buf[:end].split(b"\n\n"))

    def finish(self) -> list[Event]:
        """The events still buffered when the stream ended (an unterminated last one included)."""
        buf, self._buf, self._cr = self._buf.strip(b"\n"), b"", False
        return _events(buf.split(b"\n\n")) if buf else []

    @property
    def pending(self) -> int:
        """Bytes buffered towards an event not yet complete."""
        return len(self._buf)


def _events(blocks: list[bytes]) -> list[Event]:
    out: list[Event] = []
    for block in blocks:
        if block[:5] == b"data:" and block.find(b"\n") < 0:  # the usual case: one data line
            data = block[6:] if block[5:6] == b" " else block[5:]
            if data:
                out.append((b"", data))
        elif block:
            _slow(block, out)
    return out


def _slow(block: bytes, out: list[Event]) -> None:
    """Line by line: several data lines, event types, comments, a leading blank line."""
    kind, data = b"", []
    for line in block.split(b"\n"):
        if not line:  # a blank line inside the block (runs of blank lines): ends an event
            if data:
                joined = b"\n".join(data)
                if joined:
                    out.append((kind, joined))
            kind, data = b"", []
            continue
        if line[:1] == b":":
            continue
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            kind = value
    if data:
        joined = b"\n".join(data)
        if joined:
            out.append((kind, joined))
