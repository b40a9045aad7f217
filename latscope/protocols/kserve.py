"""KServe v2 / Open Inference Protocol over HTTP/1.1: JSON tensors, or the binary tensor extension.

    POST /v2/models/<model>[/versions/<v>]/infer
    JSON:   {"inputs": [{"name", "shape", "datatype", "data": [flat, row-major]}], "outputs"?: [{"name"}]}
    binary: the same JSON header with `"parameters": {"binary_data_size": n}` per input instead of `data`,
            then the inputs' raw little-endian bytes in input order; `Inference-Header-Content-Length`
            gives the header's length. Outputs come back binary too: each named output asks with
            `"parameters": {"binary_data": true}`, or, when none are named, the request asks for all of
            them with the request-level `"parameters": {"binary_data_output": true}` (Triton's way, which
            the reference server, KServe and Triton follow).

What the client measures, besides what the HTTP transport does:
- `encode_ns`: from the request's tensors to the bytes that go on the wire (JSON or header + raw
  bytes, and the HTTP head) — done for every request (`prepare`, ahead of its send: engine.py),
  nothing cached, since that cost is the point;
- `decode_ns`: from the response body to validated numpy arrays (JSON parse, or header parse plus
  zero-copy views of the binary parts);
- `server_timing` / `replica` from the `Server-Timing` / `X-Replica-Id` headers.
`sent_ns` is stamped when the prepared request is sent and `end_ns` after the decode, so the decode
counts in service time (the `network` metric is service time minus decode and the server's own parts).

A response that is not a well-formed tensor response is a `protocol` error, "invalid tensor response:
<why>"; a 4xx/5xx answer is `http_4xx`/`http_5xx` with the server's `{"error": ...}` message.
`decode_response` (pure: body and header value in, arrays out) is public so that tests and tools can
check what came back.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from latscope.protocols.http import (Failure, HttpPool, http_error, prefix_or_refusal, refused_outcome, refused_what,
                                     request_id_line, request_id_name, what_it_sends, with_server_headers)
from latscope.records import Outcome, Request
from latscope.scenario import Scenario
from latscope.workload import DTYPES, Payloads, Tensor

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

# KServe v2 datatype -> the numpy dtype of its raw (little-endian) bytes. BF16 has no numpy type: its
# raw elements are kept as their 16-bit patterns. BYTES (variable-length elements) is handled apart.
RAW_DTYPES: dict[str, np.dtype] = {name: np.dtype(t).newbyteorder("<") for name, t in DTYPES.items()}
RAW_DTYPES["BF16"] = np.dtype("<u2")
# The numpy kinds JSON `data` may hold for each kind of datatype (as the reference server checks inputs).
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_WORDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "floating-point numbers", "U": "strings",
               "S": "strings", "O": "mixed or null values"}
KNOWN_DATATYPES = (*DTYPES, "BF16", "BYTES")


class InvalidResponse(ValueError):
    """A response that is not a valid KServe v2 tensor response; the message says why."""


# -- encoding (pure) -----------------------------------------------------------------------------


def little_endian(array: np.ndarray) -> np.ndarray:
    """`array` as C-contiguous little-endian data (no copy when it already is)."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def raw_bytes(array: np.ndarray) -> np.ndarray:
    """A zero-copy view of a contiguous array's bytes (1-D uint8), usable wherever bytes are joined."""
    return array.reshape(-1).view(np.uint8)


def _outputs_entry(outputs: list[str], binary: bool) -> list[dict[str, Any]]:
    if binary:
        return [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
    return [{"name": name} for name in outputs]


def encode_json(tensors: list[Tensor], outputs: list[str]) -> bytes:
    """A JSON infer request body: every input's data as a flat row-major list."""
    doc: dict[str, Any] = {"inputs": [
        {"name": t.name, "shape": list(t.array.shape), "datatype": t.datatype, "data": t.array.ravel().tolist()}
        for t in tensors
    ]}
    if outputs:
        doc["outputs"] = _outputs_entry(outputs, False)
    return json.dumps(doc, separators=(",", ":")).encode()


def encode_binary(tensors: list[Tensor], outputs: list[str]) -> tuple[bytes, list[np.ndarray]]:
    """A binary-extension infer request: (JSON header, the inputs' raw bytes in order, as views).
    The body is the header followed by the parts; asks for every output as binary."""
    arrays = [little_endian(t.array) for t in tensors]
    doc: dict[str, Any] = {"inputs": [
        {"name": t.name, "shape": list(a.shape), "datatype": t.datatype, "parameters": {"binary_data_size": a.nbytes}}
        for t, a in zip(tensors, arrays)
    ]}
    if outputs:
        doc["outputs"] = _outputs_entry(outputs, True)
    else:
        doc["parameters"] = {"binary_data_output": True}
    return json.dumps(doc, separators=(",", ":")).encode(), [raw_bytes(a) for a in arrays]


# -- decoding (pure) -----------------------------------------------------------------------------


def check_shape(name: str, shape: Any) -> int:
    """The element count of an output's shape, which must be a list of non-negative integers."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidResponse(f"output '{name}': shape must be a list of non-negative integers, got {_short(shape)}")
    return math.prod(shape)


def check_datatype(name: str, datatype: Any) -> str:
    if datatype not in KNOWN_DATATYPES:
        raise InvalidResponse(f"output '{name}': unknown datatype {_short(datatype)} "
                              f"(known: {', '.join(KNOWN_DATATYPES)})")
    return datatype


def from_raw(name: str, datatype: str, blob, shape: list[int]) -> np.ndarray:
    """One output's array from its raw little-endian bytes (zero-copy for fixed-size datatypes)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_elements(name, memoryview(blob), count).reshape(shape)
    dtype = RAW_DTYPES[datatype]
    if len(blob) != count * dtype.itemsize:
        raise InvalidResponse(f"output '{name}': {len(blob)} bytes of binary data, shape {shape} of {datatype} "
                              f"needs {count * dtype.itemsize}")
    return np.frombuffer(blob, dtype=dtype, count=count).reshape(shape)


def _bytes_elements(name: str, view: memoryview, count: int) -> np.ndarray:
    """BYTES elements: each a 4-byte little-endian length, then that many bytes."""
    pos, end = 0, len(view)
    if count * 4 > end:  # checked before anything is allocated: a shape may claim 10**24 elements
        raise InvalidResponse(f"output '{name}': {end} bytes of BYTES data cannot hold {count} elements "
                              f"(4 bytes each at least)")
    out = np.empty(count, dtype=object)
    for i in range(count):
        if pos + 4 > end:
            raise InvalidResponse(f"output '{name}': BYTES data ends after {i} of {count} elements")
        n = int.from_bytes(view[pos:pos + 4], "little")
        pos += 4
        if pos + n > end:
            raise InvalidResponse(f"output '{name}': BYTES element {i} runs past the end of its data")
        out[i] = bytes(view[pos:pos + n])
        pos += n
    if pos != end:
        raise InvalidResponse(f"output '{name}': {end - pos} bytes of BYTES data left after {count} elements")
    return out


def from_json(name: str, datatype: str, data: Any, shape: list[int]) -> np.ndarray:
    """One output's array from its JSON `data` (flat or nested, row-major), checked against shape and datatype."""
    count = math.prod(shape)
    try:
        array = np.asarray(data, dtype=object if datatype == "BYTES" else None)
    except (ValueError, TypeError) as exc:  # ragged nesting
        raise InvalidResponse(f"output '{name}': data is not a regular array ({exc})") from None
    if array.size != count:
        raise InvalidResponse(f"output '{name}': shape {shape} needs {count} elements, data has {array.size}")
    if datatype == "BYTES":
        return array.reshape(shape)
    target = np.dtype(np.float32) if datatype == "BF16" else RAW_DTYPES[datatype]
    allowed = _JSON_KINDS[target.kind]
    if array.dtype.kind not in allowed:
        found = _KIND_WORDS.get(array.dtype.kind, "non-numeric values")
        raise InvalidResponse(f"output '{name}': data holds {found}, not {datatype} values")
    try:
        return array.astype(target.newbyteorder("="), copy=False).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InvalidResponse(f"output '{name}': data does not fit {datatype} ({exc})") from None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def decode_response(body: bytes, header_length: str | None = None) -> dict[str, np.ndarray]:
    """The outputs of an infer response body, by name, in response order. `header_length` is the
    Inference-Header-Content-Length header (None: the whole body is JSON). Raises InvalidResponse."""
    raw = memoryview(b"")
    header = body
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidResponse(f"{HEADER_LENGTH} is {_short(header_length)}, not a number") from None
        if not 0 < n <= len(body):
            raise InvalidResponse(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
        header, raw = body[:n], memoryview(body)[n:]
    try:
        doc = json.loads(header)
    except ValueError as exc:  # UnicodeDecodeError too
        raise InvalidResponse(f"body is not JSON ({exc})") from None
    except RecursionError:
        raise InvalidResponse("body is not JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise InvalidResponse(f"body is JSON but not an object ({type(doc).__name__})")
    items = doc.get("outputs")
    if not isinstance(items, list):
        raise InvalidResponse("no 'outputs' list" if items is None else f"'outputs' is not a list ({_short(items)})")
    if not items:
        raise InvalidResponse("'outputs' is empty")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidResponse(f"outputs[{i}] is not an object")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidResponse(f"outputs[{i}] has no name")
        datatype = check_datatype(name, item.get("datatype"))
        if name in arrays:
            raise InvalidResponse(f"output '{name}' appears twice")
        shape = item.get("shape")
        check_shape(name, shape)
        params = item.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidResponse(f"output '{name}': parameters is not an object")
        if params and "binary_data_size" in params:
            size = params["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidResponse(f"output '{name}': binary_data_size is {_short(size)}, not a byte count")
            if offset + size > len(raw):
                left = len(raw) - offset
                raise InvalidResponse(f"output '{name}': binary_data_size {size} runs past the end of the body "
                                      f"({left} bytes of binary data left)")
            arrays[name] = from_raw(name, datatype, raw[offset:offset + size], shape)
            offset += size
        elif "data" in item:
            arrays[name] = from_json(name, datatype, item["data"], shape)
        else:
            raise InvalidResponse(f"output '{name}' has neither data nor parameters.binary_data_size")
    if offset != len(raw):
        raise InvalidResponse(f"{len(raw) - offset} bytes of binary data after the outputs' binary_data_size "
                              f"({offset} bytes) are accounted for")
    return arrays


def check_named_outputs(arrays: dict[str, np.ndarray], wanted: list[str]) -> None:
    """The outputs the request named must all be in the response."""
    missing = [name for name in wanted if name not in arrays]
    if missing:
        raise InvalidResponse(f"output(s) asked for but missing: {', '.join(missing)} "
                              f"(got: {', '.join(arrays) or 'none'})")


# -- the client ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ClassPlan:
    """How one workload class's requests are built (the parts that do not depend on the tensors)."""

    binary: bool
    outputs: list[str]
    prefix: bytes  # request line and headers, without the body-length headers
    request_id: bytes | None  # target.request_id_header and the run's id prefix (http.request_id_name)
    refused: str | None = None  # why the request cannot be written (http.unsafe_head): each one is an error
    sends: str | None = None  # what it carries beyond the plain request (http.what_it_sends)

    def encode(self, tensors: list[Tensor], seq: int) -> tuple[bytes, int]:
        """(the whole request `seq` as it goes on the wire, the body's length)."""
        prefix = self.prefix + request_id_line(self.request_id, seq)
        if self.binary:
            header, parts = encode_binary(tensors, self.outputs)
            body_len = len(header) + sum(len(p) for p in parts)
            lengths = b"Content-Length: %d\r\nInference-Header-Content-Length: %d\r\n\r\n" % (body_len, len(header))
            return b"".join([prefix, lengths, header, *parts]), body_len
        body = encode_json(tensors, self.outputs)
        return b"".join([prefix, b"Content-Length: %d\r\n\r\n" % len(body), body]), len(body)


class KServeClient:
    """KServe v2 REST for the classes that share one URL (one keep-alive pool); each class has its own
    path (model, version), headers, encoding and outputs."""

    def __init__(self, scenario: Scenario, classes: list[int], payloads: Payloads):
        self._pool = HttpPool(scenario.endpoint(classes[0]).url, scenario.endpoint(classes[0]).timeout,
                              scenario.limits.max_response_bytes)
        self._payloads = payloads
        self._plans: dict[int, _ClassPlan] = {}
        for c in classes:
            endpoint = scenario.endpoint(c)
            binary = endpoint.kserve.binary
            prefix, refused = prefix_or_refusal(endpoint, BINARY_TYPE if binary else JSON_TYPE, own=(HEADER_LENGTH,))
            self._plans[c] = _ClassPlan(binary, list(endpoint.kserve.outputs), prefix, request_id_name(endpoint, scenario), refused,
                                        what_it_sends(endpoint))

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    def prepare(self, request: Request) -> None:
        """The request's bytes: its tensors encoded (timed: `encode`). `wire` is (bytes, body length)."""
        plan = self._plans[request.cls]
        if plan.refused:
            return
        started = time.perf_counter_ns()
        request.wire = plan.encode(self._payloads.get(request).tensors, request.seq)
        request.wire_bytes = len(request.wire[0])
        request.prepared_ns = time.perf_counter_ns()
        request.encode_ns = request.prepared_ns - started

    async def send(self, request: Request) -> Outcome:
        return (await self.infer(request))[0]

    async def infer(self, request: Request) -> tuple[Outcome, dict[str, np.ndarray] | None]:
        """Send one request (prepared already, or now); its outcome, and the decoded outputs when it succeeded."""
        plan = self._plans[request.cls]
        if plan.refused:
            return refused_outcome(plan.refused), None
        if request.wire is None:
            self.prepare(request)
        (data, body_len), encode_ns = request.wire, request.encode_ns
        sent = time.perf_counter_ns()
        try:
            response = await self._pool.request(data, keep_body=True)
        except Failure as failure:
            return Outcome(sent, time.perf_counter_ns(), error=failure.kind, reason=failure.reason,
                           bytes_out=body_len, encode_ns=encode_ns), None
        outcome = Outcome(sent, response.end_ns, status=response.status, bytes_out=body_len,
                          bytes_in=response.body_len, encode_ns=encode_ns)
        with_server_headers(outcome, response)
        if response.status >= 400:
            return refused_what(http_error(outcome, response, response.body), plan.sends), None
        header_length = response.headers.get("inference-header-content-length")
        return decoded(outcome, lambda: decode_response(response.body or b"", header_length), plan.outputs)


def decoded(outcome: Outcome, decode: Callable[[], dict[str, np.ndarray]], outputs: list[str]
            ) -> tuple[Outcome, dict[str, np.ndarray] | None]:
    """Run `decode` on a response (timed: `decode_ns`, and part of the service time, so `end_ns` moves
    to its end) and check the named outputs came; an invalid response is a protocol error."""
    started = time.perf_counter_ns()
    try:
        arrays = decode()
        check_named_outputs(arrays, outputs)
    except InvalidResponse as exc:
        outcome.error, outcome.reason = "protocol", f"invalid tensor response: {exc}"
        return outcome, None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:  # what numpy says of what no check foresaw
        outcome.error, outcome.reason = "protocol", f"invalid tensor response: {type(exc).__name__}: {exc}"
        return outcome, None
    outcome.end_ns = time.perf_counter_ns()
    outcome.decode_ns = outcome.end_ns - started
    return outcome, arrays
