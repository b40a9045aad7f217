"""The report's "Why the tail" panel (report/why_panel.py) without a browser: from copies of a real run
written before per-request records existed (tests/data/run_f16f211) with an explain.json beside it
(the shape docs/explain.md documents, as `latscope explain` writes it), from the same run without one
(no requests.parquet: not measured, named in the header's one line), and on the compare page; the
page parsed, its figure's data read back. The browser test (test_browser.py) opens it in Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from report_page import figure_array, page_figures, panel_section, start_tags
from latscope.analysis.run_data import load_run
from latscope.errors import ResultsError
from latscope.report.compare import compare_html
from latscope.report.html import report_html

OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = '&lt;img src=x onerror="window.__xss=1"&gt;'


def explanation(replica: str = "replica-b", verdict: str = "cause") -> dict:
    """An explain.json as `latscope explain` writes it (docs/explain.md): a slow replica stands out, the rest does not."""
    return {
        "schema_version": 1, "metric": "latency", "quantile": 0.99, "verdict": verdict, "reason": None,
        "summary": f"p99 latency is 181.5 ms (12 requests above it, of 1,200 measured). Top cause: replica {replica}.",
        "requests": {"measured": 1200, "sampled": False}, "threshold_ms": 181.5,
        "tail": {"n": 12, "mean_ms": 190.0, "p50_ms": 185.0, "max_ms": 230.0},
        "body": {"n": 600, "mean_ms": 12.0, "low_ms": 10.0, "high_ms": 14.0}, "excess_ms": 178.0,
        "components": [
            {"name": "send_lag", "label": "client send lag", "side": "client", "tail_ms": 0.2, "body_ms": 0.1, "share": 0.0006},
            {"name": "server.compute", "label": "server.compute", "side": "server", "tail_ms": 180.0, "body_ms": 5.0, "share": 0.98},
            {"name": "decode", "label": "client decode", "side": "client", "tail_ms": 0.0, "body_ms": 0.0, "share": 0.0}],
        "causes": [
            {"rank": 1, "kind": "where", "name": f"replica={replica}", "label": f"replica {replica}", "effect": 0.84,
             "p_value": 1e-12, "stands_out": verdict == "cause",
             "evidence": f"88% of tail requests were served by {replica} against 25% of all requests",
             "detail": {"column": "replica", "groups": [{"label": replica, "tail_share": 0.88, "all_share": 0.25},
                                                        {"label": "replica-a", "tail_share": 0.12, "all_share": 0.75}]}},
            {"rank": 2, "kind": "time", "name": "bursts", "label": "bursts (1 s window)", "effect": 0.11, "p_value": 0.2,
             "stands_out": False, "evidence": "14% of the tail was sent in bursts that hold 3% of all requests"},
            {"rank": 3, "kind": "generator", "name": "generator", "label": "the load generator itself", "effect": 0.02,
             "p_value": 0.6, "stands_out": False, "evidence": "the generator's own delay averages 0.2 ms in the tail"},
        ],
        "tested": 30, "alpha": 0.001, "min_effect": 0.3,
    }


def _run(tmp_path: Path, explain: dict | None, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(OLD_RUN, run)
    if explain is not None:
        (run / "explain.json").write_text(json.dumps(explain))
    return run


def _not_measured(page: str) -> str:
    start = page.find('<details class="not-measured" id="not-measured"><summary>')
    return "" if start < 0 else page[page.index("<summary>", start) + len("<summary>"):page.index("</summary>", start)]


def test_the_panel_leads_the_report_with_the_paragraph_the_ranked_causes_and_the_top_causes_picture(tmp_path):
    page = report_html(load_run(_run(tmp_path, explanation())))
    section = panel_section(page, "why")
    # the first card after the summary tables, and the first link of the header's nav
    assert page.index('<section id="why">') < page.index('<section id="spectrum">')
    assert page.index('href="#why"') < page.index('href="#spectrum"')
    assert ('<p class="why"><b class="bad">Top cause: replica replica-b.</b> p99 latency is 181.5 ms (12 requests above it, '
            "of 1,200 measured). Top cause: replica replica-b.</p>") in section
    assert "Nothing stands out" not in section and "latency above its p99, 181.5 ms" in section
    # every cause in the table, ranked, the one that stands out marked
    assert ('<tr class="bad"><td class=n>1</td><td>where</td><td>replica replica-b</td><td class=n>0.84</td>'
            "<td class=n>1.0e-12</td><td>yes</td><td>88% of tail requests were served by replica-b against 25% of all "
            "requests</td></tr>") in section
    assert ('<tr class=""><td class=n>3</td><td>the generator</td><td>the load generator itself</td><td class=n>0.02</td>'
            "<td class=n>6.0e-01</td><td>no</td>") in section
    figure = page_figures(page)["plot-why"]
    bars, everyone, tail = figure["data"]
    # effect bars in explain's rank order, the first on top (plotly draws the first category at the bottom),
    # red only where a cause stands out; its evidence on hover
    assert bars["orientation"] == "h"
    assert bars["y"] == ["the load generator itself", "bursts (1 s window)", "replica replica-b"]
    np.testing.assert_allclose(figure_array(bars["x"]), [0.02, 0.11, 0.84], rtol=1e-6)
    assert bars["marker"]["color"] == ["#9aa5b1", "#9aa5b1", "#d62728"]
    assert bars["customdata"][-1] == "88% of tail requests were served by replica-b against 25% of all requests"
    # the top cause's picture: each replica's share of the tail against its share of all requests
    assert everyone["name"] == "share of all requests" and tail["name"] == "share of the tail"
    assert everyone["x"] == tail["x"] == ["replica-b", "replica-a"]
    np.testing.assert_allclose(figure_array(tail["y"]), [0.88, 0.12], rtol=1e-6)
    np.testing.assert_allclose(figure_array(everyone["y"]), [0.25, 0.75], rtol=1e-6)
    titles = [a["text"] for a in figure["layout"]["annotations"]]
    assert titles == ["causes, by effect",
                      "top cause: replica replica-b<br>its share of the tail (red) and of all requests (blue)"]


def test_nothing_stands_out_is_said_plainly_and_the_picture_is_where_the_time_went(tmp_path):
    clean = explanation(verdict="nothing_stands_out")
    page = report_html(load_run(_run(tmp_path, clean)))
    section = panel_section(page, "why")
    assert '<p class="why"><b class="good">Nothing stands out.</b> p99 latency is 181.5 ms' in section
    assert '<tr class="bad">' not in section and "Top cause" not in section.split("</p>")[0].split("</b>")[0]
    figure = page_figures(page)["plot-why"]
    bars, body, tail = figure["data"]
    assert set(bars["marker"]["color"]) == {"#9aa5b1"}  # every bar grey: no cause named
    # no top cause: the second plot is the components, tail against body (the ones with any time)
    assert body["x"] == tail["x"] == ["client send lag", "server.compute"]
    np.testing.assert_allclose(figure_array(tail["y"]), [0.2, 180.0], rtol=1e-6)
    np.testing.assert_allclose(figure_array(body["y"]), [0.1, 5.0], rtol=1e-6)
    assert [a["text"] for a in figure["layout"]["annotations"]] == ["causes, by effect",
        "where the tail's extra time went<br>mean in the tail (red) and in the body (blue)"]


def test_not_enough_data_says_so_without_a_plot(tmp_path):
    doc = {"schema_version": 1, "metric": "latency", "quantile": 0.99, "verdict": "not_enough_data",
           "reason": "40 measured requests with a latency: the tail above p99 needs at least 10 (about 1,000 requests)",
           "summary": "Not enough data to explain the tail: 40 measured requests.", "components": [], "causes": []}
    page = report_html(load_run(_run(tmp_path, doc)))
    section = panel_section(page, "why")
    assert '<p class="why">Not enough data to explain the tail: 40 measured requests.</p>' in section
    assert "No cause to draw: too few requests in the tail." in section and "plot-why" not in page


def test_a_run_without_per_request_records_names_the_panel_in_the_not_measured_line(tmp_path):
    page = report_html(load_run(OLD_RUN))  # written before requests.parquet existed, no explain.json
    assert '<section id="why">' not in page and "plot-why" not in page and 'href="#why"' not in page
    assert _not_measured(page).startswith("Not measured in this run: per-request records (why the tail), ")
    assert "This run kept no per-request records (requests.parquet)" in page
    page, _ = compare_html(load_run(OLD_RUN), load_run(OLD_RUN))
    assert _not_measured(page).startswith("Not measured in either run: per-request records (why the tail), ")


def test_target_strings_in_the_explanation_are_escaped_everywhere(tmp_path):
    """Replica ids, class and Server-Timing names come from the target and reach explain.json's labels,
    evidence, paragraph and details; explain.json is a file anyone can edit. All show as text."""
    hostile = explanation(replica=HOSTILE)
    hostile["metric"] = HOSTILE
    hostile["components"][1]["label"] = f"server.{HOSTILE}"
    page = report_html(load_run(_run(tmp_path, hostile)))
    section = panel_section(page, "why")
    assert HOSTILE not in page and "<img" not in page
    assert not [t for t in start_tags(page) if t[0] == "img" or "onerror" in t[1]]
    assert f"Top cause: replica {ESCAPED}.</b>" in section and f"<td>replica {ESCAPED}</td>" in section
    assert f"served by {ESCAPED} against" in section
    assert f"{ESCAPED.replace('_', ' ')} above its p99" in section  # the metric's name in words: "service_time", "service time"
    figure = page_figures(page)["plot-why"]
    assert figure["data"][0]["y"][-1] == f"replica {ESCAPED}" and figure["data"][1]["x"][0] == ESCAPED
    assert figure["data"][0]["customdata"][-1].startswith(f"88% of tail requests were served by {ESCAPED}")
    assert figure["layout"]["annotations"][1]["text"].startswith(f"top cause: replica {ESCAPED}<br>")


def test_compare_shows_both_runs_explanations(tmp_path):
    base = _run(tmp_path, explanation(verdict="nothing_stands_out"), "base")
    new = _run(tmp_path, explanation(), "new")
    page, _ = compare_html(load_run(base), load_run(new))
    section = panel_section(page, "why")
    assert "Why the tail: base vs new" in section
    assert '<p class="why"><b>base run</b>: <b class="good">Nothing stands out.</b>' in section
    assert '<p class="why"><b>new run</b>: <b class="bad">Top cause: replica replica-b.</b>' in section
    figure = page_figures(page)["plot-why"]
    assert [t["name"] for t in figure["data"][:2]] == ["base run", "new run"]
    assert figure["data"][1]["marker"]["color"][-1] == "#d62728" and "#d62728" not in figure["data"][0]["marker"]["color"]
    assert "<td><b>base</b></td><td class=n>1</td>" in section and "<td><b>new</b></td><td class=n>1</td>" in section
    # a base run without records: the new run's explanation alone, and a line that says why
    page, _ = compare_html(load_run(OLD_RUN), load_run(new))
    assert "The base run kept no per-request records." in panel_section(page, "why")


def test_a_damaged_explain_json_is_exit_2_naming_it(tmp_path):
    run = _run(tmp_path, None)
    for text, why in (("{not json", "not valid JSON"), ('["a list"]', "not an explain.json")):
        (run / "explain.json").write_text(text)
        with pytest.raises(ResultsError, match=f"explain.json: .*{why}"):
            report_html(load_run(run))
    r = subprocess.run([sys.executable, "-m", "latscope.cli", "report", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "explain.json" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_edited_explain_json_with_odd_values_still_draws(tmp_path):
    """A file anyone can edit: wrong types where numbers, lists and strings belong are drawn as blanks or
    text, never a lost panel."""
    odd = {"verdict": "cause", "summary": 5, "metric": ["x"], "quantile": "high", "threshold_ms": "41",
           "components": {"no": "list"},
           "causes": [{"kind": 3, "label": {"a": 1}, "effect": "big", "p_value": None, "stands_out": True,
                       "evidence": None, "detail": {"groups": "none", "bins_s": [1, 2], "tail": [1], "all": [1, 2]}},
                      "not a cause", {"name": "replica=r1", "effect": 2.0, "stands_out": "yes"}]}
    run = _run(tmp_path, None)
    (run / "explain.json").write_text(json.dumps(odd))
    page = report_html(load_run(run))
    section = panel_section(page, "why")
    assert "could not be drawn" not in section
    assert "<b class=\"bad\">Top cause: {'a': 1}.</b> 5</p>" in section and "<td>replica=r1</td>" in section
    bars = page_figures(page)["plot-why"]["data"][0]
    np.testing.assert_allclose(figure_array(bars["x"]), [2.0, 0.0], rtol=1e-6)  # as written (the bar is clipped by the axis), and 0


def test_the_top_causes_picture_for_time_and_for_a_server_signal(tmp_path):
    time_cause = {"rank": 1, "kind": "time", "name": "time", "label": "stretches of time (0.5 s bins)", "effect": 0.9,
                  "p_value": 1e-9, "stands_out": True, "evidence": "90% of the tail falls in 3 stretches",
                  "detail": {"bin_s": 0.5, "bins_s": [0.0, 0.5, 1.0, 1.5], "tail": [0, 9, 0, 1], "all": [100, 100, 100, 100],
                             "hot_s": [[0.5, 1.0]]}}
    doc = {**explanation(), "causes": [time_cause]}
    figure = page_figures(report_html(load_run(_run(tmp_path, doc, "time"))))["plot-why"]
    share = figure["data"][1]
    # the tail's share of each bin's requests, bars centred in their bins; dashed: the whole run's 10 / 400
    np.testing.assert_allclose(figure_array(share["x"]), [0.25, 0.75, 1.25, 1.75], rtol=1e-6)
    np.testing.assert_allclose(figure_array(share["y"]), [0.0, 0.09, 0.0, 0.01], rtol=1e-6)
    shapes = figure["layout"]["shapes"]
    assert [(s["x0"], s["x1"]) for s in shapes if s["type"] == "rect"] == [(0.5, 1.0)]  # the hot stretch, shaded
    assert [s["y0"] for s in shapes if s["type"] == "line"] == [0.025]
    assert figure["layout"]["annotations"][1]["text"].startswith("top cause: stretches of time (0.5 s bins)<br>")

    signal = {"rank": 1, "kind": "server_state", "name": "queue_depth", "label": "queue_depth", "effect": 0.8, "p_value": 1e-9,
              "stands_out": True, "evidence": "queue_depth at send time was higher for the tail",
              "detail": {"signal": "queue_depth", "tail": {"p10": 5, "p25": 6, "p50": 8, "p75": 9, "p90": 12},
                         "body": {"p10": 0, "p25": 0, "p50": 1, "p75": 1, "p90": 2}}}
    doc = {**explanation(), "causes": [signal]}
    figure = page_figures(report_html(load_run(_run(tmp_path, doc, "signal"))))["plot-why"]
    body, tail = figure["data"][1:]
    assert body["x"] == tail["x"] == ["p10", "p25", "p50", "p75", "p90"]
    np.testing.assert_allclose(figure_array(tail["y"]), [5, 6, 8, 9, 12])
    np.testing.assert_allclose(figure_array(body["y"]), [0, 0, 1, 1, 2])
    assert figure["layout"]["yaxis2"]["title"]["text"] == "queue_depth"
