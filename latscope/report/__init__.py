"""Reports over a results directory: the HTML page (html.py: tables and the page), its panels
(panels.py: the one list of panels, read by both pages; figures.py: one plotly figure per panel), the
run-vs-run page (compare.py), the capacity search's page (capacity_page.py, its figures in
capacity_figures.py), the Markdown summary (markdown.py), the gate's outputs (gate_output.py), and what
they share: escaping (escape.py) and events in words (words.py, the terminal's too). They
draw what latscope.analysis computes; they compute no statistic of their own."""

from __future__ import annotations

from pathlib import Path

from latscope.analysis.run_data import load_run
from latscope.results import REPORT, SUMMARY_MD, write_text


def write_report(run_dir: str | Path, out: str | Path | None = None, cdn: bool = False) -> tuple[Path, Path]:
    """Write the HTML report of the results directory `run_dir` to `out` (default RUN_DIR/report.html)
    and its Markdown summary next to it (RUN_DIR/summary.md, or OUT with the suffix .md).
    Returns (html path, markdown path). ResultsError when `run_dir` is not a results directory."""
    from latscope.report.html import report_html
    from latscope.report.markdown import summary_markdown

    run = load_run(run_dir)
    html_path = Path(out) if out is not None else run.path / REPORT
    md_path = run.path / SUMMARY_MD if out is None else html_path.with_suffix(".md")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(html_path, report_html(run, cdn=cdn))
    write_text(md_path, summary_markdown(run.summary, html_path.name))
    return html_path, md_path


def write_compare(base_dir: str | Path, new_dir: str | Path, out: str | Path | None = None, cdn: bool = False) -> tuple[Path, Path]:
    """Write the comparison page of two results directories (default NEW_DIR/compare.html) and its
    Markdown delta table next to it (same name, .md). Returns (html path, markdown path)."""
    from latscope.report.compare import compare_html, compare_markdown

    base, new = load_run(base_dir), load_run(new_dir)
    html_path = Path(out) if out is not None else new.path / "compare.html"
    md_path = html_path.with_suffix(".md")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    page, deltas = compare_html(base, new, cdn=cdn)
    write_text(html_path, page)
    write_text(md_path, compare_markdown(base, new, deltas))
    return html_path, md_path


def write_capacity_page(capacity_dir: str | Path, cdn: bool = False) -> Path:
    """Write CAPACITY_DIR/capacity.html from the CAPACITY_DIR/capacity.json `latscope capacity` wrote;
    returns its path. ResultsError when capacity.json is missing or unreadable."""
    from latscope.report.capacity_page import write_capacity_page as write

    return write(capacity_dir, cdn=cdn)
