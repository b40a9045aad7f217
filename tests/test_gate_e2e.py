"""The CI gate end to end: `latscope run --gate` and `latscope gate` as subprocesses, against the real
reference server that each run launches (scenarios/smoke.yaml, shortened, on a free port).

Runs are short (8 s at 60 req/s, ~480 latencies), so the gate file checks p50 and p90 — p99 needs
n ≥ 1,000 and would rightly be inconclusive — with a 50 % budget: two runs on a machine shared with
other work differ by more than sampling noise. The slowed server adds 50 ms to every response."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, free_port

GATE_FILE = """\
regression:
  tolerance: 0.5
  min_effect: 0.1
  checks:
    - {metric: latency, class: all, stat: p50}
    - {metric: latency, class: all, stat: p90}
"""


def latscope(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "GITHUB_ACTIONS": "true"}
    return subprocess.run([sys.executable, "-m", "latscope.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


# A one-layer encoder on one thread: a response costs well under a millisecond of CPU, so the
# latencies compared depend little on what else the (shared, 2-core) machine is doing at the time.
SERVER_FLAGS = "--threads 1 --layers 1"
# This machine is shared with other work: the runs that should measure the server get generous
# generator-lateness thresholds so that a busy CPU does not stamp them invalid; the overload run keeps
# the defaults (10 ms send lag, 50 ms loop lag).
RELAXED = ("validity.degraded_send_lag_p99_ms=50", "validity.invalid_send_lag_p99_ms=200",
           "validity.degraded_loop_lag_p99_ms=50", "validity.invalid_loop_lag_p99_ms=200")


def run_args(out: Path, url: str | None, *sets: str, server_flags: str = "") -> list[str]:
    """`latscope run` of the shortened smoke scenario against `url`, or against a server the
    scenario launches itself (with `server_flags`) when url is None."""
    if url is None:
        port = free_port()
        command = f"python -m reference_server serve --http-port {port} --grpc-port 0 {SERVER_FLAGS} {server_flags}".strip()
        target = [f"target.url=http://127.0.0.1:{port}", f"target.launch.command={command}",
                  f"target.launch.ready_url=http://127.0.0.1:{port}/v2/health/ready"]
    else:
        target = [f"target.url={url}", "target.launch=null"]
    args = ["run", str(REPO / "scenarios" / "smoke.yaml"), "--quiet", "--workers", "1", "--out", str(out)]
    for s in (*target, "phases.0.duration=1s", "phases.1.duration=8s", "phases.1.arrival.rate=60", "limits.timer=coarse", "output.interval=0.25s",
              "output.report=false",  # the gate reads summary.json and the hlog, never the report
              # generous absolute SLO: these runs are about regressions; the breach case tightens it
              "slos=[{metric: latency, class: all, stat: p99, limit_ms: 2000}]", *sets):
        args += ["--set", s]
    return args


@pytest.fixture(scope="module")
def server() -> str:
    """One reference server for the runs of the same build (the slowed one launches its own)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "0",
                             *SERVER_FLAGS.split()],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("reference server did not become ready in 60 s")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def baseline(server, tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("gate_e2e")
    (d / "slo.yaml").write_text(GATE_FILE)
    res = latscope(*run_args(d / "base", server, *RELAXED))
    assert res.returncode == 0, res.stdout + res.stderr
    saved = latscope("baseline", "save", str(d / "base"), str(d / "baseline"))
    assert saved.returncode == 0, saved.stderr
    return d, d / "baseline"


def test_same_build_passes_against_its_baseline(server, baseline):
    d, base = baseline
    res = latscope(*run_args(d / "aa", server, *RELAXED), "--gate", "--baseline", str(base), "--slo", str(d / "slo.yaml"),
                   "--junit", str(d / "aa.xml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "regression  latency/all p50" in res.stdout and "gate passed" in res.stdout
    assert (d / "aa.xml").read_text().count("<testcase") == 5  # 2 validity, 1 SLO, 2 regression


def test_slowed_server_is_a_regression_exit_3_naming_the_metric(baseline):
    d, base = baseline
    res = latscope(*run_args(d / "slow", None, *RELAXED, server_flags="--extra-latency-ms 50"), "--gate", "--baseline", str(base),
                   "--slo", str(d / "slo.yaml"))
    assert res.returncode == 3, res.stdout + res.stderr
    failed = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    assert any("latency/all p50" in line and "over the 50% budget and beyond the noise" in line for line in failed), res.stdout
    assert "::error title=latscope gate latency/all p50::" in res.stdout


def test_slo_breach_exits_1(baseline, tmp_path):
    d, base = baseline
    (tmp_path / "tight.yaml").write_text("slos:\n  - {metric: latency, class: all, stat: p50, limit_ms: 0.05}\n")
    res = latscope("gate", str(d / "base"), "--slo", str(tmp_path / "tight.yaml"), "--markdown", str(tmp_path / "g.md"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "breaches the SLO (≤ 0.05 ms)" in res.stdout
    assert "gate failed: SLO breach" in (tmp_path / "g.md").read_text()


def test_overloaded_generator_is_invalid_exit_4(server, baseline):
    d, base = baseline
    # one worker asked for 20,000 req/s: it cannot send on time; bounded by max_requests and 2 s
    res = latscope(*run_args(d / "overload", server, "phases.1.duration=2s", "phases.1.arrival.rate=20000", "limits.max_requests=3000"),
                   "--gate", "--baseline", str(base), "--slo", str(d / "slo.yaml"))
    assert res.returncode == 4, res.stdout + res.stderr
    assert json.loads((d / "overload" / "summary.json").read_text())["validity"] == "invalid"
    assert "new run is invalid — the load generator fell behind" in res.stdout
