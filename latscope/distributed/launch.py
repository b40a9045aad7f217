"""The commands behind `latscope run --distributed`, `latscope worker` and `latscope locustfile`.

The first two become the Locust processes they stand for (os.execv: the same process, so a
terminal's Ctrl-C, a container's SIGTERM and the exit code are Locust's, and Locust's are latscope's):

    python -m locust -f <locustfile.py> --master --headless --master-bind-host H --master-bind-port P
        --expect-workers N --expect-workers-max-wait W --latscope-scenario FILE …
    python -m locust -f <locustfile.py> --worker --master-host H --master-port P [--latscope-engines N]

`python -m locust`, not the `locust` script: gevent patches the interpreter before anything else is
imported, and nothing here has been imported into it.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Callable

from latscope.errors import RunError

DEFAULT_PORT = 5557  # Locust's master port
NEEDS_LOCUST = "distributed runs need Locust: pip install 'latscope[distributed]'"


def locustfile_path() -> Path:
    return Path(__file__).with_name("locustfile.py")


def split_bind(bind: str) -> tuple[str, int]:
    """HOST:PORT (PORT 0: any free one, printed by the master) -> (host, port)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--bind {bind!r}: give HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT} or 0.0.0.0:{DEFAULT_PORT}")
    return host.strip("[]"), int(port)


def master_argv(scenario_file: Path, *, expect: int, bind: str, on_node_loss: str, workers_wait_s: float,
                master_timeout_s: float, overrides: tuple[str, ...], out: Path | None, run_args: list[str]) -> list[str]:
    host, port = split_bind(bind)
    argv = [sys.executable, "-m", "locust", "-f", str(locustfile_path()), "--master", "--headless",
            "--master-bind-host", host, "--master-bind-port", str(port), "--expect-workers", str(expect),
            "--expect-workers-max-wait", f"{workers_wait_s:g}", "--loglevel", "WARNING", "--only-summary",
            "--latscope-scenario", str(scenario_file), "--latscope-on-node-loss", on_node_loss,
            "--latscope-master-timeout", f"{master_timeout_s:g}"]
    argv += [a for kv in overrides for a in ("--latscope-set", kv)]
    argv += ["--latscope-out", str(out)] if out else []
    return argv + ([f"--latscope-run-args={shlex.join(run_args)}"] if run_args else [])


def worker_argv(master_host: str, master_port: int, engines: int | None) -> list[str]:
    argv = [sys.executable, "-m", "locust", "-f", str(locustfile_path()), "--worker", "--master-host", master_host,
            "--master-port", str(master_port), "--loglevel", "WARNING"]
    return argv + (["--latscope-engines", str(engines)] if engines else [])


def exec_locust(argv: list[str]) -> None:
    """Become the Locust process (never returns); RunError when Locust is not installed."""
    if importlib.util.find_spec("locust") is None:
        raise RunError(NEEDS_LOCUST)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def remote_pool(relay_fd: int, scenario_file: Path, overrides: tuple[str, ...], *, expect: int, on_node_loss: str,
                master_timeout_s: float) -> Callable:
    """run_scenario's make_pool for the coordinator: its senders are the machines behind the relay."""
    from latscope.distributed.remote import RemotePool

    def make(scenario, plan, events, requests_dir):  # noqa: ANN001, ANN202 - requests_dir: the run's .requests/ (None: off)
        sock = socket.socket(fileno=relay_fd)
        sock.setblocking(True)  # the relay's end is gevent's, non-blocking: the flag is shared
        return RemotePool(sock, scenario_file, overrides, scenario, plan, events, expect=expect, on_node_loss=on_node_loss,
                          master_timeout_s=master_timeout_s, requests_dir=None if requests_dir is None else Path(requests_dir))

    return make
