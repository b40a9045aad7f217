"""The coordinator's pool (run/pool.py): the run's senders are whole machines, reached through Locust.

The coordinator is `latscope run` itself, started by the Locust master's relay with `--relay-fd`:
the orchestrator, collector and summary writer are today's, and this pool stands where the local
worker processes stood. Through the relay (frames: wire.py) it

- takes the roster the relay froze at Locust's test start (the first `expect` workers that said
  hello with this latscope and wire version) and gives node i engines [first_i, first_i + P_i) of
  G = Σ P_i: engine g sends plan rows g, g + G, … (Plan.worker_slice), so the union is the plan
  whatever the machines, and the same seed sends the same requests;
- ships each node the scenario as written (its `${VAR}` filled from the node's own environment), the
  plan as built here (numpy's streams are not promised equal across machines) and the files it needs;
- measures each node's clock from the relay's pings (clock.py) and gives it t0 on its own clock;
- turns each node's interval frame into an IntervalReport on this machine's clock (sender = node i),
  keeps each node's health per interval (nodes.parquet) and reports a node Locust lost;
- writes each node's per-request records (its engines' part files, shipped once they are done) into
  the run's `.requests/` as they come, whole files only, for the run's merge into requests.parquet
  (`node_of_worker` names the node of each engine); a node lost before or while it shipped them
  keeps the files that came whole, and its summary entry says its records are not complete.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import queue
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from latscope import __version__, results
from latscope.distributed import validate
from latscope.distributed.clock import ClockEstimate
from latscope.distributed.frames import WIRE_VERSION, PeerGone, recv_sized, send_frame
from latscope.distributed.validate import InvalidMessage, printable
from latscope.distributed.wire import CHUNK, decode_report, encode_plan, file_sha256, report_limits, shift_report
from latscope.errors import RunError
from latscope.plan import Plan
from latscope.records import IntervalReport, WorkerDone, WorkerFailed, WorkerMessage, WorkerReady
from latscope.recorder import from_sparse, new_histogram, summarize
from latscope.results.schema import COMPLETED, ERROR_INDEX, NODE_COLUMNS, SENT
from latscope.run.parts import RunPart
from latscope.scenario import Scenario, secret_values


CLOCK_SAMPLES = 16  # pings before a node counts as ready (the shortest round trip gives the estimate)
MIN_START_DELAY_S = 0.5  # t0 is at least this far ahead when the start goes out (five hops, gevent on two)
# A node's first CLOCK_SAMPLES clock answers are waited for this long after the roster: on loopback
# they take 0.2 s; a lossy link has the relay's re-pings, 4 every 5 s (locustfile.REPING_S), twice over.
CLOCK_WAIT_S = 12.0
AHEAD_INTERVALS = 2  # a report may be for at most this many intervals past the current one (clock error, slack)


@dataclass
class NodeState:
    index: int
    client: str  # Locust's client id
    host: str
    engines: int
    first: int
    clock: ClockEstimate = field(default_factory=ClockEstimate)
    status: str = "ok"  # ok | lost | failed
    ready: bool = False
    reported_ready: bool = False
    done: bool = False  # it sent its last frame: a Locust worker leaving after that is no loss
    lost_ns: int | None = None
    intervals: set = field(default_factory=set)  # the intervals it has reported (each once)
    reason: str | None = None
    late_ms: float | None = None
    cpu_max: float | None = None
    frame_bytes: int = 0  # what it sent the coordinator, as framed, but its records (Locust's envelope adds ~60 B a message)
    records_received: int = 0  # bytes of its records chunks received (the part under way too)
    records_files: int = 0  # its part files received whole, and their bytes
    records_bytes: int = 0
    records_part: tuple[str, int, int] | None = None  # the part file under way: name, size, bytes so far
    records_had: dict | None = None  # what its `done` said it had: {files, bytes}
    records_error: str | None = None  # this machine could not write them
    totals: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))  # sent, completed, errors
    send_lag: object = field(default_factory=new_histogram)
    loop_lag: object = field(default_factory=new_histogram)


class RemotePool:
    start_delay_s = MIN_START_DELAY_S
    ready_timeout_s = math.inf  # the machines are waited for by Locust (--workers-wait) and their setup

    def __init__(self, sock: socket.socket, scenario_file: Path, overrides: tuple[str, ...], scenario: Scenario,
                 plan: Plan, events: results.EventLog, *, expect: int, on_node_loss: str, master_timeout_s: float,
                 requests_dir: Path | None = None):
        self.sock, self.scenario, self.plan, self.events = sock, scenario, plan, events
        self.requests_dir = requests_dir  # where the nodes' records go (the run's `.requests/`); None: dropped
        self.source = scenario_file.read_text()
        self.scenario_name = scenario_file.name
        # and the run's prompt salt (drawn once for the run: workload.with_run_salt), so every machine builds its prompts
        self.overrides = [*overrides, f"prompt_salt={scenario.prompt_salt}"]
        check_no_secrets(self.source, self.overrides, secret_values(scenario))
        self.senders, self.engines = expect, 0
        self.on_node_loss, self.master_timeout_s = on_node_loss, master_timeout_s
        self.nodes: list[NodeState] = []
        self.by_client: dict[str, NodeState] = {}
        self.locust_version: str | None = None
        self.rows: list[tuple] = []
        self.files = payload_files(scenario)  # as written -> (local path, sha256, size)
        # a node's reports end by the collector's hard deadline (planned duration + target timeout + 30 s), and 30 s more
        last = math.ceil((plan.duration_s + scenario.target.timeout + 60.0) / scenario.output.interval)
        self.limits = report_limits(plan, last, {digest: size for _, digest, size in self.files.values()})
        self.roster_at: float | None = None
        self._lost: list[tuple[int, str]] = []
        self._inbox: queue.Queue[dict] = queue.Queue()
        self._lock = threading.Lock()
        self.t0_ns: int | None = None
        self.interval_s = scenario.output.interval

    # -- the pool interface (run/pool.py) --------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._read, name="latscope-relay-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                frame, size = recv_sized(self.sock)
                frame["bytes"] = size
                self._inbox.put(frame)
        except (PeerGone, OSError) as exc:
            self._inbox.put({"t": "gone", "why": str(exc)})

    def get(self, timeout: float) -> WorkerMessage | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = self._inbox.get(timeout=left)
            except queue.Empty:
                break
            if (message := self._on_frame(frame)) is not None:
                return message
        self._check_clocks()
        return self._newly_ready()

    def lost(self) -> list[tuple[int, str]]:
        out, self._lost = self._lost, []
        return out

    def continue_without(self, i: int) -> bool:
        return self.on_node_loss == "continue" and self.nodes[i].status == "lost"

    def go(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        for node in self.nodes:
            self._down(node, {"t": "start", "t0": t0_ns + node.clock.freeze()})

    def stop(self) -> None:
        for node in self.nodes:
            if node.status == "ok":
                self._down(node, {"t": "stop"})

    def close(self, hurry: bool) -> None:
        """Stop the nodes; a part file still under way (a node lost, or stopped waiting for) is removed:
        only whole files are merged."""
        self.stop()
        for node in self.nodes:
            if node.records_part is not None and self.requests_dir is not None:
                (self.requests_dir / f".{node.records_part[0]}.part").unlink(missing_ok=True)
                node.records_part = None

    def node_of_worker(self) -> dict[int, str]:
        """The node of each engine, as requests.parquet's `node` column names it: "<node>:<host>"
        (a host may run two nodes)."""
        return {g: f"{n.index}:{n.host}" for n in self.nodes for g in range(n.first, n.first + n.engines)}

    def pids(self) -> dict[str, int]:
        return {}

    def parts(self) -> list:
        return [_NodesFile(self)]

    # -- frames ---------------------------------------------------------------------------------

    def _send(self, frame: dict) -> None:
        with self._lock:
            try:
                send_frame(self.sock, frame)
            except OSError:
                pass  # the relay is gone: its reader reports it

    def _down(self, node: NodeState, frame: dict) -> None:
        self._send({"t": "down", "n": node.client, "f": frame})

    def _on_frame(self, frame: dict) -> WorkerMessage | None:
        kind = frame["t"]
        if kind == "gone":
            if not self.nodes:
                raise RunError(f"the Locust master exited before {self.senders} worker(s) joined (none within "
                               "--workers-wait? Locust's own message is above)")
            raise RunError(f"the Locust master's relay went away ({frame['why']})")
        if kind == "roster":
            self._take_roster(frame)
        elif kind == "refused":
            self.events.emit("node_rejected", host=frame["host"], reason=frame["why"])
        elif kind == "clock" and (node := self.by_client.get(frame["n"])) and node.status == "ok":
            try:
                t1, t2 = validate.pong(frame["pong"], frame["asked"])
            except InvalidMessage as exc:
                self._drop(node, str(exc))
                return None
            node.clock.add(t1, t2, frame["t4"])
        elif kind == "lost" and (node := self.by_client.get(frame["n"])) and node.status == "ok" and not node.done:
            node.status, node.lost_ns = "lost", time.perf_counter_ns()
            node.reason = f"node {node.index} ({node.host}) lost: {frame['why']}"
            self.events.emit("node_lost", node=node.index, host=node.host, reason=frame["why"])
            self._lost.append((node.index, node.reason))
        elif kind == "up" and (node := self.by_client.get(frame["n"])):
            if not (isinstance(frame["f"], dict) and frame["f"].get("t") == "records"):
                node.frame_bytes += frame["bytes"]
            if node.status == "ok":  # a lost node that comes back (Locust lets a missing worker heal) is not heard
                try:
                    return self._from_node(node, validate.frame(frame["f"], self.limits))
                except InvalidMessage as exc:
                    self._drop(node, str(exc))
        return None

    def _drop(self, node: NodeState, why: str) -> None:
        """A node that sent something invalid: stopped, told why (its worker leaves), and reported
        like a lost one (`node_failed`), which ends the run partial, naming it and the reason."""
        node.status, node.lost_ns = "failed", time.perf_counter_ns()
        node.reason = f"node {node.index} ({node.host}) dropped: {why}"
        self.events.emit("node_failed", node=node.index, host=node.host, error=why)
        self._down(node, {"t": "stop"})
        self._send({"t": "reject", "n": node.client, "why": why})
        self._lost.append((node.index, node.reason))

    def _check_clocks(self) -> None:
        """A node whose clock answers have not come within CLOCK_WAIT_S of the roster is dropped:
        without its clock there is no t0 to give it, and the run would wait for it for ever."""
        if self.roster_at is None or time.monotonic() - self.roster_at < CLOCK_WAIT_S:
            return
        for node in self.nodes:
            if node.status == "ok" and not node.reported_ready and node.clock.samples < CLOCK_SAMPLES:
                self._drop(node, f"it answered {node.clock.samples} of the first {CLOCK_SAMPLES} clock pings within "
                                 f"{CLOCK_WAIT_S:g} s")

    def _take_roster(self, frame: dict) -> None:
        self.locust_version = frame["locust"]
        nodes = frame["nodes"][: self.senders]
        if len(nodes) < self.senders:
            refused = "; ".join(f"{r['host']}: {r['why']}" for r in frame.get("refused", []))
            raise RunError(f"expected {self.senders} workers, {len(nodes)} joined with latscope {__version__} "
                           f"(wire {WIRE_VERSION})" + (f"; refused: {refused}" if refused else ""))
        elsewhere = sorted({hello["host"] for hello in nodes} - {socket.gethostname()})
        if elsewhere and _loopback(self.scenario.target.url):
            raise RunError(f"target.url {self.scenario.target.url} is this machine's loopback, but workers run on "
                           f"{', '.join(elsewhere)}: their requests would go to their own loopback. Give the target "
                           "an address the workers reach (and bind it there)")
        first = 0
        self.roster_at = time.monotonic()
        for i, hello in enumerate(nodes):  # each hello checked by the relay (validate.hello)
            node = NodeState(i, hello["n"], hello["host"], int(hello["engines"]), first)
            first += node.engines
            self.nodes.append(node)
            self.by_client[node.client] = node
            self.events.emit("node_joined", node=i, host=node.host, engines=node.engines, latscope=hello["latscope"],
                             locust=frame["locust"])
        self.engines = first
        plan = encode_plan(self.plan)
        manifest = {written: [digest, size] for written, (_, digest, size) in self.files.items()}
        for node in self.nodes:
            self._down(node, {"t": "setup", "scenario": self.source, "name": self.scenario_name,
                              "overrides": self.overrides, "plan": plan, "first": node.first, "engines": node.engines,
                              "of": self.engines, "files": manifest, "master_timeout_s": self.master_timeout_s})

    def _from_node(self, node: NodeState, f: dict) -> WorkerMessage | None:
        kind = f["t"]
        if kind == "interval":
            self._check_interval(node, f["k"])
            report = shift_report(decode_report(f["blob"], node.index, self.limits, f["k"]), -node.clock.offset_ns)
            self._note_health(node, report, f.get("cpu"))
            return report
        if kind == "ready":
            node.ready = True
        elif kind == "fetch":
            self._serve_chunk(node, f["sha"], f["offset"])
        elif kind == "started":
            node.late_ms = f["late_ms"]
            self.events.emit("node_started", node=node.index, late_ms=f["late_ms"])
        elif kind == "records":
            self._take_records(node, f)
        elif kind == "done":
            node.done, node.records_had = True, f["records"]
            return WorkerDone(node.index, f["not_sent"], f["error_examples"], f["unaccounted"])
        elif kind == "failed":
            node.status, node.reason = "failed", f"node {node.index} ({node.host}) failed"
            self.events.emit("node_failed", node=node.index, host=node.host,
                             error=(f["error"].strip().splitlines() or ["(no message)"])[-1].strip())
            return WorkerFailed(node.index, f"{node.reason}:\n{f['error']}")
        return None

    def _check_interval(self, node: NodeState, k: int) -> None:
        """A report is for an interval that has begun (give or take AHEAD_INTERVALS), once per node:
        what the collector holds for intervals not yet complete stays bounded."""
        now = None if self.t0_ns is None else (time.perf_counter_ns() - self.t0_ns) / 1e9 / self.interval_s
        if now is None or k > now + AHEAD_INTERVALS:
            raise InvalidMessage(f"a report for interval {k}, " + ("before the run started" if now is None else
                                                                  f"in interval {max(0, int(now))} of the run"))
        if k in node.intervals:
            raise InvalidMessage(f"a second report for interval {k}")
        node.intervals.add(k)

    def _newly_ready(self) -> WorkerReady | None:
        """A node is ready once its engines are and its clock has been measured CLOCK_SAMPLES times."""
        for node in self.nodes:
            if node.ready and not node.reported_ready and node.clock.samples >= CLOCK_SAMPLES:
                node.reported_ready = True
                c = node.clock
                self.events.emit("node_ready", node=node.index, offset_ms=round(c.offset_ns / 1e6, 4),
                                 bound_ms=round(c.bound_ns / 1e6, 4), rtt_min_ms=round(c.rtt_min_ns / 1e6, 4))
                self.start_delay_s = max(self.start_delay_s, 5 * c.rtt_min_ns / 1e9)
                return WorkerReady(node.index, 0)
        return None

    def _serve_chunk(self, node: NodeState, digest: str, offset: int) -> None:
        path = next((path for path, d, _ in self.files.values() if d == digest), None)
        if path is None:
            return
        with open(path, "rb") as f:
            f.seek(offset)
            self._down(node, {"t": "chunk", "sha": digest, "offset": offset, "data": f.read(CHUNK)})

    def _take_records(self, node: NodeState, c: dict) -> None:
        """A chunk of one of the node's part files (validate.records_chunk: its own engine's, in order,
        within its budget), written where it goes under a dot-name until the file is whole, then
        renamed; answered with the node's total so far (records_ok: the node's window moves on)."""
        validate.records_chunk(c, range(node.first, node.first + node.engines), node.records_part, node.records_received,
                               int(node.totals[0]))
        name, data = c["name"], c["data"]
        node.records_received += len(data)
        end = c["offset"] + len(data)
        node.records_part = None if end == c["size"] else (name, c["size"], end)
        if self.requests_dir is not None and node.records_error is None:
            final, temp = self.requests_dir / name, self.requests_dir / f".{name}.part"
            if c["offset"] == 0 and final.exists():
                raise InvalidMessage(f"its records chunk of {name}: a second part file of that name")
            try:
                self.requests_dir.mkdir(exist_ok=True)
                with open(temp, "r+b" if c["offset"] else "wb") as f:
                    f.seek(c["offset"])
                    f.write(data)
                if end == c["size"]:
                    os.replace(temp, final)
                    node.records_files += 1
                    node.records_bytes += c["size"]
            except OSError as exc:  # this machine's disk, not the node's doing: the rest of its records are lost
                node.records_error = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(OSError):
                    temp.unlink(missing_ok=True)
        self._down(node, {"t": "records_ok", "bytes": node.records_received})

    # -- each node's health ---------------------------------------------------------------------

    def _note_health(self, node: NodeState, report: IntervalReport, cpu: float | None) -> None:
        rows = list(report.counters.values())
        sent = int(sum(r[SENT] for r in rows))
        completed = int(sum(r[COMPLETED] for r in rows))
        errors = int(sum(r[i] for r in rows for i in ERROR_INDEX.values()))
        node.totals += (sent, completed, errors)
        lags = {}
        for metric, total in (("send_lag", node.send_lag), ("loop_lag", node.loop_lag)):
            h = new_histogram()
            for (m, _, _), sparse in report.histograms.items():
                if m == metric:
                    h.add(from_sparse(*sparse))
            total.add(h)
            lags[metric] = summarize(h).get("p99_ms", math.nan)
        if cpu is not None:
            node.cpu_max = max(node.cpu_max or 0.0, cpu)
        self.rows.append((report.interval * self.interval_s, node.index, node.host, node.status, sent, completed, errors,
                          report.in_flight, lags["send_lag"], lags["loop_lag"], math.nan if cpu is None else cpu,
                          node.clock.offset_ns / 1e6))

    def describe(self, run_s: float) -> dict:
        """summary.json generator's `distributed` and `nodes` (each node's `validity` stamp is the
        summary's to add: run/summary.py judges it by the run's lateness thresholds)."""
        nodes = []
        for n in self.nodes:
            lag = {m: summarize(h).get("p99_ms") for m, h in (("send_lag", n.send_lag), ("loop_lag", n.loop_lag))}
            nodes.append({
                "node": n.index, "host": n.host, "locust_client_id": printable(n.client), "engines": n.engines, "status": n.status,
                "lost_at_s": None if n.lost_ns is None or self.t0_ns is None else round((n.lost_ns - self.t0_ns) / 1e9, 3),
                "reason": n.reason, "clock": n.clock.summary(run_s) if n.clock.best else None,
                "start_late_ms": n.late_ms,
                "requests": dict(zip(("sent", "completed", "errors"), map(int, n.totals))),
                "send_lag_p99_ms": lag["send_lag"], "loop_lag_p99_ms": lag["loop_lag"], "cpu_max_pct": n.cpu_max,
                "frame_bytes": n.frame_bytes,
                "records": {"files": n.records_files, "bytes": n.records_bytes, "error": n.records_error,
                            "complete": n.records_error is None
                            and n.records_had == {"files": n.records_files, "bytes": n.records_bytes}},
            })
        errors = [n["clock"]["max_error_ms"] for n in nodes if n["clock"]]
        return {"distributed": {"engine": "locust", "locust_version": self.locust_version, "wire_version": WIRE_VERSION,
                                "nodes_expected": self.senders, "nodes": len(nodes), "engines": self.engines,
                                "on_node_loss": self.on_node_loss,
                                "clock": {"max_error_ms": max(errors) if errors else None}},
                "nodes": nodes}


class _NodesFile(RunPart):
    """The run part that writes nodes.parquet from the pool's rows."""

    def __init__(self, pool: RemotePool):
        self.pool = pool

    def write(self, run_dir: Path) -> None:
        rows = self.pool.rows
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in NODE_COLUMNS]
        results.write_table(run_dir / results.NODES, dict(zip(NODE_COLUMNS, columns)))


def check_no_secrets(source: str, overrides: list[str], secrets: list[str]) -> None:
    """RunError when a secret of the scenario is written in its text or in a --set value: those go to
    every node over Locust's link, which has neither authentication nor encryption. Written as
    `${VAR}`, a secret is filled on each machine from its own environment, and never travels."""
    for where, text in (("the scenario file", source), *((f"--set {o.split('=', 1)[0]}", o) for o in overrides)):
        if any(secret in text for secret in secrets):
            raise RunError(f"{where} holds a secret as it is (an API key, a credential): a distributed run would send "
                           "it to every worker unencrypted. Write it as ${VAR} (quoted on the command line) and set "
                           "VAR on each machine")


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def payload_files(scenario: Scenario) -> dict[str, tuple[Path, str, int]]:
    """The files the engines read (datasets, length samples, tensors), as written in the scenario ->
    (path here, sha256, size). Traces are not among them: the plan is built here."""
    found: dict[str, tuple[Path, str, int]] = {}

    def walk(model: object) -> None:
        if isinstance(model, BaseModel):
            for name in type(model).model_fields:
                value = getattr(model, name)
                if name in ("file", "npy") and isinstance(value, str):
                    path = scenario.resolve_path(value)
                    found[value] = (path, file_sha256(path), path.stat().st_size)
                else:
                    walk(value)
        elif isinstance(model, (list, tuple)):
            for item in model:
                walk(item)
        elif isinstance(model, dict):
            for item in model.values():
                walk(item)

    walk(scenario.workload)
    return found
