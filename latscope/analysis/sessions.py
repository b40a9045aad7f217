"""Chat sessions (multi-turn conversations) and the server's prefix cache, from a results directory.

What each function computes, all read from the files a run wrote, nothing measured again:

- `session_table`: per class that ran sessions (summary.json `sessions`, outside warm-up), how its
  sessions ended — started, completed, abandoned (a turn failed or was dropped at the in-flight cap),
  cut (the run ended first), history_limit (its carried history passed its bound), the turns those
  did not send — the session duration's p50 and p99 (a
  completed session: turn 1's intended time → its last answer's end) and its prefix-cache hit rate.
- `turn_table`: per class × turn, that turn's requests: completed, errors, prompt tokens, cached and
  cache-reported prompt tokens, the hit rate (cached ÷ cache-reported prompt tokens; None when the
  server never said), and the p50/p99 of latency, TTFT, ITL and TPOT (summary.json
  `sessions.<class>.by_turn`; for a class without one, `metrics["turn.<metric>"]["<class>#<turn>"]`).
  Turn 1 against the later turns is the prefix cache's story: a later turn re-sends what turn 1 sent.
- `prefix_cache_table`: per class and "all", the prefix cache over every request (summary.json
  `tokens.<class>.prefix_cache`), runs without sessions included (a Mooncake trace replay).
- `session_timeline`: per interval × class, from timeseries.parquet's session counters (warm-up
  included, flagged): sessions started and ended (completed, abandoned, cut, history_limit) in the
  interval, turns not sent, and the sessions in progress at the interval's end (cumulative started −
  cumulative ended). Empty for a file written before those counters existed (a missing column is
  absent, not 0), except history_limit, added later: a file without its column ended none that way.
- `load_model`: summary.json `load`: open loop, or closed/mixed with its users and the note that says
  how to read it (the offered load follows the server: coordinated omission).

The hit rate is a fraction (0…1); a report multiplies it by 100.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latscope.analysis.run_data import RunData
from latscope.results.schema import SESSION_COUNTERS, TURN_COUNTERS, TURN_METRICS, TURN_PREFIX, split_turn_class

SESSION_COLUMNS = ("class", "started", "completed", "abandoned", "cut", "history_limit", "turns_not_sent", "duration_count",
                   "duration_p50_ms", "duration_p99_ms", "cached_tokens", "prompt_tokens", "hit_rate")
TURN_STATS = ("p50_ms", "p99_ms")
TURN_COLUMNS = ("class", "turn", *TURN_COUNTERS, "hit_rate",
                *(f"{m}_{s}" for m in TURN_METRICS for s in TURN_STATS), *(f"{m}_count" for m in TURN_METRICS))
CACHE_COLUMNS = ("class", "cached_tokens", "prompt_tokens", "hit_rate")
TIMELINE_COLUMNS = ("t_s", "class", "phase", "warmup", "started", "completed", "abandoned", "cut", "history_limit",
                    "ended", "turns_not_sent", "in_progress")
LATER_SESSION_COUNTERS = ("sessions_history_limit",)  # added after the others: a file written before has none (0)
CLOSED_MODELS = ("closed", "mixed")


def number(value: object) -> float | None:
    """A finite number, else None (summary.json writes null for a statistic it does not have)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _hit_rate(cached: object, reported: object) -> float | None:
    cached, reported = number(cached), number(reported)
    return cached / reported if cached is not None and reported else None


def sessions_of(summary: dict) -> dict[str, dict]:
    """summary.json `sessions` ({} for a run without sessions, or one written before they existed)."""
    sessions = summary.get("sessions")
    return sessions if isinstance(sessions, dict) else {}


def session_table(run: RunData) -> pd.DataFrame:
    """One row per class that ran sessions (SESSION_COLUMNS); empty (same columns) without sessions."""
    rows = []
    for cls, s in sessions_of(run.summary).items():
        duration = s.get("duration") or {}
        cache = s.get("prefix_cache") or {}
        rows.append({
            "class": cls, **{c.removeprefix("sessions_"): int(s.get(c.removeprefix("sessions_")) or 0) for c in SESSION_COUNTERS},
            "duration_count": int(duration.get("count") or 0),
            "duration_p50_ms": number(duration.get("p50_ms")), "duration_p99_ms": number(duration.get("p99_ms")),
            "cached_tokens": int(cache.get("cached_tokens") or 0), "prompt_tokens": int(cache.get("prompt_tokens") or 0),
            "hit_rate": number(cache.get("hit_rate")),
        })
    return pd.DataFrame(rows, columns=list(SESSION_COLUMNS))


def _turn_row(cls: str, turn: int, counters: dict, stats: dict[str, dict]) -> dict:
    row: dict = {"class": cls, "turn": turn, **{c: int(counters.get(c) or 0) for c in TURN_COUNTERS}}
    row["hit_rate"] = number(counters["hit_rate"]) if "hit_rate" in counters else _hit_rate(
        row["cached_tokens"], row["cache_reported_prompt_tokens"])
    for m in TURN_METRICS:
        s = stats.get(m) or {}
        row[f"{m}_count"] = int(s.get("count") or 0)
        for stat in TURN_STATS:
            row[f"{m}_{stat}"] = number(s.get(stat)) if row[f"{m}_count"] else None
    return row


def turn_table(run: RunData) -> pd.DataFrame:
    """One row per class × turn (TURN_COLUMNS), turns in order; empty (same columns) without sessions."""
    rows = []
    sessions = sessions_of(run.summary)
    for cls, s in sessions.items():
        for turn, t in sorted((s.get("by_turn") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append(_turn_row(cls, int(turn), t, {m: t.get(m) for m in TURN_METRICS}))
    # a class with turn histograms but no by_turn (a summary written without it): its turns' statistics alone
    metrics = run.summary.get("metrics", {})
    found: dict[tuple[str, int], dict] = {}
    for m in TURN_METRICS:
        for name, stats in (metrics.get(TURN_PREFIX + m) or {}).items():
            if "#" not in name:
                continue
            cls, turn = split_turn_class(name)
            if cls not in sessions:
                found.setdefault((cls, turn), {})[m] = stats
    for (cls, turn), stats in sorted(found.items()):
        rows.append(_turn_row(cls, turn, {"hit_rate": None}, stats))  # no counters: no hit rate
    return pd.DataFrame(rows, columns=list(TURN_COLUMNS))


def prefix_cache_table(run: RunData) -> pd.DataFrame:
    """One row per class (and "all", last) whose requests the server reported cached tokens for
    (CACHE_COLUMNS); empty (same columns) when it never did."""
    rows = []
    tokens = run.summary.get("tokens") or {}
    for cls, t in sorted(tokens.items(), key=lambda kv: kv[0] == "all"):
        cache = (t or {}).get("prefix_cache") if isinstance(t, dict) else None
        if not cache:
            continue
        rows.append({"class": cls, "cached_tokens": int(cache.get("cached_tokens") or 0),
                     "prompt_tokens": int(cache.get("prompt_tokens") or 0), "hit_rate": number(cache.get("hit_rate"))})
    return pd.DataFrame(rows, columns=list(CACHE_COLUMNS))


def session_timeline(run: RunData) -> pd.DataFrame:
    """One row per interval × class that started a session (and "all" when several did), in time order
    (TIMELINE_COLUMNS): the counters of the class's "latency" rows, where timeseries.parquet keeps a
    workload class's counters (one row per class and interval, even when nothing completed). Empty when
    the file has no session counters or no session started."""
    ts = run.timeseries
    empty = pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    if not len(ts) or any(c not in ts for c in ("metric", "class", *SESSION_COUNTERS) if c not in LATER_SESSION_COUNTERS):
        return empty
    rows = ts[ts["metric"] == "latency"]
    started = rows.groupby("class", sort=False)["sessions_started"].sum()
    classes = [c for c, n in started.items() if c != "all" and n > 0]
    if not classes:
        return empty
    if len(classes) > 1:
        classes.append("all")
    frames = []
    for cls in classes:
        df = rows[rows["class"] == cls].sort_values("interval_start_s", kind="stable")
        counts = {c.removeprefix("sessions_"): df[c].fillna(0).to_numpy(np.int64) if c in df else np.zeros(len(df), np.int64)
                  for c in SESSION_COUNTERS}
        ended = counts["completed"] + counts["abandoned"] + counts["cut"] + counts["history_limit"]
        frames.append(pd.DataFrame({
            "t_s": df["interval_start_s"].to_numpy(float), "class": cls, "phase": df["phase"].to_numpy(object),
            "warmup": df["phase"].isin(run.warmup_phases).to_numpy(bool),
            **{k: counts[k] for k in ("started", "completed", "abandoned", "cut", "history_limit")}, "ended": ended,
            "turns_not_sent": counts["turns_not_sent"], "in_progress": np.cumsum(counts["started"]) - np.cumsum(ended),
        }))
    return pd.concat(frames, ignore_index=True)[list(TIMELINE_COLUMNS)]


def load_model(summary: dict) -> dict:
    """summary.json `load`: {"model": "open"} (also for a run written before it existed), or
    {"model": "closed" | "mixed", "users": N, "note": "..."}."""
    load = summary.get("load")
    return load if isinstance(load, dict) and load.get("model") else {"model": "open"}


def closed_loop(summary: dict) -> bool:
    """Whether some of the run's load came from closed-loop users (the offered load followed the server)."""
    return load_model(summary).get("model") in CLOSED_MODELS


def has_session_data(run: RunData) -> bool:
    """Whether the run had sessions or the server reported a prefix cache (the report's panel is drawn)."""
    return bool(sessions_of(run.summary)) or not prefix_cache_table(run).empty or not turn_table(run).empty
