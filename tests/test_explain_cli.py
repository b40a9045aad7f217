"""`latscope explain`, explain.json after `latscope run`, and the gate file's fail_on_generator_tail,
through real subprocesses (the analysis itself: tests/analysis/test_explain.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from conftest import REPO, scenario_dict

sys.path.insert(0, str(REPO / "tests" / "analysis"))
from explain_runs import clean_frame, set_service, write_dir  # noqa: E402

LATSCOPE = [sys.executable, "-m", "latscope.cli"]


def latscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LATSCOPE, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def slow_replica_dir(path: Path) -> Path:
    frame = clean_frame(6000, 1)
    set_service(frame, (frame["replica"] == "r2").to_numpy(), 15_000)
    return write_dir(path, frame)


def generator_dir(path: Path) -> Path:
    """A tail the generator made: sends 25 ms late for 0.3 s every 5 s (a CPU hog on the client)."""
    frame = clean_frame(6000, 2)
    lag = np.where((frame["intended_us"].to_numpy() / 1e6) % 5 < 0.3, 25_000, 0)
    for column in ("send_lag_us", "sent_us", "first_byte_us", "end_us", "latency_us", "client_inclusive_us"):
        frame[column] += lag
    return write_dir(path, frame)


def test_explain_prints_the_paragraph_and_table_and_writes_explain_json(tmp_path):
    path = slow_replica_dir(tmp_path / "run")
    r = latscope("explain", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("why the tail: p99 latency is")
    assert "Top cause: replica r2" in r.stdout and "stands out" in r.stdout and "candidate causes" in r.stdout
    doc = json.loads((path / "explain.json").read_text())
    assert doc["verdict"] == "cause" and doc["causes"][0]["name"] == "replica=r2"
    assert doc["summary"].split()[:4] == r.stdout.split()[3:7]  # the same paragraph

    r = latscope("explain", str(path), "--json", "--quantile", "0.95", "--metric", "service_time")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["metric"], doc["quantile"], doc["tail"]["n"]) == ("service_time", 0.95, 300)  # above p95 of 6,000
    assert json.loads((path / "explain.json").read_text()) == doc  # the last explanation is the one kept


def test_explain_bad_input_exits_2_with_one_line_and_no_traceback(tmp_path):
    r = latscope("explain", str(REPO / "tests" / "data" / "run_f16f211"))  # written before requests.parquet
    assert r.returncode == 2
    assert "requests.parquet: missing" in r.stderr and "Traceback" not in r.stderr
    assert not (REPO / "tests" / "data" / "run_f16f211" / "explain.json").exists()
    path = slow_replica_dir(tmp_path / "run")
    r = latscope("explain", str(path), "--metric", "tpot")
    assert r.returncode == 2 and "no metric 'tpot' per request; it has" in r.stderr
    r = latscope("explain", str(path), "--quantile", "1.5")
    assert r.returncode == 2 and "--quantile" in r.stderr
    r = latscope("explain", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_run_writes_explain_json_and_prints_its_paragraph(target, tmp_path):
    url = target(delay_ms=1)
    path = tmp_path / "s.yaml"
    # 1,200 requests: a p99 tail of 12 when no two latencies tie at the threshold, 2 more than the fewest explain
    # takes (10), so that a tie there (latencies are whole microseconds) cannot leave it short (CI, 2026-11-28)
    path.write_text(yaml.safe_dump(scenario_dict(url, tmp_path, [{"name": "p", "duration": 3.0,
                                                                  "arrival": {"type": "constant", "rate": 400}}])))
    r = latscope("run", str(path), "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = next((tmp_path / "results").glob("test-*"))
    doc = json.loads((run_dir / "explain.json").read_text())
    assert doc["verdict"] in ("cause", "nothing_stands_out") and doc["requests"]["measured"] == 1200, doc["reason"]
    latency_us = pd.read_parquet(run_dir / "requests.parquet")["latency_us"].to_numpy()  # every request measured
    tail = int((latency_us > np.quantile(latency_us, 0.99, method="lower")).sum())  # explain's tail, exactly
    assert doc["tail"]["n"] == tail >= 10
    assert "why the tail: " + doc["summary"][:40] in " ".join(r.stdout.split())


def test_a_run_without_request_records_explains_why_not(target, tmp_path):
    url = target(delay_ms=1)
    path = tmp_path / "s.yaml"
    scenario = scenario_dict(url, tmp_path, [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 20}}])
    scenario.setdefault("output", {})["requests"] = "off"
    path.write_text(yaml.safe_dump(scenario))
    r = latscope("run", str(path), "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = next((tmp_path / "results").glob("test-*"))
    doc = json.loads((run_dir / "explain.json").read_text())
    assert doc["verdict"] == "not_enough_data" and "requests.parquet: missing" in doc["reason"]
    assert "why the tail: Not enough data to explain the tail" in " ".join(r.stdout.split())


def test_the_gate_fails_a_tail_the_generator_made_and_passes_the_servers(tmp_path):
    gate_file = tmp_path / "gate.yaml"
    gate_file.write_text("fail_on_generator_tail: true\n")
    r = latscope("gate", str(generator_dir(tmp_path / "gen")), "--slo", str(gate_file))
    assert r.returncode == 4, r.stdout + r.stderr  # invalid: the measurement is the generator's
    assert "tail_cause" in r.stdout and "the load generator made this tail, not the target" in r.stdout
    r = latscope("gate", str(slow_replica_dir(tmp_path / "replica")), "--slo", str(gate_file))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the load generator did not make the tail: its top cause is replica r2" in r.stdout
