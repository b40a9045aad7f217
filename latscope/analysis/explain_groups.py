"""Causes of the tail that are groups of requests: where (replica, node, worker, connection), what
(class, turn, prompt and output length, prefix-cache miss) and when (phase, time bins, bursts, the
first requests after an idle stretch, actions, a replica's first requests).

Each group is a count test: the tail's count in it against its share of all measured requests
(exact binomial, explain_stats), and its effect is the share of the tail it explains beyond that
share (explain_stats.excess_share). Every group tested counts towards the Bonferroni correction.
Stretches of time are the one group chosen from the data (where the tail is): they are found with one
random half of the tail and tested on the other, so the test stays valid.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from latscope.analysis.explain_split import Candidate, Split, pct
from latscope.analysis.explain_stats import binomial_sf, excess_share

MAX_GROUPS = 200  # groups of one column tested (the most common); the rest are left out
DETAIL_GROUPS = 20
TIME_RADII_S = (0.02, 0.1, 0.5)
BURST_WINDOWS_S = (0.25, 1.0)
BURST_FACTOR = 1.5  # a burst: arrivals at 1.5 × their median rate or more
MAX_BINS = 2000
MIN_EPISODES = 3  # separate stretches of time a time cause needs (fewer: a one-off, which any busy box has)
REPLICA_FIRST = 20  # a replica's first requests (by send time), for replica_start


def concentration(s: Split, key: np.ndarray, labels: list[str], kind: str, family: str, name: str | None,
                  what: str, verb: str = "") -> list[Candidate]:
    """One candidate per group of `key` (int codes over the measured rows, -1: not in any group,
    left out of the universe). `name`: the candidate's name for every group (a length's bins), else
    "<family>=<label>". `what`: how a group is named ("replica {}"); `verb`: how the evidence says a
    request is in it ("came from replica {}"; default "is " + what)."""
    keep = key >= 0
    if not keep.any():
        return []
    codes = key[keep]
    tail = s.tail[keep]
    size = int(codes.max()) + 1
    all_count = np.bincount(codes, minlength=size)
    tail_count = np.bincount(codes[tail], minlength=size)
    present = np.flatnonzero(all_count)
    if len(present) < 2:  # one group: nothing to compare
        return []
    present = present[np.argsort(-all_count[present], kind="stable")][:MAX_GROUPS]
    n_all, n_tail = int(keep.sum()), int(tail.sum())
    if not n_tail:
        return []
    shares = [(c, tail_count[c] / n_tail, all_count[c] / n_all) for c in present]
    groups = [{"label": labels[c], "tail_share": round(float(t), 4), "all_share": round(float(a), 4)}
              for c, t, a in sorted(shares, key=lambda x: -x[1])[:DETAIL_GROUPS]]
    out = []
    for c, t, a in shares:
        effect = excess_share(t, a)
        p = binomial_sf(int(tail_count[c]), n_tail, a)
        label = what.format(labels[c])
        said = (verb or "is " + what).format(labels[c])
        evidence = (f"{pct(t)} of the tail ({int(tail_count[c])} of {n_tail}) {said}, against {pct(a)} of all "
                    f"{n_all:,} requests")
        out.append(Candidate(kind, name or f"{family}={labels[c]}", label, effect, p, evidence,
                             {"column": family, "groups": groups, "tail_share": round(float(t), 4),
                              "all_share": round(float(a), 4)}, family))
    return out


def binary(s: Split, member: np.ndarray, kind: str, name: str, label: str, extra: dict | None = None) -> list[Candidate]:
    """A yes/no group over the measured rows: one candidate (the "no" side is not a cause)."""
    key = member.astype(np.int64)
    found = concentration(s, key, ["no", label], kind, name, name, "{}")
    for c in found:
        c.detail.update(extra or {})
        c.detail["groups"] = [g for g in c.detail["groups"] if g["label"] == label] + \
                             [{**g, "label": "other requests"} for g in c.detail["groups"] if g["label"] == "no"]
    return [c for c in found if c.label == label]


def _codes_of_numbers(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Integer codes of a numeric column's values (-1 for NaN), by hashing (pandas.factorize: a
    million rows in milliseconds, where sorting them takes a good part of a second)."""
    key, uniq = pd.factorize(values, use_na_sentinel=True)
    return key.astype(np.int64), [f"{v:g}" for v in uniq]


def where_what(s: Split) -> list[Candidate]:
    """Replica, node, worker, connection; class, turn, lengths, prefix-cache miss."""
    rec = s.records
    out: list[Candidate] = []
    for column, kind, what, verb in (("replica", "where", "replica {}", "came from replica {}"),
                                     ("node", "where", "node {}", "was sent from node {}"),
                                     ("class", "what", "class {}", "is of class {}")):
        if column in rec.codes:
            out += concentration(s, rec.codes[column][s.rows].astype(np.int64), rec.values[column], kind, column,
                                 None, what, verb)
    if "worker" in rec.numbers:
        key, labels = _codes_of_numbers(s.column("worker"))
        out += concentration(s, key, labels, "where", "worker", None, "worker {}", "was sent by worker {}")
        if "connection" in rec.numbers:
            conn = s.column("connection")
            pair = np.where(np.isfinite(conn) & (conn >= 0), s.column("worker") * 1e6 + conn, np.nan)
            key, labels = _codes_of_numbers(pair)
            labels = [f"{int(float(v) // 1e6)}:{int(float(v) % 1e6)}" for v in labels]
            out += concentration(s, key, labels, "where", "connection", None, "connection {} (worker:connection)",
                                 "went over connection {} (worker:connection)")
    if "turn" in rec.numbers:
        turn = s.column("turn")
        if np.nanmax(turn, initial=0) > 0:
            key, labels = _codes_of_numbers(np.where(turn > 0, np.minimum(turn, 10), np.nan))
            labels = [("10+" if v == "10" else v) for v in labels]
            out += concentration(s, key, labels, "what", "turn", None, "turn {}")
    for column, words in (("prompt_tokens", "a prompt of {} tokens"), ("output_tokens", "an answer of {} tokens")):
        if column in rec.numbers:
            out += _lengths(s, column, words)
    if "cached_tokens" in rec.numbers:
        cached = s.column("cached_tokens")
        said = np.isfinite(cached)
        if said.any() and (cached[said] == 0).any() and (cached[said] > 0).any():
            key = np.where(said, (cached == 0).astype(np.int64), -1)
            found = concentration(s, key, ["hit", "miss"], "what", "prefix_cache_miss", "prefix_cache_miss",
                                  "a prefix-cache {}", "was a prefix-cache {}")
            out += [c for c in found if c.label == "a prefix-cache miss"]
    return out


def _lengths(s: Split, column: str, words: str) -> list[Candidate]:
    """A length: its values as groups when few, else its quintiles; every bin is named `column`."""
    values = s.column(column)
    finite = np.isfinite(values)
    if not finite.any():
        return []
    if len(pd.unique(values[finite])) <= 12:
        key, labels = _codes_of_numbers(values)
    else:
        known = values[finite]
        if len(known) > 200_000:  # the quintiles' edges from a sample: exact enough, 10× faster
            known = known[np.random.default_rng(0).choice(len(known), 200_000, replace=False)]
        edges = np.unique(np.quantile(known, [0.2, 0.4, 0.6, 0.8]))
        key = np.where(finite, np.searchsorted(edges, np.where(finite, values, 0), side="right"), -1)
        bounds = [float(values[finite].min()), *edges.tolist(), float(values[finite].max())]
        labels = [f"{bounds[i]:g}–{bounds[i + 1]:g}" for i in range(len(bounds) - 1)]
    return concentration(s, key, labels, "what", column, column, words, "had " + words)


def when(s: Split) -> list[Candidate]:
    """Phase, time bins, bursts, after an idle stretch, actions, a replica's first requests."""
    rec = s.records
    out: list[Candidate] = []
    if "phase" in rec.codes:
        out += concentration(s, rec.codes["phase"][s.rows].astype(np.int64), rec.values["phase"], "time", "phase",
                             None, "phase {}", "was sent in phase {}")
    intended = rec.number("intended_us") / 1e6
    mine = intended[s.rows]
    ordered = np.sort(mine)
    for radius in TIME_RADII_S:
        found = _time_near(s, mine, ordered, radius)
        if found is not None:
            out.append(found)
    if np.isfinite(intended).sum() > 1:
        start = float(np.nanmin(intended))
        for window in BURST_WINDOWS_S:
            out += _bursts(s, intended, mine, start, window)
        out += _after_idle(s, intended)
    out += _actions(s, mine)
    out += _replica_starts(s, mine)
    return out


def _time_near(s: Split, t: np.ndarray, ordered: np.ndarray, radius: float) -> Candidate | None:
    """The tail concentrated in some stretches of time: the stretches within `radius` s of one random
    half of the tail (by intended time), tested on the other half: its count in them against their
    share of all requests. Under "no cause", the second half is a random subset of the requests not
    in the first, so the binomial with the stretches' share of *all* requests (the first half's own
    included, which the second cannot hold) is conservative."""
    if not len(t) or not np.isfinite(t).all():
        return None
    tail_rows = np.flatnonzero(s.tail)
    order = np.random.default_rng(0).permutation(len(tail_rows))
    half1, half2 = np.sort(t[tail_rows[order[: len(order) // 2]]]), tail_rows[order[len(order) // 2:]]
    if not len(half1) or not len(half2):
        return None
    starts, ends = half1 - radius, half1 + radius  # the stretches, merged where they touch
    breaks = np.flatnonzero(starts[1:] > ends[:-1])
    lo, hi = starts[np.concatenate(([0], breaks + 1))], ends[np.concatenate((breaks, [len(ends) - 1]))]
    # all requests in the stretches, counted on the sorted times (`ordered`: t sorted), not one by one
    share = float((np.searchsorted(ordered, hi, side="right") - np.searchsorted(ordered, lo, side="left")).sum()
                  / len(t))
    if share > 0.5:
        return Candidate("time", "time", f"stretches of time (±{radius:g} s)", 0.0, 1.0, "", family="time")
    t_half2 = t[half2]
    inside = np.searchsorted(lo, t_half2, side="right") - 1
    hot2 = (inside >= 0) & (t_half2 <= hi[np.clip(inside, 0, len(hi) - 1)])
    k2 = int(hot2.sum())
    t2 = k2 / len(half2)
    hot_s = [[round(float(a), 3), round(float(b), 3)] for a, b in zip(lo, hi)]
    # episodes: the whole tail's clusters in time (requests within 2 × radius of the next) of two or
    # more; fewer than MIN_EPISODES of them is a one-off stall, not a pattern
    ordered = np.sort(t[tail_rows])
    cluster = np.concatenate(([0], np.cumsum(np.diff(ordered) > 2 * radius)))
    episodes = int((np.bincount(cluster) >= 2).sum())
    first = float(t.min())
    width = max(radius, (float(t.max()) - first) / MAX_BINS)  # the figure's bins
    bins = ((t - first) // width).astype(np.int64)
    size = int(bins.max()) + 1
    evidence = (f"{pct(t2)} of the tail falls in {len(hot_s)} stretch{'es' if len(hot_s) != 1 else ''} of time "
                f"that hold {pct(share)} of all requests (within {radius:g} s of the rest of the tail: one half "
                "finds them, the other is counted)")
    if episodes < MIN_EPISODES:
        evidence += (f"; but the tail gathers in only {episodes} moment{'s' if episodes != 1 else ''}: "
                     + ("a one-off stall" if episodes <= 1 else "too few to be a pattern"))
    detail = {"bin_s": width, "bins_s": [round(first + i * width, 3) for i in range(size)],
              "tail": np.bincount(bins[s.tail], minlength=size).tolist(),
              "all": np.bincount(bins, minlength=size).tolist(), "hot_s": hot_s[:200], "radius_s": radius,
              "tail_share": round(t2, 4), "all_share": round(share, 4), "episodes": episodes}
    return Candidate("time", "time", f"stretches of time (±{radius:g} s)", excess_share(t2, share),
                     binomial_sf(k2, len(half2), share), evidence, detail, "time", episodes >= MIN_EPISODES)


def _bursts(s: Split, everyone: np.ndarray, t: np.ndarray, start: float, window: float) -> list[Candidate]:
    """Sent in a burst: when the arrivals of the `window` s before it (every request sent, warm-up and
    failures too: what a queue was fed) ran at BURST_FACTOR × their median rate or more, counted in
    bins of a 50th of the window. Steady arrivals (Poisson) have no such stretches: no candidate."""
    step = window / 50
    bins = ((everyone[np.isfinite(everyone)] - start) // step).astype(np.int64)
    cum = np.concatenate(([0], np.cumsum(np.bincount(bins))))
    k = ((t - start) // step).astype(np.int64)
    rate = (cum[np.clip(k + 1, 0, len(cum) - 1)] - cum[np.clip(k - 49, 0, len(cum) - 1)]) / window
    median = float(np.median(rate))
    cut = BURST_FACTOR * median
    member = rate >= cut
    if median <= 0 or not 0 < member.mean() <= 0.5:
        return []
    found = binary(s, member, "time", "bursts", "sent during a burst",
                   {"window_s": window, "rate_rps": round(cut, 3), "median_rate_rps": round(median, 3)})
    for c in found:
        c.label = f"bursts (≥ {cut:.3g} req/s over {window:g} s)"
        c.evidence = c.evidence.replace("is sent during a burst", f"was sent during a burst (≥ {cut:.3g} req/s "
                                        f"arriving over the {window:g} s before it, {BURST_FACTOR:g} × the median)")
    return found


def _after_idle(s: Split, everyone: np.ndarray) -> list[Candidate]:
    """The first request after an idle stretch (a gap ≥ 1 s and ≥ 20 × the median gap in the schedule:
    every request sent, warm-up and failures too)."""
    finite = np.isfinite(everyone)
    order = np.argsort(np.where(finite, everyone, np.inf), kind="stable")
    ordered = everyone[order]
    gaps = np.diff(ordered)
    gaps = gaps[np.isfinite(gaps)]
    if not len(gaps):
        return []
    idle = max(1.0, 20 * float(np.median(gaps)))
    before = np.empty(len(everyone))
    before[order] = np.concatenate(([np.inf], np.diff(ordered)))
    member = before[s.rows]
    member = np.isfinite(member) & (member >= idle)
    if not member.any():
        return []
    found = binary(s, member, "time", "after_idle", "the first after an idle stretch", {"idle_s": idle})
    for c in found:
        c.evidence += f" (idle ≥ {idle:.3g} s before it)"
    return found


def _actions(s: Split, t: np.ndarray) -> list[Candidate]:
    """In flight while a scenario action ran (from its start to 1 s after its end)."""
    starts: dict[str, list[float]] = {}
    windows: dict[str, list[tuple[float, float]]] = {}
    for e in s.run.events:
        name, at = e.get("name"), e.get("t_s")
        if not isinstance(name, str) or not isinstance(at, (int, float)):
            continue
        if e.get("event") == "action_start":
            starts.setdefault(name, []).append(float(at))
        elif e.get("event") == "action_end" and starts.get(name):
            windows.setdefault(name, []).append((starts[name].pop(0), float(at) + 1.0))
    for name, left in starts.items():  # never ended (the run did first)
        windows.setdefault(name, []).extend((a, a + 1.0) for a in left)
    end = s.column("end_us") / 1e6
    out = []
    for name, spans in windows.items():
        member = np.zeros(len(t), bool)
        for a, b in spans:
            member |= (t <= b) & (end >= a)
        if member.any():
            found = binary(s, member, "time", f"action={name}", f"in flight during action {name}",
                           {"spans_s": [[round(a, 3), round(b, 3)] for a, b in spans]})
            out += found
    return out


def _replica_starts(s: Split, t: np.ndarray) -> list[Candidate]:
    """A replica's first requests, for a replica first seen over 1 s after the run's first request."""
    rec = s.records
    if "replica" not in rec.codes:
        return []
    replica = rec.codes["replica"][s.rows]
    sent = s.column("sent_us")
    order = np.lexsort((np.where(np.isfinite(sent), sent, np.inf), replica))
    out = []
    first_t = float(np.nanmin(t))
    for code in np.unique(replica[replica >= 0]):
        idx = order[replica[order] == code]
        if len(idx) < 2 * REPLICA_FIRST or t[idx[0]] - first_t < 1.0:
            continue
        member = np.zeros(len(t), bool)
        member[idx[:REPLICA_FIRST]] = True
        label = rec.values["replica"][code]
        out += binary(s, member, "time", f"replica_start={label}", f"among replica {label}'s first {REPLICA_FIRST}",
                      {"first_s": round(float(t[idx[0]]), 3)})
    return out
