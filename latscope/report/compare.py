"""The run-vs-run page: the report's panels with both runs overlaid (base dashed, new solid) and a
table of percentile deltas per metric × class (computed by latscope.analysis.compare)."""

from __future__ import annotations

import math

import pandas as pd

from latscope.analysis import compare as compare_analysis
from latscope.analysis import percentiles, serialization
from latscope.analysis.run_data import RunData
from latscope.report import figures
from latscope.report.html import METRIC_LABELS, esc, TABLE_METRICS, fmt_ms, headline, metadata_table, page, safe_panel
from latscope.report.markdown import md

# A change smaller than this (relative) is shown uncoloured: within run-to-run noise for most setups.
NOTABLE_PCT = 5.0
DELTA_STATS = (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p99.9_ms", "p99.9"), ("max_ms", "max"))


def _pct(value: object) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:+.1f}%"


def _delta_cell(row: pd.Series | None) -> str:
    if row is None:
        return "<td>–</td>"
    pct = row.get("delta_pct")
    pct = None if pct is None or (isinstance(pct, float) and math.isnan(pct)) else float(pct)
    css = "" if pct is None or abs(pct) < NOTABLE_PCT else ("worse" if pct > 0 else "better")
    return (f"<td class=\"n delta {css}\">{fmt_ms(_f(row.get('base')))} → {fmt_ms(_f(row.get('new')))}"
            f"<br><b>{_pct(pct)}</b></td>")


def _f(value: object) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _ordered(deltas: pd.DataFrame) -> list[tuple[str, str]]:
    pairs = list(dict.fromkeys(zip(deltas["metric"], deltas["class"])))
    known = [p for m in TABLE_METRICS for p in pairs if p[0] == m]
    return sorted(known, key=lambda p: (TABLE_METRICS.index(p[0]), p[1] != "all", p[1]))


def delta_table(deltas: pd.DataFrame) -> str:
    if deltas is None or deltas.empty:
        return "<p>The two runs share no metric.</p>"
    index = {(r["metric"], r["class"], r["stat"]): r for _, r in deltas.iterrows()}
    rows = []
    for metric, cls in _ordered(deltas):
        cells = "".join(_delta_cell(index.get((metric, cls, stat))) for stat, _ in DELTA_STATS)
        rows.append(f"<tr><td>{esc(METRIC_LABELS.get(metric, metric))}</td><td>{esc(cls)}</td>{cells}</tr>")
    head = "".join(f"<th class=\"n\">{label} ms</th>" for _, label in DELTA_STATS)
    return ("<p class=\"note\">Each cell: base → new, and the change relative to base. Red: more than "
            f"{NOTABLE_PCT:g}% slower; green: more than {NOTABLE_PCT:g}% faster.</p>"
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


def compare_html(base: RunData, new: RunData, cdn: bool = False) -> tuple[str, pd.DataFrame]:
    """The comparison page and the deltas it shows."""
    deltas = compare_analysis.percentile_deltas(base, new)
    bs, ns = base.summary, new.summary

    def streaming():
        metrics = [m for m, _ in figures.STREAMING_METRICS]
        return figures.streaming_panel(
            {m: percentiles.spectrum(new, m) for m in metrics if m in ns.get("metrics", {})},
            compare_with={m: percentiles.spectrum(base, m) for m in metrics if m in bs.get("metrics", {})})

    def parts():
        both = [(df, which) for df, which in ((serialization.breakdown(base), "base"), (serialization.breakdown(new), "new"))
                if not df.empty]
        if not both:
            return figures.serialization_panel(pd.DataFrame())
        frame = pd.concat([df.assign(run=which) for df, which in both], ignore_index=True)
        order = {c: i for i, c in enumerate(dict.fromkeys(frame["class"]))}
        frame = frame.sort_values(["class", "run"], key=lambda col: col.map(order) if col.name == "class" else col, kind="stable")
        frame["class"] = frame["class"] + " · " + frame["run"]
        panel = figures.serialization_panel(frame.drop(columns="run"))
        panel.title = "Serialization: where a request's time goes, base vs new"
        return panel

    panels = [
        safe_panel(lambda: figures.spectrum_compare_panel(percentiles.spectrum(base), percentiles.spectrum(new)),
                   "spectrum", "Latency percentile spectrum"),
        safe_panel(lambda: figures.latency_time_compare_panel(percentiles.interval_percentiles(base), percentiles.interval_percentiles(new), bs, ns),
                   "latency-time", "Latency over time"),
        safe_panel(lambda: figures.load_compare_panel(percentiles.interval_percentiles(base), percentiles.interval_percentiles(new), bs, ns),
                   "load-time", "Load"),
        safe_panel(streaming, "streaming", "Streaming"),
        safe_panel(parts, "serialization", "Serialization"),
    ]
    line = compare_headline(bs, ns)
    header = (f"<h1>latscope compare · base {esc(bs.get('scenario', '?'))} {esc(bs.get('started_at', ''))} · "
              f"new {esc(ns.get('scenario', '?'))} {esc(ns.get('started_at', ''))}</h1><div class=\"headline\">{esc(line)}</div>")
    body = [
        "<div class=\"grid\">"
        f"<section><h2>Base: {esc(base.path.name)}</h2><p>{esc(headline(bs))}</p></section>"
        f"<section><h2>New: {esc(new.path.name)}</h2><p>{esc(headline(ns))}</p></section></div>",
        f"<section id=\"deltas\"><h2>Percentile deltas (outside warm-up)</h2>{delta_table(deltas)}</section>",
    ]
    tail = [f"<div class=\"grid\"><section><h2>Base run</h2>{metadata_table(base)}</section>"
            f"<section><h2>New run</h2>{metadata_table(new)}</section></div>"]
    return page(f"latscope compare · {esc(line)}", header, body, panels, tail, cdn), deltas


def compare_markdown(base: RunData, new: RunData, deltas: pd.DataFrame) -> str:
    lines = [f"### latscope compare · {md(base.path.name)} → {md(new.path.name)}", "",
             f"**{md(compare_headline(base.summary, new.summary))}**", ""]
    if deltas is not None and not deltas.empty:
        index = {(r["metric"], r["class"], r["stat"]): r for _, r in deltas.iterrows()}
        lines.append("| metric | class | " + " | ".join(f"{label} ms" for _, label in DELTA_STATS) + " |")
        lines.append("|---|---|" + "---|" * len(DELTA_STATS))
        for metric, cls in _ordered(deltas):
            cells = []
            for stat, _ in DELTA_STATS:
                r = index.get((metric, cls, stat))
                cells.append("–" if r is None else f"{fmt_ms(_f(r.get('base')))} → {fmt_ms(_f(r.get('new')))} ({_pct(_f(r.get('delta_pct')))})")
            lines.append(f"| {md(METRIC_LABELS.get(metric, metric))} | {md(cls)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
