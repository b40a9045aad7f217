"""Ctrl-C and SIGTERM at any moment of `latscope run`: real `python -m latscope` processes, real
signals, sent at moments found by watching the process (its handlers, its results directory, its
events), not by sleeping. Before the results directory exists the run says that nothing was written;
after, the directory is complete. Always exit 1, never a traceback, never death by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, scenario_dict
from helpers import read_summary
from latscope.interrupt import BEFORE_START
from latscope.results import read_events
from latscope.results.hlog import HlogReader

LATSCOPE = [sys.executable, "-m", "latscope"]
DEADLINE_S = 30


def start(tmp_path: Path, url: str, *, duration: float = 3, report: bool = False) -> tuple[subprocess.Popen, Path]:
    """`latscope run` of a tiny scenario against `url`, one worker, in a session of its own (so that
    a signal can go to its whole process group, as a terminal's Ctrl-C does)."""
    data = scenario_dict(url, tmp_path, [{"name": "p", "duration": duration, "arrival": {"type": "constant", "rate": 50}}])
    data["output"]["report"] = report
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    proc = subprocess.Popen([*LATSCOPE, "run", str(path), "--out", str(out), "--workers", "1", "--quiet"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, out


def wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} after {DEADLINE_S} s"
        time.sleep(0.005)


def handles_sigterm(proc: subprocess.Popen) -> bool:
    """The process has a handler for SIGTERM: latscope's signal handling is installed (it is the
    first thing the program does), and the imports and the scenario are still ahead."""
    status = Path(f"/proc/{proc.pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def worker_starting(proc: subprocess.Popen) -> bool:
    """A worker process of `proc` exists (spawned: it is importing, not yet running its loop)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == proc.pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                return True
        except (OSError, IndexError, ValueError):  # a process that ended while we looked
            continue
    return False


def run_started(out: Path) -> bool:
    return (out / "events.jsonl").exists() and '"run_start"' in (out / "events.jsonl").read_text()


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 1, (proc.returncode, stdout, stderr)
    assert "Traceback" not in stdout + stderr, stdout + stderr
    return stdout, stderr


def assert_complete(out: Path) -> dict:
    """Every file of a results directory, readable; the interval log at least its header; partial;
    and `latscope report` makes a report of it."""
    summary = read_summary(out)
    assert summary["partial"] is True and "interrupted by SIG" in summary["abort_reason"]
    yaml.safe_load((out / "scenario.yaml").read_text())
    reader = HlogReader(out / "histograms.hlog")
    list(reader)
    assert reader.version == "1.3" and reader.start_time_s is not None  # never a 0-byte log
    pd.read_parquet(out / "timeseries.parquet")
    read_events(out)
    assert not list(out.glob(".*.tmp")), "temporary files left behind"
    report = subprocess.run([*LATSCOPE, "report", str(out), "--cdn"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    return summary


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_results_directory_says_nothing_was_written(target, tmp_path, sig):
    proc, out = start(tmp_path, target())
    wait_for(proc, lambda: handles_sigterm(proc), "signal handling")
    proc.send_signal(sig)
    _, stderr = finish(proc)
    assert BEFORE_START in stderr
    assert not out.exists()


def test_ctrl_c_while_workers_start_leaves_a_complete_directory(target, tmp_path):
    proc, out = start(tmp_path, target())
    wait_for(proc, lambda: worker_starting(proc), "worker process")
    time.sleep(0.1)  # into the worker's imports (they take ~0.5 s)
    os.killpg(proc.pid, signal.SIGINT)  # the worker gets it too
    finish(proc)
    summary = assert_complete(out)
    assert "run_start" not in [e["event"] for e in read_events(out)]  # it was stopped before t = 0
    assert summary["requests"]["sent"] == 0
    assert summary["validity"] == "invalid" and "nothing was sent" in summary["validity_reasons"][0]


def test_ctrl_c_mid_run_leaves_a_complete_directory(target, tmp_path):
    # (SIGTERM mid-run, and two workers: tests/run/test_run.py)
    proc, out = start(tmp_path, target())
    wait_for(proc, lambda: run_started(out), "run_start")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    finish(proc)
    assert assert_complete(out)["requests"]["completed"] > 0


def test_a_second_ctrl_c_during_shutdown_finishes_fast_without_the_report(target, tmp_path):
    # Requests take 3 s: after the first Ctrl-C the workers wait for those in flight, and the
    # second Ctrl-C comes while they do.
    proc, out = start(tmp_path, target(delay_ms=3000), duration=20, report=True)
    wait_for(proc, lambda: run_started(out), "run_start")
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    second = time.monotonic()
    _, stderr = finish(proc)
    assert time.monotonic() - second < 5
    assert "report skipped" in stderr and not (out / "report.html").exists()
    assert assert_complete(out)["requests"]["sent"] > 0
