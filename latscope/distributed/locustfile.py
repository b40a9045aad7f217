"""latscope's locustfile: Locust carries, latscope measures.

    locust -f $(latscope locustfile) --master --headless --expect-workers 2 --latscope-scenario s.yaml
    locust -f $(latscope locustfile) --worker --master-host H            # on each load machine

(`latscope run s.yaml --distributed --expect-workers 2` and `latscope worker --master-host H` run
exactly these.) The only module of latscope that imports locust, whose import patches the whole
interpreter for gevent: no asyncio engine may run in this process (its loop would never yield to
gevent, heartbeats would stop and the master would drop the worker). So the Locust processes only
relay, and measure nothing:

- the master's relay starts the **coordinator** (`latscope run … --relay-fd`, remote.py) and the
  worker's relay a **node** (node.py), each a plain process started with `subprocess` (a
  multiprocessing child of the `locust` script comes out gevent-patched too) on a socketpair;
- they pump frames (frames.py) between those children and Locust custom messages, undecoded;
- they admit the roster at Locust's test start (`--expect-workers` met): workers that said a valid
  hello (validate.py) with this latscope and wire version, in Locust's worker order; a worker that
  joins later, or whose hello is not valid, is refused with the reason;
- the master's relay pings each node's relay for its clock (clock.py) and tells the coordinator
  when Locust marks a worker missing or it leaves; the worker's relay passes each master heartbeat
  to its node as `alive` (no heartbeat for `--latscope-master-timeout` s: the node stops sending),
  and leaves, its node stopped, when its master's heartbeats stop for FOLLOW_S (a master killed).

The run ends when the coordinator exits: its exit code becomes Locust's (0, 1 partial or failed,
2 bad input, 3/4 a failed gate).
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time

import gevent
import locust
from locust import LoadTestShape, User, constant, events, task
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from latscope import __version__
from latscope.distributed import validate
from latscope.distributed.frames import WIRE_VERSION, PeerGone, recv_frame, send_frame

__all__ = ["LatscopeIdleUser", "LatscopeShape"]  # what `from latscope.distributed.locustfile import *` must give Locust

PINGS = 16  # at the roster: the shortest round trip of these gives each node's clock offset
# ... and of these, one every SETTLE_EVERY_S for SETTLE_S after it: at the roster every node starts its
# engines, and on a small machine that burst of CPU delayed all 16 first pings by 25–240 ms (a clock
# bound of tens of ms); a node's t0 is computed from the best sample when its start goes out (clock.py
# `freeze`), after its setup, so the pings of the settled machine are there to be the best.
SETTLE_S = 10.0
SETTLE_EVERY_S = 0.05
REPING_S = 5.0  # then a few more every this often, for drift
REPINGS = 4
WATCH_S = 0.25  # how often the master looks for missing workers
HELLO_ASK_S = 0.25  # how often the master asks connected workers for their hello
HELLO_WAIT_S = 10.0  # at the test start, how long to wait for connected workers' hellos
QUIT_WAIT_S = 40.0  # how long Locust's shutdown waits for the coordinator to write its results
# A worker that hears no master heartbeat (one a second) for this long leaves, stopping its node: the
# master would mark it missing after as long (Locust's 3 missed heartbeats), and Locust's own worker
# waits 60 s. (Before the first heartbeat a worker waits for its master, however long.)
FOLLOW_S = 3.0


@events.init_command_line_parser.add_listener
def _options(parser) -> None:  # noqa: ANN001 - Locust's (configargparse) parser
    group = parser.add_argument_group("latscope", "A distributed latscope run (latscope/distributed/locustfile.py)")
    group.add_argument("--latscope-scenario", env_var="LATSCOPE_SCENARIO", default="", help="scenario file (master)")
    group.add_argument("--latscope-set", action="append", default=[], help="scenario override key=value (master)")
    group.add_argument("--latscope-out", env_var="LATSCOPE_OUT", default="", help="results directory (master)")
    group.add_argument("--latscope-on-node-loss", env_var="LATSCOPE_ON_NODE_LOSS", choices=("abort", "continue"),
                       default="abort", help="a lost worker aborts the run (default), or it goes on without it, invalid")
    group.add_argument("--latscope-run-args", default="", help="more `latscope run` options for the coordinator (master)")
    group.add_argument("--latscope-engines", env_var="LATSCOPE_ENGINES", type=int, default=0,
                       help="engine processes on this worker (default: its CPU count)")
    group.add_argument("--latscope-master-timeout", env_var="LATSCOPE_MASTER_TIMEOUT", type=float, default=5.0,
                       help="the nodes stop sending after this many seconds without a master heartbeat (master)")


class LatscopeIdleUser(User):
    """Locust needs a User class; latscope's load is not made of Users, so none is ever spawned."""

    wait_time = constant(3600)

    @task
    def idle(self) -> None:
        pass


class LatscopeShape(LoadTestShape):
    """Zero users while the coordinator runs; None (Locust stops and quits) once it has exited."""

    def tick(self):  # noqa: ANN201 - Locust's signature
        return None if _master is not None and _master.exit_code is not None else (0, 1)


_master: _MasterRelay | None = None


def _child(module_args: list[str]) -> tuple[subprocess.Popen, socket.socket]:
    """A plain latscope process on one end of a socketpair: its own session (a Ctrl-C at this
    terminal reaches Locust, which stops it in order), never multiprocessing (see the docstring)."""
    ours, theirs = socket.socketpair()
    args = [sys.executable, "-m", *module_args[:1], *[a.replace("{fd}", str(theirs.fileno())) for a in module_args[1:]]]
    proc = subprocess.Popen(args, pass_fds=(theirs.fileno(),), start_new_session=True)
    theirs.close()
    return proc, ours


def _say(text: str) -> None:
    print(f"latscope: {text}", file=sys.stderr, flush=True)


class _MasterRelay:
    def __init__(self, environment) -> None:  # noqa: ANN001
        self.env, self.runner = environment, environment.runner
        opts = environment.parsed_options
        logging.getLogger("locust.stats_logger").setLevel(logging.WARNING)  # Locust's tables: always empty here
        if not opts.latscope_scenario:
            _say("no scenario: give --latscope-scenario FILE (or LATSCOPE_SCENARIO)")
            os._exit(2)
        self.expect = max(1, opts.expect_workers or 1)
        self.hellos: dict[str, dict] = {}
        self.refused: list[dict] = []
        self.roster: list[str] | None = None
        self.exit_code: int | None = None
        self.reported_lost: set[str] = set()
        self.pinged: dict[str, set[int]] = {}  # each roster worker's pings not answered yet (their t1)
        args = ["latscope", "run", opts.latscope_scenario, "--relay-fd", "{fd}", "--expect-workers", str(self.expect),
                "--on-node-loss", opts.latscope_on_node_loss, "--master-timeout", str(opts.latscope_master_timeout)]
        args += [a for kv in opts.latscope_set for a in ("--set", kv)]
        args += ["--out", opts.latscope_out] if opts.latscope_out else []
        self.coordinator, self.sock = _child(args + shlex.split(opts.latscope_run_args))
        host = opts.master_bind_host if opts.master_bind_host != "*" else "0.0.0.0"
        _say(f"Locust master listening on {host}:{self.runner.server.port}, waiting for {self.expect} worker(s)")
        self.runner.register_message("latscope:hello", self.on_hello)
        self.runner.register_message("latscope:pong", self.on_pong)
        self.runner.register_message("latscope:up", self.on_up)
        events.test_start.add_listener(self.on_test_start)
        events.quitting.add_listener(self.on_quitting)
        atexit.register(self.at_exit)
        # Locust's headless master with a shape installs no SIGTERM handler, and Ctrl-C ends its greenlets
        # before the coordinator has written anything: a signal goes to the coordinator, whose exit ends Locust.
        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, self.on_signal, sig)
        gevent.spawn(self.pump)
        gevent.spawn(self.ask)

    def to_coordinator(self, frame: dict) -> None:
        try:
            send_frame(self.sock, frame)
        except OSError:
            pass  # it has exited: pump() sees it

    def pump(self) -> None:
        """Coordinator -> workers; when it exits, its exit code is the run's."""
        try:
            while True:
                frame = recv_frame(self.sock)
                if frame["t"] == "down":
                    self.runner.send_message("latscope:down", frame["f"], client_id=frame["n"])
                elif frame["t"] == "reject":  # a node the coordinator dropped: its worker is told why, and leaves
                    self.runner.send_message("latscope:reject", {"why": frame["why"]}, client_id=frame["n"])
        except (PeerGone, OSError):
            pass
        while (code := self.coordinator.poll()) is None:
            gevent.sleep(0.05)
        self.exit_code = self.env.process_exit_code = code if code >= 0 else 1
        if self.roster is None:  # it ended before the test started (bad input, no workers): Locust still waits
            self.runner.quit()
            gevent.sleep(0.5)
            os._exit(self.exit_code)

    def ask(self) -> None:
        """Ask each connected worker that has not said hello who it is, again and again (a worker
        registers its handlers only after it has connected: an ask may come too early). A worker
        that says hello after the roster is frozen is refused (on_hello)."""
        while self.exit_code is None:
            for n in list(self.runner.clients):
                if not self.heard(n):
                    self.runner.send_message("latscope:who", None, client_id=n)
            gevent.sleep(HELLO_ASK_S)

    def on_hello(self, environment, msg) -> None:  # noqa: ANN001
        if self.heard(msg.node_id):
            return  # asked twice before its first answer came
        host = msg.data.get("host") if isinstance(msg.data, dict) and isinstance(msg.data.get("host"), str) else None
        try:
            hello = {**validate.hello(msg.data), "n": msg.node_id}  # this latscope and wire version, and sane
        except validate.InvalidMessage as exc:
            self.refuse(msg.node_id, str(exc), host)
            return
        if self.roster is not None:
            self.refuse(msg.node_id, "the run has started with its workers; a worker that joins late is refused "
                                     "(start a new run to use more workers)", hello["host"])
        else:
            self.hellos[msg.node_id] = hello

    def heard(self, client_id: str) -> bool:
        """Whether the worker has said hello (admitted or refused)."""
        return client_id in self.hellos or any(r["n"] == client_id for r in self.refused)

    def refuse(self, client_id: str, why: str, host: str | None = None) -> None:
        host = validate.printable(host or self.hellos.get(client_id, {}).get("host") or client_id)
        _say(f"refused worker {host}: {why}")
        self.refused.append({"n": client_id, "host": host, "why": why})
        self.runner.send_message("latscope:reject", {"why": why}, client_id=client_id)
        self.to_coordinator({"t": "refused", "host": host, "why": why})

    def on_test_start(self, **_) -> None:
        gevent.spawn(self.freeze_roster)

    def freeze_roster(self) -> None:
        deadline = time.monotonic() + HELLO_WAIT_S
        while time.monotonic() < deadline and any(
                not self.heard(c.id) for c in self.runner.clients.values()):
            gevent.sleep(0.05)
        ordered = sorted(self.hellos, key=self.runner.get_worker_index)[: self.expect]
        self.roster = ordered
        for extra in set(self.hellos) - set(ordered):
            self.refuse(extra, f"the run takes {self.expect} workers (--expect-workers)")
        self.to_coordinator({"t": "roster", "locust": locust.__version__, "refused": self.refused,
                             "nodes": [self.hellos[n] for n in ordered]})
        for n in ordered:
            gevent.spawn(self.ping, n)
        gevent.spawn(self.watch)

    def ping(self, client_id: str) -> None:
        """PINGS pings 10 ms apart, then one every SETTLE_EVERY_S until SETTLE_S after the roster, then
        REPINGS every REPING_S (clock.py keeps the shortest round trip)."""
        waiting, settle_until = self.pinged.setdefault(client_id, set()), time.monotonic() + SETTLE_S

        def send() -> None:
            waiting.add(t1 := time.perf_counter_ns())
            self.runner.send_message("latscope:ping", {"t1": t1}, client_id=client_id)

        for _ in range(PINGS):
            send()
            gevent.sleep(0.01)
        while self.exit_code is None and time.monotonic() < settle_until:
            send()
            gevent.sleep(SETTLE_EVERY_S)
        while self.exit_code is None:
            for _ in range(REPINGS):
                send()
                gevent.sleep(0.01)
            gevent.sleep(REPING_S)

    def on_pong(self, environment, msg) -> None:  # noqa: ANN001 - runs in Locust's socket reader: stamp first
        t4 = time.perf_counter_ns()
        if self.roster is not None and msg.node_id in self.roster:  # checked by the coordinator (validate.pong)
            t1 = msg.data.get("t1") if isinstance(msg.data, dict) else None
            waiting = self.pinged.get(msg.node_id, set())
            asked = isinstance(t1, int) and t1 in waiting  # an answer to a ping of ours, once: no forged t1, no flood
            if asked:
                waiting.discard(t1)
            self.to_coordinator({"t": "clock", "n": msg.node_id, "pong": msg.data, "t4": t4, "asked": asked})

    def on_up(self, environment, msg) -> None:  # noqa: ANN001
        if self.roster is not None and msg.node_id in self.roster:
            self.to_coordinator({"t": "up", "n": msg.node_id, "f": msg.data})

    def watch(self) -> None:
        """Locust marks a worker missing after about 3 s without its heartbeat; it forgets one that quit."""
        while self.exit_code is None:
            for n in self.roster:
                client = self.runner.clients.get(n)
                why = ("it left the run" if client is None else
                       "no heartbeat for 3 s (Locust marked it missing)" if client.state == STATE_MISSING else None)
                if why and n not in self.reported_lost:
                    self.reported_lost.add(n)
                    self.to_coordinator({"t": "lost", "n": n, "why": why})
            gevent.sleep(WATCH_S)

    def on_signal(self, sig: int) -> None:
        """Ctrl-C or SIGTERM: passed on to the coordinator, which stops the run in order (a second: in a hurry)."""
        if self.coordinator.poll() is None:
            self.coordinator.send_signal(sig)

    def at_exit(self) -> None:
        """Locust exiting on its own (no workers within --expect-workers-max-wait): the coordinator
        sees its socket close, writes what it has, and the shell gets its prompt back after that."""
        self.sock.close()
        try:
            self.coordinator.wait(timeout=QUIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.coordinator.kill()

    def on_quitting(self, **_) -> None:
        """Locust is shutting down (the run ended, Ctrl-C or SIGTERM): the coordinator stops the run
        in order and writes its results while the workers are still connected."""
        if self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + QUIT_WAIT_S
            while self.exit_code is None and time.monotonic() < deadline:
                gevent.sleep(0.05)
        if self.exit_code is None:
            self.coordinator.kill()
            self.env.process_exit_code = 1


class _WorkerRelay:
    def __init__(self, environment) -> None:  # noqa: ANN001
        self.env, self.runner = environment, environment.runner
        opts = environment.parsed_options
        self.engines = opts.latscope_engines or os.cpu_count() or 1
        self.quitting = False
        self.heartbeat_at: float | None = None  # when the master's last heartbeat came (None: none yet)
        self.node, self.sock = _child(["latscope.distributed.node", "--fd", "{fd}"])
        self.runner.register_message("latscope:who", self.on_who)
        self.runner.register_message("latscope:ping", self.on_ping)
        self.runner.register_message("latscope:down", self.on_down)
        self.runner.register_message("latscope:reject", self.on_reject)
        events.heartbeat_received.add_listener(self.on_heartbeat)
        events.quitting.add_listener(self.on_quitting)
        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, self.on_signal)
        gevent.spawn(self.pump)
        gevent.spawn(self.follow)

    def on_who(self, environment, msg) -> None:  # noqa: ANN001
        import numpy

        self.runner.send_message("latscope:hello", {
            "latscope": __version__, "wire": WIRE_VERSION, "host": socket.gethostname(), "cpus": os.cpu_count(),
            "engines": self.engines, "python": platform.python_version(), "numpy": numpy.__version__,
            "locust": locust.__version__})

    def on_ping(self, environment, msg) -> None:  # noqa: ANN001
        self.runner.send_message("latscope:pong", {"t1": msg.data["t1"], "t2": time.perf_counter_ns()})

    def on_down(self, environment, msg) -> None:  # noqa: ANN001
        self.to_node(msg.data)

    def on_heartbeat(self, **_) -> None:
        self.heartbeat_at = time.monotonic()
        self.to_node({"t": "alive"})

    def follow(self) -> None:
        """The master's heartbeats stopped for FOLLOW_S (it was killed, or cut off): this worker
        leaves, its node stopped, rather than wait out Locust's 60 s."""
        while not self.quitting:
            if self.heartbeat_at is not None and time.monotonic() - self.heartbeat_at > FOLLOW_S:
                _say(f"no heartbeat from the master for {FOLLOW_S:g} s: this worker leaves")
                self.env.process_exit_code = 1
                self.stop_node()
                gevent.spawn(self.runner.quit)
                return
            gevent.sleep(0.2)

    def to_node(self, frame: dict) -> None:
        try:
            send_frame(self.sock, frame)
        except OSError:
            pass

    def on_signal(self) -> None:
        """Ctrl-C or SIGTERM on a load machine: its node stops, the worker leaves (the master sees it lost)."""
        self.env.process_exit_code = 1
        self.stop_node()
        gevent.spawn(self.runner.quit)

    def on_reject(self, environment, msg) -> None:  # noqa: ANN001
        _say(f"the master refused this worker: {msg.data['why']}")
        self.env.process_exit_code = 1
        self.stop_node()
        gevent.spawn(self.runner.quit)

    def pump(self) -> None:
        """Node -> master; a node that exits without its `done` is reported failed."""
        try:
            while True:
                self.runner.send_message("latscope:up", recv_frame(self.sock))
        except (PeerGone, OSError):
            pass
        code = self.node.wait()
        self.end_group()
        if code != 0 and not self.quitting:  # it failed, or stopped for want of a master: this worker is done
            self.runner.send_message("latscope:up", {"t": "failed", "error": f"the node process exited with code {code}"})
            self.env.process_exit_code = 1
            self.runner.quit()

    def stop_node(self) -> None:
        self.quitting = True
        self.sock.close()  # the node stops its engines at end of stream
        deadline = time.monotonic() + 3.0
        while self.node.poll() is None and time.monotonic() < deadline:
            gevent.sleep(0.05)
        if self.node.poll() is None:
            self.node.kill()
        self.end_group()

    def end_group(self) -> None:
        """Whatever the node left running (its engines, multiprocessing's resource tracker: a node
        killed in its setup leaves them) ends with it: they are in its process group (its own session)."""
        try:
            os.killpg(self.node.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing left

    def on_quitting(self, **_) -> None:
        self.stop_node()


@events.init.add_listener
def _on_init(environment, **_) -> None:  # noqa: ANN001
    global _master
    if isinstance(environment.runner, MasterRunner):
        _master = _MasterRelay(environment)
    elif isinstance(environment.runner, WorkerRunner):
        _WorkerRelay(environment)
    else:
        _say("run this locustfile with --master (and --latscope-scenario) or --worker")
        os._exit(2)
