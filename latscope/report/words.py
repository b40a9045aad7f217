"""Events of events.jsonl, and summary.json's goodput, in words, in one place for the terminal and the
report (its time plots, its tables, summary.md).

- `event_text(e)`: the long form the terminal prints as a run goes (console.event_line puts the time
  before it): "action ping (http) ok, status 200 in 0.02 s", "new replica r1, first response 378 ms".
  Plain text: the terminal prints it as text, never as markup.
- `event_label(e, failed)`: the short label of the event's vertical line on a time plot (figures.
  add_phases_and_events): "ping (http, failed)", "new replica r1", "run stopped: reason", else the
  event's name with its replica, action or reason. Ready for plotly: every part that came from the
  scenario or the target goes through `esc_label`, and the label (for "run stopped", the reason) is
  cut at LABEL_CHARS characters after escaping; the words written here have no '&', '<' or '>'.

- `goodput_sentence(g)`: one entry of summary.json's goodput (results.schema.GOODPUT_STATS) as a
  sentence: "98.7% of requests met every objective, 74.0 req/s, 1,234 output tokens/s";
  `objectives_text(o)`: a class's objectives, "TTFT ≤ 500 ms, ITL (worst gap) ≤ 50 ms";
  `slo_value_text(stat, v, ms)`: an SLO verdict's value or limit in its unit ("98.7%", "74.0 req/s",
  or `ms(v)` + " ms" for a time statistic). Plain text.

It imports no plotly, so the terminal can use it without loading the figures.
"""

from __future__ import annotations

import math
from typing import Callable

from latscope.report.escape import esc_label

LABEL_CHARS = 80


def fmt_ms(value: float | None) -> str:
    """Milliseconds with about three significant digits: 0.412, 9.81, 41.2, 1,204."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if value < 10:
        return f"{value:.2f}" if value >= 1 else f"{value:.3f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def event_text(e: dict) -> str:
    """A notable event (run.NOTABLE_EVENTS) in words, for the terminal: plain text, not escaped."""
    kind = e["event"]
    if kind == "action_end":
        outcome = "ok" if e.get("ok") else "FAILED"
        detail = (f"status {e['status']}" if e.get("status") is not None else
                  f"exit code {e['exit_code']}" if e.get("exit_code") is not None else
                  f"ready after {e['ready_after_s']:.2f} s" if e.get("ready_after_s") is not None else "")
        error = f": {e['error']}" if e.get("error") else ""
        return f"action {e.get('name')} ({e.get('kind')}) {outcome}{', ' + detail if detail else ''} in {e.get('duration_s', 0):.2f} s{error}"
    if kind == "action_skipped":
        return f"action {e.get('name')} skipped: {e.get('reason')}"
    if kind == "replica_first_seen":
        first = f", first response {e['latency_ms']:,.0f} ms" if e.get("latency_ms") is not None else ""
        return f"new replica {e.get('replica')}{first}"
    if kind == "first_after_idle":
        outcome = f"error {e['error']}" if e.get("error") else f"{e.get('latency_ms', 0):,.0f} ms"
        return f"first request after {e.get('idle_gap_s', 0):.1f} s idle: {outcome}"
    if kind == "target_ready":
        return f"target ready after {e.get('after_s', 0):.2f} s"
    if kind == "target_stopped":
        return f"target stopped (exit code {e.get('exit_code')})"
    return f"{kind.replace('_', ' ')}: {e.get('reason', '')}"


def event_label(e: dict, failed: bool = False) -> str:
    """The short label of an event's line on a time plot, escaped with esc_label for plotly.
    `failed`: for an action_start, whether that action ended in failure (its action_end says so)."""
    kind = e["event"]
    if kind == "action_start":  # scenario actions (actions.py): named, and whether they failed
        return esc_label(f"{e.get('name', '?')} ({e.get('kind', 'action')}{', failed' if failed else ''})")[:LABEL_CHARS]
    if kind == "replica_first_seen":
        return f"new replica {esc_label(e.get('replica', '?'))}"
    if kind == "abort":
        return f"run stopped: {esc_label(e.get('reason', ''))[:LABEL_CHARS]}"
    detail = e.get("replica") or e.get("action") or e.get("reason") or ""
    return esc_label(kind.replace("_", " ") + (f" {detail}" if detail else ""))[:LABEL_CHARS]


OBJECTIVE_WORDS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL (worst gap)", "latency_ms": "latency",
                   "ttfot_ms": "TTFOT"}


def objectives_text(objectives: dict) -> str:
    """A class's goodput objectives ({"ttft_ms": 500, ...}) in words, plain text, not escaped."""
    return ", ".join(f"{OBJECTIVE_WORDS.get(k, k)} ≤ {v:,g} ms" for k, v in objectives.items())


def goodput_sentence(g: dict) -> str:
    """One class's (or "all"'s) goodput in words, plain text: how many requests were good, at what rate."""
    if g.get("fraction") is None:
        return "no request was measured"
    tokens = g.get("output_tokens_per_s") or 0
    return (f"{g['fraction']:.1%} of requests met every objective ({g.get('good', 0):,} of {g.get('total', 0):,}), "
            f"{g.get('rps', 0):,.1f} req/s" + (f", {tokens:,.0f} output tokens/s" if tokens else ""))


def slo_value_text(stat: str, value: float | None, ms: Callable[[float], str]) -> str:
    """An SLO verdict's value or limit (summary.json's slo[].value / limit) in the unit of its `stat`:
    a fraction as a percentage, a rate in req/s, a time statistic as `ms(value)` ms; "–" for none."""
    if value is None:
        return "–"
    if stat in ("error_rate", "fraction"):
        return f"{value:.2%}" if stat == "error_rate" else f"{value:.1%}"
    if stat in ("throughput", "rps"):
        return f"{value:,.1f} req/s"
    return f"{ms(value)} ms"
