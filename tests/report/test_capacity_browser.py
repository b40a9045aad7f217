"""The capacity page in a real headless Chromium (as test_browser.py opens the run report): the sample
capacity directory's page loads with no JavaScript error, draws every plot, runs none of the hostile
strings (no alert dialog, no injected element or script) and shows them as text, and its step links
resolve to each step's report inside the directory."""

from __future__ import annotations

import importlib.util
from typing import Iterator

import pytest

from browser_cdp import PLOTS_DONE, Browser
from conftest import REPO
from capacity_sample import HOSTILE_CLASS, HOSTILE_SLO, IMG, SCENARIO, SCRIPT, capacity_dict, sample_capacity
from latscope.report import write_capacity_page
from test_browser import _need_chromium

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    _need_chromium()
    with Browser(tmp_path_factory.mktemp("chromium")) as b:
        yield b


def test_capacity_page_in_chromium(browser, tmp_path):
    directory = sample_capacity(tmp_path)
    html = write_capacity_page(directory)
    page = browser.open(html.resolve().as_uri(), wait_for=PLOTS_DONE)
    assert page.errors == []
    plots = page.evaluate("""Array.from(document.querySelectorAll('div.plot')).map(d => ({
        id: d.id, svg: d.querySelectorAll('.main-svg').length, traces: d.querySelectorAll('g.trace, g.points').length}))""")
    assert [p["id"] for p in plots] == ["plot-curve-1", "plot-curve-2", "plot-curve-3", "plot-goodput"]
    assert all(p["svg"] > 0 and p["traces"] > 0 for p in plots), plots
    # Nothing hostile ran: no alert dialog opened, no element or script was injected.
    assert page.dialogs == []  # browser_cdp dismisses and records any alert()
    assert page.evaluate("document.scripts.length") == 3  # plotly.js, the figures' JSON, the page's own script
    assert page.evaluate("document.querySelectorAll('img, iframe, [onerror], [onload]').length") == 0
    # ...and each is shown as the text it is: in the header, the table, the nav and on the plots.
    text = page.evaluate("document.body.innerText")
    assert f"latscope capacity · {SCENARIO}" in text and HOSTILE_SLO in text and f"rerun for 8 s {SCRIPT}" in text
    assert "Capacity ≈ 375 req/s (bracket 375–387.5 req/s, precision 5 %)" in text
    assert page.evaluate("document.title").startswith(f"latscope capacity · {SCENARIO}")
    labels = page.evaluate("Array.from(document.querySelectorAll('.annotation-text')).map(t => t.textContent)")
    assert "p99 ≤ 40 ms" in labels and "capacity ≈ 375 req/s" in labels
    titles = page.evaluate("Array.from(document.querySelectorAll('nav a')).map(a => a.textContent)")
    assert titles == ["latency · all", "TTFT · all", f"latency · {HOSTILE_CLASS}", "Goodput"]
    # The step links: one per step with a report, each resolving to that step's directory.
    links = page.evaluate("Array.from(document.querySelectorAll('#steps a')).map(a => [a.textContent, a.href])")
    expected = [s for s in capacity_dict()["steps"] if s["report"]]
    assert [href for _, href in links] == [(directory / s["report"]).as_uri() for s in expected]
    assert links[-1][0] == f"008-387.5{IMG}"
    assert all((directory / s["dir"]).is_dir() for s in expected)
    shot = page.screenshot(tmp_path / "capacity.png", width=1200)
    assert shot.stat().st_size > 50_000


def test_capacity_page_screenshot_helper(tmp_path):
    """docs/capacity_screenshot.py's `screenshot`, which makes docs/capacity.md's picture."""
    _need_chromium()
    spec = importlib.util.spec_from_file_location("capacity_screenshot", REPO / "docs" / "capacity_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    screenshot = module.screenshot
    html = write_capacity_page(sample_capacity(tmp_path))
    png = screenshot(html, tmp_path / "top.png", width=1000, height=900)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
