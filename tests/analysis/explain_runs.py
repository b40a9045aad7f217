"""Synthetic results directories for `latscope explain`: a requests.parquet with Contract 1's
columns (results/schema.py REQUEST_COLUMNS), drawn from a seeded generator, and the few other files
explain reads (summary.json, events.jsonl, telemetry.parquet).

A clean run is i.i.d.: a lognormal service time (a heavy-ish tail, as on a noisy box), split into a
Server-Timing `compute` part, a little network and decode, a send lag of tens of µs, uniform
arrivals over replicas, workers, connections, classes and lengths. Each test then injects one cause
by changing some rows (`frame.loc[...]`) and writes the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from latscope.results.schema import REQUEST_COLUMNS

RATE = 200.0  # requests per second of the synthetic schedule


def clean_frame(n: int = 6000, seed: int = 0, *, stream: bool = False) -> pd.DataFrame:
    """n i.i.d. requests (200 req/s Poisson), none warm-up, all successful."""
    rng = np.random.default_rng(seed)
    intended = np.cumsum(rng.exponential(1e6 / RATE, n)).astype(np.int64)
    lag = rng.integers(5, 60, n)
    compute = rng.lognormal(np.log(8000), 0.35, n)  # µs
    network = rng.integers(80, 200, n)
    decode = rng.integers(10, 40, n)
    service = (compute + network + decode).astype(np.int64)
    sent = intended + lag
    end = sent + service
    frame = pd.DataFrame({
        "row": np.arange(n, dtype=np.int64),
        "class": rng.choice(["chat", "embed"], n),
        "phase": np.where(intended < intended[n // 2], "steady", "second"),
        "warmup": np.zeros(n, bool),
        "worker": (np.arange(n) % 2).astype(np.int32),
        "node": pd.Series([None] * n, dtype=object),
        "session": pd.Series([None] * n, dtype="Int64"),
        "turn": np.zeros(n, np.int32),
        "intended_us": intended, "sent_us": sent, "first_byte_us": end - decode,
        "first_token_us": pd.Series([None] * n, dtype="Int64"), "end_us": end,
        "error": pd.Series([None] * n, dtype=object), "status": np.full(n, 200, np.int32),
        "latency_us": end - intended, "service_us": service, "send_lag_us": lag.astype(np.int64),
        "encode_us": rng.integers(5, 20, n), "decode_us": decode.astype(np.int64), "network_us": network.astype(np.int64),
        "ttft_us": pd.Series([None] * n, dtype="Int64"), "tpot_us": pd.Series([None] * n, dtype="Int64"),
        "itl_max_us": pd.Series([None] * n, dtype="Int64"), "client_inclusive_us": end - intended,
        "prompt_tokens": rng.integers(10, 1000, n).astype(np.int32),
        "output_tokens": rng.integers(1, 200, n).astype(np.int32),
        "cached_tokens": pd.Series([None] * n, dtype="Int32"),
        "replica": rng.choice(["r0", "r1", "r2"], n),
        "bytes_in": np.full(n, 300, np.int64), "bytes_out": np.full(n, 200, np.int64),
        "stall_us": np.zeros(n, np.int64),
        "connection": rng.integers(0, 8, n).astype(np.int32),
        "server.compute": compute / 1000.0,
    })
    if stream:
        first = sent + (compute * 0.3).astype(np.int64)
        frame["first_token_us"] = first
        frame["ttft_us"] = first - intended
        frame["server.compute"] = compute * 0.3 / 1000.0  # a stream's Server-Timing leaves with its first token
    return frame


def set_service(frame: pd.DataFrame, rows: np.ndarray, extra_us: np.ndarray | int, part: str = "server.compute") -> None:
    """Make `rows` slower by `extra_us` of server time (in Server-Timing `part`), keeping the columns consistent."""
    extra = np.broadcast_to(np.asarray(extra_us, np.int64), (int(np.count_nonzero(rows)) if rows.dtype == bool
                                                             else len(rows),))
    frame.loc[rows, part] = frame.loc[rows, part].fillna(0) + extra / 1000.0
    for column in ("end_us", "latency_us", "service_us", "client_inclusive_us", "first_byte_us"):
        frame.loc[rows, column] += extra


def write_dir(path: Path, frame: pd.DataFrame, *, events: list[dict] = (), telemetry: pd.DataFrame | None = None,
              summary: dict | None = None) -> Path:
    """A results directory holding `frame` as requests.parquet (Contract 1's column order)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps({"schema_version": 1, **(summary or {})}))
    columns = [c for c in REQUEST_COLUMNS if c in frame] + [c for c in frame if c.startswith("server.")]
    pq.write_table(pa.Table.from_pandas(frame[columns], preserve_index=False), path / "requests.parquet")
    if events:
        (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if telemetry is not None:
        telemetry.to_parquet(path / "telemetry.parquet", index=False)
    return path
