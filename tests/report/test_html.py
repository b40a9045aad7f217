"""The report's HTML and Markdown without a browser: from a real short run, what the page says and
what it escapes; the CLI's report/compare commands and their exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, free_port, serve
from latscope import results
from latscope.analysis.run_data import load_run
from latscope.builtin_target import make_app
from latscope.report import write_report
from latscope.report import html as report_html
from latscope.report.html import headline, script_json
from latscope.report.markdown import md, summary_markdown
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    with serve(make_app(delay_ms=2)) as url:
        scenario = scenario_from_dict({
            "name": "html", "seed": 2,
            "target": {"url": url, "method": "POST", "path": "/infer", "timeout": 5},
            "workload": {"body": {"inputs": [1]}, "classes": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}]},
            "phases": [{"name": "w", "duration": 0.5, "warmup": True, "arrival": {"type": "constant", "rate": 20}},
                       {"name": "main", "duration": 1.5, "arrival": {"type": "constant", "rate": 40}}],
            "slos": [{"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 1000}],
            "output": {"dir": str(tmp)},
        })
        return run_scenario(scenario, workers=1).run_dir


def _latscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latscope.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_run_writes_report_and_summary_md(run_dir):
    html = (run_dir / "report.html").read_text()
    assert "p99 latency" in html and "1 of 1 SLOs met" in html
    assert html.count("<script") == 3 and "Plotly" in html  # plotly.js embedded once: no network needed
    assert 'id="plot-spectrum"' in html and 'id="plot-load-time"' in html
    # No telemetry in this run: the GPU section says so in one line instead of an empty plot.
    assert "No GPU telemetry in this run." in html and 'id="plot-gpu"' not in html
    markdown = (run_dir / "summary.md").read_text()
    assert "1 of 1 SLOs met" in markdown and "| latency | all |" in markdown and "Full report: `report.html`" in markdown


def test_headline_sentence():
    summary = {"metrics": {"latency": {"all": {"p99_ms": 41.23}}}, "throughput": {"achieved_rps": 99.8},
               "slo": [{"passed": True}] * 3, "validity": "valid", "requests": {"errors": 0}}
    assert headline(summary) == "p99 latency 41.2 ms at 99.8 req/s — 3 of 3 SLOs met — measurement valid"
    summary["metrics"]["ttft"] = {"all": {"p99_ms": 8.04}}
    assert headline(summary).startswith("p99 latency 41.2 ms (time to first token p99 8.04 ms) at 99.8 req/s — ")
    del summary["metrics"]["ttft"]
    summary.update(partial=True, abort_reason="interrupted by SIGINT", requests={"errors": 5, "sent": 1000})
    summary["slo"] = [{"passed": True}, {"passed": False}]
    assert headline(summary) == ("PARTIAL RUN (interrupted by SIGINT) — p99 latency 41.2 ms at 99.8 req/s — 1 of 2 SLOs met — "
                                 "5 errors (0.5% of sent) — measurement valid")


def test_script_json_cannot_close_the_script_element():
    text = script_json({"name": "</script><script>alert(1)</script>", "x": "a & b"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>", "x": "a & b"}


def test_markdown_escapes_markup_and_table_pipes():
    assert md("<b>x</b> | y_z * 1.5-2") == "&lt;b>x&lt;/b> \\| y\\_z \\* 1.5-2"
    assert md("two\nlines") == "two lines"
    summary = json.loads(json.dumps({"scenario": "<img src=x onerror=alert(1)>", "metrics": {}, "errors": {"http_5xx": 2},
                                     "error_examples": {"http_5xx": ["HTTP 500: <script>alert(2)</script> | bad"]},
                                     "validity": "valid", "slo": []}))
    text = summary_markdown(summary)
    assert "<img" not in text and "<script" not in text and "&lt;script>" in text and "\\| bad" in text


def test_cdn_page_is_small_and_loads_plotly_from_its_cdn(run_dir, tmp_path):
    html_path, md_path = write_report(run_dir, tmp_path / "small.html", cdn=True)
    html = html_path.read_text()
    assert len(html) < 300_000 and 'src="https://cdn.plot.ly/plotly-' in html
    assert md_path == tmp_path / "small.md" and md_path.exists()
    assert (run_dir / "report.html").stat().st_size > 3_000_000  # the embedded one carries plotly.js


def test_gpu_lanes_label_nvml_memory_busy_when_bandwidth_is_absent(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    t = np.arange(0, 2, 0.25)
    metrics = ("gpu_util_pct", "mem_util_pct", "power_w", "mem_used_bytes")
    results.write_table(copy / results.TELEMETRY, {
        "t_s": np.tile(t, len(metrics)), "source": ["nvml"] * len(t) * len(metrics), "device": ["0"] * len(t) * len(metrics),
        "metric": [m for m in metrics for _ in t], "value": np.linspace(1, 90, len(t) * len(metrics))})
    html_path, _ = write_report(copy)
    html = html_path.read_text()
    assert 'id="plot-gpu"' in html and "No GPU telemetry" not in html
    assert "memory-controller busy counter, which is not bandwidth" in html
    assert "Memory-controller busy (NVML memory utilization, not bandwidth) (%)" in html
    assert "GPU memory used (GiB)" in html


def test_a_failing_panel_becomes_a_note_not_a_lost_report(run_dir, tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ValueError("bad <histogram>")

    monkeypatch.setattr(report_html.percentiles, "spectrum", broken)
    with caplog.at_level("WARNING", logger="latscope.report"):
        html = report_html.report_html(load_run(run_dir))
    assert [r.getMessage() for r in caplog.records if r.name == "latscope.report"] == [
        "report panel 'spectrum' could not be drawn: ValueError: bad <histogram>"]
    assert "This panel could not be drawn: ValueError: bad &lt;histogram&gt;" in html
    assert 'id="plot-load-time"' in html


def test_cli_report_and_compare(run_dir, tmp_path):
    r = _latscope("report", str(run_dir), "-o", str(tmp_path / "r.html"), "--cdn")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.html").exists() and (tmp_path / "r.md").exists()
    r = _latscope("compare", str(run_dir), str(run_dir), "-o", str(tmp_path / "c.html"), "--cdn")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "c.html").read_text()
    assert "Percentile deltas" in html and "+0.0%" in html
    assert "| latency | all |" in (tmp_path / "c.md").read_text()


def test_cli_rejects_a_directory_that_holds_no_results(tmp_path):
    r = _latscope("report", str(tmp_path))
    assert r.returncode == 2 and "is not a results directory" in r.stderr
    r = _latscope("compare", str(tmp_path / "nope"), str(tmp_path))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_a_run_cut_short_still_gets_its_report(tmp_path):
    with serve(make_app(delay_ms=1)) as url:
        scenario = scenario_from_dict({
            "name": "cut", "target": {"url": url, "method": "POST", "path": "/infer", "timeout": 5},
            "phases": [{"name": "long", "duration": 30, "arrival": {"type": "constant", "rate": 20}}],
            "output": {"dir": str(tmp_path)}})
        timer = threading.Timer(2.5, os.kill, (os.getpid(), signal.SIGINT))  # run_scenario turns it into a stop request
        timer.start()
        try:
            run_dir = run_scenario(scenario, workers=1).run_dir
        finally:
            timer.cancel()
    html = (run_dir / "report.html").read_text()
    assert "PARTIAL RUN (interrupted by SIGINT)" in html
    assert "Partial run: interrupted by SIGINT" in (run_dir / "summary.md").read_text()


def test_a_run_where_nothing_completed_says_so_instead_of_empty_plots(tmp_path, caplog):
    scenario = scenario_from_dict({
        "name": "refused", "target": {"url": f"http://127.0.0.1:{free_port()}", "timeout": 2},  # nothing listens
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 20}}],
        "output": {"dir": str(tmp_path)}})
    with caplog.at_level("WARNING", logger="latscope.report"):
        run_dir = run_scenario(scenario, workers=1).run_dir
    failed = [r.getMessage() for r in caplog.records if r.name == "latscope.report"]
    assert not failed, failed  # no panel may fail on a run without latency
    html = (run_dir / "report.html").read_text()
    assert "no request completed" in html and "connect" in html
    assert 'id="plot-spectrum"' not in html and "there is no spectrum" in html
    assert 'id="plot-latency-time"' not in html and 'id="plot-load-time"' in html  # the errors are still plotted
