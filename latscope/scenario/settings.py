"""The sections that say how a run is carried out and judged: `limits:` (the generator's caps and
timer), `slos:` (pass/fail objectives), `output:` (where results go) and `validity:` (how late the
generator may be before a run is stamped degraded or invalid)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from latscope.scenario.base import Duration, Model


class Limits(Model):
    """Caps on the generator, and how it keeps time. Past `max_in_flight`, requests wait for a slot
    ("queue") or are dropped. `timer: precise` sends within microseconds of the schedule at the cost
    of up to 1 ms of CPU per request; `coarse` uses event-loop timers only (about 1 ms late at p99,
    no CPU while idle): pick it when the generator shares a small machine with the target."""

    max_in_flight: int = Field(10000, ge=1)
    max_requests: int | None = Field(None, ge=1)
    overflow: Literal["queue", "drop"] = "queue"
    timer: Literal["precise", "coarse"] = "precise"


SLO_RUN_STATS = ("error_rate", "throughput")  # of the whole run, not of a metric


class Slo(Model):
    """A pass/fail objective on one statistic of one metric and class, e.g. latency p99 <= 100 ms.

    Time statistics take `limit_ms`; `error_rate` (errors / answered requests, 0..1) and
    `throughput` (achieved req/s) take `limit`. `direction: max` means the value must stay at or
    under the limit, `min` at or over it; the default is `min` for throughput, `max` otherwise."""

    model_config = ConfigDict(populate_by_name=True)

    metric: str = "latency"
    class_: str = Field("all", alias="class")  # "class" is a Python keyword
    stat: Literal["p50", "p90", "p95", "p99", "p99.9", "max", "mean", "error_rate", "throughput"]
    limit_ms: float | None = Field(None, gt=0)
    limit: float | None = Field(None, ge=0)
    direction: Literal["max", "min"] | None = None

    @model_validator(mode="after")
    def _limit_fits_stat(self) -> Slo:
        if self.stat in SLO_RUN_STATS:
            if self.limit is None or self.limit_ms is not None:
                raise ValueError(f"stat {self.stat} takes `limit` ({'a fraction 0..1' if self.stat == 'error_rate' else 'req/s'}), not limit_ms")
            if self.stat == "error_rate" and self.limit > 1:
                raise ValueError("an error_rate limit is a fraction between 0 and 1")
        elif self.limit_ms is None or self.limit is not None:
            raise ValueError(f"stat {self.stat} takes `limit_ms`")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_limits(self, handler: Any) -> dict:
        # A resolved scenario.yaml shows the SLO as written: no `limit: null` next to limit_ms.
        return {k: v for k, v in handler(self).items() if v is not None or k not in ("limit_ms", "limit", "direction")}

    @property
    def bound(self) -> Literal["max", "min"]:
        """`max`: the value must stay at or under the limit; `min`: at or over it."""
        return self.direction or ("min" if self.stat == "throughput" else "max")

    @property
    def threshold(self) -> float:
        """The limit in the statistic's own unit (ms, fraction, req/s)."""
        return self.limit if self.stat in SLO_RUN_STATS else self.limit_ms  # type: ignore[return-value]


class Output(Model):
    """Where results go and how often interval statistics are taken."""

    dir: str = "results"
    interval: Annotated[Duration, Field(ge=0.1)] = 1.0
    save_schedule: bool = True
    report: bool = True  # report.html + summary.md at the end (`latscope report` can write them later)


class Validity(Model):
    """Thresholds (ms, p99) on the generator's own lateness that stamp a run degraded or invalid."""

    # validate_default: a default invalid_* must also be checked against a raised degraded_*.
    degraded_send_lag_p99_ms: float = Field(1.0, gt=0)
    invalid_send_lag_p99_ms: float = Field(10.0, gt=0, validate_default=True)
    degraded_loop_lag_p99_ms: float = Field(5.0, gt=0)
    invalid_loop_lag_p99_ms: float = Field(50.0, gt=0, validate_default=True)

    @field_validator("invalid_send_lag_p99_ms", "invalid_loop_lag_p99_ms")
    @classmethod
    def _not_below_degraded(cls, value: float, info: ValidationInfo) -> float:
        degraded_name = info.field_name.replace("invalid_", "degraded_")
        degraded = info.data.get(degraded_name)
        if degraded is not None and value < degraded:
            raise ValueError(f"must be at least {degraded_name} ({degraded:g})")
        return value
