"""HdrHistogram interval log (.hlog), format version 1.3, with tags.

The file is text, one line per record, as written by the Java ``HistogramLogWriter`` (and
readable by its ``HistogramLogReader``, HistogramLogAnalyzer, ``hdrh.log.HistogramLogReader``
and the other HdrHistogram ports)::

    #[Histogram log format version 1.3]
    #[StartTime: 1732284000.000 (seconds since epoch), Fri Nov 22 14:00:00 UTC 2024]
    #[BaseTime: 1732284000.000 (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    Tag=latency/all,0.000,1.000,12.345,HISTFAAAAEV42pNpmSz...
    0.000,1.000,3.071,HISTFAAAAC94...

* Lines starting with ``#`` are comments; ``#[StartTime: <s> ...`` and ``#[BaseTime: <s> ...``
  are epoch seconds. We write BaseTime = StartTime, so every interval timestamp is in seconds
  relative to the start of the run.
* The legend line (``"StartTimestamp",...``) is ignored by readers.
* An interval line is ``[Tag=<tag>,]<start>,<length>,<max>,<histogram>``: start and length in
  seconds (``%.3f``), max the interval histogram's max value divided by 1000 — our values are
  µs, so Interval_Max is in ms (``%.3f``) — and the histogram as a V2 compressed, base64 blob.
  A tag may not contain ``,`` or whitespace; a line without a tag is an untagged interval.

Reading follows the Java/Python readers: without a BaseTime line, timestamps more than a year
before StartTime are taken as relative (base = StartTime), others as absolute (base = 0); without
a StartTime line, the first interval's timestamp is the start. ``read_hlog`` yields each interval's
start relative to StartTime.

``hdrh``'s own ``HistogramLogWriter`` is not used: it writes format 1.2, cannot write tags, and
its ``output_start_time`` is broken.
"""

from __future__ import annotations

import base64
import ctypes
import itertools
import math
import os
import re
import struct
import time
import zlib
from typing import Callable, Iterator, TextIO

import numpy as np
from hdrh.codec import (
    V2_COMPRESSION_COOKIE_BASE,
    V2_ENCODING_COOKIE_BASE,
    ext_header_size,
    get_cookie_base,
    payload_header_size,
)
from hdrh.histogram import HdrHistogram
from pyhdrh import decode as varint_decode  # hdrh's own C varint decoder

from latscope.recorder import decode, encode, merge, new_histogram

FORMAT_VERSION = "1.3"
LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
MAX_VALUE_UNIT_RATIO = 1000.0  # µs -> ms for Interval_Max

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_BAD_TAG = re.compile(r"[,\s]")
_START_TIME = re.compile(r"#\[StartTime: *([-+\d.eE]+)")
_BASE_TIME = re.compile(r"#\[BaseTime: *([-+\d.eE]+)")
_ONE_YEAR_S = 365 * 24 * 3600.0


def _utc_date(t: float) -> str:
    """Java's Date.toString() in UTC, locale-independent: 'Fri Nov 22 14:00:00 UTC 2024'."""
    g = time.gmtime(t)
    return f"{_DAYS[g.tm_wday]} {_MONTHS[g.tm_mon - 1]} {g.tm_mday:02d} {g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d} UTC {g.tm_year}"


def _check_time(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    return value + 0.0  # -0.0 -> 0.0 (else "%.3f" writes "-0.000")


class HlogWriter:
    """Writes a tagged interval log to an open text file; the caller owns (flushes, closes) the file."""

    def __init__(self, f: TextIO, start_time_epoch_s: float):
        self.f = f
        self.start_time_epoch_s = start_time_epoch_s
        f.write(
            f"#[Histogram log format version {FORMAT_VERSION}]\n"
            f"#[StartTime: {start_time_epoch_s:.3f} (seconds since epoch), {_utc_date(start_time_epoch_s)}]\n"
            f"#[BaseTime: {start_time_epoch_s:.3f} (seconds since epoch)]\n"
            f"{LEGEND}\n"
        )

    def comment(self, text: str) -> None:
        """One '#' line per line of text."""
        self.f.write("".join(f"#{line}\n" for line in (text.splitlines() or [""])))

    def write(self, tag: str | None, start_s: float, length_s: float, h: HdrHistogram) -> None:
        """One interval: start_s relative to StartTime, length_s, both in seconds; values in µs.
        ValueError for a tag that is empty or holds ',' or whitespace, or a negative/non-finite time."""
        if tag is not None and (not tag or _BAD_TAG.search(tag)):
            raise ValueError(f"hlog tag must be non-empty, without ',' or whitespace: {tag!r}")
        start_s = _check_time("start_s", start_s)
        length_s = _check_time("length_s", length_s)
        blob = encode(h)  # syncs h.max_value from the counts first
        max_ms = h.get_max_value() / MAX_VALUE_UNIT_RATIO
        prefix = "" if tag is None else f"Tag={tag},"
        self.f.write(f"{prefix}{start_s:.3f},{length_s:.3f},{max_ms:.3f},{blob}\n")


class HlogReader:
    """Iterates over an interval log's intervals as (tag, start_s relative to StartTime, length_s,
    histogram). After iteration, ``start_time_s`` / ``base_time_s`` hold the log's epoch times
    (None if absent) and ``version`` its format version (None if absent).

    A malformed interval line raises ValueError naming it, unless strict=False, in which case it
    is skipped (e.g. the torn last line of a log whose writer was killed).

    `want(tag)`, when given, picks the intervals to decode; the others are skipped unread, which
    makes reading one metric out of a long log several times faster."""

    def __init__(self, source: str | os.PathLike | TextIO, strict: bool = True, want: Callable[[str | None], bool] | None = None):
        self.source = source
        self.strict = strict
        self.want = want
        self.start_time_s: float | None = None
        self.base_time_s: float | None = None
        self.version: str | None = None

    def __iter__(self) -> Iterator[tuple[str | None, float, float, HdrHistogram]]:
        if isinstance(self.source, (str, os.PathLike)):
            with open(self.source, encoding="utf-8") as f:
                yield from self._lines(f)
        else:
            yield from self._lines(self.source)

    def _lines(self, f: TextIO) -> Iterator[tuple[str | None, float, float, HdrHistogram]]:
        start = self.start_time_s
        base = self.base_time_s
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith('"'):  # blank, legend
                continue
            if line.startswith("#"):
                if m := _START_TIME.match(line):
                    start = self.start_time_s = float(m.group(1))
                elif m := _BASE_TIME.match(line):
                    base = self.base_time_s = float(m.group(1))
                elif line.startswith("#[Histogram log format version "):
                    self.version = line[len("#[Histogram log format version ") :].rstrip("]").strip()
                continue
            try:
                tag = None
                if line.startswith("Tag="):
                    tag, line = line[4:].split(",", 1)
                    tag = tag or None
                if self.want is not None and not self.want(tag):
                    continue
                ts, length, _max, blob = line.split(",", 3)
                ts, length = float(ts), float(length)
                h = decode(blob)
            except Exception as e:  # noqa: BLE001 - any parse/decode failure is a malformed line
                if self.strict:
                    raise ValueError(f"{getattr(f, 'name', 'hlog')}:{number}: malformed interval line ({_what(e)})") from e
                continue
            if start is None:  # no StartTime: the first interval starts the log
                start = ts
            if base is None:  # no BaseTime: relative if more than a year before StartTime
                base = start if ts < start - _ONE_YEAR_S else 0.0
            yield tag, ts + (base - start), length, h  # exact ts when BaseTime == StartTime


def read_hlog(
    path: str | os.PathLike | TextIO, strict: bool = True, want: Callable[[str | None], bool] | None = None
) -> Iterator[tuple[str | None, float, float, HdrHistogram]]:
    """(tag, start_s relative to the log's StartTime, length_s, histogram) for each interval; see HlogReader."""
    return iter(HlogReader(path, strict, want))


# -- reading a latscope log fast -------------------------------------------------------------------
#
# hdrh's decode() builds a whole HdrHistogram per interval: two fresh 184 KiB counter arrays, and
# page faults on first touch; that is ~90% of the time of reading an hour's log. A log written by
# latscope (BaseTime == StartTime, our histogram layout) is read here instead with hdrh's own
# pieces (its wire-format headers and pyhdrh's varint decoder) into one reused counter array, of
# which only the non-zero counters are kept. Anything else goes through read_hlog, the
# reference reader; tests check that both give the same counters.

Sparse = tuple[np.ndarray, np.ndarray]  # (counts-array indices int32, counts int64)
_LAYOUT = new_histogram()
_COUNTS_LEN = _LAYOUT.counts_len
_OUR_LAYOUT = (_LAYOUT.lowest_trackable_value, _LAYOUT.highest_trackable_value, _LAYOUT.significant_figures, 0)


def read_sparse(path: str | os.PathLike, prefix: str) -> Iterator[tuple[str, float, float, Sparse]]:
    """(tag, start_s relative to StartTime, length_s, sparse counters) of the intervals whose tag
    starts with `prefix`, in file order. ValueError naming the line for a malformed one."""
    with open(path, encoding="utf-8") as f:
        times: dict[str, float] = {}
        number, line = 0, ""
        for number, line in enumerate(f, 1):  # the header: comments up to the legend or first interval
            if not line.startswith("#"):
                break
            for key, pattern in (("start", _START_TIME), ("base", _BASE_TIME)):
                if m := pattern.match(line):
                    try:
                        times[key] = float(m.group(1))
                    except ValueError:
                        raise ValueError(f"{path}:{number}: malformed header line ({m.group(1)!r} is not a time)") from None
        if "start" in times and times.get("start") == times.get("base"):  # written by latscope
            wanted = "Tag=" + prefix
            scratch = (ctypes.c_int64 * _COUNTS_LEN)()  # one per call: readers in threads do not share it
            for number, line in itertools.chain([(number, line)], enumerate(f, number + 1)):
                if not line.startswith(wanted):
                    continue
                try:
                    tag, start_s, length_s, _max, blob = line[4:].split(",", 4)
                    interval = tag, _time(start_s), _time(length_s), _sparse(blob.strip(), scratch)
                except Exception as exc:  # noqa: BLE001 - base64, zlib, struct, hdrh's cookie/length errors: a damaged line
                    raise ValueError(f"{path}:{number}: malformed interval line ({_what(exc)})") from None
                yield interval
            return
    # another writer's log: the reference reader knows its cases
    for tag, start_s, length_s, h in read_hlog(path, want=lambda tag: tag is not None and tag.startswith(prefix)):
        yield tag, start_s, length_s, _sparse_of(h)


def _time(text: str) -> float:
    """An interval's start or length as latscope writes it (HlogWriter: finite, >= 0)."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"time {text.strip()!r} is not a finite number of seconds >= 0")
    return value


def _what(exc: Exception) -> str:
    """A decode error in words: hdrh's exceptions carry no message (HdrCookieException()), and
    binascii's and zlib's are called Error and error."""
    name = type(exc).__name__
    if name.lower() == "error":
        name = f"{type(exc).__module__}.{name}"
    return f"{name}: {exc}" if str(exc) else f"{name}: not an HdrHistogram V2 blob"


_OUTER = struct.Struct(">II")  # hdrh.codec.ExternalHeader: cookie, length
_INNER = struct.Struct(">IIIIQQd")  # hdrh.codec.PayloadHeader: cookie, payload_len, normalizing_index_offset,
#                                     significant_figures, lowest, highest, conversion_ratio_bits
# Far above any histogram's payload (ours: at most 9 bytes a counter, ~200 KiB), far below memory trouble
_MAX_INFLATED = 64 << 20
assert _OUTER.size == ext_header_size and _INNER.size == payload_header_size


def _sparse(blob: str, scratch: ctypes.Array) -> Sparse:
    """A V2 compressed histogram blob's non-zero counters (see above), decoded through `scratch`
    (a zeroed counter array, left zeroed); one of another layout is decoded by hdrh and re-bucketed
    into ours."""
    raw = base64.b64decode(blob, validate=True)
    cookie, length = _OUTER.unpack_from(raw)
    if get_cookie_base(cookie) == V2_COMPRESSION_COOKIE_BASE and length == len(raw) - ext_header_size:
        inflate = zlib.decompressobj()
        data = inflate.decompress(raw[ext_header_size:], _MAX_INFLATED)
        if inflate.unconsumed_tail:  # a damaged (or hostile) blob: no histogram inflates this far
            raise ValueError(f"the histogram inflates past {_MAX_INFLATED >> 20} MiB")
        cookie, payload_len, offset, figures, lowest, highest, _ = _INNER.unpack_from(data)
        if (get_cookie_base(cookie) == V2_ENCODING_COOKIE_BASE and (lowest, highest, figures, offset) == _OUR_LAYOUT
                and payload_len == len(data) - payload_header_size):
            found = varint_decode(data, payload_header_size, ctypes.addressof(scratch), _COUNTS_LEN, 8)
            if not found["total"]:
                return np.zeros(0, np.int32), np.zeros(0, np.int64)
            lo, hi = found["min_nonzero_index"], found["max_nonzero_index"] + 1
            window = np.ctypeslib.as_array(scratch)[lo:hi]
            nz = np.flatnonzero(window != 0)  # via bool: ~5x faster than on the int64 counters
            counts = window[nz].copy()
            window[nz] = 0
            return (nz + lo).astype(np.int32), counts
    return _sparse_of(decode(blob))


def _sparse_of(h: HdrHistogram) -> Sparse:
    if h.counts_len != _COUNTS_LEN or h.unit_magnitude != _LAYOUT.unit_magnitude:
        h = merge([h])  # another tool's layout: re-bucketed into ours
    counts = np.ctypeslib.as_array(h.counts)
    nz = np.flatnonzero(counts != 0)
    return nz.astype(np.int32), counts[nz].astype(np.int64)
