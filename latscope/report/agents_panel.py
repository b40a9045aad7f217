"""The "Agents" panel: what agent jobs (a class's `agent:`) did, from latscope.analysis.agents. A job
is rounds of model answers (tool calls) over one growing context with tool waits between them, and
at its fan-out, sub-agents running at once; its job time is what the user waits for.

Drawn: the job-time distribution of each agent class (the share of completed jobs at or below each
job time: analysis.agents.job_time_cdf), each round's TTFT p50 (latency p50 without streamed tokens)
and prefix-cache hit rate (round_table), a table of how the jobs ended with their job time, the
model's and the tools' shares of the critical path, rounds, context, cached share and tool calls
(agent_table), and, per class, the critical path of the job at the median job time and of the one
at the p99 (job_timelines): a Gantt-like lane per agent — the job's, and each sub-agent's during its
fan-out — of model rounds (a tick at the first token) and tool waits, the critical path in the
darker colours. On the compare page: the distributions and rounds overlaid (base dashed, new solid),
the timelines side by side (base left, new right), the tables with a row per run; a page where
neither run had agent jobs names the panel in its "Not measured" line.

Drawn like every panel (figures.py): analysis outputs in, a figure out; every class name (it comes
from the scenario, and summary.json and requests.parquet are files anyone can edit) through
esc_label in plotly labels and in this module's HTML text (no attribute value here holds one);
everything else here is numbers, formatted, or words written here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.analysis import agents
from latscope.analysis.agents import JobTimeline
from latscope.analysis.run_data import RunData
from latscope.report.escape import esc_label
from latscope.report.figures import COLORS, MARGIN, Panel, apply_layout, f32, log_ticks
from latscope.report.sessions_panel import class_table
from latscope.report.words import fmt_ms

TITLE = "Agents"
# (kind, on the critical path) -> (legend name, colour)
SEGMENTS = {("model", True): ("model round", "#1f77b4"), ("tool", True): ("tool wait", "#ff7f0e"),
            ("model", False): ("model round (sub-agent off the critical path)", "#aec7e8"),
            ("tool", False): ("tool wait (sub-agent off the critical path)", "#ffd0a0")}
FIRST_TOKEN = "#222222"
HIT_COLOR = "#2ca02c"
TOP_HEIGHT, LANE_HEIGHT, TIMELINE_BASE, GAP = 330, 26, 70, 80  # px
WHICH = {"p50": "median job", "p99": "p99 job"}

# (table, rounds, job-time CDF, timelines by class, summary) of one run
Data = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, list[JobTimeline]], dict]


def gather(run: RunData) -> Data:
    """What the panel draws of one run, from latscope.analysis.agents."""
    table = agents.agent_table(run)
    return (table, agents.round_table(run), agents.job_time_cdf(run),
            {cls: agents.job_timelines(run, cls) for cls in table["class"]}, run.summary)


def agents_panel(run: RunData, base: RunData | None = None) -> Panel:
    """The panel of `run`, or (with `base`) of both runs: the PanelSpec build (report/panels.py)."""
    return draw(gather(run), None if base is None else gather(base))


# -- tables --------------------------------------------------------------------------------------

def _int(value: object) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{int(value):,}"


def _share(value: object) -> str:
    """A share (0…1) as a percentage; "–" when there is none (cached share: the server never said)."""
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{float(value) * 100:.1f}%"


def _mean(value: object) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{float(value):,.1f}"


_WRITE = {"int": _int, "ms": fmt_ms, "pct": _share, "mean": _mean,
          "rate": lambda v: "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{float(v):,.3f}"}
# (heading, the row's field, how a value is written); the class column comes first
_JOB_COLUMNS = (("jobs started", "started", "int"), ("completed", "completed", "int"), ("abandoned", "abandoned", "int"),
                ("cut", "cut", "int"), ("rounds not sent", "turns_not_sent", "int"), ("job p50 ms", "job_p50_ms", "ms"),
                ("job p95 ms", "job_p95_ms", "ms"), ("job p99 ms", "job_p99_ms", "ms"), ("model share", "model_share", "pct"),
                ("tool share", "tool_share", "pct"), ("mean rounds", "rounds_mean", "mean"), ("mean requests", "requests_mean", "mean"),
                ("mean context tokens", "context_tokens_mean", "mean"), ("cached share", "cached_share", "pct"),
                ("tool calls", "tool_calls", "int"), ("invalid JSON", "invalid_json", "int"),
                ("good jobs", "good_jobs_fraction", "pct"), ("good jobs/s", "good_jobs_per_s", "rate"))
_ROUND_COLUMNS = (("round", "round", "int"), ("completed", "completed", "int"), ("errors", "errors", "int"),
                  ("TTFT p50 ms", "ttft_p50_ms", "ms"), ("TTFT p99 ms", "ttft_p99_ms", "ms"),
                  ("latency p50 ms", "latency_p50_ms", "ms"), ("latency p99 ms", "latency_p99_ms", "ms"),
                  ("hit rate", "hit_rate", "pct"))


# -- the figure ----------------------------------------------------------------------------------

def _add_cdf(fig: go.Figure, cdf: pd.DataFrame, colors: dict, dash: str | None, suffix: str) -> list[float]:
    """Each class's share of completed jobs at or below each job time (a step), row 1 column 1."""
    values: list[float] = []
    for cls, df in cdf.groupby("class", sort=False):
        x = df["value_ms"].to_numpy(float)
        values.extend(x.tolist())
        name = f"{esc_label(cls)} job time{suffix}"
        fig.add_trace(go.Scatter(x=f32(x), y=f32(df["fraction"].to_numpy(float) * 100), mode="lines+markers", name=name,
                                 line=dict(color=colors[cls], width=2, dash=dash, shape="hv"), marker=dict(size=5),
                                 hovertemplate=f"{name}: %{{y:.1f}}% of jobs ≤ %{{x:,.1f}} ms<extra></extra>"), row=1, col=1)
    return values


def _add_rounds(fig: go.Figure, rounds: pd.DataFrame, metric: str, colors: dict, dash: str | None, suffix: str) -> bool:
    """Each class's TTFT (or latency) p50 by round, and its hit rate by round on the right axis, row 1
    column 2; returns whether a hit rate was drawn."""
    label = "TTFT" if metric == "ttft" else "latency"
    hit = False
    for cls, df in rounds.groupby("class", sort=False):
        df = df.sort_values("round")
        x = df["round"].to_numpy(int)
        name = f"{esc_label(cls)} {label} p50{suffix}"
        fig.add_trace(go.Scatter(x=x, y=f32(df[f"{metric}_p50_ms"].to_numpy(float)), mode="lines+markers", name=name,
                                 line=dict(color=colors[cls], width=2, dash=dash), marker=dict(size=7),
                                 hovertemplate=f"{name} round %{{x}}: %{{y:.2f}} ms<extra></extra>"), row=1, col=2)
        rate = df["hit_rate"].to_numpy(float) * 100
        if np.isfinite(rate).any():
            hit = True
            name = f"{esc_label(cls)} hit rate{suffix}"
            fig.add_trace(go.Scatter(x=x, y=f32(rate), mode="lines+markers", name=name,
                                     line=dict(color=HIT_COLOR, width=1.5, dash=dash or "dot"),
                                     marker=dict(symbol="square", size=6),
                                     hovertemplate=f"{name} round %{{x}}: %{{y:.1f}}%<extra></extra>"),
                          row=1, col=2, secondary_y=True)
    return hit


def _lane_name(lane: int) -> str:
    return "job" if lane == 0 else f"sub-agent {lane}"


def _add_timeline(fig: go.Figure, timeline: JobTimeline, row: int, col: int, shown: set[str]) -> None:
    """One job's lanes: a horizontal bar per segment, a tick at each round's first token."""
    segments = timeline.segments
    for (kind, critical), (name, color) in SEGMENTS.items():
        df = segments[(segments["kind"] == kind) & (segments["critical"] == critical)]
        if not len(df):
            continue
        start, end = df["start_ms"].to_numpy(float), df["end_ms"].to_numpy(float)
        words = "model" if kind == "model" else "tool wait"
        text = [f"{_lane_name(lane)} round {k}: {words} {fmt_ms(e - s)} ms ({fmt_ms(s)} → {fmt_ms(e)} ms)"
                + ("" if math.isnan(t) else f", first token after {fmt_ms(t - s)} ms")
                for lane, k, s, e, t in zip(df["lane"], df["round"], start, end, df["ttft_ms"].to_numpy(float))]
        fig.add_trace(go.Bar(orientation="h", y=[_lane_name(lane) for lane in df["lane"]], x=f32(end - start), base=f32(start),
                             width=0.6, name=name, legendgroup=name, showlegend=name not in shown, marker_color=color,
                             hovertext=text, hovertemplate="%{hovertext}<extra></extra>"), row=row, col=col)
        shown.add(name)
    ticks = segments[segments["ttft_ms"].notna()]
    if len(ticks):
        name = "first token"
        fig.add_trace(go.Scatter(x=f32(ticks["ttft_ms"].to_numpy(float)), y=[_lane_name(lane) for lane in ticks["lane"]],
                                 mode="markers", name=name, legendgroup=name, showlegend=name not in shown,
                                 marker=dict(symbol="line-ns", size=12, line=dict(width=2, color=FIRST_TOKEN)),
                                 hovertemplate="first token at %{x:,.1f} ms<extra></extra>"), row=row, col=col)
        shown.add(name)
    lanes = [_lane_name(lane) for lane in sorted(set(segments["lane"]))]
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=lanes[::-1], row=row, col=col)


def _timeline_title(cls: str, which: str, timeline: JobTimeline | None, run: str) -> str:
    who = f"{run} run · " if run else ""
    if timeline is None:
        return f"{who}{esc_label(cls)}: no completed job to draw"
    return (f"{who}{esc_label(cls)} {WHICH[which]}: {fmt_ms(timeline.job_time_ms)} ms "
            f"(job {timeline.job} at {timeline.start_s:,.1f} s, {timeline.rank:,} of {timeline.of:,} by job time)")


def _timeline_rows(runs: list[tuple[str, Data]], compare: bool) -> list[list[tuple[str, JobTimeline | None]]]:
    """The timeline rows, each two (title, timeline) cells: per class, its median and p99 job; when
    comparing, per class and job, the base run's and the new run's. A class none of whose runs has a
    completed job in requests.parquet gets no row."""
    classes = list(dict.fromkeys(c for _, d in runs for c in d[3]))
    rows = []
    for cls in classes:
        by_run = [(run, {t.which: t for t in d[3].get(cls, [])}) for run, d in runs]
        if not any(found for _, found in by_run):
            continue
        if not compare:
            found = by_run[0][1]
            rows.append([(_timeline_title(cls, w, found[w], ""), found[w]) for w in WHICH])
            continue
        for which in WHICH:
            rows.append([(_timeline_title(cls, which, found.get(which), run), found.get(which)) for run, found in by_run])
    return rows


def _note(runs: list[tuple[str, Data]], metric: str, compare: bool) -> str:
    metric_words = "TTFT" if metric == "ttft" else "latency (no streamed tokens, so no TTFT)"
    note = ("Top left: the share of completed jobs (outside warm-up) whose job time — round 1's intended send to the last "
            "answer's end, what the user waits for — was at most that long (histograms.hlog, 3 significant digits). Top right: "
            f"each round's {metric_words} p50, and the share of its prompt tokens the server said came from its prefix "
            "cache (a round re-sends the context so far). Below: the critical path of the job at the median job time and "
            "of the one at the p99 (nearest rank among the completed jobs in requests.parquet): each round from its intended "
            "send to its answer's end (the tick: its first token), the tool waits between them, and during a fan-out each "
            "sub-agent in a lane of its own, all at once; the job's next round goes when the last of them ended. In the "
            "darker colours, the critical path: its segments add up to the job time.")
    for run, (table, _, _, timelines, summary) in runs:
        who = f"The {run} run" if compare else "This run"
        records = summary.get("request_records")
        missing = [esc_label(c) for c in table["class"] if not timelines.get(c)]
        if not isinstance(records, dict):
            note += f" {who} kept no per-request records (requests.parquet): no job's critical path to draw."
        elif missing:
            note += f" {who} has no completed job in requests.parquet to draw for {', '.join(missing)}."
        if isinstance(records, dict) and records.get("sampled"):
            note += (f" {who}'s requests.parquet holds a sample of its requests (summary.json request_records): its "
                     "timelines are of the jobs the sample kept whole.")
    if compare:
        note += " Base dashed and on the left, new solid and on the right."
    return note


def draw(new: Data, base: Data | None = None) -> Panel:
    """The panel from gather()'s data of the run, or of both runs (`base`: the base run's)."""
    compare = base is not None
    panel = Panel("agents", TITLE + (": base (dashed) vs new (solid)" if compare else ""))
    runs: list[tuple[str, Data]] = [("base", base), ("new", new)] if compare else [("", new)]
    if not any(len(d[0]) for _, d in runs):
        panel.note = ("Neither run had agent jobs." if compare else
                      "This run had no agent jobs (a class's <code>agent:</code>: rounds of tool calls over one growing "
                      "context, with tool waits and sub-agents).")
        panel.not_measured = "agent jobs"
        return panel
    classes = list(dict.fromkeys(c for _, d in runs for c in d[0]["class"]))
    colors = {c: COLORS[i % len(COLORS)] for i, c in enumerate(classes)}
    metric = "ttft" if any(len(d[1]) and (d[1]["ttft_count"] > 0).any() for _, d in runs) else "latency"
    timeline_rows = _timeline_rows(runs, compare)
    heights = [TOP_HEIGHT] + [TIMELINE_BASE + LANE_HEIGHT * max(len(set(t.segments["lane"])) if t else 1 for _, t in row)
                              for row in timeline_rows]
    total = sum(heights) + GAP * (len(heights) - 1)
    fig = make_subplots(rows=len(heights), cols=2, row_heights=heights, vertical_spacing=GAP / total,
                        horizontal_spacing=0.1,
                        specs=[[{}, {"secondary_y": True}]] + [[{}, {}]] * len(timeline_rows),
                        subplot_titles=["Job time: share of completed jobs at or below (CDF)",
                                        f"{'TTFT' if metric == 'ttft' else 'Latency'} p50 and prefix-cache hit rate by round"]
                        + [title for row in timeline_rows for title, _ in row])
    cdf_values: list[float] = []
    hit = False
    for run, (_, rounds, cdf, _, _) in runs:
        dash, suffix = ("dash", " (base)") if run == "base" else (None, " (new)" if compare else "")
        cdf_values += _add_cdf(fig, cdf, colors, dash, suffix)
        hit |= _add_rounds(fig, rounds, metric, colors, dash, suffix)
    finite = np.asarray([v for v in cdf_values if v > 0])
    if len(finite) and finite.max() / finite.min() > 20:
        fig.update_xaxes(title_text="job time (ms), log scale", type="log", **log_ticks(finite), row=1, col=1)
    else:
        fig.update_xaxes(title_text="job time (ms)", row=1, col=1)
    fig.update_yaxes(title_text="% of completed jobs", range=[0, 102], row=1, col=1)
    fig.update_xaxes(title_text="round", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text=f"{'TTFT' if metric == 'ttft' else 'latency'} p50 (ms)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="hit rate (%)" if hit else "hit rate (the server reported no cached tokens)", range=[0, 105],
                     tickmode="linear", tick0=0, dtick=20, showgrid=False, row=1, col=2, secondary_y=True)
    shown: set[str] = set()
    for r, row in enumerate(timeline_rows, start=2):
        longest = max((t.job_time_ms for _, t in row if t is not None), default=1.0)
        for c, (_, timeline) in enumerate(row, start=1):
            if timeline is not None:
                _add_timeline(fig, timeline, r, c, shown)
            fig.update_xaxes(title_text="ms since the job started", range=[0, longest * 1.02], row=r, col=c)
    fig.update_layout(barmode="overlay")
    panel.figure = apply_layout(fig, total + 150, hovermode="closest", margin={**MARGIN, "t": 100},
                                legend=dict(orientation="h", yanchor="top", y=0.995, yref="container", xanchor="left", x=0))
    rounds_html = class_table([(run, d[1]) for run, d in runs], _ROUND_COLUMNS, compare, _WRITE)
    limited = any((d[0]["history_limit"] > 0).any() for _, d in runs)  # the column only where it says something
    job_columns = _JOB_COLUMNS[:4] + (("history limit", "history_limit", "int"),) * limited + _JOB_COLUMNS[4:]
    panel.html = class_table([(run, d[0]) for run, d in runs], job_columns, compare, _WRITE) + (
        f"<details><summary>Every round of the jobs (outside warm-up; sub-agents' rounds not included)</summary>"
        f"{rounds_html}</details>" if rounds_html else "")
    panel.note = _note(runs, metric, compare)
    alone = [run for run, d in runs if len(d[0])]
    if compare and len(alone) == 1:
        missing = "new" if alone[0] == "base" else "base"
        panel.note += f" The {missing} run had no agent jobs, so only the {alone[0]} run's are here."
    return panel
