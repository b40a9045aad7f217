"""A distributed run's machines in the report's generator-health panel, its metadata and summary.md:
from a copy of tests/data/run_sessions made into a two-machine run (a nodes.parquet and summary.json's
generator.distributed and generator.nodes added; machine 1 lost at 4.2 s, its host and the reason
holding markup), from tests/data/run_f16f211 (a run on one machine, written before distributed runs:
its page must not change), and the compare page with machines on one side only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from report_page import figure_array, page_figures, panel_section, start_tags
from latscope import results
from latscope.analysis import percentiles
from latscope.analysis.run_data import load_run
from latscope.errors import ResultsError
from latscope.report import figures, panels
from latscope.report.compare import compare_html
from latscope.report.html import report_html
from latscope.report.markdown import summary_markdown

SESSIONS_RUN = REPO / "tests" / "data" / "run_sessions"
OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
HOST_B = "box-b&<i>"
HOST_B_ESCAPED = "box-b&amp;&lt;i&gt;"
REASON = "no heartbeat for 3 s <script>window.__xss=1</script>"
REASON_ESCAPED = "no heartbeat for 3 s &lt;script&gt;window.__xss=1&lt;/script&gt;"
SEND_LAG_A = [0.1, 0.2, 0.3, 0.25, 0.2, 0.15, 0.1, 0.1, 0.1]
SEND_LAG_B = [0.4, 0.5, 0.6, 0.7]


def _node(node: int, host: str, status: str, offset: float, bound: float, drift: float, lost_at: float | None = None,
          reason: str | None = None) -> dict:
    return {"node": node, "host": host, "engines": 2, "status": status, "lost_at_s": lost_at, "reason": reason,
            "clock": {"offset_ms": offset, "bound_ms": bound, "rtt_min_ms": 0.4, "drift_ppm": drift, "max_error_ms": 0.21},
            "requests": {"sent": 12 if node == 0 else 8, "completed": 12 if node == 0 else 7, "errors": 0 if node == 0 else 1},
            "send_lag_p99_ms": 0.3 if node == 0 else 0.7, "loop_lag_p99_ms": 0.5, "cpu_max_pct": 80.0 if node == 0 else 95.5,
            "validity": "valid" if node == 0 else "degraded"}


def _nodes_frame() -> pd.DataFrame:
    """Machine 0 for all nine intervals; machine 1 for four, then lost in the fifth (4.2 s)."""
    rows = [(float(t), 0, "box-a", "ok", 2, 2, 0, 1, lag, 0.5, 40.0 + t, 0.01) for t, lag in enumerate(SEND_LAG_A)]
    rows += [(float(t), 1, HOST_B, "ok", 2, 2, 0, 1, lag, 0.6, 90.0, -0.35) for t, lag in enumerate(SEND_LAG_B)]
    rows.append((4.0, 1, HOST_B, "lost", 0, 0, 1, 0, np.nan, np.nan, np.nan, -0.35))
    columns = ["interval_start_s", "node", "host", "status", "sent", "completed", "errors", "in_flight", "send_lag_p99_ms",
               "loop_lag_p99_ms", "cpu_pct", "clock_offset_ms"]
    return pd.DataFrame(rows, columns=columns).astype({c: "int64" for c in ("node", "sent", "completed", "errors", "in_flight")})


def _distributed(tmp_path: Path, name: str = "dist", summary_nodes: bool = True) -> Path:
    run = tmp_path / name
    shutil.copytree(SESSIONS_RUN, run)
    _nodes_frame().to_parquet(run / results.NODES, index=False)
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary["generator"].update(workers=4, distributed={
        "engine": "locust", "locust_version": "2.47.0", "nodes_expected": 2, "nodes": 2, "engines": 4,
        "on_node_loss": "abort", "clock": {"max_error_ms": 0.4}})
    if summary_nodes:
        summary["generator"]["nodes"] = [_node(0, "box-a", "ok", 0.01, 0.2, 1.5),
                                         _node(1, HOST_B, "lost", -0.35, 0.15, -2.25, lost_at=4.2, reason=REASON)]
    path.write_text(json.dumps(summary))
    return run


def _traces(page: str) -> dict[str, dict]:
    return {t["name"]: t for t in page_figures(page)["plot-generator"]["data"]}


# -- one distributed run -------------------------------------------------------------------------

def test_the_panel_shows_each_machine_and_the_lost_one_stands_out(tmp_path):
    page = report_html(load_run(_distributed(tmp_path)))
    section = panel_section(page, "generator")
    # the table: each machine's host (escaped), engines, status in words, clock offset ± bound, drift, requests, lags, CPU
    assert ('<tr><td>0</td><td class=host>box-a</td><td class=n>2</td><td class="status">ok</td><td class=n>+0.010 ± 0.200</td><td class=n>+1.5</td>'
            "<td class=n>12</td><td class=n>12</td><td class=n>0</td><td class=n>0.300</td><td class=n>0.500</td>"
            '<td class=n>80%</td><td><span class="stamp valid">valid</span></td></tr>') in section
    assert (f'<tr class="bad"><td>1</td><td class=host>{HOST_B_ESCAPED}</td><td class=n>2</td>'
            f'<td class="status worse"><b>lost at 4.2 s: {REASON_ESCAPED}</b></td><td class=n>−0.350 ± 0.150</td><td class=n>−2.2</td>'
            "<td class=n>8</td><td class=n>7</td><td class=n>1</td><td class=n>0.700</td><td class=n>0.500</td>"
            '<td class=n>96%</td><td><span class="stamp degraded">degraded</span></td></tr>') in section
    # the lost machine leads the panel, in words
    assert (f'<p class="warning"><b>Machine 1 ({HOST_B_ESCAPED}) lost at 4.2 s: {REASON_ESCAPED}</b> (on node loss: abort)</p>'
            in section)
    assert "to within 0.400 ms" in section and "a red cross marks a machine lost" in section
    # nothing the machines sent became markup: the page's own three scripts, no <i>
    assert page.count("<script") == 3 and "window.__xss=1</script>" not in page
    assert not [t for t in start_tags(page) if t[0] == "i"]
    # the generator line of the metadata, and the header's badges
    assert "<tr><th>generator</th><td>2 machines, 4 engines (Locust master/worker), 1.0 s intervals</td></tr>" in page
    assert "requests completed outside warm-up</span><span>2 machines, 4 engines (Locust master/worker)</span></p>" in page


def test_each_machine_has_its_send_lag_and_cpu_lines_and_a_cross_where_it_was_lost(tmp_path):
    traces = _traces(report_html(load_run(_distributed(tmp_path))))
    a, b = traces["machine 0 box-a send lag p99"], traces[f"machine 1 {HOST_B_ESCAPED} send lag p99"]
    np.testing.assert_allclose(figure_array(a["x"]), np.arange(9) + 0.5)
    np.testing.assert_allclose(figure_array(a["y"]), SEND_LAG_A, rtol=1e-6)
    np.testing.assert_allclose(figure_array(b["y"])[:4], SEND_LAG_B, rtol=1e-6)
    assert np.isnan(figure_array(b["y"])[4])  # nothing after the machine was lost
    assert a["yaxis"] == b["yaxis"] == "y"  # the lag row, with the run-wide lines
    assert {"send lag p99", "event-loop lag p99"} <= set(traces)
    cpu_a, cpu_b = traces["machine 0 box-a CPU"], traces[f"machine 1 {HOST_B_ESCAPED} CPU"]
    assert cpu_a["yaxis"] == cpu_b["yaxis"] == "y2"  # a CPU row, though this run has no host telemetry
    np.testing.assert_allclose(figure_array(cpu_a["y"]), 40.0 + np.arange(9), rtol=1e-6)
    cross = traces[f"machine 1 {HOST_B_ESCAPED} lost at 4.2 s"]
    assert list(figure_array(cross["x"])) == [4.2] and figure_array(cross["y"])[0] == pytest.approx(0.7)
    assert all("<" not in name for name in traces)


def test_summary_md_names_the_machines_and_the_lost_one(tmp_path):
    text = summary_markdown(load_run(_distributed(tmp_path)).summary)
    assert ("Generator: 2 machines, 4 engines (Locust master/worker); ⚠️ machine 1 (box-b&amp;&lt;i>) lost at 4.2 s: "
            "no heartbeat for 3 s &lt;script>window.\\_\\_xss=1&lt;/script>.") in text
    assert "<script" not in text and "<i>" not in text


def test_without_generator_nodes_in_the_summary_the_table_comes_from_nodes_parquet(tmp_path):
    section = panel_section(report_html(load_run(_distributed(tmp_path, summary_nodes=False))), "generator")
    assert '<tr><td>0</td><td class=host>box-a</td><td class=n>–</td><td class="status">ok</td>' in section
    assert f'<tr class="bad"><td>1</td><td class=host>{HOST_B_ESCAPED}</td><td class=n>–</td><td class="status worse"><b>lost</b></td>' in section
    assert "<td class=n>18</td><td class=n>18</td><td class=n>0</td>" in section  # machine 0's requests, summed
    assert 'class="warning"' not in section  # when and why it was lost are only in summary.json


def test_a_nodes_parquet_without_its_columns_is_named(tmp_path):
    run = _distributed(tmp_path)
    _nodes_frame().drop(columns=["cpu_pct"]).to_parquet(run / results.NODES, index=False)
    with pytest.raises(ResultsError, match="nodes.parquet: missing columns cpu_pct"):
        load_run(run)


# -- a run on one machine, and the compare page ------------------------------------------------

def test_a_run_on_one_machine_renders_as_before():
    run = load_run(OLD_RUN)
    assert run.nodes.empty and list(run.nodes.columns)[:4] == ["interval_start_s", "node", "host", "status"]
    send, loop = (percentiles.interval_percentiles(run, m, "all") for m in ("send_lag", "loop_lag"))
    before = figures.generator_panel(send, loop, run.summary, run.telemetry)  # the drawing without machines
    after = panels.generator_panel(run)
    assert (after.title, after.lead, after.note, after.html) == (before.title, before.lead, before.note, before.html)
    assert after.figure.to_json() == before.figure.to_json()
    page = report_html(run)
    assert 'class="nodes"' not in page and "Clock offset" not in panel_section(page, "generator")
    assert "<tr><th>generator</th><td>1 worker process(es), 1.0 s intervals</td></tr>" in page
    assert "Generator:" not in summary_markdown(run.summary)


def test_compare_with_machines_on_one_side_only(tmp_path):
    dist = _distributed(tmp_path)
    page, _ = compare_html(load_run(OLD_RUN), load_run(dist))
    section = panel_section(page, "generator")
    assert "<h3>new run: 2 machines, 4 engines (Locust master/worker)</h3>" in section and "<h3>base run" not in section
    assert "The base run ran on one machine." in section
    assert f'<p class="warning"><b>new run:</b> <b>Machine 1 ({HOST_B_ESCAPED}) lost at 4.2 s' in section
    traces = _traces(page)
    assert traces["machine 0 box-a send lag p99 (new)"]["line"].get("dash") is None
    assert "send lag p99 (base)" in traces and not any(n.startswith("machine") and n.endswith("(base)") for n in traces)
    # both sides distributed: the base run's machines dashed, a table each
    page, _ = compare_html(load_run(dist), load_run(dist))
    section = panel_section(page, "generator")
    assert "<h3>base run: 2 machines" in section and "<h3>new run: 2 machines" in section
    assert _traces(page)["machine 0 box-a send lag p99 (base)"]["line"]["dash"] == "dash"
    assert "ran on one machine" not in section
    # and the other way round: the base run distributed, the new one not
    page, _ = compare_html(load_run(dist), load_run(OLD_RUN))
    assert "The new run ran on one machine." in panel_section(page, "generator") and "could not be drawn" not in page
