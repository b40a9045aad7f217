"""The "Why the tail" panel: what latscope.analysis.explain found when it compared the tail (requests
above a quantile of latency, or of TTFT for streams) with the body (the middle half) — its paragraph,
its causes ranked by effect size (a bar each, the ones that stand out in red), one small figure for
the top cause drawn from that cause's `detail` (the tail's share against everyone's by replica,
class, length…; the tail's share of the requests over time; a server signal at send time, tail
against body; the generator's delays) or, when nothing stands out, where the tail's extra time went
(the components, tail against body), and a table of every cause with its one sentence of evidence.
On the compare page: both runs' paragraphs and bars, the new run's picture.

It draws explain.json (docs/explain.md), which the run wrote beside summary.json, or what the
analysis returns now for a directory without one (panels.py gathers it); it computes nothing. A run
without per-request records (requests.parquet: every directory written before they existed) has no
tail to explain: the panel is not measured. When nothing stands out the panel says so, plainly, and
names no cause.

Every string in the explanation may embed what a target or scenario said (replica ids, class and
phase names, Server-Timing part names, error kinds), and explain.json is a file anyone can edit: all
of it goes through esc_label, in plotly labels and in this module's HTML text (no attribute value
here holds one); numbers are formatted, never pasted.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latscope.report.escape import esc_label
from latscope.report.figures import MARGIN, Panel, apply_layout, f32

TITLE = "Why the tail"
MAX_CAUSES = 8  # bars drawn; the table lists every cause explain.json holds
STANDS_OUT, QUIET = "#d62728", "#9aa5b1"
TAIL, BODY = "#d62728", "#1f77b4"
KIND_WORDS = {"generator": "the generator", "time": "when", "where": "where", "what": "what",
              "server_state": "server state"}
QUANTILES = ("p10", "p25", "p50", "p75", "p90")
MAX_TIME_BARS = 120  # bars of the tail over time; the analysis's bins are merged to fit


def _num(value: object) -> float | None:
    """A finite number from explain.json, else None (the file may be edited: never trust a type)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _causes(explain: dict) -> list[dict]:
    causes = explain.get("causes")
    return [c for c in causes if isinstance(c, dict)] if isinstance(causes, list) else []


def _dicts(value: object) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _numbers(value: object) -> list[float]:
    return [_num(v) or 0.0 for v in value] if isinstance(value, list) else []


def _stands_out(cause: dict) -> bool:
    return cause.get("stands_out") is True


def _label(cause: dict) -> str:
    """A cause for people, escaped: its label ("replica r2"), else its name ("replica=r2")."""
    return esc_label(cause.get("label") or cause.get("name") or "?")


def _kind(cause: dict) -> str:
    kind = str(cause.get("kind", ""))
    return esc_label(KIND_WORDS.get(kind, kind))


def _verdict(explain: dict) -> str:
    """The answer in a few bold words: the top cause, or nothing stands out ("" when there is too little
    data: the paragraph says so, and why)."""
    verdict = explain.get("verdict")
    top = next((c for c in _causes(explain) if _stands_out(c)), None)
    if verdict == "cause" and top is not None:
        return f'<b class="bad">Top cause: {_label(top)}.</b>'
    if verdict == "not_enough_data":  # the paragraph says so, and why
        return ""
    return '<b class="good">Nothing stands out.</b>'


def _tail_words(explain: dict) -> str:
    """"latency above its p99, 41.2 ms" from the explanation's metric, quantile and threshold."""
    metric = esc_label({"ttft": "TTFT"}.get(str(explain.get("metric")), str(explain.get("metric", "latency")).replace("_", " ")))
    q = _num(explain.get("quantile"))
    threshold = _num(explain.get("threshold_ms"))
    quantile = f"p{q * 100:g}" if q is not None else "quantile"
    return f"{metric} above its {quantile}" + (f", {threshold:,.1f} ms" if threshold is not None else "")


def _lead(runs: list[tuple[str, dict]]) -> str:
    return "".join(f'<p class="why">{f"<b>{label} run</b>: " if label else ""}{verdict + " " if (verdict := _verdict(explain)) else ""}'
                   f'{esc_label(explain.get("summary", ""))}</p>' for label, explain in runs)


def _effect_traces(fig: go.Figure, runs: list[tuple[str, dict]]) -> None:
    """One horizontal bar per cause (the strongest on top), its effect size 0…1; red where it stands out."""
    compare = len(runs) > 1
    for label, explain in runs:
        causes = _causes(explain)[:MAX_CAUSES][::-1]  # ranked by the analysis; plotly draws the first bar at the bottom
        if not causes:
            continue
        fig.add_trace(go.Bar(
            y=[_label(c) for c in causes], x=f32([_num(c.get("effect")) or 0.0 for c in causes]), orientation="h",
            name=f"{label} run" if compare else "effect size",
            marker=dict(color=[STANDS_OUT if _stands_out(c) else QUIET for c in causes],
                        pattern=dict(shape="/" if label == "base" else "")),
            customdata=[esc_label(c.get("evidence", "")) for c in causes],
            hovertemplate="%{y}: effect %{x:.2f}<br>%{customdata}<extra></extra>", showlegend=compare),
            row=1, col=1)
    fig.update_xaxes(title_text="effect: share of the tail explained", range=[0, 1.02], row=1, col=1)


def _pair(fig: go.Figure, x: list[str], rows: list[dict], keys: tuple[str, str], words: tuple[str, str], unit: str) -> None:
    """Two bar series side by side in the second subplot: everyone's (blue), then the tail's (red)."""
    for key, word, color in ((keys[0], words[0], BODY), (keys[1], words[1], TAIL)):
        fig.add_trace(go.Bar(x=x, y=f32([_num(r.get(key)) or 0.0 for r in rows]), name=word, marker_color=color,
                             hovertemplate="%{x}: %{y:" + unit + "}<extra>" + word + "</extra>"), row=1, col=2)


def _detail_traces(fig: go.Figure, cause: dict) -> str:
    """The top cause's picture from its `detail` (docs/explain.md), in the second subplot; returns its
    title ("" when the detail has nothing to draw)."""
    detail = cause.get("detail") if isinstance(cause.get("detail"), dict) else {}
    label = _label(cause)
    if groups := _dicts(detail.get("groups")):  # replica, class, phase, turn, lengths, bursts…: shares
        _pair(fig, [esc_label(g.get("label", "?")) for g in groups], groups, ("all_share", "tail_share"),
              ("share of all requests", "share of the tail"), ".1%")
        fig.update_yaxes(tickformat=".0%", row=1, col=2)
        return f"{label}<br>its share of the tail (red) and of all requests (blue)"
    if parts := _dicts(detail.get("components")):  # the generator: its delays in the tail against the body
        _pair(fig, [esc_label(p.get("name", "?")) for p in parts], parts, ("body_ms", "tail_ms"), ("body", "tail"), ".2f")
        fig.update_yaxes(title_text="mean ms", row=1, col=2)
        return f"{label}<br>its delays, mean in the tail (red) and in the body (blue)"
    if isinstance(detail.get("tail"), dict) and isinstance(detail.get("body"), dict):  # a server signal at send time
        rows = [{"q": q, "tail": _num(detail["tail"].get(q)), "body": _num(detail["body"].get(q))} for q in QUANTILES]
        _pair(fig, list(QUANTILES), rows, ("body", "tail"), ("body requests", "tail requests"), ".3g")
        fig.update_yaxes(title_text=esc_label(detail.get("signal", "value")), row=1, col=2)
        return f"{label} when each request was sent<br>in the tail (red) and in the body (blue)"
    bins, tail, every = _numbers(detail.get("bins_s")), _numbers(detail.get("tail")), _numbers(detail.get("all"))
    if bins and len(bins) == len(tail) == len(every) and sum(every) > 0:  # stretches of time
        _time_traces(fig, detail, bins, tail, every)
        return f"{label}<br>the tail's share of the requests over time (dashed: whole run)"
    return ""


def _time_traces(fig: go.Figure, detail: dict, bins: list[float], tail: list[float], every: list[float]) -> None:
    """The tail's share of the requests sent in each stretch of time (at most MAX_TIME_BARS bars: the
    analysis's bins merged), against its share over the whole run (dashed), its hot stretches shaded."""
    width = _num(detail.get("bin_s")) or (bins[1] - bins[0] if len(bins) > 1 else 1.0)
    factor = max(1, math.ceil(len(bins) / MAX_TIME_BARS))
    x, share = [], []
    for i in range(0, len(bins), factor):
        n = sum(every[i:i + factor])
        if n > 0:
            x.append(bins[i] + width * factor / 2)
            share.append(sum(tail[i:i + factor]) / n)
    fig.add_trace(go.Bar(x=f32(x), y=f32(share), width=width * factor, name="tail's share", marker_color=TAIL,
                         hovertemplate="%{x:.2f} s: %{y:.1%} in the tail<extra></extra>"), row=1, col=2)
    hot = detail.get("hot_s") if isinstance(detail.get("hot_s"), list) else []
    for start, end in [h for h in hot if isinstance(h, list) and len(h) == 2][:MAX_TIME_BARS]:
        if _num(start) is not None and _num(end) is not None:  # after the trace: plotly skips shapes on an empty subplot
            fig.add_vrect(x0=start, x1=max(end, start + width), fillcolor=TAIL, opacity=0.12, line_width=0, row=1, col=2)
    fig.add_hline(y=sum(tail) / sum(every), line=dict(color="#555", dash="dash", width=1), row=1, col=2)
    fig.update_xaxes(title_text="time since the run started (s)", row=1, col=2)
    fig.update_yaxes(tickformat=".0%", row=1, col=2)


def _component_traces(fig: go.Figure, explain: dict) -> str:
    """Where the tail's extra time went (explain.json `components`), tail against body, in the second subplot."""
    parts = [c for c in _dicts(explain.get("components")) if _num(c.get("tail_ms")) or _num(c.get("body_ms"))]
    if not parts:
        return ""
    _pair(fig, [esc_label(c.get("label") or c.get("name", "?")) for c in parts], parts, ("body_ms", "tail_ms"),
          ("body (mean)", "tail (mean)"), ".2f")
    fig.update_yaxes(title_text="ms", row=1, col=2)
    return "where the tail's extra time went<br>mean in the tail (red) and in the body (blue)"


def _table(runs: list[tuple[str, dict]]) -> str:
    compare = len(runs) > 1
    rows = []
    for label, explain in runs:
        for i, c in enumerate(_causes(explain), 1):
            effect, p = _num(c.get("effect")), _num(c.get("p_value"))
            rows.append(f"<tr class=\"{'bad' if _stands_out(c) else ''}\">" + (f"<td><b>{label}</b></td>" if compare else "")
                        + f"<td class=n>{i}</td><td>{_kind(c)}</td><td>{_label(c)}</td>"
                        f"<td class=n>{'–' if effect is None else f'{effect:.2f}'}</td>"
                        f"<td class=n>{'–' if p is None else f'{p:.1e}'}</td><td>{'yes' if _stands_out(c) else 'no'}</td>"
                        f"<td>{esc_label(c.get('evidence', ''))}</td></tr>")
    if not rows:
        return ""
    return ("<details><summary>Every cause, ranked, with its evidence</summary><table><tr>" + ("<th>run</th>" if compare else "")
            + "<th>#</th><th>kind</th><th>cause</th><th class=n>effect</th><th class=n>p</th><th>stands out</th>"
            "<th>evidence</th></tr>" + "".join(rows) + "</table></details>")


NOTE = ("The tail ({tail}) against the body (the middle half), cause by cause. Each bar is a cause's effect, the share of "
        "the tail it explains: 0, the tail is like everyone; 1, all of it. Red: it stands out, large, significant and "
        "recurring (docs/explain.md). Hover a bar for its evidence.")
NOT_MEASURED_NOTE = ("This run kept no per-request records (requests.parquet), so its tail cannot be explained: a run made "
                     "before latscope wrote them, or with <code>output.requests: off</code>. Run it again to get "
                     "<code>latscope explain</code>'s answer here.")


def why_panel(explain: dict | None, base: dict | None = None, compare: bool = False) -> Panel:
    """The panel from an explanation (explain.json's document; None when the run kept no per-request
    records). With compare, `base` is the base run's (None: it kept none) and both are drawn: the two
    paragraphs, each cause's effect bar by run, and the new run's top cause."""
    panel = Panel("why", TITLE + (": base vs new" if compare else ""))
    runs = [(label, e) for label, e in ((("base", base), ("new", explain)) if compare else (("", explain),)) if isinstance(e, dict)]
    if not runs:
        panel.note, panel.not_measured = NOT_MEASURED_NOTE, "per-request records (why the tail)"
        return panel
    panel.lead = _lead(runs)
    if compare and len(runs) == 1:
        panel.lead += f"<p class=\"note\">The {'base' if runs[0][0] == 'new' else 'new'} run kept no per-request records.</p>"
    panel.html = _table(runs)
    if not any(_causes(e) for _, e in runs):
        panel.note = "No cause to draw: " + ("too few requests in the tail." if runs[-1][1].get("verdict") == "not_enough_data"
                                             else "no candidate cause had evidence.")
        return panel
    new = runs[-1][1]
    top = next((c for c in _causes(new) if _stands_out(c)), None)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12,
                        subplot_titles=["causes, by effect", "detail"])
    _effect_traces(fig, runs)
    title = (_detail_traces(fig, top) if top is not None else "") or _component_traces(fig, new)
    if title:
        fig.layout.annotations[1].text = ("top cause: " if top is not None and title.startswith(_label(top)) else "") + title
    else:  # nothing more to draw: the bars take the whole width
        fig = make_subplots(rows=1, cols=1, subplot_titles=["causes, by effect"])
        _effect_traces(fig, runs)
    bars = max(len(_causes(e)[:MAX_CAUSES]) for _, e in runs) * len(runs)
    panel.figure = apply_layout(fig, max(300, 90 + 24 * bars), margin={**MARGIN, "l": 200, "t": 80}, hovermode="closest",
                                barmode="group", legend=dict(orientation="h", yanchor="top", y=0.99, yref="container",
                                                             xanchor="left", x=0))
    panel.note = NOTE.format(tail=_tail_words(new))
    return panel
