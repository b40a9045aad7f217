"""A hostile latscope worker, for tests/distributed/test_hostile_nodes.py: a locustfile.

    HOSTILE=<case> python -m locust -f tests/distributed/hostile_node.py --worker --master-host H --master-port P

It is a real Locust worker (Locust's own WorkerRunner: its connection, heartbeats and messages) that
speaks latscope's relay protocol as latscope's worker relay does (locustfile.py's hello with this
latscope and frames.WIRE_VERSION, clock answers, the node frames listed in wire.py) — until it sends
the one bad message its case names. It runs no engine and sends no request. It leaves when the
master quits (a refusal it ignores).
"""

from __future__ import annotations

import os
import socket
import time
import zlib

import gevent
from locust import User, constant, events, task
from locust.runners import WorkerRunner

from latscope import __version__
from latscope.distributed.frames import WIRE_VERSION

CASE = os.environ.get("HOSTILE", "")


class HostileIdleUser(User):
    wait_time = constant(3600)

    @task
    def idle(self) -> None:
        pass


def good_hello() -> dict:
    return {"latscope": __version__, "wire": WIRE_VERSION, "host": socket.gethostname(), "cpus": 2, "engines": 1,
            "python": "3", "numpy": "2", "locust": "2"}


HELLOS = {  # the hello cases: the master must refuse each, saying why
    "hello-list": ["latscope", __version__],
    "hello-no-engines": {k: v for k, v in good_hello().items() if k != "engines"},
    "hello-negative-engines": {**good_hello(), "engines": -3},
    "hello-huge-engines": {**good_hello(), "engines": 10**12},
    "hello-esc-host": {**good_hello(), "host": "evil\x1b[2J\x1b]0;owned\x07host", "engines": "8"},
    # admitted to the roster, then refused there: another host than the master's, with a loopback target
    "esc-host-admitted": {**good_hello(), "host": "evil\x1b[2J\x1b]0;owned\x07host"},
}


def bomb(pairs: int = 15) -> bytes:
    """zlib data (2.2 MB) that inflates to ~500 MiB of zeros, made in a fraction of a second: deflate's
    output for 16 MiB chunks of zeros repeats every two chunks, so that pair is written `pairs` times.
    What it inflates to, for its checksum, is measured on one and two pairs (84 MB, streamed)."""
    z = zlib.compressobj(1, zlib.DEFLATED, -15)
    zeros = bytes(16 << 20)
    head, a, b = (z.compress(zeros) for _ in range(3))
    tail = z.flush()

    def inflated(n: int) -> int:
        d, data, total = zlib.decompressobj(-15), head + (a + b) * n + tail, 0
        while data:
            total += len(d.decompress(data, 16 << 20))
            data = d.unconsumed_tail
        return total

    one, two = inflated(1), inflated(2)
    size = one + (pairs - 1) * (two - one)
    return b"\x78\x01" + head + (a + b) * pairs + tail + (((size % 65521) << 16) | 1).to_bytes(4, "big")


class Hostile:
    def __init__(self, environment) -> None:  # noqa: ANN001
        self.runner = environment.runner
        self.setup: dict | None = None
        for name, handler in (("who", self.on_who), ("ping", self.on_ping), ("down", self.on_down),
                              ("reject", self.on_reject)):
            self.runner.register_message(f"latscope:{name}", handler)
        self.payload = bomb() if CASE == "bomb" else None

    def up(self, frame: object) -> None:
        self.runner.send_message("latscope:up", frame)

    def on_who(self, environment, msg) -> None:  # noqa: ANN001
        self.runner.send_message("latscope:hello", HELLOS.get(CASE, good_hello()))

    def on_ping(self, environment, msg) -> None:  # noqa: ANN001
        if CASE == "pong-silent":
            return
        answer = {"pong-none": None, "pong-string": {"t1": msg.data["t1"], "t2": "soon"},
                  "pong-unasked": {"t1": msg.data["t1"] + 1, "t2": time.perf_counter_ns()}}.get(
            CASE, {"t1": msg.data["t1"], "t2": time.perf_counter_ns()})
        self.runner.send_message("latscope:pong", answer)

    def on_down(self, environment, msg) -> None:  # noqa: ANN001
        frame = msg.data
        if frame["t"] == "setup":
            gevent.spawn(self.after_setup, frame)
        elif frame["t"] == "start":
            gevent.spawn(self.after_start, frame)

    def after_setup(self, setup: dict) -> None:
        sha = next(iter(setup["files"].values()))[0] if setup["files"] else "0" * 64
        bad = {
            "frame-list": [1, 2, 3],
            "frame-string": "interval",
            "failed-not-string": {"t": "failed", "error": {"traceback": 42}},
            "done-missing-fields": {"t": "done", "not_sent": 0},
            "fetch-negative-offset": {"t": "fetch", "sha": sha, "offset": -1},
            "fetch-huge-offset": {"t": "fetch", "sha": sha, "offset": 10**18},
            "esc-failure": {"t": "failed", "error": "the node broke:\n  boom\x1b[2J\x1b[31m red\x07"},
            # records that would be written outside the run's .requests/, or under another node's engine
            "records-escape": {"t": "records", "name": "../../escape.parquet", "offset": 0, "size": 4, "data": b"PAR1"},
            "records-other-engine": {"t": "records", "name": "w007-000000.parquet", "offset": 0, "size": 4,
                                     "data": b"PAR1"},
        }.get(CASE)
        if bad is not None:
            self.up(bad)
        else:
            self.up({"t": "ready"})  # the interval cases: a ready node, then its bad report after the start

    def after_start(self, start: dict) -> None:
        self.up({"t": "started", "late_ms": 0.1})
        blob = {"interval-random-bytes": os.urandom(4096), "bomb": self.payload}.get(CASE)
        if blob is not None:
            self.up({"t": "interval", "k": 0, "blob": blob, "cpu": 1.0})

    def on_reject(self, environment, msg) -> None:  # noqa: ANN001
        print(f"hostile: refused: {msg.data['why']} (staying: it leaves when the master quits)", flush=True)


@events.init.add_listener
def _on_init(environment, **_) -> None:  # noqa: ANN001
    if isinstance(environment.runner, WorkerRunner):
        Hostile(environment)
