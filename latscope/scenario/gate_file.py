"""The gate file (`latscope gate --slo slo.yaml`): absolute SLOs and the regression policy.

    slos:                       # optional; replaces the scenario's own `slos` when given
      - {metric: latency, class: all, stat: p99, limit_ms: 250}
      - {metric: ttft, stat: p95, limit_ms: 800}
      - {metric: ttfot, stat: p95, limit_ms: 3000}  # a reasoning model's answer: its first content token
      - {stat: error_rate, limit: 0.01}          # at most 1 % of answered requests fail
      - {stat: throughput, limit: 40}            # at least 40 req/s achieved (direction: min)
    regression:                 # used when a baseline is given
      tolerance: 0.10           # a percentile may grow by up to 10 % ...
      min_effect: 0.02          # ... and a failure needs the CI's lower bound above +2 %
      alpha: 0.02               # false-failure budget of the whole gate (A/A), split over the checks
      inconclusive_factor: 2    # inconclusive when a regression of 2× the tolerance cannot be ruled out
      checks:
        - {metric: latency, class: all, stat: p50}
        - {metric: latency, class: all, stat: p99, tolerance: 0.15}
    min_capacity_rps: 350       # a capacity directory (`latscope capacity`): its bracket's upper end
                                # must reach 350 req/s; with a baseline capacity directory, a bracket
                                # wholly below the baseline's is a regression
    fail_on_generator_tail: true  # fail (exit 4, invalid) when `latscope explain`'s top cause of the
                                # tail is the load generator itself: never blame the server for it
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from latscope.errors import ScenarioError
from latscope.scenario.load import parse_yaml
from latscope.scenario.settings import Slo

PERCENTILE_OF = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class RegressionCheck(_Model):
    """One percentile of one metric and class compared with the baseline."""

    metric: str = "latency"
    class_: str = Field("all", alias="class")
    stat: Literal["p50", "p90", "p95", "p99", "p99.9"]
    tolerance: float | None = Field(None, gt=0)  # overrides the policy's

    @property
    def percentile(self) -> float:
        return PERCENTILE_OF[self.stat]


class RegressionPolicy(_Model):
    """How much growth is allowed and how sure the gate must be before it fails the build."""

    tolerance: float = Field(0.10, gt=0)
    min_effect: float = Field(0.02, ge=0)
    alpha: float = Field(0.02, gt=0, lt=0.5)
    # inconclusive when the ratio's upper confidence bound is above 1 + inconclusive_factor × tolerance
    inconclusive_factor: float = Field(2.0, ge=1)
    checks: list[RegressionCheck] = Field(
        default_factory=lambda: [RegressionCheck(stat="p50"), RegressionCheck(stat="p99")], min_length=1
    )

    @model_validator(mode="after")
    def _effect_within_tolerance(self) -> RegressionPolicy:
        for c in self.checks:
            if self.min_effect >= (c.tolerance or self.tolerance):
                raise ValueError(f"min_effect ({self.min_effect:g}) must be smaller than the tolerance of {c.metric}/{c.class_} {c.stat}")
        return self


class GateFile(_Model):
    slos: list[Slo] | None = None
    regression: RegressionPolicy = RegressionPolicy()
    # For a capacity directory (`latscope capacity`): fail when the capacity found — the upper end of
    # its bracket, the lowest rate that failed — is below this many req/s.
    min_capacity_rps: float | None = Field(None, gt=0)
    # Fail when `latscope explain` finds that the load generator made the tail (its top cause,
    # standing out): the measurement is the client's, not the target's (analysis/explain.py).
    fail_on_generator_tail: bool = False


def load_gate_file(path: str | Path | None) -> GateFile:
    """The gate file at `path` (the defaults when None). ScenarioError naming the file and field."""
    if path is None:
        return GateFile()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the gate file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: the gate file is not UTF-8 text") from None
    # the scenario loader's parse: its bounds, and a 5,000-digit integer named by line, not a traceback
    data = parse_yaml(text, str(path)) or {}
    try:
        return GateFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ScenarioError(f"{path}: {problems}") from None
