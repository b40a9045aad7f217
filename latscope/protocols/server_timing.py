"""W3C Server-Timing header values (https://w3c.github.io/server-timing/), parsed for their durations.

    Server-Timing: queue;dur=0.120, compute;dur=3.5;desc="batch of 4", cache;desc=hit

gives {"queue": 0.12, "compute": 3.5}: entries without a numeric `dur` (cache above) say nothing about
time and are skipped. Names are the header's tokens, which never hold ',', ';', '/', '=' or spaces, so
they are safe as metric names (`server.queue`). A repeated name keeps its first duration, as the spec
asks. Anything that does not parse ends the parsing: what came before it is kept.
"""

from __future__ import annotations

import math
import re

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_PARAM = re.compile(rf"\s*;\s*({_TOKEN})(?:\s*=\s*({_TOKEN}|{_QUOTED}))?")
_NAME = re.compile(rf"\s*({_TOKEN})")
_SEPARATOR = re.compile(r"\s*(,|$)")


def parse_server_timing(value: str) -> dict[str, float]:
    """{name: duration in ms} for the entries of a Server-Timing value that have a `dur`."""
    out: dict[str, float] = {}
    pos, end = 0, len(value)
    while pos < end:
        name = _NAME.match(value, pos)
        if name is None:
            break
        pos, dur = name.end(), None
        while (param := _PARAM.match(value, pos)) is not None:
            pos = param.end()
            if param[1].lower() == "dur" and dur is None and param[2] is not None:
                try:
                    dur = float(param[2].strip('"'))
                except ValueError:
                    pass
        separator = _SEPARATOR.match(value, pos)
        if separator is None:
            break
        pos = separator.end()
        if dur is not None and math.isfinite(dur) and dur >= 0 and name[1] not in out:
            out[name[1]] = dur
        if not separator[1]:
            break
    return out
