"""Where a request's time goes: client encode, network, the server's Server-Timing parts, client
decode — as shares of client-inclusive latency, per class (and the protocol that class used).

The client builds each request ahead of its intended time (engine.py), so `latency` (from the
intended time) holds no encode; `client_inclusive` (latency + that encode, intervals.py) is what a
caller that encodes at its send time would wait, and the parts add up to it. A run recorded before
requests were prepared ahead has no `client_inclusive`: its encode was inside latency, which is then
the total.

From summary.json (warm-up excluded, as there). A part is not recorded for every request (a
stream's Server-Timing covers only its start, so "network" is left out for streams; a server may
send Server-Timing for some responses only), so each part is weighed by how many requests had it:
a part's `mean_ms` is its total time divided by the class's completed requests (its mean
contribution to one request), and its `share` that over the mean total. "other" is the rest of the
total: waiting to be sent (send lag), and whatever the parts do not cover. A server's
"server.total", when it sends one, is the sum of its other parts, so it is a part of its own only
when the server sends nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from latscope.analysis.run_data import RunData
from latscope.results.reading import read_scenario

COLUMNS = ("class", "protocol", "part", "mean_ms", "share", "latency_ms")


def breakdown(run: RunData) -> pd.DataFrame:
    """One row per class × part: class, protocol, part ("encode", "network", "server.<name>", ...,
    "decode", "other"), mean_ms, share (of the mean total, client-inclusive latency where the run
    has it; parts plus "other" sum to 1), latency_ms (the class's mean latency, for comparison).
    Empty DataFrame (same columns) when the run recorded no encode/decode/server parts."""
    metrics = run.summary.get("metrics", {})
    server_parts = sorted(m for m in metrics if m.startswith("server.") and m != "server.total")
    if not server_parts and "server.total" in metrics:  # a server that reports only its total
        server_parts = ["server.total"]
    parts = ["encode", "network", *server_parts, "decode"]
    protocols = class_protocols(run.path)
    rows = []
    for cls, latency in metrics.get("latency", {}).items():
        n, latency_ms = latency.get("count", 0), latency.get("mean_ms")
        if not n or not latency_ms:
            continue
        inclusive = metrics.get("client_inclusive", {}).get(cls, {})
        # recorded with every encode: a class whose requests all had one has it as its total
        mean = inclusive["mean_ms"] if inclusive.get("count") == n else latency_ms
        present = [(part, metrics[part][cls]) for part in parts if cls in metrics.get(part, {})]
        present = [(part, s) for part, s in present if s.get("count")]
        if not present:
            continue
        protocol = protocols.get(cls) or (_one(protocols.values()) if cls == "all" else None)
        total = 0.0
        for part, s in present:
            part_ms = s["mean_ms"] * s["count"] / n
            total += part_ms
            rows.append({"class": cls, "protocol": protocol, "part": part, "mean_ms": part_ms, "share": part_ms / mean,
                         "latency_ms": latency_ms})
        rows.append({"class": cls, "protocol": protocol, "part": "other", "mean_ms": mean - total,
                     "share": (mean - total) / mean, "latency_ms": latency_ms})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _one(values) -> str | None:
    values = set(values)
    return values.pop() if len(values) == 1 else ("mixed" if values else None)


def class_protocols(run_dir: Path) -> dict[str, str]:
    """class -> protocol, from the run's scenario.yaml (a class's own protocol, else the
    target's); {} when the file is missing (ResultsError when damaged: results/reading.py)."""
    scenario = read_scenario(Path(run_dir))
    target = scenario.get("target") or {}
    default = target.get("protocol") or "http"
    classes = (scenario.get("workload") or {}).get("classes") or [{"name": "default"}]
    return {c["name"]: c.get("protocol") or default for c in classes if isinstance(c, dict) and "name" in c}
