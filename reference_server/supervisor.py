"""The supervisor: `latscope-ref serve` runs N replica processes serving one port, starts and stops them,
and serves the admin API (admin.py) that adds and removes them.

Process model. `latscope-ref serve` is the supervisor: it checks the flags, reserves the HTTP and
gRPC ports, builds the built-in model once (into the cache), serves the admin API (admin.py) and starts
each replica as `python -m reference_server replica --index I --parent-pid P`, a fresh interpreter
that reads its ServerConfig (pickled) from stdin and runs server.serve(). Every replica binds the same
ports with SO_REUSEPORT (gRPC: the `grpc.so_reuseport` option) and listens on its own sockets; the
kernel hashes each new connection onto one of the listening sockets, so connections (not requests)
are spread across replicas. The supervisor's own sockets are bound with SO_REUSEPORT but never
listen: they keep the ports reserved (and make port 0 resolve to one concrete port) without ever
taking a connection. Closing a listening socket drops the connections still in its accept queue, so
removing a replica under load can reset a few connections (a limit of plain SO_REUSEPORT).

Replica -> supervisor: lines on the replica's stdout. `@replica {json}` lines report state changes
(starting -> loading -> warming -> ready, model loaded/unloaded; sent by lifecycle.ReplicaRole);
`ready ...` lines are the replica's own ready lines, which the supervisor repeats on its stdout once
every initial replica is ready. Supervisor -> replica: SIGTERM (graceful: stop accepting, finish
in-flight requests, exit 0). A replica also gets SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so
none is ever orphaned. A replica that dies is logged and dropped, not restarted.

Replica ids are `r<index>-<pid>`: the index is never reused within one supervisor and the pid
tells a new process from an old one, so a load generator can see exactly when new capacity arrived.

What runs inside a replica (prewarm, lazy load, idle unload) is lifecycle.py; replica_main, the
replica process's entry point, is here because it is the other end of this process model (stdin,
PR_SET_PDEATHSIG) and runs server.serve(), which lifecycle.py must not import.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import pickle
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from reference_server import admin
from reference_server.backends import choose_backend
from reference_server.backends.base import BackendUnavailable
from reference_server.config import ServerConfig, resolve_model
from reference_server.errors import StartupError
from reference_server.lifecycle import EVENT_PREFIX, ReplicaRole
from reference_server.server import serve

log = logging.getLogger(__name__)

STOP_GRACE_S = 40.0  # a replica still running this long after SIGTERM is killed (server drains for 30 s)


# --- the replica process's entry point ----------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when the supervisor dies, so no replica outlives it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
        sys.exit(1)


def replica_main(index: int, parent_pid: int) -> None:
    """Body of `python -m reference_server replica`: config from stdin, then server.serve() as one replica."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor turns Ctrl-C into SIGTERM; serve() handles both
    _die_with_parent(parent_pid)
    config, spawned_at = pickle.loads(sys.stdin.buffer.read())
    role = ReplicaRole(index, spawned_at)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s [{role.id}] %(name)s: %(message)s")
    role.report(state="starting")
    try:
        asyncio.run(serve(config, role))
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        role.report(error=str(exc))
        sys.exit(1)


# --- the supervisor ---------------------------------------------------------------------------------------

@dataclass(eq=False)
class Replica:
    """The supervisor's view of one replica process."""
    index: int
    process: asyncio.subprocess.Process
    prewarm: bool
    started_at: float  # unix time of spawn
    state: str = "starting"  # starting -> loading -> warming -> ready -> stopping
    ready_at: float | None = None
    model_loaded: bool = False
    ready_lines: list[str] = field(default_factory=list)
    error: str | None = None  # why it could not start, as it said
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return f"r{self.index}-{self.process.pid}"

    def as_json(self) -> dict:
        return {"id": self.id, "index": self.index, "pid": self.process.pid, "state": self.state,
                "prewarm": self.prewarm, "model_loaded": self.model_loaded, "started_at": self.started_at,
                "ready_at": self.ready_at,
                "ready_after_s": round(self.ready_at - self.started_at, 3) if self.ready_at else None}


class ReplicaFailed(Exception):
    """A replica exited before it was ready."""


class Supervisor:
    """Starts, tracks and stops replica processes; the admin API calls add/remove/list."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config  # what every replica runs: the shared port(s) already resolved, no admin token
        self.replicas: dict[str, Replica] = {}
        self.stopping = False
        self.starts = 0
        self.unexpected_exits = 0
        self._next_index = 0
        self._tasks: set[asyncio.Task] = set()
        self.all_gone = asyncio.Event()  # set when the last replica exits

    def list(self) -> list[dict]:
        return [r.as_json() for r in sorted(self.replicas.values(), key=lambda r: r.index)]

    def find(self, replica_id: str) -> Replica | None:
        """By full id (`r1-12345`) or by its index part (`r1`)."""
        return self.replicas.get(replica_id) or next(
            (r for r in self.replicas.values() if replica_id == f"r{r.index}"), None)

    async def add(self, prewarm: bool | None = None) -> Replica:
        """Start one replica process now; it becomes ready (and visible to traffic) on its own."""
        prewarm = self.config.prewarm if prewarm is None else prewarm
        index, self._next_index = self._next_index, self._next_index + 1
        package_parent = str(Path(__file__).resolve().parents[1])
        env = {k: v for k, v in os.environ.items() if k != "LATSCOPE_REF_ADMIN_TOKEN"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        started_at = time.time()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reference_server", "replica", "--index", str(index),
            "--parent-pid", str(os.getpid()), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=env)
        replica = Replica(index, process, prewarm, started_at)
        self.replicas[replica.id] = replica
        self.starts += 1
        process.stdin.write(pickle.dumps((dataclasses.replace(self.config, prewarm=prewarm), started_at)))
        process.stdin.close()
        log.info("replica %s started (pid %d, %s)", replica.id, process.pid, "prewarm" if prewarm else "no prewarm")
        task = asyncio.create_task(self._follow(replica), name=f"replica-{replica.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return replica

    async def _follow(self, replica: Replica) -> None:
        """Read the replica's stdout until it exits, then log how it ended and forget it."""
        assert replica.process.stdout is not None
        async for raw in replica.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(EVENT_PREFIX):
                try:
                    self._on_event(replica, json.loads(line[len(EVENT_PREFIX):]))
                except ValueError:
                    log.warning("replica %s: unreadable event %r", replica.id, line)
            elif line.startswith("ready"):
                replica.ready_lines.append(line)
            elif line:
                log.info("replica %s: %s", replica.id, line)
        code = await replica.process.wait()
        replica.exited.set()
        self.replicas.pop(replica.id, None)
        how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        if self.stopping or replica.state == "stopping":
            log.info("replica %s stopped (%s)", replica.id, how)
        else:
            self.unexpected_exits += 1
            log.warning("replica %s died (%s) %s; not restarted, %d replica(s) left", replica.id, how,
                        "after it was ready" if replica.ready_at else "before it was ready", len(self.replicas))
        if not self.replicas:
            self.all_gone.set()

    def _on_event(self, replica: Replica, event: dict) -> None:
        state = event.get("state")
        if state and replica.state != "stopping":
            replica.state = state
            if state == "ready":
                replica.ready_at = time.time()
                replica.ready.set()
                log.info("replica %s ready %.2f s after start", replica.id, replica.ready_at - replica.started_at)
        if "model_loaded" in event:
            replica.model_loaded = bool(event["model_loaded"])
        if "error" in event:
            replica.error = str(event["error"])

    async def wait_ready(self, replicas: list[Replica]) -> None:
        """Until every one of `replicas` is ready; ReplicaFailed if one exits first."""
        for replica in replicas:
            ready = asyncio.ensure_future(replica.ready.wait())
            exited = asyncio.ensure_future(replica.exited.wait())
            await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            exited.cancel()
            if not replica.ready.is_set():
                raise ReplicaFailed(replica.error or f"replica {replica.id} exited with code "
                                    f"{replica.process.returncode} before it was ready (its log is above)")

    def remove(self, replica: Replica) -> None:
        """Graceful stop: SIGTERM; the replica stops accepting, finishes in-flight requests and exits."""
        if replica.state == "stopping":
            return
        replica.state = "stopping"
        log.info("stopping replica %s", replica.id)
        self._signal(replica, signal.SIGTERM)
        if not self.replicas or all(r.state == "stopping" for r in self.replicas.values()):
            log.warning("no replica left to take traffic: connections to the port are refused until one is added")

    @staticmethod
    def _signal(replica: Replica, sig: signal.Signals) -> None:
        try:
            replica.process.send_signal(sig)
        except ProcessLookupError:
            pass

    async def stop_all(self) -> None:
        """SIGTERM every replica, wait for them (killing any still there after STOP_GRACE_S)."""
        self.stopping = True
        replicas = list(self.replicas.values())
        for replica in replicas:
            replica.state = "stopping"
            self._signal(replica, signal.SIGTERM)
        waits = [asyncio.ensure_future(r.process.wait()) for r in replicas]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=STOP_GRACE_S)
            for replica in replicas:
                if replica.process.returncode is None:
                    log.warning("replica %s still running %.0f s after SIGTERM: killing it", replica.id, STOP_GRACE_S)
                    self._signal(replica, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT that never listens: it pins the port (port 0 ->
    a concrete free one) for the replicas, which bind it the same way and listen, without ever being
    handed a connection itself. A port already in use, even by another SO_REUSEPORT server (which would
    silently share our traffic), fails here."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:  # no SO_REUSEPORT: conflicts with any listener
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def _reserve_grpc_port(config: ServerConfig) -> tuple[socket.socket | None, int]:
    """Reserve the gRPC port like the HTTP one (the replicas bind it with the grpc option
    `grpc.so_reuseport`): the socket, and the concrete port every replica gets (grpc_server.OFF: no gRPC).
    Same rules as grpc_server.bind_grpc: not given = DEFAULT_PORT, or no gRPC (warning) when it is taken."""
    from reference_server.grpc_server import DEFAULT_PORT, OFF

    if config.grpc_port == OFF:
        return None, OFF
    port = DEFAULT_PORT if config.grpc_port is None else config.grpc_port
    try:
        sock = reserve_port(config.host, port)
    except OSError as exc:
        if config.grpc_port is not None:
            raise StartupError(f"cannot listen on {config.host}:{port} (--host/--grpc-port): {exc}") from None
        log.warning("grpc: off, the default port %d is taken (%s); pass --grpc-port PORT, or 0 for any free port",
                    port, exc)
        return None, OFF
    return sock, sock.getsockname()[1]


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


async def supervise(config: ServerConfig) -> None:
    """`latscope-ref serve`: start config.replicas replicas and the admin API, print the ready line(s),
    run until SIGTERM/SIGINT, then stop every replica gracefully and return."""
    try:
        choose_backend(config.backend)
    except BackendUnavailable as exc:
        raise StartupError(str(exc)) from None
    try:
        http_sock = reserve_port(config.host, config.http_port)
    except OSError as exc:
        raise StartupError(f"cannot listen on {config.host}:{config.http_port} (--host/--http-port): {exc}") from None
    grpc_sock, grpc_port = _reserve_grpc_port(config)
    resolve_model(config)  # the built-in model is built once here, the replicas find it in the cache
    replica_config = dataclasses.replace(config, http_port=http_sock.getsockname()[1], grpc_port=grpc_port,
                                         admin_token=None)
    supervisor = Supervisor(replica_config)
    log.info("replicas: %d, each its own process on %s (SO_REUSEPORT); %s; idle unload %s", config.replicas,
             _url(http_sock), "prewarm" if config.prewarm else "no prewarm: models load on the first request",
             f"after {config.idle_unload:g} s" if config.idle_unload else "off")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    admin_runner = None
    try:
        if config.admin_token:
            admin_runner, admin_url = await admin.start(supervisor, config.host, config.admin_port, config.admin_token)
            log.info("admin API on %s (Authorization: Bearer <token>)", admin_url)
            print(f"ready-admin {admin_url}", flush=True)
        else:
            log.info("admin API disabled: no --admin-token / LATSCOPE_REF_ADMIN_TOKEN given")

        first = [await supervisor.add() for _ in range(config.replicas)]
        starting = asyncio.ensure_future(supervisor.wait_ready(first))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # SIGTERM during startup: stop what was started, exit 0
            starting.cancel()
            log.info("stopped during startup")
            return
        stopped.cancel()
        try:
            starting.result()
        except ReplicaFailed as exc:
            raise StartupError(str(exc)) from None
        for line in first[0].ready_lines or [f"ready {_url(http_sock)}"]:
            print(line, flush=True)

        gone = asyncio.ensure_future(supervisor.all_gone.wait())
        stopped = asyncio.ensure_future(stop.wait())
        while True:
            await asyncio.wait({gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                break
            if admin_runner is None and not supervisor.stopping:
                raise StartupError("every replica has exited and the admin API is off: nothing left to serve")
            supervisor.all_gone.clear()
            gone = asyncio.ensure_future(supervisor.all_gone.wait())
        gone.cancel()
        log.info("shutting down: stopping %d replica(s)", len(supervisor.replicas))
    finally:
        await supervisor.stop_all()
        if admin_runner is not None:
            await admin_runner.cleanup()
        http_sock.close()
        if grpc_sock is not None:
            grpc_sock.close()
    log.info("stopped")
