"""Reading and writing a results directory — the contract between measuring and analysing.

    results/<scenario>-<UTC timestamp>/
      summary.json        what CI and other tools read (schema_version 1; keys are added, never renamed)
      scenario.yaml       the resolved scenario, secrets redacted
      histograms.hlog     HdrHistogram interval log 1.3, one `Tag=metric/class` line per interval
      timeseries.parquet  one row per interval × metric × class
      telemetry.parquet   one row per sample: t_s (run clock), source, device, metric, value (latscope/telemetry/)
      events.jsonl        run start/end, phases, target launch, aborts
      schedule.parquet    the realized schedule: intended offset, phase, class of every planned request
      target.log          output of a target the scenario launched

Every file is written to a temporary name and renamed, so a reader never sees half a file; an
interrupted run still leaves each of them, with summary.json saying `"partial": true`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from latscope.errors import ResultsError, ScenarioError
from latscope.hlog import read_hlog

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram

SCHEMA_VERSION = 1
SUMMARY = "summary.json"
SCENARIO = "scenario.yaml"
HLOG = "histograms.hlog"
TIMESERIES = "timeseries.parquet"
TELEMETRY = "telemetry.parquet"
EVENTS = "events.jsonl"
SCHEDULE = "schedule.parquet"
TARGET_LOG = "target.log"


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


class EventLog:
    """events.jsonl: one JSON object a line, flushed as it happens, timestamped on the run's clock
    (`t_s`, seconds from the first intended send; negative before it) and on the wall clock."""

    def __init__(self, path: Path):
        self._f: TextIO = open(path, "a", encoding="utf-8")
        self.t0_ns: int | None = None
        self.listeners: list[Callable[[dict], None]] = []  # also get each event (progress display, live metrics)
        self._lock = threading.Lock()  # telemetry threads emit too (gaps), not only the run loop

    def emit(self, event: str, at_ns: int | None = None, **fields: Any) -> None:
        """Log `event` as happening now, or at perf_counter_ns `at_ns` (e.g. seen by a worker earlier)."""
        now = time.perf_counter_ns()
        at = now if at_ns is None else at_ns
        wall = datetime.now(timezone.utc) - timedelta(microseconds=(now - at) / 1000)
        record = {
            "event": event,
            "t_s": round((at - self.t0_ns) / 1e9, 6) if self.t0_ns is not None else None,
            "wall": wall.isoformat(timespec="milliseconds"),
            **fields,
        }
        with self._lock:
            if not self._f.closed:
                self._f.write(json.dumps(record) + "\n")
                self._f.flush()
                for listener in self.listeners:
                    listener(record)

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def read_events(run_dir: str | Path) -> list[dict]:
    """events.jsonl's events. The torn last line of a run that was killed mid-write is left out;
    any other line that is not JSON is a ResultsError naming it."""
    path = Path(run_dir) / EVENTS
    lines = path.read_text().splitlines()
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError as exc:
            if number == len(lines):
                continue
            raise ResultsError(f"{path}:{number}: not a JSON event ({exc})") from None
    return events


Interval = tuple[float, float, "HdrHistogram"]  # (start_s from the run's start, length_s, histogram)


def read_intervals(run_dir: str | Path, metrics: Collection[str] | None = None) -> dict[tuple[str, str], list[Interval]]:
    """The per-interval histograms of histograms.hlog, by (metric, class), in time order; only
    those of `metrics` when given (the others are not decoded). Warm-up intervals are included:
    timeseries.parquet's `phase` column, or summary.json's `phases`, tell them apart."""
    wanted = None if metrics is None else set(metrics)

    def want(tag: str | None) -> bool:
        return tag is not None and (wanted is None or tag.split("/", 1)[0] in wanted)

    out: dict[tuple[str, str], list[Interval]] = {}
    for tag, start_s, length_s, h in read_hlog(Path(run_dir) / HLOG, want=want):
        metric, cls = tag.split("/", 1)  # metric names hold no "/" (Server-Timing names are tokens)
        out.setdefault((metric, cls), []).append((start_s, length_s, h))
    return out


def read_timeseries(run_dir: str | Path):
    import pandas as pd

    return pd.read_parquet(Path(run_dir) / TIMESERIES)


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
