"""One step of a capacity search: its looks run, pooled and judged; a step's record in capacity.json.

A step is a rate. Its first look is one run of the scaled scenario, `T` measured seconds long; when
every SLO cannot be told from its limit, the step is EXTENDED — another run at the same rate (its
own directory, `steps/NNN-<rate>-ext1`, with its own seed, so its arrivals are new evidence, not a
replay), +T, then +2T — and judged again on the pooled measured intervals of all its runs
(analysis/slo_confidence.py `pool`):

    look 1:  T           look 2:  T + T = 2T           look 3:  2T + 2T = 4T   (pooled seconds)

each look at the level 1 − (1 − confidence)/3, so that the whole sequence of looks is wrong (a pass
or a fail that is not so) with probability at most (1 − confidence)/2 per SLO side (the union bound;
slo_confidence.py says it in full). Still undecided after look 3, the rate joins the undecided band:
never a pass, never a fail (search.py).

A step is also where a dead target shows: every request of its last intervals failed to connect
(`target_down`) is the target's state, not a latency or error-rate measurement of its capacity.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from latscope import results
from latscope.analysis.run_data import optional_table
from latscope.analysis.slo_confidence import (FAIL, LOOKS, PASS, UNDECIDED, curve_keys, curve_points, curve_stats, load,
                                             look_confidence, pool, slo_intervals)
from latscope.capacity.search import decide_seconds
from latscope.capacity.shape import scaled
from latscope.errors import RunError
from latscope.interrupt import StopRequest
from latscope.results.schema import STEPS_DIR, TIMESERIES
from latscope.run import Progress, run_scenario
from latscope.scenario import Scenario
from latscope.scenario.schema import MAX_SEED

MIN_INTERVALS = 20
LOOK_SECONDS = (1.0, 1.0, 2.0)  # each look's own run, in step lengths T: pooled T, 2T, 4T
SEED_STRIDE = 7919  # look k runs with seed + (k − 1)·SEED_STRIDE: new arrivals, still reproducible
DOWN_TAIL = 0.25  # the share of a step's last intervals in which no answer at all means the target is down


def look_name(index: int, rate: float, look: int) -> str:
    """A look's directory under steps/: "004-350", its extensions "004-350-ext1", "004-350-ext2"."""
    return f"{index:03d}-{rate:.6g}" + (f"-ext{look - 1}" if look > 1 else "")


def run_look(scenario: Scenario, base_rate: float, out: Path, index: int, rate: float, look: int, seconds: float,
             workers: int | None, stop: StopRequest | None,
             on_progress: Callable[[Progress], None] | None) -> tuple[dict, dict | None]:
    """Run one look of the step `index` at `rate`, `seconds` measured: its record's plain fields,
    and its summary (None when its run could not start: a RunError's message is the record's note)."""
    name = look_name(index, rate, look)
    factor = rate / base_rate
    step_scenario = scaled(scenario, factor, seconds)
    step_scenario.seed = (scenario.seed + (look - 1) * SEED_STRIDE) % (MAX_SEED + 1)
    # At least MIN_INTERVALS reporting intervals per run: the tail's confidence interval resamples
    # whole intervals (quantile_ci's block bootstrap), and four of them would leave it wide open.
    step_scenario.output.interval = max(0.1, min(step_scenario.output.interval, seconds / MIN_INTERVALS))
    run_dir = out / STEPS_DIR / name
    record = {"index": index, "dir": f"{STEPS_DIR}/{name}", "rate_rps": rate, "factor": round(factor, 6),
              "duration_s": round(seconds, 3), "look": look, "looks": LOOKS, "longer": look > 1}
    try:
        summary = run_scenario(step_scenario, out=run_dir, workers=workers, on_progress=on_progress, stop=stop).summary
    except RunError as exc:
        return {**record, "verdict": "partial", "counted_as": None, "note": str(exc)}, None
    tokens = summary.get("tokens", {}).get("all", {})
    record.update({
        "offered_rps": summary["throughput"]["offered_rps"],
        "achieved_rps": summary["throughput"]["achieved_rps"],
        "validity": summary["validity"],
        "validity_reasons": summary["validity_reasons"],
        "partial": summary["partial"],
        "requests": {k: summary["requests"][k] for k in ("sent", "completed", "errors", "dropped", "late")},
        "errors": dict(summary.get("errors") or {}),
        "goodput": (summary.get("goodput") or {}).get("all"),
        "output_tokens_per_s": tokens.get("output_tokens_per_s"),
        "report": f"{STEPS_DIR}/{name}/{results.REPORT}" if (run_dir / results.REPORT).exists() else None,
        "counted_as": None, "note": summary["abort_reason"] or "",  # "interrupted by SIGINT", "target ..."
    })
    return record, summary


def judge_look(record: dict, dirs: list[Path], scenario: Scenario, confidence: float, measured_s: float) -> None:
    """Judge a look on the pooled runs of `dirs` (this step's looks so far, this one last) at the
    look level; fill the record's `slos`, `percentiles`, `pooled_s` and `verdict`. A look whose
    generator was not valid is `invalid` (its run is not pooled: runner.py stops there)."""
    slos = scenario.slos
    level = look_confidence(confidence)
    run = pool([load(d, slos) for d in dirs])
    judged = slo_intervals(run, slos, level)
    record["pooled_s"] = round(measured_s, 3)
    record["confidence"] = round(level, 6)
    record["slos"] = [{"name": j.name, "value": _round(j.value), "low": _round(j.low), "high": _round(j.high),
                       "limit": j.limit, "bound": j.bound, "unit": j.unit, "verdict": j.verdict,
                       **({"decide_s": _round(decide_seconds(measured_s, j.value, j.low, j.high, j.limit))}
                          if j.verdict == UNDECIDED else {})} for j in judged]
    record["percentiles"] = curve_points(run, curve_keys(slos), curve_stats(slos), level)
    verdicts = {j.verdict for j in judged}
    record["verdict"] = (FAIL if FAIL in verdicts else UNDECIDED if UNDECIDED in verdicts else PASS)


def decide_s(record: dict) -> float | None:
    """The measured seconds that would decide every undecided SLO of a look (the longest of them);
    None when one of them cannot be estimated (an interval open on the side facing the limit)."""
    needs = [s.get("decide_s") for s in record.get("slos", []) if s.get("verdict") == UNDECIDED]
    return None if not needs or any(n is None for n in needs) else max(needs)


def target_down(run_dir: Path) -> bool:
    """Whether the target stopped answering during this run: no request of its last DOWN_TAIL of
    intervals (at least 3 of them with requests that ended) completed, and some failed to connect."""
    table = optional_table(run_dir / TIMESERIES)
    if table is None or table.empty:
        return False
    rows = table[table["class"] == "all"].drop_duplicates("interval_start_s").sort_values("interval_start_s")
    ended = rows[(rows["completed"] + rows["errors"]) > 0]
    if ended.empty:
        return False
    tail = ended.tail(max(3, math.ceil(len(ended) * DOWN_TAIL)))
    return int(np.sum(tail["completed"])) == 0 and int(np.sum(tail["connect"])) > 0


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 6)
