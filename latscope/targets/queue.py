"""A target whose capacity is known from queueing theory: one FIFO server, exponential service times.

    python -m latscope.targets.queue --port 0 --service-ms 2 --seed 1

Each request is served by one server, first come first served, for an exponentially distributed
time of mean `service_ms` (rate μ = 1000 / service_ms per second). Under Poisson arrivals at rate
λ < μ this is the M/M/1 queue, whose time in system (wait + service) is exponential with rate μ − λ:

    P(T > t) = exp(−(μ − λ)·t),   so its p-quantile is  −ln(1 − p) / (μ − λ),   p99 = ln(100) / (μ − λ),

and the highest arrival rate whose p99 stays at or under a limit L is  λ* = μ − ln(100) / L.
`latscope capacity` is checked against that λ* (tests/capacity/, benchmarks/capacity.py).

The queue runs in virtual time, so the box's own scheduling cannot bend it: a request arriving at
a (monotonic clock, after its body is read) departs at d = max(a, previous departure) + Exp(μ), and
its response is written at d. Lateness of the event loop's timer (under a millisecond) is added to
each response on its own and never piles up in the queue. It binds 127.0.0.1 by default, bounds
request bodies, and prints `ready http://HOST:PORT` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from aiohttp import web

from latscope.targets.echo import serve, target_app


def make_app(service_ms: float, seed: int = 0) -> web.Application:
    """The target's aiohttp application: an M/M/1 queue with mean service time `service_ms`."""
    rng = random.Random(seed)
    mean_s = service_ms / 1000
    last_departure = 0.0

    async def handle(request: web.Request) -> web.Response:
        nonlocal last_departure
        await request.read()
        arrival = time.monotonic()
        last_departure = departure = max(arrival, last_departure) + rng.expovariate(1 / mean_s)
        await asyncio.sleep(departure - time.monotonic())
        return web.json_response({"ok": True})

    return target_app(handle)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free one (printed on the ready line)")
    parser.add_argument("--service-ms", type=float, default=2.0, help="mean service time (exponential)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    serve(make_app(args.service_ms, args.seed), args.host, args.port)


if __name__ == "__main__":
    main()
