"""A small HTTP target for examples and tests: answers every request after a configurable delay.

    python -m latscope.targets.echo --port 8765 --delay-ms 2 --jitter-ms 1

It can also freeze, like a process stopped with ^Z or a long GC pause: with `--freeze-every 10
--freeze-for 2` every request that arrives during the 2 s freeze at the start of each 10 s cycle is
held until the freeze ends. It binds 127.0.0.1 by default and bounds request bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from typing import Awaitable, Callable

from aiohttp import web

MAX_BODY_BYTES = 1 << 20


def make_app(delay_ms: float = 1.0, jitter_ms: float = 0.0, freeze_every: float = 0.0, freeze_for: float = 0.0,
             seed: int = 0) -> web.Application:
    """The target's aiohttp application. Freeze cycles are counted from the app's start."""
    rng = random.Random(seed)
    started = time.monotonic()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if freeze_every > 0 and freeze_for > 0:
            into_cycle = (time.monotonic() - started) % freeze_every
            if into_cycle < freeze_for:
                await asyncio.sleep(freeze_for - into_cycle)
        delay = delay_ms + (rng.uniform(-jitter_ms, jitter_ms) if jitter_ms else 0.0)
        if delay > 0:
            await asyncio.sleep(delay / 1000)
        return web.json_response({"ok": True, "received_bytes": len(body)})

    return target_app(handle)


def target_app(handle: Callable[[web.Request], Awaitable[web.Response]]) -> web.Application:
    """An application that answers GET /health and sends every other request to `handle`, with
    request bodies bounded (the other demo targets build on it)."""
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready", "pid": os.getpid()})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def serve(app: web.Application, host: str, port: int) -> None:
    """Serve `app` on host:port (0: a free port) until interrupted, on uvloop where it is installed,
    printing `ready http://HOST:PORT` once it listens (what tests and `target.launch` wait for)."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = site._server.sockets[0].getsockname()[:2]
        print(f"ready http://{bound_host}:{bound_port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay-ms", type=float, default=1.0, help="mean response delay")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform ± jitter around the delay")
    parser.add_argument("--freeze-every", type=float, default=0.0, metavar="S", help="freeze cycle length")
    parser.add_argument("--freeze-for", type=float, default=0.0, metavar="S", help="freeze length per cycle")
    args = parser.parse_args(argv)
    app = make_app(args.delay_ms, args.jitter_ms, args.freeze_every, args.freeze_for)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
