"""The "Sessions and prefix cache" panel of the report and the compare page: from tests/data/run_sessions
(a real run of five four-turn chat sessions against the reference server's prefix cache), from edited
copies of it (a closed loop, hostile class names, a base run with other numbers), from a run written
before sessions existed (tests/data/run_f16f211: the panel is a one-line note and the page still
renders), and from a real short closed-loop run against a chat server; the page parsed, its figure's
data read back, and once in a headless Chromium when one is installed."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chat_server import make_chat_app
from conftest import REPO, serve
from report_page import figure_array, page_figures, panel_section
from latscope.analysis.run_data import load_run
from latscope.report.compare import compare_html
from latscope.report.html import report_html
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

SESSIONS_RUN = REPO / "tests" / "data" / "run_sessions"
OLD_RUN = REPO / "tests" / "data" / "run_f16f211"
HOSTILE = "<img src=x onerror=\"window.__xss=1\">&amp;"


def _traces(page: str) -> dict[str, dict]:
    return {t["name"]: t for t in page_figures(page)["plot-sessions"]["data"]}


class _Checker(HTMLParser):
    """Parses the page and keeps every start tag: a stray tag from a name would show up here."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _parse(page: str) -> _Checker:
    checker = _Checker()
    checker.feed(page)
    checker.close()
    return checker


def _copy(tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(SESSIONS_RUN, run)
    return run


def _edit_summary(run: Path, edit) -> None:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))


# -- the sample run ------------------------------------------------------------------------------

def test_sample_run_report_shows_sessions_turns_hit_rate_and_timeline():
    page = report_html(load_run(SESSIONS_RUN))
    section = panel_section(page, "sessions")
    tags = _parse(section).tags
    assert ("div", {"class": "plot", "id": "plot-sessions"}) in tags and 'href="#sessions"' in page
    # the table: started / completed / abandoned / cut / turns not sent / session p50, p99 / hit rate
    assert ("<tr><td>chat</td><td class=n>5</td><td class=n>5</td><td class=n>0</td><td class=n>0</td><td class=n>0</td>"
            "<td class=n>989</td><td class=n>1,004</td><td class=n>70.2%</td></tr>") in section
    # every turn: reported and cached prompt tokens, hit rate, TTFT p50 and p99, latency p50 and p99
    assert ("<td>chat</td><td class=n>1</td><td class=n>5</td><td class=n>0</td><td class=n>2,735</td><td class=n>0</td>"
            "<td class=n>0.0%</td><td class=n>36.7</td><td class=n>58.1</td><td class=n>44.1</td><td class=n>65.1</td>") in section
    assert ("<td>chat</td><td class=n>4</td><td class=n>5</td><td class=n>0</td><td class=n>2,735</td><td class=n>2,560</td>"
            "<td class=n>93.6%</td><td class=n>7.78</td><td class=n>15.5</td><td class=n>12.9</td><td class=n>15.6</td>") in section
    assert "No session was abandoned or cut." in section and "TTFT" in section
    assert 'class="warning"' not in page  # an open-loop run: no closed-loop statement anywhere

    traces = _traces(page)
    p50, p99 = traces["chat TTFT p50"], traces["chat TTFT p99"]
    assert list(figure_array(p50["x"])) == [1, 2, 3, 4]
    np.testing.assert_allclose(figure_array(p50["y"]), [36.671, 10.639, 8.399, 7.783], rtol=1e-6)
    np.testing.assert_allclose(figure_array(p99["y"]), [58.079, 17.631, 11.047, 15.527], rtol=1e-6)
    hit = traces["chat hit rate (all turns 70.2%)"]
    np.testing.assert_allclose(figure_array(hit["y"]), [0.0, 93.6015, 93.6015, 93.6015], rtol=1e-6)
    progress = traces["chat in progress"]
    assert list(figure_array(progress["x"])) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert list(figure_array(progress["y"])) == [0, 4, 2, 3, 2, 2, 1, 0]
    assert not any("abandoned" in name or "cut" in name for name in traces)
    assert all(t.get("line", {}).get("dash") is None for t in traces.values())  # one run: nothing dashed


def test_an_old_run_still_renders_and_its_sessions_panel_is_named_in_the_not_measured_line():
    page = report_html(load_run(OLD_RUN))
    assert '<section id="sessions">' not in page  # no card: the header's one line names it, with why
    line = page[page.index('<details class="not-measured"'):page.index("</details>", page.index('<details class="not-measured"'))]
    assert "<summary>Not measured in this run: per-request records (why the tail), the server's own TTFT and latency, chat sessions and prefix cache," in line
    assert "<li><b>chat sessions and prefix cache</b>: This run had no chat sessions and its server reported no prefix-cache hits" in line
    assert "plot-sessions" not in page and 'href="#sessions"' not in page
    assert "could not be drawn" not in page and 'id="plot-spectrum"' in page
    _parse(page)
    page, _ = compare_html(load_run(OLD_RUN), load_run(OLD_RUN))
    assert "<summary>Not measured in either run: per-request records (why the tail), the server's own TTFT and latency, chat sessions and prefix cache," in page
    assert "Neither run had chat sessions or prefix-cache hits" in page and '<section id="sessions">' not in page
    assert "plot-sessions" not in page


# -- compare -------------------------------------------------------------------------------------

def test_compare_draws_the_base_run_dashed_and_the_new_one_solid(tmp_path):
    base = _copy(tmp_path, "base")

    def slower(summary):
        chat = summary["sessions"]["chat"]
        for turn in chat["by_turn"].values():
            turn["ttft"] = {**turn["ttft"], "p50_ms": 100.0, "p99_ms": 200.0}
        chat.update(completed=4, abandoned=1, turns_not_sent=2)

    _edit_summary(base, slower)
    ts = pd.read_parquet(base / "timeseries.parquet")
    latency = ts["metric"] == "latency"
    ts.loc[latency & (ts["interval_start_s"] == 5.0), ["sessions_completed", "sessions_abandoned"]] = [0, 1]
    ts.to_parquet(base / "timeseries.parquet", index=False)

    page, _ = compare_html(load_run(base), load_run(SESSIONS_RUN))
    section = panel_section(page, "sessions")
    assert "Sessions and prefix cache: base (dashed) vs new (solid)" in section
    assert "<tr><td><b>base</b></td><td>chat</td><td class=n>5</td><td class=n>4</td><td class=n>1</td>" in section
    assert "<tr><td><b>new</b></td><td>chat</td><td class=n>5</td><td class=n>5</td><td class=n>0</td>" in section
    traces = _traces(page)
    assert traces["chat TTFT p50 (base)"]["line"]["dash"] == "dash"
    assert traces["chat TTFT p50 (new)"]["line"].get("dash") is None
    assert list(figure_array(traces["chat TTFT p50 (base)"]["y"])) == [100.0] * 4
    assert traces["chat in progress (base)"]["line"]["dash"] == "dash"
    assert list(figure_array(traces["abandoned per interval (base)"]["y"])) == [0, 0, 0, 0, 0, 1, 0]
    assert "abandoned per interval (new)" not in traces

    # a base run without sessions: only the new run's lines, and the note says why
    page, _ = compare_html(load_run(OLD_RUN), load_run(SESSIONS_RUN))
    section = panel_section(page, "sessions")
    assert "The base run had no chat sessions, so only the new run's are here." in section
    assert all(name.endswith("(new)") for name in _traces(page))


# -- the closed loop, escaping, a run without sessions -------------------------------------------

def test_a_closed_loop_run_says_so_in_the_header_and_the_panel(tmp_path):
    run = _copy(tmp_path)
    note = "closed loop: the offered load follows the server <b>read throughput</b>"
    _edit_summary(run, lambda s: s.update(load={"model": "closed", "users": 3, "note": note}))
    page = report_html(load_run(run))
    statement = ("<p class=\"warning\"><b>Load model: closed, 3 users.</b> closed loop: the offered load follows the server "
                 "&lt;b&gt;read throughput&lt;/b&gt;</p>")
    header = page[page.index("<header>"):page.index("</header>")]
    assert statement in header and statement in panel_section(page, "sessions")
    page, _ = compare_html(load_run(SESSIONS_RUN), load_run(run))
    assert "<p class=\"warning\"><b>new run</b> <b>Load model: closed, 3 users.</b>" in panel_section(page, "sessions")
    assert "<b>base run</b>" not in panel_section(page, "sessions")  # the base run was open loop


def test_class_names_from_the_scenario_are_escaped_everywhere_in_the_panel(tmp_path):
    """Scenario class names are [A-Za-z0-9_.-], but a results directory is a file anyone can edit: a
    class named like markup shows as text in the tables and the plot's labels, never as a tag."""
    run = _copy(tmp_path)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text.replace('"chat"', json.dumps(HOSTILE)).replace('"chat#', json.dumps(HOSTILE)[:-1] + "#"))
    ts = pd.read_parquet(run / "timeseries.parquet")
    ts["class"] = ts["class"].astype(object).replace({"chat": HOSTILE})
    ts.to_parquet(run / "timeseries.parquet", index=False)
    page = report_html(load_run(run))
    section = panel_section(page, "sessions")
    escaped = "&lt;img src=x onerror=\"window.__xss=1\"&gt;&amp;amp;"
    assert f"<td>{escaped}</td><td class=n>5</td>" in section and f"<td>{escaped}</td><td class=n>4</td>" in section
    assert "<img" not in page and not [t for t in _parse(page).tags if t[0] == "img" or "onerror" in t[1]]
    names = list(_traces(page))
    assert f"{escaped} TTFT p50" in names and f"{escaped} in progress" in names
    assert all("<" not in name for name in names)


def test_a_run_without_sessions_shows_the_servers_prefix_cache_as_a_table(tmp_path):
    """A trace replay (no sessions) against a server that reports cached tokens: the hit rate per class."""
    run = tmp_path / "replay"
    shutil.copytree(OLD_RUN, run)

    def cached(summary):
        summary["tokens"]["chat"]["prefix_cache"] = {"cached_tokens": 450, "prompt_tokens": 1000, "hit_rate": 0.45}
        summary["tokens"]["health"]["prefix_cache"] = {"cached_tokens": 0, "prompt_tokens": 0, "hit_rate": None}
        summary["tokens"]["all"]["prefix_cache"] = {"cached_tokens": 450, "prompt_tokens": 1000, "hit_rate": 0.45}

    _edit_summary(run, cached)
    page = report_html(load_run(run))
    section = panel_section(page, "sessions")
    assert "plot-sessions" not in page and "No chat sessions in this run; the server reported cached prompt tokens" in section
    assert "<tr><td>chat</td><td class=n>1,000</td><td class=n>450</td><td class=n>45.0%</td></tr>" in section
    assert "<tr><td>health</td><td class=n>0</td><td class=n>0</td><td class=n>not reported</td></tr>" in section
    assert '<tr class="total"><td>all</td><td class=n>1,000</td><td class=n>450</td><td class=n>45.0%</td></tr>' in section


# -- a real run ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def closed_loop_run(tmp_path_factory) -> Path:
    """Two closed-loop users for 1.5 s, three-turn sessions against a chat server that reports as cached
    the longest prefix a prompt shares with an earlier one; `latscope run` writes the report itself."""
    tmp = tmp_path_factory.mktemp("closed")
    with serve(make_chat_app([], ttft_ms=20)) as url:
        scenario = scenario_from_dict({
            "name": "chat", "seed": 7,
            "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5},
            "workload": {"classes": [{"name": "chat", "prompt_tokens": 12, "output_tokens": 3,
                                      "session": {"turns": 3, "shared_prefix": {"tokens": 40}}}]},
            "phases": [{"name": "users", "duration": 1.5, "arrival": {"type": "users", "users": 2}}],
            "output": {"dir": str(tmp)},
        })
        return run_scenario(scenario, workers=1).run_dir


def test_a_real_closed_loop_run_reports_its_sessions(closed_loop_run):
    page = (closed_loop_run / "report.html").read_text()
    summary = json.loads((closed_loop_run / "summary.json").read_text())
    chat = summary["sessions"]["chat"]
    assert summary["load"]["model"] == "closed" and chat["started"] > 10
    header = page[page.index("<header>"):page.index("</header>")]
    assert "<b>Load model: closed, 2 users.</b> closed loop:" in header and "coordinated omission" in header
    section = panel_section(page, "sessions")
    assert (f"<tr><td>chat</td><td class=n>{chat['started']:,}</td><td class=n>{chat['completed']:,}</td>"
            f"<td class=n>{chat['abandoned']:,}</td><td class=n>{chat['cut']:,}</td><td class=n>{chat['turns_not_sent']:,}</td>") in section
    assert f"{chat['prefix_cache']['hit_rate'] * 100:.1f}%" in section
    traces = _traces(page)
    assert {"chat TTFT p50", "chat TTFT p99", "chat in progress"} <= set(traces)
    assert list(figure_array(traces["chat TTFT p50"]["x"])) == [1, 2, 3]
    np.testing.assert_allclose(figure_array(traces["chat TTFT p50"]["y"]),
                               [chat["by_turn"][t]["ttft"]["p50_ms"] for t in ("1", "2", "3")], rtol=1e-6)
    # every session that started ended (completed, or cut when the run ended): none left in progress
    assert figure_array(traces["chat in progress"]["y"])[-1] == 0
    if chat["cut"]:
        assert figure_array(traces["cut per interval"]["y"]).sum() == chat["cut"]


def test_the_panel_renders_in_chromium(tmp_path):
    browser_cdp = pytest.importorskip("browser_cdp")
    if browser_cdp.chromium_path() is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    path = tmp_path / "report.html"
    path.write_text(report_html(load_run(SESSIONS_RUN)))
    with browser_cdp.Browser(tmp_path) as browser:
        page = browser.open(path.resolve().as_uri(), wait_for=browser_cdp.PLOTS_DONE)
        assert page.errors == []
        rendered = page.evaluate("document.querySelectorAll('#plot-sessions .main-svg').length")
        traces = page.evaluate("document.querySelectorAll('#plot-sessions g.trace').length")
        titles = page.evaluate("Array.from(document.querySelectorAll('#plot-sessions .gtitle, #plot-sessions .annotation-text'))"
                               ".map(t => t.textContent)")
    assert rendered > 0 and traces >= 4
    assert "TTFT by turn (p50 ●, p99 ◆)" in titles and "Prefix-cache hit rate by turn" in titles
