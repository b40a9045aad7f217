"""The capacity page's figures, drawn from capacity.json (what `latscope capacity` wrote): one
latency–throughput curve per metric/class the steps measured, and goodput against offered load.

Why these: the knee is what a stakeholder came for. Latency percentiles against the rate the target
actually achieved show where the tail bends up; the SLO limits drawn across them and the capacity
(with its bracket) drawn down them say where the search put the line and why. Steps that failed,
were undecided or did not count keep their place on the plot with their own markers, so nothing the
search measured is hidden.

Nothing here computes a statistic: values, confidence bounds and verdicts are capacity.json's.
Every string from the scenario or the target (SLO names, class names, notes) goes through
`esc_label` before it reaches plotly (see report/escape.py).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import plotly.graph_objects as go

from latscope.report.escape import esc_html, esc_label
from latscope.report.figures import COLORS, STAT_STYLE, Panel, apply_layout, log_ticks
from latscope.results.schema import metric_label

# The percentiles' colours: the time panels' for p50, p99 and p99.9 (what capacity.json's curves
# hold), and their own for any other a curve carries (p90 when an SLO is on it).
STAT_COLORS = {**dict(STAT_STYLE.values()), "p90": "#1f77b4", "p95": "#9467bd", "max": "#7f7f7f"}
# How a step's marker looks: counted passes are plain, counted fails are crosses, and the steps that
# did not count (undecided and extended, undecided after every look, invalid, partial) are open symbols.
SYMBOLS = {"pass": "circle", "fail": "x", "undecided": "diamond-open", "invalid": "square-open",
           "partial": "triangle-up-open"}
CAPACITY_COLOR = "#18794e"
FAIL_COLOR = "#c62828"
UNDECIDED_COLOR = "#b7791f"
UNCOUNTED = "did not count (undecided, invalid, partial)"


def fmt_rate(value: float | None) -> str:
    """A rate with about three significant figures and at most one decimal from 10 up:
    0.412, 9.81, 99.3, 375, 387.5, 1,204.5."""
    if value is None or not math.isfinite(value):
        return "–"
    if value >= 10:
        return f"{value:,.1f}".removesuffix(".0")
    if value >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def step_words(step: dict) -> str:
    """A step in a few words for hover text (escaped for plotly): its rates, verdict and note."""
    verdict = str(step.get("verdict") or "?")
    counted = step.get("counted_as")
    how = f"counted as {counted}" if counted else "not counted"
    text = (f"step {esc_label(step.get('index', '?'))} · planned {fmt_rate(_num(step.get('rate_rps')))} req/s · "
            f"offered {fmt_rate(_num(step.get('offered_rps')))} · achieved {fmt_rate(_num(step.get('achieved_rps')))}"
            f"<br>{esc_label(verdict)} ({esc_label(how)})")
    if step.get("note"):
        text += f"<br>{esc_label(step['note'])}"
    if step.get("validity") not in (None, "valid"):
        reasons = "; ".join(str(r) for r in step.get("validity_reasons") or [])
        text += f"<br>measurement {esc_label(step['validity'])}" + (f": {esc_label(reasons)}" if reasons else "")
    return text


def _symbol(step: dict) -> str:
    if step.get("counted_as") == "fail":
        return SYMBOLS["fail"]
    if step.get("counted_as") == "pass":
        return SYMBOLS["pass"]
    return SYMBOLS.get(str(step.get("verdict")), "circle-open")


def mark_capacity(fig: go.Figure, capacity: dict) -> None:
    """The found capacity as a vertical line with the bracket shaded behind it; with no passing rate,
    the lowest failing rate as a red line instead."""
    bracket = capacity.get("bracket") or {}
    low, high = _num(bracket.get("low_rps")), _num(bracket.get("high_rps"))
    found = _num(capacity.get("max_rate_rps"))
    if low is not None and high is not None and high > low:
        fig.add_vrect(x0=low, x1=high, fillcolor=CAPACITY_COLOR, opacity=0.12, line_width=0, layer="below")
    u_low, u_high = _num(bracket.get("undecided_low_rps")), _num(bracket.get("undecided_high_rps"))
    if u_low is not None:  # schema 2: the rates the data could not decide, neither a pass nor a fail
        fig.add_vrect(x0=u_low, x1=u_high if u_high is not None and u_high > u_low else u_low * 1.002,
                      fillcolor=UNDECIDED_COLOR, opacity=0.18, line_width=0, layer="below")
    if found is not None:
        fig.add_vline(x=found, line=dict(color=CAPACITY_COLOR, width=2),
                      annotation=dict(text=f"capacity ≈ {fmt_rate(found)} req/s", font=dict(color=CAPACITY_COLOR)),
                      annotation_position="top left")
    elif high is not None:
        fig.add_vline(x=high, line=dict(color=FAIL_COLOR, width=2, dash="dot"),
                      annotation=dict(text=f"SLOs fail at {fmt_rate(high)} req/s", font=dict(color=FAIL_COLOR)),
                      annotation_position="top right")


def curve_keys(steps: Iterable[dict], slos: Iterable[dict]) -> list[str]:
    """Every metric/class some step has percentiles for, in the order first seen, those an SLO is
    about first."""
    seen: dict[str, None] = {}
    for step in steps:
        for key in step.get("percentiles") or {}:
            seen.setdefault(key)
    about = {f"{s.get('metric')}/{s.get('class')}" for s in slos}
    return sorted(seen, key=lambda k: k not in about)


def _interval(point: dict) -> str:
    low, high = _num(point.get("low_ms")), _num(point.get("high_ms"))
    if low is None and high is None:
        return "(no CI: too few samples)"
    return f"[{'–' if low is None else f'{low:.3g}'}–{'–' if high is None else f'{high:.3g}'}]"


def _stat_trace(points: list[tuple[dict, dict]], stat: str, color: str, counted: bool, show_legend: bool) -> go.Scatter:
    """One percentile over some steps: (step, {value_ms, low_ms, high_ms}) sorted by achieved rate,
    with the confidence interval as asymmetric whiskers (none where it has no bound)."""
    x = [float(s["achieved_rps"]) for s, _ in points]
    y = [float(p["value_ms"]) for _, p in points]
    up = [None if _num(p.get("high_ms")) is None else max(0.0, p["high_ms"] - p["value_ms"]) for _, p in points]
    down = [None if _num(p.get("low_ms")) is None else max(0.0, p["value_ms"] - p["low_ms"]) for _, p in points]
    name = esc_label(stat)
    hover = [f"{name} {p['value_ms']:.3g} ms {_interval(p)}<br>{step_words(s)}" for s, p in points]
    symbols = [_symbol(s) for s, _ in points]
    return go.Scatter(
        x=x, y=y, mode="lines+markers" if counted else "markers", name=name if counted else UNCOUNTED,
        legendgroup=name if counted else "uncounted", showlegend=show_legend,
        line=dict(color=color, width=2.5 if stat == "p99" else 1.8),
        marker=dict(color=color, symbol=symbols, size=[12 if m == "x" else 9 for m in symbols], line=dict(width=1.5, color=color),
                    opacity=1.0 if counted else 0.75),
        error_y=dict(type="data", symmetric=False, array=up, arrayminus=down, color=color, thickness=1.2, width=4),
        customdata=hover, hovertemplate="%{customdata}<extra></extra>")


def _curve_slos(key: str, slos: list[dict]) -> list[dict]:
    """The SLOs on this metric/class with a limit in ms (those a latency curve can show)."""
    return [slo for slo in slos if f"{slo.get('metric')}/{slo.get('class')}" == key
            and _num(slo.get("limit")) is not None and slo.get("unit", "ms") == "ms"]


def _slo_lines(fig: go.Figure, slos: list[dict], log: bool) -> None:
    """Each SLO as a dashed horizontal line labelled "p99 ≤ 40 ms". The label is an annotation of its
    own: on a log axis an annotation's y is the log of the value (a shape's is the value)."""
    for slo in slos:
        limit = float(slo["limit"])
        sign = "≥" if slo.get("bound") == "min" else "≤"
        color = STAT_COLORS.get(str(slo.get("stat")), "#555")
        fig.add_hline(y=limit, line=dict(color=color, width=1.5, dash="dash"))
        fig.add_annotation(x=0, xref="x domain", y=math.log10(limit) if log and limit > 0 else limit, yref="y",
                           text=f"{esc_label(slo.get('stat', ''))} {sign} {limit:g} ms", font=dict(color=color),
                           showarrow=False, xanchor="left", yanchor="bottom")


def _percentile_order(stat: str) -> float:
    """Where a statistic sits among percentiles: p50 → 50, p99.9 → 99.9, max → 100, others last."""
    if stat == "max":
        return 100.0
    try:
        return float(stat.removeprefix("p"))
    except ValueError:
        return 101.0


def curve_stats(steps: list[dict], key: str) -> list[tuple[str, str]]:
    """(statistic, colour) for each percentile some step has for `key`, in percentile order:
    capacity.json's p50, p99, p99.9, and any other it carries."""
    stats = {stat for s in steps for stat in ((s.get("percentiles") or {}).get(key) or {})}
    ordered = sorted(stats, key=lambda stat: (_percentile_order(stat), stat))
    return [(stat, STAT_COLORS.get(stat, COLORS[i % len(COLORS)])) for i, stat in enumerate(ordered)]


def curve_panel(number: int, key: str, capacity: dict) -> Panel:
    """Each percentile of `key` ("latency/all": p50, p99, p99.9) against the achieved rate, one
    point per step."""
    metric, _, cls = key.partition("/")
    label = f"{metric_label(metric)}" + (f" · {cls}" if cls else "")
    steps = [s for s in capacity.get("steps") or [] if _num(s.get("achieved_rps")) is not None]
    stats = curve_stats(steps, key)
    names = ", ".join(esc_html(stat) for stat, _ in stats) or "percentiles"
    panel = Panel(f"curve-{number}", f"{esc_html(label)}: {names} against the achieved rate")
    fig = go.Figure()
    values: list[float] = []
    uncounted_traces = []
    for stat, color in stats:
        points = sorted(((s, p) for s in steps if (p := ((s.get("percentiles") or {}).get(key) or {}).get(stat))
                         and _num(p.get("value_ms")) is not None), key=lambda sp: sp[0]["achieved_rps"])
        counted = [sp for sp in points if sp[0].get("counted_as") in ("pass", "fail")]
        uncounted = [sp for sp in points if sp[0].get("counted_as") not in ("pass", "fail")]
        values += [p["value_ms"] for _, p in points]
        if counted:
            fig.add_trace(_stat_trace(counted, stat, color, True, True))
        if uncounted:
            uncounted_traces.append(_stat_trace(uncounted, stat, color, False, not uncounted_traces))
    for trace in uncounted_traces:  # after the percentiles, so the legend reads p50, p99, p99.9, then these
        fig.add_trace(trace)
    if not values:
        panel.note = f"No step measured {esc_html(label)} percentiles."
        return panel
    slos = _curve_slos(key, capacity.get("slos") or [])
    positive = np.asarray([v for v in values + [float(s["limit"]) for s in slos] if v > 0])
    log = bool(len(positive)) and positive.max() / positive.min() > 20
    _slo_lines(fig, slos, log)
    mark_capacity(fig, capacity)
    unit = f"{metric_label(metric)} (ms)"
    if log:
        fig.update_yaxes(title_text=unit + ", log scale", type="log", **log_ticks(positive))
    else:
        fig.update_yaxes(title_text=unit, rangemode="tozero")
    fig.update_xaxes(title_text="achieved rate (req/s, completed without error)", rangemode="tozero")
    panel.figure = apply_layout(fig, 440, hovermode="closest")
    panel.note = ("One point per step; whiskers: the confidence interval. Crosses: steps counted as a fail; open "
                  "symbols: steps that did not count or stayed undecided. Green: the capacity (highest planned rate that "
                  "passed every SLO with confidence), the band: the bracket the true capacity lies in; amber: rates "
                  "still undecided after every look (neither a pass nor a fail).")
    return panel


def goodput_panel(capacity: dict) -> Panel:
    """Good requests per second against the offered rate, beside the line y = x where every request
    is good: where the points leave it, load turns into waste."""
    panel = Panel("goodput", "Goodput: good requests per second against the offered rate")
    steps = sorted((s for s in capacity.get("steps") or [] if s.get("goodput") and _num(s.get("offered_rps")) is not None
                    and _num((s.get("goodput") or {}).get("rps")) is not None), key=lambda s: s["offered_rps"])
    if not steps:
        panel.note = "No step measured goodput."
        return panel
    fig = go.Figure()
    top = max(max(s["offered_rps"] for s in steps), max(s["goodput"]["rps"] for s in steps))
    fig.add_trace(go.Scatter(x=[0, top * 1.05], y=[0, top * 1.05], mode="lines", name="every request good (y = x)",
                             line=dict(color="#999", dash="dash", width=1.5), hoverinfo="skip"))
    achieved = [s for s in steps if _num(s.get("achieved_rps")) is not None]
    if achieved:
        fig.add_trace(go.Scatter(x=[s["offered_rps"] for s in achieved], y=[s["achieved_rps"] for s in achieved],
                                 mode="lines+markers", name="achieved (completed without error)",
                                 line=dict(color="#7f7f7f", width=1.2, dash="dot"), marker=dict(size=5),
                                 hovertemplate="achieved %{y:.1f} req/s<extra></extra>"))
    hover = [f"goodput {fmt_rate(s['goodput']['rps'])} req/s of {fmt_rate(s['offered_rps'])} offered"
             + (f" ({s['goodput']['fraction']:.1%} good)" if _num(s["goodput"].get("fraction")) is not None else "")
             + f"<br>{step_words(s)}" for s in steps]
    symbols = [_symbol(s) for s in steps]
    fig.add_trace(go.Scatter(x=[s["offered_rps"] for s in steps], y=[s["goodput"]["rps"] for s in steps],
                             mode="lines+markers", name="goodput", line=dict(color="#1f77b4", width=2.5),
                             marker=dict(symbol=symbols, size=[12 if m == "x" else 9 for m in symbols],
                                         line=dict(width=1.5, color="#1f77b4")),
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    for slo in capacity.get("slos") or []:
        if slo.get("metric") == "goodput" and slo.get("stat") == "rps" and _num(slo.get("limit")) is not None:
            sign = "≤" if slo.get("bound") == "max" else "≥"
            fig.add_hline(y=slo["limit"], line=dict(color="#1f77b4", width=1.5, dash="dash"),
                          annotation=dict(text=f"goodput {sign} {fmt_rate(slo['limit'])} req/s"), annotation_position="top left")
    mark_capacity(fig, capacity)
    fig.update_xaxes(title_text="offered rate (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="good requests per second", rangemode="tozero")
    panel.figure = apply_layout(fig, 400, hovermode="closest")
    panel.note = "Hover a point for the fraction of requests that were good. Symbols as on the curves above."
    return panel
