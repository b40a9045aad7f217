"""Starting and stopping a target that the scenario launches itself (`target.launch`).

The target runs in its own process group with its output in the results directory; latscope polls
its readiness URL, and afterwards stops the whole group (SIGTERM, then SIGKILL). `python` or
`python3` as the first word of the command means the interpreter running latscope, so a scenario
that launches a Python target works inside a virtualenv that is not activated.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from latscope.errors import RunError
from latscope.scenario import Launch, scrub
from latscope.scenario.base import split_credentials
from latscope.scenario.redact import redact_url

READY_POLL_S = 0.1
STOP_GRACE_S = 5.0


@dataclass
class LaunchedTarget:
    process: subprocess.Popen
    log_path: Path
    ready_after_s: float
    started_ns: int = 0  # perf_counter_ns when the process was started (Popen)
    ready_ns: int = 0  # perf_counter_ns when it was found ready (0 until then)

    def exit_code(self) -> int | None:
        return self.process.poll()


def command_argv(command: str | list[str]) -> list[str]:
    """A scenario's command (target.launch, a command action) as argv: a string is split with shlex
    (no shell); `python`/`python3` first means the interpreter running latscope."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def url_request(url: str, headers: dict[str, str] | None = None, **options) -> urllib.request.Request:
    """A urllib request for a scenario's URL: its userinfo goes as basic authentication (urllib would put
    it into the Host header), unless `headers` already carry an Authorization. `options`: Request's."""
    url, basic = split_credentials(url)
    headers = dict(headers or {})
    if basic and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = basic
    return urllib.request.Request(url, headers=headers, **options)


def _is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url_request(url), timeout=1.0) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def core_split(launch: Launch | None) -> tuple[set[int], set[int]] | None:
    """(latscope's cores, the target's cores) when the launched target asks for `cpus` of its own and
    this process may run on more cores than that; None otherwise (everything shares every core, as it
    does where the OS cannot pin: macOS)."""
    if launch is None or launch.cpus is None or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= launch.cpus:
        return None
    return set(cores[: -launch.cpus]), set(cores[-launch.cpus:])


@contextmanager
def cores_for_latscope(split: tuple[set[int], set[int]] | None) -> Iterator[None]:
    """Pin this process (and so every worker it starts) to latscope's share of a core split for the
    duration, then give it back every core it had."""
    if split is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, split[0])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_target(launch: Launch, cwd: Path, log_path: Path, should_stop: Callable[[], bool] = lambda: False,
                 cores: set[int] | None = None) -> LaunchedTarget:
    """Start the target (pinned to `cores`, the target's side of `core_split`, when given) and wait
    until its readiness URL answers 2xx (or, without one, until it has run for a moment without
    exiting). `should_stop` lets Ctrl-C end the wait."""
    argv = command_argv(launch.command)
    started = time.monotonic()
    started_ns = time.perf_counter_ns()
    with open(log_path, "ab") as log:
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env={**os.environ, **launch.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise RunError(f"cannot launch target {shlex.join(argv)}: {exc}") from exc
    if cores:  # at once: before the interpreter it execs has started any thread or process
        os.sched_setaffinity(process.pid, cores)
    target = LaunchedTarget(process, log_path, 0.0, started_ns)
    deadline = started + launch.ready_timeout
    while True:
        code = process.poll()
        if code is not None:
            raise RunError(f"launched target exited with code {code} before it was ready; its last output:\n{_tail(log_path)}")
        if launch.ready_url is None:
            if time.monotonic() - started >= 0.5:
                break
        elif _is_ready(launch.ready_url):
            break
        if should_stop():
            stop_target(target)
            raise RunError("interrupted while waiting for the launched target to become ready")
        if time.monotonic() > deadline:
            stop_target(target)
            raise RunError(
                f"launched target not ready at {redact_url(launch.ready_url)} after {launch.ready_timeout:g} s; "
                f"its last output:\n{_tail(log_path)}"
            )
        time.sleep(READY_POLL_S)
    target.ready_ns = time.perf_counter_ns()
    target.ready_after_s = (target.ready_ns - started_ns) / 1e9
    return target


def scrub_log(path: Path, secrets: list[str]) -> None:
    """Rewrite a launched target's output (target.log) with the scenario's secrets redacted: a target
    that logs the Authorization header it was sent must not put the key into the results. Line by
    line (a secret never holds a line break: the scenario refuses CR and LF in them), bytes kept."""
    if not secrets or not path.exists():
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with open(path, encoding="utf-8", errors="surrogateescape") as src, \
            open(tmp, "w", encoding="utf-8", errors="surrogateescape") as dst:
        for line in src:
            dst.write(scrub(line, secrets))
    os.replace(tmp, path)


def stop_target(target: LaunchedTarget) -> None:
    """SIGTERM the target's process group, SIGKILL it if it is still there after a grace period."""
    stop_group(target.process, STOP_GRACE_S)


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group of `process` (started with start_new_session), SIGKILL it if
    `process` is still there after `grace_s`; returns once it has exited."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass
