"""Every message a node sends, checked before it is used: the master trusts nothing it is sent.

Anyone who reaches the master's port can join as a Locust worker (docs/distributed.md, Security),
and a broken or hostile one must not take the run down, hang it or fill the master's memory. So each
message from a node is checked here — its shape, its types, its ranges, its size, a compressed
payload's inflated size — and one that fails raises InvalidMessage, whose text says what was wrong:

- the master's relay (locustfile.py) checks each hello (`hello`) and refuses the worker with that
  reason (`node_rejected`): a hello that is not a mapping, lacks a field, or claims engines outside
  1 … MAX_ENGINES;
- the coordinator (remote.py) checks each clock answer (`pong`) and each frame (`frame`; an
  interval's report body with `report_body` and `sparse`, from wire.decode_report, after `inflate`
  has bounded it; a records chunk's place in its node's stream with `records_chunk`) and drops the
  node (`node_failed`), which ends the run partial, naming the node and the reason.

Strings a node supplies (its host name, its errors, its Locust client id) go through `printable`
before they reach a console, a summary or a report: an escape sequence in a host name is shown, not
obeyed. This module imports nothing heavy (the Locust relays import it): the report checks take
numpy arrays but call only their methods.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field

from latscope import __version__
from latscope.distributed.frames import WIRE_VERSION

MAX_ENGINES = 1024  # engines one node may claim: one per core, and no machine has more than ~1,000 cores
MAX_NAME = 255  # characters of a host name (DNS: 253), a version string, a Locust client id
MAX_TEXT = 16_384  # characters of a node's error text kept (a longer one is cut, not refused)
MAX_INFLATED = 32 << 20  # bytes an interval report may inflate to (a real one: a few KB, ~3 MB at most)
MAX_HISTOGRAMS = 65_536  # histograms in one interval report (metrics × classes × warm-up, replicas, turns)
MAX_EXAMPLES = 5 * MAX_ENGINES  # error messages of one kind in a node's `done` (intervals.py keeps 5 per engine)
KEPT_EXAMPLES = 20  # of which the first are kept (the summary shows a few)
INT63 = 1 << 63  # every integer fits an int64: numpy and parquet take it as it is
# A node's records (requests.parquet's part files, shipped after its engines are done) may take at most
# RECORDS_BASE_BYTES + RECORDS_ROW_BYTES × the requests it reported sending: a row is ~40 B compressed,
# its uncompressed worst (every column, long class and replica names, many Server-Timing parts) under
# 4 KiB, and each part file's header and footer a few KB. Bounds the master's disk, not its memory
# (a chunk at a time is written as it comes).
RECORDS_ROW_BYTES = 4096
RECORDS_BASE_BYTES = 64 << 20
MAX_PART_FILES = 1 << 20  # part files one node may claim in its `done`
PART_NAME = re.compile(r"w(\d{3,7})-(\d{6,9})\.parquet")  # an engine's part file: w<engine:03d>-<batch:06d>.parquet

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_TAG = re.compile(r"[^\s,/\x00-\x1f\x7f-\x9f]{1,200}")  # a histogram's metric or class: an hlog tag's part
DTYPES = {"u1": 1, "u2": 2, "u4": 4, "u8": 8}  # how wire.py narrows a histogram's indices and counts


class InvalidMessage(ValueError):
    """A message from a node that cannot be used; the text says what is wrong with it."""


def printable(text: str, limit: int = MAX_NAME, lines: bool = False) -> str:
    """`text` safe to print: each control character (ESC and the rest of C0, DEL, C1, and the
    bidirectional overrides) written as its escape (`\\x1b`), newlines and tabs kept only with
    `lines`, cut to `limit` characters. The one helper for every string a node supplies."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    out = pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text[: limit + 1])
    return out if len(out) <= limit else out[: limit - 1] + "…"


# -- checks of one value ------------------------------------------------------------------------

def _mapping(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidMessage(f"{what} is not a mapping (a {type(value).__name__})")
    return value


def _int(value: object, what: str, lo: int = 0, hi: int = INT63 - 1) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise InvalidMessage(f"{what} is {_shown(value)}, not an integer in [{lo}, {hi}]")
    return value


def _number(value: object, what: str, lo: float, hi: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidMessage(f"{what} is {_shown(value)}, not a number in [{lo:g}, {hi:g}]")
    return value


def _str(value: object, what: str, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"{what} is {_shown(value)}, not a string")
    if len(value) > limit:
        raise InvalidMessage(f"{what} is {len(value):,} characters long (at most {limit:,})")
    return value


def _list(value: object, what: str, limit: int, length: int | None = None) -> list:
    if not isinstance(value, list) or len(value) > limit or (length is not None and len(value) != length):
        size = f"of {length}" if length is not None else f"of at most {limit:,}"
        raise InvalidMessage(f"{what} is {_shown(value)}, not a list {size}")
    return value


def _shown(value: object) -> str:
    plain = isinstance(value, (int, float, str, type(None), bool))
    return printable(repr(value), 60) if plain else f"a {type(value).__name__}"


# -- the relay's: a worker's hello and clock answers ------------------------------------------

def hello(data: object) -> dict:
    """A worker's hello, checked: this latscope and wire version (else the reason is the versions),
    a host name and 1 … MAX_ENGINES engines; strings made printable."""
    d = _mapping(data, "its hello")
    theirs, wire = d.get("latscope"), d.get("wire")
    if theirs != __version__ or wire != WIRE_VERSION:
        raise InvalidMessage(f"it runs latscope {printable(str(theirs), 60)} (wire {printable(str(wire), 20)}); "
                             f"the master runs latscope {__version__} (wire {WIRE_VERSION})")
    for name in ("host", "engines"):
        if name not in d:
            raise InvalidMessage(f"its hello has no {name!r}")
    engines = d["engines"]
    if type(engines) is not int or not 1 <= engines <= MAX_ENGINES:
        raise InvalidMessage(f"it claims {_shown(engines)} engines: a node runs 1 to {MAX_ENGINES} (one per core)")
    out = {"latscope": theirs, "wire": wire, "engines": engines,
           "host": printable(_str(d["host"], "its host name", 4 * MAX_NAME)) or "?"}
    if (cpus := d.get("cpus")) is not None:
        out["cpus"] = _int(cpus, "its CPU count", 1, 1 << 20)
    for name in ("python", "numpy", "locust"):
        if isinstance(d.get(name), str):
            out[name] = printable(d[name], 40)
    return out


def pong(data: object, asked: bool) -> tuple[int, int]:
    """A clock ping's answer: (t1 as the master sent it, t2 on the node's clock), nanoseconds;
    `asked`: the relay sent a ping with that t1 and had no answer to it yet (a forged t1 would
    fake a short round trip, and answers nobody asked for would pile up)."""
    d = _mapping(data, "a clock answer")
    t1, t2 = _int(d.get("t1"), "a clock answer's t1"), _int(d.get("t2"), "a clock answer's t2")
    if not asked:
        raise InvalidMessage(f"a clock answer to no ping of the master's (t1 {t1})")
    return t1, t2


# -- the coordinator's: frames from a node --------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """What a node's frames may say in this run (remote.py fills it from the plan and the scenario)."""

    requests: int  # rows of the plan
    classes: tuple[str, ...]  # the workload's class names
    max_interval: int  # the last interval a report may be for (the plan's, the target timeout and grace after)
    chunk: int  # bytes of a file chunk (wire.CHUNK): a fetch asks for one at a multiple of it
    counts_len: int  # counters of a latscope histogram: a histogram's index is below it
    counters: int  # len(results.schema.COUNTERS)
    turn_counters: int  # len(results.schema.TURN_COUNTERS)
    files: dict[str, int] = field(default_factory=dict)  # sha256 -> size of the files nodes may fetch


FIELDS = {"ready": (), "fetch": ("sha", "offset"), "started": ("late_ms",), "interval": ("k", "blob", "cpu"),
          "records": ("name", "offset", "size", "data"),
          "done": ("not_sent", "error_examples", "unaccounted", "records"), "failed": ("error",)}  # what each frame holds
KINDS = tuple(FIELDS)


def frame(f: object, limits: Limits) -> dict:
    """A node's frame, checked field by field (a node's error text made printable and cut)."""
    f = _mapping(f, "a frame")
    kind = f.get("t")
    if kind not in KINDS:
        raise InvalidMessage(f"a frame of type {_shown(kind)} (a node sends {', '.join(KINDS)})")
    if missing := [name for name in FIELDS[kind] if name not in f]:
        raise InvalidMessage(f"its {kind} frame has no {', '.join(missing)}")
    what = f"its {kind} frame's"
    if kind == "fetch":
        sha = _str(f.get("sha"), f"{what} sha", 64)
        if sha not in limits.files:
            raise InvalidMessage(f"{what} sha {printable(sha, 20)} is no file of the run")
        size = limits.files[sha]
        offset = _int(f.get("offset"), f"{what} offset", 0, max(size - 1, 0))
        if offset % limits.chunk:
            raise InvalidMessage(f"{what} offset {offset} is not at a chunk boundary ({limits.chunk} bytes)")
        return {"t": kind, "sha": sha, "offset": offset}
    if kind == "started":
        return {"t": kind, "late_ms": _number(f.get("late_ms"), f"{what} late_ms", -1e9, 1e9)}
    if kind == "interval":
        blob = f.get("blob")
        if not isinstance(blob, bytes) or len(blob) > MAX_INFLATED:
            size = f"{len(blob):,} bytes" if isinstance(blob, bytes) else _shown(blob)
            raise InvalidMessage(f"{what} blob is {size}, not a report of at most {MAX_INFLATED:,} bytes")
        cpu = f.get("cpu")
        return {"t": kind, "k": _int(f.get("k"), f"{what} k", 0, limits.max_interval), "blob": blob,
                "cpu": None if cpu is None else _number(cpu, f"{what} cpu", 0, 100.0 * MAX_ENGINES)}
    if kind == "done":
        examples = _mapping(f.get("error_examples"), f"{what} error_examples")
        if len(examples) > 64:
            raise InvalidMessage(f"{what} error_examples name {len(examples)} error kinds (there are a few)")
        kept = {}
        for k, v in examples.items():
            name = printable(_str(k, f"{what} error kind", 40))
            messages = [_str(m, f"{what} example of {name}", MAX_TEXT) for m in _list(v, f"{what} {name}", MAX_EXAMPLES)]
            kept[name] = [printable(m, 1000) for m in messages[:KEPT_EXAMPLES]]
        records = _mapping(f.get("records"), f"{what} records")
        return {"t": kind, "not_sent": _int(f.get("not_sent"), f"{what} not_sent", 0, limits.requests),
                "unaccounted": _int(f.get("unaccounted"), f"{what} unaccounted", 0, limits.requests),
                "error_examples": kept,
                "records": {"files": _int(records.get("files"), f"{what} records' files", 0, MAX_PART_FILES),
                            "bytes": _int(records.get("bytes"), f"{what} records' bytes")}}
    if kind == "records":
        name = _str(f.get("name"), f"{what} name", 40)
        if not (m := PART_NAME.fullmatch(name)) or name != f"w{int(m.group(1)):03d}-{int(m.group(2)):06d}.parquet":
            raise InvalidMessage(f"{what} name {_shown(name)} is not a part file's (w<engine>-<batch>.parquet)")
        data = f.get("data")
        if not isinstance(data, bytes) or not 1 <= len(data) <= limits.chunk:
            size = f"{len(data):,} bytes" if isinstance(data, bytes) else _shown(data)
            raise InvalidMessage(f"{what} data is {size}, not a chunk of 1 to {limits.chunk:,} bytes")
        size = _int(f.get("size"), f"{what} size", 1)
        offset = _int(f.get("offset"), f"{what} offset", 0, size - len(data))
        return {"t": kind, "name": name, "engine": int(m.group(1)), "offset": offset, "size": size, "data": data}
    if kind == "failed":
        error = f.get("error")
        if not isinstance(error, str):
            raise InvalidMessage(f"{what} error is {_shown(error)}, not a string")
        return {"t": kind, "error": printable(error, MAX_TEXT, lines=True)}
    return {"t": kind}


def records_budget(sent: int) -> int:
    """Bytes of part files a node that reported sending `sent` requests may ship (RECORDS_ROW_BYTES)."""
    return RECORDS_BASE_BYTES + RECORDS_ROW_BYTES * sent


def records_chunk(c: dict, engines: range, open_part: tuple[str, int, int] | None, received: int, sent: int) -> None:
    """A records chunk (`frame`'s checked map) in its place: a part file of one of the node's own
    `engines` (so no two nodes' names collide), its chunks in order, one file at a time (`open_part`:
    the name, size and bytes so far of the file under way, None between files), the node's total
    (`received` before it) within records_budget(`sent`)."""
    what = f"its records chunk of {c['name']}"
    if c["engine"] not in engines:
        raise InvalidMessage(f"{what} is engine {c['engine']}'s, not one of its engines {engines.start}…{engines.stop - 1}")
    if open_part is None and c["offset"] != 0:
        raise InvalidMessage(f"{what} starts at byte {c['offset']:,}, not 0")
    if open_part is not None and (c["name"], c["size"], c["offset"]) != open_part:
        raise InvalidMessage(f"{what} (byte {c['offset']:,} of {c['size']:,}) is not the next of "
                             f"{open_part[0]} (byte {open_part[2]:,} of {open_part[1]:,})")
    if received + c["size"] - c["offset"] > (budget := records_budget(sent)):
        raise InvalidMessage(f"its records would take more than {budget:,} bytes ({sent:,} requests sent)")


def inflate(blob: bytes, limit: int = MAX_INFLATED) -> bytes:
    """zlib data inflated, at most `limit` bytes of it: a payload that inflates past it (a zip bomb)
    is refused having used `limit` bytes, not what it would inflate to."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(blob, limit + 1)
    except zlib.error as exc:
        raise InvalidMessage(f"its report is not zlib data ({exc})") from None
    if len(out) > limit:
        raise InvalidMessage(f"its report inflates past {limit:,} bytes")
    if not d.eof:
        raise InvalidMessage("its report is cut short (the zlib stream does not end)")
    return out


def report_body(b: object, k: int, limits: Limits) -> dict:
    """An interval report's body (wire.encode_report's map), checked but for its arrays' values."""
    b = _mapping(b, "its report")
    missing = [key for key in "khcnfrpot" if key not in b]
    if missing:
        raise InvalidMessage(f"its report has no {', '.join(missing)}")
    if b["k"] != k:
        raise InvalidMessage(f"its report says interval {_shown(b['k'])}, its frame {k}")
    for h in _list(b["h"], "its histograms", MAX_HISTOGRAMS):
        metric, cls, warmup, idt, idx, cdt, cnt = _list(h, "a histogram", 7, 7)
        for name, value in (("metric", metric), ("class", cls)):
            if not isinstance(value, str) or not _TAG.fullmatch(value):
                raise InvalidMessage(f"a histogram's {name} is {_shown(value)}")
        if type(warmup) is not bool or not isinstance(idt, str) or not isinstance(cdt, str) or idt not in DTYPES \
                or cdt not in DTYPES:
            raise InvalidMessage(f"histogram {metric}/{cls}: warm-up or types are not wire.py's")
        if not isinstance(idx, bytes) or not isinstance(cnt, bytes) or len(idx) % DTYPES[idt] or len(cnt) % DTYPES[cdt] \
                or len(idx) // DTYPES[idt] != len(cnt) // DTYPES[cdt] or len(idx) // DTYPES[idt] > limits.counts_len:
            raise InvalidMessage(f"histogram {metric}/{cls}: its indices and counts do not pair up")
    for metric, n in _mapping(b["c"], "its clamped counts").items():
        _str(metric, "a clamped count's metric")
        _int(n, f"clamped count of {printable(metric)}")
    for row in _list(b["n"], "its counters", 2 * len(limits.classes)):
        ci, w, values = _list(row, "a counters row", 3, 3)
        _int(ci, "a counters row's class", 0, len(limits.classes) - 1)
        _counts(w, _list(values, "a counters row", limits.counters, limits.counters))
    _int(b["f"], "its requests in flight", 0, limits.requests)
    for name, first in _mapping(b["r"], "its replicas").items():
        _str(name, "a replica id")
        end, lat = _list(first, "a replica's first response", 2, 2)
        _int(end, "a replica's first response time", -INT63)
        if lat is not None:
            _int(lat, "a replica's first latency")
    for p in _list(b["p"], "its probes", limits.requests):
        seq, end, lat, error, replica = _list(p, "a probe", 5, 5)
        _int(seq, "a probe's row", 0, max(limits.requests - 1, 0))
        _int(end, "a probe's time", -INT63)
        _int(lat, "a probe's latency")
        if error is not None:
            _str(error, "a probe's error", 40)
        if replica is not None:
            _str(replica, "a probe's replica")
    if b["o"] is not None:
        end, lat = _list(b["o"], "its first response", 2, 2)
        _int(end, "its first response's time", -INT63), _int(lat, "its first response's latency")
    for row in _list(b["t"], "its turn counters", MAX_HISTOGRAMS):
        ci, turn, w, values = _list(row, "a turn counters row", 4, 4)
        _int(ci, "a turn counters row's class", 0, len(limits.classes) - 1)
        _int(turn, "a turn counters row's turn", 1, 1 << 31)
        _counts(w, _list(values, "a turn counters row", limits.turn_counters, limits.turn_counters))
    return b


def _counts(warmup: object, values: list) -> None:
    if type(warmup) is not bool:
        raise InvalidMessage(f"a counters row's warm-up flag is {_shown(warmup)}")
    for v in values:
        _int(v, "a counter", -(1 << 62), 1 << 62)


def sparse(metric: str, cls: str, indices, counts, counts_len: int) -> None:  # noqa: ANN001 - numpy arrays
    """A histogram's decoded counters: strictly increasing indices below `counts_len` (the deltas
    were positive), counts in [0, 2^62] (a u8 count past 2^63 wraps negative in int64)."""
    if len(indices) and (indices[0] < 0 or indices[-1] >= counts_len or (indices[1:] <= indices[:-1]).any()):
        raise InvalidMessage(f"histogram {metric}/{cls}: its indices are not increasing below {counts_len}")
    if len(counts) and (counts.min() < 0 or counts.max() > 1 << 62):
        raise InvalidMessage(f"histogram {metric}/{cls}: a count is out of range")
