"""Real Locust masters and workers on loopback for the distributed tests, and a target that logs arrivals.

Every process a test starts carries LATSCOPE_TEST_MARK in its environment, and so do their children
(coordinator, nodes, engines): `marked()` finds any left over.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from aiohttp import web

from latscope.distributed.launch import worker_argv
from latscope.request_ids import request_row
from latscope.targets.echo import target_app

REPO = Path(__file__).resolve().parents[2]
LATSCOPE = [sys.executable, "-m", "latscope"]
SHIFT_S = 1000  # a shifted worker's CLOCK_MONOTONIC reads this much ahead
UNSHARE = ["unshare", "--user", "--map-root-user", "--time", "--fork", "--monotonic", str(SHIFT_S)]


def service_ms(seq: int) -> float:
    """Each request's service time, 20–80 ms, a function of its X-Request-Id alone: two runs that send
    the same schedule meet the same service times, so their latencies differ only by how they were
    sent. Tens of ms, so that what a 2-CPU machine adds to each request (about 1 ms more with a
    distributed run's seven processes on it than with a local run's three, measured) stays small
    against the sampling error of a percentile of ~600 requests (99.9 % intervals of ±8 % at p50, ±3 % at p90)."""
    return 20.0 + 60.0 * ((seq * 2654435761) % 1000) / 1000


def arrivals_app(log: list[tuple[int, int, str]]) -> web.Application:
    """An OpenAI-compatible chat endpoint (a whole answer, not streamed) that appends (X-Request-Id,
    arrival time.time_ns(), the last message's text) to `log` for every request. The wall clock, not
    the monotonic one: a time namespace shifts only the latter."""
    import asyncio

    async def handle(request: web.Request) -> web.Response:
        arrived = time.time_ns()
        seq = request_row(request.headers["X-Request-Id"])  # a UUID that says the row
        body = await request.json()
        log.append((seq, arrived, body["messages"][-1]["content"]))
        await asyncio.sleep(service_ms(seq) / 1000)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    return target_app(handle)


def can_shift_clock() -> str | None:
    """None when a process can run in a time namespace of its own here; else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run([*UNSHARE, sys.executable, "-c", "import time; print(time.monotonic())"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"time namespaces are not allowed here: {probe.stderr.strip()[:200]}"
    return None


@dataclass
class Cluster:
    """A master (`latscope run --distributed`) and its workers, all real processes."""

    tmp: Path
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    master: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)
    port: int = 0

    def env(self) -> dict:
        return {**os.environ, "LATSCOPE_TEST_MARK": self.mark, "LATSCOPE_CACHE": str(self.tmp / "cache")}

    def start_master(self, scenario: Path, out: Path, workers: int, *extra: str) -> None:
        self.master_log = self.tmp / "master.log"
        self.master = subprocess.Popen(
            [*LATSCOPE, "run", str(scenario), "--distributed", "--expect-workers", str(workers), "--bind", "127.0.0.1:0",
             "--quiet", "--workers-wait", "60", "--out", str(out), *extra],
            stdout=open(self.master_log, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=self.env())
        deadline = time.monotonic() + 30
        while not (found := re.search(r"listening on 127\.0\.0\.1:(\d+)", self.master_log.read_text())):
            assert time.monotonic() < deadline and self.master.poll() is None, self.master_log.read_text()
            time.sleep(0.05)
        self.port = int(found.group(1))

    def start_worker(self, engines: int = 1, shifted: bool = False, version: str | None = None) -> subprocess.Popen:
        """`latscope worker` (in a time namespace SHIFT_S ahead when `shifted`); with `version`, the
        same Locust worker with latscope's version string replaced before it starts."""
        i = len(self.workers)
        log = self.tmp / f"worker{i}.log"
        command = [*LATSCOPE, "worker", "--master-host", "127.0.0.1", "--master-port", str(self.port),
                   "--engines", str(engines)]
        if version is not None:
            argv = worker_argv("127.0.0.1", self.port, engines)
            command = [sys.executable, "-c", f"import latscope, runpy, sys; latscope.__version__ = {version!r}; "
                       f"sys.argv = {['locust', *argv[3:]]!r}; runpy.run_module('locust', run_name='__main__')"]
        home = self.tmp / f"worker{i}"  # a machine of its own: none of the scenario's files are here
        home.mkdir()
        proc = subprocess.Popen([*UNSHARE, *command] if shifted else command, stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, cwd=home, env=self.env())
        proc.log = log
        self.workers.append(proc)
        return proc

    def start_hostile(self, case: str) -> subprocess.Popen:
        """A real Locust worker that speaks latscope's protocol until it sends the bad message of
        `case` (hostile_node.py, a locustfile)."""
        i = len(self.workers)
        log = self.tmp / f"hostile{i}.log"
        argv = worker_argv("127.0.0.1", self.port, None)
        argv[argv.index("-f") + 1] = str(Path(__file__).with_name("hostile_node.py"))
        proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=self.tmp,
                                env={**self.env(), "HOSTILE": case})
        proc.log = log
        self.workers.append(proc)
        return proc

    def wait_master(self, timeout: float = 60) -> int:
        try:
            return self.master.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the master did not exit in {timeout} s:\n{self.master_log.read_text()}") from None

    def marked(self) -> list[psutil.Process]:
        """Live processes this cluster started (its own, and any child of theirs)."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("LATSCOPE_TEST_MARK") == self.mark:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def no_orphans(self, within_s: float = 10) -> list[str]:
        """[] once every process this cluster started has exited (within `within_s`); else their command lines."""
        deadline = time.monotonic() + within_s
        while (left := self.marked()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [" ".join(p.cmdline()[:6]) for p in left]

    def kill_all(self) -> None:
        for p in self.marked():
            try:
                p.kill()
            except psutil.Error:
                pass
        for w in [self.master, *self.workers]:
            if w is not None and w.poll() is None:
                w.kill()
                w.wait()


def wait_for_event(run_dir: Path, event: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    """Until events.jsonl of `run_dir` holds `event` (the run's own record of its progress)."""
    path = run_dir / "events.jsonl"
    deadline = time.monotonic() + timeout
    while not (path.exists() and f'"event": "{event}"' in path.read_text()):
        assert time.monotonic() < deadline, f"no {event} within {timeout} s"
        assert proc is None or proc.poll() is None, f"the master exited ({proc.returncode}) before {event}"
        time.sleep(0.05)
