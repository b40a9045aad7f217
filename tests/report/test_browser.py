"""The HTML report in a real headless Chromium (Debian's chromium package; .ci/run installs it).

Two short real runs against real local targets — an OpenAI-style token streamer (TTFT/ITL/TPOT),
an aiohttp endpoint that answers with Server-Timing and a replica id, and one that fails with an
HTML error page carrying a script — then the report `latscope run` wrote itself, the report of a run
whose results carry hostile strings, and the comparison of the two, opened over the DevTools protocol: no JavaScript error, every plot div rendered, every
string from the scenario or the target shown as text (escaped in the source, no injected element
or script run in the DOM); and the "Why the tail" card drawn from the hostile run's own requests.parquet with a
replica id and a Server-Timing name that are markup (an alert(1) that would fail the test as a dialog). Screenshots
go to the test's temp dir; with LATSCOPE_UPDATE_DOCS=1 the
report's goes to docs/report.png (the README's picture).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest
from aiohttp import web

from browser_cdp import Browser, PLOTS_DONE, chromium_path
from conftest import REPO, serve, stream_target_process
from latscope.analysis import explain
from latscope.report import write_compare, write_report
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

pytestmark = pytest.mark.timeout(240)

# Each payload would set window.__xss if it ever ran as markup or script in the page.
ERROR_PAGE = ('<html><head><title>500 Internal Server Error</title></head><body><h1>Internal Server Error</h1>'
              '<script>window.__xss="target"</script></body></html>')
SCENARIO_NAME = '<script>window.__xss="scenario"</script>'
PHASE_NAME = '<img src=x onerror="window.__xss=\'phase\'">'
REPLICA_ID = '<svg onload="window.__xss=\'replica\'">'
PAYLOADS = (ERROR_PAGE[ERROR_PAGE.index("<script>"):ERROR_PAGE.index("</body>")], SCENARIO_NAME, PHASE_NAME, REPLICA_ID)


def _need_chromium() -> None:
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium not installed in CI (.ci/run installs it with apt-get)")
        pytest.skip("chromium not installed: apt-get install chromium")


def _target_app(replica: str) -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"outputs": [1, 2, 3]}, headers={
            "Server-Timing": "queue;dur=0.4, compute;dur=1.5", "X-Replica-Id": replica})

    async def fail(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=500, text=ERROR_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/fail", fail)
    return app


@pytest.fixture(scope="module")
def streamer() -> Iterator[str]:
    with stream_target_process(ttft_ms=15, itl_ms=4, tokens=8) as url:
        yield url


def _run(tmp: Path, streamer: str, replica: str, phase: str, rate: float) -> Path:
    with serve(_target_app(replica)) as url:
        scenario = scenario_from_dict({
            "name": "report-demo",
            "seed": 4,
            "target": {"url": url, "method": "POST", "path": "/ok", "timeout": 5},
            "workload": {"body": {"inputs": [1, 2, 3]}, "classes": [
                {"name": "chat", "weight": 3, "protocol": "openai", "url": streamer, "path": "/v1/chat/completions", "model": "m",
                 "openai": {"api": "chat", "stream": True}, "prompt_tokens": 16, "output_tokens": 8},
                {"name": "embed", "weight": 3},
                # An OpenAI-style endpoint behind a proxy that answers with its HTML error page.
                {"name": "broken", "weight": 1, "protocol": "openai", "path": "/fail", "model": "m",
                 "openai": {"api": "chat", "stream": False}, "prompt_tokens": 16, "output_tokens": 8},
            ]},
            "phases": [
                {"name": "warmup", "duration": 0.5, "warmup": True, "arrival": {"type": "constant", "rate": 10}},
                # the first request after it is measured on its own: a capacity change for the cold-start panel
                {"name": "quiet", "duration": 0.3, "arrival": {"type": "idle"}},
                {"name": phase, "duration": 3, "arrival": {"type": "burst", "base_rate": rate, "burst_rate": rate * 3,
                                                           "burst_length": 0.5, "period": 1.5}},
            ],
            # Two met with a wide margin (the machine is shared), one missed by construction: a stream of
            # 8 tokens 4 ms apart after a 15 ms first token takes at least 43 ms.
            "slos": [{"metric": "latency", "class": "embed", "stat": "p99", "limit_ms": 1000},
                     {"metric": "ttft", "class": "chat", "stat": "p99", "limit_ms": 500},
                     {"metric": "latency", "class": "chat", "stat": "p99", "limit_ms": 30}],
            "output": {"dir": str(tmp)},
        })
        return run_scenario(scenario, workers=1).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, streamer) -> tuple[Path, Path]:
    """(a clean run, a run whose phase, replica id and — edited afterwards — scenario name are XSS payloads)."""
    tmp = tmp_path_factory.mktemp("runs")
    clean = _run(tmp, streamer, "replica-a", "bursts", 15)
    hostile = _run(tmp, streamer, REPLICA_ID, PHASE_NAME, 20)
    # The scenario schema only allows [A-Za-z0-9_.-] names, but a results directory is a file anyone can
    # edit or produce: the report must not trust it.
    summary_path = hostile / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["scenario"] = SCENARIO_NAME
    summary_path.write_text(json.dumps(summary))
    return clean, hostile


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    _need_chromium()
    with Browser(tmp_path_factory.mktemp("chromium")) as b:
        yield b


def _check_page(browser: Browser, html: Path, shot: Path) -> dict:
    page = browser.open(html.resolve().as_uri(), wait_for=PLOTS_DONE)
    plots = page.evaluate("""Array.from(document.querySelectorAll('div.plot')).map(d => ({
        id: d.id, svg: d.querySelectorAll('.main-svg').length, traces: d.querySelectorAll('g.trace, g.points').length}))""")
    state = {
        "errors": page.errors,
        "plots": plots,
        "xss": page.evaluate("window.__xss === undefined ? null : String(window.__xss)"),
        "scripts": page.evaluate("document.scripts.length"),
        "injected": page.evaluate("document.querySelectorAll('img, iframe, [onerror], [onload]').length"),
        "text": page.evaluate("document.body.innerText"),
        "omitted": page.evaluate("Array.from(document.querySelectorAll('p.omitted')).map(p => p.closest('section').id)"),
    }
    page.screenshot(shot)
    state["page"] = page
    return state


def test_report_in_chromium(runs, browser, tmp_path):
    clean, _ = runs
    # The page `latscope run` wrote at the end of the run (tests/report/test_html.py covers `latscope report`).
    assert (clean / "summary.md").exists()
    state = _check_page(browser, clean / "report.html", tmp_path / "report.png")
    assert state["errors"] == []
    ids = {p["id"] for p in state["plots"]}
    # Every panel this run has data for is drawn; what it did not measure (GPU telemetry, sessions) has no card,
    # and the header names it in one line.
    assert {"plot-spectrum", "plot-latency-time", "plot-load-time", "plot-streaming", "plot-serialization",
            "plot-generator"} <= ids, ids
    # The run explained its own tail (explain.json beside summary.json); 3 s of traffic leave too few requests
    # above p99 for any cause, and the card says so in words, without a plot (test_why_the_tail_in_chromium draws one).
    assert json.loads((clean / "explain.json").read_text())["verdict"] == "not_enough_data"
    why = state["page"].evaluate("document.getElementById('why').innerText")
    assert "Not enough data to explain the tail" in why and "No cause to draw: too few requests in the tail." in why
    assert all(p["svg"] > 0 and p["traces"] > 0 for p in state["plots"]), state["plots"]
    assert "gpu" not in state["omitted"] and ("Not measured in this run: the server's own TTFT and latency, chat sessions and "
                                              "prefix cache, agent jobs, GPU telemetry.") in state["text"]
    assert state["page"].evaluate("document.querySelector('#gpu, #sessions')") is None
    assert "2 of 3 SLOs met" in state["text"]
    # The target's HTML error page is shown as text.
    assert "<h1>Internal Server Error</h1>" in state["text"] and state["xss"] is None
    if os.environ.get("LATSCOPE_UPDATE_DOCS") == "1":
        docs = REPO / "docs" / "report.png"
        docs.parent.mkdir(exist_ok=True)
        state["page"].screenshot(docs, width=1200, max_height=2300, scale=0.8)
        assert docs.stat().st_size < 1_000_000
    assert (tmp_path / "report.png").stat().st_size > 50_000


def test_hostile_strings_are_escaped_in_source_and_dom(runs, browser, tmp_path):
    _, hostile = runs
    write_report(hostile, tmp_path / "hostile.html")
    source = (tmp_path / "hostile.html").read_text()
    for payload in PAYLOADS:
        assert payload not in source, payload
    assert "&lt;script&gt;window.__xss=&quot;scenario&quot;&lt;/script&gt;" in source  # the scenario name, escaped
    assert "&lt;script&gt;window.__xss=&quot;target&quot;&lt;/script&gt;" in source  # the target's error message
    markdown = (tmp_path / "hostile.md").read_text()
    assert "<script" not in markdown and "<img" not in markdown and "<svg" not in markdown and "&lt;script>" in markdown
    state = _check_page(browser, tmp_path / "hostile.html", tmp_path / "hostile.png")
    assert state["errors"] == [] and state["xss"] is None
    assert state["scripts"] == 3  # plotly.js, the figures' JSON, the page's own script
    assert state["injected"] == 0
    # Shown as the text they are: the scenario name in the header, the phase name on the time axes.
    assert SCENARIO_NAME in state["text"]
    labels = state["page"].evaluate("Array.from(document.querySelectorAll('.annotation-text')).map(t => t.textContent)")
    assert any(PHASE_NAME in t for t in labels), labels
    assert any(REPLICA_ID in t for t in labels), labels


def test_compare_in_chromium(runs, browser, tmp_path):
    clean, hostile = runs
    write_compare(clean, hostile, tmp_path / "compare.html")
    source = (tmp_path / "compare.html").read_text()
    assert all(payload not in source for payload in PAYLOADS)
    assert "Percentile deltas" in source and (tmp_path / "compare.md").exists()
    state = _check_page(browser, tmp_path / "compare.html", tmp_path / "compare.png")
    assert state["errors"] == [] and state["xss"] is None and state["injected"] == 0
    ids = {p["id"] for p in state["plots"]}
    # Every panel of the report, with both runs (GPU: neither run has telemetry, so the header's line names it).
    assert {"plot-spectrum", "plot-latency-time", "plot-load-time", "plot-streaming", "plot-coldstart",
            "plot-serialization", "plot-generator"} <= ids, ids
    why = state["page"].evaluate("document.getElementById('why').innerText")
    assert "base run: Not enough data to explain the tail: " in why and "new run: Not enough data to explain the tail: " in why
    assert all(p["svg"] > 0 and p["traces"] > 0 for p in state["plots"]), state["plots"]
    assert "gpu" not in state["omitted"] and ("Not measured in either run: the server's own TTFT and latency, chat sessions and "
                                              "prefix cache, agent jobs, GPU telemetry.") in state["text"]
    assert "→" in state["text"]  # base → new cells of the delta table
    assert "server.queue" in state["text"] and "send lag" in state["text"]  # the delta table covers every metric


# A replica id as a target could send it, and a Server-Timing part name: if either ran, it would raise an
# alert (a dialog: Page.errors) or set window.__xss.
ALERT_REPLICA = "<img src=x onerror=alert(1)>"
SERVER_PART = "<b onmouseover=\"window.__xss='part'\">compute</b>"


def _hostile_explanation(run_dir: Path) -> dict:
    """The run's real explanation (analysis.explain over its requests.parquet) with a slow replica whose id
    is markup put on top, as `latscope explain` would write it had the target sent that id."""
    # 3 s of traffic: the tail above p70 holds enough requests to be explained (above p99, too few)
    doc = explain.explain_run(run_dir, metric="latency", quantile=0.7)
    assert doc["verdict"] != "not_enough_data" and doc["components"], doc
    top = {"rank": 1, "kind": "where", "name": f"replica={ALERT_REPLICA}", "label": f"replica {ALERT_REPLICA}",
           "effect": 0.9, "p_value": 1e-9, "stands_out": True,
           "evidence": f"90% of the tail was served by {ALERT_REPLICA} ({REPLICA_ID}), against 50% of all requests",
           "detail": {"column": "replica", "groups": [{"label": ALERT_REPLICA, "tail_share": 0.9, "all_share": 0.5},
                                                     {"label": REPLICA_ID, "tail_share": 0.1, "all_share": 0.5}]}}
    doc["causes"] = [top] + [{**c, "rank": c.get("rank", 0) + 1, "stands_out": False} for c in doc["causes"]]
    doc["verdict"] = "cause"
    doc["summary"] = f"{doc['summary']} Top cause: replica {ALERT_REPLICA}, then {SERVER_PART}."
    doc["components"] = doc["components"] + [{"name": f"server.{SERVER_PART}", "label": f"server.{SERVER_PART}",
                                              "side": "server", "tail_ms": 9.0, "body_ms": 1.0, "share": 0.1}]
    return doc


def test_why_the_tail_in_chromium(runs, browser, tmp_path):
    """The "Why the tail" card from the hostile run's own records: drawn with no error, its paragraph, bars
    and the top cause's picture there, and the target's strings in it shown as text, never run."""
    _, hostile = runs
    assert (hostile / "requests.parquet").exists()
    run = tmp_path / "run"
    shutil.copytree(hostile, run)
    (run / "explain.json").write_text(json.dumps(_hostile_explanation(run)))
    write_report(run, tmp_path / "why.html")
    source = (tmp_path / "why.html").read_text()
    assert ALERT_REPLICA not in source and SERVER_PART not in source and "<img" not in source
    state = _check_page(browser, tmp_path / "why.html", tmp_path / "why-page.png")
    page = state["page"]
    assert state["errors"] == [] and page.dialogs == [] and state["xss"] is None and state["injected"] == 0
    why = next(p for p in state["plots"] if p["id"] == "plot-why")
    assert why["svg"] > 0 and why["traces"] >= 3, why  # the effect bars, and the top cause's two bar series
    card = page.evaluate("document.getElementById('why').textContent")  # the causes' table too, folded in <details>
    assert f"Top cause: replica {ALERT_REPLICA}." in card and f"then {SERVER_PART}." in card
    assert f"90% of the tail was served by {ALERT_REPLICA} ({REPLICA_ID})" in card  # the table, as text
    ticks = page.evaluate("Array.from(document.querySelectorAll('#plot-why .ytick text, #plot-why .x2tick text'))"
                          ".map(t => t.textContent)")
    assert f"replica {ALERT_REPLICA}" in ticks and ALERT_REPLICA in ticks and REPLICA_ID in ticks, ticks
    # the bars' colours as drawn: the top cause red, the real causes below it grey (the run had no injected cause)
    fills = page.evaluate("Array.from(document.querySelectorAll('#plot-why .trace.bars')[0].querySelectorAll('path'))"
                          ".map(p => p.style.fill)")
    assert fills[-1] == "rgb(214, 39, 40)" and set(fills[:-1]) <= {"rgb(154, 165, 177)"}, fills
    # hover the top cause's bar: its evidence (the target's strings in it) shows as text in the hover label
    bars = len(fills)
    page.evaluate(f"Plotly.Fx.hover('plot-why', [{{curveNumber: 0, pointNumber: {bars - 1}}}], ['xy'])")
    page.run(page._drain(0.3))
    hover = page.evaluate("Array.from(document.querySelectorAll('#plot-why .hovertext')).map(h => h.textContent).join(' ')")
    assert f"90% of the tail was served by {ALERT_REPLICA} ({REPLICA_ID})" in hover, hover
    assert page.evaluate("document.querySelectorAll('#plot-why b[onmouseover], #plot-why img, #plot-why svg[onload]').length") == 0
    assert page.dialogs == [] and page.errors == [] and page.evaluate("window.__xss === undefined")
    shot = page.screenshot_of("#why", tmp_path / "why.png", width=1200, scale=0.8)
    assert shot.stat().st_size > 20_000

