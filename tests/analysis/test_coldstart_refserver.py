"""Acceptance, end to end: a latscope run against the real reference server, which gets a replica
added mid-run without pre-warming; cold_starts() must find that replica and its slow first
requests, and must not flag the pre-warmed replica the run started with."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402
from refserver import MODEL, running_server  # noqa: E402

from latscope.analysis.coldstart import cold_starts  # noqa: E402
from latscope.analysis.run_data import load_run  # noqa: E402
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402

TOKEN = "coldstart-test-token"
# The default encoder (6 layers): its load takes a few hundred ms, while 4 tokens run in a few ms.
BODY = {"inputs": [
    {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [101, 2023, 2003, 102]},
    {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64", "data": [1, 1, 1, 1]},
]}
ADD_AFTER_S = 1.5  # into the run: after the first 20 requests (a replica then takes a second or more to start)
DURATION_S = 10.0
RATE = 20.0  # req/s: with fresh connections about half reach the new replica

cache, logs = refserver.cache, refserver.logs


def add_replica(admin_url: str) -> dict:
    request = urllib.request.Request(f"{admin_url}/admin/replicas", data=json.dumps({"prewarm": False}).encode(),
                                     method="POST", headers={"Authorization": f"Bearer {TOKEN}",
                                                             "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_replica_added_without_prewarm_is_found_cold(cache, logs, tmp_path):
    out = tmp_path / "run"
    data = {
        "name": "coldstart", "seed": 1,
        # Connection: close: every request on a fresh connection, which the kernel hashes onto one of
        # the replicas listening on the port (SO_REUSEPORT), so the new replica gets traffic at once.
        "target": {"url": "", "method": "POST", "path": f"/v2/models/{MODEL}/infer", "timeout": 10,
                   "headers": {"Connection": "close", "Content-Type": "application/json"}},
        "workload": {"body": BODY},
        "phases": [{"name": "steady", "duration": DURATION_S, "arrival": {"type": "constant", "rate": RATE}}],
        "output": {"dir": str(tmp_path), "interval": 0.1},
    }
    added: dict = {}
    with running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--admin-port", "0", "--admin-token", TOKEN,
                        "--cache-dir", str(cache), "--threads", "1",
                        need=("ready", "ready-admin")) as server:
        data["target"]["url"] = server.url

        def scale_up() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                events = out / "events.jsonl"
                if events.exists() and "run_start" in events.read_text():
                    break
                time.sleep(0.02)
            started = time.monotonic()
            time.sleep(ADD_AFTER_S)
            added["replica"] = add_replica(server.admin)
            added["at_s"] = time.monotonic() - started

        thread = threading.Thread(target=scale_up, daemon=True)
        thread.start()
        result = run_scenario(scenario_from_dict(data), out=out, workers=1)
        thread.join(10)
    assert "replica" in added, "the replica was never added"
    summary = result.summary
    assert summary["requests"]["errors"] == 0, summary["error_examples"]
    run = load_run(out)
    # N = 3: at ~10 req/s a replica, a model load of ~300 ms holds up about that many requests
    # (each waits for what is left of the load); with N = 20 they would be diluted by fast ones.
    starts = cold_starts(run, first_n=3)
    print("\n" + "\n".join(json.dumps(s) for s in starts))
    new_id = added["replica"]["id"]
    by_label = {s["label"]: s for s in starts}
    assert new_id in by_label, (new_id, starts)
    new = by_label[new_id]
    assert new["kind"] == "replica" and new["warmup"] is False
    # first seen when it answered its first request: after it was added, once started and loaded
    assert added["at_s"] - 0.3 <= new["at_s"] < DURATION_S, (added, new)
    # Its first requests waited for the model to load: the first of them by the whole load (tens to
    # hundreds of ms against ~10 ms), the others by what was left of it when they came — on a busy
    # machine the load may be over after one or two of them, so the max, not the p50, shows it.
    assert new["cold"] is True and new["first_max_ms"] > 3 * new["steady_p50_ms"], new
    assert new["time_to_steady_s"] is None or 0 <= new["time_to_steady_s"] < DURATION_S
    # The replica the run started with was pre-warmed: over the default N (20 requests, so that a
    # scheduling hiccup on a busy machine does not decide it, all sent before the new replica's start
    # competed for the CPU) neither it nor the run's start is cold.
    default = cold_starts(run)
    print("\n".join(json.dumps(s) for s in default if s["label"] != new_id))
    (original,) = [s for s in default if s["kind"] == "replica" and s["label"] != new_id]
    assert original["at_s"] < 0.5 and original["cold"] is False, original
    (run_start,) = [s for s in default if s["kind"] == "run_start"]
    assert run_start["cold"] is False and run_start["label"] == "steady", run_start
    # the per-replica latency made it into the summary and the time series
    assert set(summary["metrics"]["replica_latency"]) == {original["label"], new_id}
    assert sum(s["count"] for s in summary["metrics"]["replica_latency"].values()) == summary["requests"]["completed"]
    ts = run.timeseries
    assert set(ts[ts.metric == "replica_latency"]["class"]) == {original["label"], new_id}
