"""Distributed runs with real Locust processes on loopback: a master (`latscope run --distributed`),
workers (`latscope worker`), their coordinator, nodes and engines, against a target in this process
that logs every request's X-Request-Id and arrival time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from latscope import __version__
from latscope.analysis.quantile_ci import binomial_ranks
from latscope.distributed.frames import WIRE_VERSION
from latscope.recorder import new_histogram
from conftest import serve
from cluster import LATSCOPE, SHIFT_S, Cluster, arrivals_app, can_shift_clock, wait_for_event
from helpers import read_intervals, read_summary, read_timeseries

pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                reason="Locust is not installed (pip install -e '.[dev]' installs it)")


def write_scenario(tmp: Path, url: str, seconds: float, rate: float = 150) -> Path:
    """Chat requests whose prompts come from data/prompts.jsonl beside the scenario: 2.4 MiB, so a
    worker that lacks it fetches it from the master in three chunks."""
    (tmp / "data").mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    with open(tmp / "data" / "prompts.jsonl", "w") as f:
        for i in range(1400):
            f.write(json.dumps({"text": f"prompt {i} " + " ".join(rng.choice(["alpha", "beta", "gamma"], 300))}) + "\n")
    path = tmp / "dist.yaml"
    path.write_text(yaml.safe_dump({
        "name": "dist", "seed": 11,
        "target": {"url": url, "protocol": "openai", "model": "m", "openai": {"stream": False}, "timeout": 5,
                   "request_id_header": "X-Request-Id"},
        "workload": {"classes": [{"name": "chat", "dataset": {"file": "data/prompts.jsonl"}, "output_tokens": 4}]},
        "phases": [{"name": "steady", "duration": seconds, "arrival": {"type": "poisson", "rate": rate}}],
        "output": {"dir": str(tmp / "results"), "report": False},
    }))
    return path


def engine_of(seq: np.ndarray, engines: int) -> np.ndarray:
    """Which engine sent row `seq` of the plan: engine g of G sends rows g, g + G, … (Plan.worker_slice)."""
    return seq % engines


def node_of(summary: dict, seq: np.ndarray) -> np.ndarray:
    nodes = summary["generator"]["nodes"]
    g = engine_of(seq, summary["generator"]["workers"])
    firsts = np.cumsum([0] + [n["engines"] for n in nodes])
    return np.searchsorted(firsts, g, side="right") - 1


def latency_histogram(run_dir: Path):
    h = new_histogram()
    for _, _, interval in read_intervals(run_dir, ["latency"])[("latency", "all")]:
        h.add(interval)
    return h


def quantile_interval(h, q: float, confidence: float) -> tuple[float, float]:
    """A distribution-free confidence interval for the q-quantile, from order statistics (binomial
    ranks) read off the histogram (whose buckets are 0.1% wide: 3 significant digits)."""
    n = h.get_total_count()
    lo, hi = binomial_ranks(n, q, confidence)
    value = lambda rank: h.get_value_at_percentile(100.0 * min(max(rank, 1), n) / n)  # noqa: E731
    return value(lo) * 0.999, value(hi) * 1.001


def arrivals(log: list[tuple[int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(log, columns=["seq", "arrival_ns", "prompt"]).sort_values("seq").reset_index(drop=True)


def test_a_distributed_run_sends_the_local_runs_schedule_measures_the_shifted_clock_and_refuses_a_late_worker(tmp_path):
    log: list[tuple[int, int, str]] = []
    shift_problem = can_shift_clock()
    with serve(arrivals_app(log)) as url:
        scenario = write_scenario(tmp_path, url, seconds=4)
        local = tmp_path / "local"
        done = subprocess.run([*LATSCOPE, "run", str(scenario), "--workers", "2", "--quiet", "--out", str(local)],
                                            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        local_log, log[:] = list(log), []

        cluster = Cluster(tmp_path)
        dist = tmp_path / "dist"
        try:
            cluster.start_master(scenario, dist, 2)
            cluster.start_worker()
            cluster.start_worker(shifted=shift_problem is None)
            # late: once the roster is frozen (Locust's test start), with the setup and the 4 s run still
            # ahead, time enough for a worker to start and say hello before the run ends on a busy box
            wait_for_event(dist, "node_joined", proc=cluster.master)
            late = cluster.start_worker()
            assert cluster.wait_master() == 0, cluster.master_log.read_text()
            assert late.wait(30) != 0
            orphans = cluster.no_orphans()
        finally:
            cluster.kill_all()
    assert orphans == []

    # The late worker was refused, said why, and the run went on with its two.
    assert "refused" in late.log.read_text()
    events = [json.loads(line) for line in (dist / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "node_rejected" and "late" in e["reason"] for e in events)

    # Same plan, same schedule: the union of the engines' shares is the planned schedule, each request once.
    s_local, s_dist = read_summary(local), read_summary(dist)
    pd.testing.assert_frame_equal(pd.read_parquet(local / "schedule.parquet"), pd.read_parquet(dist / "schedule.parquet"))
    planned = len(pd.read_parquet(dist / "schedule.parquet"))
    for s, got in ((s_local, local_log), (s_dist, log)):
        assert s["requests"]["sent"] == s["requests"]["completed"] == planned
        assert sorted(seq for seq, _, _ in got) == list(range(planned))
    assert s_dist["generator"]["workers"] == 2 and len(s_dist["generator"]["nodes"]) == 2
    assert not s_dist["partial"] and s_dist["validity"] in ("valid", "degraded"), s_dist["validity_reasons"]

    # The same requests: each seq carried the same prompt, read on the workers from the file they
    # fetched (their working directory has no data/): the master's copy, byte for byte, in their cache.
    assert arrivals(local_log)["prompt"].equals(arrivals(log)["prompt"])
    prompts = (tmp_path / "data" / "prompts.jsonl").read_bytes()
    assert [p.read_bytes() == prompts for p in (tmp_path / "cache" / "blobs").iterdir()] == [True]

    # Intended times: arrival − intended is the same constant (t0, on the wall clock) for every request
    # give or take the send and the loopback, on each node: a node that started late or early by its
    # clock's offset (1000 s for the shifted one) would stand apart by that much.
    schedule = pd.read_parquet(dist / "schedule.parquet")
    got = arrivals(log)
    lateness_ms = (got["arrival_ns"] - (schedule["intended_s"].to_numpy() * 1e9)) / 1e6
    lateness_ms -= lateness_ms.median()
    per_node = lateness_ms.groupby(node_of(s_dist, got["seq"].to_numpy())).median()
    assert per_node.max() - per_node.min() < 5.0, per_node  # a 2-core box: a wake-up of a few ms is CPU, not clock
    assert np.percentile(np.abs(lateness_ms), 99) < 20, np.percentile(np.abs(lateness_ms), 99)

    # Each node's clock offset, within its stated bound: the shifted worker's monotonic clock reads SHIFT_S ahead.
    shifted = [n for n in s_dist["generator"]["nodes"] if abs(n["clock"]["offset_ms"]) > 1e5]
    assert len(shifted) == (1 if shift_problem is None else 0), shift_problem
    for node in s_dist["generator"]["nodes"]:
        truth_ms = SHIFT_S * 1e3 if node in shifted else 0.0
        assert abs(node["clock"]["offset_ms"] - truth_ms) <= node["clock"]["bound_ms"] + 0.5, node["clock"]
        assert node["status"] == "ok" and node["requests"]["sent"] > 0

    # Percentiles agree: each run's 99.9% distribution-free interval for p50 and p90 overlaps the
    # other's. If both runs measure one distribution, each interval misses its quantile with
    # probability ≤ 0.1%, so they fail to overlap with probability ≤ 0.2%.
    h_local, h_dist = latency_histogram(local), latency_histogram(dist)
    for q in (0.5, 0.9):
        a, b = quantile_interval(h_local, q, 0.999), quantile_interval(h_dist, q, 0.999)
        assert a[0] <= b[1] and b[0] <= a[1], (q, a, b)

    nodes = pd.read_parquet(dist / "nodes.parquet")
    assert sorted(nodes["node"].unique()) == [0, 1] and nodes["sent"].sum() == planned

    # requests.parquet: each node shipped its engines' records to the master's directory, one row per
    # request sent, each row named by the node whose engine sent it (engine g sends rows g, g + G, …).
    records = pd.read_parquet(dist / "requests.parquet")
    assert len(records) == s_dist["requests"]["sent"] == planned and sorted(records["row"]) == list(range(planned))
    machines = s_dist["generator"]["nodes"]
    names = [f"{n['node']}:{n['host']}" for n in machines]
    assert (records["node"].to_numpy() == np.array(names)[node_of(s_dist, records["row"].to_numpy())]).all()
    assert records.groupby("node").size().to_dict() == {name: n["requests"]["sent"] for name, n in zip(names, machines)}
    assert (records["worker"].to_numpy() == engine_of(records["row"].to_numpy(), 2)).all()
    assert all(n["records"]["complete"] and n["records"]["files"] >= 1 for n in machines), machines
    assert not (dist / ".requests").exists()
    assert pd.read_parquet(local / "requests.parquet")["node"].isna().all()  # a local run has no nodes


def exited_within(process: psutil.Process, timeout: float) -> bool:
    """Whether `process` exited within `timeout` s: gone, or a zombie (its parent, stopped, cannot reap it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@contextmanager
def master_of(tmp_path: Path, workers: int, *options: str) -> Iterator[tuple[Cluster, Path, list]]:
    """A master expecting `workers` (with `options`) for a 20 s run at 100 req/s against the logging
    target: (the cluster, the results directory, the target's log). Whatever is left is killed after."""
    log: list[tuple[int, int, str]] = []
    with serve(arrivals_app(log)) as url:
        cluster = Cluster(tmp_path)
        try:
            cluster.start_master(write_scenario(tmp_path, url, seconds=20, rate=100), tmp_path / "run", workers, *options)
            yield cluster, tmp_path / "run", log
        finally:
            cluster.kill_all()


def _run_and_break(tmp_path: Path, action: str) -> tuple[Path, int, list, dict]:
    """A 2-worker run whose second worker is killed (-9) or stopped (SIGSTOP) 1 s into the run."""
    with master_of(tmp_path, 2) as (cluster, out, log):
        cluster.start_worker()
        victim = cluster.start_worker()
        wait_for_event(out, "run_start", proc=cluster.master)
        time.sleep(1.0)
        node = psutil.Process(victim.pid).children()[0]  # the victim's node process
        broken_at = time.time_ns()
        os.kill(victim.pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        node_gone_s = exited_within(node, 15) and (time.time_ns() - broken_at) / 1e9
        code = cluster.wait_master(30)
        ended_after_s = (time.time_ns() - broken_at) / 1e9
        if action == "stop":
            os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        orphans = cluster.no_orphans()
    return out, broken_at, log, {"code": code, "ended_after_s": ended_after_s, "orphans": orphans,
                                 "node_gone_s": node_gone_s}


def _check_partial_and_named(out: Path, broken_at: int, log: list, outcome: dict, quiet_within_s: float) -> dict:
    assert outcome["code"] == 1
    assert outcome["orphans"] == []
    summary = read_summary(out)
    assert summary["partial"] is True and summary["validity"] == "invalid"
    lost = [n for n in summary["generator"]["nodes"] if n["status"] == "lost"]
    assert len(lost) == 1, summary["generator"]["nodes"]
    name = f"node {lost[0]['node']} ({lost[0]['host']})"
    assert name in summary["abort_reason"] and lost[0]["lost_at_s"] > 1.0  # Locust's ~3 s after the break
    assert any(name in reason for reason in summary["validity_reasons"])
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "node_lost" and e["node"] == lost[0]["node"] for e in events)
    # every file of the results directory is there and readable
    for name in ("histograms.hlog", "timeseries.parquet", "schedule.parquet", "nodes.parquet", "requests.parquet"):
        assert (out / name).stat().st_size > 0, name
    pd.read_parquet(out / "nodes.parquet")
    # the node left was stopped and shipped its records; the lost one shipped none (they were still on its machine)
    ok = next(n for n in summary["generator"]["nodes"] if n["status"] == "ok")
    records = pd.read_parquet(out / "requests.parquet")
    assert records.groupby("node").size().to_dict() == {f"{ok['node']}:{ok['host']}": ok["requests"]["sent"]}
    assert ok["records"]["complete"] and not lost[0]["records"]["complete"] and lost[0]["records"]["files"] == 0
    # The lost node's engines fell silent: nothing of its share reached the target later than this after the break.
    got = arrivals(log)
    theirs = got[node_of(summary, got["seq"].to_numpy()) == lost[0]["node"]]
    assert len(theirs) > 0
    quiet_after_s = (theirs["arrival_ns"].max() - broken_at) / 1e9
    assert quiet_after_s < quiet_within_s, quiet_after_s
    print(f"last arrival of the lost node's share {quiet_after_s:.3f} s after the break; {outcome}")
    return lost[0]


def test_a_worker_killed_mid_run_ends_it_partial_naming_the_node_with_nothing_left_running(tmp_path):
    out, broken_at, log, outcome = _run_and_break(tmp_path, "kill")
    # Locust marks a worker missing after 3 missed heartbeats (measured ~4 s); then a 10 s grace at most
    assert outcome["ended_after_s"] < 20, outcome
    # the node sees its relay's socket close at once: its engines stop within a second
    _check_partial_and_named(out, broken_at, log, outcome, quiet_within_s=1.0)
    assert outcome["node_gone_s"] and outcome["node_gone_s"] < 2, outcome


def test_a_worker_stopped_mid_run_ends_it_partial_and_its_node_stops_on_its_own(tmp_path):
    out, broken_at, log, outcome = _run_and_break(tmp_path, "stop")
    assert outcome["ended_after_s"] < 20, outcome
    # The stopped relay forwards no master heartbeat (one a second): its node stops its engines 5 s
    # (--master-timeout) after the last one it got, so within 5 s of the stop, and exits: a stopped
    # Locust process or not.
    _check_partial_and_named(out, broken_at, log, outcome, quiet_within_s=5.5)
    assert outcome["node_gone_s"] and outcome["node_gone_s"] < 5 + 1, outcome


def test_a_worker_of_another_latscope_version_is_refused_before_anything_is_sent(tmp_path):
    """A worker whose latscope says another version (the real worker, its version string changed
    before Locust starts) is refused at the roster: the master says who and why, sends nothing, and
    writes a partial results directory; the worker exits 1 saying why."""
    with master_of(tmp_path, 1) as (cluster, out, log):
        other = cluster.start_worker(version="0.0.0-other")
        code = cluster.wait_master(60)
        other.wait(30)
        orphans = cluster.no_orphans()
    assert code == 1 and other.returncode == 1 and orphans == [] and log == []
    assert f"it runs latscope 0.0.0-other (wire {WIRE_VERSION}); the master runs latscope {__version__}" in \
        other.log.read_text()
    summary = read_summary(out)
    assert summary["partial"] is True and "expected 1 workers, 0 joined" in summary["abort_reason"]
    assert "0.0.0-other" in summary["abort_reason"]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["reason"] for e in events if e["event"] == "node_rejected"] == [
        f"it runs latscope 0.0.0-other (wire {WIRE_VERSION}); the master runs latscope {__version__} (wire {WIRE_VERSION})"]


def test_with_continue_a_lost_node_is_left_behind_and_sigterm_to_the_master_stops_the_run_in_order(tmp_path):
    """`--on-node-loss continue`: a worker killed 1 s in is marked lost (~4 s later) and the run goes
    on with the other, stamped invalid. Then SIGTERM to the Locust master (what `docker stop` and
    Kubernetes send): the coordinator stops the node left, collects what it measured and writes a
    complete, partial directory; nothing is left running."""
    with master_of(tmp_path, 2, "--on-node-loss", "continue") as (cluster, out, log):
        cluster.start_worker()
        victim = cluster.start_worker()
        wait_for_event(out, "run_start", proc=cluster.master)
        time.sleep(1.0)
        victim.kill()
        wait_for_event(out, "node_lost", timeout=15, proc=cluster.master)
        time.sleep(3.0)  # going on without it: at least one whole interval between lost_at_s + 1 and the stop
        cluster.master.send_signal(signal.SIGTERM)
        code = cluster.wait_master(30)
        victim.wait(10)
        orphans = cluster.no_orphans()
    assert code == 1 and orphans == []
    summary = read_summary(out)
    assert summary["partial"] is True and summary["abort_reason"] == "interrupted by SIGTERM"
    ok, lost = sorted(summary["generator"]["nodes"], key=lambda n: n["status"] != "ok")
    assert ok["status"] == "ok" and lost["status"] == "lost" and lost["lost_at_s"] > 1.0
    assert summary["validity"] == "invalid"
    assert any(f"node {lost['node']} ({lost['host']}) lost at" in r for r in summary["validity_reasons"])
    # the node left sent on after the loss, and everything it sent was counted: stopped, not lost
    got = arrivals(log)
    mine = got[node_of(summary, got["seq"].to_numpy()) == ok["node"]]
    assert ok["requests"]["sent"] == len(mine) > 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    lost_at_s = next(e for e in events if e["event"] == "node_lost")["t_s"]
    stopped_at_s = next(e for e in events if e["event"] == "abort")["t_s"]
    timeseries = read_timeseries(out)
    # the whole intervals between the loss and the stop: the one SIGTERM cut may hold only completions
    # (CI: SIGTERM at ~6.0 s left the interval at 6.0 s with 3 completions and no send)
    after = timeseries[(timeseries["metric"] == "latency") & (timeseries["class"] == "all")
                       & (timeseries["interval_start_s"] > lost_at_s + 1)
                       & (timeseries["interval_start_s"] + timeseries["interval_s"] <= stopped_at_s)]
    assert len(after) > 0 and (after["sent"] > 0).all()  # intervals after the loss completed, with one sender
    assert summary["requests"]["sent"] == summary["requests"]["completed"] + summary["requests"]["errors"] + \
        summary["requests"]["cancelled"]
    # the node left shipped its records when SIGTERM stopped it, the lost one none: its share is missing, and said so
    records = pd.read_parquet(out / "requests.parquet")
    assert records.groupby("node").size().to_dict() == {f"{ok['node']}:{ok['host']}": ok["requests"]["sent"]}
    assert ok["records"]["complete"] and not lost["records"]["complete"] and lost["records"]["files"] == 0
