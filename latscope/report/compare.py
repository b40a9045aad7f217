"""The run-vs-run page: every panel of the single-run report (report/panels.py's PANELS, each built
with a base run) with both runs — overlaid where they share axes (base dashed, new solid), side by
side where they do not (cold starts: one bar group and one block of table rows per run) — each
run's validity stamp by its name, and a table of percentile deltas for every metric × class of
either run (computed by latscope.analysis.compare). A panel is left out, named in the header's "Not
measured in either run" line, only when neither run has anything for it (the panel's build sees both)."""

from __future__ import annotations

import math

import pandas as pd

from latscope.analysis import compare as compare_analysis
from latscope.analysis.run_data import RunData
from latscope.report import figures
from latscope.report.escape import esc_html
from latscope.report.html import headline, metadata_table, page, safe_panel
from latscope.report.markdown import md
from latscope.report.panels import PANELS
from latscope.report.words import fmt_ms
from latscope.results.schema import METRIC_GROUPS, OTHER_GROUP, metric_label

# A change smaller than this (relative) is shown uncoloured: within run-to-run noise for most setups.
NOTABLE_PCT = 5.0
DELTA_STATS = (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p99.9_ms", "p99.9"), ("max_ms", "max"),
               ("mean_ms", "mean"))


def _pct(value: object) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:+.1f}%"


def _delta_cell(row: pd.Series | None) -> str:
    if row is None:
        return "<td>–</td>"
    pct = row.get("delta_pct")
    pct = None if pct is None or (isinstance(pct, float) and math.isnan(pct)) else float(pct)
    css = "" if pct is None or abs(pct) < NOTABLE_PCT else (" worse" if pct > 0 else " better")
    return (f"<td class=\"n delta{css}\">{fmt_ms(_f(row.get('base')))} → {fmt_ms(_f(row.get('new')))}"
            f"<br><b>{_pct(pct)}</b></td>")


def _f(value: object) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _metric_rank(metric: str) -> tuple[int, int, str]:
    for g, (_, members) in enumerate(METRIC_GROUPS):
        for position, member in enumerate(members):
            if metric == member or (member.endswith("*") and metric.startswith(member[:-1])):
                return g, position, metric
    return len(METRIC_GROUPS), 0, metric


def _group_name(metric: str) -> str:
    g = _metric_rank(metric)[0]
    return METRIC_GROUPS[g][0] if g < len(METRIC_GROUPS) else OTHER_GROUP


def _ordered(deltas: pd.DataFrame) -> list[tuple[str, str]]:
    """Every (metric, class) of the deltas, in METRIC_GROUPS order (the delta table's sections, in
    reading order; a metric in none of them goes to a last OTHER_GROUP); class "all" first within a metric."""
    pairs = list(dict.fromkeys(zip(deltas["metric"], deltas["class"])))
    return sorted(pairs, key=lambda p: (_metric_rank(p[0]), p[1] != "all", p[1]))


def _only_in(index: dict, metric: str, cls: str) -> tuple[str, str] | None:
    """("base" | "new", "p50 0.400 · p90 … ms") when only one run has this metric × class, else None:
    a row of "– → 0.400" cells would hide the one fact that matters (it is new, or gone)."""
    rows = [(label, index.get((metric, cls, stat))) for stat, label in DELTA_STATS]
    for side, other in (("new", "base"), ("base", "new")):
        if all(r is None or _f(r.get(other)) is None for _, r in rows):
            values = " · ".join(f"{label} {fmt_ms(_f(r.get(side)))}" for label, r in rows if r is not None)
            return side, f"{values} ms"
    return None


def _label(metric: str) -> str:
    return metric_label(metric)


def delta_table(deltas: pd.DataFrame) -> str:
    if deltas is None or deltas.empty:
        return "<p>The two runs share no metric.</p>"
    index = {(r["metric"], r["class"], r["stat"]): r for _, r in deltas.iterrows()}
    rows, group = [], None
    for metric, cls in _ordered(deltas):
        if _group_name(metric) != group:
            group = _group_name(metric)
            rows.append(f"<tr class=\"group\"><th colspan=\"{2 + len(DELTA_STATS)}\">{esc_html(group)}</th></tr>")
        only = _only_in(index, metric, cls)
        if only:
            cells = f"<td class=\"only\" colspan=\"{len(DELTA_STATS)}\"><i>only in the {only[0]} run:</i> {only[1]}</td>"
        else:
            cells = "".join(_delta_cell(index.get((metric, cls, stat))) for stat, _ in DELTA_STATS)
        strong = " class=\"total\"" if cls == "all" else ""
        rows.append(f"<tr{strong}><td>{esc_html(_label(metric))}</td><td>{esc_html(cls)}</td>{cells}</tr>")
    head = "".join(f"<th class=\"n\">{label} ms</th>" for _, label in DELTA_STATS)
    return ("<p class=\"note\">Each cell: base → new, and the change relative to base; – where a run lacks the metric or class. "
            f"Red: more than {NOTABLE_PCT:g}% slower; green: more than {NOTABLE_PCT:g}% faster. Every metric in either "
            "run's summary.json is here.</p>"
            f"<table class=\"deltas\"><tr><th>metric</th><th>class</th>{head}</tr>" + "".join(rows) + "</table>")


def compare_headline(base: dict, new: dict) -> str:
    b = base.get("metrics", {}).get("latency", {}).get("all", {}).get("p99_ms")
    n = new.get("metrics", {}).get("latency", {}).get("all", {}).get("p99_ms")
    parts = []
    if b is not None and n is not None:
        change = f" ({(n - b) / b * 100:+.1f}%)" if b else ""
        parts.append(f"p99 latency {fmt_ms(b)} → {fmt_ms(n)} ms{change}")
    br, nr = base.get("throughput", {}).get("achieved_rps"), new.get("throughput", {}).get("achieved_rps")
    if br is not None and nr is not None:
        parts.append(f"achieved {br:,.1f} → {nr:,.1f} req/s")
    for which, s in (("base", base), ("new", new)):
        slos = s.get("slo") or []
        if slos:
            parts.append(f"{which} {sum(1 for x in slos if x.get('passed'))} of {len(slos)} SLOs met")
    parts.append(f"measurement {base.get('validity', '?')} / {new.get('validity', '?')}")
    return " — ".join(parts)


def weaker_reasons(base: dict, new: dict) -> list[str]:
    """Plain-text sentences, one per run whose measurement is not "valid" (empty when both are)."""
    out = []
    for which, summary in (("base", base), ("new", new)):
        stamp = summary.get("validity")
        if stamp == "valid":
            continue
        reasons = summary.get("validity_reasons") or []
        detail = f" ({'; '.join(str(r) for r in reasons)})" if reasons else ""
        out.append(f"the {which} run's measurement is {stamp}{detail}" if stamp else f"the {which} run has no validity stamp")
    return out


def _weaker_html(base: dict, new: dict) -> str:
    reasons = weaker_reasons(base, new)
    if not reasons:
        return ""
    return ("<p class=\"warning\"><b>This comparison is weaker:</b> " + esc_html("; ".join(reasons)) + ". Where a run's "
            "generator fell behind, the load it offered was not the planned one, so a difference between the runs may come "
            "from the load generator rather than the target. See Generator health below.</p>")


def _run_line(which: str, run: RunData) -> str:
    s = run.summary
    return (f"<div class=\"run\"><b>{which}</b> {esc_html(run.path.name)} · scenario {esc_html(s.get('scenario', '?'))} · started "
            f"{esc_html(s.get('started_at', ''))} {figures.validity_stamp(s)}</div>")


def compare_html(base: RunData, new: RunData, cdn: bool = False) -> tuple[str, pd.DataFrame]:
    """The comparison page and the deltas it shows."""
    deltas = compare_analysis.percentile_deltas(base, new)
    bs, ns = base.summary, new.summary
    line = compare_headline(bs, ns)
    header = (f"<h1>latscope compare</h1><div class=\"headline\">{esc_html(line)}</div>"
              f"{_run_line('base', base)}{_run_line('new', new)}{_weaker_html(bs, ns)}")
    body = [
        "<div class=\"grid\">"
        f"<section><h2>Base: {esc_html(base.path.name)}</h2><p>{esc_html(headline(bs))}</p></section>"
        f"<section><h2>New: {esc_html(new.path.name)}</h2><p>{esc_html(headline(ns))}</p></section></div>",
        f"<section id=\"deltas\"><h2>Percentile deltas (outside warm-up)</h2>{delta_table(deltas)}</section>",
    ]
    tail = [f"<div class=\"grid\"><section><h2>Base run</h2>{metadata_table(base)}</section>"
            f"<section><h2>New run</h2>{metadata_table(new)}</section></div>"]
    panels = [safe_panel(lambda spec=spec: spec.build(new, base), spec.id, spec.compare_title or spec.title) for spec in PANELS]
    return page(f"latscope compare · {esc_html(line)}", header, body, panels, tail, cdn, not_measured_in="either run"), deltas


def compare_markdown(base: RunData, new: RunData, deltas: pd.DataFrame) -> str:
    lines = [f"### latscope compare · {md(base.path.name)} → {md(new.path.name)}", "",
             f"**{md(compare_headline(base.summary, new.summary))}**", ""]
    weaker = weaker_reasons(base.summary, new.summary)
    if weaker:
        lines += [f"⚠ This comparison is weaker: {md('; '.join(weaker))}.", ""]
    if deltas is not None and not deltas.empty:
        index = {(r["metric"], r["class"], r["stat"]): r for _, r in deltas.iterrows()}
        lines.append("| metric | class | " + " | ".join(f"{label} ms" for _, label in DELTA_STATS) + " |")
        lines.append("|---|---|" + "---|" * len(DELTA_STATS))
        for metric, cls in _ordered(deltas):
            only = _only_in(index, metric, cls)
            if only:
                lines.append(f"| {md(_label(metric))} | {md(cls)} | only in the {only[0]} run: {only[1]} |" + " |" * (len(DELTA_STATS) - 1))
                continue
            cells = []
            for stat, _ in DELTA_STATS:
                r = index.get((metric, cls, stat))
                cells.append("–" if r is None else f"{fmt_ms(_f(r.get('base')))} → {fmt_ms(_f(r.get('new')))} ({_pct(_f(r.get('delta_pct')))})")
            lines.append(f"| {md(_label(metric))} | {md(cls)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
