"""requests.parquet, a run part: the workers' part files merged into one file when the run is written.

The workers write their rows (latscope/request_log.py) under `<run_dir>/.requests/` while the run
lasts; `write(run_dir)` runs after the pool is closed (run/orchestrator.py `_Run.close`), so every
worker that stopped normally has written its last part, an interrupted run's included. The merge is
results/requests.py `merge_parts`; summary.json's `request_records` comes from `summary()`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from latscope import results
from latscope.plan import Plan
from latscope.request_log import sample_fraction
from latscope.results.requests import merge_parts
from latscope.results.schema import REQUEST_PARTS, REQUESTS
from latscope.run.parts import RunPart
from latscope.scenario import Scenario


def requests_dir(run_dir: Path, scenario: Scenario, plan: Plan) -> str | None:
    """Where the workers write their part files, None when output.requests is off."""
    return str(run_dir / REQUEST_PARTS) if sample_fraction(scenario, plan) > 0 else None


class RequestRecords(RunPart):
    """Merges the part files into requests.parquet at the end (the module docstring)."""

    def __init__(self, scenario: Scenario, plan: Plan):
        self.fraction = sample_fraction(scenario, plan)
        setting = scenario.output.requests
        self.max_rows = getattr(setting, "max_rows", None)
        self.rows: int | None = None
        # a distributed run's engines -> their machines (the `node` column); None: a local run
        self.node_of_worker: dict[int, str] | None = None

    def write(self, run_dir: Path) -> None:
        """Merge the parts; a merge that fails (a full disk) is a warning, never the run's other files
        lost: the parts stay in `.requests/` and summary.json's request_records is null."""
        try:
            self.rows = merge_parts(run_dir / REQUEST_PARTS, run_dir / REQUESTS, self.node_of_worker)
        except Exception as exc:  # noqa: BLE001 - the rest of the results directory must still be written
            logging.getLogger("latscope.run").warning(
                "requests.parquet not written (%s: %s); the workers' part files are kept in %s",
                type(exc).__name__, exc, run_dir / REQUEST_PARTS)

    def summary(self) -> dict | None:
        """summary.json's `request_records` (None: records were off)."""
        if self.rows is None:
            return None
        return {"file": results.REQUESTS, "rows": self.rows, "sampled": self.fraction < 1.0,
                "fraction": round(self.fraction, 9), "max_rows": self.max_rows}
