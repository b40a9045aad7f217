"""JSON and text helpers every text protocol's client shares (openai.py, stream_events.py and the
typed-event clients): the JSON codec of request bodies and events, and how a server's words are cut
down to a protocol error's reason."""

from __future__ import annotations

import json
from typing import Any

import orjson

loads = json.loads
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
MAX_REASON = 200  # characters of a server's message kept in a reason
MAX_ERROR_BODY = 1 << 20  # bytes of a non-event body kept to find an error message in


def tokens_text(n: int) -> str:
    return "1 token" if n == 1 else f"{n} tokens"


def parse_json(data: bytes) -> Any:
    """The JSON value of an event's data; ValueError (or RecursionError) when it is not JSON. orjson,
    from the bytes: 0.6 µs for a typical token event against 1.4 µs for the standard library's scanner
    on the decoded text (measured; the per-token cost is mostly the read itself). The standard library
    has the last word: it also reads the NaN and Infinity that Python servers write (logprobs of -inf)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads(data)


def escaped(text: str) -> bytes:
    """`text` as the inside of a JSON string (escaped, without the quotes)."""
    return dumps(text).encode()[1:-1]


def lone_surrogate(exc: UnicodeEncodeError, answer: str, *others: str) -> str:
    """What is wrong with an answer whose text UTF-8 refused: a JSON string may escape half of a UTF-16
    pair ("\\ud800") on its own, which json.loads accepts and no UTF-8 text can hold. Where it is: in
    `answer`, or the first of `others` (its reasoning, its tool calls' arguments) that holds it."""
    char = exc.object[exc.start]
    answer = next((text for text in (answer, *others) if char in text), answer)
    return (f"the answer holds a lone UTF-16 surrogate (\\u{ord(char):04x}, at character {answer.find(char):,} of its "
            "text), which is not valid Unicode text: a session cannot carry it into its next turn")


def clip(text: Any, limit: int = MAX_REASON) -> str:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[: limit * 4]).decode("utf-8", "replace")
    elif not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_message(error: Any) -> str:
    """The message of an OpenAI error object (`{"message": ...}`), a bare string, or the object itself."""
    if isinstance(error, dict):
        message = error.get("message")
        if message:
            return clip(message)
    return clip(error)
