"""Wire protocols behind one small interface.

A protocol client is created once per worker for the workload classes it serves, opened inside the
worker's event loop, and then asked to `send` requests concurrently. It builds the request from the
class's endpoint and the request's `Payload` (workload.py), stamps `sent_ns` itself when it starts on
a request (a connect counts as service time, not send lag), times its own encode and decode, and
returns an `Outcome`; it never records anything.

| `target.protocol` | module | speaks |
| --- | --- | --- |
| `http` | http.py | any HTTP/1.1 request, body prepared once per class |
| `openai` | openai.py | OpenAI-compatible /v1/completions and /v1/chat/completions, SSE streaming or not |
| `kserve-v2` | kserve.py | KServe v2 / Open Inference Protocol over HTTP, JSON or binary tensors |
| `kserve-v2-grpc` | kserve_grpc.py | the same over gRPC (Triton's protocol too) |

Classes may override the target's protocol and URL, so one run can compare JSON, binary and gRPC:
`make_client` gives each (protocol, URL) its own client and routes every request by class.
"""

from __future__ import annotations

from typing import Protocol

from latscope.records import Outcome, Request
from latscope.scenario import Scenario


class Client(Protocol):
    async def open(self) -> None: ...

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

    async def send(self, request: Request) -> Outcome:
        return await self._by_class[request.cls].send(request)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


def _client(scenario: Scenario, protocol: str, classes: list[int], max_connections: int, payloads) -> Client:
    if protocol == "http":
        from latscope.protocols.http import HttpClient

        return HttpClient(scenario, classes, max_connections)
    if protocol == "openai":
        from latscope.protocols.openai import OpenAIClient

        return OpenAIClient(scenario, classes, max_connections, payloads)
    if protocol == "kserve-v2":
        from latscope.protocols.kserve import KServeClient

        return KServeClient(scenario, classes, max_connections, payloads)
    if protocol == "kserve-v2-grpc":
        from latscope.protocols.kserve_grpc import KServeGrpcClient

        return KServeGrpcClient(scenario, classes, max_connections, payloads)
    raise ValueError(f"unknown protocol {protocol!r}")


def make_client(scenario: Scenario, max_connections: int) -> Client:
    """The client for the scenario's classes: one per distinct (protocol, URL), routed by class."""
    from latscope.workload import Payloads

    n = len(scenario.workload.effective_classes())
    groups: dict[tuple[str, str], list[int]] = {}
    for c in range(n):
        endpoint = scenario.endpoint(c)
        groups.setdefault((endpoint.protocol, endpoint.url), []).append(c)
    payloads = Payloads(scenario) if any(protocol != "http" for protocol, _ in groups) else None
    clients = {key: _client(scenario, key[0], classes, max_connections, payloads) for key, classes in groups.items()}
    if len(clients) == 1:
        return next(iter(clients.values()))
    by_class: list[Client] = [None] * n  # type: ignore[list-item]
    for key, classes in groups.items():
        for c in classes:
            by_class[c] = clients[key]
    return _Routed(by_class)
