"""Where a request's time goes: client encode, network, the server's Server-Timing parts, client
decode — as shares of latency, per class (and the protocol that class used)."""

from __future__ import annotations

import pandas as pd

from latscope.analysis.run_data import RunData


def breakdown(run: RunData) -> pd.DataFrame:
    """One row per class × part: class, protocol, part ("encode", "network", "server.<name>", ...,
    "decode", "other"), mean_ms, share (of mean latency; parts plus "other" sum to 1). Empty
    DataFrame (same columns) when the run recorded no encode/decode/server parts."""
    raise NotImplementedError
