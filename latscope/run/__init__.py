"""The parent process of one run: everything between a scenario and its results directory.

| module | holds |
| --- | --- |
| orchestrator.py | `run_scenario`: launch -> workers -> collect -> abort -> teardown, and the live `Progress` |
| collector.py | merging the workers' interval reports: histograms, counters, time-series rows, the interval log |
| summary.py | the one writer of summary.json and timeseries.parquet (`RunFacts` -> files), at the end |
| parts.py | `RunPart`: the hooks that telemetry, actions and live metrics plug in at |
| actions.py | scenario actions (commands, HTTP calls, target restarts) at their times |
| live.py | live Prometheus metrics during the run |
| launch.py | starting and stopping a target the scenario launches |

The workers themselves (engine.py, intervals.py) send and record; this package never sends a request.
"""

from latscope.run.orchestrator import Progress, RunResult, run_scenario

__all__ = ["Progress", "RunResult", "run_scenario"]
