"""Tools and tool calls on the wire: the tools an agent class declares (scenario/workload.py `Agent.tools`)
in each API's shape, the tool calls an answer makes (streamed in pieces and accumulated here, or whole),
and how a job's context carries them (docs/agents.md says what a job is).

Declared tools (`declared`): functions `tool_0`, `tool_1`, … each with a description of synthetic words
(`Payloads.tool_descriptions`: `schema_tokens` words in all) and one required string parameter, `query`:

| API | one item of the body's `tools` |
| --- | --- |
| chat completions | `{"type": "function", "function": {"name", "description", "parameters"}}` |
| Responses | `{"type": "function", "name", "description", "parameters"}` |
| Messages | `{"name", "description", "input_schema"}` |

A tool call is (id, name, arguments: the JSON text the model generated). A stream gives it in pieces, each
piece a token chunk (the clients count it as content), and `ToolCalls` puts them together by the index
the API numbers them with:

| API | a call starts | its arguments grow |
| --- | --- | --- |
| chat | a `delta.tool_calls` item with a new `index` (its `id`, `function.name`) | that index's `function.arguments` |
| Responses | `response.output_item.added` with a `function_call` item (`call_id`, `name`) at `output_index` | `response.function_call_arguments.delta` at that `output_index` |
| Messages | `content_block_start` with a `tool_use` block (`id`, `name`) at `index` | `input_json_delta.partial_json` at that `index` |

A whole answer has them whole (chat `message.tool_calls`, Responses `function_call` output items, Messages
`tool_use` blocks, whose `input` is an object already). `into` counts an answer's calls into its Outcome,
and those whose arguments do not parse as a JSON object (`tool_calls_invalid`): a server that garbles
tool calls under load is a finding.

A job's context carries them as each API represents them, after the answer's text:

| API | the model's calls | the round's tool results |
| --- | --- | --- |
| chat | the assistant message's `"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]` (content null when it said nothing) | a `{"role": "tool", "tool_call_id", "content"}` message per call |
| Responses | `{"type": "function_call", "call_id", "name", "arguments"}` input items | a `{"type": "function_call_output", "call_id", "output"}` item per call |
| Messages | the assistant message's `{"type": "tool_use", "id", "name", "input"}` blocks (`input`: the arguments parsed; `{}` when they do not parse as an object, which the API cannot carry) | one user message of `{"type": "tool_result", "tool_use_id", "content"}` blocks |

After a fan-out (chat.py) the round's new text starts with the sub-agents' final answers (`with_reports`).
A round's tool result (its drawn new text) is split by words across the calls the model made, in order
(`split_words`), so the context grows by the drawn tool result whatever the number of calls; after an
answer without a tool call it goes as a user message, as a round's new text always does.
"""

from __future__ import annotations

import json
from typing import Any

from latscope.records import Conversation, Outcome

PARAMETERS = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"

ToolCall = tuple[str, str, str]  # (id, name, arguments)


def declared(api: str, descriptions: list[str]) -> list[dict[str, Any]]:
    """The body's `tools` in `api`'s shape: one function per description."""
    tools = [(f"tool_{i}", text) for i, text in enumerate(descriptions)]
    if api == CHAT:
        return [{"type": "function", "function": {"name": n, "description": d, "parameters": PARAMETERS}} for n, d in tools]
    if api == RESPONSES:
        return [{"type": "function", "name": n, "description": d, "parameters": PARAMETERS} for n, d in tools]
    return [{"name": n, "description": d, "input_schema": PARAMETERS} for n, d in tools]


class ToolCalls:
    """One answer's tool calls as they stream in (the module docstring), keyed by the API's index."""

    __slots__ = ("_calls", "_at")

    def __init__(self) -> None:
        self._calls: list[tuple[str, str, list[str]]] = []
        self._at: dict[Any, int] = {}

    def start(self, key: Any, call_id: Any, name: Any) -> None:
        """A call begins at `key` (a second start at the same key is the same call)."""
        if key not in self._at:
            self._at[key] = len(self._calls)
            self._calls.append((call_id if type(call_id) is str else "", name if type(name) is str else "", []))

    def add(self, key: Any, piece: str) -> None:
        """A piece of the arguments of the call at `key` (one the stream never started: a call of its own)."""
        if key not in self._at:
            self.start(key, "", "")
        self._calls[self._at[key]][2].append(piece)

    def chat_items(self, items: list) -> None:
        """A chat chunk's `delta.tool_calls`."""
        for item in items:
            if type(item) is not dict:
                continue
            key = item.get("index", 0)
            function = item.get("function")
            function = function if type(function) is dict else {}
            self.start(key, item.get("id"), function.get("name"))
            if type(arguments := function.get("arguments")) is str and arguments:
                self.add(key, arguments)

    def done(self) -> list[ToolCall]:
        return [(call_id, name, "".join(pieces)) for call_id, name, pieces in self._calls]

    def __bool__(self) -> bool:
        return bool(self._calls)


def whole_chat(message: Any) -> list[ToolCall]:
    """A whole chat answer's `message.tool_calls`."""
    calls = ToolCalls()
    if type(message) is dict and type(items := message.get("tool_calls")) is list:
        calls.chat_items([{**item, "index": i} for i, item in enumerate(items) if type(item) is dict])
    return calls.done()


def into(outcome: Outcome, calls: list[ToolCall]) -> None:
    """An answer's calls counted into its Outcome: how many, and how many with arguments that are not a JSON object."""
    outcome.tool_calls = len(calls)
    outcome.tool_calls_invalid = sum(arguments_object(arguments) is None for _, _, arguments in calls)


def arguments_object(arguments: str) -> dict | None:
    """The arguments parsed, when they are a JSON object; else None."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return value if type(value) is dict else None


def with_reports(conv: Conversation, text: str) -> str:
    """A round's new text: the final answers of the job's sub-agents, when it fanned out (chat.py), then
    the drawn text (the tool result). Taken once."""
    if not conv.reports:
        return text
    text, conv.reports = "\n".join([*conv.reports, text]), []
    return text


def split_words(text: str, n: int) -> list[str]:
    """`text` in `n` parts of consecutive words (as even as whole words allow; the last ones may be empty)."""
    if n == 1:
        return [text]
    words = text.split(" ")
    size, extra = divmod(len(words), n)
    parts, at = [], 0
    for i in range(n):
        take = size + (i < extra)
        parts.append(" ".join(words[at:at + take]))
        at += take
    return parts
