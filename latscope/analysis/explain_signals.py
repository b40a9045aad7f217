"""Causes of the tail that are quantities: the load generator's own delay, and the state of the
server (and of latscope's own processes) when the tail's requests were sent.

- **generator**: the client's own part of a request's time, g = min(metric, send lag + d), where d is
  what the generator's stalls (GC pauses, event-loop lag) while the request was in flight cost it (those
  before the send are its send lag already). s µs of stalls in a flight of T µs delay the answer only
  if it arrived during one: with its arrival anywhere in the flight, d = s/T × s/2 on average. So a
  request that waited long in the server, overlapping more of a busy worker's stalls whatever made it
  wait, counts little, and one a stall held counts about half of it. Where the server said its own
  time (Server-Timing), the rest of the flight (less the client's decode) is the wire's and the
  client's, microseconds on loopback unless the client was stalled: there d = min(s, that rest).
  Its effect is its share of the tail's excess over the body, (mean g in the tail − in the body) /
  (mean metric in the tail − in the body): 1 when the generator's own delay is the whole difference.
  Mann–Whitney of g, tail against body.
- **server state**: each telemetry signal at each request's send time (interpolated between samples),
  tail against body, one value per stretch between two samples on each side (the mean of the
  requests sent in it): a signal read at 4 Hz knows only as many things as it has readings, and ten
  tail requests sent between the same two samples are one observation of it, not ten (counted as
  ten, a tail that gathers in a few moments makes any signal that moved then look significant).
  Mann–Whitney, one-sided, or (its p doubled with the other's: the better of two valid tests) the
  exact count of the tail's readings among the highest (`top_share_p`), which a few clearly higher
  readings pass where the normal approximation cannot (a queue, a full KV cache, a busy generator make a tail
  by being *higher*; a signal lower in the tail is a consequence, like the GPU idling while requests
  wait out a pause), effect max(0, 2·AUC − 1) (the rank-biserial correlation: 1 when every tail
  request saw a higher value than every body request). Beside it, the interval-level Spearman
  correlation of the metric's p99 (timeseries.parquet) with the signal's mean in that interval.
  latscope's own processes (telemetry source "host": its workers' CPU and event-loop lag) are the
  generator's signals, named `generator.<metric>`; the whole machine's CPU is `host.cpu_pct`. The
  server's own latency quantiles (`server_*_ms`) are left out: they are the tail seen from inside
  the server, high whenever it is, whatever made it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from latscope.analysis.explain_split import Candidate, Split, ms, pct, round_ms
from latscope.analysis.explain_stats import MAX_SIDE, mann_whitney, spearman, top_share_p

HOST_SOURCE = "host"
SKIP_SIGNALS = {"rss_bytes"}  # memory of latscope's processes: grows with the run, explains nothing
MAX_SERIES = 2000
MIN_SIDE = 10  # values a side for Mann–Whitney's normal approximation
MIN_EPISODES = 3  # distinct sample intervals the tail's values must come from (as explain_groups.MIN_EPISODES)


def generator(s: Split) -> list[Candidate]:
    """The generator's own delay as a share of the tail's excess over the body."""
    value = s.value
    lag = np.nan_to_num(s.column("send_lag_us"), nan=0.0).clip(min=0)
    stall = np.nan_to_num(s.column("stall_us"), nan=0.0).clip(min=0)
    sent, end = s.column("sent_us"), s.column("end_us")
    flight = np.nan_to_num(end - sent, nan=0.0).clip(min=1.0)  # the request's time in flight, µs
    in_flight = np.minimum((stall - lag).clip(min=0), flight)  # stalls before the send are its send lag already
    # A stall delays a request only if its answer arrived during it: with s µs of stalls in a flight of
    # T µs and the answer's arrival anywhere in it, the expected delay is s/T × s/2. A request that
    # waited long in the server overlaps more of a busy worker's stalls whatever kept it waiting (its
    # s grows with T, s²/2T stays small); one that a stall held (the stall is most of its flight) gets
    # about half the stall. Where the server said its own time (Server-Timing), the flight less the
    # server's time and the client's decode is the wire's and the client's: on loopback, microseconds,
    # unless the client was stalled. The stall then counts up to that rest.
    delay = in_flight * in_flight / (2 * flight)
    outside = _outside_server(s)
    if outside is not None:
        delay = np.where(np.isfinite(outside), np.minimum(in_flight, np.nan_to_num(outside).clip(min=0)), delay)
    own = np.minimum(value, lag + delay)
    excess = s.excess_us
    if excess <= 0:
        return []
    t_own, b_own = float(own[s.tail].mean()), float(own[s.body].mean())
    share = max(0.0, min(1.0, (t_own - b_own) / excess))
    auc, p = mann_whitney(own[s.tail], own[s.body])
    with_stall_t, with_stall_b = float((stall[s.tail] > 0).mean()), float((stall[s.body] > 0).mean())
    evidence = (f"the generator's own delay (its send lag, and the expected delay from its GC pauses and event-loop "
                f"stalls while the request was in flight) averages {ms(t_own)} in the tail against {ms(b_own)} in "
                f"the body: {pct(share)} of the tail's {ms(excess)} excess")
    detail = {"components": [
        {"name": "send_lag", "tail_ms": round_ms(lag[s.tail].mean()), "body_ms": round_ms(lag[s.body].mean())},
        {"name": "stall", "tail_ms": round_ms(stall[s.tail].mean()), "body_ms": round_ms(stall[s.body].mean())},
        {"name": "generator", "tail_ms": round_ms(t_own), "body_ms": round_ms(b_own)}],
        "tail_with_stall": round(with_stall_t, 4), "body_with_stall": round(with_stall_b, 4),
        "auc": round(auc, 4)}
    return [Candidate("generator", "generator", "the load generator itself", share, p, evidence, detail, "generator")]


def _outside_server(s: Split) -> np.ndarray | None:
    """Per request, its time in flight that the server's Server-Timing does not cover, less the client's
    decode (NaN where the request carried no Server-Timing); None when no request did. For a stream
    explained by its TTFT: up to its first token (its headers, and their Server-Timing, leave with it)."""
    parts = s.records.server_parts
    if not parts:
        return None
    said = np.zeros(s.n, bool)
    server = np.zeros(s.n)
    for name in parts:
        v = s.column(name)
        said |= np.isfinite(v)
        server += np.nan_to_num(v)
    if s.metric == "ttft":
        out = s.column("first_token_us") - s.column("sent_us") - server
    else:
        out = s.column("service_us") - np.nan_to_num(s.column("decode_us")) - server
    out[~said] = np.nan
    return out


def signals(telemetry: pd.DataFrame) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """name -> (kind, t_s ascending, value): each telemetry signal as one series (devices of one
    metric averaged; latscope's worker CPU summed, its loop lag the worst worker's)."""
    out: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
    if telemetry is None or not len(telemetry):
        return out
    frame = telemetry[["t_s", "source", "device", "metric", "value"]].copy()
    frame = frame[np.isfinite(frame["t_s"].astype(float)) & np.isfinite(frame["value"].astype(float))]
    for (source, metric), rows in frame.groupby(["source", "metric"], sort=True):
        if metric in SKIP_SIGNALS or (metric.startswith("server_") and metric.endswith("_ms")):
            continue  # the server's own latency is the tail seen from inside, not a cause of it
        if source == HOST_SOURCE:
            system = rows["device"] == "system"
            if system.any():
                series = rows[system].groupby("t_s")["value"].mean()
                out["host.cpu_pct"] = ("server_state", series.index.to_numpy(float), series.to_numpy(float))
            own = rows[~system]
            if len(own):
                how = "max" if metric.startswith("loop_lag") else "sum"
                series = own.groupby("t_s")["value"].agg(how)
                out[f"generator.{metric}"] = ("generator", series.index.to_numpy(float), series.to_numpy(float))
            continue
        series = rows.groupby("t_s")["value"].mean()
        name = metric if metric not in out else f"{source}.{metric}"
        out[name] = ("server_state", series.index.to_numpy(float), series.to_numpy(float))
    return out


def _at(t_s: np.ndarray, values: np.ndarray, when: np.ndarray) -> np.ndarray:
    """The signal at each time, interpolated linearly between its samples (a 1 Hz scrape's last sample
    before a send can be a second stale: a queue that filled since reads empty); NaN outside the
    samples or across a gap of more than 3 spacings (≥ 5 s: the source was not answering)."""
    out = np.interp(when, t_s, values, left=np.nan, right=np.nan)
    if len(t_s) > 1:
        spacing = float(np.median(np.diff(t_s)))
        idx = np.clip(np.searchsorted(t_s, when, side="right"), 1, len(t_s) - 1)
        out[(t_s[idx] - t_s[idx - 1]) > max(5.0, 3 * spacing)] = np.nan
    return out


def _per_stretch(seen: np.ndarray, stretch: np.ndarray) -> np.ndarray:
    """The mean signal of the requests sent in each stretch between two samples (NaN ones left out)."""
    ok = np.isfinite(seen)
    keys, at = np.unique(stretch[ok], return_inverse=True)
    return np.bincount(at, weights=seen[ok], minlength=len(keys)) / np.bincount(at, minlength=len(keys))


def _quantiles(x: np.ndarray) -> dict:
    q = np.quantile(x, [0.1, 0.25, 0.5, 0.75, 0.9])
    return {k: round(float(v), 4) for k, v in zip(("p10", "p25", "p50", "p75", "p90"), q)}


def server_state(s: Split) -> list[Candidate]:
    """Each signal at the tail's send times against the body's."""
    # only the tail and a sample of the body are compared (mann_whitney samples a side down to
    # MAX_SIDE anyway): looking every signal up for a million requests would cost seconds
    tail_rows = np.flatnonzero(s.tail)
    body_rows = np.flatnonzero(s.body)
    if len(body_rows) > MAX_SIDE:
        body_rows = np.sort(np.random.default_rng(0).choice(body_rows, MAX_SIDE, replace=False))
    sent = s.records.number("sent_us")[s.rows[np.concatenate((tail_rows, body_rows))]]
    intended = s.records.number("intended_us")[s.rows[np.concatenate((tail_rows, body_rows))]]
    when = np.where(np.isfinite(sent), sent, intended) / 1e6
    per_interval = _interval_p99(s)
    out = []
    for name, (kind, t_s, values) in signals(s.run.telemetry).items():
        seen = _at(t_s, values, when)
        stretch = np.searchsorted(t_s, when, side="right")  # which pair of samples each send fell between
        tail = _per_stretch(seen[: len(tail_rows)], stretch[: len(tail_rows)])
        body = _per_stretch(seen[len(tail_rows):], stretch[len(tail_rows):])
        readings = len(tail)  # in one or two stretches the tail is one or two readings: a one-off, not a pattern
        if readings < 2 or len(body) < MIN_SIDE:
            continue
        auc, p = mann_whitney(tail, body)  # one-sided: a signal lower in the tail did not make it
        p = min(1.0, 2 * min(p, top_share_p(tail, body)))  # the better of two valid tests, paid for (× 2)
        higher = auc >= 0.5
        effect = max(0.0, 2 * auc - 1)
        tq, bq = _quantiles(tail), _quantiles(body)
        rho = None
        if per_interval is not None:
            starts, p99, width = per_interval
            k = np.floor((t_s - starts[0]) / width).astype(np.int64)
            ok = (k >= 0) & (k < len(starts))
            means = np.bincount(k[ok], weights=values[ok], minlength=len(starts)) / np.maximum(
                np.bincount(k[ok], minlength=len(starts)), 1)
            means[np.bincount(k[ok], minlength=len(starts)) == 0] = np.nan
            rho = spearman(p99, means)
        stride = max(1, -(-len(t_s) // MAX_SERIES))
        evidence = (f"{name} at send time was {'higher' if higher else 'lower'} for the tail: median {tq['p50']:.4g} "
                    f"against {bq['p50']:.4g} for the body ({round(auc * 100)} % of pairs of the {readings} readings "
                    f"the tail was sent in and the body's {len(body)} {'higher' if higher else 'lower'})" + (f"; per-interval rank correlation with the p99 "
                                                             f"{rho:+.2f}" if rho is not None else ""))
        detail = {"signal": name, "direction": "higher" if higher else "lower", "tail": tq, "body": bq,
                  "series": {"t_s": np.round(t_s[::stride], 3).tolist(), "value": np.round(values[::stride], 6).tolist(),
                             "label": name},
                  "spearman": None if rho is None else round(rho, 4),
                  "intervals": 0 if per_interval is None else len(per_interval[0]), "auc": round(auc, 4)}
        if readings < MIN_EPISODES:
            evidence += f"; but the tail was sent in only {readings} stretches between samples: too few readings to tell"
        detail["readings"] = readings
        out.append(Candidate(kind, name, name, effect, p, evidence, detail, name, readings >= MIN_EPISODES))
    return out


def _interval_p99(s: Split) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(interval starts, the metric's p99 in ms, interval length) of class all, outside warm-up."""
    ts = s.run.timeseries
    if not len(ts) or "p99_ms" not in ts:
        return None
    rows = ts[(ts["metric"] == s.metric) & (ts["class"] == "all")]
    if "phase" in rows:
        rows = rows[~rows["phase"].isin(s.run.warmup_phases)]
    rows = rows.sort_values("interval_start_s")
    if len(rows) < 3:
        return None
    return rows["interval_start_s"].to_numpy(float), rows["p99_ms"].to_numpy(float), s.run.interval_s
