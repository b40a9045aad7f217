"""A results directory, loaded once for analysis: summary, events, time series, telemetry, and the
per-machine intervals of a distributed run (nodes.parquet).

Histograms are not loaded here (a long run holds tens of thousands of intervals): the functions
that need them read only the metrics they use, with `metric_intervals`, which streams
histograms.hlog, keeps each interval's non-zero counters only (a few hundred numbers instead of a
184 KiB histogram: an hour at 1 s intervals and three classes stays in tens of MB, not GBs) and
caches them on the RunData, so that the spectrum and the cold-start analysis decode a metric once.

Warm-up, at interval granularity: an interval belongs to the phase its start falls in (as the
collector labels timeseries.parquet's `phase`), and is a warm-up interval when that phase is one.
An interval that straddles the end of a warm-up phase is therefore left out whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from hdrh.histogram import HdrHistogram

from latscope import results
from latscope.errors import ResultsError
from latscope.recorder import bucket_bounds, from_sparse, new_histogram
from latscope.results.hlog import read_sparse
from latscope.results.reading import check_summary, read_json
from latscope.results.schema import NODE_COLUMNS, TELEMETRY_COLUMNS


# nodes.parquet's columns that are not float64, for the empty frame of a run on one machine
_NODE_TYPES = {"node": "int64", "host": object, "status": object, "sent": "int64", "completed": "int64",
               "errors": "int64", "in_flight": "int64"}

_LAYOUT = new_histogram()  # our histograms' layout, and a helper for index -> value lookups
_COUNTS_LEN = _LAYOUT.counts_len


@dataclass
class ClassIntervals:
    """One metric × class's interval histograms, compact: interval i holds the counters
    `index[offsets[i]:offsets[i+1]]` (counts-array indices, ascending) with `count[...]`."""

    start_s: np.ndarray  # float, interval starts on the run's clock, ascending
    length_s: np.ndarray
    offsets: np.ndarray  # int64, len(start_s) + 1
    index: np.ndarray  # int32
    count: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def totals(self) -> np.ndarray:
        """Values recorded in each interval."""
        cum = np.concatenate(([0], np.cumsum(self.count)))
        return cum[self.offsets[1:]] - cum[self.offsets[:-1]]

    def merged(self, select: np.ndarray | None = None) -> HdrHistogram:
        """The lossless merge of the selected intervals (a bool mask or positions; all when None)."""
        if select is None:
            index, count = self.index, self.count
        else:
            chosen = np.zeros(len(self), bool)
            chosen[select] = True
            mask = np.repeat(chosen, np.diff(self.offsets))
            index, count = self.index[mask], self.count[mask]
        # bincount sums in float64, exact for totals below 2**53
        dense = np.bincount(index, weights=count, minlength=_COUNTS_LEN).astype(np.int64)
        nz = np.flatnonzero(dense != 0)
        return from_sparse(nz, dense[nz])

    def compact_counts(self, select: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(counts, lowest, highest) of the selected intervals (a bool mask) as a dense matrix over
        only the buckets they use: selected intervals × used buckets, with those buckets' lowest and
        highest values in µs (the input of analysis.quantile_ci)."""
        sizes = np.diff(self.offsets)
        rows = np.repeat(np.arange(len(self)), sizes)
        keep = np.repeat(np.asarray(select, bool), sizes)
        used, column = np.unique(self.index[keep], return_inverse=True)
        row_of = np.cumsum(select) - 1  # position among the selected intervals
        counts = np.zeros((int(np.count_nonzero(select)), len(used)), np.int64)
        np.add.at(counts, (row_of[rows[keep]], column), self.count[keep])
        lowest, highest = bucket_bounds(_LAYOUT)
        return counts, lowest[used], highest[used]

    def span_percentile(self, p: float, first: int, last: int) -> float:
        """The p-th percentile in µs of intervals first..last (positions, inclusive) merged, with
        recorder.values_at's semantics, without building a histogram; NaN when they are empty."""
        lo, hi = self.offsets[first], self.offsets[last + 1]
        index, count = self.index[lo:hi], self.count[lo:hi]
        if last > first:  # several intervals' counters: in value order for the cumulative count
            order = np.argsort(index, kind="stable")
            index, count = index[order], count[order]
        cum = np.cumsum(count)
        if not len(cum) or not cum[-1]:
            return math.nan
        target = max(1, int(p * int(cum[-1]) / 100 + 0.5))
        value = _LAYOUT.get_value_from_index(int(index[int(np.searchsorted(cum, target, side="left"))]))
        return float(_LAYOUT.get_highest_equivalent_value(value) if p else _LAYOUT.get_lowest_equivalent_value(value))


@dataclass
class RunData:
    path: Path
    summary: dict
    events: list[dict]
    timeseries: pd.DataFrame  # timeseries.parquet as written (interval_start_s is on the run's clock)
    telemetry: pd.DataFrame  # telemetry.parquet, TELEMETRY_COLUMNS; empty (same columns) when the run has none
    # nodes.parquet, NODE_COLUMNS; empty (same columns) for a run on one machine
    nodes: pd.DataFrame = field(default_factory=lambda: _empty_nodes())
    _intervals: dict = field(default_factory=dict, repr=False, compare=False)  # metric -> {class: ClassIntervals}

    @property
    def warmup_phases(self) -> set[str]:
        return {p["name"] for p in self.summary.get("phases", []) if p.get("warmup")}

    @property
    def interval_s(self) -> float:
        """The reporting interval (summary's generator.interval_s, else the time series')."""
        value = self.summary.get("generator", {}).get("interval_s")
        if value:
            return float(value)
        if "interval_s" in self.timeseries and len(self.timeseries):
            return float(self.timeseries["interval_s"].iloc[0])
        return 1.0

    def phase_at(self, t_s: float) -> dict | None:
        """The summary's phase that `t_s` (run clock) falls in; None outside every phase."""
        for p in self.summary.get("phases", []):
            if p["start_s"] <= t_s < p["start_s"] + p["duration_s"]:
                return p
        return None

    def is_warmup(self, start_s: np.ndarray) -> np.ndarray:
        """Per interval start: does it fall in a warm-up phase?"""
        start_s = np.asarray(start_s, float)
        out = np.zeros(len(start_s), bool)
        for p in self.summary.get("phases", []):
            if p.get("warmup"):
                out |= (start_s >= p["start_s"]) & (start_s < p["start_s"] + p["duration_s"])
        return out


def load_run(path: str | Path, summary: dict | None = None) -> RunData:
    """Everything but the histograms of the results directory at `path`. ResultsError (a
    LatscopeError) naming the directory and the file when it is not a results directory or a file
    is unreadable; a missing optional file (timeseries.parquet, telemetry.parquet, events.jsonl,
    nodes.parquet) gives an empty one. `summary`: the run's summary when summary.json is not written
    yet (a run analyses its own cold starts before writing it)."""
    path = Path(path)
    if summary is None:
        summary = read_summary(path)
    elif not path.is_dir():
        raise ResultsError(f"{path}: not a results directory (no such directory)")
    return RunData(path, summary, _events(path / results.EVENTS), _timeseries(path / results.TIMESERIES),
                   _telemetry(path / results.TELEMETRY), _nodes(path / results.NODES))


def read_summary(path: str | Path) -> dict:
    """The summary.json of the results directory at `path`, checked as load_run checks it (the same
    ResultsError), reading nothing else: what opening a directory costs before its data is needed."""
    path = Path(path)
    if not path.is_dir():
        raise ResultsError(f"{path}: not a results directory (no such directory)")
    return _summary(path / results.SUMMARY)


def optional_table(path: Path) -> pd.DataFrame | None:
    """A parquet file a run may not have written (schedule.parquet when output.save_schedule is off):
    None when it is absent, ResultsError naming it when it is unreadable."""
    return _parquet(path) if path.exists() else None


def _summary(path: Path) -> dict:
    if not path.is_file():
        raise ResultsError(f"{path.parent}: not a results directory ({results.SUMMARY} is missing)")
    return check_summary(read_json(path), path)  # the shapes every reader relies on (results/reading.py)


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        return results.read_events(path.parent)
    except OSError as exc:
        raise ResultsError(f"{path}: unreadable ({exc})") from None

def _parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise ResultsError(f"{path}: unreadable ({exc})") from None


def _timeseries(path: Path) -> pd.DataFrame:
    if not path.exists():  # a baseline saved by `latscope baseline save` keeps summary and histograms only
        return pd.DataFrame({"interval_start_s": pd.Series(dtype=float), "metric": pd.Series(dtype=object),
                             "class": pd.Series(dtype=object), "phase": pd.Series(dtype=object)})
    return _parquet(path)


def _telemetry(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame({c: pd.Series(dtype=float if c in ("t_s", "value") else object) for c in TELEMETRY_COLUMNS})
    frame = _parquet(path)
    missing = [c for c in TELEMETRY_COLUMNS if c not in frame.columns]
    if missing:
        raise ResultsError(f"{path}: missing columns {', '.join(missing)}")
    return frame


def _empty_nodes() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=_NODE_TYPES.get(c, float)) for c in NODE_COLUMNS})


def _nodes(path: Path) -> pd.DataFrame:
    """nodes.parquet: only a distributed run writes it (a run on one machine, and every run written
    before distributed runs existed, has none)."""
    if not path.exists():
        return _empty_nodes()
    frame = _parquet(path)
    missing = [c for c in NODE_COLUMNS if c not in frame.columns]
    if missing:
        raise ResultsError(f"{path}: missing columns {', '.join(missing)}")
    return frame


def metric_intervals(run: RunData, metric: str) -> dict[str, ClassIntervals]:
    """class -> that metric's interval histograms (warm-up included), decoded once per RunData.
    {} when the metric has none; ResultsError naming histograms.hlog when it is missing or malformed."""
    cached = run._intervals.get(metric)
    if cached is not None:
        return cached
    path = run.path / results.HLOG
    if not path.exists():
        raise ResultsError(f"{path.parent}: incomplete results directory ({path.name} is missing)")
    prefix = metric + "/"
    parts: dict[str, tuple[list, list, list, list]] = {}
    try:
        for tag, start_s, length_s, (nz, counts) in read_sparse(path, prefix):
            starts, lengths, indices, values = parts.setdefault(tag[len(prefix):], ([], [], [], []))
            starts.append(start_s)
            lengths.append(length_s)
            indices.append(nz)
            values.append(counts)
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: unreadable (not UTF-8 text; the file is damaged)") from None
    except (OSError, ValueError) as exc:
        message = str(exc)  # hlog.py's already names the file and the line
        raise ResultsError(message if message.startswith(f"{path}:") else f"{path}: unreadable ({exc})") from None
    out = {}
    for cls, (starts, lengths, indices, values) in parts.items():
        order = np.argsort(np.asarray(starts), kind="stable")
        sizes = np.array([len(indices[i]) for i in order], np.int64)
        out[cls] = ClassIntervals(
            start_s=np.asarray(starts, float)[order],
            length_s=np.asarray(lengths, float)[order],
            offsets=np.concatenate(([0], np.cumsum(sizes))),
            index=np.concatenate([indices[i] for i in order]) if len(order) else np.zeros(0, np.int32),
            count=np.concatenate([values[i] for i in order]) if len(order) else np.zeros(0, np.int64),
        )
    run._intervals[metric] = out
    return out
