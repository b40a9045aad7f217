"""The HTML report of one run: one self-contained file (plotly.js embedded once, or loaded from its
CDN with cdn=True) that reads top to bottom for someone who was not there — the verdict in one
sentence, the SLO and percentile tables, then one panel per question (how is the tail shaped, how
did latency move over time, did the server keep up, where did the time go, was the generator
healthy), then what was run where. What the run did not measure at all (no streamed tokens, no GPU telemetry…)
gets no card: one line under the header names it.

The panels are report/panels.py's PANELS (the compare page draws the same list); this module has the
tables and puts the page together.

Escaping: every string that came from a scenario or a target — scenario, class, phase and replica
names, error messages, URLs — goes through `esc_html` (report/escape.py: html.escape, quotes too)
wherever it lands in this module's HTML, and plotly figures are embedded as JSON in a
`<script type="application/json">` with `<`, `>` and `&` written as \\u003c, \\u003e, \\u0026, so no
value can close the script element or open a tag.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

import plotly.io as pio
import plotly.offline

from latscope import __version__
from latscope.analysis.run_data import RunData
from latscope.errors import ResultsError
from latscope.report.escape import esc_html
from latscope.report.figures import Panel
from latscope.report.nodes_panel import distributed_text
from latscope.report.panels import PANELS
from latscope.report.sessions_panel import closed_loop_lead
from latscope.report.words import fmt_ms, goodput_sentence, objectives_text, slo_value_text
from latscope.results.reading import read_scenario
from latscope.results.schema import metric_label

CDN_URL = "https://cdn.plot.ly/plotly-{version}.min.js"
PERCENTILE_COLUMNS = (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p99.9_ms", "p99.9"), ("max_ms", "max"))
# The metrics of the percentile table, in order (others, like server.* parts, are in summary.json).
TABLE_METRICS = ("latency", "ttft", "itl", "tpot", "ttfot", "reasoning_time", "service_time")


def headline(summary: dict) -> str:
    """The verdict in one sentence, plain text (escape before putting it in HTML):
    "p99 latency 41.2 ms at 99.8 req/s — 3 of 3 SLOs met — measurement valid"."""
    parts = []
    latency = summary.get("metrics", {}).get("latency", {}).get("all", {})
    rps = summary.get("throughput", {}).get("achieved_rps")
    rate = f" at {rps:,.1f} req/s" if rps is not None else ""
    ttft = summary.get("metrics", {}).get("ttft", {}).get("all", {}).get("p99_ms")
    if latency.get("p99_ms") is not None:
        # For streams the user-facing wait is the first token, not the whole answer: show both.
        first = f" (time to first token p99 {fmt_ms(ttft)} ms)" if ttft is not None else ""
        parts.append(f"p99 latency {fmt_ms(latency['p99_ms'])} ms{first}{rate}")
    else:
        parts.append("no request completed")
    slos = summary.get("slo") or []
    if slos:
        met = sum(1 for s in slos if s.get("passed"))
        parts.append(f"{met} of {len(slos)} SLOs met")
    else:
        parts.append("no SLOs set")
    errors = summary.get("requests", {}).get("errors") or 0
    if errors:
        sent = summary.get("requests", {}).get("sent") or 0
        parts.append(f"{errors:,} errors ({errors / sent:.1%} of sent)" if sent else f"{errors:,} errors")
    parts.append(f"measurement {summary.get('validity', 'unknown')}")
    text = " — ".join(parts)
    if summary.get("partial"):
        text = f"PARTIAL RUN ({summary.get('abort_reason') or 'stopped early'}) — {text}"
    return text


# -- tables --------------------------------------------------------------------------------------

def slo_table(summary: dict) -> str:
    slos = summary.get("slo") or []
    if not slos:
        return "<p>The scenario sets no SLOs (add <code>slos:</code> to it to get pass/fail verdicts here).</p>"
    rows = "".join(
        f"<tr class=\"{'good' if s.get('passed') else 'bad'}\"><td>{'✔ met' if s.get('passed') else '✘ missed'}</td>"
        f"<td>{esc_html(metric_label(s['metric']))}</td><td>{esc_html(s['class'])}</td>"
        f"<td>{esc_html(str(s['stat']).removesuffix('_ms'))}</td><td class=n>{esc_html(slo_value_text(str(s['stat']), s.get('value'), fmt_ms))}</td>"
        f"<td class=n>{'≥' if s.get('direction') == 'min' else '≤'} {esc_html(slo_value_text(str(s['stat']), s.get('limit'), fmt_ms))}</td>"
        f"<td>{esc_html(s.get('reason', ''))}</td></tr>" for s in slos)
    return ("<table><tr><th>SLO</th><th>metric</th><th>class</th><th>statistic</th><th class=n>measured</th>"
            "<th class=n>limit</th><th></th></tr>" + rows + "</table>")


def goodput_table(summary: dict) -> str:
    """summary.json's goodput, one row per class with objectives and "all"; "" when the run has none
    (its scenario set no objectives, or it was written before goodput existed)."""
    goodput = summary.get("goodput") or {}
    if not goodput:
        return ""
    rows = []
    for cls, g in goodput.items():
        fraction, strong = g.get("fraction"), " class=\"total\"" if cls == "all" else ""
        objectives = "each class its own" if cls == "all" else esc_html(objectives_text(g.get("objectives") or {}))
        rows.append(
            f"<tr{strong}><td>{esc_html(cls)}</td><td>{objectives}</td>"
            f"<td class=n>{g.get('good', 0):,} / {g.get('total', 0):,}</td>"
            f"<td class=n>{'–' if fraction is None else f'{fraction:.1%}'}</td><td class=n>{g.get('rps', 0):,.1f}</td>"
            f"<td class=n>{g.get('output_tokens_per_s', 0):,.1f}</td></tr>")
    lead = (f"<p>A request is good when it succeeded and met every objective of its class, each timed from its "
            f"intended send time (ITL: the request's worst gap between tokens). All: "
            f"{esc_html(goodput_sentence(goodput.get('all', {})))}.</p>")
    return (lead + "<table><tr><th>class</th><th>objectives</th><th class=n>good / measured</th><th class=n>% good</th>"
            "<th class=n>goodput req/s</th><th class=n>good output tokens/s</th></tr>" + "".join(rows) + "</table>")


def percentile_table(summary: dict) -> str:
    metrics = summary.get("metrics", {})
    rows = []
    for metric in TABLE_METRICS:
        for cls, s in metrics.get(metric, {}).items():
            strong = " class=\"total\"" if cls == "all" else ""
            rows.append(f"<tr{strong}><td>{esc_html(metric_label(metric))}</td><td>{esc_html(cls)}</td>"
                        f"<td class=\"n\">{s.get('count', 0):,}</td>" + "".join(f"<td class=\"n\">{fmt_ms(s.get(k))}</td>" for k, _ in PERCENTILE_COLUMNS)
                        + "</tr>")
    if not rows:
        return "<p>No request completed outside warm-up.</p>"
    head = "".join(f"<th class=\"n\">{label} ms</th>" for _, label in PERCENTILE_COLUMNS)
    return f"<table><tr><th>metric</th><th>class</th><th class=\"n\">count</th>{head}</tr>" + "".join(rows) + "</table>"


def requests_table(summary: dict) -> str:
    r, t = summary.get("requests", {}), summary.get("throughput", {})
    cells = [("scheduled", r.get("scheduled")), ("sent", r.get("sent")), ("completed", r.get("completed")),
             ("errors", r.get("errors")), ("dropped at the in-flight cap", r.get("dropped")),
             ("waited for a free slot", r.get("late")), ("not sent (run stopped)", r.get("not_sent"))]
    body = "".join(f"<tr><td>{k}</td><td class=n>{v:,}</td></tr>" for k, v in cells if v is not None)
    rates = (f"<p>Offered {t.get('offered_rps', 0):,.1f} req/s, achieved {t.get('achieved_rps', 0):,.1f} req/s "
             f"(completed without error) over {t.get('measured_window_s', 0):,.1f} s outside warm-up.</p>")
    tokens = summary.get("tokens", {}).get("all")
    if tokens:
        rates += (f"<p>Tokens: {tokens['prompt_tokens']:,} prompt, {tokens['output_tokens']:,} output "
                  f"({tokens['output_tokens_per_s']:,.1f} output tokens/s; counted from {esc_html(tokens.get('output_count_source', ''))}).</p>")
    return rates + "<table><tr><th>requests (outside warm-up)</th><th>count</th></tr>" + body + "</table>"


def errors_table(summary: dict) -> str:
    errors = {k: v for k, v in (summary.get("errors") or {}).items() if v}
    if not errors:
        return "<p>No request failed.</p>"
    examples = summary.get("error_examples") or {}
    rows = "".join(
        f"<tr><td>{esc_html(kind)}</td><td class=n>{count:,}</td><td>"
        + "".join(f"<div><code>{esc_html(m)}</code></div>" for m in examples.get(kind, [])[:3]) + "</td></tr>"
        for kind, count in errors.items())
    return "<table><tr><th>kind</th><th>count</th><th>examples (as the target sent them)</th></tr>" + rows + "</table>"


def scenario_file(run: RunData) -> dict:
    """The resolved scenario (secrets redacted) for the metadata table; {} when absent, ResultsError
    naming it when damaged (results/reading.py)."""
    return read_scenario(run.path)


def metadata_table(run: RunData) -> str:
    s, scenario = run.summary, scenario_file(run)
    target = scenario.get("target") or {}
    env, gen = s.get("environment", {}), s.get("generator", {})
    rows = [
        ("scenario", s.get("scenario")), ("description", scenario.get("description")),
        ("results directory", str(run.path)), ("started (UTC)", s.get("started_at")),
        ("duration", f"{s.get('duration_s', 0):,.1f} s"),
        ("phases", ", ".join(f"{p['name']} ({p['duration_s']:g} s{', warm-up' if p.get('warmup') else ''})" for p in s.get("phases", []))),
        ("target", " ".join(str(x) for x in (target.get("protocol", "http"), target.get("method", ""), target.get("url", ""),
                                             target.get("path", "")) if x)),
        ("model", target.get("model")),
        ("stopped early", s.get("abort_reason") if s.get("partial") else None),
        ("generator", f"{distributed_text(gen) or str(gen.get('workers', '?')) + ' worker process(es)'}, "
                      f"{gen.get('interval_s', '?')} s intervals"),
        ("values clamped to the histogram range", ", ".join(f"{k}: {v}" for k, v in (gen.get("clamped_values") or {}).items()) or None),
        ("latscope", env.get("latscope")), ("python", env.get("python")), ("platform", env.get("platform")),
        ("host", f"{env.get('host', '?')} ({env.get('cpus', '?')} CPUs)"),
        ("GPUs", ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in env.get("gpus") or []) or "none seen"),
    ]
    return "<table class=\"meta\">" + "".join(
        f"<tr><th>{k}</th><td>{esc_html(v)}</td></tr>" for k, v in rows if v not in (None, "")) + "</table>"


# -- panels --------------------------------------------------------------------------------------

def safe_panel(build: Callable[[], Panel], panel_id: str, title: str) -> Panel:
    """A panel that failed to build becomes a note on the page (and a warning), never a lost report."""
    try:
        return build()
    except ResultsError:  # a damaged file is the user's to fix (exit 2), not a panel's bug
        raise
    except Exception as exc:  # noqa: BLE001 - one broken panel must not cost the rest of the report
        logging.getLogger("latscope.report").warning("report panel %r could not be drawn: %s: %s", panel_id, type(exc).__name__, exc)
        return Panel(panel_id, title, note=f"This panel could not be drawn: {esc_html(type(exc).__name__)}: {esc_html(exc)}")


# -- page ----------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
header{background:#fff;border-bottom:1px solid #ddd;padding:18px 24px}
header .inner{max-width:1180px;margin:0 auto}
h1{font-size:20px;margin:0 0 6px;font-weight:600;color:#555}
.headline{font-size:24px;font-weight:600;margin:4px 0 10px}
.headline.partial{color:#a15c00}
section{background:#fff;border:1px solid #e2e4e8;border-radius:6px;margin:16px 0;padding:12px 18px}
h2{font-size:17px;margin:4px 0 8px}
p.note{color:#555;font-size:13px;margin:2px 0 8px}
p.omitted{color:#666;font-style:italic}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border-bottom:1px solid #e6e6e6;padding:4px 10px;text-align:left;vertical-align:top}
.n{text-align:right}
table.meta th{text-align:left;color:#555;font-weight:500}table.meta td{text-align:left}
tr.total td{font-weight:600}
tr.good td:first-child{color:#18794e;font-weight:600}tr.bad td:first-child{color:#c62828;font-weight:600}
td.worse{color:#c62828}td.better{color:#18794e}
tr.group th{background:#f3f4f6;font-weight:600;padding-top:8px}
table.deltas td:first-child,td.delta{white-space:nowrap}
table.nodes td.n,table.nodes td.host{white-space:nowrap}table.nodes td.status{overflow-wrap:anywhere;min-width:12em}
.run{margin:3px 0}.run b{display:inline-block;width:3em}
.warning{background:#fff4e5;border:1px solid #e5b567;border-radius:4px;padding:6px 10px;color:#6b4300}
h3{font-size:14px;margin:10px 0 4px}
code{font-size:12px;background:#f3f3f3;padding:1px 4px;border-radius:3px;word-break:break-all}
.stamp{font-weight:700;padding:2px 8px;border-radius:4px;color:#fff;background:#666;white-space:nowrap}
.stamp.valid{background:#18794e}.stamp.degraded{background:#b7791f}.stamp.invalid{background:#c62828}
.badges span{display:inline-block;margin-right:8px}
p.why{font-size:15px;margin:4px 0 8px}p.why b.bad{color:#c62828}p.why b.good{color:#18794e}
ul.cold{margin:4px 0 8px;padding-left:20px;font-size:14px}ul.cold li.bad b{color:#c62828}ul.cold li.good b{color:#18794e}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px}
nav{font-size:13px}nav a{margin-right:12px;color:#1f5fa8;text-decoration:none}
.plot{width:100%}
footer{color:#888;font-size:12px;text-align:center}
details.not-measured{font-size:13px;color:#555;margin:8px 0 0}details.not-measured summary{cursor:pointer}
details.not-measured ul{margin:4px 0;padding-left:20px}
"""

SCRIPT = """
(function () {
  var payload = JSON.parse(document.getElementById('latscope-figures').textContent);
  var ids = Object.keys(payload.figures);
  if (typeof Plotly === 'undefined') {
    ids.forEach(function (id) {
      document.getElementById(id).textContent = 'plotly.js could not be loaded (this report loads it from the internet; make it with latscope report without --cdn to read it offline).';
    });
    document.body.setAttribute('data-plots', 'failed');
    return;
  }
  var config = {responsive: true, displaylogo: false};
  Promise.all(ids.map(function (id) {
    var fig = payload.figures[id];
    fig.layout.template = payload.template;
    return Plotly.newPlot(id, fig.data, fig.layout, config);
  })).then(function () { document.body.setAttribute('data-plots', 'done'); });
})();
"""


def script_json(obj: object) -> str:
    """JSON that is safe inside a <script> element: '<', '>' and '&' (only ever inside strings) as escapes."""
    text = obj if isinstance(obj, str) else json.dumps(obj, allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def figures_json(panels: list[Panel]) -> str:
    """{"template": ..., "figures": {div id: {data, layout}}}: the plotly template once, not per figure."""
    template = pio.templates["plotly_white"].to_plotly_json()
    parts = []
    for panel in panels:
        if panel.figure is None:
            continue
        fig = panel.figure.to_plotly_json()
        fig["layout"].pop("template", None)
        parts.append(f"{json.dumps('plot-' + panel.id)}:{pio.json.to_json_plotly(fig)}")
    return script_json('{"template":' + pio.json.to_json_plotly(template) + ',"figures":{' + ",".join(parts) + "}}")


def plotly_script(cdn: bool) -> str:
    if cdn:
        return f'<script src="{CDN_URL.format(version=plotly.offline.get_plotlyjs_version())}" charset="utf-8"></script>'
    return f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'


def panel_html(panel: Panel) -> str:
    body = [f'<section id="{panel.id}"><h2>{panel.title}</h2>', panel.lead]
    if panel.figure is None:
        body.append(f'<p class="omitted">{panel.note}</p>')
    else:
        if panel.note:
            body.append(f'<p class="note">{panel.note}</p>')
        body.append(f'<div class="plot" id="plot-{panel.id}"></div>')
    body.append(panel.html)
    body.append("</section>")
    return "".join(body)


def not_measured_html(panels: list[Panel], where: str = "this run") -> str:
    """One line naming every panel the run had nothing for (Panel.not_measured), in page order, that
    opens to each one's note (why, and how to measure it); "" when every panel has something to show.
    Its words are trusted text written by the panels, never a target's."""
    missing = [p for p in panels if p.not_measured]
    if not missing:
        return ""
    items = "".join(f"<li><b>{p.not_measured}</b>: {p.note}</li>" for p in missing)
    return (f'<details class="not-measured" id="not-measured"><summary>Not measured in {where}: '
            + ", ".join(p.not_measured for p in missing) + f".</summary><ul>{items}</ul></details>")


def page(title: str, header_html: str, body_html: list[str], panels: list[Panel], tail_html: list[str], cdn: bool,
         css: str = "", not_measured_in: str = "this run") -> str:
    """The page every report shares: CSS (plus a page's own `css`), plotly.js, the header, then the
    body, the panels and the tail, and the figures as JSON. `title` and the HTML parts are trusted.
    A panel with nothing to show (Panel.not_measured) gets no card: the header names it instead, in
    one line under the links to the panels that are drawn ("Not measured in `not_measured_in`: ...").
    A panel with nothing at all to say (no figure, note, table or not_measured: the Models panel of a
    run with one model) is left out."""
    panels = [p for p in panels if p.figure is not None or p.note or p.html or p.not_measured]
    nav = "".join(f'<a href="#{p.id}">{p.title.split(":")[0]}</a>' for p in panels if p.figure is not None)
    cards = [p for p in panels if not p.not_measured]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title>"
        f"<style>{CSS}{css}</style>{plotly_script(cdn)}</head><body>"
        f"<header><div class=\"inner\">{header_html}<nav>{nav}</nav>{not_measured_html(panels, not_measured_in)}</div></header><main>"
        + "".join(body_html) + "".join(panel_html(p) for p in cards) + "".join(tail_html)
        + f"<footer>latscope {esc_html(__version__)}</footer></main>"
        f'<script type="application/json" id="latscope-figures">{figures_json(panels)}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def report_html(run: RunData, cdn: bool = False) -> str:
    """The whole report page for one run."""
    s = run.summary
    line = headline(s)
    stamp = s.get("validity", "unknown")
    header = (f"<h1>latscope report · {esc_html(s.get('scenario', '?'))} · {esc_html(s.get('started_at', ''))}</h1>"
              f"<div class=\"headline{' partial' if s.get('partial') else ''}\">{esc_html(line)}</div>"
              f"<p class=\"badges\"><span class=\"stamp {esc_html(stamp)}\">measurement {esc_html(stamp)}</span>"
              f"<span>{s.get('duration_s', 0):,.1f} s run, {s.get('requests', {}).get('completed', 0):,} requests completed "
              f"outside warm-up</span>" + (f"<span>{esc_html(machines)}</span>" if (machines := distributed_text(
                  s.get("generator") or {})) else "") + "</p>" + closed_loop_lead(s.get("load") or {}))
    summary_sections = [
        "<div class=\"grid\">"
        f"<section id=\"slos\"><h2>SLOs</h2>{slo_table(s)}</section>"
        f"<section id=\"requests\"><h2>Requests and throughput</h2>{requests_table(s)}</section></div>",
        f"<section id=\"goodput\"><h2>Goodput</h2>{goodput_table(s)}</section>" if s.get("goodput") else "",
        f"<section id=\"percentiles\"><h2>Percentiles (ms, outside warm-up)</h2>{percentile_table(s)}</section>",
        f"<section id=\"errors\"><h2>Errors</h2>{errors_table(s)}</section>",
    ]
    panels = [safe_panel(lambda spec=spec: spec.build(run, None), spec.id, spec.title) for spec in PANELS]
    tail = [f"<section id=\"metadata\"><h2>Run metadata</h2>{metadata_table(run)}</section>"]
    return page(f"latscope · {esc_html(s.get('scenario', '?'))} · {esc_html(line)}", header, summary_sections, panels, tail, cdn)
