"""Wire protocols behind one small interface.

A protocol client is created once per worker, opened inside the worker's event loop, and then asked
to `send` requests concurrently. It stamps `sent_ns` itself when it starts on a request (a connect
counts as service time, not send lag), and returns an `Outcome`; it never records anything. New
protocols (OpenAI streaming, KServe v2) add a module here and a branch in `make_client`.
"""

from __future__ import annotations

from typing import Protocol

from latscope.records import Outcome, Request
from latscope.scenario import Scenario


class Client(Protocol):
    async def open(self) -> None: ...

    async def send(self, request: Request) -> Outcome: ...

    async def close(self) -> None: ...


def make_client(scenario: Scenario, max_connections: int) -> Client:
    """The client for `scenario.target.protocol`."""
    if scenario.target.protocol == "http":
        from latscope.protocols.http import HttpClient

        return HttpClient(scenario, max_connections)
    raise ValueError(f"unknown protocol {scenario.target.protocol!r}")
