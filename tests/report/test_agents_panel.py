"""The "Agents" panel of the report and the compare page, from two real 2 s runs against the scripted
agent endpoint (tests/agent_server.py): four three-round jobs each fanning out after round 1 into three
two-round sub-agents (100 ms tool waits), and, as a base run, two two-round jobs without a fan-out
(50 ms tool waits); from a copy of the first with a class named like markup; and from a run written
before agents existed (tests/data/run_f16f211: the panel is named in the "Not measured" line). The page
is parsed, its figure's data read back, and once drawn in a headless Chromium when one is installed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent_server import agent_run, make_agent_app
from conftest import REPO, serve
from report_page import figure_array, page_figures, panel_section, start_tags
from latscope.analysis import agents
from latscope.analysis.run_data import load_run
from latscope.report.compare import compare_html
from latscope.report.html import report_html
from latscope.report.words import fmt_ms

OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
HOSTILE = "<img src=x onerror=\"window.__xss=1\">&amp;"
ESCAPED = "&lt;img src=x onerror=\"window.__xss=1\"&gt;&amp;amp;"
FAN = {"rounds": 3, "tool_latency": "0.1s", "tool_result_tokens": 9, "tools": {"count": 2, "schema_tokens": 20},
       "fan_out": {"at_round": 1, "agents": 3, "rounds": 2, "prompt_tokens": 5}}
PLAIN = {"rounds": 2, "tool_latency": "50ms", "tool_result_tokens": 9, "tools": {"count": 2, "schema_tokens": 20}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """(base, new): the jobs without a fan-out, then the ones with (their sub-agents' last rounds answer text)."""
    tmp = tmp_path_factory.mktemp("agents")
    with serve(make_agent_app([], text_after=frozenset({2}))) as url:
        return agent_run(url, tmp / "base", PLAIN, rate=4), agent_run(url, tmp / "new", FAN, rate=8)


def _traces(page: str) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = {}
    for t in page_figures(page)["plot-agents"]["data"]:
        traces.setdefault(t["name"], []).append(t)
    return traces


def _titles(page: str) -> list[str]:
    return [a["text"] for a in page_figures(page)["plot-agents"]["layout"]["annotations"]]


def _cards(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def test_the_report_shows_job_times_rounds_the_table_and_the_critical_paths(runs):
    run = load_run(runs[1])
    coder = run.summary["agents"]["coder"]
    page = report_html(run)
    cards = _cards(page)
    assert cards.index("sessions") + 1 == cards.index("agents") and 'href="#agents"' in page  # after the sessions panel
    section = panel_section(page, "agents")
    assert "<h2>Agents</h2>" in section and ("div", {"class": "plot", "id": "plot-agents"}) in start_tags(section)
    jt = coder["job_time"]
    assert ("<tr><td>coder</td><td class=n>4</td><td class=n>4</td><td class=n>0</td><td class=n>0</td><td class=n>0</td>"
            f"<td class=n>{fmt_ms(jt['p50_ms'])}</td><td class=n>{fmt_ms(jt['p95_ms'])}</td><td class=n>{fmt_ms(jt['p99_ms'])}</td>") in section
    # every job that ended was good (no objectives: completed is enough), 4 of them in the measured window
    good_rate = coder["goodput"]["rps"]
    assert ("<td class=n>3.0</td><td class=n>9.0</td><td class=n>1.0</td><td class=n>–</td><td class=n>20</td><td class=n>0</td>"
            f"<td class=n>100.0%</td><td class=n>{good_rate:,.3f}</td></tr>") in section
    assert "<td>coder</td><td class=n>3</td><td class=n>4</td><td class=n>0</td>" in section  # round 3 of every job

    traces = _traces(page)
    (cdf,) = traces["coder job time"]
    assert figure_array(cdf["y"])[-1] == 100 and figure_array(cdf["x"])[-1] == pytest.approx(jt["max_ms"], rel=1e-6)
    (ttft,) = traces["coder TTFT p50"]
    assert list(figure_array(ttft["x"])) == [1, 2, 3]
    by_round = run.summary["sessions"]["coder"]["by_turn"]
    np.testing.assert_allclose(figure_array(ttft["y"]), [by_round[k]["ttft"]["p50_ms"] for k in ("1", "2", "3")], rtol=1e-6)
    assert "coder hit rate" not in traces  # the endpoint reports no cached tokens
    # two timelines, the median job's (x axes 3 and 4: row 2) and the p99 job's; their critical bars add up to the job time
    timelines = agents.job_timelines(run, "coder")
    titles = _titles(page)
    for t, axis in zip(timelines, ("x3", "x4")):
        label = "median job" if t.which == "p50" else "p99 job"
        assert f"coder {label}: {fmt_ms(t.job_time_ms)} ms (job {t.job} at {t.start_s:,.1f} s, {t.rank} of 4 by job time)" in titles
        critical = [b for name in ("model round", "tool wait") for b in traces[name] if b["xaxis"] == axis]
        assert sum(figure_array(b["x"]).sum() for b in critical) == pytest.approx(t.job_time_ms, abs=0.01)
        lanes = {y for name in traces if name.startswith(("model round", "tool wait")) for b in traces[name]
                 if b["xaxis"] == axis for y in b["y"]}
        assert lanes == {"job", "sub-agent 1", "sub-agent 2", "sub-agent 3"}
        tools = np.concatenate([figure_array(b["x"]) for name in traces if name.startswith("tool wait") for b in traces[name]
                                if b["xaxis"] == axis])
        np.testing.assert_allclose(tools, 100.0, atol=1e-3)  # every tool wait, the scenario's 100 ms
    assert sum(1 for name in traces for t in traces[name] if t.get("showlegend") is not False and name == "model round") == 1
    assert "agent jobs" not in page[:page.index("</header>")]  # measured: not in the header's "Not measured" line


def test_class_names_are_escaped_everywhere_in_the_panel(runs, tmp_path):
    """A class named like markup (a results directory is a file anyone can edit) shows as text in the
    table, the legend and the timelines' titles, never as a tag."""
    run = tmp_path / "hostile"
    shutil.copytree(runs[1], run)
    quoted = json.dumps(HOSTILE)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text.replace('"coder"', quoted).replace('"coder#', quoted[:-1] + "#"))
    for name in ("requests.parquet", "schedule.parquet", "timeseries.parquet"):
        frame = pd.read_parquet(run / name)
        frame["class"] = frame["class"].astype(object).replace({"coder": HOSTILE})
        frame.to_parquet(run / name, index=False)
    (run / "histograms.hlog").write_text((run / "histograms.hlog").read_text().replace("/coder,", f"/{HOSTILE},"))
    (run / "scenario.yaml").write_text((run / "scenario.yaml").read_text().replace("name: coder", f"name: {quoted}"))
    page = report_html(load_run(run))
    section = panel_section(page, "agents")
    assert f"<tr><td>{ESCAPED}</td><td class=n>4</td><td class=n>4</td>" in section
    assert "<img" not in page and not [t for t in start_tags(page) if t[0] == "img" or "onerror" in t[1]]
    names = set(_traces(page))
    assert {f"{ESCAPED} job time", f"{ESCAPED} TTFT p50"} <= names and all("<" not in n for n in names)
    titles = [t for t in _titles(page) if "by job time" in t]
    assert len(titles) == 2 and all(t.startswith(ESCAPED) and "<" not in t for t in titles)


def test_the_compare_page_overlays_the_runs_and_puts_the_timelines_side_by_side(runs):
    base, new = load_run(runs[0]), load_run(runs[1])
    page, _ = compare_html(base, new)
    section = panel_section(page, "agents")
    assert "Agents: base (dashed) vs new (solid)" in section
    assert "<tr><td><b>base</b></td><td>coder</td><td class=n>2</td><td class=n>2</td>" in section
    assert "<tr><td><b>new</b></td><td>coder</td><td class=n>4</td><td class=n>4</td>" in section
    traces = _traces(page)
    assert traces["coder job time (base)"][0]["line"]["dash"] == "dash"
    assert traces["coder job time (new)"][0]["line"].get("dash") is None
    assert list(figure_array(traces["coder TTFT p50 (base)"][0]["x"])) == [1, 2]
    titles = _titles(page)
    for which, label in (("p50", "median job"), ("p99", "p99 job")):
        for run, r in (("base", base), ("new", new)):
            t = next(t for t in agents.job_timelines(r, "coder") if t.which == which)
            assert f"{run} run · coder {label}: {fmt_ms(t.job_time_ms)} ms (job {t.job} at {t.start_s:,.1f} s, {t.rank} of {t.of} by job time)" in titles
    # the base run's jobs have one lane (no fan-out): its timelines' y axes (x3, x5: the left column) hold "job" alone
    left = {y for name in traces for b in traces[name] if b.get("xaxis") in ("x3", "x5") and b["type"] == "bar" for y in b["y"]}
    assert left == {"job"}

    page, _ = compare_html(load_run(OLD_RUN), new)
    section = panel_section(page, "agents")
    assert "The base run had no agent jobs, so only the new run's are here." in section
    assert all(name.endswith("(new)") for name in _traces(page) if "coder" in name)


def test_a_run_without_agents_names_the_panel_in_the_not_measured_line():
    page = report_html(load_run(OLD_RUN))
    assert '<section id="agents">' not in page and "plot-agents" not in page and 'href="#agents"' not in page
    line = page[page.index('<details class="not-measured"'):page.index("</details>", page.index('<details class="not-measured"'))]
    assert "chat sessions and prefix cache, agent jobs, GPU telemetry." in line
    assert "<li><b>agent jobs</b>: This run had no agent jobs (a class's <code>agent:</code>" in line
    page, _ = compare_html(load_run(OLD_RUN), load_run(OLD_RUN))
    assert "<li><b>agent jobs</b>: Neither run had agent jobs.</li>" in page and '<section id="agents">' not in page


def test_the_panel_renders_in_chromium(runs, tmp_path):
    browser_cdp = pytest.importorskip("browser_cdp")
    if browser_cdp.chromium_path() is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    path = tmp_path / "report.html"
    path.write_text(report_html(load_run(runs[1])))
    with browser_cdp.Browser(tmp_path) as browser:
        page = browser.open(path.resolve().as_uri(), wait_for=browser_cdp.PLOTS_DONE)
        assert page.errors == []
        bars = page.evaluate("document.querySelectorAll('#plot-agents g.trace.bars').length")
        titles = page.evaluate("Array.from(document.querySelectorAll('#plot-agents .annotation-text')).map(t => t.textContent)")
    assert bars >= 4
    assert "Job time: share of completed jobs at or below (CDF)" in titles
    assert any(t.startswith("coder median job: ") for t in titles) and any(t.startswith("coder p99 job: ") for t in titles)
