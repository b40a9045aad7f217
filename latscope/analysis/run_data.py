"""A results directory, loaded once for analysis: summary, events, time series, telemetry.

Histograms are not loaded here (a long run holds tens of thousands of intervals): the functions
that need them read only the metrics they use, with `results.read_intervals`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

TELEMETRY_COLUMNS = ("t_s", "source", "device", "metric", "value")


@dataclass
class RunData:
    path: Path
    summary: dict
    events: list[dict]
    timeseries: pd.DataFrame  # timeseries.parquet as written (interval_start_s is on the run's clock)
    telemetry: pd.DataFrame  # telemetry.parquet, TELEMETRY_COLUMNS; empty (same columns) when the run has none

    @property
    def warmup_phases(self) -> set[str]:
        return {p["name"] for p in self.summary.get("phases", []) if p.get("warmup")}


def load_run(path: str | Path) -> RunData:
    """Everything but the histograms of the results directory at `path`. ResultsError (a
    LatscopeError) naming the directory and the file when it is not a results directory or a file
    is unreadable; a missing optional file (telemetry.parquet, events.jsonl) gives an empty one."""
    raise NotImplementedError
