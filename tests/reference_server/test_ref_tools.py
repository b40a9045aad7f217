"""Tool calls in the reference server (reference_server/tools.py), as a real process: for the chat, Responses and
Messages APIs, streamed and whole, a request declaring tools is answered with a call of one of them whose
arguments, streamed one piece per token, concatenate to the whole answer's JSON; `--tool-call-rate 0` answers text;
a history carrying the call and its result is accepted, rendered so each round's prompt extends the previous
one's (prefix cache hits); malformed tools and tool history get 400 in each API's error shape. Raw HTTP where
the wire format is the point, the official `openai` and `anthropic` clients where their reading of it is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

import refserver
from refserver import metric, post_json, running_server, scrape
from reference_server.text_api import TextRoutes
from reference_server.tools import argument_key, arguments, arguments_piece

MODEL = "decoder"
BLOCK = 16  # prefix-cache block, in tokens
MAX = 4  # max_tokens of every request here
# (name, description, JSON Schema or None); the argument key each gets: the first required string property,
# else the first property, else "input".
TOOLS = [("read_file", "Read a file of the workspace",
          {"type": "object", "properties": {"limit": {"type": "integer"}, "path": {"type": "string"}},
           "required": ["limit", "path"]}),
         ("grep", "Search the files for a pattern",
          {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}}),
         ("finish", "End the task", None)]
KEYS = {"read_file": "path", "grep": "pattern", "finish": "input"}

cache, logs = refserver.cache, refserver.logs


def start(cache, logs, *flags: str):
    return running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--layers", "1", "--decoder-layers", "1",
                          "--cache-dir", str(cache), "--max-tokens-limit", "64", *flags)


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[str]:
    with start(cache, logs) as s:  # --tool-call-rate 1 (the default); prefix cache on (the default)
        yield s.url


@pytest.fixture(scope="module")
def text_server(cache, logs) -> Iterator[str]:
    with start(cache, logs, "--tool-call-rate", "0") as s:
        yield s.url


def events(body: bytes) -> list[dict[str, Any]]:
    """The `data:` documents of a Server-Sent Events body, without `[DONE]`."""
    return [json.loads(line[6:]) for line in body.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@dataclass
class Call:
    id: str
    name: str
    arguments: str  # the JSON text (Messages: its `input`, compact, as the stream's pieces spell it)


@dataclass
class Streamed:
    call: Call
    pieces: list[str]  # the arguments, one per token chunk
    reasoning: int  # reasoning chunks before them
    prompt: int  # usage: prompt tokens, and of those cached
    cached: int


# --- the three APIs, each as: request, whole answer, stream, carried-back history ---------------------------

class Chat:
    path, api, id_prefix = "/v1/chat/completions", "chat", "call_"

    def body(self, history: list, reasoning: int, stream: bool, tools: Any = None) -> dict:
        tools = [{"type": "function", "function": {"name": n, "description": d, **({"parameters": p} if p else {})}}
                 for n, d, p in TOOLS] if tools is None else tools
        return {"model": MODEL, "messages": history, "max_tokens": MAX, "reasoning_tokens": reasoning,
                "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {}), "tools": tools}

    def start(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    def call(self, doc: dict, reasoning: int) -> Call:
        choice = doc["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls" and message["content"] is None
        assert ("reasoning_content" in message) == bool(reasoning)
        (call,) = message["tool_calls"]
        assert call["type"] == "function"
        return Call(call["id"], call["function"]["name"], call["function"]["arguments"])

    def usage(self, doc: dict) -> tuple[int, int]:
        return doc["usage"]["prompt_tokens"], doc["usage"]["prompt_tokens_details"]["cached_tokens"]

    def text(self, doc: dict) -> str:
        choice = doc["choices"][0]
        assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
        return choice["message"]["content"]

    def streamed(self, docs: list[dict]) -> Streamed:
        chunks = [d for d in docs if d["choices"]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
        reasoning = sum("reasoning_content" in d for d in deltas)
        calls = [d["tool_calls"] for d in deltas[reasoning:]]
        assert all(len(c) == 1 and c[0]["index"] == 0 for c in calls)
        first = calls[0][0]
        assert first["type"] == "function" and all(set(c[0]) == {"index", "function"} for c in calls[1:])
        assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None] * (len(chunks) - 2) + ["tool_calls"]
        usage = docs[-1]["usage"]
        return Streamed(Call(first["id"], first["function"]["name"], ""),
                        [c[0]["function"]["arguments"] for c in calls], reasoning, usage["prompt_tokens"],
                        usage["prompt_tokens_details"]["cached_tokens"])

    def carry(self, history: list, doc: dict, result: str) -> list:
        message = doc["choices"][0]["message"]  # as an agent sends it back: content null, tool_calls, reasoning
        return [*history, message,
                {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": result}]


class Responses:
    path, api, id_prefix = "/v1/responses", "responses", "call_"

    def body(self, history: list, reasoning: int, stream: bool, tools: Any = None) -> dict:
        tools = [{"type": "function", "name": n, "description": d, **({"parameters": p} if p else {})}
                 for n, d, p in TOOLS] if tools is None else tools
        return {"model": MODEL, "input": history, "max_output_tokens": MAX, "reasoning_tokens": reasoning,
                "stream": stream, "tools": tools}

    def start(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    def call(self, doc: dict, reasoning: int) -> Call:
        assert [item["type"] for item in doc["output"]] == ["reasoning"] * bool(reasoning) + ["function_call"]
        item = doc["output"][-1]
        assert item["id"].startswith("fc_") and item["status"] == "completed"
        return Call(item["call_id"], item["name"], item["arguments"])

    def usage(self, doc: dict) -> tuple[int, int]:
        return doc["usage"]["input_tokens"], doc["usage"]["input_tokens_details"]["cached_tokens"]

    def text(self, doc: dict) -> str:
        assert [item["type"] for item in doc["output"]] == ["message"]
        return doc["output"][0]["content"][0]["text"]

    def streamed(self, docs: list[dict]) -> Streamed:
        kinds = [d["type"] for d in docs]
        assert [d["sequence_number"] for d in docs] == list(range(len(docs)))
        reasoning = kinds.count("response.reasoning_text.delta")
        tokens = kinds.count("response.function_call_arguments.delta")
        head = (["response.output_item.added"] + ["response.reasoning_text.delta"] * reasoning
                + ["response.reasoning_text.done", "response.output_item.done"]) if reasoning else []
        assert kinds == (["response.created", "response.in_progress", *head, "response.output_item.added"]
                         + ["response.function_call_arguments.delta"] * tokens
                         + ["response.function_call_arguments.done", "response.output_item.done",
                            "response.completed"])
        added, *deltas, done, item_done, completed = docs[len(head) + 2:]
        item = added["item"]
        assert (item["type"], item["arguments"], item["status"]) == ("function_call", "", "in_progress")
        assert {d["item_id"] for d in [*deltas, done]} == {item["id"]}
        pieces = [d["delta"] for d in deltas]
        assert done["arguments"] == item_done["item"]["arguments"] == "".join(pieces)
        assert item_done["item"] == {**item, "arguments": "".join(pieces), "status": "completed"}
        assert completed["response"]["output"][-1] == item_done["item"]
        usage = completed["response"]["usage"]
        return Streamed(Call(item["call_id"], item["name"], ""), pieces, reasoning, usage["input_tokens"],
                        usage["input_tokens_details"]["cached_tokens"])

    def carry(self, history: list, doc: dict, result: str) -> list:
        call_id = doc["output"][-1]["call_id"]  # output items go back as they came (reasoning, function_call)
        return [*history, *doc["output"], {"type": "function_call_output", "call_id": call_id, "output": result}]


class Messages:
    path, api, id_prefix = "/v1/messages", "messages", "toolu_"

    def body(self, history: list, reasoning: int, stream: bool, tools: Any = None) -> dict:
        tools = [{"name": n, "description": d, **({"input_schema": p} if p else {})}
                 for n, d, p in TOOLS] if tools is None else tools
        thinking = {"type": "enabled", "budget_tokens": reasoning} if reasoning else {"type": "disabled"}
        return {"model": MODEL, "messages": history, "max_tokens": MAX, "thinking": thinking, "stream": stream,
                "tools": tools}

    def start(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    def call(self, doc: dict, reasoning: int) -> Call:
        assert [block["type"] for block in doc["content"]] == ["thinking"] * bool(reasoning) + ["tool_use"]
        assert doc["stop_reason"] == "tool_use"
        block = doc["content"][-1]
        return Call(block["id"], block["name"], json.dumps(block["input"], separators=(",", ":")))

    def usage(self, doc: dict) -> tuple[int, int]:
        usage = doc["usage"]
        return usage["input_tokens"] + usage["cache_read_input_tokens"], usage["cache_read_input_tokens"]

    def text(self, doc: dict) -> str:
        assert [block["type"] for block in doc["content"]] == ["text"] and doc["stop_reason"] == "max_tokens"
        return doc["content"][0]["text"]

    def streamed(self, docs: list[dict]) -> Streamed:
        kinds = [d["delta"]["type"] if d["type"] == "content_block_delta" else d["type"] for d in docs]
        reasoning, tokens = kinds.count("thinking_delta"), kinds.count("input_json_delta")
        head = (["content_block_start", *["thinking_delta"] * reasoning, "signature_delta", "content_block_stop"]
                if reasoning else [])
        assert kinds == ["message_start", "ping", *head, "content_block_start", *["input_json_delta"] * tokens,
                         "content_block_stop", "message_delta", "message_stop"]
        start, *deltas, stop, message_delta, _ = docs[len(head) + 2:]
        block = start["content_block"]
        assert (block["type"], block["input"], start["index"]) == ("tool_use", {}, 1 if reasoning else 0)
        assert {d["index"] for d in [*deltas, stop]} == {start["index"]}
        assert message_delta["delta"]["stop_reason"] == "tool_use" and message_delta["usage"]["output_tokens"] == MAX
        usage = docs[0]["message"]["usage"]
        return Streamed(Call(block["id"], block["name"], ""), [d["delta"]["partial_json"] for d in deltas], reasoning,
                        usage["input_tokens"] + usage["cache_read_input_tokens"], usage["cache_read_input_tokens"])

    def carry(self, history: list, doc: dict, result: str) -> list:
        tool_use = doc["content"][-1]  # the content goes back as it came (thinking, tool_use)
        return [*history, {"role": "assistant", "content": doc["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"],
                                              "content": [{"type": "text", "text": result}]}]}]


APIS = [pytest.param(Chat(), id="chat"), pytest.param(Responses(), id="responses"),
        pytest.param(Messages(), id="messages")]


def ask(url: str, api, body: dict) -> Any:
    """A 200 answer: the JSON document, or a stream's event documents."""
    status, _, raw = post_json(url + api.path, body)
    assert status == 200, raw
    return events(raw) if body["stream"] else json.loads(raw)


# --- the tool-call answer ------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
def test_a_request_with_tools_is_answered_by_a_call_streamed_one_token_per_chunk(server, api):
    before = metric(scrape(server), "latscope_ref_tool_calls_total", api=api.api)
    called = set()
    for words, reasoning in ((1, 0), (2, 1), (3, 2)):  # consecutive prompt lengths: each tool in turn
        history = api.start(" ".join(f"{api.api}{i}" for i in range(words)))
        whole = ask(server, api, api.body(history, reasoning, stream=False))
        call = api.call(whole, reasoning)
        prompt, _ = api.usage(whole)
        assert call.name == TOOLS[prompt % len(TOOLS)][0] and call.id.startswith(api.id_prefix)
        called.add(call.name)
        key = KEYS[call.name]
        (value,) = json.loads(call.arguments).values()
        assert list(json.loads(call.arguments)) == [key] and len(value.split()) == MAX - reasoning

        streamed = api.streamed(ask(server, api, api.body(history, reasoning, stream=True)))
        assert streamed.call.name == call.name and streamed.call.id.startswith(api.id_prefix)
        assert (len(streamed.pieces), streamed.reasoning, streamed.prompt) == (MAX - reasoning, reasoning, prompt)
        assert "".join(streamed.pieces) == call.arguments  # greedy: the same request, the same tokens
        assert streamed.pieces[0].startswith(f'{{"{key}":"') and streamed.pieces[-1].endswith('"}')
    assert called == {name for name, _, _ in TOOLS}
    assert metric(scrape(server), "latscope_ref_tool_calls_total", api=api.api) == before + 6


@pytest.mark.parametrize("api", APIS)
def test_tool_call_rate_0_answers_text(text_server, api):
    doc = ask(text_server, api, api.body(api.start("hello there"), 0, stream=False))
    assert len(api.text(doc).split()) == MAX


def test_without_tools_the_prompt_is_as_before(server):
    """Declaring tools costs prefill tokens: the tools line comes first; no tools, no line."""
    plain = ask(server, Chat(), Chat().body([{"role": "user", "content": "hi"}], 0, stream=False, tools=[]))
    assert plain["usage"]["prompt_tokens"] == len("user: hi\nassistant:".split())
    assert plain["choices"][0]["finish_reason"] == "length"
    line = "tools: " + " ".join(f"{n} {d} {json.dumps(p or {}, sort_keys=True)}" for n, d, p in TOOLS)
    with_tools = ask(server, Chat(), Chat().body([{"role": "user", "content": "hi"}], 0, stream=False))
    assert with_tools["usage"]["prompt_tokens"] == len(f"{line}\nuser: hi\nassistant:".split())


# --- history carrying the call and its result ----------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
def test_history_with_the_call_and_its_result_extends_the_prompt_and_hits_the_prefix_cache(server, api):
    history = api.start(f"fix the failing {api.api} test in the repository")
    previous = expected = 0
    for turn in range(3):
        doc = ask(server, api, api.body(history, 1, stream=False))
        call = api.call(doc, 1)
        prompt, cached = api.usage(doc)
        if turn:
            assert prompt == expected and cached == BLOCK * (previous // BLOCK) > 0, (turn, previous, prompt)
        result = f"result {turn} of {call.name}: it printed this"
        history = api.carry(history, doc, result)
        # this prompt, its last word 'assistant:' followed by ' NAME ARGUMENTS', then 'tool: RESULT', 'assistant:'
        previous, expected = prompt, prompt + len(f"{call.name} {call.arguments}".split()) + len(result.split()) + 2


def test_responses_previous_response_id_carries_the_call(server):
    api = Responses()
    history = api.start("list the files please")
    first = ask(server, api, api.body(history, 0, stream=False))
    explicit = ask(server, api, api.body(api.carry(history, first, "a.py b.py"), 0, stream=False))
    chained = ask(server, api, {**api.body([{"type": "function_call_output", "call_id": api.call(first, 0).id,
                                             "output": "a.py b.py"}], 0, stream=False),
                                "previous_response_id": first["id"]})
    assert api.usage(chained)[0] == api.usage(explicit)[0]


# --- what is refused ----------------------------------------------------------------------------------------

BAD_TOOLS = {
    "chat": [("tools", "'tools'"), ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name"),
             ([{"name": "x"}], "tools[0]"), ([{"type": "function", "function": {"name": 7}}], "tools[0].function.name"),
             ([{"type": "function", "function": {"name": "x", "parameters": "no"}}], "tools[0].function.parameters")],
    "responses": [({"name": "x"}, "'tools'"), ([{"type": "function", "description": "x"}], "tools[0].name"),
                  ([{"type": "web_search", "name": "x"}], "tools[0]"),
                  ([{"type": "function", "name": "x", "parameters": []}], "tools[0].parameters")],
    "messages": [(3, "'tools'"), (["x"], "tools.0"), ([{"description": "x"}], "tools.0.name"),
                 ([{"name": "x", "input_schema": 1}], "tools.0.input_schema"), ([{"name": ""}], "tools.0.name")],
}


def error_message(api, doc: dict) -> str:
    if api.api == "messages":
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        return doc["error"]["message"]
    assert doc["error"]["type"] == "invalid_request_error"
    return doc["error"]["message"]


@pytest.mark.parametrize("api", APIS)
def test_malformed_tools_are_400_naming_the_field(server, api):
    for tools, field in BAD_TOOLS[api.api]:
        status, _, raw = post_json(server + api.path, api.body(api.start("x"), 0, stream=False, tools=tools))
        assert status == 400 and field in error_message(api, json.loads(raw)), (tools, raw)
    too_many = [{"type": "function", "function": {"name": f"t{i}"}, "name": f"t{i}"} for i in range(129)]
    status, _, raw = post_json(server + api.path, api.body(api.start("x"), 0, stream=False, tools=too_many))
    assert status == 400 and "at most 128" in error_message(api, json.loads(raw))


BAD_HISTORY = {
    "chat": [([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                       "function": {"name": "x"}}]}],
              "messages[0].tool_calls[0]"),
             ([{"role": "assistant", "content": None, "tool_calls": {"id": "c"}}], "messages[0].tool_calls"),
             ([{"role": "tool", "content": "out"}], "messages[0].tool_call_id")],
    "responses": [([{"type": "function_call", "name": "x", "arguments": "{}"}], "input[0]"),
                  ([{"type": "function_call_output", "call_id": "c", "output": 5}], "input[0].output"),
                  ([{"type": "function_call_output", "output": "x"}], "input[0]")],
    "messages": [([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x"}]}],
                  "messages.0.content.0"),
                 ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}],
                  "messages.0.content.0.content"),
                 ([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}], "messages.0.content.0")],
}


@pytest.mark.parametrize("api", APIS)
def test_malformed_tool_history_is_400_naming_the_field(server, api):
    for history, field in BAD_HISTORY[api.api]:
        status, _, raw = post_json(server + api.path, api.body(history, 0, stream=False))
        assert status == 400 and field in error_message(api, json.loads(raw)), (history, raw)


# --- the official clients read it -------------------------------------------------------------------------

def test_the_official_clients_read_the_calls(server):
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    chat, responses, messages = Chat(), Responses(), Messages()
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60) as oai:
        body = chat.body(chat.start("client check"), 0, stream=False)
        whole = oai.chat.completions.create(model=MODEL, messages=body["messages"], tools=body["tools"], max_tokens=MAX)
        (call,) = whole.choices[0].message.tool_calls
        chunks = list(oai.chat.completions.create(model=MODEL, messages=body["messages"], tools=body["tools"],
                                                  max_tokens=MAX, stream=True))
        assert "".join(c.choices[0].delta.tool_calls[0].function.arguments for c in chunks[1:]) \
            == call.function.arguments
        body = responses.body(responses.start("client check"), 0, stream=False)
        with oai.responses.stream(model=MODEL, input=body["input"], tools=body["tools"], max_output_tokens=MAX) as s:
            final = s.get_final_response()
        (item,) = final.output
        assert item.type == "function_call" and json.loads(item.arguments)
    with anthropic.Anthropic(base_url=server, api_key="x", max_retries=0, timeout=60) as claude:
        body = messages.body(messages.start("client check"), 0, stream=False)
        whole = claude.messages.create(model=MODEL, messages=body["messages"], tools=body["tools"], max_tokens=MAX)
        with claude.messages.stream(model=MODEL, messages=body["messages"], tools=body["tools"], max_tokens=MAX) as s:
            final = s.get_final_message()
        assert final.stop_reason == "tool_use" and final.content[0].input == whole.content[0].input


# --- in process: the arguments, the key, the rate --------------------------------------------------------------

@pytest.mark.parametrize("texts", [[" a"], [" a", ' "quoted"', " back\\slash", " new\nline", " ünï", " \U0001f600"]])
def test_arguments_are_json_for_any_text_and_their_pieces_concatenate_to_them(texts):
    pieces = [arguments_piece("k\"ey", i, t, i == len(texts) - 1) for i, t in enumerate(texts)]
    assert "".join(pieces) == arguments("k\"ey", texts)
    assert json.loads(arguments("k\"ey", texts)) == {"k\"ey": "".join(texts)}


def test_argument_key():
    assert argument_key({}) == "input"
    assert argument_key({"properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
                         "required": ["n", "s"]}) == "s"
    assert argument_key({"properties": {"n": {"type": "integer"}}, "required": ["n"]}) == "n"
    assert argument_key({"properties": [], "required": 3}) == "input"


def test_the_tool_call_rate_is_a_seeded_chance():
    def routes(rate: float) -> TextRoutes:
        return TextRoutes(None, None, None, max_body_bytes=1, max_tokens_limit=1, reasoning_tokens=0, replica_id="r",
                          tool_call_rate=rate)

    tools = ["a", "b", "c"]
    first = routes(0.5)
    half = [first.choose_tool(tools, [0] * 4, 1) for _ in range(2000)]
    assert 900 < sum(t is not None for t in half) < 1100 and {t for t in half if t} == {"b"}  # 4 % 3
    again = routes(0.5)  # each routes object owns a Random seeded 0: the same decisions in the same order
    assert [again.choose_tool(tools, [0] * 4, 1) for _ in range(2000)] == half
    assert routes(1.0).choose_tool(tools, [0] * 4, 0) is None  # no token left after reasoning: text
    assert {routes(1.0).choose_tool(tools, [0] * n, 1) for n in range(3)} == set(tools)
    assert routes(0.0).choose_tool(tools, [0], 1) is None and routes(1.0).choose_tool([], [0], 1) is None
