"""The sections that say how a run is carried out and judged: `limits:` (the generator's caps and
timer), `slos:` (pass/fail objectives), `goodput:` (per-request objectives: how many requests were
good enough), `output:` (where results go) and `validity:` (how late the generator may be before a
run is stamped degraded or invalid)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from latscope.scenario.base import Duration, Model


class Limits(Model):
    """Caps on the generator, and how it keeps time. Past `max_in_flight`, requests wait for a slot
    ("queue") or are dropped. The `max_planned_requests`, `max_body_bytes` and `max_prompt_tokens`
    bounds make an absurd scenario an error (exit 2) rather than a run that runs out of memory. `timer: precise` sends within microseconds of the schedule at the cost
    of up to 1 ms of CPU per request; `coarse` uses event-loop timers only (about 1 ms late at p99,
    no CPU while idle): pick it when the generator shares a small machine with the target."""

    max_in_flight: int = Field(10000, ge=1)
    max_requests: int | None = Field(None, ge=1)
    overflow: Literal["queue", "drop"] = "queue"
    timer: Literal["precise", "coarse"] = "precise"
    # What a scenario may ask for, checked before anything is built: a typo (`rate: 1e12`, `duration:
    # 1e9s`, a tensor shape with a zero too many) is then a message naming the field and the limit,
    # not a generator that eats the machine's memory. Building a plan peaks at ~54 bytes a request in
    # every process (measured: 2.0 M requests, 108 MB; 10 M: ~540 MB, an hour at 2,700 req/s); raise
    # the limits for a bigger machine.
    max_planned_requests: int = Field(10_000_000, ge=1)  # requests the phases plan, all together (expected count)
    max_body_bytes: int = Field(16 << 20, ge=1)  # one request's body as sent, or its input tensors' bytes
    max_prompt_tokens: int = Field(1_000_000, ge=1)  # one request's prompt (a synthetic one is ~5 bytes a token)
    # The most one response may be (head and body, as read), per request: a target whose answer never
    # ends or is enormous makes that request a `protocol` error instead of filling a worker's memory.
    max_response_bytes: int = Field(64 << 20, ge=1)
    # The most a worker's chat sessions may carry all together (the sum of their histories, each also
    # bounded by its class's session.max_history_bytes): the session whose answer takes the sum past it
    # ends `history_limit`, so many sessions with long histories cannot fill a worker's memory either.
    max_carried_bytes_per_worker: int = Field(256 << 20, ge=1)


SLO_RUN_STATS = ("error_rate", "throughput")  # of the whole run, not of a metric
SLO_GOODPUT_STATS = ("fraction", "rps")  # of summary.json's goodput (metric: goodput)
SLO_TIME_STATS = ("p50", "p90", "p95", "p99", "p99.9", "max", "mean")  # of a metric's histogram, in ms
GOODPUT = "goodput"  # the SLO metric of the goodput statistics
JOB_GOODPUT = "job_goodput"  # the SLO metric of an agent class's jobs' goodput (agent.max_job_time)


class Slo(Model):
    """A pass/fail objective on one statistic of one metric and class, e.g. latency p99 <= 100 ms.

    Time statistics take `limit_ms`; `error_rate` (errors / answered requests, 0..1) and
    `throughput` (achieved req/s) take `limit`, as do the goodput statistics (`metric: goodput`):
    `fraction` (good / measured requests, 0..1) and `rps` (good requests per second). `direction:
    max` means the value must stay at or under the limit, `min` at or over it; the default is `min`
    for throughput and goodput, `max` otherwise.

    `min: X` is short for the limit X with `direction: min`, `max: X` for `direction: max`, in the
    statistic's own unit (ms for a time statistic): `{metric: goodput, stat: fraction, min: 0.99}`."""

    model_config = ConfigDict(populate_by_name=True, json_schema_extra=lambda schema: schema["properties"].update(
        {bound: {"type": "number", "minimum": 0, "description": f"short for limit (limit_ms) with direction: {bound}"}
         for bound in ("min", "max")}))

    metric: str = "latency"
    class_: str = Field("all", alias="class")  # "class" is a Python keyword
    stat: Literal["p50", "p90", "p95", "p99", "p99.9", "max", "mean", "error_rate", "throughput", "fraction", "rps"]
    limit_ms: float | None = Field(None, gt=0)
    limit: float | None = Field(None, ge=0)
    direction: Literal["max", "min"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _min_max_shorthand(cls, data: Any) -> Any:
        # `min: X` / `max: X` become the limit and the direction, before the fields are checked.
        if not isinstance(data, dict) or not {"min", "max"} & data.keys():
            return data
        if "min" in data and "max" in data:
            raise ValueError("give `min:` or `max:`, not both (an SLO has one limit)")
        bound = "min" if "min" in data else "max"
        clash = [k for k in ("limit", "limit_ms", "direction") if k in data]
        if clash:
            raise ValueError(f"`{bound}: X` is short for the limit X with direction {bound}: give it without "
                             f"{' or '.join(clash)}")
        data = dict(data)
        data["limit_ms" if data.get("stat") in SLO_TIME_STATS else "limit"] = data.pop(bound)
        data["direction"] = bound
        return data

    @model_validator(mode="after")
    def _limit_fits_stat(self) -> Slo:
        if self.stat in SLO_GOODPUT_STATS and self.metric not in (GOODPUT, JOB_GOODPUT):
            raise ValueError(f"stat {self.stat} is a goodput statistic: write metric: goodput (or job_goodput)")
        if self.metric in (GOODPUT, JOB_GOODPUT) and self.stat not in SLO_GOODPUT_STATS:
            unit = "jobs" if self.metric == JOB_GOODPUT else "requests"
            raise ValueError(f"metric {self.metric} takes stat fraction (good / measured {unit}) or rps (good {unit} "
                             f"per s), not {self.stat}")
        if self.stat in SLO_RUN_STATS or self.stat in SLO_GOODPUT_STATS:
            if self.limit is None or self.limit_ms is not None:
                unit = {"error_rate": "a fraction 0..1", "fraction": "a fraction 0..1"}.get(self.stat, "req/s")
                raise ValueError(f"stat {self.stat} takes `limit` ({unit}), not limit_ms")
            if self.stat == "error_rate" and self.limit > 1:
                raise ValueError("an error_rate limit is a fraction between 0 and 1")
            if self.stat == "fraction" and self.limit > 1:
                raise ValueError("a goodput fraction limit is a fraction between 0 and 1 (0.99: 99 % of requests good)")
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
        return self.direction or ("min" if self.stat in ("throughput", *SLO_GOODPUT_STATS) else "max")

    @property
    def threshold(self) -> float:
        """The limit in the statistic's own unit (ms, fraction, req/s)."""
        return self.limit_ms if self.stat in SLO_TIME_STATS else self.limit  # type: ignore[return-value]


class Goodput(Model):
    """Per-request objectives, DistServe's goodput (as vLLM's benchmark, aiperf and guidellm report
    it): a request is *good* when it succeeded and met every objective given here; goodput is how
    many were (fraction, req/s, their output tokens/s). Each objective is in ms and, like every
    latscope time, runs from the plan's intended send time (the timing rules):

        latency = end − intended
        ttft    = first token chunk − intended   (no token chunks: the whole answer is its first
                                                  token, so ttft = latency)
        ttfot   = first content chunk − intended (the answer itself, after a reasoning model's
                                                  reasoning; no content chunk: ttfot = latency)
        tpot    = (end − first token) / (tokens − 1)   (met by a request of ≤ 1 token)
        itl     = the request's LONGEST gap between two token chunks (met by < 2 chunks)

    `itl` here is the worst gap of one request, not the mean (tpot is the mean): a stream that
    stalls once misses it however fast the rest came. A workload class may carry its own `goodput:`,
    which overrides these field by field for that class. At least one objective must be given."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)
    latency_ms: float | None = Field(None, gt=0)
    ttfot_ms: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_objective(self) -> Goodput:
        if not self.objectives():
            raise ValueError("give at least one objective: ttft_ms, tpot_ms, itl_ms, latency_ms or ttfot_ms")
        return self

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Any) -> dict:
        # scenario.yaml shows the objectives as written, without nulls.
        return {k: v for k, v in handler(self).items() if v is not None}

    def objectives(self) -> dict[str, float]:
        """The objectives that are set, {"ttft_ms": 500.0, ...} in field order."""
        return {name: value for name in GOODPUT_OBJECTIVES if (value := getattr(self, name)) is not None}


GOODPUT_OBJECTIVES = ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "ttfot_ms")


DEFAULT_MAX_REQUEST_ROWS = 5_000_000  # requests.parquet's bound by default (~10 bytes a plain HTTP request measured: ~50 MB)


class RequestsOutput(Model):
    """requests.parquet bounded: past `max_rows` planned requests, a seeded uniform sample of about
    that many rows (each row kept with probability max_rows / planned requests)."""

    max_rows: int = Field(DEFAULT_MAX_REQUEST_ROWS, ge=1)


class Output(Model):
    """Where results go and how often interval statistics are taken. `requests`: the per-request
    records (requests.parquet): `all` (every request), `off` (none), or `{max_rows: N}` (the default,
    N = 5,000,000: all of a run that plans up to N, else a seeded sample of about N)."""

    dir: str = "results"
    interval: Annotated[Duration, Field(ge=0.1)] = 1.0
    save_schedule: bool = True
    report: bool = True  # report.html + summary.md at the end (`latscope report` can write them later)
    requests: Literal["all", "off"] | RequestsOutput = RequestsOutput()


class Validity(Model):
    """Thresholds (ms, p99) on the generator's own lateness that stamp a run degraded or invalid.
    With `relative` (the default) they are the floor, raised to what lateness cannot change much:
    a share of the run's tightest time limit and of its arrivals' spacing (analysis/verdicts.py
    says which and why; summary.json `validity_thresholds` records those applied). `relative:
    false` applies these numbers alone."""

    relative: bool = True
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
