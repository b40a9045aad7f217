"""A results directory — the contract between measuring and analysing — and writing one.

    results/<scenario>-<UTC timestamp>/
      summary.json        what CI and other tools read (schema_version 1; keys are added, never renamed)
      scenario.yaml       the resolved scenario, secrets redacted
      histograms.hlog     HdrHistogram interval log 1.3, one `Tag=metric/class` line per interval (hlog.py)
      timeseries.parquet  one row per interval × metric × class
      telemetry.parquet   one row per sample: t_s (run clock), source, device, metric, value (latscope/telemetry/)
      events.jsonl        run start/end, phases, target launch and readiness, actions, aborts (events.py)
      schedule.parquet    the realized schedule: intended offset, phase, class of every planned request
      nodes.parquet       a distributed run's machines, one row per interval per node (NODE_COLUMNS)
      requests.parquet    one row per request sent (REQUEST_COLUMNS; merged from the workers' parts: requests.py)
      explain.json        why the tail is what it is (latscope/analysis/explain.py; `latscope explain`)
      target.log          output of a target the scenario launched
      report.html, summary.md   the report (latscope/report/), when written

schema.py names everything these files are made of (columns, counters, metrics, events). Every file
is written to a temporary name and renamed, so a reader never sees half a file; an interrupted run
still leaves each of them, with summary.json saying `"partial": true`. This package reads and writes
files only: it never imports what measures (engine, run) or what plans (plan, workload).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Collection

import pyarrow as pa
import pyarrow.parquet as pq

from latscope.errors import ScenarioError
from latscope.results.events import EventLog, read_events
from latscope.results.schema import (EVENTS, HLOG, NODES, REPORT, REQUESTS, SCENARIO, SCHEDULE, SCHEMA_VERSION, SUMMARY,
                                     SUMMARY_MD, TARGET_LOG, TELEMETRY, TIMESERIES)

__all__ = ["EVENTS", "HLOG", "NODES", "REPORT", "REQUESTS", "SCENARIO", "SCHEDULE", "SCHEMA_VERSION", "SUMMARY", "SUMMARY_MD", "TARGET_LOG",
           "TELEMETRY", "TIMESERIES", "EventLog", "create_run_dir", "read_events", "save_baseline", "utc_stamp",
           "write_json", "write_rows", "write_table", "write_text"]


def utc_stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def create_run_dir(base: str | Path, scenario_name: str, started: float, explicit: str | Path | None = None) -> Path:
    """A fresh directory for one run: `explicit` as given, else `<base>/<scenario>-<UTC timestamp>`."""
    if explicit is not None:
        path = Path(explicit)
        if (path / SUMMARY).exists():
            raise ScenarioError(f"{path} already holds results (summary.json); choose another --out")
    else:
        stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = Path(base) / f"{scenario_name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(base) / f"{scenario_name}-{stamp}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _atomic(path: Path, write: Any, mode: str = "w") -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    _atomic(path, lambda f: json.dump(obj, f, indent=2, allow_nan=False))


def write_text(path: Path, text: str) -> None:
    _atomic(path, lambda f: f.write(text))


def write_table(path: Path, columns: dict[str, Any]) -> None:
    """A parquet file from named columns (lists or numpy arrays)."""
    table = pa.table(columns)
    _atomic(path, lambda f: pq.write_table(table, f), mode="wb")


def write_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """A parquet file from row dicts, with the given columns even when there are no rows."""
    write_table(path, {c: [r.get(c) for r in rows] for c in columns})


def save_baseline(run_dir: str | Path, dest: str | Path, metrics: Collection[str] | None = None) -> int:
    """Copy what a gate needs from a run — summary.json, scenario.yaml, histograms.hlog (only the
    intervals of `metrics` when given) — to `dest`; the bytes written. The hlog is filtered line by
    line, so the copy is byte-identical for the intervals it keeps."""
    src, dest = Path(run_dir), Path(dest)
    summary = (src / SUMMARY).read_text()
    hlog_lines = (src / HLOG).read_text().splitlines(keepends=True)
    if metrics is not None:
        keep = tuple(f"Tag={m}/" for m in metrics)
        hlog_lines = [line for line in hlog_lines if not line.startswith("Tag=") or line.startswith(keep)]
    dest.mkdir(parents=True, exist_ok=True)
    write_text(dest / SUMMARY, summary)
    write_text(dest / HLOG, "".join(hlog_lines))
    if (src / SCENARIO).exists():
        write_text(dest / SCENARIO, (src / SCENARIO).read_text())
    return sum((dest / name).stat().st_size for name in (SUMMARY, HLOG, SCENARIO) if (dest / name).exists())
