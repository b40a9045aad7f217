"""The master trusts nothing a node sends: real Locust workers (hostile_node.py) that join a real
master and send malformed latscope messages are refused or dropped, naming why, and the run ends
with exit 1 and a complete partial results directory — no traceback, no hang, bounded memory. And
no process outlives its run: a node killed in its setup, a worker whose master was killed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from latscope.distributed.remote import CLOCK_SAMPLES, CLOCK_WAIT_S
from latscope.distributed.validate import MAX_ENGINES, MAX_INFLATED
from conftest import serve
from cluster import Cluster, arrivals_app, wait_for_event
from helpers import read_summary

pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                reason="Locust is not installed (pip install -e '.[dev]' installs it)")

ESC = "\x1b"


def write_scenario(tmp: Path, url: str) -> Path:
    """A 2 s run whose class reads a small dataset (so a node has a file to fetch)."""
    (tmp / "prompts.jsonl").write_text("".join(json.dumps({"text": f"prompt {i}"}) + "\n" for i in range(20)))
    path = tmp / "hostile.yaml"
    path.write_text(yaml.safe_dump({
        "name": "hostile", "seed": 1,
        "target": {"url": url, "protocol": "openai", "model": "m", "openai": {"stream": False}, "timeout": 2},
        "workload": {"classes": [{"name": "chat", "dataset": {"file": "prompts.jsonl"}, "output_tokens": 4}]},
        "phases": [{"name": "steady", "duration": 2, "arrival": {"type": "poisson", "rate": 10}}],
        "output": {"dir": str(tmp / "results"), "report": False},
    }))
    return path


@dataclass
class Outcome:
    code: int
    out: Path
    log: str  # the master's stdout and stderr
    events: list[dict]
    summary: dict
    peak_rss_mb: float  # the coordinator's peak resident memory (VmHWM)
    took_s: float
    orphans: list[str]


def _hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def hostile_run(tmp_path: Path, url: str, cases: list[str]) -> Outcome:
    """A master expecting one worker per case, joined by one hostile worker per case; until it
    exits. The coordinator's peak RSS is read from /proc while it runs (VmHWM only grows)."""
    cluster = Cluster(tmp_path)
    out = tmp_path / "run"
    try:
        started = time.monotonic()
        cluster.start_master(write_scenario(tmp_path, url), out, len(cases))
        hostiles = [cluster.start_hostile(case) for case in cases]
        master, peak, children, listed = psutil.Process(cluster.master.pid), 0.0, [], 0.0
        while cluster.master.poll() is None and time.monotonic() - started < 120:
            # VmHWM of each child every 20 ms (the bomb's peak is caught before its coordinator exits);
            # the children themselves listed every 0.5 s: psutil's children() reads all of /proc (~3 ms
            # of CPU a call), which at 50 Hz in each of the concurrent runs took up to a third of a 2-core box.
            if time.monotonic() - listed > 0.5:
                try:
                    children, listed = [c.pid for c in master.children()], time.monotonic()
                except psutil.Error:
                    pass
            for pid in children:
                peak = max(peak, _hwm_mb(pid))
            time.sleep(0.02)
        for pid in children:
            peak = max(peak, _hwm_mb(pid))
        code = cluster.wait_master(1)
        took = time.monotonic() - started
        for h in hostiles:
            h.wait(20)
        orphans = cluster.no_orphans()
    finally:
        cluster.kill_all()
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return Outcome(code, out, cluster.master_log.read_text(), events, read_summary(out), peak, took, orphans)


HELLOS = ["hello-list", "hello-no-engines", "hello-negative-engines", "hello-huge-engines", "hello-esc-host"]
# case -> what the run's abort_reason says after "node 0 (<host>) dropped: "
DROPPED = {
    "pong-silent": f"it answered 0 of the first {CLOCK_SAMPLES} clock pings within {CLOCK_WAIT_S:g} s",
    "bomb": f"its report inflates past {MAX_INFLATED:,} bytes",
    "frame-list": "a frame is not a mapping (a list)",
    "failed-not-string": "its failed frame's error is a dict, not a string",
    "done-missing-fields": "its done frame has no error_examples, unaccounted, records",
    "fetch-negative-offset": "its fetch frame's offset is -1, not an integer in [0, ",
    "fetch-huge-offset": "its fetch frame's offset is 1000000000000000000, not an integer in [0, ",
    "pong-none": "a clock answer is not a mapping (a NoneType)",
    "pong-string": "a clock answer's t2 is 'soon', not an integer in [0, ",
    "pong-unasked": "a clock answer to no ping of the master's (t1 ",  # a forged t1 would fake a short round trip
    "interval-random-bytes": "its report is not zlib data",
    "records-escape": "its records frame's name '../../escape.parquet' is not a part file's",
    "records-other-engine": "its records chunk of w007-000000.parquet is engine 7's, not one of its engines 0…0",
}
RUNS = {"hellos": HELLOS, **{case: [case] for case in DROPPED}, "esc-failure": ["esc-failure"],
        "esc-host-admitted": ["esc-host-admitted"]}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every hostile run, six at a time, each with its own master and workers: a run's ~7 s are
    Python processes starting (Locust's import, the coordinator's, ~4 s of CPU a run) and Locust's
    shutdown waits, which overlap well on two cores (the 16 runs take ~39 s together six at a time,
    ~48 s four at a time, ~110 s one after another; each still ends within a second of its roster)."""
    with serve(arrivals_app([])) as url, ThreadPoolExecutor(6) as pool:  # no request is ever sent to it
        futures = {name: pool.submit(hostile_run, tmp_path_factory.mktemp(name), url, cases)
                   for name, cases in RUNS.items()}
        return {name: f.result() for name, f in futures.items()}


def check_ended_partial(o: Outcome) -> None:
    """Exit 1, a complete partial results directory, no traceback, nothing left running."""
    assert o.code == 1, o.log
    assert o.summary["partial"] is True and o.summary["abort_reason"], o.summary
    for name in ("summary.json", "events.jsonl", "scenario.yaml"):
        assert (o.out / name).stat().st_size > 0, name
    assert "Traceback" not in o.log and "Uncaught exception" not in o.log, o.log
    assert ESC not in o.log and ESC not in json.dumps(o.summary, ensure_ascii=False)
    assert o.orphans == []


def test_hellos_that_are_not_mappings_lack_the_engines_or_claim_impossible_engines_are_refused_saying_why(outcomes):
    """Five hostile workers, each with one bad hello (they ignore the refusal and stay): none is
    admitted, each is refused with its reason (`node_rejected`), and the run ends partial, exit 1,
    naming them — a hello claiming 10^12 engines used to be accepted and the run to "succeed"."""
    o = outcomes["hellos"]
    check_ended_partial(o)
    reasons = sorted(e["reason"] for e in o.events if e["event"] == "node_rejected")
    assert reasons == sorted([
        "its hello is not a mapping (a list)",
        "its hello has no 'engines'",
        f"it claims -3 engines: a node runs 1 to {MAX_ENGINES} (one per core)",
        f"it claims 1000000000000 engines: a node runs 1 to {MAX_ENGINES} (one per core)",
        f"it claims '8' engines: a node runs 1 to {MAX_ENGINES} (one per core)",
    ]), reasons
    assert f"expected {len(HELLOS)} workers, 0 joined" in o.summary["abort_reason"]
    assert "1000000000000 engines" in o.summary["abort_reason"]
    assert not [e for e in o.events if e["event"] == "node_joined"]
    # the host name's escape sequences are shown, not obeyed: on the console, in the events
    shown = "evil\\x1b[2J\\x1b]0;owned\\x07host"
    assert any(e.get("host") == shown for e in o.events if e["event"] == "node_rejected")
    assert f"refused worker {shown}" in o.log
    print(f"hello cases: {o.took_s:.1f} s")


@pytest.mark.parametrize("case", list(DROPPED))
def test_a_node_that_sends_an_invalid_message_is_dropped_naming_why_and_the_run_ends_partial(outcomes, case):
    o = outcomes[case]
    check_ended_partial(o)
    dropped = [e for e in o.events if e["event"] == "node_failed"]
    assert len(dropped) == 1 and dropped[0]["error"].startswith(DROPPED[case]), (dropped, o.log)
    assert f"node 0 ({dropped[0]['host']}) dropped: {DROPPED[case]}" in o.summary["abort_reason"]
    node = o.summary["generator"]["nodes"][0]
    assert node["status"] == "failed" and DROPPED[case] in node["reason"]
    if case.startswith("records"):  # nothing written, there or anywhere: requests.parquet has no row
        assert not (o.out.parent.parent / "escape.parquet").exists() and not list(o.out.parent.rglob("w007-*"))
        assert len(pq.read_table(o.out / "requests.parquet")) == 0 and not node["records"]["complete"]
    # Bounded memory: the bomb inflates to ~500 MiB (the master reached 2.25 GB); refused at
    # MAX_INFLATED (32 MiB) inflated, the coordinator stays near the ~160 MB of an ordinary run.
    assert o.peak_rss_mb < 300, o.peak_rss_mb
    # Never a hang: the run ends soon after the roster (a silent node's, CLOCK_WAIT_S after it)
    at = {e["event"]: datetime.fromisoformat(e["wall"]) for e in reversed(o.events)}
    ended_s = (at["run_end"] - at["node_joined"]).total_seconds()
    assert (CLOCK_WAIT_S if case == "pong-silent" else 0) <= ended_s < (CLOCK_WAIT_S if case == "pong-silent" else 0) + 10
    print(f"{case}: ended {ended_s:.1f} s after the roster ({o.took_s:.1f} s in all), "
          f"coordinator peak RSS {o.peak_rss_mb:.0f} MB")


def test_a_nodes_host_name_and_failure_text_with_escape_sequences_are_shown_escaped_never_obeyed(outcomes):
    o = outcomes["esc-failure"]
    check_ended_partial(o)  # no raw ESC anywhere
    failed = [e for e in o.events if e["event"] == "node_failed"]
    assert failed and failed[0]["error"] == "boom\\x1b[2J\\x1b[31m red\\x07", failed
    assert "boom\\x1b[2J\\x1b[31m red\\x07" in o.log
    # A host name admitted to the roster (then refused there: another machine than the master's, with
    # a loopback target): escaped in the abort reason and on the console (check_ended_partial: no ESC).
    o = outcomes["esc-host-admitted"]
    check_ended_partial(o)
    shown = "evil\\x1b[2J\\x1b]0;owned\\x07host"
    assert f"workers run on {shown}" in o.summary["abort_reason"] and f"workers run on {shown}" in o.log


def test_a_node_killed_in_its_setup_leaves_no_process_behind(tmp_path):
    """The node (two engines started, multiprocessing's resource tracker beside them) is killed
    (-9) before it is ready: its worker ends the node's whole process group, the run ends partial
    naming it, and nothing that any of them started is left (the resource tracker and the engines
    used to be)."""
    with serve(arrivals_app([])) as url:
        cluster = Cluster(tmp_path)
        out = tmp_path / "run"
        try:
            cluster.start_master(write_scenario(tmp_path, url), out, 1)
            worker = cluster.start_worker(engines=2)
            wait_for_event(out, "node_joined", proc=cluster.master)
            node = psutil.Process(worker.pid).children()[0]
            deadline = time.monotonic() + 30
            while len(node.children()) < 3:  # the resource tracker and two engines
                assert time.monotonic() < deadline, node.children()
                time.sleep(0.02)
            below = node.children(recursive=True)
            tracked = [p.cmdline() for p in below]
            node.kill()
            code = cluster.wait_master(30)
            worker.wait(15)
            orphans = cluster.no_orphans(5)
            left = [p.pid for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        finally:
            cluster.kill_all()
    assert any("resource_tracker" in " ".join(cmd) for cmd in tracked), tracked
    assert code == 1 and orphans == [] and left == []
    summary = read_summary(out)
    assert summary["partial"] is True
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "node_failed" and "exited with code -9" in e["error"] for e in events), events


def test_a_worker_whose_master_is_killed_leaves_within_seconds_its_engines_stopped(tmp_path):
    """SIGKILL to the Locust master mid-run: the worker hears no heartbeat and leaves after
    locustfile.FOLLOW_S (3 s) instead of Locust's 60 s, its node and engines with it."""
    log: list = []
    with serve(arrivals_app(log)) as url:
        cluster = Cluster(tmp_path)
        scenario = write_scenario(tmp_path, url)
        spec = yaml.safe_load(scenario.read_text())
        spec["phases"][0]["duration"] = 30  # still running when the master is killed
        scenario.write_text(yaml.safe_dump(spec))
        try:
            cluster.start_master(scenario, tmp_path / "run", 1, "--master-timeout", "60")
            worker = cluster.start_worker(engines=1)
            wait_for_event(tmp_path / "run", "run_start", proc=cluster.master)
            time.sleep(0.5)
            below = psutil.Process(worker.pid).children(recursive=True)
            killed_at = time.monotonic()
            os.kill(cluster.master.pid, signal.SIGKILL)
            code = worker.wait(30)
            left_after_s = time.monotonic() - killed_at
            sent_before = len(log)
            time.sleep(0.5)
            silent = len(log) == sent_before
            alive = [p.pid for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            orphans = cluster.no_orphans(15)  # the coordinator writes its partial directory and exits
        finally:
            cluster.kill_all()
    print(f"worker left {left_after_s:.2f} s after its master's SIGKILL")
    assert code == 1 and left_after_s < 6, left_after_s  # FOLLOW_S + checks every 0.2 s + the node's stop
    assert alive == [] and silent and orphans == []
    assert "no heartbeat from the master for 3 s: this worker leaves" in worker.log.read_text()
