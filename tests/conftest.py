"""Fixtures: real HTTP servers on free loopback ports, and scenarios that point at them."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest
from aiohttp import web

from latscope.targets.echo import make_app

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"  # the traces the scenarios, tests and benchmarks replay (data/README.md: licences)

# The smallest valid scenario file (points at a closed port: for validation tests only).
MINIMAL = """\
name: t
target:
  url: http://127.0.0.1:9
phases:
  - name: p
    duration: 1
    arrival: {type: constant, rate: 5}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 from a background thread with its own event loop; yields the base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app, access_log=None)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def target() -> Iterator[Callable[..., str]]:
    """Factory: target(delay_ms=1, freeze_every=0, freeze_for=0) starts a built-in target and returns its URL."""
    with_stack: list = []

    def start(**kwargs) -> str:
        cm = serve(make_app(**kwargs))
        with_stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(with_stack):
        cm.__exit__(None, None, None)


def scenario_dict(url: str, tmp_path: Path, phases: list[dict], **extra) -> dict:
    """A minimal scenario for `url` writing its results under tmp_path."""
    data = {
        "name": "test",
        "seed": 1,
        "target": {"url": url, "method": "POST", "path": "/infer", "timeout": 5},
        "workload": {"body": {"inputs": [1, 2, 3]}},
        "phases": phases,
        "output": {"dir": str(tmp_path / "results"), "report": False},  # no test of a run reads its report
    }
    for key, value in extra.items():
        data[key] = value
    return data


@contextmanager
def stream_target_process(ttft_ms: float, itl_ms: float, tokens: int) -> Iterator[str]:
    """`python -m latscope.targets.stream` as a real process on a free loopback port; yields its base URL."""
    with target_process("stream", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", str(tokens)) as url:
        yield url


@contextmanager
def target_process(name: str, *args: str, cores: set[int] | None = None) -> Iterator[str]:
    """`python -m latscope.targets.NAME --port 0 ARGS` as a real process on a free loopback port (pinned
    to `cores` when given), once it printed its `ready http://...` line; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", f"latscope.targets.{name}", "--port", "0", *args], cwd=REPO,
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready http://"), line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(10)
