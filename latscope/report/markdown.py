"""summary.md: the run in a few lines of GitHub-flavoured Markdown, for pasting into a PR or a chat.

Text from a scenario or a target is HTML-escaped (GitHub renders inline HTML) and has Markdown's
punctuation backslash-escaped, so a class or an error message can neither inject markup nor break a
table row.
"""

from __future__ import annotations

import re

from latscope.analysis import coldstart
from latscope.analysis.models import fairness_lines
from latscope.report.html import PERCENTILE_COLUMNS, TABLE_METRICS, headline
from latscope.report.nodes_panel import distributed_text, lost_texts
from latscope.report.words import fmt_ms, goodput_sentence, objectives_text, slo_value_text
from latscope.results.schema import metric_label

# What can start markup inside a line of a table cell or a bold headline. Line-start syntax (#, -, 1.,
# >) cannot occur: an escaped value never begins a line. Kept minimal so the text still reads well
# where Markdown is not rendered (a chat).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(value: object) -> str:
    """Text from a scenario or a target, inert in Markdown and HTML, on one line: '&' and '<' as
    entities (no tag or entity can start), Markdown's inline punctuation backslash-escaped."""
    text = " ".join(str(value).split()).replace("&", "&amp;").replace("<", "&lt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def summary_markdown(summary: dict, report_name: str | None = "report.html") -> str:
    s = summary
    lines = [f"### latscope · {md(s.get('scenario', '?'))} · {md(s.get('started_at', ''))}", "", f"**{md(headline(s))}**", ""]
    reasons = s.get("validity_reasons") or []
    lines.append(f"Measurement **{md(s.get('validity', 'unknown'))}**" + (": " + "; ".join(md(r) for r in reasons) if reasons else "") + ".")
    t, r = s.get("throughput", {}), s.get("requests", {})
    lines += ["", f"Throughput: offered {t.get('offered_rps', 0):,.1f} req/s, achieved {t.get('achieved_rps', 0):,.1f} req/s "
              f"over {t.get('measured_window_s', 0):,.1f} s; {r.get('sent', 0):,} sent, {r.get('completed', 0):,} completed, "
              f"{r.get('errors', 0):,} errors, {r.get('dropped', 0):,} dropped."]
    machines = distributed_text(s.get("generator", {}))
    if machines:
        lines += ["", f"Generator: {md(machines)}" + "".join(f"; ⚠️ {md(lost)}" for lost in lost_texts(s["generator"])) + "."]
    slos = s.get("slo") or []
    if slos:
        lines += ["", *_table(["SLO", "metric", "class", "stat", "measured", "limit"], [
            ["✅ met" if x.get("passed") else "❌ missed", md(metric_label(x["metric"])), md(x["class"]),
             md(str(x["stat"]).removesuffix("_ms")), md(slo_value_text(str(x["stat"]), x.get("value"), fmt_ms)),
             ("≥ " if x.get("direction") == "min" else "≤ ") + md(slo_value_text(str(x["stat"]), x.get("limit"), fmt_ms))]
            for x in slos])]
    goodput = s.get("goodput") or {}
    if goodput:
        lines += ["", f"Goodput: {md(goodput_sentence(goodput.get('all', {})))}.", "",
                  *_table(["class", "objectives", "good / measured", "% good", "goodput req/s", "good output tokens/s"], [
                      [md(cls), md(objectives_text(g.get("objectives") or {})) if cls != "all" else "each class its own",
                       f"{g.get('good', 0):,} / {g.get('total', 0):,}",
                       "–" if g.get("fraction") is None else f"{g['fraction']:.1%}",
                       f"{g.get('rps', 0):,.1f}", f"{g.get('output_tokens_per_s', 0):,.1f}"] for cls, g in goodput.items()])]
    rows = [[md(metric_label(m)), md(cls), f"{st.get('count', 0):,}", *(fmt_ms(st.get(k)) for k, _ in PERCENTILE_COLUMNS)]
            for m in TABLE_METRICS for cls, st in s.get("metrics", {}).get(m, {}).items()]
    if rows:
        lines += ["", *_table(["metric", "class", "count", *(f"{label} ms" for _, label in PERCENTILE_COLUMNS)], rows)]
    fairness = fairness_lines(s.get("models") or {})  # classes that name different models
    if fairness:
        lines += ["", *(f"- {md(line)}" for line in fairness)]
    errors = {k: v for k, v in (s.get("errors") or {}).items() if v}
    if errors:
        examples = s.get("error_examples") or {}
        lines += ["", *_table(["error", "count", "example"], [
            [md(k), f"{v:,}", md(examples.get(k, [""])[0])[:300]] for k, v in errors.items()])]
    events = coldstart.capacity_events(s.get("cold_start"))
    if events:
        lines += ["", *(f"- {'🥶 cold' if e.get('cold') else 'capacity change'}: **{md(coldstart.title(e))}**: "
                        f"{md(coldstart.describe(e))}" for e in events)]
    if s.get("partial"):
        lines += ["", f"⚠️ Partial run: {md(s.get('abort_reason') or 'stopped early')}."]
    if report_name:
        lines += ["", f"Full report: `{report_name}`."]
    return "\n".join(lines) + "\n"
