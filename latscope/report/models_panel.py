"""The "Models" panel: a run whose classes name different models (adapters on one server, or models
behind one endpoint), each model's percentiles side by side, and the fairness line: how much worse
the worst model's p99 is than the best's under the same load (summary.json `models`, written by
analysis/models.py; this module only draws it).

The figure has one row per metric fairness was judged on (TTFT, TTFOT, latency), a group of bars
per model (p50, p90, p99). The tables: each model's classes and requests, and its percentiles. On
the compare page each model gets the base run's bars beside the new run's (faded), and the tables
are the new run's. Model and class names come from the scenario: escaped (esc_label in the figure,
esc_html in the tables and the lead).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.analysis.models import FAIRNESS_METRICS, fairness_lines
from latscope.report.escape import esc_html, esc_label
from latscope.report.figures import MARGIN, Panel, apply_layout
from latscope.report.words import fmt_ms
from latscope.results.schema import metric_label

STATS = (("p50_ms", "p50", "#2ca02c"), ("p90_ms", "p90", "#1f77b4"), ("p99_ms", "p99", "#ff7f0e"))
TABLE_STATS = (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p99.9_ms", "p99.9"), ("max_ms", "max"))


def models_panel(models: dict, base_models: dict | None = None, compare: bool = False) -> Panel:
    """`models`: summary.json's `models`; `base_models` the base run's on the compare page (`compare`).
    Neither with a mix: an empty Panel, which the page leaves out (html.page)."""
    panel = Panel("models", "Models: each model's latency under the same load")
    runs = [(m, label) for m, label in ((base_models, " (base)"), (models, " (new)" if compare else "")) if m]
    if not runs:  # a run with one model (the usual): no card, and nothing to name as not measured
        return panel
    metrics = [m for m in FAIRNESS_METRICS if any(f["metric"] == m for run, _ in runs for f in run.get("fairness", []))]
    metrics = metrics or ["latency"]
    fig = make_subplots(rows=len(metrics), cols=1, vertical_spacing=0.14,
                        subplot_titles=[f"{metric_label(m)} by model (ms)" for m in metrics])
    for row, metric in enumerate(metrics, start=1):
        for run, suffix in runs:
            faded = compare and suffix == " (base)"
            names = list(run["by_model"])
            for key, label, color in STATS:
                values = [run["by_model"][m]["metrics"].get(metric, {}).get(key) for m in names]
                name = f"{label}{suffix}"
                fig.add_trace(go.Bar(x=[esc_label(m) for m in names], y=values, name=name, marker_color=color,
                                     opacity=0.45 if faded else 1.0, legendgroup=name, showlegend=row == 1,
                                     hovertemplate=f"{label}{suffix}: %{{y:.2f}} ms<extra>%{{x}}</extra>"), row=row, col=1)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=row, col=1)
    fig.update_layout(barmode="group")
    panel.figure = apply_layout(fig, 240 * len(metrics) + 120, hovermode="closest", margin={**MARGIN, "t": 80},
                                legend=dict(orientation="h", yanchor="bottom", y=1.06, xanchor="left", x=0))
    lines = fairness_lines(models) if models else []
    if lines:
        panel.lead = "<p>" + "<br>".join(esc_html(line) for line in lines) + ".</p>"
    panel.note = ("Each model's statistics are those of its classes' histograms added together (lossless). The fairness "
                  "line compares the highest p99 with the lowest; its interval comes from each model's sample size: a p99 "
                  "has an upper confidence bound only from 368 requests on, and below 100 it is the model's slowest "
                  "request or next to it.")
    if models:
        panel.html = _tables(models) + ("<p class=\"note\">Tables: the new run.</p>" if compare else "")
    return panel


def _tables(models: dict) -> str:
    rows = "".join(
        f"<tr><td>{esc_html(m)}</td><td>{esc_html(', '.join(g['classes']))}</td>"
        f"<td class=n>{g['requests']['sent']:,}</td><td class=n>{g['requests']['completed']:,}</td>"
        f"<td class=n>{g['requests']['errors']:,}</td></tr>" for m, g in models["by_model"].items())
    requests = ("<table><tr><th>model</th><th>classes</th><th class=n>sent</th><th class=n>completed</th>"
                "<th class=n>errors</th></tr>" + rows + "</table>")
    head = "".join(f"<th class=n>{label} ms</th>" for _, label in TABLE_STATS)
    body = []
    for m, g in models["by_model"].items():
        for metric, s in g["metrics"].items():
            if s.get("count"):
                body.append(f"<tr><td>{esc_html(m)}</td><td>{esc_html(metric_label(metric))}</td><td class=n>{s['count']:,}</td>"
                            + "".join(f"<td class=n>{fmt_ms(s.get(k))}</td>" for k, _ in TABLE_STATS) + "</tr>")
    return (requests + f"<table class=\"models\"><tr><th>model</th><th>metric</th><th class=n>count</th>{head}</tr>"
            + "".join(body) + "</table>")
