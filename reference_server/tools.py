"""Tool calling, shared by the chat (openai_api.py), Responses (responses_api.py) and Messages (messages_api.py)
front ends: the declared tools, the prompt line they cost, the arguments of a tool-call answer and the
transcript text of a carried-back call.

- **Declared tools** (the body's `tools`; absent or [] means none): at most MAX_TOOLS, each in its API's own
  shape, with a `name` (a string of 1 to MAX_NAME characters), an optional string `description` and an
  optional JSON Schema object (`parameters`, Messages: `input_schema`). Anything else: ApiError 400 naming
  the field (param "tools").
- **Their prompt cost**: with tools, the prompt starts with the line `tools: ` followed, for each tool in
  order, by `NAME DESCRIPTION SCHEMA` (SCHEMA: json.dumps with sorted keys and the default ", " / ": "
  separators), then a newline and the transcript. The same tools give the same words, so requests declaring
  them share prefix-cache blocks.
- **Which tool, whether at all**: the front end's routes own a `random.Random(text_api.TOOL_CALL_SEED)`; a request
  with tools and at least one non-reasoning token to answer draws once from it and, with probability
  `--tool-call-rate`, is answered with a call of `tools[len(prompt_ids) % len(tools)]` (text_api.TextRoutes).
- **Arguments**: the JSON object `{KEY: TEXT}`, TEXT the answer's non-reasoning tokens rendered and joined
  (the text a text answer would have had), KEY the tool's first `required` property of type "string", else
  its first property, else "input". Streamed as one piece per token: piece 0 is `{"KEY":"` and token 0's
  text, piece i token i's text, and the last also ends with `"}`; every text is escaped by json.dumps (ASCII
  only), so the pieces concatenate to well-formed JSON for any text, the same string a whole answer carries.
- **Carried-back calls** render as `NAME ARGUMENTS` after the assistant's content in its transcript line.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from reference_server.api_error import ApiError

MAX_TOOLS = 128  # OpenAI's limit per request
MAX_NAME = 128
DEFAULT_KEY = "input"


@dataclass(frozen=True)
class Tool:
    """A declared tool: its name, description, parameters' JSON Schema ({} when not given) and argument key."""

    name: str
    description: str
    schema: dict[str, Any]
    key: str


def argument_key(schema: dict[str, Any]) -> str:
    """The one key of a call's arguments: the first required string property, else the first property, else
    DEFAULT_KEY."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return DEFAULT_KEY
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        spec = properties.get(name) if isinstance(name, str) else None
        if isinstance(spec, dict) and spec.get("type") == "string":
            return name
    return next(iter(properties))


def _tool(spec: Any, where: str, schema_field: str) -> Tool:
    """One tool from its object at `where` (the name, description and `schema_field` keys)."""
    if not isinstance(spec, dict):
        raise ApiError(400, f"{where} must be an object", param="tools")
    name, description, schema = spec.get("name"), spec.get("description"), spec.get(schema_field)
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        raise ApiError(400, f"{where}.name must be a string of 1 to {MAX_NAME} characters", param="tools")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.description must be a string", param="tools")
    if schema is not None and not isinstance(schema, dict):
        raise ApiError(400, f"{where}.{schema_field} must be a JSON Schema object", param="tools")
    schema = schema or {}
    return Tool(name, description or "", schema, argument_key(schema))


def _tool_list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(400, f"'{name}' must be a list of tools", param="tools")
    if len(value) > MAX_TOOLS:
        raise ApiError(400, f"'{name}' has {len(value)} tools; at most {MAX_TOOLS} are allowed", param="tools")
    return value


def _function_typed(spec: Any, where: str) -> None:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind != "function":
        raise ApiError(400, f"{where}: only function tools (\"type\": \"function\") are supported, not {kind!r}",
                       param="tools")


def chat_tools(value: Any) -> list[Tool]:
    """Chat completions' `tools`: `{"type": "function", "function": {"name", "description", "parameters"}}`."""
    tools = []
    for i, spec in enumerate(_tool_list(value, "tools")):
        _function_typed(spec, f"tools[{i}]")
        tools.append(_tool(spec.get("function"), f"tools[{i}].function", "parameters"))
    return tools


def responses_tools(value: Any) -> list[Tool]:
    """The Responses API's `tools`: `{"type": "function", "name", "description", "parameters"}`."""
    tools = []
    for i, spec in enumerate(_tool_list(value, "tools")):
        _function_typed(spec, f"tools[{i}]")
        tools.append(_tool(spec, f"tools[{i}]", "parameters"))
    return tools


def messages_tools(value: Any) -> list[Tool]:
    """The Messages API's `tools`: `{"name", "description", "input_schema"}`."""
    return [_tool(spec, f"tools.{i}", "input_schema") for i, spec in enumerate(_tool_list(value, "tools"))]


def with_tools(tools: list[Tool], transcript: str) -> str:
    """The prompt text: the tools line (when there are tools), then the transcript."""
    if not tools:
        return transcript
    declared = " ".join(f"{t.name} {t.description} {json.dumps(t.schema, sort_keys=True)}" for t in tools)
    return f"tools: {declared}\n{transcript}"


def with_calls(content: str, calls: list[tuple[str, str]]) -> str:
    """An assistant turn's transcript text: its content, then each call's `NAME ARGUMENTS`, space-separated."""
    return " ".join(part for part in (content, *(f"{name} {arguments}" for name, arguments in calls)) if part)


def arguments_piece(key: str, index: int, text: str, last: bool) -> str:
    """Piece `index` (0 …) of the arguments `{key: …}`, token text `text`; `last` closes the object."""
    head = "{" + json.dumps(key) + ':"' if index == 0 else ""
    return head + json.dumps(text)[1:-1] + ('"}' if last else "")


def arguments(key: str, texts: list[str]) -> str:
    """The whole arguments of the answer tokens' `texts` (at least one): its pieces, concatenated."""
    return "".join(arguments_piece(key, i, text, i == len(texts) - 1) for i, text in enumerate(texts))


def new_id(prefix: str) -> str:
    """A call or item id: `PREFIX_` and 32 hex digits (call_, fc_, toolu_)."""
    return f"{prefix}_{uuid.uuid4().hex}"
