"""`latscope capacity` end to end, as a subprocess, against a target whose capacity theory knows:
latscope.targets.queue, one FIFO server with exponential service times (the M/M/1 queue).

Its time in system at arrival rate λ is exponential with rate μ − λ, so its p-quantile is
−ln(1 − p)/(μ − λ) and the highest λ whose p90 stays at or under a limit L is λ* = μ − ln(10)/L.
With mean service 2 ms (μ = 500/s) and L = 20 ms, λ* = 500 − 115.1 = 384.9 req/s. The SLO is on p90
rather than p99 so that a 4-second step has ten times more values beyond its percentile (~150, not
~15) and the search decides in about a minute; the theory is the same (benchmarks/capacity.py does
p99 with longer steps). The acceptance band is the issue's ±10 %. Where the search lands inside it:
near λ* a relative change of λ moves p90 λ/(μ − λ) = 3.3 times as much, and a 4-second step's
interval on p90 is about ±30 % wide (the M/M/1 queue near saturation is strongly autocorrelated, and
the block bootstrap says so), so a rate passes once its p90 is ~25 % under the limit, i.e. ~8 % under
λ* — the conservative side, by design; the rerun twice as long narrows it to ~±12 % (~4 %). Measured
on this box: 375 req/s (−2.6 %) in 9 steps and 65 s, twice.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, target_process

SERVICE_MS = 2.0
LIMIT_MS = 20.0
MU = 1000 / SERVICE_MS
LAMBDA_STAR = MU - math.log(10) / (LIMIT_MS / 1000)  # 384.9 req/s


def latscope(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "latscope.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def queue_server():
    with target_process("queue", "--service-ms", str(SERVICE_MS), "--seed", "1") as url:
        yield url


def write_scenario(path: Path, url: str, slo: dict, rate: float = 60, **extra) -> Path:
    data = {
        "name": "mm1", "seed": 5,
        "target": {"url": url, "method": "POST", "path": "/infer", "timeout": "5s"},
        "phases": [{"name": "warm", "duration": "1s", "warmup": True, "arrival": {"type": "poisson", "rate": rate}},
                   {"name": "measure", "duration": "4s", "arrival": {"type": "poisson", "rate": rate}}],
        "slos": [slo],
        "output": {"dir": str(path.parent / "results"), "report": False, "save_schedule": False},
        "telemetry": {"nvml": False, "host": False},
        # The generator shares a small CI box with the target: the coarse timer spins no CPU (it sends
        # ~1 ms late at p99), and a send-lag p99 of a few ms is that box, not this test's subject. A
        # step stamped anything but valid stops the search (tested below).
        "limits": {"timer": "coarse"},
        "validity": {"degraded_send_lag_p99_ms": 5, "degraded_loop_lag_p99_ms": 20},
        **extra,
    }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def found(queue_server, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    d = tmp_path_factory.mktemp("capacity")
    scenario = write_scenario(d / "mm1.yaml", queue_server, {"metric": "latency", "stat": "p90", "limit_ms": LIMIT_MS})

    def search(out: Path) -> subprocess.CompletedProcess:
        return latscope("capacity", str(scenario), "--out", str(out), "--min-rate", "240", "--workers", "1",
                        "--price-per-hour", "3.6", "--quiet")

    res, out = search(d / "found"), d / "found"
    # The one retry: a search stopped because the generator itself fell behind (a stall of this shared
    # box, measured as send lag and printed here) says nothing about the target, so it runs once more.
    if res.returncode == 4 and json.loads((out / "capacity.json").read_text())["stopped"] == "generator_limit":
        print(f"the box stalled the generator; searching again. The first search said:\n{res.stdout}")
        res, out = search(d / "found-again"), d / "found-again"
    return res, out


def test_finds_the_theoretical_capacity_of_an_mm1_queue_within_10_percent(found):
    res, out = found
    assert res.returncode == 0, res.stdout + res.stderr
    cap = json.loads((out / "capacity.json").read_text())
    assert cap["stopped"] == "precision"
    low, high = cap["bracket"]["low_rps"], cap["bracket"]["high_rps"]
    assert (high - low) / low <= 0.05
    assert abs(cap["max_rate_rps"] - LAMBDA_STAR) / LAMBDA_STAR <= 0.10, (cap["max_rate_rps"], LAMBDA_STAR)
    # bounded: 240, 480 (fail), then at most log2(1 / 0.05) = 5 bisections, each maybe run twice
    assert len(cap["steps"]) <= 12
    for step in cap["steps"]:  # every step is an ordinary results directory
        summary = json.loads((out / step["dir"] / "summary.json").read_text())
        assert summary["throughput"]["achieved_rps"] == step["achieved_rps"]
        assert step["validity"] == "valid"
    passed = [s for s in cap["steps"] if s["counted_as"] == "pass"]
    failed = [s for s in cap["steps"] if s["counted_as"] == "fail"]
    assert max(s["rate_rps"] for s in passed) == low and min(s["rate_rps"] for s in failed) == high
    for s in passed:  # a pass means even the upper confidence bound met the limit
        assert s["slos"][0]["high"] <= LIMIT_MS
    assert cap["limiting_slo"] == "latency/all p90"
    # cost at the capacity: $3.6/h is $0.001 per second, over the achieved req/s of the passing step there
    at = next(s for s in reversed(passed) if s["rate_rps"] == low)
    assert cap["cost"]["per_1k_requests"] == pytest.approx(0.001 / at["achieved_rps"] * 1000, rel=1e-4)
    assert "capacity" in res.stdout and str(out) in res.stdout


def test_the_slo_failing_at_the_lowest_rate_exits_1(queue_server, tmp_path):
    # p90 of a 2 ms exponential service is at least 4.6 ms at any load: a 3 ms limit fails at once
    scenario = write_scenario(tmp_path / "s.yaml", queue_server, {"metric": "latency", "stat": "p90", "limit_ms": 3})
    res = latscope("capacity", str(scenario), "--out", str(tmp_path / "c"), "--workers", "1", "--quiet")
    assert res.returncode == 1, res.stdout + res.stderr
    cap = json.loads((tmp_path / "c" / "capacity.json").read_text())
    assert cap["stopped"] == "slo_fails_at_lowest_rate" and len(cap["steps"]) == 1
    assert cap["max_rate_rps"] is None and cap["bracket"]["high_rps"] == 60
    assert "fail even at the lowest rate" in res.stdout


def test_a_generator_pushed_past_its_limit_stops_with_exit_4_and_says_why(target, tmp_path):
    # One worker asked for 20,000 req/s cannot send on time: its send lag, not the target, shapes the
    # traffic. Bounded: one second of it, against a target that answers at once.
    scenario = write_scenario(tmp_path / "s.yaml", target(delay_ms=0), {"metric": "latency", "stat": "p90", "limit_ms": 10_000},
                              rate=20_000)
    data = yaml.safe_load(scenario.read_text())
    data["phases"] = [{"name": "measure", "duration": "1s", "arrival": {"type": "constant", "rate": 20_000}}]
    scenario.write_text(yaml.safe_dump(data))
    res = latscope("capacity", str(scenario), "--out", str(tmp_path / "c"), "--workers", "1", "--quiet")
    assert res.returncode == 4, res.stdout + res.stderr
    cap = json.loads((tmp_path / "c" / "capacity.json").read_text())
    assert cap["stopped"] == "generator_limit" and cap["max_rate_rps"] is None and len(cap["steps"]) == 1
    assert cap["steps"][0]["validity"] == "invalid" and cap["steps"][0]["verdict"] == "invalid"
    assert "the load generator fell behind" in res.stdout and "not the target's" in res.stdout


def test_a_cap_on_requests_is_bad_input(tmp_path):
    scenario = write_scenario(tmp_path / "s.yaml", "http://127.0.0.1:9", {"metric": "latency", "stat": "p90", "limit_ms": 5},
                              limits={"max_requests": 100})
    res = latscope("capacity", str(scenario), "--out", str(tmp_path / "c"))
    assert res.returncode == 2 and "limits.max_requests" in res.stderr and "Traceback" not in res.stderr


def test_a_scenario_without_slos_is_bad_input(tmp_path):
    scenario = write_scenario(tmp_path / "s.yaml", "http://127.0.0.1:9", {"metric": "latency", "stat": "p90", "limit_ms": 5})
    data = yaml.safe_load(scenario.read_text())
    data["slos"] = []
    scenario.write_text(yaml.safe_dump(data))
    res = latscope("capacity", str(scenario), "--out", str(tmp_path / "c"))
    assert res.returncode == 2 and "has no slos" in res.stderr and "Traceback" not in res.stderr


# -- the gate on a capacity directory ----------------------------------------------------------------


def gate_file(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


def test_gate_passes_a_capacity_above_the_minimum_and_fails_one_below_it(found, tmp_path):
    _, out = found
    high = json.loads((out / "capacity.json").read_text())["bracket"]["high_rps"]
    ok = latscope("gate", str(out), "--slo", str(gate_file(tmp_path / "ok.yaml", min_capacity_rps=high - 1)))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the bracket's upper end is below the minimum: the endpoint cannot take that load
    bad = latscope("gate", str(out), "--slo", str(gate_file(tmp_path / "bad.yaml", min_capacity_rps=high * 1.5)))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "capacity" in bad.stdout


def test_gate_regression_against_a_baseline_capacity_only_when_the_brackets_do_not_overlap(found, tmp_path):
    _, out = found
    cap = json.loads((out / "capacity.json").read_text())
    low, high = cap["bracket"]["low_rps"], cap["bracket"]["high_rps"]

    def baseline(name: str, lo: float, hi: float) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "capacity.json").write_text(json.dumps({**cap, "max_rate_rps": lo, "bracket": {"low_rps": lo, "high_rps": hi}}))
        return d

    same = latscope("gate", str(out), "--baseline", str(baseline("same", low * 0.98, high * 0.98)))
    assert same.returncode == 0, same.stdout + same.stderr
    higher = latscope("gate", str(out), "--baseline", str(baseline("higher", high * 1.2, high * 1.3)))
    assert higher.returncode == 3, higher.stdout + higher.stderr
    assert "capacity" in higher.stdout


def test_the_real_searchs_page_draws_in_chromium(found, tmp_path):
    """The page of the search above (not a sample): loads with no JavaScript error, draws its curve with
    the p90 limit and the capacity marked, and lists every step."""
    sys.path.insert(0, str(REPO / "tests" / "report"))
    from browser_cdp import Browser
    from test_browser import PLOTS_DONE, _need_chromium

    _need_chromium()
    _, out = found
    cap = json.loads((out / "capacity.json").read_text())
    with Browser(tmp_path) as browser:
        page = browser.open((out / "capacity.html").resolve().as_uri(), wait_for=PLOTS_DONE)
        assert page.errors == [] and page.dialogs == []
        plots = page.evaluate("Array.from(document.querySelectorAll('div.plot')).map(d => d.querySelectorAll('.main-svg').length)")
        assert plots and all(n > 0 for n in plots)
        labels = page.evaluate("Array.from(document.querySelectorAll('.annotation-text')).map(t => t.textContent)")
        assert f"p90 ≤ {LIMIT_MS:g} ms" in labels and any(label.startswith("capacity ≈") for label in labels), labels
        rows = page.evaluate("document.querySelectorAll('#steps tr').length") - 1  # less the header row
        assert rows == len(cap["steps"])
