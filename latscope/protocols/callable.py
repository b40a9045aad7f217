"""An in-process client: a function stands in for the target (httpx's MockTransport, for latscope).

The engine's timing rules can then be tested without sockets, servers or their jitter: the handler
decides how long each request takes and how it ends, and the test knows exactly what the engine
should have recorded. Not a wire protocol, so it has no row in latscope.scenario.protocols.

    async def handler(request: Request) -> Outcome | None:
        await asyncio.sleep(0.005)       # a 5 ms service time
        return None                      # a success, timed here; or return an Outcome of your own

    engine = Engine(CallableClient(handler), ...)
"""

from __future__ import annotations

import inspect
import time
from typing import Awaitable, Callable, Union

from latscope.records import Outcome, Request

Handler = Callable[[Request], Union[Outcome, None, Awaitable[Union[Outcome, None]]]]


class CallableClient:
    """A `Client` whose every request is `handler(request)` (a function or a coroutine function). A
    handler that returns None is a success sent when it was called and ended when it returned (status
    200); one that returns an Outcome says everything itself. `requests` keeps what was sent."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.requests: list[Request] = []

    async def open(self) -> None:
        pass

    def prepare(self, request: Request) -> None:
        """Nothing to build: the handler is called at the send."""

    async def send(self, request: Request) -> Outcome:
        sent = time.perf_counter_ns()
        self.requests.append(request)
        result = self.handler(request)
        if inspect.isawaitable(result):
            result = await result
        return result if result is not None else Outcome(sent, time.perf_counter_ns(), status=200)

    async def close(self) -> None:
        pass
