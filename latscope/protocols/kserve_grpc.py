"""KServe v2 / Open Inference Protocol over gRPC (`inference.GRPCInferenceService/ModelInfer`, Triton's too).

One grpc.aio channel per client, that is per worker and URL: every request of the worker is an HTTP/2
stream on that channel's connection (a server that spreads load per connection, like the reference
server's replicas behind SO_REUSEPORT, sees one connection per worker). The RPC is called with raw
bytes in and out, so the client serializes and parses the protobuf messages itself and times them:
- `encode_ns`: building the ModelInferRequest (inputs' shapes and datatypes, each input's
  little-endian bytes in `raw_input_contents`, the fast path) and `SerializeToString` (`prepare`,
  ahead of the send: engine.py);
- `decode_ns`: `ModelInferResponse.FromString` and numpy arrays from `raw_output_contents` (zero-copy)
  or from typed `contents`, validated like REST responses.
The messages are the reference server's (`reference_server.proto`: the standard
`grpc_predict_v2.proto` in a private descriptor pool, so tritonclient can share the process).

Metadata: the endpoint's headers (keys lower-cased, as gRPC requires), `authorization: Bearer <key>`
when an api_key is set, and `<target.request_id_header, lower-cased>: <UUID of seq>` when one is. Per-call
deadline: target.timeout. Trailing metadata `server-timing` and `x-replica-id` give the server's
parts and the replica, as the HTTP headers do over REST.

A failed call becomes an Outcome whose `status` is the gRPC code's number and whose reason is
"gRPC <CODE>: <details>"; its kind follows the code (see `ERROR_KINDS_BY_CODE`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from latscope import __version__
from latscope.protocols.http import refused_outcome, request_id_tag, too_large, unsafe_head
from latscope.protocols.kserve import (
    InvalidResponse,
    check_datatype,
    check_shape,
    decoded,
    from_json,
    from_raw,
    little_endian,
)
from latscope.protocols.server_timing import parse_server_timing
from latscope.records import Outcome, Request
from latscope.request_ids import request_id
from latscope.scenario import Scenario
from latscope.workload import Payloads, Tensor
from reference_server import proto

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # what a request may be (a response: limits.max_response_bytes)
GRPC_MAX_LENGTH = 2**31 - 1  # grpc's message length options are 32-bit
MODEL_INFER = proto.method_path("ModelInfer")
TIMING_KEY = "server-timing"
REPLICA_KEY = "x-replica-id"
DETAILS_CHARS = 200  # how much of a status's details goes into a reason

_CLIENT_SIDE = ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNAUTHENTICATED",
                "PERMISSION_DENIED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED")
# gRPC status -> error kind: the HTTP-like split of what the caller got wrong (4xx) and what the server
# did (5xx); UNAVAILABLE is what a refused or dropped connection gives, DEADLINE_EXCEEDED a timeout.
ERROR_KINDS_BY_CODE: dict[grpc.StatusCode, str] = {
    code: ("connect" if code is grpc.StatusCode.UNAVAILABLE
           else "timeout" if code is grpc.StatusCode.DEADLINE_EXCEEDED
           else "http_4xx" if code.name in _CLIENT_SIDE
           else "http_5xx")
    for code in grpc.StatusCode if code is not grpc.StatusCode.OK
}

# datatype -> the InferTensorContents field that carries it and that field's element type (FP16 and BF16
# have no field: raw only).
_CONTENTS_FIELDS: dict[str, tuple[str, type]] = {
    "BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int32), "INT16": ("int_contents", np.int32),
    "INT32": ("int_contents", np.int32), "INT64": ("int64_contents", np.int64), "UINT8": ("uint_contents", np.uint32),
    "UINT16": ("uint_contents", np.uint32), "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64), "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64), "BYTES": ("bytes_contents", object),
}


# -- messages (pure) -----------------------------------------------------------------------------


def encode_infer_request(model: str, version: str | None, tensors: list[Tensor], outputs: list[str]) -> bytes:
    """A serialized ModelInferRequest with every input's bytes in raw_input_contents."""
    message = proto.ModelInferRequest(model_name=model, model_version=version or "")
    for tensor in tensors:
        array = little_endian(tensor.array)
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=array.shape)
        message.raw_input_contents.append(array.tobytes())
    for name in outputs:
        message.outputs.add(name=name)
    return message.SerializeToString()


def decode_infer_response(data: bytes) -> dict[str, np.ndarray]:
    """The outputs of a serialized ModelInferResponse, by name, in response order. Raises InvalidResponse."""
    try:
        message = proto.ModelInferResponse.FromString(data)
    except DecodeError as exc:
        raise InvalidResponse(f"not a ModelInferResponse ({exc})") from None
    items, raw = message.outputs, message.raw_output_contents
    if not items:
        raise InvalidResponse("no outputs")
    if raw and len(raw) != len(items):
        raise InvalidResponse(f"{len(raw)} raw_output_contents for {len(items)} outputs")
    arrays: dict[str, np.ndarray] = {}
    for i, item in enumerate(items):
        name = item.name
        if name in arrays:
            raise InvalidResponse(f"output '{name}' appears twice")
        datatype = check_datatype(name, item.datatype)
        shape = list(item.shape)
        check_shape(name, shape)
        if raw:
            arrays[name] = from_raw(name, datatype, raw[i], shape)
        elif item.HasField("contents"):
            arrays[name] = _from_contents(name, datatype, item.contents, shape)
        else:
            raise InvalidResponse(f"output '{name}' has neither contents nor raw_output_contents")
    return arrays


def _from_contents(name: str, datatype: str, contents, shape: list[int]) -> np.ndarray:
    if datatype not in _CONTENTS_FIELDS:
        raise InvalidResponse(f"output '{name}': {datatype} has no typed contents field, yet the response "
                              f"has no raw_output_contents")
    field, dtype = _CONTENTS_FIELDS[datatype]
    values = getattr(contents, field)
    if dtype is object:  # BYTES: one bytes object per element
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    else:
        array = np.fromiter(values, dtype=dtype, count=len(values))
    if array.size != math.prod(shape):
        raise InvalidResponse(f"output '{name}': shape {shape} needs {math.prod(shape)} elements, "
                              f"contents.{field} has {array.size}")
    return array.reshape(shape) if dtype is object else from_json(name, datatype, array, shape)


# -- the client ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ClassPlan:
    model: str
    version: str | None
    outputs: list[str]
    metadata: tuple[tuple[str, str], ...]
    timeout_s: float
    request_id: str | None  # target.request_id_header, lower-cased
    refused: str | None = None  # why the call cannot be made (http.unsafe_head on the metadata)
    id_tag: int = 0  # the run's part of its request ids (http.request_id_tag)


def _target(url: str) -> tuple[str, bool]:
    """(host:port for grpc, TLS or not) from a grpc:// or grpcs:// URL."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}", parts.scheme == "grpcs"


class KServeGrpcClient:
    """KServe v2 gRPC for the classes that share one URL (one channel); each class has its own model,
    version, outputs and metadata. The channel multiplexes every call over one HTTP/2 connection
    (the engine caps the calls in flight)."""

    def __init__(self, scenario: Scenario, classes: list[int], payloads: Payloads):
        first = scenario.endpoint(classes[0])
        self._target, self._tls = _target(first.url)
        self._payloads = payloads
        self._plans: dict[int, _ClassPlan] = {}
        for c in classes:
            endpoint = scenario.endpoint(c)
            metadata = {k.lower(): v for k, v in endpoint.headers.items()}
            if endpoint.api_key:
                metadata["authorization"] = f"Bearer {endpoint.api_key}"
            self._plans[c] = _ClassPlan(endpoint.model or "", endpoint.kserve.version, list(endpoint.kserve.outputs),
                                        tuple(metadata.items()), endpoint.timeout,
                                        endpoint.request_id_header and endpoint.request_id_header.lower(),
                                        unsafe_head("POST", endpoint.model or "", metadata), request_id_tag(scenario))
        self._limit = min(scenario.limits.max_response_bytes, GRPC_MAX_LENGTH)
        self._channel: grpc.aio.Channel | None = None
        self._infer = None

    async def open(self) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", self._limit),
            ("grpc.primary_user_agent", f"latscope/{__version__}"),
        ]
        if self._tls:
            self._channel = grpc.aio.secure_channel(self._target, grpc.ssl_channel_credentials(), options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self._target, options=options)
        self._infer = self._channel.unary_unary(MODEL_INFER)  # no (de)serializers: bytes in, bytes out

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def prepare(self, request: Request) -> None:
        """The serialized ModelInferRequest (timed: `encode`)."""
        plan = self._plans[request.cls]
        if plan.refused:
            return
        started = time.perf_counter_ns()
        request.wire = encode_infer_request(plan.model, plan.version, self._payloads.get(request).tensors, plan.outputs)
        request.wire_bytes = len(request.wire)
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
        data, encode_ns = request.wire, request.encode_ns
        metadata = (plan.metadata + ((plan.request_id, request_id(plan.id_tag, request.seq)),) if plan.request_id
                    else plan.metadata)
        sent = time.perf_counter_ns()
        try:
            call = self._infer(data, timeout=plan.timeout_s, metadata=metadata)
            response = await call
            first = time.perf_counter_ns()  # the response message is in (its trailers may follow)
            trailing = await call.trailing_metadata()  # the status and trailers end a gRPC response
            end = time.perf_counter_ns()
        except grpc.aio.AioRpcError as exc:
            end = time.perf_counter_ns()
            code = exc.code()
            details = " ".join((exc.details() or "").split())
            if len(details) > DETAILS_CHARS:
                details = details[:DETAILS_CHARS - 1] + "…"
            outcome = Outcome(sent, end, status=code.value[0], error=ERROR_KINDS_BY_CODE.get(code, "http_5xx"),
                              reason=f"gRPC {code.name}: {details}" if details else f"gRPC {code.name}", bytes_out=len(data),
                              encode_ns=encode_ns)
            if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:  # ours: the response limit
                outcome.error, outcome.reason = "protocol", f"{too_large(self._limit)} ({outcome.reason})"
            _with_trailing(outcome, exc.trailing_metadata())
            return outcome, None
        except (grpc.RpcError, ValueError, TypeError) as exc:  # e.g. metadata grpc refuses; never raise for one request
            return Outcome(sent, time.perf_counter_ns(), error="protocol", bytes_out=len(data), encode_ns=encode_ns,
                           reason=f"gRPC call failed: {type(exc).__name__}: {exc}"), None
        outcome = Outcome(sent, end, bytes_out=len(data), bytes_in=len(response), encode_ns=encode_ns, first_byte_ns=first)
        _with_trailing(outcome, trailing)
        return decoded(outcome, lambda: decode_infer_response(response), plan.outputs)


def _with_trailing(outcome: Outcome, metadata) -> None:
    """Server-Timing parts and the replica id from a call's trailing metadata."""
    if not metadata:
        return
    for key, value in metadata:
        if key == TIMING_KEY and outcome.server_timing is None and isinstance(value, str):
            outcome.server_timing = parse_server_timing(value)
        elif key == REPLICA_KEY and outcome.replica is None and isinstance(value, str):
            outcome.replica = value
