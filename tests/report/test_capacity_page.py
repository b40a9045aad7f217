"""The capacity page without a browser: from capacity_sample's capacity directory (a fail, an
undecided step rerun longer, an invalid one, goodput on some, hostile strings everywhere), what the
page says, what it links to, what it escapes, and the figures it hands plotly.
(test_capacity_browser.py opens the same page in Chromium.)"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest

from capacity_sample import HOSTILE_CLASS, HOSTILE_DIR, HOSTILE_SLO, IMG, PAYLOADS, SCRIPT, capacity_dict, sample_capacity
from latscope.errors import ResultsError
from latscope.report import write_capacity_page
from latscope.report.capacity_figures import fmt_rate
from latscope.report.capacity_page import capacity_headline, capacity_html, cost_line, report_link

FIGURES = re.compile(r'<script type="application/json" id="latscope-figures">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    directory = sample_capacity(tmp_path_factory.mktemp("capacity"))
    path = write_capacity_page(directory)
    assert path == directory / "capacity.html"
    return path.read_text()


def _figures(html: str) -> dict:
    return json.loads(FIGURES.search(html).group(1))["figures"]


def _outside_plotly(html: str) -> str:
    """The page without the embedded plotly.js bundle (the part this code wrote)."""
    start = html.index("<script type=\"text/javascript\">")
    return html[:start] + html[html.index("</script>", start):]


def test_the_headline_says_the_capacity_its_limit_why_it_stopped_and_the_cost(page):
    capacity = capacity_dict()
    assert capacity_headline(capacity) == "Capacity ≈ 375 req/s (bracket 375–387.5 req/s, precision 5 %)"
    assert cost_line(capacity) == "$0.00259 per 1,000 requests, $1.23 per 1M output tokens at $3.50/h (at 375 req/s)"
    assert '<div class="headline">Capacity ≈ 375 req/s (bracket 375–387.5 req/s, precision 5 %)</div>' in page
    assert "Limited by <b>latency/all p99</b> (p99 ≤ 40 ms): the SLO that failed at the lowest failing rate." in page
    assert "Stopped: the bracket is within the precision asked. capacity 375 req/s: every SLO held" in page
    assert "Cost: <b>$0.00259 per 1,000 requests, $1.23 per 1M output tokens at $3.50/h (at 375 req/s)</b>" in page
    assert 'class="warning"' not in page and "headline partial" not in page
    assert page.count("<script") == 3 and "Plotly" in page  # plotly.js embedded once: no network needed


@pytest.mark.parametrize("change, headline", [
    (dict(max_rate_rps=None, bracket={"low_rps": None, "high_rps": 100.0}, stopped="slo_fails_at_lowest_rate", exit_code=1),
     "No rate met every SLO: they fail at the lowest rate tried (100 req/s)"),
    (dict(max_rate_rps=800.0, bracket={"low_rps": 800.0, "high_rps": None}, stopped="max_rate", exit_code=0),
     "Capacity ≥ 800 req/s (no rate tried failed an SLO)"),
    # schema 2: rates undecided after their looks are a band, not a failure
    (dict(schema_version=2, max_rate_rps=300.0, stopped="undecided_band", exit_code=0,
          bracket={"low_rps": 300.0, "high_rps": 400.0, "undecided_low_rps": 320.0, "undecided_high_rps": 350.0}),
     "Capacity ≥ 300 req/s (the SLOs are undecided at 320–350 req/s, fail with confidence at 400 req/s)"),
    (dict(max_rate_rps=None, bracket={"low_rps": None, "high_rps": None}, stopped="run_failed", exit_code=4, cost=None),
     "No capacity found"),
])
def test_other_endings_and_the_warning_style(change, headline):
    capacity = {**capacity_dict(), **change}
    html = capacity_html(capacity, cdn=True)
    assert capacity_headline(capacity) == headline
    warned = capacity["exit_code"] != 0
    assert ('<div class="headline partial">' in html) == warned and ('<p class="warning">' in html) == warned
    if warned:
        assert f"(exit code {capacity['exit_code']})" in html
    if capacity.get("cost") is None:
        assert "Cost:" not in html


def test_every_hostile_string_is_escaped(page):
    for payload in PAYLOADS:
        assert payload not in page, payload
    own = _outside_plotly(page)
    assert "<img" not in own and "<script>alert" not in own
    escaped_script = "&lt;script&gt;alert(1)&lt;/script&gt;"
    escaped_img = "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
    assert f"latscope capacity · mm1{escaped_script}" in page  # scenario name: header and <title>
    assert f"<title>latscope capacity · mm1{escaped_script}" in page
    assert f"ttft/all p99{escaped_img}" in page  # an SLO name: table header and settings
    assert f"undecided: rerun for 8 s {escaped_script}" in page  # a note
    assert f"generator fell behind {escaped_img}" in page  # a validity reason
    assert f"failed latency/all p99 {escaped_img}" in page  # the message
    assert f"latency · chat{escaped_img}: p50" in page  # a class name, in a panel title and the nav
    # Plotly's JSON cannot close its script element, and the labels it draws are escaped for plotly.
    figures_text = FIGURES.search(page).group(1)
    assert "<" not in figures_text and ">" not in figures_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in json.dumps(_figures(page), ensure_ascii=False)


def test_each_step_links_to_its_report(page):
    capacity = capacity_dict()
    hrefs = re.findall(r'<a href="(steps/[^"]*)">', _outside_plotly(page))
    linked = [s for s in capacity["steps"] if s["report"]]
    assert hrefs == [quote(s["report"], safe="/") for s in linked] and len(hrefs) == 7
    assert hrefs[0] == "steps/001-100/report.html"
    # The hostile directory: percent-encoded in the href, escaped in the text.
    assert f'<a href="{quote(HOSTILE_DIR + "/report.html", safe="/")}">008-387.5&quot;&gt;&lt;img' in page
    assert "004-300 <span class=ci>(no report)</span>" in page


def test_a_report_link_stays_a_relative_path_inside_the_directory():
    def link(report: str) -> str:
        return report_link({"dir": "steps/001-1", "report": report})

    assert link("steps/001-1/report.html") == '<td><a href="steps/001-1/report.html">001-1</a></td>'
    for outside in ("/etc/passwd", "//evil.example/x", "../other/report.html", "steps\\..\\x"):
        assert "<a" not in link(outside), outside
    assert link("javascript:alert(1)") == '<td><a href="javascript%3Aalert%281%29">001-1</a></td>'  # a file name, not a scheme


def test_the_steps_table_in_the_order_run(page):
    table = page[page.index('<section id="steps">'):page.index('<section id="settings">')]
    assert [int(i) for i in re.findall(r"<tr(?: class=\"uncounted\")?><td class=n>(\d+)</td>", table)] == list(range(1, 9))
    assert table.count('<tr class="uncounted">') == 2  # the undecided step and the invalid one
    assert "11.7 <span class=ci>[11.2–12.2]</span> <span class=\"v good\">✔ pass</span>" in table
    assert "47.7 <span class=ci>[45.8–49.6]</span> <span class=\"v bad\">✘ fail</span>" in table
    assert "<span class=\"v unsure\">undecided</span>" in table and "8 s (longer)" in table
    assert "not counted<br>undecided: rerun for 8 s" in table and "counted as fail" in table
    assert "<td class=n>99.2 (99.9%)</td>" in table and "<td class=n>266.7 (67.1%)</td>" in table  # goodput: rps (fraction)
    assert "<td class=n>300</td><td class=n>8 s (longer)</td><td class=n>297.9</td><td class=n>297.3</td>" in table


def test_the_figures_draw_the_curves_the_limits_and_the_capacity(page):
    figures = _figures(page)
    assert list(figures) == ["plot-curve-1", "plot-curve-2", "plot-curve-3", "plot-goodput"]
    curve = figures["plot-curve-1"]  # latency/all: the SLO'd curves first, then the hostile class
    assert curve["layout"]["yaxis"]["title"]["text"].startswith("latency (ms)")
    counted = [t for t in curve["data"] if t.get("legendgroup") != "uncounted"]
    assert [t["name"] for t in counted] == ["p50", "p99", "p99.9"]
    p99 = counted[1]
    assert p99["mode"] == "lines+markers" and p99["x"] == sorted(p99["x"]) and len(p99["x"]) == 6
    assert p99["marker"]["symbol"] == ["circle", "circle", "circle", "circle", "x", "x"]  # 384 and 396.4 req/s failed
    assert p99["error_y"]["array"][0] == pytest.approx(12.16 - 11.69) and p99["error_y"]["arrayminus"][0] == pytest.approx(11.69 - 11.22)
    assert counted[2]["error_y"]["array"][0] is None  # step 1's p99.9 has no interval: no whisker
    uncounted = [t for t in curve["data"] if t.get("legendgroup") == "uncounted"]
    assert len(uncounted) == 3 and sum(t.get("showlegend", True) for t in uncounted) == 1
    assert set(uncounted[0]["marker"]["symbol"]) == {"diamond-open", "square-open"}
    assert any("undecided (not counted)" in text for text in uncounted[0]["customdata"])
    shapes = curve["layout"]["shapes"]
    assert any(s["type"] == "line" and s["y0"] == 40.0 and s["line"]["dash"] == "dash" for s in shapes)  # p99 ≤ 40 ms
    assert any(s["type"] == "line" and s["x0"] == 375.0 and s["x1"] == 375.0 for s in shapes)  # the capacity
    assert any(s["type"] == "rect" and (s["x0"], s["x1"]) == (375.0, 387.5) for s in shapes)  # the bracket
    labels = [a["text"] for a in curve["layout"]["annotations"]]
    assert "p99 ≤ 40 ms" in labels and "capacity ≈ 375 req/s" in labels
    assert "p99 ≤ 30 ms" in [a["text"] for a in figures["plot-curve-2"]["layout"]["annotations"]]  # ttft/all
    assert not any(s["type"] == "line" and s["y0"] in (30.0, 40.0) for s in figures["plot-curve-3"]["layout"]["shapes"])
    goodput = figures["plot-goodput"]
    names = [t["name"] for t in goodput["data"]]
    assert names == ["every request good (y = x)", "achieved (completed without error)", "goodput"]
    good = goodput["data"][2]
    assert len(good["x"]) == 6 and good["x"] == sorted(good["x"]) and all("% good)" in h for h in good["customdata"])
    assert goodput["layout"]["xaxis"]["title"]["text"] == "offered rate (req/s)"


def test_rates_read_at_a_glance():
    assert [fmt_rate(v) for v in (0.4123, 9.812, 5.0, 99.34, 375.0, 387.5, 1204.5, None)] == [
        "0.412", "9.81", "5", "99.3", "375", "387.5", "1,204.5", "–"]


def test_a_search_that_ran_no_full_step_still_has_a_page(tmp_path):
    capacity = {"schema_version": 1, "scenario": "s", "precision": 0.05, "confidence": 0.95, "max_rate_rps": None,
                "bracket": {"low_rps": None, "high_rps": None}, "stopped": "run_failed", "exit_code": 4,
                "message": "no answer: a step's run failed", "slos": [], "cost": None,
                "steps": [{"index": 1, "dir": "steps/001-100", "rate_rps": 100.0, "factor": 1.0, "duration_s": 4.0,
                           "longer": False, "verdict": "partial", "counted_as": None, "note": f"target died {SCRIPT}"}]}
    (tmp_path / "capacity.json").write_text(json.dumps(capacity))
    html = write_capacity_page(tmp_path).read_text()
    assert _figures(html) == {} and "No capacity found" in html and "target died &lt;script&gt;" in html
    assert "001-100 <span class=ci>(no report)</span>" in html


def test_cdn_page_loads_plotly_from_its_cdn():
    html = capacity_html(capacity_dict(), cdn=True)
    assert '<script src="https://cdn.plot.ly/plotly-' in html and len(html) < 500_000


def test_a_directory_without_capacity_json_is_a_results_error(tmp_path):
    with pytest.raises(ResultsError, match="capacity.json"):
        write_capacity_page(tmp_path)
    (tmp_path / "capacity.json").write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        write_capacity_page(tmp_path)


def test_names_from_the_sample_are_hostile():
    # The sample keeps its promise: the strings the tests above look for do come from it.
    assert IMG in HOSTILE_SLO and IMG in HOSTILE_CLASS and IMG in HOSTILE_DIR


def test_a_curve_draws_every_percentile_it_is_given_in_order():
    # capacity.json's curves hold p50, p99 and p99.9; a p90 (the statistic of a p90 SLO) is drawn too.
    capacity = capacity_dict()
    for step in capacity["steps"][:3]:
        step["percentiles"]["latency/all"]["p90"] = {"value_ms": 9.0, "low_ms": 8.0, "high_ms": 10.0}
    figures = _figures(capacity_html(capacity, cdn=True))
    counted = [t["name"] for t in figures["plot-curve-1"]["data"] if t.get("legendgroup") != "uncounted"]
    assert counted == ["p50", "p90", "p99", "p99.9"]


def test_without_goodput_there_is_no_goodput_plot_or_column():
    capacity = capacity_dict()
    for step in capacity["steps"]:
        step["goodput"] = None
    html = capacity_html(capacity, cdn=True)
    assert "plot-goodput" not in _figures(html) and "goodput req/s" not in html
