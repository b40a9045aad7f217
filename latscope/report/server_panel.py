"""The "Server's view" panel: the server's own TTFT (and end-to-end time) from its /metrics beside
latscope's client-side numbers, per interval, and the difference, the time outside the engine
(network, proxy, client). The numbers come from analysis/server_signals.py; this module draws them.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.analysis.server_signals import outside_median_ms
from latscope.report.figures import MARGIN, TIME_AXIS, Panel, add_phases_and_events, apply_layout, f32
from latscope.report.words import fmt_ms

OUTSIDE = "outside the engine (network, proxy, client)"
# (column prefix, legend name, colour, dash) for each row's lines
LINES = (("client", "client (latscope)", "#1f77b4", None), ("server", "server's own", "#ff7f0e", "dash"),
         ("outside", OUTSIDE, "#2ca02c", "dot"))


def server_panel(rows: list[tuple[str, str, pd.DataFrame]], summary: dict, events: list[dict], which: str = "") -> Panel:
    """`rows`: (client metric label, server label, analysis.server_signals.client_vs_server frame),
    one subplot each; no rows with data: `not_measured`. `which`: " (new run)" on the compare page."""
    panel = Panel("server-view", "Server's view: its own TTFT and latency beside latscope's" + which)
    rows = [r for r in rows if len(r[2])]
    if not rows:
        panel.note = ("The server exported no TTFT or request-time histogram in this run. An engine's own view comes "
                      "from its /metrics: <code>telemetry: {prometheus: {url: http://HOST:PORT/metrics, mapping: vllm}}</code> "
                      "(or sglang, tgi, llama.cpp, triton, reference-server).")
        panel.not_measured = "the server's own TTFT and latency"
        return panel
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{client} vs {server} (ms)" for client, server, _ in rows])
    leads = []
    for i, (client, server, frame) in enumerate(rows, start=1):
        x = f32(frame["t_s"])
        for prefix, name, color, dash in LINES:
            for q, width in (("p50", 2.0), ("p99", 1.2)):
                y = frame[f"{prefix}_{q}_ms"].to_numpy(float)
                label = f"{name} {q}"
                fig.add_trace(go.Scatter(x=x, y=f32(y), name=label, mode="lines+markers", marker=dict(size=3),
                                         line=dict(color=color, width=width, dash=dash), opacity=1.0 if q == "p50" else 0.6,
                                         legendgroup=label, showlegend=i == 1, connectgaps=False,
                                         hovertemplate=f"{label} %{{y:.1f}} ms"), row=i, col=1)
        fig.update_yaxes(title_text="ms", row=i, col=1)
        median = outside_median_ms(frame)
        if median is not None and not math.isnan(median) and median >= 0:
            leads.append(f"{client}: {fmt_ms(median)} ms of the median, per interval, was {OUTSIDE}")
        elif median is not None and not math.isnan(median):
            leads.append(f"{client}: the server's own median is {fmt_ms(-median)} ms above latscope's (its histogram's "
                         "buckets are coarser than the gap between the two)")
    add_phases_and_events(fig, summary, events, label_phases=False)
    fig.update_xaxes(title_text=TIME_AXIS, row=len(rows), col=1)
    panel.figure = apply_layout(fig, 260 * len(rows) + 160, margin={**MARGIN, "t": 90},
                                legend=dict(orientation="h", yanchor="bottom", y=1.06, xanchor="left", x=0))
    if leads:
        panel.lead = "<p>" + "; ".join(leads) + ".</p>"
    panel.note = ("Client lines: latscope's p50 and p99 per interval, from the intended send time. Server lines: the p50 and "
                  "p99 of the requests the server finished between two scrapes of its /metrics, interpolated in its "
                  "histogram's buckets (off by up to a bucket's width) and placed at the middle of each interval. The "
                  f"difference is {OUTSIDE}; quantiles of different windows do not subtract exactly, so read its level, "
                  "not each point.")
    return panel

