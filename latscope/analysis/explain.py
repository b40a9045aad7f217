"""Why the tail is what it is (`latscope explain`): the requests above a quantile of a metric (the
tail) against the middle half (the body), from requests.parquet, with the run's events, telemetry
and time series beside them. The answer, explain.json (Contract 3, docs/explain.md):

- **components**: where the tail's extra time went (send lag, each Server-Timing part, decode, the
  network and whatever the server did not report; for streams, the wait for the first token and the
  token stream), as shares of the excess of the tail's mean over the body's. They always add up, so
  they describe, they do not accuse: a clean run's tail lies in some component too.
- **causes**: candidates, each tested and given an effect on one scale, the share of the tail it
  explains (explain_groups.py for groups of requests, explain_signals.py for the generator and the
  server's state). A cause *stands out* when it is both large (effect ≥ MIN_EFFECT) and significant
  (p < ALPHA / the number of candidates tested: Bonferroni). On a run where the tail has no cause
  (independent, identically distributed latencies), each test's p-value is valid (exact binomial,
  conservative against the hypergeometric; Mann–Whitney's normal approximation from ten a side), so
  the chance that anything stands out is at most ALPHA = 0.1 % per explanation, whatever the
  number of candidates. Time-correlated noise (a noisy box stalls everyone at once) makes p-values
  optimistic; MIN_EFFECT is the guard there: noise spread over the run does not make 30 % of the tail.
- The generator goes first when it stands out with at least half the excess (its own delay,
  `generator`, GENERATOR_FIRST): a tail the load generator made is not the target's. Its signals (`generator.<metric>`: loop lag, CPU) count only when that
  delay is a large part of the excess, and rank by effect like the rest.

Everything is a pure function of the results directory; writing explain.json is `write_explain`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from latscope import results
from latscope.analysis.explain_data import Records, read_records
from latscope.analysis.explain_groups import when, where_what
from latscope.analysis.explain_signals import generator, server_state
from latscope.analysis.explain_split import Candidate, Split, ms, pct, round_ms, split
from latscope.analysis.run_data import RunData, load_run
from latscope.errors import ResultsError
from latscope.results.reading import read_json
from latscope.results.schema import EXPLAIN, REQUESTS

SCHEMA_VERSION = 1
ALPHA = 0.001  # the family-wise false-positive rate of one explanation (Bonferroni over the candidates)
MIN_EFFECT = 0.3  # a cause explains at least this share of the tail
MIN_TAIL = 10  # tail requests needed to explain anything (the tests' approximations need about ten)
MAX_CAUSES = 12
# the generator goes first when its own delay is at least half the tail's excess (it shaped the tail);
# a smaller part, however real, ranks by its effect like any cause (a server queue of 60 % first)
GENERATOR_FIRST = 0.5
QUANTILE = 0.99
VERDICTS = ("cause", "nothing_stands_out", "not_enough_data")
_SIDE = {"send_lag": "client", "decode": "client", "network": "network", "first_token_wait": "server",
         "first_token_rest": "network", "token_stream": "server"}
_LABEL = {"send_lag": "client send lag", "decode": "client decode", "first_token_wait": "wait for the first token",
          "first_token_rest": "the rest of the wait for the first token (network, unreported server time)",
          "token_stream": "token stream (first token to end)"}


def explain_run(run_dir: str | Path, metric: str | None = None, quantile: float = QUANTILE) -> dict:
    """explain.json's document for the results directory at `run_dir` (nothing written).
    ResultsError naming the file when requests.parquet (or summary.json) is missing or damaged, or
    the metric is not in it; ValueError for a quantile outside (0.5, 1)."""
    run = load_run(run_dir)
    return explain(run, read_records(run.path), metric, quantile)


def explain_or_reason(run_dir: str | Path, metric: str | None = None, quantile: float = QUANTILE) -> dict:
    """explain_run, or a `not_enough_data` document saying why when the directory cannot be explained
    (no requests.parquet, a damaged one): what `latscope run` writes, never failing the run."""
    try:
        return explain_run(run_dir, metric, quantile)
    except ResultsError as exc:
        return _not_enough(metric or "latency", quantile, str(exc))


def explanation(run: RunData) -> dict | None:
    """For the report: explain.json when the directory has one (ResultsError when it is damaged),
    else the explanation computed now, else None when the run kept no requests.parquet."""
    path = run.path / EXPLAIN
    if path.is_file():
        doc = read_json(path)
        if not isinstance(doc, dict) or doc.get("verdict") not in VERDICTS:
            raise ResultsError(f"{path}: not an explain.json (no verdict)")
        return doc
    if not (run.path / REQUESTS).is_file():
        return None
    return explain(run, read_records(run.path))


def write_explain(run_dir: str | Path, doc: dict) -> Path:
    """Write explain.json beside summary.json (atomically); its path."""
    path = Path(run_dir) / EXPLAIN
    results.write_json(path, doc)
    return path


def generator_caused(doc: dict) -> dict | None:
    """The top cause when it is the load generator and stands out, else None (the gate's question)."""
    causes = doc.get("causes") or []
    if doc.get("verdict") == "cause" and causes and causes[0].get("kind") == "generator" and causes[0].get("stands_out"):
        return causes[0]
    return None


def default_metric(records: Records) -> str:
    """ttft when most successful measured requests are streams with a first token, else latency."""
    ttft = records.numbers.get("ttft_us")
    if ttft is None:
        return "latency"
    ok = ~records.warmup & np.isfinite(records.number("latency_us"))
    return "ttft" if ok.any() and np.isfinite(ttft[ok]).mean() >= 0.5 else "latency"


def explain(run: RunData, records: Records, metric: str | None = None, quantile: float = QUANTILE) -> dict:
    """The explanation of one run from its records (see the module docstring)."""
    if not 0.5 < quantile < 1:
        raise ValueError(f"quantile {quantile!r}: the tail is above a quantile between 0.5 and 1 (e.g. 0.99)")
    metric = metric or default_metric(records)
    values = records.metric_us(metric)
    if values is None:
        have = sorted({"service_time" if c == "service_us" else c[:-3] for c, v in records.numbers.items()
                       if c.endswith("_us") and np.isfinite(v).any()}
                      - {"intended", "sent", "first_byte", "first_token", "end", "stall"})
        raise ResultsError(f"{run.path / REQUESTS}: no metric {metric!r} per request; it has {', '.join(have)}")
    s = split(records, run, metric, values, quantile)
    sampled = bool((run.summary.get("request_records") or {}).get("sampled"))
    if s is None or s.n_tail < MIN_TAIL:
        n = 0 if s is None else s.n
        need = math.ceil(MIN_TAIL / (1 - quantile))
        return _not_enough(metric, quantile, f"{n:,} measured requests with a {metric}: the tail above p{quantile * 100:g} "
                                             f"needs at least {MIN_TAIL} (about {need:,} requests)", n, sampled)
    candidates = generator(s) + when(s) + where_what(s) + server_state(s)
    _generator_signals_need_its_delay(candidates)
    tested = max(1, len(candidates))
    limit = ALPHA / tested
    ranked = _rank(candidates, limit)
    components = _components(s)
    causes = []
    for i, c in enumerate(ranked[:MAX_CAUSES], 1):
        causes.append({"rank": i, **c.doc(), "stands_out": stands_out(c, limit)})
    verdict = "cause" if causes and causes[0]["stands_out"] else "nothing_stands_out"
    tail, body = s.value[s.tail], s.value[s.body]
    doc = {
        "schema_version": SCHEMA_VERSION, "metric": metric, "quantile": quantile, "verdict": verdict, "reason": None,
        "summary": "", "requests": {"measured": s.n, "sampled": sampled},
        "threshold_ms": round_ms(s.threshold_us),
        "tail": {"n": s.n_tail, "mean_ms": round_ms(tail.mean()), "p50_ms": round_ms(float(np.median(tail))),
                 "max_ms": round_ms(tail.max())},
        "body": {"n": int(s.body.sum()), "mean_ms": round_ms(body.mean()), "low_ms": round_ms(s.low_us),
                 "high_ms": round_ms(s.high_us)},
        "excess_ms": round_ms(s.excess_us), "components": components, "causes": causes,
        "tested": tested, "alpha": ALPHA, "min_effect": MIN_EFFECT,
    }
    doc["summary"] = paragraph(doc)
    return doc


def _generator_signals_need_its_delay(candidates: list[Candidate]) -> None:
    """latscope's own signals (its loop lag, its CPU) hurt a request only through its send lag and its
    stalls, which `generator` measures per request. When those are a small part of the tail's excess,
    a signal that is merely higher for the tail only picked which of the slow requests the noise put
    above the quantile (a replica 150 ms slower makes the tail; a few ms of loop lag decide which of
    its requests): not a cause, however significant the ranks."""
    own = next((c for c in candidates if c.name == "generator"), None)
    share = own.effect if own is not None else 0.0
    if share >= MIN_EFFECT:
        return
    for c in candidates:
        if c.kind == "generator" and c.name != "generator":
            c.eligible = False
            c.evidence += (f"; but the generator's own delay is only {pct(share)} of the tail's excess: this picks "
                           "which slow requests made the tail, it did not make them slow")


def stands_out(c: Candidate, limit: float) -> bool:
    """Large, significant after the correction, and a pattern (not a one-off moment)."""
    return bool(c.eligible and c.effect >= MIN_EFFECT and c.p_value < limit)


def _rank(candidates: list[Candidate], limit: float) -> list[Candidate]:
    """The generator first when it stands out with half the excess or more, then the others standing
    out, then the rest; by effect
    (to 0.05, then the specific before the generic, then by p); one per name (a length's bins, time bins of three widths: the best of them)."""
    def key(c: Candidate) -> tuple:
        stands = stands_out(c, limit)
        # effects within 0.05 are a tie, which the more specific cause wins: bursts, a replica, an
        # action over the bare "the tail is in some stretches of time" (that most causes also make)
        first = stands and c.name == "generator" and c.effect >= GENERATOR_FIRST
        return (not stands, not first, -round(c.effect * 20), c.name == "time", c.p_value)

    seen, out = set(), []
    for c in sorted(candidates, key=key):
        if c.name not in seen and c.evidence:
            seen.add(c.name)
            out.append(c)
    return out


def _components(s: Split) -> list[dict]:
    """Where the tail's extra time went: additive parts of the metric, tail mean and body mean."""
    col = s.column
    zero = np.zeros(s.n)
    if "sent_us" not in s.records.numbers or "service_us" not in s.records.numbers:
        return []  # a file without the request's own timestamps: nothing to split
    sent, end, first = col("sent_us"), col("end_us"), col("first_token_us")
    stream = np.isfinite(first).mean() >= 0.5
    parts: dict[str, np.ndarray] = {}
    if s.metric in ("latency", "ttft"):
        parts["send_lag"] = np.nan_to_num(col("send_lag_us"))
    if stream and s.metric in ("latency", "ttft"):
        # a stream's headers (and its Server-Timing) leave with its first token: the parts it names
        # are parts of the wait for it, the rest is the network's and whatever the server did not say
        wait = np.nan_to_num(first - sent)
        for name in s.records.server_parts:
            parts[name] = np.nan_to_num(col(name))
            wait = wait - parts[name]
        parts["first_token_rest" if s.records.server_parts else "first_token_wait"] = wait
        if s.metric == "latency":
            parts["token_stream"] = np.nan_to_num(end - first)
    elif not stream and s.metric in ("latency", "service_time"):
        service = col("service_us")
        server = zero.copy()
        for name in s.records.server_parts:
            parts[name] = np.nan_to_num(col(name))
            server += parts[name]
        parts["decode"] = np.nan_to_num(col("decode_us"))
        rest = np.nan_to_num(service) - parts["decode"] - server
        parts["network" if s.records.server_parts else "server and network"] = rest
    excess = s.excess_us
    out = []
    for name, v in parts.items():
        t, b = float(v[s.tail].mean()), float(v[s.body].mean())
        out.append({"name": name, "label": _LABEL.get(name, name),
                    "side": _SIDE.get(name, "server" if name.startswith("server") else "network"),
                    "tail_ms": round_ms(t), "body_ms": round_ms(b),
                    "share": round((t - b) / excess, 4) if excess > 0 else None})
    return out


def _not_enough(metric: str, quantile: float, reason: str, n: int = 0, sampled: bool = False) -> dict:
    doc = {"schema_version": SCHEMA_VERSION, "metric": metric, "quantile": quantile, "verdict": "not_enough_data",
           "reason": reason, "summary": "", "requests": {"measured": n, "sampled": sampled}, "threshold_ms": None,
           "tail": {"n": 0}, "body": {"n": 0}, "excess_ms": None, "components": [], "causes": [], "tested": 0,
           "alpha": ALPHA, "min_effect": MIN_EFFECT}
    doc["summary"] = paragraph(doc)
    return doc


def paragraph(doc: dict) -> str:
    """The explanation in one paragraph, as the console prints it."""
    if doc["verdict"] == "not_enough_data":
        return f"Not enough data to explain the tail: {doc['reason']}."
    q = f"p{doc['quantile'] * 100:g}"
    metric = {"ttft": "TTFT"}.get(doc["metric"], doc["metric"].replace("_", " "))
    body = doc["body"]
    text = (f"{q} {metric} is {ms(doc['threshold_ms'] * 1000)} ({doc['tail']['n']:,} requests above it, of "
            f"{doc['requests']['measured']:,} measured; the body, p25–p75, is {ms(body['low_ms'] * 1000)}–"
            f"{ms(body['high_ms'] * 1000)}).")
    grew = sorted((c for c in doc["components"] if (c["share"] or 0) >= 0.15), key=lambda c: -c["share"])
    if grew and doc["excess_ms"]:
        text += (f" The tail's extra {ms(doc['excess_ms'] * 1000)} over the body went mostly to "
                 + ", ".join(f"{c['label']} ({pct(min(c['share'], 1))})" for c in grew[:3]) + ".")
    if doc["verdict"] == "nothing_stands_out":
        limit = doc["alpha"] / max(1, doc["tested"])
        once = next((c for c in doc["causes"] if c["name"] == "time" and c["effect"] >= doc["min_effect"]
                     and c["p_value"] < limit), None)
        if once is not None:  # large and significant, but in one or two moments: say so, as what it is
            moments = once["detail"].get("episodes", 0)
            text += (f" Most of the tail came from {'one moment' if moments <= 1 else f'{moments} moments'} "
                     f"(around {once['detail']['hot_s'][0][0]:g} s): a one-off stall, not a pattern.")
        return text + (f" Nothing stands out: the tail's requests are spread over time, replicas, classes and lengths "
                       f"like the rest ({doc['tested']} candidates tested; none both large, effect ≥ "
                       f"{doc['min_effect']:g}, and significant, p < {doc['alpha']:g} after correction, and recurring)."
                       if once is None else
                       f" Nothing recurring stands out ({doc['tested']} candidates tested).")
    top, *rest = [c for c in doc["causes"] if c["stands_out"]]
    if top["name"] == "generator":
        text += (f" Top cause: {top['label']} — {top['evidence']} (effect {top['effect']:.2f}). "
                 + ("latscope shaped this tail, not the target" if top["effect"] >= GENERATOR_FIRST else
                    "Part of this tail is latscope's own, and nothing else stands out")
                 + ": give the generator more CPU or fewer requests per worker, then measure again.")
    else:
        text += f" Top cause: {top['label']} — {top['evidence']} (effect {top['effect']:.2f})."
    if rest:
        text += " Also: " + "; ".join(f"{c['label']} (effect {c['effect']:.2f})" for c in rest[:3]) + "."
    return text
