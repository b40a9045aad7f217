"""events.jsonl: what happened during a run, one JSON object a line (the event names and their fields
are catalogued in schema.EVENT_TYPES)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, TextIO

from latscope.errors import ResultsError
from latscope.results.schema import EVENTS


class EventLog:
    """events.jsonl: one JSON object a line, flushed as it happens, timestamped on the run's clock
    (`t_s`, seconds from the first intended send; negative before it) and on the wall clock."""

    def __init__(self, path: Path):
        self._f: TextIO = open(path, "a", encoding="utf-8")
        self.t0_ns: int | None = None
        self.listeners: list[Callable[[dict], None]] = []  # also get each event (progress display, live metrics)
        self._lock = threading.Lock()  # telemetry threads emit too (gaps), not only the run loop

    def emit(self, event: str, at_ns: int | None = None, **fields: Any) -> None:
        """Log `event` (a name of schema.EVENT_TYPES) as happening now, or at perf_counter_ns `at_ns`
        (e.g. seen by a worker earlier)."""
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
