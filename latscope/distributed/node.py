"""A load machine's share of a distributed run: its engines, their reports merged, one frame per interval.

Started by the Locust worker's relay (locustfile.py) as `python -m latscope.distributed.node --fd N`:
a plain process, never gevent-patched, talking frames (wire.py) over the socketpair fd. How many
engines it runs, and which, the coordinator's setup says (from the worker's hello).

    setup  -> the files it lacks fetched in chunks -> the scenario loaded here (so `${VAR}` takes this
              machine's environment: secrets never cross the wire) -> P engines (run/pool.LocalPool,
              engines first … first + P − 1 of the run's G, sending from the master's plan) -> ready
    start  -> t0 (on this machine's clock) to the engines -> started
    engines' reports, interval by interval -> merged (wire.merge_reports) -> one `interval` frame
    every engine done -> its records shipped (the engines' requests.parquet part files, written to a
              temporary directory of its own, sent in chunks: `ship_records`) -> done; exit

It stops its engines — the run cannot be recorded any more — when its relay goes (the socket
closes: the Locust worker was killed) or goes quiet for `master_timeout_s` (the relay forwards
each master heartbeat as `alive`: a stopped relay or a lost master both fall silent).
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil

from latscope.distributed.frames import PeerGone, recv_frame, send_frame
from latscope.distributed.validate import PART_NAME
from latscope.distributed.wire import CHUNK, RECORDS_WINDOW, decode_plan, encode_report, file_sha256, merge_reports
from latscope.errors import ScenarioError
from latscope.records import IntervalReport, WorkerDone, WorkerFailed, WorkerReady
from latscope.request_log import sample_fraction
from latscope.results.requests import part_files
from latscope.run.pool import LocalPool
from latscope.scenario import load_scenario, scrub, secret_values

WINDOW = 8  # chunks asked for before the first arrives: ZeroMQ drops silently past its queue limit
REASK_S = 5.0  # a chunk asked for and not come in this long is asked for again
LATE_START_MS = 10.0  # a start that arrives later than this after its t0 is refused (the engines would burst)
RECORDS_WAIT_S = 10.0  # records chunks unanswered this long: the coordinator is not taking them, the rest stay here
POLL_S = 0.05


def cache_dir() -> Path:
    """Where fetched files are kept by content hash (LATSCOPE_CACHE, else ~/.cache/latscope/blobs)."""
    root = os.environ.get("LATSCOPE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latscope"
    return Path(root) / "blobs"


class Stopped(Exception):
    """The relay went away or told the node to stop before the engines ran."""


class Node:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbox: queue.Queue[dict] = queue.Queue()
        self.lock = threading.Lock()
        self.heard = time.monotonic()
        self.timeout_s = 3600.0  # until setup says otherwise: a worker may wait long for its master
        self.pool: LocalPool | None = None
        self.secrets: list[str] = []
        self.records_dir: Path | None = None  # where its engines write their part files (removed at the end)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                self.inbox.put(recv_frame(self.sock))
        except (PeerGone, OSError) as exc:
            self.inbox.put({"t": "gone", "why": f"the Locust worker's relay went away ({exc})"})

    def send(self, frame: dict) -> None:
        with self.lock:
            send_frame(self.sock, frame)

    def next_frame(self, timeout: float) -> dict | None:
        """The relay's next frame; Stopped when it went away or fell silent for too long."""
        try:
            frame = self.inbox.get(timeout=timeout)
        except queue.Empty:
            if time.monotonic() - self.heard > self.timeout_s:
                raise Stopped(f"no word from the master for {self.timeout_s:g} s") from None
            return None
        self.heard = time.monotonic()
        if frame["t"] == "gone":
            raise Stopped(frame["why"])
        return frame

    # -- setup ----------------------------------------------------------------------------------

    def setup(self, frame: dict) -> None:
        self.timeout_s = frame["master_timeout_s"]
        files = self.fetch(frame["files"])
        with tempfile.TemporaryDirectory(prefix="latscope-node-") as work:  # under its own name: the run's name
            path = Path(work) / frame["name"]
            path.write_text(frame["scenario"])
            scenario = load_scenario(path, frame["overrides"])
        scenario.use_files(Path.cwd(), files)
        self.secrets = secret_values(scenario)
        plan = decode_plan(frame["plan"])
        if sample_fraction(scenario, plan) > 0:
            self.records_dir = Path(tempfile.mkdtemp(prefix="latscope-records-"))
        self.pool = LocalPool(scenario, frame["engines"], first=frame["first"], of=frame["of"], plan=plan,
                              requests_dir=None if self.records_dir is None else str(self.records_dir))
        self.pool.start()

    def fetch(self, manifest: dict[str, list]) -> dict[str, Path]:
        """Each file the scenario needs: a local copy with the master's hash at the same path, or
        one from the cache, or fetched from the master in chunks (at most WINDOW in flight)."""
        out: dict[str, Path] = {}
        for written, (digest, size) in manifest.items():
            local = Path(written).expanduser()
            if local.is_file() and local.stat().st_size == size and file_sha256(local) == digest:
                continue  # the scenario's own path resolves to it
            cached = cache_dir() / digest
            if not cached.is_file():
                self._download(digest, size, cached)
            out[written] = cached
        return out

    def _download(self, digest: str, size: int, dest: Path) -> None:
        """Chunks asked for WINDOW at a time; those not come within REASK_S are asked for again (the
        master's ROUTER socket drops a message it cannot deliver, silently)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(f".{os.getpid()}.part")
        todo, waiting = list(range(0, size, CHUNK)), {}  # offsets not asked yet; asked -> when
        with open(part, "wb") as f:
            while todo or waiting:
                now = time.monotonic()
                for offset in [o for o, at in waiting.items() if now - at > REASK_S]:
                    del waiting[offset]
                    todo.insert(0, offset)
                while todo and len(waiting) < WINDOW:
                    offset = todo.pop(0)
                    self.send({"t": "fetch", "sha": digest, "offset": offset})
                    waiting[offset] = now
                frame = self.next_frame(POLL_S)
                if frame is not None and frame["t"] == "stop":
                    raise Stopped("stopped while fetching files")
                if frame is None or frame["t"] != "chunk" or frame["sha"] != digest or frame["offset"] not in waiting:
                    continue
                f.seek(frame["offset"])
                f.write(frame["data"])
                del waiting[frame["offset"]]
        if file_sha256(part) != digest:
            part.unlink()
            raise RuntimeError(f"a fetched file does not match its hash {digest[:12]}…")
        part.replace(dest)

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            while (frame := self.next_frame(POLL_S)) is None or frame["t"] != "setup":
                if frame is not None and frame["t"] == "stop":
                    return 0
            self.setup(frame)
            self.wait_ready()
            return self.measure()
        except Stopped as exc:
            print(f"latscope node: stopping: {exc}", file=sys.stderr, flush=True)
            return 1
        except ScenarioError as exc:  # e.g. a ${VAR} this machine's environment lacks: the message says which
            self._send_quietly({"t": "failed", "error": f"the scenario does not load on this machine: {exc}"})
            return 1
        except Exception:  # noqa: BLE001 - the coordinator names the node and aborts
            self._send_quietly({"t": "failed", "error": scrub(traceback.format_exc(), self.secrets)})
            return 1
        finally:
            if self.pool is not None:
                self.pool.close(hurry=True)
            if self.records_dir is not None:
                shutil.rmtree(self.records_dir, ignore_errors=True)

    def wait_ready(self) -> None:
        ready = set()
        while len(ready) < self.pool.count:
            message = self.pool.get(POLL_S)
            if isinstance(message, WorkerFailed):
                raise RuntimeError(f"engine {message.worker} failed to start:\n{message.error}")
            if isinstance(message, WorkerReady):
                ready.add(message.worker)
            if dead := self.pool.lost():
                raise RuntimeError(dead[0][1])
            self._control(self.next_frame(0))
        self.send({"t": "ready"})

    def measure(self) -> int:
        pending: dict[int, list[IntervalReport]] = {}
        done: dict[int, WorkerDone] = {}
        cpu = EnginesCpu([psutil.Process(p.pid) for p in self.pool.processes])
        while len(done) < self.pool.count:
            self._control(self.next_frame(0))
            message = self.pool.get(POLL_S)
            if message is None:
                if dead := [why for i, why in self.pool.lost() if i not in done]:
                    raise RuntimeError(dead[0])
                continue
            if isinstance(message, IntervalReport):
                reports = pending.setdefault(message.interval, [])
                reports.append(message)
                if len(reports) == self.pool.count:
                    merged = merge_reports(pending.pop(message.interval), worker=0)
                    self.send({"t": "interval", "k": merged.interval, "blob": encode_report(merged), "cpu": cpu.percent()})
            elif isinstance(message, WorkerDone):
                done[message.worker] = message
            elif isinstance(message, WorkerFailed):
                raise RuntimeError(f"engine {message.worker} failed:\n{message.error}")
        for k in sorted(pending):  # a stopped engine's last interval may be missing others' reports
            merged = merge_reports(pending[k], worker=0)
            self.send({"t": "interval", "k": k, "blob": encode_report(merged), "cpu": None})
        examples: dict[str, list[str]] = {}
        for d in done.values():
            for kind, messages in d.error_examples.items():
                examples.setdefault(kind, []).extend(m for m in messages if m not in examples.get(kind, []))
        records = self.ship_records()
        self.send({"t": "done", "not_sent": sum(d.not_sent for d in done.values()), "error_examples": examples,
                   "unaccounted": sum(d.unaccounted for d in done.values()), "records": records})
        return 0

    def ship_records(self) -> dict:
        """The engines' part files (whole ones: each is written under a temporary name, then renamed)
        to the coordinator, CHUNK bytes a `records` frame, with at most RECORDS_WINDOW × CHUNK bytes
        unanswered (its `records_ok` says what it has); {files, bytes}: what there was to send, for
        the coordinator to tell whether it got all. A coordinator that answers nothing for
        RECORDS_WAIT_S gets no more (its summary then says this node's records are not complete)."""
        found = [p for p in part_files(self.records_dir) if PART_NAME.fullmatch(p.name)] if self.records_dir else []
        parts = [(p, size) for p in found if (size := p.stat().st_size) > 0]  # a parquet file is never empty
        had = {"files": len(parts), "bytes": sum(size for _, size in parts)}
        sent = answered = 0
        heard = time.monotonic()
        for path, size in parts:
            with open(path, "rb") as f:
                for offset in range(0, size, CHUNK):
                    while sent - answered + min(CHUNK, size - offset) > RECORDS_WINDOW * CHUNK:
                        frame = self.next_frame(POLL_S)
                        if frame is not None and frame["t"] == "records_ok":
                            answered, heard = max(answered, frame["bytes"]), time.monotonic()
                        elif time.monotonic() - heard > RECORDS_WAIT_S:
                            print(f"latscope node: the coordinator took {answered:,} bytes of {had['bytes']:,} of records "
                                  f"and answered nothing for {RECORDS_WAIT_S:g} s: the rest stay here", file=sys.stderr,
                                  flush=True)
                            return had
                    data = f.read(CHUNK)
                    self.send({"t": "records", "name": path.name, "offset": offset, "size": size, "data": data})
                    sent += len(data)
        return had

    def _control(self, frame: dict | None) -> None:
        if frame is None:
            return
        if frame["t"] == "start":
            late_ms = (time.perf_counter_ns() - frame["t0"]) / 1e6
            if late_ms > LATE_START_MS:
                raise RuntimeError(f"the start arrived {late_ms:.1f} ms after t0 (more than {LATE_START_MS:g} ms): "
                                   "requests would leave in a burst")
            self.pool.go(frame["t0"])
            self.send({"t": "started", "late_ms": round(late_ms, 3)})
        elif frame["t"] == "stop":
            self.pool.stop()

    def _send_quietly(self, frame: dict) -> None:
        try:
            self.send(frame)
        except OSError:
            pass


class EnginesCpu:
    """The engines' CPU time over the wall time since the last reading, percent of one core, summed;
    None when the reading comes less than half an interval after the last (two reports sent back to
    back would divide a few ms of CPU by almost no time)."""

    def __init__(self, processes: list):
        self.processes = processes
        self.last = (time.monotonic(), self._cpu_s())

    def _cpu_s(self) -> float | None:
        try:
            return sum(sum(p.cpu_times()[:2]) for p in self.processes)
        except psutil.Error:
            return None

    def percent(self) -> float | None:
        now, cpu = time.monotonic(), self._cpu_s()
        then, before = self.last
        if cpu is None or before is None or now - then < 0.5:
            return None
        self.last = (now, cpu)
        return round(100 * (cpu - before) / (now - then), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latscope.distributed.node")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)  # the relay's end is gevent's, non-blocking: the flag is shared
    return Node(sock).run()


if __name__ == "__main__":
    sys.exit(main())
