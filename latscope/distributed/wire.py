"""What crosses between machines in a distributed run: the frames' contents and the codecs.

Frames between the coordinator and a node (frames.py carries them; → to the node, ← from it):

    → setup {scenario, name, overrides, plan, first, engines, of, files, master_timeout_s}
    ← fetch {sha, offset}        → chunk {sha, offset, data}           (a file the node lacks, CHUNK at a time)
    ← ready {}                   → start {t0}                          (t0 on the node's own clock)
    ← started {late_ms}          ← interval {k, blob, cpu}             (blob: encode_report)
    → stop {}                    ← failed {error}                      → alive {} (from the worker's relay)
    ← records {name, offset, size, data}   → records_ok {bytes}
          (its engines' requests.parquet part files once they are done, CHUNK at a time; bytes: all
          received from it so far; at most RECORDS_WINDOW × CHUNK bytes unanswered)
    ← done {not_sent, error_examples, unaccounted, records}   (records: {files, bytes}, the part files it had)

Histograms travel losslessly: a report's sparse HDR counters (recorder.Sparse) as delta-coded
indices and counts in the narrowest unsigned type that holds them, msgpack, zlib level 1. No pickle
crosses a machine: the plan is numpy arrays (np.save, allow_pickle=False) plus plain fields.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from latscope.distributed import validate
from latscope.distributed.frames import pack, unpack

from latscope.plan import Plan, PhasePlan
from latscope.records import IntervalReport, Probe
from latscope.recorder import new_histogram
from latscope.results.schema import COUNTERS, TURN_COUNTERS, add_counters
from latscope.sessions import Turns

CHUNK = 1 << 20  # a file travels (and is hashed) this many bytes at a time, either way
# A node's records in flight, unanswered by records_ok, at most this many CHUNKs: what Locust's queues
# hold of them, so a heartbeat waits behind at most 4 MiB (ZeroMQ bounds messages, not bytes: without it
# a node's whole records would queue ahead of its heartbeats, and on a slow link the master would
# think it lost)
RECORDS_WINDOW = 4


def file_sha256(path: Path) -> str:
    """A file's content hash (how a node knows its copy is the master's), read CHUNK bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


# -- interval reports -------------------------------------------------------------------------

def report_limits(plan: Plan, last_interval: int, files: dict[str, int]) -> validate.Limits:
    """What a node's frames may say in a run of `plan` (validate.Limits), its reports ending by
    `last_interval` and its nodes fetching `files` (sha256 -> size)."""
    return validate.Limits(requests=len(plan), classes=tuple(plan.class_names), max_interval=last_interval, chunk=CHUNK,
                           counts_len=new_histogram().counts_len, counters=len(COUNTERS),
                           turn_counters=len(TURN_COUNTERS), files=files)


def _narrow(values: np.ndarray) -> tuple[str, bytes]:
    top = int(values.max()) if len(values) else 0
    dtype = next(t for t in ("u1", "u2", "u4", "u8") if top < 1 << (8 * int(t[1])))
    return dtype, values.astype("<" + dtype).tobytes()


def _widen(dtype: str, data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<" + dtype).astype(np.int64)


def encode_report(r: IntervalReport) -> bytes:
    hists = []
    for (metric, cls, warmup), (indices, counts) in r.histograms.items():
        order = np.argsort(indices, kind="stable")
        idx, cnt = np.asarray(indices, np.int64)[order], np.asarray(counts, np.int64)[order]
        hists.append([metric, cls, warmup, *_narrow(np.diff(idx, prepend=0)), *_narrow(cnt)])
    body = {
        "k": r.interval, "h": hists, "c": dict(r.clamped),
        "n": [[ci, w, [int(x) for x in row]] for (ci, w), row in r.counters.items()],
        "f": r.in_flight,
        "r": {name: [end, lat] for name, (end, lat) in r.replicas.items()},
        "p": [[p.seq, p.end_ns, p.latency_us, p.error, p.replica] for p in r.probes],
        "o": list(r.first_ok) if r.first_ok else None,
        "t": [[ci, turn, w, [int(x) for x in row]] for (ci, turn, w), row in r.turns.items()],
    }
    return zlib.compress(pack(body), 1)


def decode_report(blob: bytes, worker: int, limits: validate.Limits, k: int) -> IntervalReport:
    """A node's interval `k` report, checked before use (validate.py: InvalidMessage says what is
    wrong): inflated to at most validate.MAX_INFLATED bytes, every field's type and range."""
    try:
        body = unpack(validate.inflate(blob))
    except validate.InvalidMessage:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack's errors are several, and a few are plain ValueErrors
        raise validate.InvalidMessage(f"its report is not msgpack ({type(exc).__name__})") from None
    b = validate.report_body(body, k, limits)
    histograms = {}
    for metric, cls, warmup, idt, idx, cdt, cnt in b["h"]:
        indices, counts = np.cumsum(_widen(idt, idx)), _widen(cdt, cnt)
        validate.sparse(metric, cls, indices, counts, limits.counts_len)
        histograms[(metric, cls, warmup)] = (indices.astype(np.int32), counts)
    return IntervalReport(
        b["k"], histograms, b["c"], {(ci, w): np.asarray(row, np.int64) for ci, w, row in b["n"]}, b["f"],
        {name: (end, lat) for name, (end, lat) in b["r"].items()}, [Probe(*p) for p in b["p"]],
        tuple(b["o"]) if b["o"] else None, worker=worker,
        turns={(ci, turn, w): np.asarray(row, np.int64) for ci, turn, w, row in b["t"]},
    )


def merge_reports(reports: list[IntervalReport], worker: int) -> IntervalReport:
    """One report of several engines' reports of the same interval (a node's), lossless: counts
    added per histogram bucket, counters added, the earliest first response and replica sightings."""
    parts: dict[tuple, list] = {}
    for r in reports:
        for key, sparse in r.histograms.items():
            parts.setdefault(key, []).append(sparse)
    histograms = {}
    for key, sparses in parts.items():
        idx = np.concatenate([np.asarray(i, np.int64) for i, _ in sparses])
        cnt = np.concatenate([np.asarray(c, np.int64) for _, c in sparses])
        uniq, inverse = np.unique(idx, return_inverse=True)
        histograms[key] = (uniq.astype(np.int32), np.bincount(inverse, weights=cnt, minlength=len(uniq)).astype(np.int64))
    clamped: dict[str, int] = {}
    counters: dict = {}
    turns: dict = {}
    replicas: dict = {}
    for r in reports:
        for metric, n in r.clamped.items():
            clamped[metric] = clamped.get(metric, 0) + n
        for key, row in r.counters.items():
            counters[key] = add_counters(counters.get(key), np.asarray(row, np.int64))  # sums, a few maxima
        for key, row in r.turns.items():
            turns[key] = turns.get(key, 0) + np.asarray(row, np.int64)
        for name, first in r.replicas.items():
            if name not in replicas or first[0] < replicas[name][0]:
                replicas[name] = first
    firsts = [tuple(r.first_ok) for r in reports if r.first_ok]
    return IntervalReport(reports[0].interval, histograms, clamped, counters, sum(r.in_flight for r in reports), replicas,
                          [p for r in reports for p in r.probes], min(firsts) if firsts else None, worker=worker, turns=turns)


def shift_report(r: IntervalReport, by_ns: int) -> IntervalReport:
    """The report with its perf_counter times (first responses, probes) moved by `by_ns`: from a
    node's clock onto the coordinator's."""
    r.replicas = {name: (end + by_ns, lat) for name, (end, lat) in r.replicas.items()}
    r.probes = [dataclasses.replace(p, end_ns=p.end_ns + by_ns) for p in r.probes]
    r.first_ok = (r.first_ok[0] + by_ns, r.first_ok[1]) if r.first_ok else None
    return r


# -- the plan ---------------------------------------------------------------------------------

def encode_plan(plan: Plan) -> bytes:
    """The master's plan for the nodes: every array through np.save (no pickle), compressed."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"phases": [dataclasses.asdict(p) for p in plan.phases], "class_names": plan.class_names,
                            "session_seed": plan.session_seed, "arrays": []}
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        elif isinstance(value, Turns):
            arrays.update({f"turns.{t.name}": getattr(value, t.name) for t in dataclasses.fields(Turns)})
        elif f.name == "blocks" and value is not None:
            arrays.update({f"blocks.{i}": a for i, a in enumerate(value)})
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    meta["arrays"] = sorted(arrays)
    return zlib.compress(pack({"meta": meta, "npz": buf.getvalue()}), 1)


def decode_plan(blob: bytes) -> Plan:
    body = unpack(zlib.decompress(blob))
    meta = body["meta"]
    with np.load(io.BytesIO(body["npz"]), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in meta["arrays"]}
    turns = None
    if "turns.first" in arrays:
        turns = Turns(**{t.name: arrays.pop(f"turns.{t.name}") for t in dataclasses.fields(Turns)})
    blocks = tuple(arrays.pop(f"blocks.{i}") for i in range(3)) if "blocks.0" in arrays else None
    return Plan(phases=[PhasePlan(**p) for p in meta["phases"]], class_names=list(meta["class_names"]),
                session_seed=meta["session_seed"], turns=turns, blocks=blocks, **arrays)
