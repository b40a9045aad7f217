"""Fuzzing every front end of one real reference server (REST JSON and binary, gRPC, OpenAI-compatible, admin)
with requests built around valid ones: a client's mistake is always a 4xx (gRPC: INVALID_ARGUMENT, NOT_FOUND,
...), never a 5xx (INTERNAL, UNKNOWN), and never a traceback in the server's log. Then the hostile requests
found by hand, each with the answer it must get (add each new one there).

Deterministic: a fixed seed, no example database. Requests go out as raw bytes over fresh loopback
connections (so headers can hold any byte) and as raw gRPC messages.
"""

from __future__ import annotations

import gzip
import json
import socket
from typing import Any, Iterator

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

import refserver
from refserver import MODEL, Server, http, running_server, wait_for
from reference_server import proto

TOKEN = "fuzz-admin-token"
GENERATOR = "decoder"
SEED = 20261124
CASES = 400  # per front end: ~2-4 s each on a busy 2-core box
FUZZ = settings(max_examples=CASES, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

cache, logs = refserver.cache, refserver.logs


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[Server]:
    """Every front end on ports it picks: the smallest encoder and decoder, at most 4 tokens per answer (the
    first one reasoning), an adapter."""
    with running_server(logs, "--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--admin-token", TOKEN,
                        "--layers", "1", "--decoder-layers", "1", "--max-tokens-limit", "4", "--reasoning-tokens", "1",
                        "--adapter", "a2=2", "--cache-dir",
                        str(cache), need=("ready", "ready-grpc", "ready-admin")) as s:
        yield s


# --- talking raw HTTP and gRPC -------------------------------------------------------------------------

def raw_http(url: str, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
             body: bytes) -> tuple[int, bytes]:
    """(status, whole response) for one request written byte for byte on a fresh connection."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    lines = [b"%s %s HTTP/1.1" % (method, path), b"Host: fuzz", b"Connection: close",
             b"Content-Length: %d" % len(body), *(name + b": " + value for name, value in headers)]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    assert answer.startswith(b"HTTP/1."), f"no HTTP answer: {answer[:200]!r}"
    return int(answer.split(b" ", 2)[1]), answer


def assert_not_5xx(status: int, answer: bytes, sent: Any) -> None:
    assert 200 <= status < 500, f"{status} for {sent!r:.600}:\n{answer[:600]!r}"


def assert_quiet(server: Server) -> None:
    """The server still serves, and nothing it was sent put a traceback or an ERROR line in its log."""
    assert http("GET", f"{server.url}/v2/health/ready")[0] == 200
    text = server.log_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


# --- strategies ----------------------------------------------------------------------------------------

BIG = 2 ** 70
junk_scalars = st.one_of(st.none(), st.booleans(), st.integers(-BIG, BIG), st.integers(-3, 600),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                         st.sampled_from(["INT64", "FP32", "BYTES", "input_ids", "attention_mask", "embedding",
                                          "binary_data_size", "", MODEL, GENERATOR]))
junk = st.recursive(junk_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=8)


def _slots(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON document: the places a mutation can change."""
    found: list[tuple[Any, Any]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        found.append((doc, key))
        found.extend(_slots(value))
    return found


@st.composite
def mutated(draw, valid: st.SearchStrategy) -> Any:
    """A valid document with 0-3 changes: a value replaced by junk, a key deleted, a list item added."""
    doc = draw(valid)
    for _ in range(draw(st.integers(0, 3))):
        slots = _slots(doc)
        if not slots:
            return draw(junk)
        container, key = draw(st.sampled_from(slots))
        action = draw(st.sampled_from(["replace", "replace", "delete", "append"]))
        if action == "delete":
            del container[key]
        elif action == "append" and isinstance(container[key], list):
            container[key].append(draw(junk))
        else:
            container[key] = draw(junk)
    return doc


@st.composite
def v2_doc(draw, binary: bool = False) -> dict:
    """A valid infer request for the encoder; with `binary`, the tensors' sizes in binary_data_size."""
    rows, seq = draw(st.integers(1, 2)), draw(st.integers(1, 6))
    inputs = []
    for name in ("input_ids", "attention_mask"):
        item: dict[str, Any] = {"name": name, "datatype": "INT64", "shape": [rows, seq]}
        if binary:
            item["parameters"] = {"binary_data_size": rows * seq * 8}
        else:
            item["data"] = draw(st.lists(st.integers(0, 8191), min_size=rows * seq, max_size=rows * seq))
        inputs.append(item)
    doc: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": "embedding", "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=6))
    return doc


ENCODINGS = st.sampled_from([b"gzip", b"deflate", b"br", b"zstd", b"identity", b"x-junk", b"gzip, br"])
header_value = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def encoded(draw, body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Sometimes a Content-Encoding the body does not have (or a random body under it)."""
    if not draw(st.integers(0, 5)) == 0:
        return [], body
    return [(b"Content-Encoding", draw(ENCODINGS))], draw(st.one_of(st.just(body), st.binary(max_size=64)))


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


# --- the front ends ------------------------------------------------------------------------------------

INFER = f"/v2/models/{MODEL}/infer".encode()


@seed(SEED)
@FUZZ
@given(data=st.data())
def test_v2_rest_json_infer_never_answers_5xx(server, data):
    body = dumps(data.draw(mutated(v2_doc())))
    path = data.draw(st.sampled_from([INFER, INFER, INFER, b"/v2/models/other/infer"]))
    headers, body = data.draw(encoded(body))
    status, answer = raw_http(server.url, b"POST", path, headers, body)
    assert_not_5xx(status, answer, (path, headers, body))


@st.composite
def binary_request(draw) -> tuple[list[tuple[bytes, bytes]], bytes]:
    header = dumps(draw(mutated(v2_doc(binary=True))))
    raw = draw(st.one_of(st.binary(max_size=200), st.integers(0, 4).map(lambda n: bytes(8 * n * n))))
    length = draw(st.one_of(
        st.just(str(len(header)).encode()), st.integers(-BIG, BIG).map(lambda n: str(n).encode()),
        st.integers(-2, len(header) + len(raw) + 2).map(lambda n: str(n).encode()),
        st.sampled_from([b"", b" 7", b"1_0", b"0x10", b"1e3", b"+5", b"\xff\xfe", b"\x00", b"9" * 5000]),
        header_value))
    return [(b"Inference-Header-Content-Length", length)], header + raw


@seed(SEED)
@FUZZ
@given(request=binary_request())
def test_v2_rest_binary_infer_never_answers_5xx(server, request):
    headers, body = request
    status, answer = raw_http(server.url, b"POST", INFER, headers, body)
    assert_not_5xx(status, answer, request)


def schema() -> dict[str, Any]:
    """A drawn request's tool's parameters: a new object each time, as `mutated` changes documents in place."""
    return {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


@st.composite
def openai_request(draw) -> tuple[bytes, Any]:
    chat = draw(st.booleans())
    doc: dict[str, Any] = {"model": GENERATOR, "max_tokens": draw(st.integers(1, 4)), "stream": draw(st.booleans())}
    if chat:
        doc["messages"] = [{"role": "user", "content": draw(st.text(max_size=20))}]
        if draw(st.booleans()):  # tools, and a history carrying a call and its result
            doc["tools"] = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": schema()}}]
            doc["messages"] += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"q":"x"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "out"}]
    else:
        doc["prompt"] = draw(st.one_of(st.text(min_size=1, max_size=20), st.lists(st.integers(0, 100), max_size=5)))
    if doc["stream"] and draw(st.booleans()):
        doc["stream_options"] = {"include_usage": True}
    path = b"/v1/chat/completions" if chat else b"/v1/completions"
    return path, draw(mutated(st.just(doc)))


@seed(SEED)
@FUZZ
@given(data=st.data())
def test_openai_completions_never_answer_5xx(server, data):
    post_drawn(server, data, openai_request())


def post_drawn(server: Server, data: st.DataObject, requests: st.SearchStrategy[tuple[bytes, Any]]) -> None:
    """POST a (path, document) drawn from `requests`, its body encoded as drawn: never a 5xx."""
    path, doc = data.draw(requests)
    headers, body = data.draw(encoded(dumps(doc)))
    status, answer = raw_http(server.url, b"POST", path, headers, body)
    assert_not_5xx(status, answer, (path, headers, body))


@st.composite
def newer_api_request(draw) -> tuple[bytes, Any]:
    """A valid request, then mutated, for /v1/responses, /v1/messages, /v1/embeddings or /v1/rerank."""
    api = draw(st.sampled_from(["responses", "messages", "embeddings", "rerank"]))
    text = st.text(min_size=1, max_size=20)
    model = draw(st.sampled_from([GENERATOR, GENERATOR, "a2"]))
    if api == "responses":
        doc: dict[str, Any] = {"model": model, "max_output_tokens": draw(st.integers(1, 4)),
                               "stream": draw(st.booleans()),
                               "input": draw(st.one_of(text, st.just([{"role": "user", "content": "hi"}])))}
        if draw(st.booleans()):
            doc["reasoning_tokens"] = draw(st.integers(0, 5))
        if draw(st.booleans()):  # tools, and a history carrying a call and its result
            doc["tools"] = [{"type": "function", "name": "f", "description": "d", "parameters": schema()}]
            doc["input"] = [{"role": "user", "content": "hi"},
                            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"q":"x"}'},
                            {"type": "function_call_output", "call_id": "call_1", "output": "out"}]
    elif api == "messages":
        doc = {"model": model, "max_tokens": draw(st.integers(2, 4)), "stream": draw(st.booleans()),
               "messages": [{"role": "user", "content": draw(text)}]}
        if draw(st.booleans()):
            doc["thinking"] = {"type": "enabled", "budget_tokens": 1}
        if draw(st.booleans()):  # tools, and a history carrying a call and its result
            doc["tools"] = [{"name": "f", "description": "d", "input_schema": schema()}]
            call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": "x"}}
            doc["messages"] += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "out"}]}]}]
    elif api == "embeddings":
        doc = {"model": MODEL, "input": draw(st.one_of(text, st.lists(text, min_size=1, max_size=3))),
               "encoding_format": draw(st.sampled_from(["float", "base64"]))}
    else:
        doc = {"model": MODEL, "query": draw(text), "documents": draw(st.lists(text, min_size=1, max_size=3)),
               "top_n": draw(st.integers(1, 3))}
    return b"/v1/" + api.encode(), draw(mutated(st.just(doc)))


@seed(SEED)
@FUZZ
@given(data=st.data())
def test_responses_messages_embeddings_rerank_never_answer_5xx(server, data):
    post_drawn(server, data, newer_api_request())


# --- gRPC ----------------------------------------------------------------------------------------------

DATATYPES = ["INT64", "INT32", "FP32", "FP16", "BOOL", "UINT8", "BYTES", "", "int64"]
CONTENT_FIELDS = {"int64_contents": st.integers(-2 ** 63, 2 ** 63 - 1), "fp32_contents": st.floats(width=32),
                  "int_contents": st.integers(-2 ** 31, 2 ** 31 - 1), "bool_contents": st.booleans(),
                  "uint64_contents": st.integers(0, 2 ** 64 - 1)}


@st.composite
def infer_message(draw) -> bytes:
    """A ModelInferRequest with random fields around a valid one, or bytes that are not quite protobuf."""
    rows, seq = draw(st.integers(1, 2)), draw(st.integers(1, 6))
    request = proto.ModelInferRequest(model_name=draw(st.sampled_from([MODEL, MODEL, MODEL, "other", ""])),
                                      model_version=draw(st.sampled_from(["", "", "1", "2"])),
                                      id=draw(st.text(max_size=4)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["input_ids", "attention_mask", "x", ""]))
        shape = draw(st.one_of(st.just([rows, seq]), st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=3)))
        tensor = request.inputs.add(name=name, datatype=draw(st.sampled_from(DATATYPES)), shape=shape)
        if draw(st.integers(0, 4)) == 0:
            key = draw(st.sampled_from(["shared_memory_region", "binary_data_size", "k"]))
            tensor.parameters[key].int64_param = draw(st.integers(-5, 5))
        if raw:
            request.raw_input_contents.append(draw(st.one_of(st.binary(max_size=100), st.just(bytes(8 * rows * seq)))))
        elif draw(st.integers(0, 5)):
            field = draw(st.sampled_from(sorted(CONTENT_FIELDS)))
            size = draw(st.sampled_from([rows * seq, 0, 3]))
            getattr(tensor.contents, field).extend(draw(st.lists(CONTENT_FIELDS[field], min_size=size, max_size=size)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(st.sampled_from(["embedding", "y", ""])))
        if draw(st.booleans()):
            output.parameters["classification"].int64_param = 1
    message = request.SerializeToString()
    if draw(st.integers(0, 5)) == 0:  # corrupt it: cut, or overwrite a few bytes
        cut = draw(st.integers(0, len(message)))
        message = message[:cut] + draw(st.binary(max_size=8))
    return message


GRPC_CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc) as c:
        yield c


def grpc_code(channel: grpc.Channel, method: str, message: bytes) -> grpc.StatusCode:
    try:
        channel.unary_unary(proto.method_path(method))(message, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@seed(SEED)
@FUZZ
@given(message=infer_message())
def test_grpc_model_infer_never_answers_internal_or_unknown(channel, message):
    code = grpc_code(channel, "ModelInfer", message)
    assert code in GRPC_CLIENT_CODES, (code, message)


@seed(SEED)
@settings(FUZZ, max_examples=CASES // 5)
@given(method=st.sampled_from(["ModelMetadata", "ModelReady", "ServerMetadata", "ServerLive"]),
       name=st.sampled_from([MODEL, "x", ""]), version=st.text(max_size=3), tail=st.binary(max_size=6))
def test_grpc_metadata_rpcs_never_answer_internal_or_unknown(channel, method, name, version, tail):
    message = proto.ModelReadyRequest(name=name, version=version).SerializeToString() + tail
    assert grpc_code(channel, method, message) in GRPC_CLIENT_CODES


# --- the admin API -------------------------------------------------------------------------------------

def _admin_would_act(method: bytes, path: bytes, body: bytes) -> bool:
    """Whether an authorized request would add or remove a replica (the fuzz only sends those it may)."""
    if method == b"DELETE":
        return not path.startswith(b"/admin/replicas/zz")
    if method != b"POST" or path != b"/admin/replicas":
        return False
    try:
        options = json.loads(body) if body.strip() else {}
    except ValueError:
        return False
    return isinstance(options, dict) and set(options) <= {"prewarm"} and options.get("prewarm") in (None, True, False)


admin_path = st.one_of(st.sampled_from([b"/admin/replicas", b"/metrics", b"/nowhere", b"/admin/replicas/r0"]),
                       st.text(min_size=1, max_size=6).map(lambda t: b"/admin/replicas/zz" + t.encode().hex().encode()),
                       st.binary(min_size=1, max_size=6).map(lambda b: b"/admin/replicas/zz%" + b.hex()[:2].encode()))
admin_body = st.one_of(st.just(b""), st.binary(max_size=40), junk.map(dumps))


@seed(SEED)
@FUZZ
@given(method=st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT"]), path=admin_path, body=admin_body,
       authorization=st.one_of(st.none(), header_value, header_value.map(lambda b: b"Bearer " + b),
                               st.just(b"Bearer " + TOKEN.encode()), st.just(b"bearer " + TOKEN.encode())),
       encoding=st.one_of(st.none(), ENCODINGS))
def test_admin_api_answers_401_to_any_wrong_token_and_never_5xx(server, method, path, body, authorization, encoding):
    authorized = authorization == b"Bearer " + TOKEN.encode()
    assume(not (authorized and _admin_would_act(method, path, body)))
    headers = [(b"Authorization", authorization)] if authorization is not None else []
    headers += [(b"Content-Encoding", encoding)] if encoding is not None else []
    status, answer = raw_http(server.admin, method, path, headers, body)
    assert_not_5xx(status, answer, (method, path, headers, body))
    if not authorized:  # 401; or aiohttp's own plain-text 400 when its parser refuses the headers (a control
        # character in the token, an encoding it cannot decode) before the API sees the request
        refused_by_parser = status == 400 and b"Content-Type: text/plain" in answer.split(b"\r\n\r\n")[0]
        assert status == 401 or refused_by_parser, (status, answer[:300], authorization)


# --- the hostile requests found by hand, each with the answer it must get ------------------------------

def _json_infer(**changes) -> bytes:
    doc = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [5, 6]},
                      {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]}]}
    doc["inputs"][0].update(changes)
    return dumps(doc)


def _error_text(answer: bytes) -> str:
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    return error["message"] if isinstance(error, dict) else error  # OpenAI's shape, or v2's


def test_datatype_given_as_a_list_is_400_naming_the_input(server):
    status, answer = raw_http(server.url, b"POST", INFER, [], _json_infer(datatype=["INT64"]))
    assert status == 400
    assert "input 'input_ids': datatype ['INT64'] does not match the model's INT64" in _error_text(answer)


ALL_ZERO_INFER = _json_infer(data=[0, 0])


@pytest.mark.parametrize("path, body, admin", [
    (INFER, ALL_ZERO_INFER, False),
    (b"/v1/completions", dumps({"model": GENERATOR, "prompt": "hi", "max_tokens": 1}), False),
    (b"/admin/replicas", b'{"prewarm": true}', True),
], ids=["v2", "openai", "admin"])
def test_a_body_that_is_not_what_its_content_encoding_says_is_400(server, path, body, admin):
    url, auth = (server.admin, [(b"Authorization", b"Bearer " + TOKEN.encode())]) if admin else (server.url, [])
    for encoding in (b"gzip", b"deflate", b"br"):
        status, answer = raw_http(url, b"POST", path, [*auth, (b"Content-Encoding", encoding)], body)
        assert status == 400, answer[:400]
        assert _error_text(answer).startswith("cannot read the request body: Can not decode content-encoding")
    if not admin:  # a real gzip body is still decoded and served (tritonclient can compress its requests)
        status, answer = raw_http(url, b"POST", path, [(b"Content-Encoding", b"gzip")], gzip.compress(body))
        assert status == 200, answer[:400]


@pytest.mark.parametrize("authorization", [
    b"Bearer \xff\xfe", b"Bearer " + TOKEN.encode() + b"\xc3", ("Bearer " + TOKEN + "\xe9").encode("latin-1"),
    b"Bearer wrong", b"Basic " + TOKEN.encode(), None],
    ids=["not-utf8", "cut-utf8", "latin1", "wrong", "basic", "none"])
def test_admin_answers_401_to_a_missing_wrong_or_undecodable_token(server, authorization):
    headers = [(b"Authorization", authorization)] if authorization is not None else []
    status, answer = raw_http(server.admin, b"GET", b"/admin/replicas", headers, b"")
    assert status == 401 and b'WWW-Authenticate: Bearer realm="latscope-ref admin"' in answer, answer[:400]
    status, answer = raw_http(server.admin, b"GET", b"/admin/replicas",
                              [(b"Authorization", b"Bearer " + TOKEN.encode())], b"")
    assert status == 200


@pytest.mark.parametrize("length, words", [
    (b"-5", "must be the JSON header's length in bytes"),
    (b"abc", "must be the JSON header's length in bytes"),
    (b"1_0", "must be the JSON header's length in bytes"),
    (b"99999", "is 99999 but the body has"),
    (b"0", "is 0 but the body has"),
    (b"9" * 30, "is 99999999999999999999... but the body has"),
    (b"7", "the first 7 bytes of the body (Inference-Header-Content-Length: 7) are not a JSON header"),
    (b"LONGER", "are not a JSON header"),  # the JSON and 8 bytes of tensor data
], ids=["negative", "not-a-number", "underscore", "past-the-body", "zero", "30-digits", "shorter", "longer"])
def test_binary_request_whose_header_length_lies_is_400_naming_that_header(server, length, words):
    header = dumps({"inputs": [{"name": n, "datatype": "INT64", "shape": [1, 1],
                                "parameters": {"binary_data_size": 8}} for n in ("input_ids", "attention_mask")]})
    body = header + bytes(16)
    length = str(len(header) + 8).encode() if length == b"LONGER" else length
    status, answer = raw_http(server.url, b"POST", INFER, [(b"Inference-Header-Content-Length", length)], body)
    assert status == 400
    message = _error_text(answer)
    assert "Inference-Header-Content-Length" in message and words in message, message
    assert raw_http(server.url, b"POST", INFER, [(b"Inference-Header-Content-Length", str(len(header)).encode())],
                    body)[0] == 200  # the same body with the true length is served


@pytest.mark.parametrize("request_bytes, reason", [
    (b"GET /v2 HTTP/1.1\r\nHo st: x\r\n\r\n", "Invalid header token"),
    (b"POST /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "Invalid character in Content-Length"),
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-A: \x01\r\n\r\n", "Invalid header value char"),
], ids=["header-token", "content-length", "control-char"])
def test_requests_the_http_parser_refuses_are_400_with_one_log_line_and_no_traceback(server, request_bytes, reason):
    before = server.log_text().count(reason)
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request_bytes)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.") and answer.split(b" ", 2)[1] == b"400", answer
    line = wait_for(lambda: [x for x in server.log_text().splitlines() if reason in x][before:], 10, "the log line")
    assert len(line) == 1 and " INFO " in line[0] and "malformed request (a client's mistake" in line[0], line
    assert "Traceback" not in server.log_text()


@pytest.mark.parametrize("path", [INFER, b"/v1/completions", b"/v1/chat/completions"], ids=["v2", "completions", "chat"])
def test_a_client_that_closes_mid_body_is_one_info_line_not_an_unhandled_error(server, path):
    """Ten clients send their headers and 12 of the 100,000 bytes their Content-Length promises, then close:
    each is one INFO line naming the route and the bytes that came (it used to be an ERROR "unhandled error"
    with a traceback), and the server serves on."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    went_away = f"client went away: the client closed the connection while sending its request body " \
                f"(POST {path.decode()}, 12 of 100000 bytes came)"
    before = server.log_text().count(went_away)
    for _ in range(10):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{\"inputs\": [" % path)
            sock.shutdown(socket.SHUT_WR)  # nothing more comes: the server sees the connection end mid-body
    lines = wait_for(lambda: [x for x in server.log_text().splitlines() if went_away in x][before:] if
                     server.log_text().count(went_away) >= before + 10 else None, 10, "ten 'client went away' lines")
    assert len(lines) == 10 and all(" INFO " in line for line in lines), lines
    text = server.log_text()
    assert "Traceback" not in text and "unhandled" not in text and " ERROR " not in text, text[-3000:]
    assert http("GET", f"{server.url}/v2/health/ready")[0] == 200


def test_grpc_shape_whose_size_overflows_int64_is_invalid_argument_with_the_true_size(channel):
    request = proto.ModelInferRequest(model_name=MODEL)
    for name in ("input_ids", "attention_mask"):
        request.inputs.add(name=name, datatype="INT64", shape=[2 ** 61, 8])
        request.raw_input_contents.append(b"")
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(proto.method_path("ModelInfer"))(request.SerializeToString(), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"needs {2 ** 64 * 8} bytes" in caught.value.details()  # not "needs 0 bytes" (numpy wrapped it)


def test_no_traceback_or_error_in_the_server_log_after_the_fuzz(server):
    """Last in this module: everything above was a client's mistake, none of it is the server's error."""
    assert_quiet(server)
