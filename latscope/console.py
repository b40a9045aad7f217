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
from latscope.analysis.models import fairness_lines
from latscope.analysis.sessions import closed_loop
from latscope.capacity import StepStart
from latscope.report.capacity_page import cost_line
from latscope.report.words import event_text, goodput_sentence, slo_value_text
from latscope.results.schema import TURN_PREFIX
from latscope.run import Progress
from latscope.run.token_counts import count_lines

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
        if metric.startswith(TURN_PREFIX):  # by turn: the sessions lines say it shorter
            continue
        for cls, s in by_class.items():
            table.add_row(metric, cls, f"{s.get('count', 0):,}", *(_ms(s.get(k)) for k in
                          ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms")))
    return table


def sessions_lines(summary: dict) -> list[str]:
    """A line per class with sessions: how they ended, TTFT p50 turn by turn, the prefix-cache hit rate;
    and one per class whose server reported cached tokens without sessions."""
    lines = []
    for cls, s in (summary.get("sessions") or {}).items():
        ttft = [t["ttft"].get("p50_ms") for t in s["by_turn"].values() if "ttft" in t]
        line = (f"sessions {cls}: {s['started']:,} started, {s['completed']:,} completed, {s['abandoned']:,} abandoned, "
                f"{s['cut']:,} cut, {s['turns_not_sent']:,} turns not sent")
        if s.get("history_limit"):  # ended at their carried history's bound (absent in older summaries)
            line = line.replace(" cut, ", f" cut, {s['history_limit']:,} at the history limit, ", 1)
        if any(v is not None for v in ttft):
            line += " · TTFT p50 by turn " + " → ".join(_ms(v) for v in ttft[:8]) + (" …" if len(ttft) > 8 else "") + " ms"
        if s["prefix_cache"]["hit_rate"] is not None:
            line += f" · prefix-cache hit rate {s['prefix_cache']['hit_rate']:.1%}"
        lines.append(line)
    for cls, t in (summary.get("tokens") or {}).items():
        if cls != "all" and cls not in (summary.get("sessions") or {}) and (cache := t.get("prefix_cache")):
            lines.append(f"prefix cache {cls}: {cache['cached_tokens']:,} of {cache['prompt_tokens']:,} prompt tokens "
                         f"cached ({cache['hit_rate']:.1%})")
    return lines


def answers_lines(summary: dict) -> list[str]:
    """A line per class whose answers reasoned or came back empty: its reasoning tokens (of the output
    tokens) and TTFOT p50 (the answer's first token), and its empty answers (completed, 0 tokens)."""
    lines, tokens, metrics = [], summary.get("tokens") or {}, summary.get("metrics") or {}
    for cls, counts in (summary.get("requests_by_class") or {}).items():
        reasoning, empty = (tokens.get(cls) or {}).get("reasoning_tokens", 0), counts.get("empty", 0)
        parts = []
        if reasoning:
            parts.append(f"{reasoning:,} reasoning tokens of {tokens[cls]['output_tokens']:,} output tokens")
            if ttfot := (metrics.get("ttfot") or {}).get(cls):
                parts.append(f"TTFOT p50 {_ms(ttfot.get('p50_ms'))} ms (TTFT p50 "
                             f"{_ms((metrics.get('ttft') or {}).get(cls, {}).get('p50_ms'))} ms)")
        if empty:
            parts.append(f"{empty:,} empty answers (completed with 0 output tokens, no TTFT)")
        if parts:
            lines.append(f"answers {cls}: " + " · ".join(parts))
    return lines


def batch_lines(summary: dict) -> list[str]:
    """A line per class of a batch protocol (embeddings, rerank): its items and input tokens per second."""
    return [f"batch {cls}: {b['items']:,} {b['unit']} ({b['items_per_request']:,.1f} a request) · {b['items_per_s']:,.1f} "
            f"{b['unit']}/s · {b['input_tokens_per_s']:,.1f} input tokens/s" for cls, b in (summary.get("batch") or {}).items()]


def print_summary(console: Console, summary: dict, run_dir: object) -> None:
    console.print(summary_table(summary))
    r, t = summary["requests"], summary["throughput"]
    console.print(
        f"requests: {r['sent']:,} sent, {r['completed']:,} completed, {r['errors']:,} errors, "
        f"{r['dropped']:,} dropped, {r['late']:,} late · offered {t['offered_rps']:,.1f}/s, achieved {t['achieved_rps']:,.1f}/s",
        highlight=False,
    )
    if r.get("unaccounted"):  # the counts do not add up: a latscope bug, never hidden
        console.print(Text(f"{r['unaccounted']:,} request(s) sent but counted neither completed, nor an error, nor "
                           "cancelled: a latscope bug", "bold red"))
    errors = {k: v for k, v in summary["errors"].items() if v}
    if errors:
        console.print("errors by kind: " + ", ".join(f"{k} {v:,}" for k, v in errors.items()), highlight=False)
        for kind, examples in summary.get("error_examples", {}).items():
            console.print(Text(f"  {kind}: {examples[0]}", style="dim"))
    if closed_loop(summary):
        load = summary["load"]
        console.print(Text(f"{load['users']:,} users, {load['note']}", "bold yellow"))
    for line in sessions_lines(summary):
        console.print(line, highlight=False)
    for line in answers_lines(summary):  # class names come from the scenario: text, never markup
        console.print(Text(line), highlight=False)
    for line in batch_lines(summary):
        console.print(Text(line), highlight=False)
    for line in count_lines(summary.get("tokens") or {}):  # where token counts came from (run/token_counts.py)
        console.print(Text(line), highlight=False)
    for line in fairness_lines(summary.get("models") or {}):  # model names come from the scenario: text, never markup
        console.print(Text(line), highlight=False)
    goodput = (summary.get("goodput") or {}).get("all")
    if goodput:
        console.print(f"goodput: {goodput_sentence(goodput)}", highlight=False)
    for slo in summary["slo"]:
        mark = Text("PASS", "green") if slo["passed"] else Text("FAIL", "red")
        value, limit = (_ms(slo["value"]), f"{slo['limit']:g}") if str(slo["stat"]).endswith("_ms") else (
            slo_value_text(slo["stat"], slo["value"], _ms), slo_value_text(slo["stat"], slo["limit"], _ms))
        console.print(Text.assemble("SLO ", mark, f" {slo['metric']}/{slo['class']} {slo['stat']} {value} "
                                    f"{'≥' if slo.get('direction') == 'min' else '≤'} {limit}"))
    for event in coldstart.capacity_events(summary.get("cold_start")):
        console.print(Text.assemble(Text("cold start" if event.get("cold") else "capacity change",
                                         "bold red" if event.get("cold") else "green"),
                                    f" {coldstart.title(event)}: {coldstart.describe(event)}"), highlight=False)
    for line in machines_lines(summary.get("generator") or {}):
        console.print(Text(line), highlight=False)
    stamp = summary["validity"]
    console.print(Text.assemble("measurement: ", Text(stamp.upper(), STYLE[stamp]),
                                *(f"\n  - {reason}" for reason in summary["validity_reasons"])))
    if summary["partial"]:
        console.print(Text(f"partial run: {summary['abort_reason']}", "bold yellow"))
    console.print(f"results: {run_dir}", highlight=False)


# -- latscope capacity ------------------------------------------------------------------------------


def _rate(r: float | None) -> str:
    return "—" if r is None else f"{r:,.4g}"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def step_start_line(s: StepStart) -> str:
    """A step about to run: its rate, the bracket so far, and at most how much is left."""
    again = f" extending (look {s.look} of {s.looks})" if s.longer else ""
    expected = f"about {s.steps_expected} more, " if s.steps_expected is not None else ""
    return (f"step {s.index}: {_rate(s.rate_rps)} req/s{again} · bracket [{_rate(s.low)}, {_rate(s.high)}] req/s · "
            f"{expected}at most {s.steps_left_max} steps, ≤ {_duration(s.time_left_max_s)} left")


def step_line(step: dict) -> str:
    """A judged step: its verdict and each SLO's value with its interval."""
    def value(j: dict) -> str:
        unit = {"ms": " ms", "req/s": " req/s", "fraction": ""}[j["unit"]]
        v = "no data" if j["value"] is None else f"{j['value']:.4g}{unit}"
        ci = f" [{_num(j['low'])}–{_num(j['high'])}]" if j["low"] != j["high"] else ""
        return f"{j['name']} {v}{ci} {'≤' if j['bound'] == 'max' else '≥'} {j['limit']:g}: {j['verdict']}"

    counted = f" (counted as {step['counted_as']})" if step["counted_as"] and step["counted_as"] != step["verdict"] else ""
    head = f"step {step['index']}: {_rate(step['rate_rps'])} req/s {step['verdict'].upper()}{counted}"
    if "achieved_rps" in step:
        head += f", achieved {_rate(step['achieved_rps'])} req/s"
    parts = [value(j) for j in step.get("slos", [])]
    return "  ".join([head, *parts] + ([step["note"]] if step["note"] else []))


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


class CapacityDisplay(ProgressDisplay):
    """`latscope capacity`'s terminal: a line per step before and after it runs, and each step's
    live run progress (`live`) in between."""

    def __init__(self, console: Console, live: bool = True):
        super().__init__(console, enabled=live)

    def on_step(self, item: StepStart | dict) -> None:
        out = self._live.console if self._live is not None else self.console
        if isinstance(item, StepStart):
            self._events_printed = 0  # a new run: its events count from zero
            self._last_plain = 0.0
            out.print(Text(step_start_line(item), style="bold"), highlight=False, soft_wrap=True)
        else:
            style = {"pass": "green", "fail": "red"}.get(item["counted_as"] or "", "yellow")
            out.print(Text(step_line(item), style=style), highlight=False, soft_wrap=True)


def print_capacity(console: Console, document: dict, out: object) -> None:
    """The answer: capacity and bracket, why the search stopped, cost, and where the files are."""
    ok = document["exit_code"] == 0
    console.print(Text.assemble(Text("capacity: " if ok else "no capacity: ", "bold green" if ok else "bold red"),
                                document["message"]), soft_wrap=True)
    cost = document.get("cost")
    if cost:
        console.print(f"cost: {cost_line(document)}", highlight=False, soft_wrap=True)
    console.print(f"results: {out}  (capacity.json, capacity.html, steps/)", highlight=False, soft_wrap=True)


def machines_lines(generator: dict) -> list[str]:
    """A distributed run's machines, a line each: host, engines, how it ended, requests, clock."""
    dist = generator.get("distributed")
    if not dist:
        return []
    out = [f"distributed: {dist['nodes']} machine(s), {dist['engines']} engine(s), Locust {dist['locust_version']}"]
    for n in generator.get("nodes", []):
        clock = n.get("clock") or {}
        state = n["status"] + (f" at {n['lost_at_s']} s" if n.get("lost_at_s") is not None else "")
        out.append(f"  node {n['node']} {n['host']}: {n['engines']} engine(s), {state}, {n['requests']['sent']:,} sent, "
                   f"clock offset {clock.get('offset_ms', float('nan')):.3f} ± {clock.get('bound_ms', float('nan')):.3f} ms")
    return out


# -- latscope explain -------------------------------------------------------------------------------

_VERDICT_STYLE = {"cause": "bold yellow", "nothing_stands_out": "bold green", "not_enough_data": "dim"}


def print_explanation(console: Console, doc: dict, table: bool = True) -> None:
    """explain.json in the terminal: its paragraph (what `latscope run` prints at the end) and, with
    `table`, the ranked causes (`latscope explain`). Every string is printed as text, never markup:
    a replica id or a class name comes from the target or the scenario."""
    console.print(Text.assemble(Text("why the tail: ", _VERDICT_STYLE.get(doc.get("verdict"), "bold")),
                                Text(doc.get("summary", ""))), highlight=False, soft_wrap=not table)
    if not table or not doc.get("causes"):
        return
    causes = Table(title=f"candidate causes ({doc.get('tested', 0)} tested; stands out: effect ≥ "
                         f"{doc.get('min_effect', 0):g} and p < {doc.get('alpha', 0):g} / tested)", title_justify="left")
    for column, justify in (("#", "right"), ("kind", "left"), ("cause", "left"), ("effect", "right"),
                            ("p", "right"), ("", "left"), ("evidence", "left")):
        causes.add_column(column, justify=justify, overflow="fold")
    for c in doc["causes"]:
        causes.add_row(str(c["rank"]), Text(c["kind"]), Text(c["label"]), f"{c['effect']:.2f}", f"{c['p_value']:.2g}",
                       Text("stands out", "bold yellow") if c["stands_out"] else Text(""), Text(c["evidence"]))
    console.print(causes)
