"""The cold-start panel: how long users suffered, and how badly, at each capacity change that
latscope.analysis.coldstart found (a launch, a restart, a replica added, the first request after an
idle stretch): one line per change, a zoomed latency plot per change, and the tables. Drawn like every
panel (figures.py): analysis outputs in, a figure out, every string from a target through esc_label."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.analysis import coldstart
from latscope.report.escape import esc_label
from latscope.report.figures import MARGIN, Panel, apply_layout, f32, log_ticks


def _start_label(c: dict) -> str:
    kind = {"run_start": "run start", "phase": "phase", "replica": "new replica"}.get(c["kind"], c["kind"])
    label = "" if c["kind"] == "run_start" else f" {esc_label(c['label'])}"
    return f"{kind}{label} @ {c['at_s']:.1f} s"


def _num(value: object, fmt: str = ".2f", none: str = "–") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


MAX_COLD_PLOTS = 6


def _cold_title(e: dict) -> str:
    return esc_label(coldstart.title(e))


def _run_cell(run: str, compare: bool) -> str:
    """A table row's first cell naming its run, on a compare page only."""
    return f"<td><b>{run}</b></td>" if compare else ""


def _cold_table(entries: list[tuple[str, dict]], compare: bool) -> str:
    rows = []
    for run, e in entries:
        worst = e.get("first_latency_ms")
        ratio = (worst / e["steady_p50_ms"]) if worst is not None and e.get("steady_p50_ms") else None
        cold = {True: "yes", False: "no", None: "–"}[e.get("cold")]
        rows.append(
            f"<tr class=\"{'bad' if e.get('cold') else ''}\">{_run_cell(run, compare)}<td>{_cold_title(e)}</td>"
            f"<td class=n>{_num(e['at_s'] - e['cause_at_s'], '.2f')}</td>"
            f"<td class=n>{_num(worst, ',.1f')}</td><td class=n>{_num(e.get('first_max_ms'), ',.1f')}</td>"
            f"<td class=n>{_num(e.get('steady_p50_ms'), ',.1f')}</td><td class=n>{_num(ratio, ',.1f')}{'×' if ratio is not None else ''}</td>"
            + (f"<td class=n>{_num(e.get('suffered_s'), '.2f', 'never settled')}</td><td class=n>{_num(e.get('affected_requests'), ',')}</td>"
               if e.get("cold") else "<td class=n>–</td><td class=n>–</td>") +
            f"<td>{cold}</td></tr>")
    return ("<table><tr>" + ("<th>run</th>" if compare else "") + "<th>what</th><th>seen after cause (s)</th><th>first request ms</th>"
            "<th>worst of first N ms</th><th>steady p50 ms</th><th>first ÷ steady</th><th>users suffered (s)</th>"
            "<th>requests affected</th><th>cold?</th></tr>" + "".join(rows) + "</table>")


def _starts_table(starts: list[tuple[str, dict]], compare: bool) -> str:
    rows = "".join(
        f"<tr class=\"{'bad' if c.get('cold') else ''}\">{_run_cell(run, compare)}<td>{_start_label(c)}{' (warm-up)' if c.get('warmup') else ''}</td>"
        f"<td class=n>{c.get('first_count', 0):,}</td><td class=n>{_num(c.get('first_p50_ms'))}</td><td class=n>{_num(c.get('first_max_ms'))}</td>"
        f"<td class=n>{_num(c.get('steady_p50_ms'))}</td><td class=n>{_num(c.get('slowdown_p50'), '.2f')}{'×' if c.get('slowdown_p50') is not None else ''}</td>"
        f"<td class=n>{_num(c.get('time_to_steady_s'), '.1f', 'never')}</td><td>{'yes (' + c['cold_by'] + ')' if c.get('cold') and c.get('cold_by') else 'yes' if c.get('cold') else 'no'}</td></tr>"
        for run, c in starts)
    return ("<details><summary>Every start analysed (the run, each phase, each replica)</summary><table><tr>"
            + ("<th>run</th>" if compare else "") + "<th>start</th><th>first requests</th><th>first p50 ms</th>"
            "<th>first max ms</th><th>steady p50 ms</th><th>slowdown p50</th><th>p50 back to steady after (s)</th><th>cold?</th></tr>"
            + rows + "</table></details>")


def coldstart_panel(events: list[dict], series: dict[tuple[str, str], pd.DataFrame], starts: list[dict],
                    base_events: list[dict] | None = None, base_series: dict | None = None,
                    base_starts: list[dict] | None = None) -> Panel:
    """How long users suffered, and how badly, at each capacity change (analysis.coldstart.capacity_events):
    a line per change, a zoomed latency plot per change (each interval's max and p50 on the series the
    change is on, the steady p50, the stretch users suffered shaded), and a table. With base_*, both runs:
    the n-th change of a kind in one run is drawn with the n-th of that kind in the other (base dashed),
    on a clock that starts at its cause (the scale action, the launch, the idle stretch's start)."""
    compare = base_events is not None
    panel = Panel("coldstart", "Cold starts: how long users suffered, and how badly" + (", base vs new" if compare else ""))
    runs = ([("base", base_events or [], base_series or {}, base_starts or []), ("new", events, series, starts)]
            if compare else [("", events, series, starts)])
    entries = [(run, e) for run, evs, _, _ in runs for e in evs]
    all_starts = [(run, c) for run, _, _, chosen in runs for c in chosen]
    if not entries:
        panel.note = ("No capacity change to measure: the scenario launched no target, ran no scale action and had no idle "
                      "stretch (see scenarios/scale_up.yaml and scenarios/cold_start.yaml).")
        panel.html = _starts_table(all_starts, compare) if all_starts else ""
        if not all_starts:  # no request completed: no start to analyse either
            panel.not_measured = "cold starts"
        return panel
    panel.lead = "<ul class=\"cold\">" + "".join(
        f"<li class=\"{'bad' if e.get('cold') else 'good'}\">{'<b>' + run + '</b> ' if compare else ''}<b>{_cold_title(e)}</b>: {coldstart.describe(e)}</li>"
        for run, e in entries) + "</ul>"
    # one subplot per change; in a comparison the n-th of a kind in each run share one
    groups: dict[tuple[str, int], dict[str, dict]] = {}
    for run, evs, _, _ in runs:
        seen: dict[str, int] = {}
        for e in evs:
            n = seen[e["kind"]] = seen.get(e["kind"], -1) + 1
            groups.setdefault((e["kind"], n), {})[run] = e
    keys = list(groups)[:MAX_COLD_PLOTS]
    cols = min(len(keys), 3)
    rows = math.ceil(len(keys) / cols)
    titles = [_cold_title(groups[k].get("new") or groups[k].get("") or groups[k]["base"]) for k in keys]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.07, vertical_spacing=0.18)
    frames = {run: frs for run, _, frs, _ in runs}
    values = []
    for i, key in enumerate(keys):
        row, col = i // cols + 1, i % cols + 1
        for run, e in groups[key].items():
            df = frames[run].get((e["metric"], e["class"]))
            if df is None or not len(df):
                continue
            zero = e["cause_at_s"] if e["kind"] in ("scale_up", "restart") else e["at_s"]
            suffered = e.get("suffered_s")
            until = e["at_s"] + (suffered if suffered is not None else 5.0) + 4.0
            near = df[(df["t_s"] >= zero - 1.0) & (df["t_s"] <= until) & (df["count"] > 0)]
            interval = float(near["t_s"].diff().min()) if len(near) > 1 else 1.0
            x = f32(near["t_s"].to_numpy(float) + interval / 2 - zero)
            dash, who = ("dash", "base ") if run == "base" else ("solid", "new " if compare else "")
            first = i == 0
            fig.add_trace(go.Scatter(x=x, y=f32(near["max_ms"]), mode="lines+markers", name=f"{who}max per interval",
                                     legendgroup=f"{run}max", showlegend=first, line=dict(color="#d62728", dash=dash, width=1.5),
                                     marker=dict(size=4), hovertemplate="max %{y:.1f} ms"), row=row, col=col)
            fig.add_trace(go.Scatter(x=x, y=f32(near["p50_ms"]), mode="lines", name=f"{who}p50 per interval",
                                     legendgroup=f"{run}p50", showlegend=first, line=dict(color="#2ca02c", dash=dash, width=1.5),
                                     hovertemplate="p50 %{y:.1f} ms"), row=row, col=col)
            values.extend(near[["p50_ms", "max_ms"]].to_numpy(float).ravel().tolist())
            if e.get("steady_p50_ms"):
                fig.add_hline(y=e["steady_p50_ms"], line=dict(color="#1f77b4", dash="dot" if run == "base" else "dash", width=1),
                              row=row, col=col)
            if e.get("cold") and suffered:
                fig.add_vrect(x0=e["at_s"] - zero, x1=e["at_s"] + suffered - zero, fillcolor="#d62728",
                              opacity=0.10 if run == "base" else 0.18, line_width=0, row=row, col=col)
            fig.add_vline(x=e["at_s"] - zero, line=dict(color="#555", dash="dot", width=1), row=row, col=col)
        fig.update_xaxes(title_text="s since " + ("the action" if key[0] in ("scale_up", "restart") else "it started"),
                         row=row, col=col)
    finite = np.array([v for v in values if v and math.isfinite(v) and v > 0])
    if len(finite) and finite.max() / finite.min() > 20:
        fig.update_yaxes(type="log", **log_ticks(finite))
    fig.update_yaxes(title_text="latency (ms)", col=1)
    # the legend above the subplot titles, not over them
    panel.figure = apply_layout(fig, 320 * rows + 80, margin={**MARGIN, "t": 80},
                           legend=dict(orientation="h", yanchor="top", y=0.98, yref="container", xanchor="left", x=0))
    panel.html = _cold_table(entries, compare) + _starts_table(all_starts, compare)
    panel.note = ("Each capacity change (the launched target's start, a restart, a replica added by a scale action, the first "
                  "request after an idle stretch) against the steady state that followed it. Red: each interval's slowest request; "
                  "green: its median; dashed blue: the steady p50; shaded: the stretch users suffered — until the p50 of each "
                  "window of N requests stays within 20% of steady and no interval's max is over 1.5× the steady max. "
                  "<i>First request</i> is the very first response measured on its own (the replica's first, the first after "
                  "idle); a change is cold when its first requests were over 1.5× the steady p50, or the slowest of its first interval over "
                  "1.5× the steady max."
                  + (" Each run's change is drawn on a clock that starts at its cause; base dashed, new solid." if compare else ""))
    return panel
