"""Wire protocols behind one small interface.

A protocol client is created once per worker for the workload classes it serves, opened inside the
worker's event loop, and then asked to `prepare` each request and later to `send` it, many
concurrently. `prepare` builds the request from the class's endpoint and the request's `Payload`
(workload.py) into `Request.wire` (with `wire_bytes`, and `encode_ns`, `prepared_ns`: the encode is
timed here), ahead of the request's intended time (the engine's look-ahead window); `send` stamps
`sent_ns` when it starts writing (a connect counts as service time, not send lag), times its own
decode, and returns an `Outcome`; it never records anything. `send` prepares a request that was not
(a test calling it directly). With `target.request_id_header`, each request carries its `seq` (as a UUID: request_ids.py).

What a client must never do, whatever the target does: read more than `limits.max_response_bytes`
of one response (an endless or enormous one ends as a `protocol` error, the connection dropped), or
write a request line or header holding CR, LF or NUL (http.unsafe_head, checked once per class when
the client is built; such a request is a `protocol` error "not sent: ..."). An exception escaping
`send` is a bug the engine still counts, as a `protocol` error.

| `target.protocol` | module | speaks |
| --- | --- | --- |
| `http` | http.py | any HTTP/1.1 request, body prepared once per class |
| `openai` | openai.py | OpenAI-compatible /v1/completions and /v1/chat/completions, SSE streaming or not |
| `openai-responses` | openai_responses.py | OpenAI's Responses API, /v1/responses: typed SSE events or whole (stream_events.py) |
| `anthropic-messages` | anthropic_messages.py | Anthropic's Messages API, /v1/messages: typed SSE events or whole (stream_events.py) |
| `kserve-v2` | kserve.py | KServe v2 / Open Inference Protocol over HTTP, JSON or binary tensors |
| `kserve-v2-grpc` | kserve_grpc.py | the same over gRPC (Triton's protocol too) |
| `openai-embeddings` | embeddings.py | OpenAI-compatible /v1/embeddings, a batch of inputs a request (batch.py) |
| `rerank` | rerank.py | a query and a batch of documents: /v1/rerank (vLLM, Jina, Cohere) or TEI's /rerank |

Which client speaks a protocol, and everything the scenario checks about it (URL schemes, default
path and method, model and tensors required), is one row of latscope.scenario.protocols.PROTOCOLS: a
new protocol is a module here plus a row there. A client class is constructed as
`Client(scenario, classes)`, or `Client(scenario, classes, payloads)` when its row says `payloads`.

Classes may override the target's protocol and URL, so one run can compare JSON, binary and gRPC:
`make_client` gives each (protocol, URL) its own client and routes every request by class.
"""

from __future__ import annotations

from importlib import import_module
from typing import Protocol

from latscope.records import Outcome, Request
from latscope.scenario import PROTOCOLS, Scenario
from latscope.workload import Payloads


class Client(Protocol):
    async def open(self) -> None: ...

    def prepare(self, request: Request) -> None: ...

    async def send(self, request: Request) -> Outcome: ...

    async def close(self) -> None: ...


class _Routed:
    """Several clients, each serving some classes."""

    def __init__(self, by_class: list[Client]):
        self._by_class = by_class
        self._clients = list({id(c): c for c in by_class}.values())

    async def open(self) -> None:
        for client in self._clients:
            await client.open()

    def prepare(self, request: Request) -> None:
        self._by_class[request.cls].prepare(request)

    async def send(self, request: Request) -> Outcome:
        return await self._by_class[request.cls].send(request)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


def client_class(protocol: str) -> type:
    """The client class of `protocol` (its row's `client`, "module:Class" in this package), imported
    here: a worker imports only the clients it speaks (gRPC's, for one, is heavy)."""
    module, name = PROTOCOLS[protocol].client.split(":")
    return getattr(import_module(f"latscope.protocols.{module}"), name)


def make_client(scenario: Scenario) -> Client:
    """The client for the scenario's classes: one per distinct (protocol, URL), routed by class."""
    n = len(scenario.workload.effective_classes())
    groups: dict[tuple[str, str], list[int]] = {}
    for c in range(n):
        endpoint = scenario.endpoint(c)
        groups.setdefault((endpoint.protocol, endpoint.url), []).append(c)
    payloads = Payloads(scenario) if any(PROTOCOLS[protocol].payloads for protocol, _ in groups) else None
    clients = {(protocol, url): client_class(protocol)(scenario, classes, *([payloads] if PROTOCOLS[protocol].payloads else []))
               for (protocol, url), classes in groups.items()}
    if len(clients) == 1:
        return next(iter(clients.values()))
    by_class: list[Client] = [None] * n  # type: ignore[list-item]
    for key, classes in groups.items():
        for c in classes:
            by_class[c] = clients[key]
    return _Routed(by_class)
