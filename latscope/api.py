"""latscope from Python: open a results directory as plain dicts and pandas DataFrames, run a
scenario, search for capacity. `latscope run`, `report`, `gate` and `capacity` are built on these
functions, so a notebook gets exactly what the command line gets (docs/python-api.md).

    open_results(path)        -> Results (a run's directory) or Capacity (a capacity search's)
    run_scenario(scenario)    -> Results     a file, a dict or a Scenario; writes a results directory
    find_capacity(scenario)   -> Capacity    the capacity search; writes a capacity directory
    load_scenario(scenario)   -> Scenario    checked as `latscope validate` checks it

Opening is cheap: only summary.json (or capacity.json) is read and checked at once; every other file
is read on first use, and a file a run did not write gives an empty frame or None, never an
exception. The names avoid latscope's subpackages (`latscope.run`, `latscope.capacity`): an imported
subpackage would shadow a function of the same name on the package. Reading needs nothing from the
measuring side; running imports it only when called.
"""

from __future__ import annotations

import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pandas as pd

from latscope import results
from latscope.analysis.capacity_gate import capacity_gate, is_capacity_dir, read_capacity
from latscope.analysis.gate import GateResult, gate as evaluate_gate
from latscope.analysis.percentiles import percentile_ms
from latscope.analysis.run_data import RunData, load_run, optional_table, read_summary
from latscope.errors import RunError, ScenarioError
from latscope.results.reading import read_scenario
from latscope.results.schema import ROW_STATS
from latscope.scenario import Scenario, load_scenario as load_scenario_file, scenario_from_dict
from latscope.scenario.gate_file import GateFile, load_gate_file

if TYPE_CHECKING:
    from latscope.capacity import StepStart
    from latscope.interrupt import StopRequest
    from latscope.run import Progress
    from latscope.run.pool import Pool

__all__ = ["Capacity", "Results", "find_capacity", "load_scenario", "open_results", "run_scenario"]

class Results:
    """One results directory of `latscope run`, read-only. Use `open_results` or `run_scenario`."""

    def __init__(self, path: str | Path, summary: dict) -> None:
        self.path = Path(path)
        self.summary: dict = summary  # summary.json as written (results/schema.py names its parts)

    def __repr__(self) -> str:
        sent = self.summary.get("requests", {}).get("sent", 0)
        partial = ", partial" if self.partial else ""
        return f"Results({str(self.path)!r}: {self.validity}{partial}, {sent:,} requests sent)"

    @property
    def partial(self) -> bool:
        """The run was cut short (summary.json `abort_reason` says why); what it measured is kept."""
        return bool(self.summary.get("partial"))

    @property
    def validity(self) -> str:
        """"valid", "degraded" or "invalid": whether the generator kept its schedule (the reasons
        are `summary["validity_reasons"]`)."""
        return self.summary.get("validity", "valid")

    @cached_property
    def _run(self) -> RunData:
        return load_run(self.path, self.summary)

    @cached_property
    def scenario(self) -> dict:
        """scenario.yaml: the scenario as it ran (overrides applied, secrets redacted); {} without one;
        ResultsError naming it when it is not a YAML mapping."""
        return read_scenario(self.path)

    @cached_property
    def percentiles(self) -> pd.DataFrame:
        """One row per metric × class of summary.json (warm-up excluded): metric, class, count, min_ms,
        mean_ms, p50_ms, p90_ms, p95_ms, p99_ms, p99.9_ms, max_ms (NaN where a class recorded none)."""
        rows = [{"metric": metric, "class": cls, **row} for metric, by_class in self.summary.get("metrics", {}).items()
                for cls, row in by_class.items()]
        frame = pd.DataFrame(rows, columns=["metric", "class", *ROW_STATS])
        return frame.astype({"count": "int64", **{s: "float64" for s in ROW_STATS[1:]}})

    def percentile(self, metric: str = "latency", q: float = 99.0, cls: str = "all") -> float:
        """The q-th percentile (0–100) of `metric` for class `cls`, in ms, from the histograms: any q
        (p99.99, p75). Warm-up intervals are left out whole, as in the report; without a warm-up
        phase it equals the summary's at its own points. NaN when the class recorded nothing;
        ValueError naming what there is for a metric or class the run does not have."""
        metrics = self.summary.get("metrics", {})
        if metric not in metrics:
            raise ValueError(f"{self.path}: no metric {metric!r}; it has {', '.join(metrics) or 'none'}")
        if cls not in metrics[metric]:
            raise ValueError(f"{self.path}: {metric} has no class {cls!r}; it has {', '.join(metrics[metric])}")
        if not 0 <= q <= 100:
            raise ValueError(f"q={q!r}: a percentile is between 0 and 100")
        return percentile_ms(self._run, metric, q, cls)

    @property
    def timeseries(self) -> pd.DataFrame:
        """timeseries.parquet: one row per interval × metric × class (TIMESERIES_COLUMNS), warm-up
        included (its `phase` says which); empty without the file (a saved baseline)."""
        return self._run.timeseries

    @property
    def telemetry(self) -> pd.DataFrame:
        """telemetry.parquet: one row per sample (t_s, source, device, metric, value); empty without."""
        return self._run.telemetry

    @property
    def events(self) -> list[dict]:
        """events.jsonl: one dict per event (`event`, `t_s` on the run's clock, its fields); [] without."""
        return self._run.events

    @property
    def nodes(self) -> pd.DataFrame:
        """nodes.parquet: a distributed run's machines, one row per interval per node; empty for a run
        on one machine."""
        return self._run.nodes

    @cached_property
    def schedule(self) -> pd.DataFrame | None:
        """schedule.parquet: one row per planned request (row i is the request whose X-Request-Id says i: request_ids.request_row): intended_s, phase,
        class, lengths; None when the run did not save it (output.save_schedule: false)."""
        return optional_table(self.path / results.SCHEDULE)

    @cached_property
    def requests(self) -> pd.DataFrame | None:
        """requests.parquet, the per-request records (results.schema.REQUEST_COLUMNS: one row per request
        sent, warm-up flagged); None for a run with `output.requests: off` or written before them.
        Nullable integer columns with nulls come as float64 (NaN); read the file with pyarrow for exact ints."""
        return optional_table(self.path / results.REQUESTS)

    def report(self, out: str | Path | None = None, cdn: bool = False) -> tuple[Path, Path]:
        """Write the HTML report (default PATH/report.html) and its Markdown summary next to it
        (PATH/summary.md, or OUT with the suffix .md), as `latscope report`; (html, markdown).
        cdn: load plotly.js from its CDN instead of embedding it."""
        from latscope.report import write_report

        return write_report(self.path, out, cdn=cdn)

    def gate(self, baseline: str | Path | Results | None = None, slo: str | Path | GateFile | None = None) -> GateResult:
        """The CI gate, as `latscope gate`: validity, SLOs (the scenario's, or a gate file's), and
        p50/p99 regressions against `baseline` (a results directory or a saved baseline).
        `.outcome` is "pass", "slo_breach", "regression", "inconclusive" or "invalid"; `.checks` say why."""
        base = baseline.path if isinstance(baseline, Results) else baseline
        return evaluate_gate(self.path, base, _gate_file(slo))

    def explain(self, metric: str | None = None, quantile: float = 0.99) -> dict:
        """Why the tail is what it is, as `latscope explain` (explain.json's document, not written):
        the requests above `quantile` of `metric` (default ttft for streams, else latency) against
        the middle half, ranked causes with effect and evidence; `["verdict"]` is "cause",
        "nothing_stands_out" or "not_enough_data". ResultsError without requests.parquet."""
        from latscope.analysis.explain import explain
        from latscope.analysis.explain_data import read_records

        return explain(self._run, read_records(self.path), metric, quantile)


class Capacity:
    """One capacity directory of `latscope capacity`, read-only. Use `open_results` or `find_capacity`."""

    def __init__(self, path: str | Path, document: dict) -> None:
        self.path = Path(path)
        self.document: dict = document  # capacity.json as written

    def __repr__(self) -> str:
        return f"Capacity({str(self.path)!r}: {self.message})"

    @property
    def capacity_rps(self) -> float | None:
        """The highest rate at which every SLO held with confidence, req/s (the bracket's low end);
        None when the search found none (`stopped` and `message` say why)."""
        return self.document.get("max_rate_rps")

    @property
    def bracket(self) -> tuple[float | None, float | None]:
        """(low, high): the SLOs held at low and failed at high; high is None when they held up to --max-rate."""
        b = self.document.get("bracket") or {}
        return b.get("low_rps"), b.get("high_rps")

    @property
    def stopped(self) -> str | None:
        """Why the search stopped: "precision", "max_rate", "slo_fails_at_lowest_rate", "generator_limit", ..."""
        return self.document.get("stopped")

    @property
    def message(self) -> str:
        """The answer in words, as `latscope capacity` prints it."""
        return self.document.get("message", "")

    @property
    def exit_code(self) -> int:
        """`latscope capacity`'s exit code: 0 found, 1 the SLOs fail at the lowest rate, 4 no answer."""
        return self.document.get("exit_code", 4)

    @cached_property
    def steps(self) -> list[Results]:
        """Each step's results directory, in the order they ran (a step whose run could not start and
        left no directory is left out: capacity.json's `steps` still lists it)."""
        found = []
        for step in self.document.get("steps", []):
            path = self.path / step["dir"]
            if (path / results.SUMMARY).is_file():
                found.append(Results(path, read_summary(path)))
        return found

    @cached_property
    def step_table(self) -> pd.DataFrame:
        """One row per step of capacity.json, its plain fields: index, dir, rate_rps, duration_s,
        longer, offered_rps, achieved_rps, validity, verdict, counted_as, note, ..."""
        steps = self.document.get("steps", [])
        return pd.DataFrame([{k: v for k, v in s.items() if not isinstance(v, (dict, list))} for s in steps])

    def report(self, cdn: bool = False) -> Path:
        """Write PATH/capacity.html (next to the steps it links to), as `latscope report`; its path."""
        from latscope.report import write_capacity_page

        return write_capacity_page(self.path, cdn=cdn)

    def gate(self, baseline: str | Path | Capacity | None = None, slo: str | Path | GateFile | None = None) -> GateResult:
        """The gate over the search's answer, as `latscope gate`: a gate file's min_capacity_rps, and
        a regression only when the bracket is wholly below a `baseline` capacity directory's."""
        base = baseline.path if isinstance(baseline, Capacity) else baseline
        return capacity_gate(self.path, base, _gate_file(slo))


def _gate_file(slo: str | Path | GateFile | None) -> GateFile:
    return slo if isinstance(slo, GateFile) else load_gate_file(slo)


def open_results(path: str | Path) -> Results | Capacity:
    """The results directory at `path`: a Results for a run's, a Capacity for a capacity search's
    (it holds capacity.json). Reads summary.json (capacity.json) only; ResultsError naming the
    directory when it is neither, or its summary is unreadable or from a newer latscope."""
    path = Path(path)
    if is_capacity_dir(path):
        return Capacity(path, read_capacity(path))
    return Results(path, read_summary(path))


def load_scenario(scenario: str | Path | Mapping[str, Any] | Scenario, overrides: Sequence[str] = ()) -> Scenario:
    """A checked Scenario from a file's path, a dict (as the YAML would parse) or a Scenario (as is).
    `overrides` are `--set` ones ("phases.0.arrival.rate=50"), for a file or a dict. ScenarioError,
    a line per problem (the file's line, or the override, and the field), as `latscope validate`."""
    if isinstance(overrides, str):
        overrides = (overrides,)
    if isinstance(scenario, Scenario):
        if overrides:
            raise ScenarioError("overrides apply to a scenario file or dict; a Scenario is already built "
                                "(copy it with scenario.model_copy(update=...) instead)")
        return scenario
    if isinstance(scenario, Mapping):
        return scenario_from_dict(dict(scenario), overrides=overrides)
    return load_scenario_file(scenario, overrides)


def run_scenario(scenario: str | Path | Mapping[str, Any] | Scenario, *, overrides: Sequence[str] = (),
                 out: str | Path | None = None, workers: int | None = None,
                 on_progress: Callable[[Progress], None] | None = None, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1", stop: StopRequest | None = None,
                 make_pool: Callable[..., Pool] | None = None) -> Results:
    """Run a scenario (see load_scenario) and open its results directory, as `latscope run`: `out`
    (default output.dir/<name>-<UTC time>), `workers` processes (default: one per core), live
    Prometheus metrics on `metrics_port`. `on_progress` gets a latscope.run.Progress after each
    reporting interval (output.interval). Ctrl-C during the run stops it in order: the Results is
    then `partial`. ScenarioError for a bad scenario, RunError when the run could not start. `stop`
    and `make_pool` are the command line's (its signal handler; a distributed run's senders)."""
    from latscope.run import run_scenario as run

    _not_in_a_worker("run_scenario")
    result = run(load_scenario(scenario, overrides), out=out, workers=workers, on_progress=on_progress,
                 metrics_port=metrics_port, metrics_host=metrics_host, stop=stop, make_pool=make_pool)
    return Results(result.run_dir, result.summary)


def find_capacity(scenario: str | Path | Mapping[str, Any] | Scenario, *, overrides: Sequence[str] = (),
                  out: str | Path | None = None, on_step: Callable[[StepStart | dict], None] | None = None,
                  on_progress: Callable[[Progress], None] | None = None, **options: Any) -> Capacity:
    """The capacity search, as `latscope capacity`: the highest rate at which every SLO of the
    scenario holds with confidence. `options` are latscope.capacity.CapacityOptions' fields:
    precision, min_rate, max_rate, max_steps, step_duration_s, confidence, price_per_hour, workers.
    Writes `out` (default output.dir/<name>-capacity-<UTC time>): capacity.json, capacity.html and
    steps/. `on_step` gets a StepStart before each step and its record after it."""
    from latscope.capacity import CapacityOptions, find_capacity as search

    _not_in_a_worker("find_capacity")
    loaded = load_scenario(scenario, overrides)
    knobs = CapacityOptions(**options)
    path = results.create_run_dir(loaded.output.dir, f"{loaded.name}-capacity", time.time(), out)
    return Capacity(path, search(loaded, path, knobs, on_step=on_step, on_progress=on_progress))


def _not_in_a_worker(name: str) -> None:
    """A script that runs latscope at its top level runs it again in every worker: multiprocessing's
    spawn imports the main script in each new process. Say so there, instead of the bare "worker 0
    exited unexpectedly" the run would report."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RunError(f"latscope.{name} was called while a worker process was importing the main script "
                       "(latscope starts its workers with multiprocessing's spawn, which imports it again): "
                       'put the call under `if __name__ == "__main__":`')
