"""Latency recording with HDR histograms: the worker-side recorder and the statistics over histograms.

Units
    Every value is an integer number of microseconds. Histograms track 1 µs .. 1 h
    (``LOWEST_US`` .. ``HIGHEST_US``) at 3 significant figures: values below 2048 µs are exact,
    above that a bucket is at most 1/1024 (≈ 0.098 %) of its values wide. Values outside
    [0, HIGHEST_US] are clamped into it and counted per metric (``Recorder.clamped``), never lost
    silently (``HdrHistogram.record_value`` would just return False).

Statistics are computed with numpy over the histogram's counts array, never from the
histogram's ``min_value``/``max_value``/``total_count`` fields (``hdrh``'s ``add()`` sets
``min_value = min(self.get_min_value(), other.get_min_value())``, and ``get_min_value()`` is 0 for
an empty histogram, so adding an empty histogram pins min at 0 for good), and never with
``hdrh``'s own percentile/mean/reset methods, which are pure-Python loops over all 23,552 counters.

Percentile semantics (exactly those of HdrHistogram, and equal to
``HdrHistogram.get_percentile_to_value_dict``):

* N is the total count; the target rank of percentile p (0 <= p <= 100) is
  ``max(1, int(p * N / 100 + 0.5))`` (computed in that order, as ``hdrh`` does);
* the bucket is the first one, in value order, at which the cumulative count reaches the target rank;
* the value is that bucket's *highest equivalent value* (the largest value that would have been
  counted in it), or its *lowest equivalent value* when p == 0.

So p100 is the highest equivalent value of the largest recorded value, p0 the lowest equivalent
value of the smallest one, and a reported percentile is never below the true sample percentile
and at most one bucket width (≤ 1/1024 relative) above it.

``summarize`` reports min = lowest equivalent value of the first non-empty bucket, max = highest
equivalent value of the last non-empty bucket, and mean = count-weighted mean of each bucket's
median equivalent value (lowest + half the bucket width), as ``hdrh``'s ``get_mean_value`` does.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Iterable, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # 1 h
SIGNIFICANT_FIGURES = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)

Key = tuple[str, str, bool]  # (metric, class name, warmup)
Sparse = tuple[np.ndarray, np.ndarray]  # (counts-array indices, their counts)


def new_histogram() -> HdrHistogram:
    """An empty histogram for µs values in [LOWEST_US, HIGHEST_US] at SIGNIFICANT_FIGURES."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


# Counts-array index of a value, inlined in Recorder.record instead of calling hdrh's
# record_value (which costs ~3 µs in pure Python). For unit_magnitude 0 and a sub-bucket count
# of 2**(m+1) (m = sub_bucket_half_count_magnitude), hdrh's index is:
#   value < 2**(m+1):  value
#   otherwise:         (b << m) + (value >> b)   with b = value.bit_length() - (m + 1)
# (its bucket_index is b, sub_bucket_index value >> b, index (b + 1) << m + sub - 2**m).
_PROBE = new_histogram()
assert _PROBE.unit_magnitude == 0, "the inlined index formula assumes LOWEST_US == 1"
_HALF_MAG = _PROBE.sub_bucket_half_count_magnitude  # 10
_SUB_COUNT = _PROBE.sub_bucket_count  # 2048
_SHIFT = _HALF_MAG + 1  # 11
_COUNTS_LEN = _PROBE.counts_len  # 23552
del _PROBE


def _to_int(value) -> int:
    """A non-int value (float, numpy scalar) rounded to the nearest integer; ±inf and NaN become
    out-of-range values so that they are clamped (and counted) like any other."""
    try:
        return int(round(value))
    except (ValueError, OverflowError):  # NaN, ±inf
        return HIGHEST_US + 1 if value > 0 else -1


class Recorder:
    """Worker side: one HDR histogram per (metric, class, warmup) for the CURRENT interval only.

    Memory stays flat: snapshot() hands the interval's counters out and drops them from the
    recorder (their zeroed counter arrays are kept in a small pool and reused by the next
    interval, which is much cheaper than allocating and zeroing new 184 KiB histograms).
    """

    def __init__(self) -> None:
        self._counts: dict[Key, ctypes.Array] = {}  # the hot path touches only this
        self._hists: dict[Key, HdrHistogram] = {}
        self._pool: list[HdrHistogram] = []
        self.clamped: dict[str, int] = {}  # metric -> values clamped since the last snapshot

    def record(self, metric: str, cls: str, value_us: int, warmup: bool = False) -> None:
        """Count one value (µs). Values outside [0, HIGHEST_US] are clamped and counted in
        ``self.clamped[metric]``; non-int values are rounded to the nearest µs."""
        counts = self._counts.get((metric, cls, warmup))
        if counts is None:
            counts = self._open((metric, cls, warmup))
        if type(value_us) is not int:
            value_us = _to_int(value_us)
        if not 0 <= value_us <= HIGHEST_US:
            value_us = 0 if value_us < 0 else HIGHEST_US
            self.clamped[metric] = self.clamped.get(metric, 0) + 1
        if value_us < _SUB_COUNT:
            counts[value_us] += 1
        else:
            b = value_us.bit_length() - _SHIFT
            counts[(b << _HALF_MAG) + (value_us >> b)] += 1

    def _open(self, key: Key) -> ctypes.Array:
        h = self._pool.pop() if self._pool else new_histogram()
        self._hists[key] = h
        self._counts[key] = h.counts
        return h.counts

    def snapshot(self) -> tuple[dict[Key, Sparse], dict[str, int]]:
        """({key: (indices, counts)} — the non-zero counters of every histogram recorded into since
        the last snapshot, see `from_sparse` — and {metric: clamped count}); the recorder then starts
        empty. Sparse arrays, not encoded histograms: this runs on the worker's event loop, where
        encoding (~1 ms a histogram) would delay every response being read; the parent builds them."""
        out: dict[Key, Sparse] = {}
        for key, h in self._hists.items():
            counts = _counts(h)
            nz = np.flatnonzero(counts)
            out[key] = (nz.astype(np.int32), counts[nz].copy())
            counts[nz] = 0
            h.total_count, h.min_value, h.max_value = 0, sys.maxsize, 0
            self._pool.append(h)
        clamped = self.clamped
        self._hists, self._counts, self.clamped = {}, {}, {}
        return out, clamped


def from_sparse(indices: np.ndarray, counts: np.ndarray) -> HdrHistogram:
    """The histogram whose non-zero counters are `counts` at `indices` (as Recorder.snapshot gives them)."""
    h = new_histogram()
    np.add.at(_counts(h), indices, counts)
    _sync(h)
    return h


def to_sparse(h: HdrHistogram) -> Sparse:
    """The histogram's non-zero counters as (indices, counts): from_sparse's inverse."""
    counts = _counts(h)
    nz = np.flatnonzero(counts)
    return nz.astype(np.int32), counts[nz].copy()


def _counts(h: HdrHistogram) -> np.ndarray:
    """Zero-copy numpy view of the histogram's counters."""
    return np.ctypeslib.as_array(h.counts)


def _sync(h: HdrHistogram) -> None:
    """Set total_count/min_value/max_value from the counts array (as hdrh's decoder does), so
    that hdrh's own encode() (which encodes counters up to max_value's index) and getters are right."""
    counts = _counts(h)
    nz = np.flatnonzero(counts)
    if len(nz) == 0:
        h.total_count, h.min_value, h.max_value = 0, sys.maxsize, 0
        return
    h.total_count = int(counts.sum())
    h.min_value = h.get_value_from_index(int(nz[0]))
    h.max_value = h.get_highest_equivalent_value(h.get_value_from_index(int(nz[-1])))


def encode(h: HdrHistogram) -> str:
    """The histogram as a V2 compressed, base64 blob (str), its tracking fields synced from the counts first."""
    _sync(h)
    return h.encode().decode("ascii")


def decode(blob: str | bytes) -> HdrHistogram:
    """A histogram from a V2 base64 blob (as written by encode() or any HdrHistogram port)."""
    return HdrHistogram.decode(blob)


def _same_layout(a: HdrHistogram, b: HdrHistogram) -> bool:
    return (
        a.unit_magnitude == b.unit_magnitude
        and a.sub_bucket_half_count_magnitude == b.sub_bucket_half_count_magnitude
        and a.counts_len == b.counts_len
    )


def merge(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    """Lossless sum of the histograms, as a new histogram (inputs are left untouched).

    Histograms with our layout are added counter by counter; one with another layout (say a
    nanosecond histogram from another tool) is added value by value, each bucket at its lowest
    equivalent value, as hdrh's add() does — ValueError if such a value is out of our range."""
    out = new_histogram()
    acc = _counts(out)
    for h in histograms:
        if _same_layout(h, out):
            acc += _counts(h)
        else:
            other = _counts(h)
            for i in np.flatnonzero(other):
                value, n = h.get_value_from_index(int(i)), int(other[i])
                if not out.record_value(value, n):
                    raise ValueError(f"value {value} does not fit a [{LOWEST_US}, {HIGHEST_US}] histogram")
    _sync(out)
    return out


# Per layout: (lowest, highest, median) equivalent value of every counts-array index, int64.
_TABLES: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _tables(h: HdrHistogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Value tables for h's layout, built once per process (~0.1 s, with hdrh's own helpers, so
    that they agree with hdrh by construction)."""
    layout = (h.unit_magnitude, h.sub_bucket_half_count_magnitude, h.counts_len)
    tables = _TABLES.get(layout)
    if tables is None:
        values = [h.get_value_from_index(i) for i in range(h.counts_len)]
        lowest = np.array([h.get_lowest_equivalent_value(v) for v in values], dtype=np.int64)
        highest = np.array([h.get_highest_equivalent_value(v) for v in values], dtype=np.int64)
        # _hdr_median_equiv_value: lowest + (bucket width >> 1); width = highest - lowest + 1
        median = lowest + ((highest - lowest + 1) >> 1)
        tables = _TABLES[layout] = (lowest, highest, median)
    return tables


def _values_at(h: HdrHistogram, cum: np.ndarray, percentiles: Sequence[float]) -> dict[float, int]:
    total = int(cum[-1])
    ps = list(dict.fromkeys(percentiles))  # dedupe, keep order
    for p in ps:
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile {p!r} is not in [0, 100]")
    if total == 0:
        return {}
    targets = np.array([max(1, int(p * total / 100 + 0.5)) for p in ps], dtype=np.uint64)
    idx = np.searchsorted(cum, targets, side="left")  # first bucket whose cumulative count >= target
    lowest, highest, _ = _tables(h)
    return {p: int(highest[i]) if p else int(lowest[i]) for p, i in zip(ps, idx.tolist())}


def values_at(h: HdrHistogram, percentiles: Sequence[float]) -> dict[float, int]:
    """{p: value in µs} with HDR semantics (see the module docstring); equal to hdrh's
    get_percentile_to_value_dict, including {} for an empty histogram. ValueError for p outside [0, 100]."""
    return _values_at(h, np.cumsum(_counts(h)), percentiles)


def summarize(h: HdrHistogram) -> dict:
    """{"count", "min_ms", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99.9_ms", "max_ms"},
    ms rounded to 3 decimals (µs resolution); {"count": 0} for an empty histogram."""
    counts = _counts(h)
    nz = np.flatnonzero(counts)
    if len(nz) == 0:
        return {"count": 0}
    cum = np.cumsum(counts)
    total = int(cum[-1])
    lowest, highest, median = _tables(h)
    c, m = counts[nz].astype(np.int64), median[nz]
    if total * int(m[-1]) < 2**63:  # the exact int64 dot product cannot overflow
        weighted = int(np.dot(c, m))
    else:
        weighted = sum(int(a) * int(b) for a, b in zip(c.tolist(), m.tolist()))
    out = {"count": total, "min_ms": round(int(lowest[nz[0]]) / 1000, 3), "mean_ms": round(weighted / total / 1000, 3)}
    for p, v in _values_at(h, cum, PERCENTILES).items():
        out[f"p{p:g}_ms"] = round(v / 1000, 3)
    out["max_ms"] = round(int(highest[nz[-1]]) / 1000, 3)
    return out


def bucket_bounds(h: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) equivalent value of every counts-array index of h's layout, int64 µs."""
    lowest, highest, _ = _tables(h)
    return lowest, highest


def bucket_indices(values_us: np.ndarray) -> np.ndarray:
    """Counts-array index of each value (µs; clamped into [0, HIGHEST_US], rounded), vectorised."""
    v = np.clip(np.rint(np.asarray(values_us, dtype=np.float64)), 0, HIGHEST_US).astype(np.int64)
    b = np.maximum(np.frexp(v.astype(np.float64))[1] - _SHIFT, 0)  # frexp's exponent is the bit length (< 2**53)
    return np.where(v < _SUB_COUNT, v, (b << _HALF_MAG) + (v >> b))


def counts_from_values(values_us: np.ndarray) -> np.ndarray:
    """The counts array that recording `values_us` one by one into a new_histogram() would give —
    vectorised, for synthetic histograms in tests and benchmarks."""
    return np.bincount(bucket_indices(np.ravel(values_us)), minlength=_COUNTS_LEN).astype(np.int64, copy=False)
