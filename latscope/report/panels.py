"""The report's panels, listed once: `PANELS`, in page order, read by both the single-run page
(html.report_html) and the run-vs-run page (compare.compare_html).

Each entry's `build(run, base)` gathers what its panel needs from latscope.analysis and hands it to
its figures function: with base None, the single-run panel of `run`; with a base run, the same
panel with both runs (`run` is then the new one) — overlaid where they share axes (base dashed,
new solid), side by side where they do not (the cold-start table, the correlation tables). Each
page wraps every build in html.safe_panel, so one panel that fails is a note, not a lost page. A build
whose run (on the compare page: both runs) has nothing for its panel returns it with `not_measured`
set, and the page names it in one line instead of drawing its card (html.page).

A new panel is one entry here (plus its function in figures.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from latscope.analysis import coldstart, correlation, explain, percentiles, serialization, server_signals, sessions
from latscope.analysis.run_data import RunData
from latscope.report import figures
from latscope.report.agents_panel import agents_panel
from latscope.report.coldstart_panel import coldstart_panel as draw_coldstart
from latscope.report.escape import esc_html
from latscope.report.figures import Panel
from latscope.report.models_panel import models_panel as draw_models
from latscope.report.nodes_panel import add_nodes, node_traces
from latscope.report.sessions_panel import sessions_panel as draw_sessions
from latscope.report.server_panel import server_panel as draw_server
from latscope.report.why_panel import why_panel as draw_why
from latscope.results.schema import metric_label


@dataclass(frozen=True)
class PanelSpec:
    id: str  # the panel's id (Panel.id), for the note of a panel that failed
    title: str  # its title in that note
    build: Callable[[RunData, RunData | None], Panel]  # (run, base): base None for the single-run page
    compare_title: str | None = None  # the title in that note on the compare page, where it differs


# -- data gathering shared by several panels ------------------------------------------------------

def classes_of(summary: dict, metric: str = "latency") -> list[str]:
    return list(summary.get("metrics", {}).get(metric, {}))


def generator_lags(run: RunData) -> tuple:
    """(send lag, event-loop lag) per interval, class "all"; None for one the run did not record."""
    metrics = run.summary.get("metrics", {})
    return tuple(percentiles.interval_percentiles(run, m, "all") if m in metrics else None for m in ("send_lag", "loop_lag"))


def cold_start_data(run: RunData) -> tuple[list[dict], dict, list[dict]]:
    """(capacity events, their latency series by (metric, class), every start) for the cold-start panel:
    from summary.json's cold_start, which the run analysed already, or analysed now for a run without one."""
    cold = run.summary.get("cold_start") or coldstart.cold_start_summary(run)
    events = coldstart.capacity_events(cold)
    series = {(e["metric"], e["class"]): percentiles.interval_percentiles(run, e["metric"], e["class"]) for e in events}
    return events, series, cold["starts"]


def serialization_both(base: RunData, new: RunData) -> tuple[pd.DataFrame, list[str]]:
    """Both runs' serialization breakdowns in one frame, each class's base bar then its new bar
    (classes renamed "CLASS · base", "CLASS · new"), and which runs ("base", "new") had any parts;
    (an empty frame, []) when neither had."""
    both = [(df, which) for df, which in ((serialization.breakdown(base), "base"), (serialization.breakdown(new), "new"))
            if not df.empty]
    if not both:
        return pd.DataFrame(), []
    frame = pd.concat([df.assign(run=which) for df, which in both], ignore_index=True)
    order = {c: i for i, c in enumerate(dict.fromkeys(frame["class"]))}
    frame = frame.sort_values(["class", "run"], key=lambda col: col.map(order) if col.name == "class" else col, kind="stable")
    frame["class"] = frame["class"] + " · " + frame["run"]
    return frame.drop(columns="run"), [which for _, which in both]


# -- one build per panel, (run, base) -> Panel, each named after the figures function it calls -----

def spectrum_panel(run: RunData, base: RunData | None = None) -> Panel:
    if base is None:
        return figures.spectrum_panel(percentiles.spectrum(run, "latency"))
    return figures.spectrum_panel(percentiles.spectrum(run), base_spectra=percentiles.spectrum(base))


def latency_time_panel(run: RunData, base: RunData | None = None) -> Panel:
    s = run.summary
    if base is None:
        by_class = {c: percentiles.interval_percentiles(run, "latency", c) for c in classes_of(s) or ["all"]}
        return figures.latency_time_panel(by_class, s, run.events)
    # all classes only: per-class lines for two runs would bury the comparison
    return figures.latency_time_panel({"all": percentiles.interval_percentiles(run)}, s, run.events,
                                      base_by_class={"all": percentiles.interval_percentiles(base)}, base_summary=base.summary)


def load_time_panel(run: RunData, base: RunData | None = None) -> Panel:
    if base is None:
        return figures.load_time_panel(percentiles.interval_percentiles(run, "latency", "all"), run.summary, run.events)
    return figures.load_time_panel(percentiles.interval_percentiles(run), run.summary, run.events,
                                   base_overall=percentiles.interval_percentiles(base), base_summary=base.summary)


def streaming_panel(run: RunData, base: RunData | None = None) -> Panel:
    def spectra(r: RunData) -> dict:
        metrics = r.summary.get("metrics", {})
        return {m: percentiles.spectrum(r, m) for m, _ in figures.STREAMING_METRICS if m in metrics}

    panel = (figures.streaming_panel(spectra(run)) if base is None
             else figures.streaming_panel(spectra(run), compare_with=spectra(base)))
    empty = {c: n["empty"] for c, n in (run.summary.get("requests_by_class") or {}).items() if n.get("empty")}
    if empty and panel.figure is not None:  # completed answers with 0 output tokens: no TTFT, counted apart
        panel.note += " Empty answers (completed with 0 output tokens, no TTFT): " + ", ".join(
            f"{esc_html(c)} {n:,}" for c, n in empty.items()) + "."
    return panel


def gpu_panel(run: RunData, base: RunData | None = None) -> Panel:
    if base is None:
        panel = figures.gpu_panel(run.telemetry, run.summary, run.events)
        if panel.figure is not None:
            panel.html = figures.correlation_table(correlation.correlations(run))
        return panel
    panel = figures.gpu_panel(run.telemetry, run.summary, run.events, base_telemetry=base.telemetry, base_summary=base.summary)
    if panel.figure is not None:
        tables = [(which, figures.correlation_table(correlation.correlations(r))) for which, r in (("base", base), ("new", run))]
        if any(table for _, table in tables):
            panel.html = "<div class=\"grid\">" + "".join(
                f"<div><h3>{which} run</h3>{table or '<p>No telemetry series to correlate.</p>'}</div>" for which, table in tables) + "</div>"
    return panel


def coldstart_panel(run: RunData, base: RunData | None = None) -> Panel:
    events, series, starts = cold_start_data(run)
    if base is None:
        return draw_coldstart(events, series, starts)
    base_events, base_series, base_starts = cold_start_data(base)
    return draw_coldstart(events, series, starts, base_events, base_series, base_starts)


def serialization_panel(run: RunData, base: RunData | None = None) -> Panel:
    if base is None:
        return figures.serialization_panel(serialization.breakdown(run))
    frame, runs = serialization_both(base, run)
    panel = figures.serialization_panel(frame, compare=True)
    if not runs:
        return panel
    panel.title = "Serialization: where a request's time goes, base vs new"
    if len(runs) == 1:
        missing = "new" if runs[0] == "base" else "base"
        panel.note += f" The {missing} run recorded no encode/decode or Server-Timing parts, so only the {runs[0]} run's bars are here."
    return panel


def generator_panel(run: RunData, base: RunData | None = None) -> Panel:
    """The run-wide lags and CPU (figures.generator_panel) plus, for a distributed run, each machine's
    lines and table (nodes_panel); a run on one machine gets nothing more."""
    send, loop = generator_lags(run)
    if base is None:
        panel = figures.generator_panel(send, loop, run.summary, run.telemetry, extra=node_traces(run.nodes, run.summary))
        return add_nodes(panel, [(run.nodes, run.summary, "")])
    base_send, base_loop = generator_lags(base)
    extra = node_traces(base.nodes, base.summary, "dash", " (base)") + node_traces(run.nodes, run.summary, None, " (new)")
    panel = figures.generator_panel(send, loop, run.summary, run.telemetry, base_send_lag=base_send, base_loop_lag=base_loop,
                                    base_summary=base.summary, base_telemetry=base.telemetry, extra=extra)
    return add_nodes(panel, [(base.nodes, base.summary, "base"), (run.nodes, run.summary, "new")])


def sessions_panel(run: RunData, base: RunData | None = None) -> Panel:
    def data(r: RunData) -> tuple:  # sessions, turns, timeline, prefix cache per class, load model, summary
        return (sessions.session_table(r), sessions.turn_table(r), sessions.session_timeline(r),
                sessions.prefix_cache_table(r), sessions.load_model(r.summary), r.summary)

    if base is None:
        return draw_sessions(*data(run))
    return draw_sessions(*data(run), base=data(base))


def why_panel(run: RunData, base: RunData | None = None) -> Panel:
    """The tail explained (analysis.explain): explain.json as the run wrote it, or explained now."""
    if base is None:
        return draw_why(explain.explanation(run))
    return draw_why(explain.explanation(run), explain.explanation(base), compare=True)


def server_panel(run: RunData, base: RunData | None = None) -> Panel:
    """The server's own TTFT and end-to-end time beside the client's (analysis/server_signals.py);
    on the compare page, the new run's, or the base run's when only it has them."""
    def rows(r: RunData) -> list:
        return [(metric_label(client), label, server_signals.client_vs_server(r, client, signal))
                for client, signal, label in server_signals.PAIRS]

    new = rows(run)
    if base is None or any(len(frame) for *_, frame in new):
        return draw_server(new, run.summary, run.events, "" if base is None else " (new run)")
    return draw_server(rows(base), base.summary, base.events, " (base run)")


def models_panel(run: RunData, base: RunData | None = None) -> Panel:
    """Each model's percentiles and the fairness line, from summary.json's `models` (analysis/models.py)."""
    if base is None:
        return draw_models(run.summary.get("models") or {})
    return draw_models(run.summary.get("models") or {}, base.summary.get("models") or {}, compare=True)


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("why", "Why the tail", why_panel),
    PanelSpec("spectrum", "Latency percentile spectrum", spectrum_panel),
    PanelSpec("latency-time", "Latency over time", latency_time_panel),
    PanelSpec("load-time", "Load: offered vs achieved rate, in flight, errors", load_time_panel, compare_title="Load"),
    PanelSpec("streaming", "Streaming", streaming_panel),
    PanelSpec("models", "Models", models_panel),
    PanelSpec("server-view", "Server's view", server_panel),
    PanelSpec("sessions", "Sessions and prefix cache", sessions_panel),
    PanelSpec("agents", "Agents", agents_panel),
    PanelSpec("gpu", "GPU lanes", gpu_panel),
    PanelSpec("coldstart", "Cold starts", coldstart_panel),
    PanelSpec("serialization", "Serialization", serialization_panel),
    PanelSpec("generator", "Generator health", generator_panel),
)
