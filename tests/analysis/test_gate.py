"""The gate's checks, outcome, exit codes and outputs, over real results directories written with
synthetic latencies (lognormal, fixed seeds): summary.json, scenario.yaml and histograms.hlog as a
run writes them."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from latscope import results
from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, gate, outcome, Check
from latscope.cli import main
from latscope.scenario.gate_file import GateFile, load_gate_file
from latscope.errors import ScenarioError
from latscope.results.hlog import HlogWriter
from latscope.recorder import counts_from_values, from_sparse, merge, summarize


def write_run(path: Path, seed: int, scale: float = 1.0, n: int = 20_000, k: int = 20, validity: str = "valid",
              slos: list | None = None, errors: int = 0, warmup_scale: float | None = None,
              goodput: dict | None = None) -> Path:
    """A results directory with `k` 1-s intervals of n/k lognormal latencies (median 20 ms) × scale.
    With warmup_scale, two extra warm-up intervals first (phase `warmup`) at that scale."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    hists, phases, t = [], [], 0.0
    if warmup_scale is not None:
        phases.append({"name": "warmup", "start_s": 0.0, "duration_s": 2.0, "warmup": True})
        for _ in range(2):
            hists.append((t, rng.lognormal(math.log(20_000), 0.5, n // k) * warmup_scale, True))
            t += 1.0
    phases.append({"name": "steady", "start_s": t, "duration_s": float(k), "warmup": False})
    for _ in range(k):
        hists.append((t, rng.lognormal(math.log(20_000), 0.5, n // k) * scale, False))
        t += 1.0
    with open(path / results.HLOG, "w") as f:
        w = HlogWriter(f, 1_700_000_000.0)
        measured = []
        for start, values, warm in hists:
            counts = counts_from_values(values)
            nz = np.flatnonzero(counts)
            h = from_sparse(nz, counts[nz])
            w.write("latency/all", start, 1.0, h)
            if not warm:
                measured.append(h)
    latency = summarize(merge(measured))
    summary = {
        "schema_version": 1, "scenario": "synthetic", "partial": False, "validity": validity,
        "validity_reasons": ["send lag p99 40.000 ms > 10 ms: the generator could not keep to the schedule"] if validity == "invalid" else [],
        "requests": {"scheduled": n, "sent": n, "completed": n - errors, "errors": errors, "dropped": 0},
        "throughput": {"offered_rps": n / k, "achieved_rps": (n - errors) / k},
        "metrics": {"latency": {"all": latency}}, "phases": phases,
    }
    if goodput is not None:
        summary["goodput"] = goodput
    (path / results.SUMMARY).write_text(json.dumps(summary))
    (path / results.SCENARIO).write_text(yaml.safe_dump({"name": "synthetic", "slos": slos or []}))
    return path


def gate_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "slo.yaml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runs")
    slo = [{"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 500}]
    return {
        "base": write_run(d / "base", 1, slos=slo),
        "same": write_run(d / "same", 2, slos=slo),
        "slow": write_run(d / "slow", 3, scale=1.3, slos=slo),
        "tight": write_run(d / "tight", 4, slos=[{"metric": "latency", "stat": "p99", "limit_ms": 30}]),
        "invalid": write_run(d / "invalid", 5, scale=1.3, validity="invalid", slos=slo),
        "small": write_run(d / "small", 6, n=600, k=6, slos=slo),
        "warm": write_run(d / "warm", 7, warmup_scale=20.0, slos=slo),
    }


def cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env or {"GITHUB_ACTIONS": ""})


def test_same_build_passes_with_reasons(runs):
    r = gate(runs["same"], runs["base"], GateFile())
    assert r.outcome == "pass"
    p99 = next(c for c in r.checks if c.name == "latency/all p99")
    assert p99.status == PASS and "within the 10% budget" in p99.message and "[98% CI " in p99.message
    assert [c.kind for c in r.checks] == ["validity", "validity", "slo", "regression", "regression"]


def test_slower_build_is_a_regression_with_cli_exit_3(runs, tmp_path):
    res = cli("gate", str(runs["slow"]), "--baseline", str(runs["base"]), "--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "g.md"))
    assert res.exit_code == 3, res.output
    line = next(l for l in res.output.splitlines() if "regression  latency/all p99" in l)
    assert line.startswith("FAIL") and "over the 10% budget and beyond the noise" in line and "+3" in line  # ≈ +30 %
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert suite.get("tests") == "5" and suite.get("failures") == "2"  # p50 and p99 both grew 30 %
    assert cases["latency/all p99"].find("failure") is not None and cases["new run validity"].find("failure") is None
    md = (tmp_path / "g.md").read_text()
    assert md.startswith("### latscope: gate failed: regression against the baseline")
    assert "| ❌ | latency/all p99 |" in md


def test_slo_breach_exits_1_and_wins_over_regression(runs):
    res = cli("gate", str(runs["tight"]), "--baseline", str(runs["base"]))
    assert res.exit_code == 1, res.output
    assert "latency/all p99" in res.output and "breaches the SLO (≤ 30 ms)" in res.output
    assert outcome([Check("slo", "s", FAIL, ""), Check("regression", "r", FAIL, "")]) == "slo_breach"


def test_invalid_run_exits_4_even_when_it_also_regressed(runs):
    res = cli("gate", str(runs["invalid"]), "--baseline", str(runs["base"]))
    assert res.exit_code == 4, res.output
    assert "new run is invalid — the load generator fell behind" in res.output
    assert res.output.rstrip().endswith("gate failed: invalid measurement")


def test_too_few_samples_is_inconclusive_not_pass(runs):
    r = gate(runs["small"], runs["base"], GateFile())
    p99 = next(c for c in r.checks if c.name == "latency/all p99")
    assert p99.status == INCONCLUSIVE and "n = 600, 6.0 expected beyond it" in p99.message
    assert r.outcome == "inconclusive"
    assert cli("gate", str(runs["small"]), "--baseline", str(runs["base"])).exit_code == 4


def test_warm_up_intervals_are_not_gated(runs):
    # the warm-up is 20× slower; counted, it would be a huge p99 regression
    r = gate(runs["warm"], runs["base"], GateFile())
    assert r.outcome == "pass", [c.message for c in r.checks]
    assert next(c for c in r.checks if c.name == "latency/all p99").details["new"]["n"] == 20_000


def test_without_baseline_only_validity_and_slos(runs):
    res = cli("gate", str(runs["base"]))
    assert res.exit_code == 0 and "regression" not in res.output and "meets the SLO (≤ 500 ms)" in res.output


def test_github_annotations_only_under_github_actions(runs):
    res = cli("gate", str(runs["slow"]), "--baseline", str(runs["base"]), env={"GITHUB_ACTIONS": "true"})
    errors = [l for l in res.output.splitlines() if l.startswith("::error ")]
    assert len(errors) == 2 and errors[1].startswith("::error title=latscope gate latency/all p99::latency/all p99 ")
    assert "::error" not in cli("gate", str(runs["slow"]), "--baseline", str(runs["base"])).output


def test_gate_file_slos_error_rate_and_throughput(runs, tmp_path):
    f = gate_file(tmp_path, "slos:\n  - {stat: error_rate, limit: 0.01}\n  - {stat: throughput, limit: 2000}\n"
                            "  - {metric: latency, stat: p50, limit_ms: 25}\n")
    res = cli("gate", str(runs["base"]), "--slo", str(f))
    assert res.exit_code == 1
    assert "error rate 0.00% meets the SLO (≤ 1.00%)" in res.output
    assert "throughput 1000.0 req/s breaches the SLO (≥ 2000.0 req/s)" in res.output
    assert "latency/all p99" not in res.output  # the file's slos replace the scenario's


def test_gate_file_tolerance_and_checks(runs, tmp_path):
    f = gate_file(tmp_path, "regression:\n  tolerance: 0.5\n  checks:\n    - {stat: p90}\n")
    res = cli("gate", str(runs["slow"]), "--baseline", str(runs["base"]), "--slo", str(f))
    assert res.exit_code == 0, res.output  # +30 % is inside a 50 % budget
    regressions = [l for l in res.output.splitlines() if "  regression  " in l]
    assert len(regressions) == 1 and "latency/all p90" in regressions[0] and "within the 50% budget" in regressions[0]


def test_usage_errors_exit_2(runs, tmp_path):
    assert cli("gate", str(tmp_path / "nope")).exit_code == 2
    bad = gate_file(tmp_path, "regression:\n  tolerance: 0.1\n  min_effect: 0.2\n")
    res = cli("gate", str(runs["base"]), "--slo", str(bad))
    assert res.exit_code == 2 and "min_effect (0.2) must be smaller than the tolerance" in res.output
    with pytest.raises(ScenarioError, match="regression.checks.0.stat"):
        load_gate_file(gate_file(tmp_path, "regression:\n  checks: [{stat: p42}]\n"))
    (tmp_path / "empty").mkdir()
    assert cli("gate", str(tmp_path / "empty")).exit_code == 2


def test_baseline_save_is_small_and_gates_the_same(runs, tmp_path):
    res = cli("baseline", "save", str(runs["base"]), str(tmp_path / "bl"))
    assert res.exit_code == 0 and "baseline saved to" in res.output
    assert sorted(p.name for p in (tmp_path / "bl").iterdir()) == ["histograms.hlog", "scenario.yaml", "summary.json"]
    assert sum(p.stat().st_size for p in (tmp_path / "bl").iterdir()) < 200_000
    assert cli("gate", str(runs["slow"]), "--baseline", str(tmp_path / "bl")).exit_code == 3
    assert cli("gate", str(runs["same"]), "--baseline", str(tmp_path / "bl")).exit_code == 0
    cli("baseline", "save", str(runs["base"]), str(tmp_path / "none"), "--metric", "ttft")
    assert "Tag=latency" not in (tmp_path / "none" / "histograms.hlog").read_text()


def test_goodput_slos_from_the_scenario_and_from_a_gate_file(tmp_path):
    goodput = {"all": {"good": 19_740, "total": 20_000, "fraction": 0.987, "rps": 987.0, "output_tokens_per_s": 0.0}}
    slos = [{"metric": "goodput", "class": "all", "stat": "fraction", "limit": 0.95, "direction": "min"}]
    run = write_run(tmp_path / "run", 8, slos=slos, goodput=goodput)
    res = cli("gate", str(run))
    assert res.exit_code == 0, res.output
    assert "goodput/all fraction 98.7% meets the SLO (≥ 95.0%)" in res.output
    f = gate_file(tmp_path, "slos:\n  - {metric: goodput, class: all, stat: fraction, min: 0.99}\n"
                            "  - {metric: goodput, stat: rps, min: 900}\n")
    res = cli("gate", str(run), "--slo", str(f))
    assert res.exit_code == 1, res.output
    assert "goodput/all fraction 98.7% breaches the SLO (≥ 99.0%)" in res.output
    assert "goodput/all rps 987.0 req/s meets the SLO (≥ 900.0 req/s)" in res.output
    # A run without goodput (no objectives, or written before goodput existed) cannot meet a goodput SLO.
    res = cli("gate", str(write_run(tmp_path / "none", 9)), "--slo", str(f))
    assert res.exit_code == 1 and "goodput/all fraction: no data (SLO ≥ 99.0%)" in res.output


def test_a_run_in_which_no_request_succeeded_is_invalid_without_blaming_the_generator():
    from latscope.analysis.gate import validity_check

    reason = 'no request succeeded: 73 sent, 73 errors (http_4xx 73): no latency was measured; e.g. http_4xx: "HTTP 400"'
    check = validity_check({"validity": "invalid", "validity_reasons": [reason]}, "new")
    assert check.status == INCONCLUSIVE and check.message == f"new run is invalid: {reason}"
    lag = validity_check({"validity": "invalid", "validity_reasons": ["send lag p99 30 ms > 10 ms"]}, "new")
    assert "the load generator fell behind" in lag.message
