"""Replicas, the admin API and cold starts, with the reference server as real processes on loopback:
SO_REUSEPORT spreading, token auth, add/remove at runtime, --no-prewarm vs prewarm first responses,
--idle-unload scale from zero, and SIGTERM/SIGKILL leaving no replica behind."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO
import refserver
from refserver import MODEL, Server, alive, children, http, metric, running_server, scrape, start_server, wait_for

TOKEN = "replica-test-token"
REPLICA_ID = re.compile(r"^r(\d+)-(\d+)$")
# 16 tokens: a few ms of compute with --layers 2, so the model load (tens to hundreds of ms) stands out.
BODY = json.dumps({"inputs": [
    {"name": "input_ids", "shape": [1, 16], "datatype": "INT64", "data": list(range(1, 17))},
    {"name": "attention_mask", "shape": [1, 16], "datatype": "INT64", "data": [1] * 16},
]}).encode()

# The shared module-scoped fixtures (refserver.py), bound here so that pytest finds them by name.
cache, logs = refserver.cache, refserver.logs


def infer(server: Server) -> tuple[str, float]:
    """One inference on a new connection (so the kernel picks a replica): (replica id, client latency ms)."""
    started = time.perf_counter()
    status, headers, _ = http("POST", f"{server.url}/v2/models/{MODEL}/infer", BODY,
                              {"Content-Type": "application/json"})
    latency_ms = (time.perf_counter() - started) * 1000
    assert status == 200
    return headers["X-Replica-Id"], latency_ms


def admin(server: Server, method: str, path: str, body: dict | None = None, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = json.dumps(body).encode() if body is not None else None
    status, _, raw = http(method, server.admin + path, data, headers)
    return status, json.loads(raw) if raw else None


def replicas(server: Server) -> dict[str, dict]:
    status, answer = admin(server, "GET", "/admin/replicas")
    assert status == 200, answer
    return {r["id"]: r for r in answer["replicas"]}


def replica_metrics(server: Server, replica_id: str, attempts: int = 200) -> str:
    """/metrics as served by `replica_id` (fresh connections until the kernel hands us that replica)."""
    for _ in range(attempts):
        status, headers, body = http("GET", f"{server.url}/metrics")
        if status == 200 and headers["X-Replica-Id"] == replica_id:
            return body.decode()
    raise AssertionError(f"/metrics never answered by {replica_id}")


def serve_args(cache: Path, *flags: str, token: str | None = TOKEN) -> list[str]:
    """`serve` flags: HTTP and admin API on ports it picks (admin only with a token), gRPC off."""
    args = ["--http-port", "0", "--grpc-port", "-1", "--admin-port", "0", "--cache-dir", str(cache), "--layers", "2",
            "--threads", "1", *flags]
    if token:
        args += ["--admin-token", token]
    return args


@contextmanager
def running(cache: Path, logs: Path, *flags: str, token: str | None = TOKEN) -> Iterator[Server]:
    """A started server; on exit SIGTERM must end it with status 0 and leave none of its replicas behind."""
    with running_server(logs, *serve_args(cache, *flags, token=token)) as server:
        yield server


@pytest.fixture(scope="module")
def pair(cache, logs) -> Iterator[Server]:
    with running(cache, logs, "--replicas", "2") as server:
        yield server


# --- two replicas, one port -----------------------------------------------------------------------------

def test_two_replicas_share_the_port_and_fresh_connections_reach_both(pair):
    listed = replicas(pair)
    assert len(listed) == 2
    for rid, r in listed.items():
        assert REPLICA_ID.match(rid) and int(REPLICA_ID.match(rid)[2]) == r["pid"]
        assert r["state"] == "ready" and r["model_loaded"] and r["ready_at"] >= r["started_at"]
    assert sorted(r["index"] for r in listed.values()) == [0, 1]
    assert [line.split()[0] for line in pair.lines] == ["ready-admin", "ready"]  # each printed once

    seen: dict[str, int] = {}
    for _ in range(200):
        rid, _ = infer(pair)
        seen[rid] = seen.get(rid, 0) + 1
        if len(seen) == 2 and min(seen.values()) >= 3:
            break
    assert set(seen) == set(listed), seen


def test_admin_refuses_requests_without_the_right_token(pair):
    for token in (None, "wrong", "", TOKEN + "x"):
        for method, path in (("GET", "/admin/replicas"), ("POST", "/admin/replicas"),
                             ("DELETE", "/admin/replicas/r0"), ("GET", "/metrics"), ("GET", "/nowhere")):
            status, answer = admin(pair, method, path, token=token)
            assert status == 401, (token, method, path, answer)
            assert "Bearer" in answer["error"]
    # a token in the wrong scheme
    status, _, _ = http("GET", pair.admin + "/admin/replicas", headers={"Authorization": f"Basic {TOKEN}"})
    assert status == 401
    status, _, _ = http("GET", pair.admin + "/admin/replicas", headers={"Authorization": TOKEN})
    assert status == 401
    assert len(replicas(pair)) == 2  # nothing was started or stopped


def test_admin_adds_a_replica_that_takes_traffic_then_removes_it(pair):
    before = replicas(pair)
    assert admin(pair, "POST", "/admin/replicas", {"prewarm": "yes"})[0] == 400
    assert admin(pair, "POST", "/admin/replicas", {"replicas": 3})[0] == 400
    assert admin(pair, "DELETE", "/admin/replicas/r99")[0] == 404

    status, added = admin(pair, "POST", "/admin/replicas")
    assert status == 202, added
    new = added["id"]
    assert REPLICA_ID.match(new) and new not in before and added["index"] == 2 and added["prewarm"] is True
    assert added["state"] in ("starting", "loading", "warming")
    ready = wait_for(lambda: replicas(pair)[new]["state"] == "ready" and replicas(pair)[new], 30, f"{new} ready")
    assert ready["ready_after_s"] > 0 and ready["model_loaded"]
    wait_for(lambda: infer(pair)[0] == new, 30, f"a response from {new}", interval=0)

    status, removed = admin(pair, "DELETE", f"/admin/replicas/{new}")
    assert status == 202 and removed["state"] == "stopping"
    wait_for(lambda: new not in replicas(pair), 30, f"{new} to leave the list")
    wait_for(lambda: not alive(added["pid"]), 10, f"pid {added['pid']} to exit")
    assert {infer(pair)[0] for _ in range(40)} <= set(before)
    assert f"replica {new} stopped (exit code 0)" in pair.log_text()

    metrics = http("GET", pair.admin + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})[2].decode()
    assert metric(metrics, "latscope_ref_replicas", state="ready") == 2
    assert metric(metrics, "latscope_ref_replica_starts_total") == 3


def test_a_replica_that_dies_is_logged_and_not_restarted(pair):
    victim = max(replicas(pair).values(), key=lambda r: r["index"])
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: victim["id"] not in replicas(pair), 10, f"{victim['id']} to leave the list")
    assert re.search(rf"replica {victim['id']} died \(signal SIGKILL\)", pair.log_text())
    time.sleep(0.5)
    assert len(replicas(pair)) == 1
    assert {infer(pair)[0] for _ in range(10)} == set(replicas(pair))  # the survivor takes everything


def test_a_port_already_served_is_refused(pair, cache):
    port = pair.url.rsplit(":", 1)[1]
    done = subprocess.run([sys.executable, "-m", "reference_server", "serve", "--http-port", port, "--grpc-port",
                           "-1", "--cache-dir", str(cache), "--layers", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--http-port" in done.stderr, done.stderr


# --- cold starts: a replica added at runtime, with and without prewarm ----------------------------------

def first_responses(server: Server, replica_id: str, count: int, timeout: float = 30) -> list[float]:
    """Latencies (ms) of `replica_id`'s first `count` responses, sending one request at a time on fresh
    connections from the moment it was added (so its very first request is one of ours)."""
    mine: list[float] = []
    deadline = time.monotonic() + timeout
    while len(mine) < count:
        assert time.monotonic() < deadline, f"{replica_id} answered {len(mine)} requests in {timeout} s"
        rid, latency = infer(server)
        if rid == replica_id:
            mine.append(latency)
    return mine


def test_a_replica_added_without_prewarm_is_cold_and_with_prewarm_is_not(cache, logs):
    with running(cache, logs, "--max-queue-delay-us", "0") as server:
        for _ in range(5):
            infer(server)
        steady = statistics.median(infer(server)[1] for _ in range(40))

        status, cold = admin(server, "POST", "/admin/replicas", {"prewarm": False})
        assert status == 202 and cold["prewarm"] is False
        cold_first = first_responses(server, cold["id"], 5)
        cold_replica = replicas(server)[cold["id"]]
        text = replica_metrics(server, cold["id"])
        assert metric(text, "latscope_ref_model_loads_total", reason="first_request") == 1
        assert metric(text, "latscope_ref_model_loads_total", reason="prewarm") == 0
        assert metric(text, "latscope_ref_model_load_seconds") > 0

        status, warm = admin(server, "POST", "/admin/replicas", {"prewarm": True})
        assert status == 202 and warm["prewarm"] is True
        warm_first = first_responses(server, warm["id"], 5)
        warm_replica = replicas(server)[warm["id"]]
        text = replica_metrics(server, warm["id"])
        assert metric(text, "latscope_ref_model_loads_total", reason="prewarm") == 1
        assert metric(text, "latscope_ref_model_warmup_seconds") > 0
        assert metric(text, "latscope_ref_replica_ready_timestamp_seconds", replica=warm["id"]) > 0

    print(f"\nsteady median {steady:.1f} ms; no-prewarm replica: ready after {cold_replica['ready_after_s']} s, "
          f"first responses {[round(x, 1) for x in cold_first]} ms; prewarm replica: ready after "
          f"{warm_replica['ready_after_s']} s, first responses {[round(x, 1) for x in warm_first]} ms")
    # The cold replica's first request waits for the model load and the first run: many times steady state.
    assert cold_first[0] >= 5 * steady, (cold_first, steady)
    # The warmed one took traffic only once loaded and warmed: its first answers look like everyone else's.
    assert statistics.median(warm_first[:3]) <= 3 * steady + 10, (warm_first, steady)
    assert warm_first[0] * 3 < cold_first[0], (warm_first, cold_first)


# --- scale from zero: --no-prewarm --idle-unload --------------------------------------------------------

def test_no_prewarm_loads_on_first_request_and_idle_unload_reloads(cache, logs):
    with running(cache, logs, "--no-prewarm", "--idle-unload", "1", "--max-queue-delay-us", "0",
                 token=None) as server:
        assert not server.admin and "admin API disabled" in server.log_text()
        text = scrape(server.url)
        assert metric(text, "latscope_ref_model_loaded", model=MODEL) == 0  # accepting, but nothing loaded yet

        _, first = infer(server)
        steady = statistics.median(infer(server)[1] for _ in range(30))
        text = scrape(server.url)
        assert metric(text, "latscope_ref_model_loads_total", reason="first_request") == 1
        assert metric(text, "latscope_ref_model_loaded", model=MODEL) == 1

        time.sleep(2.0)  # > --idle-unload 1
        text = scrape(server.url)  # /metrics is not a request for the model
        assert metric(text, "latscope_ref_model_loaded", model=MODEL) == 0
        assert metric(text, "latscope_ref_model_unloads_total", model=MODEL) == 1
        _, reload = infer(server)
        after = statistics.median(infer(server)[1] for _ in range(10))
        text = scrape(server.url)
        assert metric(text, "latscope_ref_model_loads_total", reason="idle_reload") == 1
        assert metric(text, "latscope_ref_model_loaded", model=MODEL) == 1
        assert "model encoder unloaded" in server.log_text()

    print(f"\nfirst request {first:.1f} ms, steady median {steady:.1f} ms, after 2 s idle {reload:.1f} ms, "
          f"then {after:.1f} ms")
    assert first >= 5 * steady, (first, steady)
    assert reload >= 5 * steady, (reload, steady)


# --- stopping ---------------------------------------------------------------------------------------------

def test_sigkill_of_the_supervisor_takes_its_replicas_along(cache, logs):
    server = start_server(logs, *serve_args(cache, "--replicas", "2", token=None))
    pids = children(server.proc.pid)
    try:
        assert len(pids) == 2
        server.proc.kill()
        server.proc.wait(10)
        wait_for(lambda: not any(alive(p) for p in pids), 15, f"replicas {pids} to exit after the supervisor died")
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
