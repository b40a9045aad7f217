"""The report's HTML and Markdown without a browser: from a real short run, what the page says and
what it escapes; the CLI's report/compare commands and their exit codes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from conftest import REPO, free_port, serve
from report_page import figure_array, page_figures
from latscope import results
from latscope.analysis import percentiles
from latscope.analysis.run_data import load_run
from latscope.analysis.compare import percentile_deltas
from latscope.report import write_compare, write_report
from latscope.report import html as report_html
from latscope.report.compare import compare_html
from latscope.report.html import headline, script_json
from latscope.report.markdown import md, summary_markdown
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict
from latscope.targets.echo import make_app


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
            "goodput": {"latency_ms": 1000},
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
    # No telemetry in this run: no GPU card, the header's "not measured" line names it instead.
    assert "No GPU telemetry in this run." in html and 'id="plot-gpu"' not in html and '<section id="gpu">' not in html
    markdown = (run_dir / "summary.md").read_text()
    assert "1 of 1 SLOs met" in markdown and "| latency | all |" in markdown and "Full report: `report.html`" in markdown


DATA_RUNS = REPO / "tests" / "data"


def _not_measured(page: str) -> str:
    """The header's one "Not measured in …: …." line (its summary), "" when the page has none."""
    start = page.find('<details class="not-measured" id="not-measured"><summary>')
    return "" if start < 0 else page[page.index("<summary>", start) + len("<summary>"):page.index("</summary>", start)]


def _cards(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def test_panels_the_run_did_not_measure_collapse_into_one_line(run_dir):
    """A plain HTTP run (no streamed tokens, no sessions, no GPU telemetry, no Server-Timing parts): no card for
    those panels, one line in the header naming them in page order, each opening to how it is measured."""
    page = report_html.report_html(load_run(run_dir))
    assert _not_measured(page) == ("Not measured in this run: token streams (TTFT, ITL, TPOT), the server's own TTFT and latency, "
                                   "chat sessions and prefix cache, agent jobs, "
                                   "GPU telemetry, encode/decode and Server-Timing parts.")
    assert page.count('id="not-measured"') == 1 and page.index('id="not-measured"') < page.index("</header>")
    assert {"streaming", "sessions", "gpu", "serialization"}.isdisjoint(_cards(page)), _cards(page)
    assert {"why", "spectrum", "latency-time", "load-time", "coldstart", "generator"} <= set(_cards(page))  # what it has: cards
    assert not {"#streaming", "#sessions", "#gpu", "#serialization"} & set(re.findall(r'href="(#[^"]+)"', page))
    assert "e.g. protocol: openai with stream: true" in page  # why each is missing, inside the line


def test_a_run_with_streams_has_their_card_and_the_line_leaves_them_out():
    page = report_html.report_html(load_run(DATA_RUNS / "run_f16f211"))  # an OpenAI-style streamed run, no sessions
    assert "streaming" in _cards(page) and 'id="plot-streaming"' in page and 'href="#streaming"' in page
    line = _not_measured(page)
    assert line == ("Not measured in this run: per-request records (why the tail), the server's own TTFT and latency, "
                    "chat sessions and prefix cache, agent jobs, GPU telemetry.")  # a run from before requests.parquet
    assert "sessions" not in _cards(page) and "gpu" not in _cards(page)
    page = report_html.report_html(load_run(DATA_RUNS / "run_sessions"))
    assert {"streaming", "sessions"} <= set(_cards(page)) and _not_measured(page) == (
        "Not measured in this run: per-request records (why the tail), the server's own TTFT and latency, agent jobs, "
        "GPU telemetry.")


def test_compare_leaves_a_panel_out_only_when_neither_run_has_it(run_dir):
    plain, streamed = load_run(run_dir), load_run(DATA_RUNS / "run_f16f211")
    page, _ = compare_html(plain, streamed)
    # the streamed run has streams and encode/decode parts: those cards stay, drawn with its data
    assert {"streaming", "serialization"} <= set(_cards(page)) and 'id="plot-streaming"' in page
    assert _not_measured(page) == ("Not measured in either run: the server's own TTFT and latency, chat sessions and prefix cache, "
                                   "agent jobs, GPU telemetry.")
    assert "Neither run has GPU telemetry." in page and "gpu" not in _cards(page)
    page, _ = compare_html(load_run(DATA_RUNS / "run_sessions"), plain)
    assert "sessions" in _cards(page) and _not_measured(page) == ("Not measured in either run: the server's own TTFT and latency, "
                                                                  "agent jobs, GPU telemetry.")
    page, _ = compare_html(plain, plain)
    assert {"streaming", "sessions", "gpu", "serialization"}.isdisjoint(_cards(page))
    assert _not_measured(page).startswith("Not measured in either run: token streams (TTFT, ITL, TPOT), the server's own TTFT and latency, ")


def test_report_and_summary_md_show_goodput(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    g = summary["goodput"]["all"]
    assert g["good"] == g["total"] == summary["requests"]["sent"] == 60  # 2 ms answers, 1 s objective
    html = (run_dir / "report.html").read_text()
    section = html[html.index('<section id="goodput">'):]
    section = section[:section.index("</section>")]
    assert "<td>a</td><td>latency ≤ 1,000 ms</td>" in section and "<td class=n>60 / 60</td><td class=n>100.0%</td>" in section
    assert f"<td class=n>{g['rps']:,.1f}</td>" in section
    assert html.index('id="slos"') < html.index('id="goodput"') < html.index('id="percentiles"')
    markdown = (run_dir / "summary.md").read_text()
    assert f"Goodput: 100.0% of requests met every objective (60 of 60), {g['rps']:,.1f} req/s." in markdown
    assert "| all | each class its own | 60 / 60 | 100.0% |" in markdown


def test_goodput_and_slo_tables_escape_and_word_their_units():
    evil = "<script>alert(1)</script>"
    summary = {"goodput": {evil: {"objectives": {"ttft_ms": 500.0, evil: 3}, "good": 987, "total": 1000, "fraction": 0.987,
                                  "rps": 98.7, "output_tokens_per_s": 1234.5},
                           "all": {"good": 987, "total": 1000, "fraction": 0.987, "rps": 98.7, "output_tokens_per_s": 1234.5}},
               "slo": [{"metric": "goodput", "class": evil, "stat": "fraction", "limit": 0.99, "value": 0.987, "passed": False,
                        "direction": "min"},
                       {"metric": "latency", "class": "all", "stat": "p99_ms", "limit": 100, "value": 41.23, "passed": True}]}
    table = report_html.goodput_table(summary)
    assert "<script" not in table and "&lt;script&gt;alert(1)&lt;/script&gt;" in table
    assert "TTFT ≤ 500 ms, &lt;script&gt;" in table and "<td class=n>987 / 1,000</td><td class=n>98.7%</td>" in table
    assert "<td class=n>98.7</td><td class=n>1,234.5</td>" in table
    assert "98.7% of requests met every objective (987 of 1,000), 98.7 req/s, 1,234 output tokens/s" in table
    slos = report_html.slo_table(summary)
    assert "<script" not in slos and "<td class=n>98.7%</td><td class=n>≥ 99.0%</td>" in slos
    assert "<td class=n>41.2 ms</td><td class=n>≤ 100 ms</td>" in slos
    text = summary_markdown({**summary, "scenario": "s", "metrics": {}, "errors": {}, "validity": "valid"})
    assert "<script" not in text and "| ❌ missed | goodput | &lt;script>alert(1)&lt;/script> | fraction | 98.7% | ≥ 99.0% |" in text
    assert report_html.goodput_table({"goodput": {}}) == report_html.goodput_table({}) == ""


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


def test_markdown_lists_each_capacity_change_with_how_long_and_how_badly():
    steady = {"first_count": 20, "first_max_ms": 400.0, "steady_p50_ms": 25.0, "steady_max_ms": 60.0}
    cold = {"target_launch": None, "restarts": [], "scale_from_zero": [],
            "scale_up": [{"action": "add", "issued_at_s": 10.0, "replica": "<b>r1</b>", "class": "_b_r1_b_",
                          "first_seen_s": 12.0, "first_sent_s": 11.6, "first_latency_ms": 400.0, **steady, "cold": True,
                          "suffered_s": 2.5, "affected_requests": 31}]}
    text = summary_markdown({"scenario": "s", "metrics": {}, "errors": {}, "validity": "valid", "slo": [], "cold_start": cold})
    assert ("- 🥶 cold: **scale-up &lt;b>r1&lt;/b> @ 11.6 s**: users waited up to 400 ms, 16× the steady p50 of 25.0 ms, "
            "for 2.5 s (31 requests)") in text


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

    monkeypatch.setattr(percentiles, "spectrum", broken)  # the module the panels read (report/panels.py)
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


# -- compare: every panel of the report with both runs ---------------------------------------------

HOSTILE_REASON = "send lag p99 above 5 ms <script>alert(3)</script>"


def _write_telemetry(run: Path, level: float) -> None:
    """GPU and host CPU samples (a stand-in for NVML: this machine has no GPU), `level` apart per run."""
    t = np.arange(0, 2, 0.25)
    series = [("nvml", "0", "gpu_util_pct"), ("nvml", "0", "power_w"), ("host", "system", "cpu_pct"), ("host", "worker-0", "cpu_pct")]
    results.write_table(run / results.TELEMETRY, {
        "t_s": np.tile(t, len(series)), "source": [s for s, _, _ in series for _ in t], "device": [d for _, d, _ in series for _ in t],
        "metric": [m for _, _, m in series for _ in t], "value": np.tile(np.linspace(10, 60, len(t)), len(series)) + level})


@pytest.fixture(scope="module")
def compare_runs(run_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(base: the module's run with telemetry, new: a run against a target that sends Server-Timing and a replica
    id, with telemetry, marked degraded afterwards with a reason carrying markup)."""
    tmp = tmp_path_factory.mktemp("compare")
    base = tmp / "base"
    shutil.copytree(run_dir, base)
    _write_telemetry(base, 0)
    _set_validity(base, "valid", [])  # as measured, it depends on how busy this machine was

    async def timed(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True}, headers={"Server-Timing": "queue;dur=0.4, compute;dur=1.5", "X-Replica-Id": "r1"})

    app = web.Application()
    app.router.add_post("/infer", timed)
    with serve(app) as url:
        scenario = scenario_from_dict({
            "name": "html", "seed": 3, "target": {"url": url, "method": "POST", "path": "/infer", "timeout": 5},
            "workload": {"body": {"inputs": [1]}, "classes": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}]},
            "phases": [{"name": "w", "duration": 0.5, "warmup": True, "arrival": {"type": "constant", "rate": 20}},
                       {"name": "pause", "duration": 0.3, "arrival": {"type": "idle"}},  # a capacity change: after idle
                       {"name": "main", "duration": 1.5, "arrival": {"type": "constant", "rate": 40}}],
            "output": {"dir": str(tmp)}})
        new = run_scenario(scenario, workers=1).run_dir
    _write_telemetry(new, 20)
    _set_validity(new, "degraded", [HOSTILE_REASON])
    return base, new


def _set_validity(run: Path, stamp: str, reasons: list[str]) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary.update(validity=stamp, validity_reasons=reasons)
    (run / "summary.json").write_text(json.dumps(summary))


def _names(figure: dict) -> set[str]:
    return {t.get("name") for t in figure["data"]}


def test_compare_draws_every_report_panel_with_both_runs(compare_runs, tmp_path):
    base, new = compare_runs
    html_path, _ = write_compare(base, new, tmp_path / "c.html", cdn=True)
    page = html_path.read_text()
    figures = page_figures(page)
    report_panels = set(page_figures((base / "report.html").read_text())) | {"plot-gpu"}  # base's own report predates its telemetry
    assert report_panels - {"plot-streaming"} <= set(figures), set(figures)  # no stream in these runs
    assert {"all (base)", "a (base)", "all (new)", "b (new)"} <= _names(figures["plot-spectrum"])
    assert {"p50 (base)", "p99.9 (base)", "p50 (new)", "p99.9 (new)"} <= _names(figures["plot-latency-time"])
    assert {"offered (scheduled) (base)", "achieved (completed) (new)", "in flight (at interval end) (base)"} <= _names(figures["plot-load-time"])
    assert {"nvml 0 (base)", "nvml 0 (new)"} <= _names(figures["plot-gpu"])
    # The GPU lanes of both runs: the new run's samples are 20 above the base's at the same time.
    power = {t["name"]: t for t in figures["plot-gpu"]["data"] if t["yaxis"] == "y2"}
    assert power.keys() == {"nvml 0 (base)", "nvml 0 (new)"} and power["nvml 0 (base)"]["line"]["dash"] == "dash"
    assert np.allclose(figure_array(power["nvml 0 (new)"]["y"]) - figure_array(power["nvml 0 (base)"]["y"]), 20)
    assert {"send lag p99 (base)", "send lag p99 (new)", "CPU worker-0 (base)", "CPU worker-0 (new)",
            "CPU whole machine (base)", "CPU whole machine (new)"} <= _names(figures["plot-generator"])
    # Cold starts: the new run's one capacity change (the first request after its idle phase) drawn and
    # listed for the new run only (the base run had none); every start of both runs in the detail table.
    assert _names(figures["plot-coldstart"]) == {"new max per interval", "new p50 per interval"}
    assert figures["plot-coldstart"]["layout"]["annotations"][0]["text"] == "scale from zero after idle, phase main @ 0.8 s"
    assert page.count("<td><b>new</b></td><td>scale from zero after idle, phase main @ 0.8 s</td>") == 1
    assert "<td><b>base</b></td><td>scale from zero" not in page
    assert page.count("<td><b>base</b></td><td>run start @ 0.0 s") == 1 and page.count("<td><b>new</b></td><td>run start @ 0.0 s") == 1
    assert "new replica r1" in page  # the new run's replica start, in its half of the detail table


def test_compare_delta_table_lists_every_metric_and_class_grouped(compare_runs, tmp_path):
    base, new = compare_runs
    html_path, md_path = write_compare(base, new, tmp_path / "c.html", cdn=True)
    table = html_path.read_text().split('<table class="deltas">')[1].split("</table>")[0]
    deltas = percentile_deltas(load_run(base), load_run(new))
    pairs = set(zip(deltas["metric"], deltas["class"]))
    assert {("server.queue", "all"), ("server.compute", "a"), ("network", "b"), ("send_lag", "all"), ("service_time", "a")} <= pairs
    rows = [r for r in table.split("</tr>") if "<td>" in r]
    assert len(rows) == len(pairs)  # one row per metric × class, none left out
    order = [r.split("<td>")[1].split("</td>")[0] for r in rows]  # each row's metric label, top to bottom
    # Latency first, then where the time went (server parts by name), then replicas, then the generator.
    assert [m for i, m in enumerate(order) if i == 0 or order[i - 1] != m] == [
        "latency", "service time", "network", "server.compute", "server.queue", "latency per replica", "send lag", "event-loop lag"]
    assert '<tr class="group"><th colspan="8">Where the service time goes' in table and "Load generator health" in table
    # server.queue exists in the new run only: one cell says so, with the new run's values (0.4 ms, as the target sent).
    queue = next(r for r in rows if "<td>server.queue</td><td>all</td>" in r)
    assert '<td class="only" colspan="6"><i>only in the new run:</i> p50 0.400 · p90 0.400' in queue, queue
    latency = next(r for r in rows if "<td>latency</td><td>all</td>" in r)
    assert latency.count("→") == 6 and "only in" not in latency
    markdown = md_path.read_text()
    assert "| server.queue | all | only in the new run: p50 0.400" in markdown and "| send lag | all | " in markdown


def test_compare_header_stamps_each_run_and_says_when_the_comparison_is_weaker(compare_runs, tmp_path):
    base, new = compare_runs
    page = write_compare(base, new, tmp_path / "c.html", cdn=True)[0].read_text()
    header = page.split("</header>")[0]
    assert header.index('<span class="stamp valid">measurement valid</span>') < header.index(
        '<span class="stamp degraded">measurement degraded</span>')  # base's stamp, then new's, each next to its name
    assert header.index(f"<b>base</b> {base.name}") < header.index("stamp valid") < header.index(f"<b>new</b> {new.name}")
    assert "This comparison is weaker:</b> the new run&#x27;s measurement is degraded (send lag p99 above 5 ms &lt;script&gt;" in header
    assert "<script>alert(3)" not in page
    assert "This comparison is weaker" in (tmp_path / "c.md").read_text()
    same = write_compare(base, base, tmp_path / "same.html", cdn=True)[0].read_text()
    assert "This comparison is weaker" not in same and same.split("</header>")[0].count('<span class="stamp valid">') == 2


def test_output_report_false_writes_no_report(tmp_path):
    scenario = scenario_from_dict({
        "name": "quiet", "target": {"url": f"http://127.0.0.1:{free_port()}", "timeout": 2},
        "phases": [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 4}}],
        "output": {"dir": str(tmp_path), "report": False}})
    run_dir = run_scenario(scenario, workers=1).run_dir
    assert (run_dir / "summary.json").exists()
    assert not (run_dir / "report.html").exists() and not (run_dir / "summary.md").exists()

