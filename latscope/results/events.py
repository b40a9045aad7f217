"""events.jsonl: what happened during a run, one JSON object a line (the event names and their fields
are catalogued in schema.EVENT_TYPES)."""

from __future__ import annotations

import json
import math
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
    """events.jsonl's events. The torn last line of a run that was killed mid-write (no newline at
    its end; cut anywhere, in a UTF-8 character too) is left out; any other line that is not a JSON
    object with an `event` name (and a numeric or null `t_s`) is refused, a ResultsError naming the
    file and the line: a damaged log is not read as a shorter one, which would silently drop the
    events a report draws (restarts, aborts, new replicas)."""
    path = Path(run_dir) / EVENTS
    lines = path.read_bytes().split(b"\n")
    torn = len(lines) if lines[-1] else 0  # the line after the last newline, when there is one
    events = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
            problem = _event_problem(event)
        except RecursionError:
            problem = "nested deeper than JSON can be read"
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 text (byte {exc.start} of the line); the file is damaged"
        except ValueError as exc:
            problem = f"not a JSON event ({exc})"
        if problem is None:
            events.append(event)
        elif number != torn:
            raise ResultsError(f"{path}:{number}: {problem}")
    return events


def _event_problem(event: object) -> str | None:
    if not isinstance(event, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(event), "a number")
        return f"{kind}, not a JSON object (an event)"
    if not isinstance(event.get("event"), str):
        return "no `event` name"
    t_s = event.get("t_s")
    if t_s is not None and not (type(t_s) in (int, float) and math.isfinite(t_s)):  # a bool is not a time either
        return "`t_s` is neither a finite number nor null"
    return None
