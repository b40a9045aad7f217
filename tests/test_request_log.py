"""The worker's request log on its own: rows as columns, nulls, part files in bounded batches,
stalls laid over requests, the sample's hash. A real RequestLog writing real files; no run."""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow.parquet as pq

import latscope.request_log as request_log
from latscope.records import Conversation, Outcome, Request
from latscope.request_log import NULL, RequestLog, kept, stall_overlap_us

T0 = 10_000_000_000  # ns
MS = 1_000_000


def new_log(tmp_path, **kw) -> RequestLog:
    return RequestLog(tmp_path / "parts", 7, T0, ["a", "b"], np.array([0, 0, 1, 1]), ["warm", "main"], [0.0, 1.0], **kw)


def test_a_row_holds_what_it_was_given_with_nulls_where_nothing_was_recorded(tmp_path):
    log = new_log(tmp_path, secrets=["hunter2"])
    ok = Request(2, T0 + 1_500 * MS, 1, False, prompt_tokens=12)
    outcome = Outcome(T0 + 1_501 * MS, T0 + 1_530 * MS, status=200, bytes_in=99, bytes_out=12, token_ns=[T0 + 1_510 * MS],
                      output_tokens=1, server_timing={"queue": 2.5, "hunter2x": 1.0}, replica="pod-hunter2",
                      first_byte_ns=T0 + 1_505 * MS, connection=3, cached_tokens=4)
    log.add(ok, outcome, (30_000, 29_000, 1_000, NULL, NULL, NULL, NULL), (10_000, NULL, NULL))
    turn = Request(9, T0 + 1_600 * MS, 0, False, turn=2, session=Conversation(5, 0, True, -1, 3, T0))
    log.add(turn, Outcome(T0 + 1_600 * MS, T0 + 1_700 * MS, status=503, error="http_5xx"),
            (NULL, NULL, 0, NULL, NULL, NULL, NULL), (NULL, NULL, NULL))
    log.cancelled(Request(0, T0, 0, True))
    log.close()
    files = sorted((tmp_path / "parts").iterdir())
    assert [f.name for f in files] == ["w007-000000.parquet"]
    t = pq.read_table(files[0]).to_pydict()
    assert t["row"] == [2, 9, 0] and t["class"] == ["b", "a", "a"] and t["warmup"] == [False, False, True]
    assert t["phase"] == ["main", "main", "warm"]  # row 9 is past the plan: the phase of its intended time (1.6 s)
    assert t["worker"] == [7, 7, 7] and t["session"] == [None, 5, None] and t["turn"] == [0, 2, 0]
    assert t["intended_us"] == [1_500_000, 1_600_000, 0] and t["sent_us"] == [1_501_000, 1_600_000, None]
    assert t["first_byte_us"] == [1_505_000, None, None] and t["first_token_us"] == [1_510_000, None, None]
    assert t["end_us"][:2] == [1_530_000, 1_700_000] and t["end_us"][2] > 0
    assert t["error"] == [None, "http_5xx", "cancelled"] and t["status"] == [200, 503, 0]
    assert t["latency_us"] == [30_000, None, None] and t["send_lag_us"] == [1_000, 0, None]
    assert t["ttft_us"] == [10_000, None, None] and t["tpot_us"] == [None] * 3 and t["encode_us"] == [None] * 3
    assert t["prompt_tokens"] == [12, 0, 0] and t["output_tokens"] == [1, 0, 0] and t["cached_tokens"] == [4, None, None]
    assert t["replica"] == ["pod-<redacted>", None, None] and t["connection"] == [3, None, None]
    assert t["server.queue"] == [2.5, None, None] and t["server.<redacted>x"] == [1.0, None, None]
    assert t["bytes_in"] == [99, 0, 0] and t["stall_us"] == [0, 0, 0]
    assert "node" not in t  # the merge adds it


def test_batches_leave_at_batch_rows_and_after_the_flush_age_as_complete_files(tmp_path, monkeypatch):
    monkeypatch.setattr(request_log, "BATCH_ROWS", 100)
    log = new_log(tmp_path)
    for i in range(250):
        log.add(Request(i, T0 + i, 0, False), Outcome(T0 + i, T0 + i + 5000), (5, 5, 0, NULL, NULL, NULL, NULL),
                (NULL, NULL, NULL))
    log.on_interval()  # not yet FLUSH_AFTER_NS since the last batch: the 50 rows stay
    assert log.n == 50
    monkeypatch.setattr(request_log, "FLUSH_AFTER_NS", 0)
    log.on_interval()
    assert log.n == 0
    log.close()
    files = sorted((tmp_path / "parts").iterdir())
    assert [f.name for f in files] == ["w007-000000.parquet", "w007-000001.parquet", "w007-000002.parquet"]
    assert [pq.read_metadata(f).num_rows for f in files] == [100, 100, 50]
    assert log.rows_written == 250


def test_stalls_overlapping_a_request_count_once_as_their_union():
    stalls = np.array([(50, 60), (70, 80), (75, 90), (200, 201)])  # µs; the 2nd and 3rd overlap: one span 70..90
    start, end = np.array([65, 0, 95, 72, 200]), np.array([85, 300, 100, 74, 200])
    # [65, 85]: 70..85 of the merged span; [0, 300]: all, 10 + 20 + 1; [95, 100]: none; inside one span; empty
    assert stall_overlap_us(stalls, start, end).tolist() == [15, 31, 0, 2, 0]


def test_a_stall_reported_after_the_answers_it_held_still_counts_for_them(tmp_path):
    # A starved worker reads the answers held back by a stall in the loop turn that ends it, often
    # before its loop-lag probe reports the stall: the overlap is taken when the batch leaves.
    log = new_log(tmp_path)
    now = time.perf_counter_ns()
    log.add(Request(0, now - 100 * MS, 0, False), Outcome(now - 99 * MS, now), (100_000, 99_000, 1_000, NULL, NULL, NULL, NULL),
            (NULL, NULL, NULL))
    log.stall(40_000)  # reported now: [≈ now − 40 ms, ≈ now]
    log.stall(999)  # under STALL_MIN_US: not kept
    assert len(log.stalls) == 1
    log.close()
    stall_us = pq.read_table(next((tmp_path / "parts").iterdir()))["stall_us"][0].as_py()
    assert 39_000 <= stall_us <= 40_000  # less only by the time between the row's end and the report


def test_the_sample_keeps_each_row_with_the_fraction_asked_independently_of_the_worker():
    """200,000 rows at 0.1: Binomial(200000, 0.1), sd 134; 5 sd. Deterministic per (seed, row); another
    seed draws another sample, of the same size within the same bound, overlapping as independent draws do
    (0.1 × 0.1 of the rows, sd of that count ~44)."""
    rows = range(200_000)
    a = {r for r in rows if kept(3, r, 0.1)}
    b = {r for r in rows if kept(4, r, 0.1)}
    sd = math.sqrt(200_000 * 0.1 * 0.9)
    assert abs(len(a) - 20_000) < 5 * sd and abs(len(b) - 20_000) < 5 * sd
    assert a == {r for r in rows if kept(3, r, 0.1)}
    assert abs(len(a & b) - 2_000) < 5 * math.sqrt(200_000 * 0.01 * 0.99)
    assert all(kept(3, r, 1.0) for r in range(1000)) and not any(kept(3, r, 0.0) for r in range(1000))


def test_made_up_names_cannot_grow_a_worker_without_bound(tmp_path, monkeypatch):
    """A target naming a new Server-Timing part and a new replica in every response: MAX_SERVER_PARTS
    columns at most, and replica ids are kept per batch (each part file names only its own)."""
    monkeypatch.setattr(request_log, "BATCH_ROWS", 50)
    log = new_log(tmp_path)
    for i in range(100):
        log.add(Request(i, T0, 0, False), Outcome(T0, T0 + 1000, server_timing={f"p{i}": 1.0}, replica=f"r{i}"),
                (1, 1, 0, NULL, NULL, NULL, NULL), (NULL, NULL, NULL))
    log.close()
    first, second = (pq.read_table(f) for f in sorted((tmp_path / "parts").iterdir()))
    assert len(log.part_names) == request_log.MAX_SERVER_PARTS == 64
    assert sum(n.startswith("server.") for n in first.schema.names + second.schema.names) == 64
    assert first["replica"].to_pylist() == [f"r{i}" for i in range(50)]
    assert second["replica"].to_pylist() == [f"r{i}" for i in range(50, 100)]
    assert len(second["replica"].chunk(0).dictionary) == 50
