"""Request ids (`target.request_id_header`): each request's row in the plan, as a UUID.

Servers that read a request-id header often accept only a UUID there (llama.cpp's server answers
HTTP 400 to anything else), so the id latscope sends is one, version-4-shaped, that still says which
request it was:

    RRRRRRRR-RRRR-4RRR-8000-SSSSSSSSSSSS

- R (60 bits, with the version nibble 4 between them): the run's tag, from its prompt salt (the seed
  alone with `prompt_salt: none`), so ids from different runs differ and every request of one run
  shares them;
- 8000: the RFC 4122 variant bits (10) and 14 zero bits;
- S (48 bits, 12 hex digits): the request's `seq`, its row in schedule.parquet (sessions' later
  turns included).

`request_row` decodes an id back to its row (what a server's logs or a packet capture are matched
by), `request_run` to its run's part. This module imports nothing from latscope: the measuring side
writes ids, the analysis reads them.
"""

from __future__ import annotations

import re

ROW_BITS = 48
MAX_ROW = (1 << ROW_BITS) - 1
_MASK64 = (1 << 64) - 1
_ID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8000-)([0-9a-f]{12})")


def run_tag(key: int) -> int:
    """The 60 bits of a run's ids, from a 64-bit key (workload.text_seed): splitmix64's finalizer,
    so that nearby keys (seeds 1, 2, 3) give unrelated tags."""
    z = (key + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 4


def id_prefix(tag: int) -> str:
    """Every id of a run up to its row: "RRRRRRRR-RRRR-4RRR-8000-"."""
    hi, lo = tag >> 12, tag & 0xFFF
    return f"{hi >> 16:08x}-{hi & 0xFFFF:04x}-4{lo:03x}-8000-"


def request_id(tag: int, seq: int) -> str:
    """The id of request `seq` (0 <= seq <= MAX_ROW) of the run whose tag is `tag`."""
    if not 0 <= seq <= MAX_ROW:
        raise ValueError(f"request row {seq} does not fit {ROW_BITS} bits")
    return f"{id_prefix(tag)}{seq:012x}"


def request_row(value: str) -> int | None:
    """The schedule row a request id encodes; None for a string that is not such an id."""
    match = _ID.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    return int(match.group(2), 16) if match else None


def request_run(value: str) -> str | None:
    """The run's part of a request id ("RRRRRRRR-RRRR-4RRR-8000-"); None for a string that is not one."""
    match = _ID.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    return match.group(1) if match else None
