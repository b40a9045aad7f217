"""`latscope capacity` when the user or the target gives up mid-search, as real processes: the
`latscope` program (python -m latscope, its signal handling from the first line) against a real
queue target process.

- Ctrl-C twice in the middle of a step: the search ends as for one (capacity.json and capacity.html
  written, `stopped: interrupted`, exit 4), never with click's "Aborted!" and exit 1.
- The target killed between steps: the next step's requests all fail to connect, and the search
  says so (`target_down`, exit 1: "the target stopped answering at ..."), not "capacity X req/s,
  error_rate is the SLO that gives out".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from conftest import REPO


def start_queue() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "latscope.targets.queue", "--port", "0", "--service-ms", "1", "--seed", "1"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready http://"), line
    return proc, line.split()[1]


def scenario(path: Path, url: str, measure_s: float, slos: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "mm1", "seed": 5,
        "target": {"url": url, "method": "POST", "path": "/infer", "timeout": "2s"},
        "phases": [{"name": "warm", "duration": "0.5s", "warmup": True, "arrival": {"type": "poisson", "rate": 50}},
                   {"name": "measure", "duration": f"{measure_s}s", "arrival": {"type": "poisson", "rate": 50}}],
        "slos": slos,
        "output": {"dir": str(path.parent / "results"), "report": False, "save_schedule": False},
        "telemetry": {"nvml": False, "host": False},
        "limits": {"timer": "coarse"},
        # a loaded CI box sends late: not this test's subject (a step stamped invalid would stop the search)
        "validity": {"degraded_send_lag_p99_ms": 500, "degraded_loop_lag_p99_ms": 1000,
                     "invalid_send_lag_p99_ms": 1000, "invalid_loop_lag_p99_ms": 2000},
    }))
    return path


def latscope_capacity(file: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "latscope", "capacity", str(file), "--out", str(out), "--workers", "1",
                             "--quiet", *args], cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_second_ctrl_c_mid_step_still_writes_capacity_json_and_html_and_exits_4(tmp_path):
    proc, url = start_queue()
    try:
        file = scenario(tmp_path / "s.yaml", url, 20, [{"metric": "latency", "stat": "p90", "limit_ms": 50}])
        out = tmp_path / "c"
        search = latscope_capacity(file, out)
        try:
            # the first step's run has started sending (its events file has more than its first line)
            events = out / "steps" / "001-50" / "events.jsonl"
            wait_for(lambda: events.exists() and "run_start" in events.read_text())
            time.sleep(0.5)
            search.send_signal(signal.SIGINT)
            time.sleep(0.2)
            search.send_signal(signal.SIGINT)
            stdout, stderr = search.communicate(timeout=60)
        finally:
            if search.poll() is None:
                search.kill()
    finally:
        proc.terminate()
        proc.wait(10)
    assert search.returncode == 4, stdout + stderr
    assert "Traceback" not in stderr and "Aborted" not in stdout + stderr
    cap = json.loads((out / "capacity.json").read_text())
    assert cap["stopped"] == "interrupted" and cap["exit_code"] == 4
    assert cap["steps"][0]["verdict"] == "partial" and cap["steps"][0]["note"].startswith("interrupted by SIGINT")
    assert (out / "capacity.html").is_file() and "interrupted" in (out / "capacity.html").read_text()
    assert "no capacity: no answer: interrupted" in stdout


def test_a_target_that_dies_mid_search_is_reported_as_such_not_as_a_capacity(tmp_path):
    proc, url = start_queue()
    file = scenario(tmp_path / "s.yaml", url, 1.5, [{"metric": "latency", "stat": "p90", "limit_ms": 50},
                                                    {"stat": "error_rate", "limit": 0.1}])
    out = tmp_path / "c"
    search = latscope_capacity(file, out)
    try:
        # killed once the first step (50 req/s, which passes) is written: the second step meets a dead port
        wait_for(lambda: (out / "capacity.json").exists())
        proc.kill()
        proc.wait(10)
        stdout, stderr = search.communicate(timeout=60)
    finally:
        if search.poll() is None:
            search.kill()
        if proc.poll() is None:
            proc.kill()
    assert search.returncode == 1, stdout + stderr
    cap = json.loads((out / "capacity.json").read_text())
    assert cap["stopped"] == "target_down", cap["message"]
    assert cap["steps"][0]["verdict"] == "pass" and cap["steps"][-1]["verdict"] == "target_down"
    assert cap["limiting_slo"] is None and "error_rate" not in cap["message"]
    assert cap["message"].startswith("the target stopped answering at 100 req/s"), cap["message"]
    assert "the SLOs pass with confidence at 50 req/s" in cap["message"]
    assert cap["steps"][-1]["errors"]["connect"] == cap["steps"][-1]["requests"]["errors"] > 0
    assert (out / "capacity.html").is_file() and "Traceback" not in stderr
