"""The sessions and prefix-cache panel: what chat sessions (multi-turn conversations) did and what the
server's prefix cache saved them, from latscope.analysis.sessions. Three plots — TTFT by turn (p50 and
p99: later turns re-send turn 1's prompt, so a prefix cache makes them cheaper), the prefix-cache hit
rate by turn, the sessions in progress over time with the ones abandoned or cut — and a table of how
the sessions ended. A run without sessions whose server reported cached tokens (a trace replay) gets
the per-class hit rate as a table; a run with neither gets a one-line note, as other panels do.

A closed-loop run (summary.json `load.model` closed or mixed) leads with the note that says so: its
offered load followed the server, so its throughput and service time are what to read.

Drawn like every panel (figures.py): analysis outputs in, a figure out; every class name (it comes
from the scenario) through esc_label in plotly labels and in this module's HTML text (no attribute
here holds one), the run's own notes too (summary.json is a file anyone can edit).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.report.escape import esc_label
from latscope.report.figures import COLORS, MARGIN, TIME_AXIS, Panel, apply_layout, f32, log_ticks
from latscope.report.words import fmt_ms

TITLE = "Sessions and prefix cache"
STAT_COLORS = {"p50": "#2ca02c", "p99": "#ff7f0e"}  # one class: the colours of the latency panels' p50 and p99
ABANDONED_COLOR, CUT_COLOR, PROGRESS_COLOR = "#d62728", "#ff9f40", "#1f77b4"


def _pct(rate: object, none: str = "not reported") -> str:
    """A hit rate (0…1) as a percentage; `none` when the server never said."""
    if rate is None or (isinstance(rate, float) and not math.isfinite(rate)):
        return none
    return f"{float(rate) * 100:.1f}%"


def _int(value: object) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{int(value):,}"


def _finite(values) -> np.ndarray:
    v = np.asarray([np.nan if x is None else x for x in values], float)
    return v[np.isfinite(v) & (v > 0)]


def _run_end(summary: dict) -> float:
    return max([p["start_s"] + p["duration_s"] for p in summary.get("phases", [])] + [summary.get("duration_s") or 0, 1])


def closed_loop_lead(load: object, who: str = "") -> str:
    """The visible statement of a closed-loop run (trusted HTML; its note escaped), "" for an open-loop one."""
    if not isinstance(load, dict) or load.get("model") not in ("closed", "mixed"):
        return ""
    users = load.get("users")
    users = f", {_int(users)} users" if isinstance(users, (int, float)) and not isinstance(users, bool) else ""
    kind = "closed" if load["model"] == "closed" else "mixed (open and closed loop)"
    note = load.get("note") or ("closed loop: the offered load follows the server (coordinated omission); read achieved "
                                "throughput and service time.")
    return f"<p class=\"warning\">{who}<b>Load model: {kind}{users}.</b> {esc_label(note)}</p>"


# -- tables --------------------------------------------------------------------------------------

# Each table: (heading, the row's field, how a value is written); the class column comes first.
_SESSION_COLUMNS = (("sessions started", "started", "int"), ("completed", "completed", "int"),
                    ("abandoned", "abandoned", "int"), ("cut", "cut", "int"), ("turns not sent", "turns_not_sent", "int"),
                    ("session p50 ms", "duration_p50_ms", "ms"), ("session p99 ms", "duration_p99_ms", "ms"),
                    ("prefix-cache hit rate", "hit_rate", "pct"))
_TURN_COLUMNS = (("turn", "turn", "int"), ("completed", "completed", "int"), ("errors", "errors", "int"),
                 ("prompt tokens (cache reported)", "cache_reported_prompt_tokens", "int"),
                 ("cached tokens", "cached_tokens", "int"), ("hit rate", "hit_rate", "pct"),
                 ("TTFT p50 ms", "ttft_p50_ms", "ms"), ("TTFT p99 ms", "ttft_p99_ms", "ms"),
                 ("latency p50 ms", "latency_p50_ms", "ms"), ("latency p99 ms", "latency_p99_ms", "ms"))
_CACHE_COLUMNS = (("prompt tokens (cache reported)", "prompt_tokens", "int"), ("cached tokens", "cached_tokens", "int"),
                  ("prefix-cache hit rate", "hit_rate", "pct"))
_WRITE = {"int": _int, "ms": fmt_ms, "pct": _pct}


def class_table(tables: list[tuple[str, pd.DataFrame]], columns: tuple, compare: bool,
                write: dict[str, Callable[[Any], str]] = _WRITE) -> str:
    """One HTML table of every run's rows (a "run" column first when comparing), a row's class first, then
    `columns` ((heading, field, how it is written: a key of `write`)); "" without rows. The "all" row,
    where there is one, is marked as the total."""
    rows = "".join(
        ('<tr class="total">' if r["class"] == "all" else "<tr>") + (f"<td><b>{run}</b></td>" if compare else "")
        + f"<td>{esc_label(r['class'])}</td>"
        + "".join(f"<td class=n>{write[kind](r[field])}</td>" for _, field, kind in columns) + "</tr>"
        for run, df in tables for _, r in df.iterrows())
    if not rows:
        return ""
    return ("<table><tr>" + ("<th>run</th>" if compare else "") + "<th>class</th>"
            + "".join(f"<th class=n>{heading}</th>" for heading, _, _ in columns) + "</tr>" + rows + "</table>")


# -- the figure ----------------------------------------------------------------------------------

def _colors(classes: list[str]) -> dict[str, str]:
    return {c: COLORS[i % len(COLORS)] for i, c in enumerate(classes)}


def _add_turns(fig: go.Figure, turns: pd.DataFrame, overall: dict[str, float | None], metric: str, colors: dict,
               one_class: bool, dash: str | None, suffix: str, row: int) -> list[float]:
    """TTFT (or latency) p50/p99 by turn in column 1, the hit rate by turn in column 2; returns the ms values drawn."""
    values: list[float] = []
    label = metric.upper() if metric == "ttft" else metric
    for cls, df in turns.groupby("class", sort=False):
        df = df.sort_values("turn")
        x = df["turn"].to_numpy(int)
        name = esc_label(cls)
        for stat, symbol, width in (("p50", "circle", 2.2), ("p99", "diamond", 1.3)):
            y = df[f"{metric}_{stat}_ms"].to_numpy(float)
            values.extend(y[np.isfinite(y)].tolist())
            color = STAT_COLORS[stat] if one_class else colors[cls]
            trace = f"{name} {label} {stat}{suffix}"
            fig.add_trace(go.Scatter(x=x, y=f32(y), mode="lines+markers", name=trace, legendgroup=f"{cls}{stat}{suffix}",
                                     line=dict(color=color, width=width, dash=dash), marker=dict(symbol=symbol, size=7),
                                     hovertemplate=f"{trace} turn %{{x}}: %{{y:.2f}} ms<extra></extra>"), row=row, col=1)
        rate = df["hit_rate"].to_numpy(float) * 100
        if np.isfinite(rate).any():
            trace = f"{name} hit rate (all turns {_pct(overall.get(cls))}){suffix}"
            fig.add_trace(go.Scatter(x=x, y=f32(rate), mode="lines+markers", name=trace, legendgroup=f"{cls}hit{suffix}",
                                     line=dict(color=PROGRESS_COLOR if one_class else colors[cls], width=2, dash=dash),
                                     marker=dict(symbol="square", size=7),
                                     hovertemplate=f"{name} hit rate{suffix} turn %{{x}}: %{{y:.1f}}%<extra></extra>"),
                          row=row, col=2)
    return values


def _add_timeline(fig: go.Figure, timeline: pd.DataFrame, interval_s: float, end_s: float, colors: dict, one_class: bool,
                  dash: str | None, suffix: str, row: int) -> bool:
    """Sessions in progress at each interval's end (a line per class; the last interval ends with the
    run, at `end_s`), abandoned and cut per interval (bars, of all session classes together); returns
    whether any session was abandoned or cut."""
    lost = False
    for cls, df in timeline.groupby("class", sort=False):
        t = df["t_s"].to_numpy(float)
        x = np.concatenate(([t[0]], np.maximum(np.minimum(t + interval_s, end_s), t))) if len(t) else t
        y = np.concatenate(([0], df["in_progress"].to_numpy(float))) if len(t) else t
        name = f"{'all session classes' if cls == 'all' else esc_label(cls)} in progress{suffix}"
        color = PROGRESS_COLOR if one_class or cls == "all" else colors[cls]
        fig.add_trace(go.Scatter(x=f32(x), y=f32(y), mode="lines", name=name, line=dict(color=color, width=2.5 if cls == "all" else 1.8,
                                 dash=dash, shape="linear"), hovertemplate=f"{name} %{{y:.0f}}<extra></extra>"), row=row, col=1)
    # the bars: the one class's, or the "all" rows' when there are several
    totals = timeline[timeline["class"] == ("all" if "all" in set(timeline["class"]) else timeline["class"].iloc[0])]
    t = totals["t_s"].to_numpy(float)
    middle = f32((t + np.maximum(np.minimum(t + interval_s, end_s), t)) / 2)
    for column, color, light in (("abandoned", ABANDONED_COLOR, "#ff9896"), ("cut", CUT_COLOR, "#ffd0a0"),
                                 ("history_limit", "#9467bd", "#c5b0d5")):
        y = totals[column].to_numpy(float)
        if not y.any():
            continue
        lost = True
        name = f"{column.replace('_', ' ')} per interval{suffix}"
        fig.add_trace(go.Bar(x=middle, y=f32(y), name=name, marker_color=light if dash else color, width=interval_s * 0.4,
                             hovertemplate=f"{name} %{{y:.0f}}<extra></extra>"), row=row, col=1)
    return lost


def _ttft_metric(turn_tables: list[pd.DataFrame]) -> str:
    return "ttft" if any(len(t) and (t["ttft_count"] > 0).any() for t in turn_tables) else "latency"


def sessions_panel(sessions: pd.DataFrame, turns: pd.DataFrame, timeline: pd.DataFrame, cache: pd.DataFrame, load: dict,
                   summary: dict, base: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict, dict] | None = None,
                   ) -> Panel:
    """The run's sessions and prefix cache (analysis.sessions: session_table, turn_table, session_timeline,
    prefix_cache_table, load_model; `summary` for the interval and the run's length). With `base`, the
    same six of the base run: its lines dashed, the new run's solid, each table with a row per run."""
    compare = base is not None
    panel = Panel("sessions", TITLE + (": base (dashed) vs new (solid)" if compare else ""))
    runs = ([("base", *base), ("new", sessions, turns, timeline, cache, load, summary)] if compare
            else [("", sessions, turns, timeline, cache, load, summary)])
    panel.lead = "".join(closed_loop_lead(r[5], f"<b>{r[0]} run</b> " if compare else "") for r in runs)
    have_turns = any(len(r[2]) for r in runs)
    have_timeline = any(len(r[3]) for r in runs)
    session_classes = {c for r in runs for c in r[1]["class"]}
    # the prefix cache of classes without sessions (a trace replay, or a class beside the chat ones)
    cache_tables = [(r[0], r[4]) for r in runs if len(r[4]) and set(r[4]["class"]) - session_classes - {"all"}]
    details = class_table([(r[0], r[2]) for r in runs], _TURN_COLUMNS, compare)
    limited = any(len(r[1]) and (r[1]["history_limit"] > 0).any() for r in runs)  # the column only where it says something
    session_columns = _SESSION_COLUMNS[:4] + (("history limit", "history_limit", "int"),) * limited + _SESSION_COLUMNS[4:]
    tables = class_table([(r[0], r[1]) for r in runs], session_columns, compare) + (
        f"<details><summary>Every turn (outside warm-up)</summary>{details}</details>" if details else "")
    cache_html = class_table(cache_tables, _CACHE_COLUMNS, compare)
    if cache_html:
        cache_html = ("<p>The prefix cache over every request of each class (cached ÷ prompt tokens, of the requests the "
                      "server reported cached tokens for):</p>" + cache_html)
    if not have_turns and not have_timeline:
        if not tables and not cache_html:
            panel.note = ("This run had no chat sessions and its server reported no prefix-cache hits (sessions come from a "
                          "class's <code>session:</code>; cached tokens from an OpenAI-style server's usage)."
                          if not compare else "Neither run had chat sessions or prefix-cache hits reported by the server.")
            if not panel.lead:  # a closed-loop statement is something to show: keep the card for it
                panel.not_measured = "chat sessions and prefix cache"
            return panel
        panel.note = ("No session turns to plot." if tables else
                      "No chat sessions" + (" in either run" if compare else " in this run") + "; the server reported cached prompt "
                      "tokens (usage.prompt_tokens_details.cached_tokens), so here is its prefix-cache hit rate per class.")
        panel.html = tables + cache_html
        return panel

    turn_tables = [r[2] for r in runs]
    metric = _ttft_metric(turn_tables)
    classes = list(dict.fromkeys([c for t in turn_tables for c in t["class"]] + [c for r in runs for c in r[3]["class"] if c != "all"]))
    one_class = len(classes) == 1
    colors = _colors(classes)
    rows = int(have_turns) + int(have_timeline)
    turn_title = ("TTFT by turn (p50 ●, p99 ◆)" if metric == "ttft"
                  else "Latency by turn (p50 ●, p99 ◆; no streamed tokens, so no TTFT)")
    reported = any(len(t) and np.isfinite(t["hit_rate"].to_numpy(float)).any() for t in turn_tables)
    hit_title = "Prefix-cache hit rate by turn" + ("" if reported else " (the server reported no cached tokens)")
    specs, titles = [], []
    if have_turns:
        specs.append([{}, {}])
        titles += [turn_title, hit_title]
    if have_timeline:
        specs.append([{"colspan": 2}, None])
        titles.append("Sessions in progress (at each interval's end), abandoned and cut")
    fig = make_subplots(rows=rows, cols=2, specs=specs, subplot_titles=titles, horizontal_spacing=0.1,
                        vertical_spacing=0.2 if rows == 2 else 0.1)
    ms_values: list[float] = []
    lost = False
    for run, s_table, t_table, timeline_, _, _, s in runs:
        dash, suffix = ("dash", " (base)") if run == "base" else (None, " (new)" if compare else "")
        overall = dict(zip(s_table["class"], s_table["hit_rate"]))
        if have_turns and len(t_table):
            ms_values += _add_turns(fig, t_table, overall, metric, colors, one_class, dash, suffix, row=1)
        if have_timeline and len(timeline_):
            interval = (s.get("generator") or {}).get("interval_s") or 1.0
            lost |= _add_timeline(fig, timeline_, float(interval), _run_end(s), colors, one_class, dash, suffix, row=rows)
    if have_turns:
        fig.update_xaxes(title_text="turn", dtick=1, row=1, col=1)
        fig.update_xaxes(title_text="turn", dtick=1, row=1, col=2)
        finite = _finite(ms_values)
        unit = f"{'TTFT' if metric == 'ttft' else 'latency'} (ms)"
        if len(finite) and finite.max() / finite.min() > 20:
            fig.update_yaxes(title_text=unit + ", log scale", type="log", **log_ticks(finite), row=1, col=1)
        else:
            fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=1)
        fig.update_yaxes(title_text="hit rate (%)", range=[0, 105], row=1, col=2)
    if have_timeline:
        ends = [_run_end(r[6]) for r in runs]
        for phase in summary.get("phases", []):  # warm-up sessions count too: shade where they ran
            if phase.get("warmup"):
                fig.add_vrect(x0=phase["start_s"], x1=phase["start_s"] + phase["duration_s"], fillcolor="#999999",
                              opacity=0.16, line_width=0, row=rows, col=1)
        fig.update_xaxes(title_text=TIME_AXIS, range=[0, max(ends)], row=rows, col=1)
        fig.update_yaxes(title_text="sessions", rangemode="tozero", row=rows, col=1)
        fig.update_layout(barmode="group")
    panel.figure = apply_layout(fig, 330 * rows + 150, hovermode="closest", margin={**MARGIN, "t": 90},
                                legend=dict(orientation="h", yanchor="top", y=0.99, yref="container", xanchor="left", x=0))
    panel.html = tables + cache_html
    metric_words = ("time to first token" if metric == "ttft" else "latency (the run streamed no tokens, so no TTFT)")
    panel.note = (
        f"Top left: each turn's {metric_words}, p50 and p99 over the turn's requests outside warm-up, measured from its "
        "intended send time (a later turn is due its think time after the answer before it). A later turn re-sends "
        "the conversation so far, so a server with a prefix cache answers it sooner. Top right: the share of each turn's "
        "prompt tokens the server said came from its cache (usage.prompt_tokens_details.cached_tokens), and in the legend "
        "the class's rate over all its turns. "
        if have_turns else "") + (
        "Bottom: sessions started and not yet ended at the end of each interval (warm-up included, shaded grey); a "
        "session ends completed, abandoned (a turn failed, or was dropped at the in-flight cap: its later turns are not "
        "sent), cut (the run ended before its next turn) or, carrying its history, at the history limit (its history "
        "passed session.max_history_bytes, or the worker's together limits.max_carried_bytes_per_worker)."
        + ("" if lost else " No session was abandoned or cut." if not compare else " Neither run abandoned or cut a session.")
        if have_timeline else "") + (
        " Each run on its own clock; base dashed, new solid." if compare else "")
    alone = [r[0] for r in runs if len(r[1]) or len(r[2]) or len(r[3])]
    if compare and len(alone) == 1:
        missing = "new" if alone[0] == "base" else "base"
        panel.note += f" The {missing} run had no chat sessions, so only the {alone[0]} run's are here."
    return panel
