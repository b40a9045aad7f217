"""One function per report panel: analysis outputs in, a plotly figure out.

Nothing here computes a statistic: percentiles, cold starts, the serialization breakdown and the
deltas come from latscope.analysis; this module only chooses how to draw them. A panel without data
comes back as a `Panel` with no figure and a one-line `note` saying why, so the page can say so
instead of drawing an empty plot; a panel whose whole subject the run did not measure (no streamed
tokens, no GPU telemetry, no Server-Timing parts) also sets `not_measured`, a short phrase the page
gathers into one "Not measured in this run" line instead of drawing its card.

Every string that came from a scenario or a target (class, phase and replica names, error
messages) goes through `esc_label` (report/escape.py) before it reaches plotly: plotly renders a
subset of HTML tags in titles, legends, annotations and hover labels, and decodes entities, so
escaped text displays as written and never as markup. Where such text lands in this module's own
HTML (tables, the cold-start list, validity reasons) it is HTML text, never an attribute value, so
`esc_label` is enough there too; the one attribute value, the validity badge's class, goes through
`esc_html`. The event labels on the time plots come from report/words.py's `event_label`, escaped
there with `esc_label`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.report.escape import esc_html, esc_label
from latscope.report.words import event_label
from latscope.results.schema import TELEMETRY_METRICS, metric_label

# Figure geometry shared by every time-axis panel, so their x axes line up down the page.
MARGIN = dict(l=80, r=40, t=50, b=50)
TIME_AXIS = "time since the run started (s)"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
STAT_STYLE = {"p50_ms": ("p50", "#2ca02c"), "p99_ms": ("p99", "#ff7f0e"), "p99.9_ms": ("p99.9", "#d62728")}
# Events drawn as vertical lines on the time panels; the others (run start/end, target launch and
# stop, phase starts — phases are drawn as bands) would only add clutter.
QUIET_EVENTS = {"run_start", "run_end", "phase_start", "target_launch", "target_ready", "target_stopped",
                "action_end", "action_skipped"}  # an action is drawn once, at its action_start
MAX_EVENT_LINES = 25
STREAMING_METRICS = (("ttft", "time to first token"), ("itl", "inter-token latency"), ("tpot", "time per output token"),
                     ("ttfot", "time to first output token"), ("reasoning_time", "first token → first answer token"))
# GPU lanes, in page order; mem_util_pct stands in for mem_bw_util_pct only when the latter is absent.
GPU_LANES = ("gpu_util_pct", "mem_bw_util_pct", "mem_util_pct", "sm_active_pct", "mem_used_bytes", "power_w")


@dataclass
class Panel:
    id: str  # the plot div's id (and the section's anchor)
    title: str  # trusted text (written here), not escaped again
    figure: go.Figure | None = None
    note: str = ""  # trusted HTML: one line shown under the title, or instead of the plot when figure is None
    html: str = ""  # trusted HTML shown after the plot (tables)
    lead: str = ""  # trusted HTML shown before the plot (a verdict the plot explains)
    # Trusted text, set only when the run did not measure what the panel shows ("GPU telemetry"): the
    # page then names it in its one "Not measured" line (with `note`, which says how to get it) and draws no card.
    not_measured: str = ""


def log_ticks(values) -> dict:
    """Explicit 1-2-5 ticks for a log axis over `values`, each labelled in full ("50", "200",
    "1,000"): plotly's own minor labels ("5" for 50) are easy to misread."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return {}
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(v.min())) - 1, math.ceil(math.log10(v.max())) + 1)
             for m in (1, 2, 5)]
    ticks = [t for t in ticks if v.min() / 2.5 <= t <= v.max() * 2.5]
    return dict(tickvals=ticks, ticktext=[f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in ticks])


def apply_layout(fig: go.Figure, height: int, **kwargs) -> go.Figure:
    settings = dict(height=height, margin=MARGIN, template="plotly_white", hovermode="x unified",
                    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    fig.update_layout(**{**settings, **kwargs})
    return fig


def _sides(new: object, base: object, compare: bool) -> list[tuple[object, str | None, str]]:
    """(data, line dash, legend suffix) per run to draw: the run alone, or base (dashed) then new (solid)."""
    return [(base, "dash", " (base)"), (new, None, " (new)")] if compare else [(new, None, "")]


# -- percentile spectrum -------------------------------------------------------------------------

PERCENTILE_TICKS = ((1, "0%"), (2, "50%"), (4, "75%"), (10, "90%"), (20, "95%"), (100, "99%"), (1e3, "99.9%"),
                    (1e4, "99.99%"), (1e5, "99.999%"), (1e6, "99.9999%"), (1e7, "99.99999%"))


def _spectrum_x(df: pd.DataFrame) -> np.ndarray:
    """1/(1−p) for each percentile; the max (p = 100) sits at the rank of the last sample, N (the
    last row's `count`: analysis gives, as HdrHistogram does, the count of values at or below each)."""
    p = df["percentile"].to_numpy(float) / 100.0
    count = float(df["count"].iloc[-1]) if "count" in df and len(df) else 1.0
    with np.errstate(divide="ignore"):
        x = 1.0 / (1.0 - p)
    return np.where(p >= 1.0, max(count, 1.0), x)


def _percentile_label(p: float) -> str:
    return "max" if p >= 100 else f"p{p:g}"


def _add_spectrum(fig: go.Figure, spectra: dict[str, pd.DataFrame], row: int | None = None, col: int | None = None,
                  dash: str | None = None, suffix: str = "", show_legend: bool = True, colors: dict | None = None) -> float:
    """Lines per class on the 1/(1−p) axis; returns the largest x drawn."""
    xmax = 2.0
    for i, (cls, df) in enumerate(sorted(spectra.items(), key=lambda kv: (kv[0] != "all", kv[0]))):
        if df.empty:
            continue
        x = _spectrum_x(df)
        xmax = max(xmax, float(x.max()))
        labels = [_percentile_label(p) for p in df["percentile"]]
        color = (colors or {}).get(cls, COLORS[i % len(COLORS)])
        trace = go.Scatter(
            x=x, y=df["value_ms"].to_numpy(float), mode="lines+markers", name=esc_label(cls) + suffix,
            line=dict(color=color, width=3 if cls == "all" else 1.8, dash=dash), marker=dict(size=5),
            customdata=labels, hovertemplate="%{customdata}: %{y:.3f} ms",
            legendgroup=esc_label(cls), showlegend=show_legend,
        )
        fig.add_trace(trace, row=row, col=col) if row else fig.add_trace(trace)
    return xmax


def _spectrum_axes(fig: go.Figure, xmax: float, values: np.ndarray, unit_title: str, row=None, col=None) -> None:
    ticks = [(v, t) for v, t in PERCENTILE_TICKS if v <= xmax * 1.01]
    kw = dict(row=row, col=col) if row else {}
    fig.update_xaxes(type="log", tickvals=[v for v, _ in ticks], ticktext=[t for _, t in ticks],
                     title_text="percentile (log scale of 1/(1−p))", range=[0, math.log10(xmax * 1.3)], **kw)
    positive = values[np.isfinite(values) & (values > 0)]
    log = bool(len(positive)) and positive.max() / positive.min() > 20
    if log:
        fig.update_yaxes(title_text=unit_title + ", log scale", type="log", **log_ticks(positive), **kw)
    else:
        fig.update_yaxes(title_text=unit_title, rangemode="tozero", **kw)


def _values(*spectra: dict[str, pd.DataFrame]) -> np.ndarray:
    arrays = [df["value_ms"].to_numpy(float) for sp in spectra for df in sp.values() if not df.empty]
    return np.concatenate(arrays) if arrays else np.array([])


def spectrum_panel(spectra: dict[str, pd.DataFrame], base_spectra: dict[str, pd.DataFrame] | None = None) -> Panel:
    """Latency per class on the 1/(1−p) axis. With base_spectra, the base run's too: each class keeps
    one colour, dashed for the base run, solid for the new one."""
    compare = base_spectra is not None
    panel = Panel("spectrum", "Latency percentile spectrum" + (": base (dashed) vs new (solid)" if compare else ""))
    if not spectra and not base_spectra:
        panel.note = ("No latency was recorded outside warm-up (no request completed), so there is no spectrum." if not compare
                      else "Neither run recorded latency outside warm-up.")
        return panel
    fig = go.Figure()
    classes = sorted(set(spectra) | set(base_spectra or {}), key=lambda c: (c != "all", c))
    colors = {c: COLORS[i % len(COLORS)] for i, c in enumerate(classes)}
    xmax = 2.0
    for frames, dash, suffix in _sides(spectra, base_spectra, compare):
        xmax = max(xmax, _add_spectrum(fig, frames, dash=dash, suffix=suffix, colors=colors))
    _spectrum_axes(fig, xmax, _values(spectra, base_spectra or {}), "latency (ms)")
    panel.figure = apply_layout(fig, 440 if compare else 420, hovermode="closest")
    panel.note = ("Latency at each percentile, whole run without warm-up, per request class. The x axis "
                  "stretches the tail: each step right is ten times rarer (99% = 1 request in 100, 99.9% = 1 in 1,000). "
                  "The last point of each line is the slowest request."
                  + (" Each class has one colour, dashed for the base run, solid for the new one." if compare else ""))
    return panel


def streaming_panel(spectra_by_metric: dict[str, dict[str, pd.DataFrame]], compare_with: dict | None = None) -> Panel:
    """TTFT / ITL / TPOT spectra side by side (only the metrics the run recorded)."""
    panel = Panel("streaming", "Streaming: time to first token, inter-token latency, time per output token")
    present = [(m, label) for m, label in STREAMING_METRICS
               if spectra_by_metric.get(m) or (compare_with or {}).get(m)]
    if not present:
        panel.note = ("This run recorded no streamed tokens (TTFT, ITL and TPOT come from streaming responses, e.g. protocol: openai with stream: true)."
                      if compare_with is None else "Neither run recorded streamed tokens (TTFT, ITL and TPOT come from streaming responses).")
        panel.not_measured = "token streams (TTFT, ITL, TPOT)"
        return panel
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=[f"{metric_label(m)}: {label}" for m, label in present],
                        horizontal_spacing=0.08)
    classes = sorted({c for m, _ in present for src in (spectra_by_metric, compare_with or {}) for c in src.get(m, {})},
                     key=lambda c: (c != "all", c))
    colors = {c: COLORS[i % len(COLORS)] for i, c in enumerate(classes)}
    for i, (metric, _) in enumerate(present, start=1):
        xmax = 2.0
        if compare_with is not None:
            xmax = _add_spectrum(fig, compare_with.get(metric, {}), row=1, col=i, dash="dash", suffix=" (base)",
                                 show_legend=i == 1, colors=colors)
        xmax = max(xmax, _add_spectrum(fig, spectra_by_metric.get(metric, {}), row=1, col=i, show_legend=i == 1,
                                       suffix=" (new)" if compare_with is not None else "", colors=colors))
        _spectrum_axes(fig, xmax, _values(spectra_by_metric.get(metric, {}), (compare_with or {}).get(metric, {})),
                       f"{metric_label(metric)} (ms)", row=1, col=i)
    fig.update_xaxes(title_text="percentile")
    panel.figure = apply_layout(fig, 420, hovermode="closest", margin={**MARGIN, "t": 90},
                           legend=dict(orientation="h", yanchor="bottom", y=1.12, xanchor="left", x=0))
    panel.note = ("Per class, whole run without warm-up, on the same percentile axis as the latency spectrum. TTFT runs from "
                  "the request's intended send time; ITL is every gap between streamed chunks; TPOT is (end − first token) / (tokens − 1).")
    if any(m in ("ttfot", "reasoning_time") for m, _ in present):
        panel.note += (" A reasoning model's first tokens are its reasoning: TTFT counts them, TTFOT (time to first output "
                       "token) runs to the answer's first token, and the reasoning time is the span between.")
    return panel


# -- over time -----------------------------------------------------------------------------------

def f32(values) -> np.ndarray:
    """Plot data as float32: plotly embeds numpy arrays as base64, so this halves the page's data
    (7 significant digits are far more than a plot shows)."""
    return np.asarray(values, dtype=np.float32)


def _time_x(df: pd.DataFrame, interval_s: float) -> np.ndarray:
    return f32(df["t_s"].to_numpy(float) + interval_s / 2)  # the middle of each interval


def add_phases_and_events(fig: go.Figure, summary: dict, events: list[dict], label_phases: bool = True) -> None:
    """Phase bands (warm-up grey, the others in alternating light tints, each named once at the top
    of the figure) and vertical lines for the run's events (new replicas, scale actions, aborts).
    Shapes span the whole figure height (yref "paper"), so one set serves every row of a figure whose
    rows share the time axis; they are added in one layout update (plotly's add_vrect/add_vline per
    shape and row cost seconds on a long run)."""
    shapes, annotations = [], []
    total = _time_range(summary)[1]
    for i, phase in enumerate(summary.get("phases", [])):
        start, end = phase["start_s"], phase["start_s"] + phase["duration_s"]
        warm = phase.get("warmup")
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=start, x1=end, y0=0, y1=1, line_width=0, layer="below",
                           fillcolor="#999999" if warm else ("#4c78a8" if i % 2 else "#72b7b2"), opacity=0.16 if warm else 0.07))
        # A band narrower than 7% of the axis has no room for its name without running into the
        # next one's (a 1-minute warm-up in a 1-hour run): it stays unlabelled; the note says grey is warm-up.
        if label_phases and (end - start) / total >= 0.07:
            wide = (end - start) / total > 0.25
            text = esc_label(phase["name"]) + (" (warm-up, not counted)" if warm and wide else " (warm-up)" if warm else "")
            annotations.append(dict(x=start, y=1, xref="x", yref="paper", text=text, showarrow=False, xanchor="left",
                                    yanchor="top", font=dict(size=10, color="#555"), bgcolor="rgba(255,255,255,0.6)"))
    shown = [e for e in events if e.get("t_s") is not None and e.get("event") not in QUIET_EVENTS]
    failed = {e.get("name") for e in events if e.get("event") == "action_end" and not e.get("ok", True)}
    for e in shown[:MAX_EVENT_LINES]:
        kind = e["event"]
        action_failed = kind == "action_start" and e.get("name") in failed  # scenario actions: red when they failed
        text = event_label(e, action_failed)  # escaped (esc_label) and cut at 80 characters
        color = "#d62728" if kind == "abort" or action_failed else "#2ca02c" if kind == "action_start" else "#7f7f7f"
        shapes.append(dict(type="line", xref="x", yref="paper", x0=e["t_s"], x1=e["t_s"], y0=0, y1=1,
                           line=dict(color=color, width=1, dash="dot")))
        annotations.append(dict(x=e["t_s"], y=0.02, xref="x", yref="paper", text=text, showarrow=False, textangle=-90,
                                xanchor="left", yanchor="bottom", font=dict(size=10, color=color)))
    fig.update_layout(shapes=[*fig.layout.shapes, *shapes], annotations=[*fig.layout.annotations, *annotations])


def _time_range(*summaries: dict | None) -> list[float]:
    """[0, the end of the longest of the runs]: on a compare page each run is drawn on its own clock."""
    end = max([p["start_s"] + p["duration_s"] for s in summaries if s for p in s.get("phases", [])]
              + [(s or {}).get("duration_s") or 0 for s in summaries] + [1])
    return [0, end]


def latency_time_panel(by_class: dict[str, pd.DataFrame], summary: dict, events: list[dict],
                       base_by_class: dict[str, pd.DataFrame] | None = None, base_summary: dict | None = None) -> Panel:
    """p50/p99/p99.9 per interval for all classes; p99 of each class dotted when there are several.
    With base_summary, the base run's all-class lines are drawn too (dashed; per-class lines are left
    to each run's own report: six of them per class would bury the comparison)."""
    compare = base_summary is not None
    panel = Panel("latency-time", "Latency over time" + (": base (dashed) vs new (solid)" if compare else ""))
    sides = [(frames.get("all") if frames else None, s, dash, suffix)
             for (frames, s), dash, suffix in _sides((by_class, summary), (base_by_class, base_summary), compare)]
    sides = [side for side in sides if _has_intervals(side[0])]
    if not sides:
        panel.note = ("No request completed, so there is no latency to plot over time." if not compare
                      else "Neither run completed a request, so there is no latency to plot over time.")
        return panel
    fig = go.Figure()
    for overall, s, dash, suffix in sides:
        interval = s.get("generator", {}).get("interval_s") or 1.0
        for stat, (label, color) in STAT_STYLE.items():
            name = label + (suffix or " (all classes)")
            fig.add_trace(go.Scatter(x=_time_x(overall, interval), y=f32(overall[stat]), name=name, mode="lines+markers",
                                     marker=dict(size=4), line=dict(color=color, width=2, dash=dash), hovertemplate=f"{name} %{{y:.2f}} ms"))
    classes = [c for c in by_class if c != "all"]
    if len(classes) > 1 and not compare:
        interval = summary.get("generator", {}).get("interval_s") or 1.0
        for i, cls in enumerate(classes):
            df = by_class[cls]
            fig.add_trace(go.Scatter(x=_time_x(df, interval), y=f32(df["p99_ms"]), name=f"p99 {esc_label(cls)}", mode="lines",
                                     line=dict(color=COLORS[(i + 4) % len(COLORS)], width=1.2, dash="dot"),
                                     hovertemplate=f"p99 {esc_label(cls)} %{{y:.2f}} ms", visible="legendonly" if len(classes) > 4 else True))
    add_phases_and_events(fig, summary, events)
    values = np.concatenate([overall[["p50_ms", "p99.9_ms"]].to_numpy(float).ravel() for overall, *_ in sides])
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > 20:
        fig.update_yaxes(title_text="latency per interval (ms), log scale", type="log", **log_ticks(values))
    else:
        fig.update_yaxes(title_text="latency per interval (ms)", rangemode="tozero")
    fig.update_xaxes(title_text=TIME_AXIS, range=_time_range(summary, base_summary))
    panel.figure = apply_layout(fig, 400)
    interval = summary.get("generator", {}).get("interval_s") or 1.0
    panel.note = (f"Percentiles of the requests that completed in each {interval:g} s interval, measured from each "
                  "request's intended send time. Shaded bands are the scenario's phases (grey: warm-up, not counted in the "
                  "tables); dotted vertical lines are events such as a new replica."
                  + (" All classes; each run on its own clock (seconds since it started); bands and events are the new run's."
                     if compare else ""))
    return panel


def load_time_panel(overall: pd.DataFrame, summary: dict, events: list[dict], base_overall: pd.DataFrame | None = None,
                    base_summary: dict | None = None) -> Panel:
    """Offered vs achieved rate, requests in flight, errors — per interval, one shared time axis.
    With base_summary, the base run's lines too (dashed; its error bars lighter)."""
    compare = base_summary is not None
    panel = Panel("load-time", "Load: offered vs achieved rate, in flight, errors" + (": base (dashed) vs new (solid)" if compare else ""))
    sides = [side for side in _sides((overall, summary), (base_overall, base_summary), compare)
             if side[0][0] is not None and not side[0][0].empty]
    if not sides:
        panel.note = ("The run has no intervals (it stopped before the first one ended)." if not compare
                      else "Neither run has intervals (both stopped before the first one ended).")
        return panel
    has_errors = any(bool(df["errors"].fillna(0).sum()) for (df, _), *_ in sides)
    rows = 3 if has_errors else 2
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.05, row_heights=[0.5, 0.25, 0.25][:rows])
    for (df, s), dash, suffix in sides:
        interval = s.get("generator", {}).get("interval_s") or 1.0
        x = _time_x(df, interval)
        # Alone, offered is the dashed line; on a compare page dashes mean "base", and colour tells offered from achieved.
        fig.add_trace(go.Scatter(x=x, y=f32(df["scheduled"] / interval), name=f"offered (scheduled){suffix}", mode="lines",
                                 line=dict(color="#7f7f7f", width=2, dash=dash if compare else "dash"),
                                 hovertemplate=f"offered{suffix} %{{y:.1f}}/s"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=f32(df["completed"] / interval), name=f"achieved (completed){suffix}", mode="lines",
                                 line=dict(color="#1f77b4", width=2, dash=dash), hovertemplate=f"achieved{suffix} %{{y:.1f}}/s"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=f32(df["in_flight"]), name=f"in flight (at interval end){suffix}", mode="lines",
                                 line=dict(color="#9467bd", width=1.5, shape="hv", dash=dash), hovertemplate=f"in flight{suffix} %{{y:.0f}}"),
                      row=2, col=1)
        if has_errors:
            fig.add_trace(go.Bar(x=x, y=f32(df["errors"] / interval), name=f"errors{suffix}", marker_color="#ff9896" if dash else "#d62728",
                                 hovertemplate=f"errors{suffix} %{{y:.1f}}/s"), row=3, col=1)
    add_phases_and_events(fig, summary, events, label_phases=True)
    fig.update_yaxes(title_text="requests/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="in flight", rangemode="tozero", row=2, col=1)
    if has_errors:
        fig.update_yaxes(title_text="errors/s", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(range=_time_range(summary, base_summary))
    fig.update_xaxes(title_text=TIME_AXIS, row=rows, col=1)
    panel.figure = apply_layout(fig, 520 if has_errors else 440)
    panel.note = ("Offered is what the schedule asked for in each interval (open loop: it never waits for the server); "
                  "achieved is what completed. A gap between them, with in-flight requests piling up, is the server falling behind."
                  + ("" if has_errors else " No request failed." if not compare else " Neither run had a failed request.")
                  + (" Each run on its own clock; bands and events are the new run's; the base run's error bars are the lighter ones."
                     if compare else ""))
    return panel


VERDICTS = {"valid": "the generator kept to the schedule: these numbers describe the target.",
            "degraded": "the generator was late at times; the latencies are still honest (measured from the intended send "
                        "time) but the offered load was not quite the planned one.",
            "invalid": "the generator could not keep to the schedule: the load generator, not the target, shaped the traffic."}


def validity_stamp(summary: dict) -> str:
    """The run's validity as a coloured badge (trusted HTML; the value itself is escaped)."""
    stamp = summary.get("validity", "unknown")
    return f'<span class="stamp {esc_html(stamp)}">measurement {esc_label(stamp)}</span>'


def _validity_lead(summary: dict, who: str = "") -> str:
    reasons = summary.get("validity_reasons") or []
    verdict = VERDICTS.get(summary.get("validity", "unknown"), "")
    return (f"<p>{who}{validity_stamp(summary)} — {verdict}</p>"
            + ("<ul>" + "".join(f"<li>{esc_label(r)}</li>" for r in reasons) + "</ul>" if reasons else ""))


def _host_cpu(telemetry: pd.DataFrame | None) -> pd.DataFrame:
    if telemetry is None or not len(telemetry):
        return pd.DataFrame()
    return telemetry[(telemetry["metric"] == "cpu_pct") & (telemetry["source"] == "host")]


def _has_intervals(df: pd.DataFrame | None) -> bool:
    return df is not None and not df.empty and bool(df["count"].fillna(0).gt(0).any())


def generator_panel(send_lag: pd.DataFrame | None, loop_lag: pd.DataFrame | None, summary: dict,
                    telemetry: pd.DataFrame | None = None, base_send_lag: pd.DataFrame | None = None,
                    base_loop_lag: pd.DataFrame | None = None, base_summary: dict | None = None,
                    base_telemetry: pd.DataFrame | None = None, extra: Sequence[tuple[str, go.Scatter]] = ()) -> Panel:
    """The load generator's own health: did requests leave on time, and were its processes short of CPU?
    With base_summary, the base run's lags and CPU are drawn too (dashed) and both runs' validity stamps lead.
    `extra`: more traces, each with the row it belongs to ("lag" or "cpu"): a distributed run's lines per
    machine (report/nodes_panel.py), drawn after the run's own."""
    compare = base_summary is not None
    panel = Panel("generator", "Generator health: send lag, event-loop lag, CPU" + (": base (dashed) vs new (solid)" if compare else ""))
    panel.lead = (_validity_lead(base_summary, "<b>base</b> ") + _validity_lead(summary, "<b>new</b> ") if compare
                  else _validity_lead(summary))
    sides = [(lags, cpu, s, dash, suffix) for (lags, cpu, s), dash, suffix in _sides(
        ((send_lag, loop_lag), _host_cpu(telemetry), summary), ((base_send_lag, base_loop_lag), _host_cpu(base_telemetry), base_summary),
        compare)]
    have_lag = any(_has_intervals(df) for lags, *_ in sides for df in lags) or any(row == "lag" for row, _ in extra)
    host_cpu = any(not cpu.empty for _, cpu, *_ in sides)
    have_cpu = host_cpu or any(row == "cpu" for row, _ in extra)
    if not have_lag and not have_cpu:
        panel.note = "The run recorded no send or loop lag." if not compare else "Neither run recorded send or loop lag."
        return panel
    rows = 2 if have_lag and have_cpu else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4][:rows])
    devices = sorted({d for _, cpu, *_ in sides if not cpu.empty for d in cpu["device"].unique()}, key=str)
    cpu_colors = {d: COLORS[(i + 2) % len(COLORS)] for i, d in enumerate(devices)}
    for (send, loop), cpu, s, dash, suffix in sides:
        interval = s.get("generator", {}).get("interval_s") or 1.0
        for (name, df), color in zip((("send lag p99", send), ("event-loop lag p99", loop)), ("#1f77b4", "#ff7f0e")):
            if not _has_intervals(df):
                continue
            worst = name.replace("p99", "max")
            fig.add_trace(go.Scatter(x=_time_x(df, interval), y=f32(df["p99_ms"]), name=name + suffix, mode="lines",
                                     line=dict(color=color, width=1.8, dash=dash), hovertemplate=f"{name}{suffix} %{{y:.3f}} ms"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=_time_x(df, interval), y=f32(df["max_ms"]), name=worst + suffix, mode="lines",
                                     # the base run's max dash-dotted, the new run's dotted: both thin, told apart
                                     line=dict(color=color, width=1, dash="dashdot" if dash else "dot"),
                                     visible="legendonly" if compare else True, hovertemplate=f"{worst}{suffix} %{{y:.3f}} ms"),
                          row=1, col=1)
        for device, df in (cpu.groupby("device", sort=True) if not cpu.empty else ()):
            name = ("CPU whole machine" if device == "system" else f"CPU {esc_label(device)}") + suffix
            fig.add_trace(go.Scatter(x=f32(df["t_s"]), y=f32(df["value"]), name=name, mode="lines",
                                     line=dict(color=cpu_colors[device], width=1.2, dash=dash), hovertemplate=f"{name} %{{y:.0f}}%"),
                          row=rows, col=1)
    for row, trace in extra:
        fig.add_trace(trace, row=1 if row == "lag" else rows, col=1)
    if have_lag:
        fig.update_yaxes(title_text="lag per interval (ms)", rangemode="tozero", row=1, col=1)
    if have_cpu:
        fig.update_yaxes(title_text="CPU (% of one core)", rangemode="tozero", row=rows, col=1)
    add_phases_and_events(fig, summary, [])
    fig.update_xaxes(range=_time_range(summary, base_summary))
    fig.update_xaxes(title_text=TIME_AXIS, row=rows, col=1)
    panel.figure = apply_layout(fig, 340 if rows == 1 else 460)
    panel.note = ("Send lag = actual send − intended send time of each request; event-loop lag = how late the generator's "
                  "own timer fired. Both should stay near zero." + (
                      " CPU: latscope's own processes and the whole machine (a worker near 100% of one core cannot keep to the schedule)."
                      if host_cpu else "")
                  + (" Each run on its own clock; phase bands are the new run's. The interval maxima are hidden "
                     "(click them in the legend to show them)." if compare else ""))
    return panel


# -- GPU / host telemetry ------------------------------------------------------------------------

def gpu_panel(telemetry: pd.DataFrame, summary: dict, events: list[dict], base_telemetry: pd.DataFrame | None = None,
              base_summary: dict | None = None) -> Panel:
    """One lane per GPU metric, raw samples per device. With base_summary, the base run's samples are
    drawn too (dashed; each source and device keeps its colour across runs)."""
    compare = base_summary is not None
    panel = Panel("gpu", "GPU lanes" + (": base (dashed) vs new (solid)" if compare else ""))
    sides = [(frame if frame is not None and len(frame) else None, dash, suffix)
             for frame, dash, suffix in _sides(telemetry, base_telemetry, compare)]
    metrics = {m for frame, *_ in sides if frame is not None for m in frame["metric"].unique()}
    lanes = [m for m in GPU_LANES if m in metrics and not (m == "mem_util_pct" and "mem_bw_util_pct" in metrics)]
    if not lanes:
        panel.note = ("No GPU telemetry in this run." if not compare else "Neither run has GPU telemetry.") + (
            " It comes from NVML on the generator's machine when it has an NVIDIA GPU, or from a DCGM exporter's /metrics "
            "named under <code>telemetry: prometheus:</code> in the scenario.")
        panel.not_measured = "GPU telemetry"
        return panel
    titles = []
    for m in lanes:
        label, unit = TELEMETRY_METRICS.get(m, (m, ""))
        unit = "GiB" if unit == "B" else unit
        titles.append(f"{label} ({unit})")
    fig = make_subplots(rows=len(lanes), cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=titles)
    series = [(frame[frame["metric"].isin(lanes)], dash, suffix) for frame, dash, suffix in sides if frame is not None]
    keys = sorted({(s, d) for frame, *_ in series for s, d in zip(frame["source"], frame["device"])}, key=str)
    colors = {k: COLORS[i % len(COLORS)] for i, k in enumerate(keys)}
    for row, metric in enumerate(lanes, start=1):
        scale = 1 / 2**30 if metric == "mem_used_bytes" else 1.0
        for frame, dash, suffix in series:
            for (source, device), df in frame[frame["metric"] == metric].groupby(["source", "device"], sort=True):
                name = f"{esc_label(source)} {esc_label(device)}{suffix}"
                fig.add_trace(go.Scatter(x=f32(df["t_s"]), y=f32(df["value"].to_numpy(float) * scale), name=name,
                                         mode="lines", line=dict(color=colors[(source, device)], width=1.3, dash=dash),
                                         legendgroup=name, showlegend=row == 1, hovertemplate=f"{name} %{{y:.1f}}"), row=row, col=1)
        unit = TELEMETRY_METRICS.get(metric, ("", ""))[1]
        fig.update_yaxes(title_text="GiB" if unit == "B" else unit, rangemode="tozero", row=row, col=1)
    add_phases_and_events(fig, summary, events, label_phases=False)
    fig.update_xaxes(range=_time_range(summary, base_summary))
    fig.update_xaxes(title_text=TIME_AXIS, row=len(lanes), col=1)
    panel.figure = apply_layout(fig, 170 * len(lanes) + 140, margin={**MARGIN, "t": 90},
                           legend=dict(orientation="h", yanchor="bottom", y=1.04, xanchor="left", x=0))
    notes = ["Raw samples per device, on the same time axis as the latency panels."]
    if compare:
        notes.append("Each run on its own clock; a run without GPU telemetry has no lines here. Event lines are the new run's.")
    if "mem_util_pct" in lanes:
        notes.append("Memory-bandwidth utilization (GPM) was not available; the memory lane shows NVML's coarse "
                     "memory-controller busy counter, which is not bandwidth.")
    panel.note = " ".join(notes)
    return panel


def correlation_table(rows: list[dict]) -> str:
    rows = [r for r in rows if r.get("spearman") is not None][:8]
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{esc_label(TELEMETRY_METRICS.get(r.get('metric'), (r['series'],))[0])} · {esc_label(r.get('source', ''))} {esc_label(r.get('device', ''))}</td><td class=n>{r['n']}</td><td class=n>{r['spearman']:+.2f}</td>"
        f"<td class=n>{'' if r.get('pearson') is None else format(r['pearson'], '+.2f')}</td></tr>" for r in rows)
    return ("<p>Latency p99 per interval against each telemetry series (strongest first; rank correlation "
            "near ±1 means they move together, which is a hint, not proof of cause):</p>"
            "<table><tr><th>series</th><th>intervals</th><th>Spearman</th><th>Pearson</th></tr>" + body + "</table>")


# -- serialization ---------------------------------------------------------------------------

PART_COLORS = {"encode": "#9467bd", "network": "#7f7f7f", "decode": "#e377c2", "other": "#c7c7c7"}


def serialization_panel(parts: pd.DataFrame, compare: bool = False) -> Panel:
    """Each class's mean request, stacked by part. `compare`: `parts` holds both runs' bars (panels.serialization_both)."""
    panel = Panel("serialization", "Serialization: where a request's time goes")
    if parts is None or parts.empty:
        panel.note = (("Neither run" if compare else "This run") + " recorded no encode/decode or Server-Timing parts (they come from the openai, kserve-v2 and "
                      "kserve-v2-grpc protocols, and from servers that send a Server-Timing header).")
        panel.not_measured = "encode/decode and Server-Timing parts"
        return panel
    fig = go.Figure()
    labels = {}
    for cls, df in parts.groupby("class", sort=False):
        protocol = df["protocol"].iloc[0] if "protocol" in df else ""
        labels[cls] = f"{esc_label(cls)} ({esc_label(protocol)})" if protocol else esc_label(cls)
    order = list(dict.fromkeys(parts["part"]))
    server_colors = iter(("#2ca02c", "#98df8a", "#17becf", "#bcbd22", "#ff7f0e", "#ffbb78", "#8c564b"))
    for part in order:
        df = parts[parts["part"] == part]
        color = PART_COLORS.get(part) or next(server_colors, None)
        fig.add_trace(go.Bar(
            y=[labels[c] for c in df["class"]], x=df["mean_ms"], name=esc_label(part), orientation="h", marker_color=color,
            customdata=np.round(df["share"].to_numpy(float) * 100, 1),
            hovertemplate=f"{esc_label(part)}: %{{x:.3f}} ms (%{{customdata}}% of the total)<extra></extra>"))
    totals = parts.groupby("class", sort=False)["mean_ms"].sum()
    if "latency_ms" in parts:
        latency = parts.groupby("class", sort=False)["latency_ms"].first()
        fig.add_trace(go.Scatter(y=[labels[c] for c in latency.index], x=latency.to_numpy(float), mode="markers",
                                 name="latency (from the intended time)", marker={"symbol": "line-ns-open", "size": 22,
                                                                                  "color": "#111", "line": {"width": 2}},
                                 hovertemplate="latency: %{x:.3f} ms<extra></extra>"))
    fig.add_trace(go.Scatter(y=[labels[c] for c in totals.index], x=totals.to_numpy(float), mode="text",
                             text=[f"  {v:,.2f} ms" if v < 10 else f"  {v:,.1f} ms" for v in totals], textposition="middle right",
                             showlegend=False, hoverinfo="skip"))
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_xaxes(title_text="mean time per request (ms)", rangemode="tozero", range=[0, float(totals.max()) * 1.15])
    fig.update_yaxes(title_text="class (protocol)", autorange="reversed")
    panel.figure = apply_layout(fig, 140 + 60 * len(labels), hovermode="closest")
    panel.note = ("Mean per request, stacked: client encode, network (the rest of the round trip), the server's own "
                  "Server-Timing parts, client decode; \"other\" is what those do not cover (queueing in the client, "
                  "streaming after the first chunk). The bar's total is client-inclusive latency: latency plus the "
                  "client's encode, which latscope does ahead of each request's intended time; the black mark is latency "
                  "itself, what the target is judged by (from the intended time, encode not included).")
    return panel
