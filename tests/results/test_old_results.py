"""A results directory written before the re-layout (commit f16f211, by tests/data/run_f16f211.yaml:
a streaming class, a plain HTTP class and a class that gets 404s, a warm-up, an action and host
telemetry) still opens with `latscope report`, `compare` and `gate`: the results directory is the
contract between measuring and analysing, and it must outlive the code that wrote it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from latscope.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "run_f16f211"


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """A copy (the report is written into the results directory)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def test_report_of_an_old_run(old_run: Path):
    result = CliRunner().invoke(main, ["report", str(old_run), "--cdn"])
    assert result.exit_code == 0, result.output
    summary = json.loads((old_run / "summary.json").read_text())
    page = (old_run / "report.html").read_text()
    count = summary["metrics"]["ttft"]["chat"]["count"]
    assert "<h1>latscope report · fixture · 2026-11-24T05:15:50Z</h1>" in page
    assert f'TTFT</td><td>chat</td><td class="n">{count}</td><td class="n">8.65</td>' in page  # the percentile table
    assert "http_4xx" in page and "HTTP 404 Not Found" in page  # the errors table, with the target's message
    assert "2 of 2 SLOs met" in (old_run / "summary.md").read_text()


def test_compare_of_two_old_runs(old_run: Path, tmp_path: Path):
    base = Path(shutil.copytree(FIXTURE, tmp_path / "base"))
    result = CliRunner().invoke(main, ["compare", str(base), str(old_run), "--cdn"])
    assert result.exit_code == 0, result.output
    deltas = (old_run / "compare.md").read_text()
    assert "| TTFT | chat |" in deltas and "(+0.0%)" in deltas  # the same run on both sides: no change


def test_gate_of_an_old_run_against_itself(old_run: Path, tmp_path: Path):
    gate_file = tmp_path / "gate.yaml"
    gate_file.write_text("slos:\n  - {metric: ttft, class: chat, stat: p50, limit_ms: 100}\n"
                         "regression:\n  checks:\n    - {metric: latency, class: all, stat: p50}\n")
    result = CliRunner().invoke(main, ["gate", str(old_run), "--baseline", str(FIXTURE), "--slo", str(gate_file)])
    assert result.exit_code == 0, result.output  # pass: valid, SLO met, p50 unchanged
    assert "ttft/chat p50" in result.output and "latency/all p50" in result.output
