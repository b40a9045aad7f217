"""A distributed run's machines ("nodes") in the generator-health panel: a line per machine for its send
lag p99 and its engines' CPU over time (from nodes.parquet, drawn into figures.generator_panel's rows
through its `extra` traces), a cross where a machine was lost, and a table of the machines (from
summary.json's generator.nodes): host, engines, status, clock, requests, lags, CPU, validity. A lost
or failed machine leads the panel in a warning, in words ("lost at 4.2 s: no heartbeat for 3 s").

A run on one machine has neither nodes.parquet nor generator.nodes: nothing here adds anything to
its panel, which stays exactly as figures.generator_panel draws it.

Hosts, statuses and reasons come from remote machines (through summary.json and nodes.parquet,
files anyone can edit): every one goes through esc_label, in plotly labels and in this module's HTML
text; the one attribute value built from them, the validity badge's class, through esc_html.
`distributed_text` and `lost_texts` are plain text (escape them where they land).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from latscope.report.escape import esc_html, esc_label
from latscope.report.figures import Panel, f32
from latscope.report.words import fmt_ms

# Not figures.COLORS: those already colour the run-wide lags (blue, orange) and the host CPU lines of
# the same rows; no orange here either (ColorBrewer's Dark2, its orange last).
NODE_COLORS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666", "#d95f02")
LOST_COLOR = "#c62828"
DOWN = ("lost", "failed")  # the statuses of a machine that stopped before the run did


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: object) -> str:
    return f"{int(value):,}" if _finite(value) else "–"


def _plural(n: object, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# -- words ---------------------------------------------------------------------------------------

def distributed_text(generator: dict) -> str | None:
    """summary.json's generator of a distributed run in words, plain text: "2 machines, 4 engines
    (Locust master/worker)" ("2 of 3 machines" when fewer joined than expected); None for a run on one machine."""
    dist = generator.get("distributed")
    if not isinstance(dist, dict):
        return None
    joined, expected = dist.get("nodes", "?"), dist.get("nodes_expected")
    machines = _plural(joined, "machine") if expected in (None, joined) else f"{joined} of {expected} machines"
    engine = str(dist["engine"]).capitalize() + " " if dist.get("engine") else ""
    return f"{machines}, {_plural(dist.get('engines', generator.get('workers', '?')), 'engine')} ({engine}master/worker)"


def status_text(node: dict) -> str:
    """A machine's status in words, plain text: "ok", "lost at 4.2 s: no heartbeat for 3 s", "failed: …"."""
    status = str(node.get("status") or "unknown")
    at = node.get("lost_at_s")
    when = f" at {at:,.1f} s" if _finite(at) else ""
    reason = node.get("reason")
    return f"{status}{when}" + (f": {reason}" if reason else "")


def lost_texts(generator: dict) -> list[str]:
    """Each machine that was lost or failed, in words, plain text: "machine 1 (box-b) lost at 4.2 s: …"."""
    return [f"machine {n.get('node', '?')} ({n.get('host', '?')}) {status_text(n)}"
            for n in _summary_nodes(generator) if n.get("status") in DOWN]


def _summary_nodes(generator: dict) -> list[dict]:
    nodes = generator.get("nodes")
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


# -- the lines -----------------------------------------------------------------------------------

def _node_name(node: object, host: object) -> str:
    return f"machine {esc_label(node)} {esc_label(host)}"


def node_traces(nodes: pd.DataFrame, summary: dict, dash: str | None = None, suffix: str = "") -> list[tuple[str, go.Scatter]]:
    """(row, trace) for figures.generator_panel's `extra`: each machine's send lag p99 ("lag" row) and
    its engines' CPU ("cpu" row) per interval, one colour per machine, and a red cross where one was
    lost or failed. [] without nodes.parquet (a run on one machine)."""
    if nodes is None or nodes.empty:
        return []
    interval = summary.get("generator", {}).get("interval_s") or 1.0
    lost = {n.get("node"): n for n in _summary_nodes(summary.get("generator", {})) if n.get("status") in DOWN}
    out: list[tuple[str, go.Scatter]] = []
    for i, (node, df) in enumerate(nodes.sort_values(["node", "interval_start_s"]).groupby("node", sort=True)):
        name, color = _node_name(node, df["host"].iloc[-1]), NODE_COLORS[i % len(NODE_COLORS)]
        x = f32(df["interval_start_s"].to_numpy(float) + interval / 2)
        for row, column, what, unit in (("lag", "send_lag_p99_ms", "send lag p99", "%{y:.3f} ms"),
                                        ("cpu", "cpu_pct", "CPU", "%{y:.0f}%")):
            y = df[column].to_numpy(float)
            if np.isfinite(y).any():
                out.append((row, go.Scatter(x=x, y=f32(y), name=f"{name} {what}{suffix}", mode="lines",
                                            legendgroup=f"machine {node}{suffix}", hovertemplate=unit,
                                            line=dict(color=color, width=1.2, dash=dash))))
        if int(node) in lost:
            out += _lost_marker(lost[int(node)], df, name, interval, suffix)
    return out


def _lost_marker(node: dict, df: pd.DataFrame, name: str, interval: float, suffix: str) -> list[tuple[str, go.Scatter]]:
    """A red cross at the time a machine was lost (at the height of its last send lag), on the lag row."""
    at = node.get("lost_at_s")
    if not _finite(at):
        return []
    before = df[df["interval_start_s"] + interval / 2 <= at]["send_lag_p99_ms"].to_numpy(float)
    before = before[np.isfinite(before)]
    label = f"{name} {esc_label(node.get('status'))} at {at:,.1f} s{suffix}"
    return [("lag", go.Scatter(x=[at], y=[float(before[-1]) if len(before) else 0.0], name=label, mode="markers",
                               marker=dict(symbol="x", size=12, color=LOST_COLOR), hovertemplate=label + "<extra></extra>"))]


# -- the table -----------------------------------------------------------------------------------

def _clock(clock: dict) -> str:
    """Offset ± bound in ms: how far the machine's clock was from the run's, and how sure that is."""
    offset, bound = clock.get("offset_ms"), clock.get("bound_ms")
    if not _finite(offset):
        return "–"
    sign = "−" if offset < 0 else "+"
    return f"{sign}{fmt_ms(abs(offset))}" + (f" ± {fmt_ms(bound)}" if _finite(bound) else "")


def _drift(clock: dict) -> str:
    drift = clock.get("drift_ppm")
    return f"{drift:+,.1f}".replace("-", "−") if _finite(drift) else "–"


def _validity(value: object) -> str:
    return f'<span class="stamp {esc_html(value)}">{esc_label(value)}</span>' if value else "–"


def _row(node: dict) -> str:
    """One machine as a table row (trusted HTML): a lost or failed one red, its status in words."""
    down = node.get("status") in DOWN
    clock = node.get("clock") if isinstance(node.get("clock"), dict) else {}
    requests = node.get("requests") if isinstance(node.get("requests"), dict) else {}
    cpu = node.get("cpu_max_pct")
    cells = [f"<td>{esc_label(node.get('node', '?'))}</td>", f"<td class=host>{esc_label(node.get('host', '?'))}</td>",
             f"<td class=n>{_count(node.get('engines'))}</td>",
             f'<td class="status worse"><b>{esc_label(status_text(node))}</b></td>' if down
             else f'<td class="status">{esc_label(status_text(node))}</td>',
             f"<td class=n>{_clock(clock)}</td>", f"<td class=n>{_drift(clock)}</td>",
             *(f"<td class=n>{_count(requests.get(k))}</td>" for k in ("sent", "completed", "errors")),
             f"<td class=n>{fmt_ms(node.get('send_lag_p99_ms'))}</td>", f"<td class=n>{fmt_ms(node.get('loop_lag_p99_ms'))}</td>",
             f"<td class=n>{f'{cpu:,.0f}%' if _finite(cpu) else '–'}</td>", f"<td>{_validity(node.get('validity'))}</td>"]
    return ('<tr class="bad">' if down else "<tr>") + "".join(cells) + "</tr>"


HEADINGS = ("machine", "host", "engines", "status", "clock offset ± bound (ms)", "drift (ppm)", "sent", "completed",
            "errors", "send lag p99 (ms)", "loop lag p99 (ms)", "CPU max (% of a core)", "validity")
TEXT_HEADINGS = {"machine", "host", "status", "validity"}  # the others are numbers, right-aligned


def node_table(nodes: list[dict]) -> str:
    """The machines of a run as an HTML table (trusted; every value from the machines escaped); "" without any."""
    if not nodes:
        return ""
    head = "".join(f"<th>{h}</th>" if h in TEXT_HEADINGS else f"<th class=n>{h}</th>" for h in HEADINGS)
    return f'<table class="nodes"><tr>{head}</tr>' + "".join(_row(n) for n in nodes) + "</table>"


def frame_nodes(nodes: pd.DataFrame) -> list[dict]:
    """The table's rows from nodes.parquet alone, for a summary without generator.nodes (what the
    intervals tell: host, last status, requests, the highest CPU; the run-wide lags and clock are
    only in summary.json)."""
    rows = []
    for node, df in nodes.sort_values("interval_start_s").groupby("node", sort=True):
        cpu = df["cpu_pct"].to_numpy(float)
        rows.append({"node": int(node), "host": df["host"].iloc[-1], "status": df["status"].iloc[-1],
                     "requests": {k: int(df[k].sum()) for k in ("sent", "completed", "errors")},
                     "cpu_max_pct": float(np.nanmax(cpu)) if np.isfinite(cpu).any() else None})
    return rows


# -- the panel -----------------------------------------------------------------------------------

def _lost_lead(summary: dict, who: str) -> str:
    generator = summary.get("generator", {})
    policy = (generator.get("distributed") or {}).get("on_node_loss")
    after = f" (on node loss: {esc_label(policy)})" if policy else ""
    return "".join(f'<p class="warning">{who}<b>{esc_label(text[:1].upper() + text[1:])}</b>{after}</p>'
                   for text in lost_texts(generator))


def add_nodes(panel: Panel, sides: list[tuple[pd.DataFrame, dict, str]]) -> Panel:
    """The generator panel with each distributed run's machines: a warning per lost machine before
    the plot, a table per run after it, a sentence in the note. `sides`: (nodes.parquet, summary,
    who) per run drawn: ("", the run) alone, or ("base", …) then ("new", …). Unchanged when no run
    is distributed."""
    tables = [(who, _summary_nodes(s.get("generator", {})) or frame_nodes(nodes), s) for nodes, s, who in sides]
    tables = [(who, rows, s) for who, rows, s in tables if rows]
    if not tables:
        return panel
    compare = len(sides) > 1
    panel.lead += "".join(_lost_lead(s, f"<b>{who} run:</b> " if compare else "") for who, _, s in tables)
    panel.html += "".join((f"<h3>{who} run: {_machines(s, rows)}</h3>" if compare else "") + node_table(rows)
                          for who, rows, s in tables)
    panel.note += _node_note(tables, [who for _, _, who in sides], compare, panel.figure is not None)
    return panel


def _machines(summary: dict, rows: list[dict]) -> str:
    return esc_label(distributed_text(summary.get("generator", {})) or _plural(len(rows), "machine"))


def _node_note(tables: list, whos: list[str], compare: bool, drawn: bool) -> str:
    """The note's sentences on the machines (trusted text: numbers and words written here)."""
    errors = [f"{fmt_ms(e)} ms" for _, _, s in tables
              if _finite(e := ((s.get("generator", {}).get("distributed") or {}).get("clock") or {}).get("max_error_ms"))]
    lines = (" Per machine (thin lines, one colour each): its send lag p99 and its engines' CPU; a red cross marks a "
             "machine lost." if drawn else "")
    note = (lines + " Clock offset ± bound: how far each machine's clock was from the run's, as measured; each machine's "
            "times are mapped onto the run's clock" + (f", to within {' and '.join(errors)}" if errors else "") + ".")
    single = [who for who in whos if who not in {w for w, _, _ in tables}]
    return note + (f" The {single[0]} run ran on one machine." if compare and single else "")
