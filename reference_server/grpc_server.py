"""KServe v2 gRPC front end (grpc.aio): `inference.GRPCInferenceService` on the same model and batcher as REST.

RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer. ModelInfer takes
tensors in `raw_input_contents` (one little-endian, row-major blob per input, in input order) or as
typed `contents` (int64_contents, fp32_contents, ...), and always answers with `raw_output_contents`,
byte for byte what the REST binary extension sends.

Validation is the REST front end's (`v2`), so the same mistake gets the same message: bad input ->
INVALID_ARGUMENT naming the input, unknown model or version -> NOT_FOUND, queue full ->
RESOURCE_EXHAUSTED (+ `retry-after` trailing metadata), a backend failure -> INTERNAL (never bad
input). Every answer carries trailing metadata `x-replica-id`; ModelInfer answers also carry
`server-timing`, formatted exactly like the HTTP header. Handlers take and return raw bytes, so that
protobuf parsing counts in `deser` and protobuf encoding in `ser`, as JSON parsing and encoding do over
REST (and a body that is not protobuf is INVALID_ARGUMENT, not the INTERNAL grpc would answer).
Messages over `max_body_bytes` are refused by grpc itself with RESOURCE_EXHAUSTED before any handler
runs (so they are not in the request metrics).

Metrics: the REST counters and histograms, with `endpoint` = the RPC path
("/inference.GRPCInferenceService/ModelInfer") and `status` = the gRPC code name ("OK",
"INVALID_ARGUMENT", ...).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from reference_server import __version__, proto, v2
from reference_server.batcher import InferenceFailed, Overloaded, RequestTooLarge
from reference_server.http_server import RETRY_AFTER_S, SERVER_NAME, ServedModel
from reference_server.metrics import Metrics, server_timing
from reference_server.signature import Signature, TensorSpec

log = logging.getLogger(__name__)

REPLICA_KEY = "x-replica-id"
TIMING_KEY = "server-timing"

# v2 datatype -> (InferTensorContents field, numpy dtype of that protobuf field) for typed contents.
# FP16 (and BYTES, which this server does not serve) have no typed field: they go in raw_input_contents.
_CONTENTS: dict[str, tuple[str, np.dtype]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
}
_UNSUPPORTED_INPUT_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


# --- messages <-> v2 requests (pure functions) ---------------------------------------------------------

def _from_raw(spec: TensorSpec, blob: bytes, index: int, shape: tuple[int, ...]) -> np.ndarray:
    expected = math.prod(shape) * spec.dtype.itemsize  # Python ints: np.prod wraps past 2**63 (to 0 bytes, say)
    if len(blob) != expected:
        raise v2.BadRequest(f"input '{spec.name}': raw_input_contents[{index}] has {len(blob)} bytes, shape "
                            f"{list(shape)} of {spec.datatype} needs {expected} bytes")
    return v2.from_binary(spec, len(blob), memoryview(blob), 0, shape)


def _from_contents(spec: TensorSpec, contents, shape: tuple[int, ...]) -> np.ndarray:
    if spec.datatype not in _CONTENTS:
        raise v2.BadRequest(f"input '{spec.name}': {spec.datatype} has no typed contents field; "
                            f"send it in raw_input_contents")
    wanted, dtype = _CONTENTS[spec.datatype]
    given = [f.name for f, _ in contents.ListFields()]
    if given != [wanted]:
        others = ", ".join(f"contents.{name}" for name in given if name != wanted) or "nothing"
        raise v2.BadRequest(f"input '{spec.name}': {spec.datatype} data goes in contents.{wanted} alone; "
                            f"the request set {others}")
    values = getattr(contents, wanted)
    # Same element-count, kind and range checks, reshape and cast as JSON data over REST.
    return v2.from_json(spec, np.fromiter(values, dtype=dtype, count=len(values)), shape)


def decode_infer_request(message, signature: Signature) -> v2.InferRequest:
    """Validate a ModelInferRequest against the model, as `v2.decode_request` does a REST body."""
    items = message.inputs
    if not items:
        raise v2.BadRequest("'inputs' must be a non-empty list of tensors")
    raw = message.raw_input_contents
    if raw and len(raw) != len(items):
        raise v2.BadRequest(f"raw_input_contents has {len(raw)} entries for {len(items)} inputs; "
                            f"send one per input, in the order of 'inputs'")
    inputs: dict[str, np.ndarray] = {}
    seen: dict[str, tuple[int, str]] = {}
    for index, item in enumerate(items):
        name = item.name
        spec, shape = v2.check_input(signature, name, item.datatype, list(item.shape), inputs, seen)
        if unsupported := [p for p in _UNSUPPORTED_INPUT_PARAMETERS if p in item.parameters]:
            raise v2.BadRequest(f"input '{name}': shared memory ({unsupported[0]}) is not supported by this "
                                f"server; send the tensor in raw_input_contents")
        if raw:
            if item.HasField("contents"):
                raise v2.BadRequest(f"input '{name}' has typed contents but the request uses raw_input_contents: "
                                    f"use one or the other for every input")
            inputs[name] = _from_raw(spec, raw[index], index, shape)
        elif item.HasField("contents"):
            inputs[name] = _from_contents(spec, item.contents, shape)
        else:
            raise v2.BadRequest(f"input '{name}' has neither contents nor an entry in raw_input_contents")

    v2.check_all_given(signature, inputs)

    outputs = []
    for item in message.outputs:
        if signature.output(item.name) is None:
            expected = ", ".join(t.name for t in signature.outputs)
            raise v2.BadRequest(f"unknown output {item.name!r}; the model's outputs are: {expected}")
        if "classification" in item.parameters:
            raise v2.BadRequest(f"output '{item.name}': the classification extension is not supported")
        outputs.append((item.name, True))
    if not outputs:
        outputs = [(t.name, True) for t in signature.outputs]
    return v2.InferRequest(message.id or None, inputs, outputs)


def encode_infer_response(model_name: str, request: v2.InferRequest, outputs: dict[str, np.ndarray],
                          signature: Signature):
    """A ModelInferResponse with every requested output in raw_output_contents (same bytes as REST binary)."""
    response = proto.ModelInferResponse(model_name=model_name, model_version=v2.MODEL_VERSION, id=request.id or "")
    for name, _ in request.outputs:
        spec = signature.output(name)
        array = outputs[name]
        response.outputs.add(name=name, datatype=spec.datatype, shape=array.shape)
        response.raw_output_contents.append(np.ascontiguousarray(array, dtype=spec.dtype).tobytes())
    return response


# --- the service ---------------------------------------------------------------------------------------

@dataclass
class _Abort(Exception):
    code: grpc.StatusCode
    message: str
    metadata: tuple[tuple[str, str], ...] = field(default=())


Trailing = list[tuple[str, str]]
Handler = Callable[[bytes, Trailing], Awaitable[bytes]]


class InferenceService:
    """The RPC handlers for one model. Each takes the request bytes and a list to add trailing metadata
    to, and returns the response bytes; failures raise _Abort."""

    def __init__(self, model: ServedModel, metrics: Metrics, *, extra_latency_ms: float = 0.0) -> None:
        self.model = model
        self.metrics = metrics
        self.extra_latency_s = extra_latency_ms / 1000

    @staticmethod
    def _parse(name: str, body: bytes):
        try:
            return proto.METHODS[name][0].FromString(body)
        except DecodeError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {name}Request: {exc}") from None

    def _check_model(self, name: str, version: str) -> None:
        if name != self.model.name:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"unknown model {name!r}; this server serves {self.model.name!r}")
        if version not in ("", v2.MODEL_VERSION):
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"model {name!r} has no version {version!r}; "
                                                    f"its versions: {v2.MODEL_VERSION}")

    async def server_live(self, body: bytes, trailing: Trailing) -> bytes:
        self._parse("ServerLive", body)
        return proto.ServerLiveResponse(live=True).SerializeToString()

    async def server_ready(self, body: bytes, trailing: Trailing) -> bytes:
        self._parse("ServerReady", body)
        return proto.ServerReadyResponse(ready=True).SerializeToString()

    async def model_ready(self, body: bytes, trailing: Trailing) -> bytes:
        request = self._parse("ModelReady", body)
        self._check_model(request.name, request.version)
        return proto.ModelReadyResponse(ready=True).SerializeToString()

    async def server_metadata(self, body: bytes, trailing: Trailing) -> bytes:
        self._parse("ServerMetadata", body)
        return proto.ServerMetadataResponse(name=SERVER_NAME, version=__version__,
                                            extensions=["binary_tensor_data"]).SerializeToString()

    async def model_metadata(self, body: bytes, trailing: Trailing) -> bytes:
        request = self._parse("ModelMetadata", body)
        self._check_model(request.name, request.version)
        meta = v2.model_metadata(self.model.name, self.model.platform, self.model.signature)
        return proto.ModelMetadataResponse(**meta).SerializeToString()

    async def model_infer(self, body: bytes, trailing: Trailing) -> bytes:
        started = time.perf_counter_ns()
        request = self._parse("ModelInfer", body)
        self._check_model(request.model_name, request.model_version)
        try:
            decoded = decode_infer_request(request, self.model.signature)
        except v2.BadRequest as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        deser_ns = time.perf_counter_ns() - started

        if self.extra_latency_s:  # simulated slowdown (--extra-latency-ms): not part of any Server-Timing entry
            await asyncio.sleep(self.extra_latency_s)
        try:
            result = await self.model.batcher.submit(decoded.inputs)
        except Overloaded as exc:
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"server overloaded: {exc}; retry after {RETRY_AFTER_S} s",
                         (("retry-after", str(RETRY_AFTER_S)),)) from None
        except RequestTooLarge as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except InferenceFailed as exc:
            raise _Abort(grpc.StatusCode.INTERNAL, str(exc)) from None
        self.metrics.queue_seconds.observe(result.queue_ns / 1e9)

        started = time.perf_counter_ns()
        payload = encode_infer_response(self.model.name, decoded, result.outputs,
                                        self.model.signature).SerializeToString()
        trailing.append((TIMING_KEY, server_timing(queue_ns=result.queue_ns, deser_ns=deser_ns,
                                                   compute_ns=result.compute_ns,
                                                   ser_ns=time.perf_counter_ns() - started,
                                                   batch=result.batch_size)))
        return payload

    def handlers(self) -> dict[str, Handler]:
        return {"ServerLive": self.server_live, "ServerReady": self.server_ready, "ModelReady": self.model_ready,
                "ServerMetadata": self.server_metadata, "ModelMetadata": self.model_metadata,
                "ModelInfer": self.model_infer}


def _observed(name: str, handler: Handler, metrics: Metrics, replica_id: str):
    """The grpc.aio behaviour for one RPC: run `handler`, set trailing metadata, turn failures into status
    codes, count and time it in the shared request metrics."""
    endpoint = proto.method_path(name)

    async def behaviour(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        trailing: Trailing = []
        metrics.in_flight.inc()
        try:
            payload = await handler(body, trailing)
            context.set_trailing_metadata((*trailing, (REPLICA_KEY, replica_id)))
            return payload
        except _Abort as exc:
            code = exc.code
            await context.abort(exc.code, exc.message, trailing_metadata=(*exc.metadata, (REPLICA_KEY, replica_id)))
        except asyncio.CancelledError:  # the client went away or the server is stopping
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must still answer, and be logged with its traceback
            code = grpc.StatusCode.INTERNAL
            log.exception("unhandled error in %s", endpoint)
            await context.abort(code, f"internal error: {type(exc).__name__}: {exc}",
                                trailing_metadata=((REPLICA_KEY, replica_id),))
        finally:
            metrics.in_flight.dec()
            metrics.requests.labels(endpoint, code.name).inc()
            metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - started)
        raise AssertionError("unreachable: context.abort raises")

    return behaviour


def default_replica_id() -> str:
    """The same `<hostname>-<pid>` the REST front end puts in X-Replica-Id."""
    return f"{socket.gethostname()}-{os.getpid()}"


class GrpcFrontEnd:
    """A grpc.aio server: `bind` early (before the model loads, so a taken port fails fast),
    `serve_model` once the batcher exists, then `start` and, on shutdown, `stop`."""

    def __init__(self, server: grpc.aio.Server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port

    @classmethod
    def bind(cls, host: str, port: int, *, max_body_bytes: int, reuse_port: bool = False) -> GrpcFrontEnd:
        """Create the server and bind host:port (0 = any free port). Needs a running event loop.
        `reuse_port` lets several processes share the port (SO_REUSEPORT); off, a taken port is an error.
        Raises OSError when the address cannot be bound."""
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_body_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ])
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises RuntimeError("Failed to bind to address ...")
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if not bound:  # older grpcio returns 0 instead of raising
            raise OSError(f"cannot listen on {address}")
        return cls(server, host, bound)

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def serve_model(self, model: ServedModel, metrics: Metrics, *, extra_latency_ms: float = 0.0,
                    replica_id: str | None = None) -> None:
        replica_id = replica_id or default_replica_id()
        service = InferenceService(model, metrics, extra_latency_ms=extra_latency_ms)
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(  # no (de)serializers: handlers see and return bytes
                _observed(name, handler, metrics, replica_id))
            for name, handler in service.handlers().items()
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(proto.SERVICE, handlers),))

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        """Refuse new RPCs, give in-flight ones up to `grace_s` to finish, then cancel the rest."""
        await self.server.stop(grace_s)


DEFAULT_PORT = 8001  # Triton's and KServe's gRPC port
OFF = -1


def bind_grpc(host: str, port: int | None, *, max_body_bytes: int, reuse_port: bool = False) -> GrpcFrontEnd | None:
    """The gRPC front end as `--grpc-port` asks: None (not given) = DEFAULT_PORT, or no gRPC with a warning
    when that port is taken; OFF (-1) = no gRPC; 0 = any free port. Raises OSError when a port that was
    asked for explicitly cannot be bound."""
    if port == OFF:
        log.info("grpc: off (--grpc-port %d)", OFF)
        return None
    try:
        return GrpcFrontEnd.bind(host, DEFAULT_PORT if port is None else port, max_body_bytes=max_body_bytes,
                                 reuse_port=reuse_port)
    except OSError as exc:
        if port is not None:
            raise
        log.warning("grpc: off, the default port is taken (%s); pass --grpc-port PORT, or 0 for any free port", exc)
        return None
