"""What a person sees in the terminal: live progress during a run and the final summary table.

On a terminal, progress is a live panel refreshed every interval; elsewhere (CI logs) it is one
plain line every PLAIN_EVERY_S seconds, so logs stay readable.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from latscope.analysis import coldstart
from latscope.report.words import event_text
from latscope.run import Progress

PLAIN_EVERY_S = 10.0
STYLE = {"valid": "bold green", "degraded": "bold yellow", "invalid": "bold red"}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.2f}"


def progress_line(p: Progress) -> str:
    return (
        f"{p.elapsed_s:6.1f}/{p.duration_s:.0f}s  phase {p.phase or '-':<12} offered {p.offered_rps:8.1f}/s  "
        f"achieved {p.achieved_rps:8.1f}/s  in flight {p.in_flight:5d}  p50 {_ms(p.p50_ms)} ms  "
        f"p99 {_ms(p.p99_ms)} ms  errors {p.errors}" + (f"  [stopping: {p.stopping}]" if p.stopping else "")
    )


def event_line(e: dict) -> str:
    """A notable event (run.NOTABLE_EVENTS) as one line for the terminal: its time, then its words
    (report/words.py's event_text, which the report's time plots share)."""
    at = f"{e['t_s']:7.1f} s" if e.get("t_s") is not None else " before t=0"
    return f"{at}  {event_text(e)}"


class ProgressDisplay:
    """A context manager whose instances are the `on_progress` callback of `run_scenario`."""

    def __init__(self, console: Console, enabled: bool = True):
        self.console = console
        self.enabled = enabled
        self._live: Live | None = None
        self._last_plain = 0.0
        self._events_printed = 0

    def __enter__(self) -> "ProgressDisplay":
        if self.enabled and self.console.is_terminal:
            self._live = Live(Text("starting…"), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        new = min(p.events_seen - self._events_printed, len(p.recent_events))
        for event in p.recent_events[len(p.recent_events) - new:] if new > 0 else ():
            # Text: replica ids and errors come from the target and are not rich markup
            (self._live.console if self._live is not None else self.console).print(Text(event_line(event), style="cyan"))
        self._events_printed = p.events_seen
        if self._live is not None:
            self._live.update(self._panel(p))
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            self.console.print(progress_line(p), highlight=False, soft_wrap=True)

    @staticmethod
    def _panel(p: Progress) -> Table:
        table = Table.grid(padding=(0, 2))
        fraction = min(1.0, p.elapsed_s / p.duration_s) if p.duration_s else 1.0
        bar = "█" * int(fraction * 30) + "░" * (30 - int(fraction * 30))
        table.add_row("elapsed", f"{bar} {p.elapsed_s:.1f} / {p.duration_s:.1f} s", "phase", p.phase or "-")
        table.add_row("offered", f"{p.offered_rps:,.1f} req/s", "achieved", f"{p.achieved_rps:,.1f} req/s")
        table.add_row("in flight", f"{p.in_flight:,}", "sent / completed", f"{p.sent:,} / {p.completed:,}")
        table.add_row("latency p50", f"{_ms(p.p50_ms)} ms", "latency p99", f"{_ms(p.p99_ms)} ms")
        table.add_row("errors", f"{p.errors:,}", "", Text(f"stopping: {p.stopping}", "yellow") if p.stopping else "")
        return table


def summary_table(summary: dict) -> Table:
    """Percentiles per metric × class, as in summary.json."""
    table = Table(title=f"latscope · {summary['scenario']}", title_justify="left")
    for column in ("metric", "class", "count", "p50", "p90", "p99", "p99.9", "max"):
        table.add_column(column + (" ms" if column.startswith("p") or column == "max" else ""),
                         justify="left" if column in ("metric", "class") else "right", no_wrap=True)
    for metric, by_class in summary["metrics"].items():
        for cls, s in by_class.items():
            table.add_row(metric, cls, f"{s.get('count', 0):,}", *(_ms(s.get(k)) for k in
                          ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms")))
    return table


def print_summary(console: Console, summary: dict, run_dir: object) -> None:
    console.print(summary_table(summary))
    r, t = summary["requests"], summary["throughput"]
    console.print(
        f"requests: {r['sent']:,} sent, {r['completed']:,} completed, {r['errors']:,} errors, "
        f"{r['dropped']:,} dropped, {r['late']:,} late · offered {t['offered_rps']:,.1f}/s, achieved {t['achieved_rps']:,.1f}/s",
        highlight=False,
    )
    errors = {k: v for k, v in summary["errors"].items() if v}
    if errors:
        console.print("errors by kind: " + ", ".join(f"{k} {v:,}" for k, v in errors.items()), highlight=False)
        for kind, examples in summary.get("error_examples", {}).items():
            console.print(Text(f"  {kind}: {examples[0]}", style="dim"))
    for slo in summary["slo"]:
        mark = Text("PASS", "green") if slo["passed"] else Text("FAIL", "red")
        console.print(Text.assemble("SLO ", mark, f" {slo['metric']}/{slo['class']} {slo['stat']} "
                                    f"{_ms(slo['value'])} {'≥' if slo.get('direction') == 'min' else '≤'} {slo['limit']:g}"))
    for event in coldstart.capacity_events(summary.get("cold_start")):
        console.print(Text.assemble(Text("cold start" if event.get("cold") else "capacity change",
                                         "bold red" if event.get("cold") else "green"),
                                    f" {coldstart.title(event)}: {coldstart.describe(event)}"), highlight=False)
    stamp = summary["validity"]
    console.print(Text.assemble("measurement: ", Text(stamp.upper(), STYLE[stamp]),
                                *(f"\n  - {reason}" for reason in summary["validity_reasons"])))
    if summary["partial"]:
        console.print(Text(f"partial run: {summary['abort_reason']}", "bold yellow"))
    console.print(f"results: {run_dir}", highlight=False)
