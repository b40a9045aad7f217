"""The Python API (latscope/api.py): the examples of docs/python-api.md run, in order, in one
namespace, as a reader would run them (a real run against the demo target the page's scenario
launches, a real capacity search); what they leave behind is then checked against what the page
promises. The results directory written by older code (tests/data/run_f16f211) keeps opening."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import latscope
from conftest import REPO, free_port
from latscope import api
from latscope.analysis.gate import OUTCOMES, GateResult
from latscope.analysis.percentiles import spectrum
from latscope.analysis.run_data import load_run
from latscope.errors import ResultsError, ScenarioError
from latscope.results.schema import REQUEST_COLUMNS, ROW_STATS, SCHEDULE_COLUMNS, TELEMETRY_COLUMNS

PAGE = REPO / "docs" / "python-api.md"
OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
SESSIONS_RUN = REPO / "tests" / "data" / "run_sessions"
PAGE_PORT = "8765"  # the demo target's port on the page; each test run takes a free one
SKIP = "<!-- no-test -->"  # a line right before a block the tests leave out


def page_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of each ```python block of the page, less those marked SKIP."""
    blocks = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() != SKIP:
            blocks.append((text[: m.start()].count("\n") + 2, m.group(1)))
    return blocks


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> dict:
    """Every example of the page, run in order in one namespace, in a fresh folder (the page's
    relative paths, results/ and baselines/, land there); the namespace they leave."""
    folder = tmp_path_factory.mktemp("page")
    port = str(free_port())
    namespace: dict = {"__name__": "python_api_page"}
    here = os.getcwd()
    os.chdir(folder)
    try:
        for line, code in page_blocks(PAGE.read_text()):
            # padded so that a traceback names the page's own line
            exec(compile("\n" * (line - 1) + code.replace(PAGE_PORT, port), str(PAGE), "exec"), namespace)
    finally:
        os.chdir(here)
    namespace["_folder"] = folder
    return namespace


@pytest.fixture
def here(page, monkeypatch) -> dict:
    """The page's namespace, from its folder: the paths it printed are relative to it, as a reader's are."""
    monkeypatch.chdir(page["_folder"])
    return page


def test_the_page_has_examples_of_every_public_name():
    code = "\n".join(c for _, c in page_blocks(PAGE.read_text()))
    assert len(page_blocks(PAGE.read_text())) >= 8
    for name in api.__all__:
        if name[0].islower():
            assert f"latscope.{name}(" in code, name
    assert page_blocks("```python\nx = 1\n```\n<!-- no-test -->\n```python\ny = 2\n```\n") == [(2, "x = 1\n")]


def test_the_run_of_the_page_is_a_results_object_with_what_the_page_says(here):
    run = here["run"]
    assert isinstance(run, latscope.Results) and isinstance(run.path, Path) and (run.path / "summary.json").is_file()
    assert run.path.parent == Path("results") and run.path.name.startswith("echo-")
    assert isinstance(run.summary, dict) and run.summary["scenario"] == "echo"
    assert run.partial is False and run.validity in ("valid", "degraded", "invalid")
    assert run.scenario["name"] == "echo" and run.scenario["phases"][1]["name"] == "steady"
    assert here["progress"] and here["progress"][-1].completed > 0  # on_progress was called


def test_percentiles_are_the_summarys_rows_and_percentile_agrees_with_them(here):
    run = here["run"]
    table = run.percentiles
    assert list(table.columns) == ["metric", "class", *ROW_STATS]
    assert len(table) == sum(len(by_class) for by_class in run.summary["metrics"].values())
    row = table[(table["metric"] == "latency") & (table["class"] == "all")].iloc[0]
    assert row["count"] == run.summary["metrics"]["latency"]["all"]["count"] > 100
    # any percentile, from the histograms as the report's spectrum reads them (warm-up left out by interval)
    ladder = spectrum(load_run(run.path), "latency")["all"]
    assert len(ladder) > 5
    for q, value in zip(ladder["percentile"], ladder["value_ms"]):
        assert run.percentile("latency", q) == value
    with pytest.raises(ValueError, match="no metric 'latncy'; it has latency"):
        run.percentile("latncy", 99)
    with pytest.raises(ValueError, match="no class 'chat'; it has default, all"):
        run.percentile("latency", 99, cls="chat")


def test_the_files_of_a_run_come_as_frames_and_lists(here):
    run = here["run"]
    assert isinstance(run.timeseries, pd.DataFrame) and {"warmup", "steady"} <= set(run.timeseries["phase"])
    assert isinstance(run.telemetry, pd.DataFrame) and list(run.telemetry.columns) == list(TELEMETRY_COLUMNS)
    assert isinstance(run.events, list) and {"run_start", "run_end", "target_ready"} <= {e["event"] for e in run.events}
    assert isinstance(run.schedule, pd.DataFrame) and list(run.schedule.columns) == list(SCHEDULE_COLUMNS)
    assert len(run.schedule) == run.summary["requests"]["scheduled"] + run.summary["warmup_requests"]["scheduled"]
    assert isinstance(run.nodes, pd.DataFrame) and run.nodes.empty
    sent = run.summary["requests"]["sent"] + run.summary["warmup_requests"]["sent"]
    assert isinstance(run.requests, pd.DataFrame) and len(run.requests) == sent  # one row per request sent
    assert list(run.requests.columns[:len(REQUEST_COLUMNS)]) == list(REQUEST_COLUMNS)


def test_report_and_gate_write_and_judge_as_the_commands_do(here):
    run, verdict = here["run"], here["verdict"]
    html, markdown = here["html"], here["markdown"]
    assert html == run.path / "report.html" and html.stat().st_size > 100_000 and markdown == run.path / "summary.md"
    assert isinstance(verdict, GateResult) and verdict.outcome in OUTCOMES
    assert [c.kind for c in verdict.checks[:2]] == ["validity", "validity"]  # the run's and the baseline's
    assert any(c.kind == "regression" for c in verdict.checks)
    # a Results is a baseline too, and a gate file is read as `latscope gate --slo` reads it
    slo = here["_folder"] / "slo.yaml"
    slo.write_text("slos: [{metric: latency, stat: p50, limit_ms: 0.001}]\n")
    breach = run.gate(slo=slo)
    assert breach.outcome in ("slo_breach", "invalid") and any(c.kind == "slo" and c.status == "fail" for c in breach.checks)
    assert run.gate(baseline=run).outcome == run.gate(baseline=run.path).outcome


def test_a_saved_baseline_opens_with_empty_frames_for_what_it_left_out(here):
    baseline = latscope.open_results("baselines/echo")
    assert isinstance(baseline, latscope.Results)
    assert baseline.timeseries.empty and baseline.telemetry.empty and baseline.events == []
    assert baseline.schedule is None and baseline.requests is None and baseline.nodes.empty
    assert baseline.percentile("latency", 50) == here["run"].percentile("latency", 50)


def test_the_capacity_search_of_the_page(here):
    cap = here["cap"]
    assert isinstance(cap, latscope.Capacity) and (cap.path / "capacity.json").is_file()
    assert cap.path.name.startswith("echo-capacity-") and (cap.path / "capacity.html").is_file()
    assert cap.document["scenario"] == "echo" and cap.capacity_rps == cap.document["max_rate_rps"]
    assert cap.bracket == (cap.document["bracket"]["low_rps"], cap.document["bracket"]["high_rps"])
    assert cap.stopped in ("max_rate", "precision", "undecided_band", "generator_limit", "slo_fails_at_lowest_rate", "max_steps",
                           "inconclusive")
    assert isinstance(cap.message, str) and cap.message and cap.exit_code in (0, 1, 4)
    steps = cap.document["steps"]
    assert 1 <= len(steps) <= 3 and len(cap.step_table) == len(steps)
    assert list(cap.step_table["rate_rps"]) == [s["rate_rps"] for s in steps]
    assert [s.path for s in cap.steps] == [cap.path / s["dir"] for s in steps]
    assert all(isinstance(s, latscope.Results) and s.summary["scenario"] == "echo" for s in cap.steps)
    assert isinstance(here["again"], latscope.Capacity)
    verdict = cap.gate()
    assert isinstance(verdict, GateResult) and verdict.checks[0].name == "new capacity search"


def test_without_warm_up_percentile_is_the_summarys_at_every_point_of_its_ladder():
    run = latscope.open_results(SESSIONS_RUN)  # no warm-up phase; sessions' per-turn metrics too
    assert not any(p["warmup"] for p in run.summary["phases"])
    checked = 0
    for metric, by_class in run.summary["metrics"].items():
        for cls, row in by_class.items():
            for stat in ROW_STATS[3:-1] if row["count"] else ():
                assert round(run.percentile(metric, float(stat[1:-3]), cls), 3) == row[stat], (metric, cls, stat)
                checked += 1
    assert checked > 100 and any(m.startswith("turn.") for m in run.summary["metrics"])


def test_the_results_directory_written_by_older_code_keeps_opening():
    run = latscope.open_results(OLD_RUN)
    assert isinstance(run, latscope.Results) and run.validity == "valid" and not run.partial
    metrics = run.summary["metrics"]
    assert len(run.percentiles) == sum(len(c) for c in metrics.values())
    assert run.percentiles.set_index(["metric", "class"]).loc[("latency", "chat"), "p99_ms"] == 15.911
    assert run.percentile("latency", 99, "chat") == 15.911 and run.percentile("latency", 99.99, "chat") == 16.831
    assert len(run.timeseries) == 124 and len(run.telemetry) == 48 and len(run.events) == 12
    assert len(run.schedule) == 121 and run.nodes.empty and run.requests is None
    assert run.gate().outcome == "pass"


def test_what_is_not_a_results_directory_says_so(tmp_path):
    with pytest.raises(ResultsError, match=r"not a results directory \(no such directory\)"):
        latscope.open_results(tmp_path / "nope")
    with pytest.raises(ResultsError, match=r"not a results directory \(summary.json is missing\)"):
        latscope.open_results(tmp_path)
    (tmp_path / "summary.json").write_text('{"schema_version": 99}')
    with pytest.raises(ResultsError, match="newer than this latscope reads"):
        latscope.open_results(tmp_path)


def test_a_scenario_comes_from_a_dict_a_file_or_a_scenario(tmp_path):
    data = {"target": {"url": "http://127.0.0.1:9"}, "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 5}}]}
    checked = latscope.load_scenario(data, overrides=["phases.0.arrival.rate=7"])
    assert checked.name == "scenario" and checked.phases[0].arrival.rate == 7 and data["phases"][0]["arrival"]["rate"] == 5
    assert latscope.load_scenario(checked) is checked
    with pytest.raises(ScenarioError, match="overrides apply to a scenario file or dict"):
        latscope.load_scenario(checked, overrides=["seed=2"])
    with pytest.raises(ScenarioError, match=r"<dict> \(from --set phases.0.duration=…\): phases\[0\].duration"):
        latscope.load_scenario(data, overrides="phases.0.duration=-1")  # one override as a string
    file = tmp_path / "s.yaml"
    file.write_text("target: {url: 'http://127.0.0.1:9'}\nphases:\n  - {name: p, duration: 1, arrival: {type: constant, rate: -1}}\n")
    with pytest.raises(ScenarioError, match=r"s.yaml:3: phases\[0\].arrival.rate"):
        latscope.load_scenario(file)


def test_import_latscope_stays_cheap_and_the_api_names_survive_the_subpackages():
    code = ("import sys, latscope; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('latscope', 'pandas', 'numpy', 'pydantic'))); import latscope.run, latscope.capacity; "
            "print(latscope.run_scenario.__module__, latscope.find_capacity.__module__, latscope.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.splitlines() == ["['latscope']", f"latscope.api latscope.api {latscope.__version__}"]
    assert set(dir(latscope)) >= set(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        latscope.nope  # noqa: B018


def test_a_script_that_runs_at_its_top_level_is_told_to_guard_the_call(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("import latscope\nlatscope.run_scenario({'target': {'url': 'http://127.0.0.1:9'}, 'phases': "
                      "[{'name': 'p', 'duration': 0.2, 'arrival': {'type': 'constant', 'rate': 5}}], "
                      "'output': {'report': False}, 'telemetry': {'nvml': False, 'host': False}}, workers=1)\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 1
    assert 'put the call under `if __name__ == "__main__":`' in res.stderr
    assert "workers did not start" in res.stderr
