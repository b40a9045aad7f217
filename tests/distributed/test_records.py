"""A node's per-request records crossing to the coordinator: the real node code (node.Node.ship_records)
and the real coordinator code (remote.RemotePool, its checks and its writing) on two socketpairs, with
a relay between them in this process that stands where Locust's two relays stand, and can hold the
coordinator's answers back. (tests/distributed/test_distributed.py runs the same through real Locust
processes; its parts are one chunk each, these span several.)
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from latscope.distributed.frames import PeerGone, recv_frame, send_frame
from latscope.distributed.node import Node
from latscope.distributed.remote import NodeState, RemotePool
from latscope.distributed.wire import CHUNK, RECORDS_WINDOW
from latscope.plan import build_plan
from latscope.results import EventLog
from latscope.scenario import load_scenario
from conftest import REPO


class Relay:
    """Frames from the node to the pool (as the master's relay hands them: `up`), the pool's `down`
    frames to the node once `answers` is set; what crossed, counted."""

    def __init__(self, node_end: socket.socket, pool_end: socket.socket, pool: RemotePool):
        self.node_end, self.pool_end, self.pool = node_end, pool_end, pool
        self.answers = threading.Event()
        self.up_bytes = 0  # records bytes the pool has taken
        self.errors: list[BaseException] = []
        threading.Thread(target=self._up, daemon=True).start()
        threading.Thread(target=self._down, daemon=True).start()

    def _up(self) -> None:
        try:
            while True:
                frame = recv_frame(self.node_end)
                self.pool._on_frame({"t": "up", "n": "client-0", "f": frame, "bytes": 0})
                self.up_bytes += len(frame.get("data", b""))
        except PeerGone:
            pass
        except BaseException as exc:  # noqa: BLE001 - shown by the test
            self.errors.append(exc)

    def _down(self) -> None:
        try:
            while True:
                frame = recv_frame(self.pool_end)
                self.answers.wait()
                send_frame(self.node_end, frame["f"])
        except (PeerGone, OSError):
            pass


def test_a_nodes_part_files_arrive_whole_under_their_names_never_more_than_the_window_ahead(tmp_path):
    scenario_file = REPO / "scenarios" / "smoke.yaml"
    scenario = load_scenario(scenario_file)
    (tmp_path / "run").mkdir()  # the results directory; its .requests/ is made by the first chunk
    node_sock, node_end = socket.socketpair()
    pool_sock, pool_end = socket.socketpair()
    pool = RemotePool(pool_sock, scenario_file, (), scenario, build_plan(scenario), EventLog(tmp_path / "events.jsonl"),
                      expect=1, on_node_loss="abort", master_timeout_s=5.0, requests_dir=tmp_path / "run" / ".requests")
    state = NodeState(0, "client-0", "host-a", engines=2, first=4)  # engines 4 and 5 of the run
    state.totals[0] = 2000  # it reported 2,000 requests sent: its records may take 64 MiB + 8 MB
    pool.nodes.append(state)
    pool.by_client[state.client] = state
    relay = Relay(node_end, pool_end, pool)

    node = Node(node_sock)
    node.records_dir = tmp_path / "node"
    node.records_dir.mkdir()
    rng = np.random.default_rng(1)
    files = {"w004-000000.parquet": 5 * CHUNK + 123, "w004-000001.parquet": 17, "w005-000000.parquet": 3 * CHUNK}
    for name, size in files.items():
        (node.records_dir / name).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    (node.records_dir / ".w005-000001.parquet.tmp").write_bytes(b"half")  # an engine's file being written: not sent

    shipped: dict = {}
    sender = threading.Thread(target=lambda: shipped.update(node.ship_records()), daemon=True)
    sender.start()
    # With the coordinator's answers held back, the node sends RECORDS_WINDOW chunks and waits.
    deadline = time.monotonic() + 10
    while relay.up_bytes < RECORDS_WINDOW * CHUNK and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # ... and sends no more: without the window the whole 8 MiB would be through by now
    assert relay.up_bytes == RECORDS_WINDOW * CHUNK and sender.is_alive(), relay.up_bytes
    relay.answers.set()
    sender.join(10)
    assert not sender.is_alive() and relay.errors == []

    total = sum(files.values())
    deadline = time.monotonic() + 10  # the node has sent its last chunk: the relay hands it over
    while relay.up_bytes < total and time.monotonic() < deadline and not relay.errors:
        time.sleep(0.01)
    assert shipped == {"files": 3, "bytes": total} and relay.up_bytes == total and relay.errors == []
    out = tmp_path / "run" / ".requests"
    assert sorted(p.name for p in out.iterdir()) == sorted(files)  # whole files, no temporary name left
    for name in files:
        assert (out / name).read_bytes() == (node.records_dir / name).read_bytes(), name
    assert (state.records_files, state.records_bytes, state.status) == (3, total, "ok")
    assert pool.node_of_worker() == {4: "0:host-a", 5: "0:host-a"}
    node_sock.close()
    pool_sock.close()
