"""The capacity page: DIR/capacity.html beside the DIR/capacity.json that `latscope capacity` wrote,
one self-contained file (plotly.js embedded, or from its CDN with cdn=True) built on the report's
own page (html.py `page`), so it looks, escapes and loads like report.html.

It reads top to bottom for a stakeholder: the capacity in one line (with its bracket, the SLO that
limits it, why the search stopped and what it costs), then the knee — latency percentiles against the
achieved rate with the SLO limits and the capacity drawn on them — goodput against offered load,
and last every step in the order run, each linked to its own report.

Only capacity.json is read: the numbers and verdicts are the search's, this module only shows them.
Escaping: every string that came from a scenario or a target (scenario and SLO names, messages,
notes, validity reasons, step directories) goes through `esc_html` where it lands in HTML (the
figures escape theirs for plotly, see capacity_figures.py), and a step's report link is only ever a
percent-encoded relative path inside DIR.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from urllib.parse import quote

from latscope.analysis.capacity_gate import read_capacity
from latscope.report.capacity_figures import curve_keys, curve_panel, fmt_rate, goodput_panel
from latscope.report.escape import esc_html
from latscope.report.html import page, safe_panel
from latscope.report.words import fmt_ms
from latscope.results import write_text
from latscope.results.schema import CAPACITY_PAGE, CAPACITY_STOPS

VERDICT_CLASS = {"pass": "good", "fail": "bad", "undecided": "unsure", "invalid": "bad", "partial": "unsure",
                 "target_down": "bad"}
CSS = """
.headline .sub{display:block;font-size:15px;font-weight:400;color:#444;margin-top:4px}
.facts{font-size:14px;margin:4px 0}.facts b{font-weight:600}
.scroll{overflow-x:auto}
table.steps td{white-space:nowrap}table.steps td.note{white-space:normal;min-width:14em;font-size:12px;color:#555}
table.steps tr.uncounted td{color:#888}
span.ci{color:#777;font-size:11px}
.v{font-weight:600}.v.good{color:#18794e}.v.bad{color:#c62828}.v.unsure{color:#b7791f}
"""


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def fmt_money(value: float | None) -> str:
    """Dollars: $1.23 from a dollar up, else three significant figures, never in e-notation
    ($0.00259, $0.0000608)."""
    if value is None:
        return "–"
    if value >= 1 or value <= 0:
        return f"${value:,.2f}"
    return f"${value:.{2 - math.floor(math.log10(value))}f}"


def _rate(value: object) -> str:
    return fmt_rate(_num(value))


def _precision(capacity: dict) -> str:
    p = _num(capacity.get("precision"))
    return f"{p * 100:g} %" if p is not None else "?"


def capacity_headline(capacity: dict) -> str:
    """The answer in one line, plain text (escape before putting it in HTML):
    "Capacity ≈ 375 req/s (bracket 375–387.5 req/s, precision 5 %)"."""
    bracket = capacity.get("bracket") or {}
    low, high = _num(bracket.get("low_rps")), _num(bracket.get("high_rps"))
    found = _num(capacity.get("max_rate_rps"))
    u_low, u_high = _num(bracket.get("undecided_low_rps")), _num(bracket.get("undecided_high_rps"))
    if found is not None and u_low is not None and capacity.get("stopped") != "precision":  # schema 2: a band the data could not decide
        band = fmt_rate(u_low) + (f"–{fmt_rate(u_high)}" if u_high is not None and u_high != u_low else "")
        fails = f", fail with confidence at {fmt_rate(high)} req/s" if high is not None else ""
        return f"Capacity ≥ {fmt_rate(found)} req/s (the SLOs are undecided at {band} req/s{fails})"
    if found is not None and high is not None:
        low_text = fmt_rate(low if low is not None else found)
        return f"Capacity ≈ {fmt_rate(found)} req/s (bracket {low_text}–{fmt_rate(high)} req/s, precision {_precision(capacity)})"
    if found is not None:
        return f"Capacity ≥ {fmt_rate(found)} req/s (no rate tried failed an SLO)"
    if capacity.get("exit_code") == 1 or capacity.get("stopped") == "slo_fails_at_lowest_rate":
        at = f" ({fmt_rate(high)} req/s)" if high is not None else ""
        return f"No rate met every SLO: they fail at the lowest rate tried{at}"
    return "No capacity found" + (f": SLOs fail at {fmt_rate(high)} req/s" if high is not None else "")


def cost_line(capacity: dict) -> str | None:
    """"$0.00259 per 1,000 requests, $1.23 per 1M output tokens at $3.50/h (at 375 req/s)", or None."""
    cost = capacity.get("cost")
    if not isinstance(cost, dict):
        return None
    parts = []
    if _num(cost.get("per_1k_requests")) is not None:
        parts.append(f"{fmt_money(cost['per_1k_requests'])} per 1,000 requests")
    if _num(cost.get("per_1m_output_tokens")) is not None:
        parts.append(f"{fmt_money(cost['per_1m_output_tokens'])} per 1M output tokens")
    if not parts:
        return None
    price = _num(cost.get("price_per_hour"))
    at = f" (at {_rate(cost.get('at_rate_rps'))} req/s)" if _num(cost.get("at_rate_rps")) is not None else ""
    return ", ".join(parts) + (f" at {fmt_money(price)}/h" if price is not None else "") + at


def _value(value: object, unit: str, with_unit: bool = False) -> str:
    """A value in an SLO's unit: ms like the report, a fraction as a percentage, a rate like the curves."""
    v = _num(value)
    if v is None:
        return "–"
    if unit == "ms":
        return fmt_ms(v) + (" ms" if with_unit else "")
    if unit == "fraction":
        return f"{v * 100:.3g} %"
    if unit == "req/s":
        return fmt_rate(v) + (" req/s" if with_unit else "")
    return f"{v:,.3g}" + (f" {unit}" if with_unit else "")


def _slo_words(slo: dict) -> str:
    """"p99 ≤ 40 ms", "error_rate ≤ 1 %", "rps ≥ 50 req/s" (plain text)."""
    sign = "≥" if slo.get("bound") == "min" else "≤"
    unit, limit = str(slo.get("unit") or "ms"), _num(slo.get("limit"))
    if unit == "ms" and limit is not None:  # a limit as the scenario wrote it: 40, not 40.0
        return f"{slo.get('stat', '?')} {sign} {limit:g} ms"
    return f"{slo.get('stat', '?')} {sign} {_value(limit, unit, with_unit=True)}"


def header_html(capacity: dict) -> str:
    """The title, the answer, what limits it, why the search stopped and the cost: the page's top."""
    warn = capacity.get("exit_code") not in (0, None)
    lines = [f"<h1>latscope capacity · {esc_html(capacity.get('scenario', '?'))} · {esc_html(capacity.get('started_at', ''))}</h1>",
             f"<div class=\"headline{' partial' if warn else ''}\">{esc_html(capacity_headline(capacity))}</div>"]
    limiting = capacity.get("limiting_slo")
    if limiting:
        slo = next((s for s in capacity.get("slos") or [] if s.get("name") == limiting), None)
        words = f" ({esc_html(_slo_words(slo))})" if slo else ""
        lines.append(f"<p class=\"facts\">Limited by <b>{esc_html(limiting)}</b>{words}: the SLO that failed at the lowest failing rate.</p>")
    stopped = str(capacity.get("stopped") or "")
    why = CAPACITY_STOPS[stopped][1] if stopped in CAPACITY_STOPS else stopped or "unknown"
    message = esc_html(capacity.get("message") or "")
    if warn:
        lines.append(f"<p class=\"warning\"><b>Stopped: {esc_html(why)}.</b> {message} (exit code {esc_html(capacity.get('exit_code'))})</p>")
    else:
        lines.append(f"<p class=\"facts\">Stopped: {esc_html(why)}. {message}</p>")
    cost = cost_line(capacity)
    if cost:
        lines.append(f"<p class=\"facts\">Cost: <b>{esc_html(cost)}</b></p>")
    steps = capacity.get("steps") or []
    confidence = _num(capacity.get("confidence"))
    lines.append("<p class=\"badges\">"
                 + (f"<span>verdicts at {confidence * 100:g} % confidence</span>" if confidence is not None else "")
                 + f"<span>{len(steps)} steps in {_num(capacity.get('duration_s')) or 0:,.1f} s</span>"
                 + f"<span>base rate {_rate(capacity.get('base_rate_rps'))} req/s</span></p>")
    return "".join(lines)


# -- the steps table -----------------------------------------------------------------------------

def slo_cell(result: dict | None) -> str:
    """"12.1 [11.0–13.9] ✔ pass" for one SLO at one step."""
    if not result:
        return "<td>–</td>"
    unit = str(result.get("unit") or "ms")
    low, high = result.get("low"), result.get("high")
    ci = (f" <span class=ci>[{_value(low, unit)}–{_value(high, unit)}]</span>" if _num(low) is not None or _num(high) is not None
          else " <span class=ci>[no CI]</span>")
    verdict = str(result.get("verdict") or "?")
    mark = {"pass": "✔ ", "fail": "✘ "}.get(verdict, "")
    return (f"<td class=n>{_value(result.get('value'), unit)}{ci} "
            f"<span class=\"v {VERDICT_CLASS.get(verdict, 'unsure')}\">{mark}{esc_html(verdict)}</span></td>")


def report_link(step: dict) -> str:
    """The step's own report as a link relative to DIR (percent-encoded, so no name can break out of
    the attribute or become a scheme), or its directory as text when it has none."""
    name = esc_html(PurePosixPath(str(step.get("dir") or "")).name or "step")
    report = step.get("report")
    path = PurePosixPath(str(report)) if isinstance(report, str) and report else None
    if path is None or path.is_absolute() or ".." in path.parts or "\\" in str(report):
        return f"<td>{name} <span class=ci>(no report)</span></td>"
    return f"<td><a href=\"{esc_html(quote(str(path), safe='/'))}\">{name}</a></td>"


def _goodput(step: dict) -> str:
    g = step.get("goodput")
    if not isinstance(g, dict) or _num(g.get("rps")) is None:
        return "–"
    fraction = f" ({g['fraction']:.1%})" if _num(g.get("fraction")) is not None else ""
    return f"{fmt_rate(g['rps'])}{fraction}"


def _validity(step: dict) -> str:
    validity = str(step.get("validity") or "unknown")
    reasons = "; ".join(str(r) for r in step.get("validity_reasons") or [])
    return (f"<span class=\"v {'good' if validity == 'valid' else 'unsure' if validity == 'degraded' else 'bad'}\">{esc_html(validity)}</span>"
            + (f"<br><span class=ci>{esc_html(reasons)}</span>" if reasons else ""))


def _verdict(step: dict) -> str:
    verdict = str(step.get("verdict") or "?")
    counted = step.get("counted_as")
    how = f"counted as {esc_html(counted)}" if counted else "not counted"
    note = f"<br>{esc_html(step['note'])}" if step.get("note") else ""
    partial = "<br>partial run" if step.get("partial") else ""
    return f"<span class=\"v {VERDICT_CLASS.get(verdict, 'unsure')}\">{esc_html(verdict)}</span> · {how}{note}{partial}"


def _look(step: dict) -> str:
    """" (look 2 of 3, 8 s pooled)" for an extension of an undecided step; " (longer)" in a schema 1 file."""
    look, pooled = step.get("look"), _num(step.get("pooled_s"))
    if isinstance(look, int) and not isinstance(look, bool) and look > 1:
        return f" (look {look} of {esc_html(step.get('looks', 3))}" + (f", {pooled:g} s pooled)" if pooled is not None else ")")
    return " (longer)" if step.get("longer") and look is None else ""


def steps_table(capacity: dict) -> str:
    """Every step in the order run: its rates, each SLO's value with its interval and verdict,
    goodput, validity, the verdict that counted, and a link to its report."""
    steps = capacity.get("steps") or []
    if not steps:
        return "<p>No step ran.</p>"
    slos = capacity.get("slos") or []
    goodput = any(isinstance(s.get("goodput"), dict) for s in steps)  # a column only when some step has it
    head = ("<tr><th class=n>#</th><th>step (its report)</th><th class=n>planned req/s</th><th class=n>duration</th>"
            "<th class=n>offered req/s</th><th class=n>achieved req/s</th><th class=n>sent / errors</th>"
            + "".join(f"<th class=n>{esc_html(s.get('name', '?'))}<br><span class=ci>{esc_html(_slo_words(s))}</span></th>" for s in slos)
            + ("<th class=n>goodput req/s</th>" if goodput else "") + "<th>measurement</th><th>verdict</th></tr>")
    rows = []
    for step in steps:
        by_name = {r.get("name"): r for r in step.get("slos") or []}
        requests = step.get("requests") or {}
        duration = _num(step.get("duration_s"))
        uncounted = "" if step.get("counted_as") in ("pass", "fail", "undecided") else " class=\"uncounted\""
        rows.append(
            f"<tr{uncounted}><td class=n>{esc_html(step.get('index', '?'))}</td>{report_link(step)}"
            f"<td class=n>{_rate(step.get('rate_rps'))}</td>"
            f"<td class=n>{f'{duration:g} s' if duration is not None else '–'}{_look(step)}</td>"
            f"<td class=n>{_rate(step.get('offered_rps'))}</td><td class=n>{_rate(step.get('achieved_rps'))}</td>"
            f"<td class=n>{requests.get('sent', 0) or 0:,} / {requests.get('errors', 0) or 0:,}</td>"
            + "".join(slo_cell(by_name.get(s.get("name"))) for s in slos)
            + (f"<td class=n>{_goodput(step)}</td>" if goodput else "")
            + f"<td>{_validity(step)}</td><td class=note>{_verdict(step)}</td></tr>")
    return f"<div class=\"scroll\"><table class=\"steps\">{head}{''.join(rows)}</table></div>"


def settings_table(capacity: dict) -> str:
    """How the search was asked to run: the SLOs and the options."""
    options = capacity.get("options") or {}
    rows = [(esc_html(s.get("name", "?")), esc_html(_slo_words(s))) for s in capacity.get("slos") or []]
    rows += [("precision", esc_html(_precision(capacity))),
             ("confidence", esc_html(f"{_num(capacity.get('confidence')) * 100:g} %" if _num(capacity.get("confidence")) is not None else "–"))]
    rows += [(esc_html(k.replace("_", " ")), esc_html("–" if v is None else v)) for k, v in options.items()]
    return "<table class=\"meta\">" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


# -- the page ------------------------------------------------------------------------------------

def capacity_html(capacity: dict, cdn: bool = False) -> str:
    """The whole capacity page for one capacity.json (as a dict)."""
    steps = capacity.get("steps") or []
    panels = [safe_panel(lambda n=n, key=key: curve_panel(n, key, capacity), f"curve-{n}", "Latency against throughput")
              for n, key in enumerate(curve_keys(steps, capacity.get("slos") or []), 1)]
    if any(isinstance(s.get("goodput"), dict) for s in steps):
        panels.append(safe_panel(lambda: goodput_panel(capacity), "goodput", "Goodput"))
    tail = [f"<section id=\"steps\"><h2>Steps, in the order run</h2>"
            "<p class=\"note\">Grey rows did not count toward the answer (undecided and extended, invalid or partial); "
            "an extension is judged on the evidence of its step's looks pooled. "
            "Each SLO: the measured value [its confidence interval] and the verdict.</p>"
            f"{steps_table(capacity)}</section>",
            f"<section id=\"settings\"><h2>The search</h2>{settings_table(capacity)}</section>"]
    title = f"latscope capacity · {esc_html(capacity.get('scenario', '?'))} · {esc_html(capacity_headline(capacity))}"
    return page(title, header_html(capacity), [], panels, tail, cdn, css=CSS)


def write_capacity_page(capacity_dir: str | Path, cdn: bool = False) -> Path:
    """Write DIR/capacity.html from DIR/capacity.json; returns its path. ResultsError when
    capacity.json is missing or is not JSON."""
    directory = Path(capacity_dir)
    capacity = read_capacity(directory)
    out = directory / CAPACITY_PAGE
    write_text(out, capacity_html(capacity, cdn=cdn))
    return out
