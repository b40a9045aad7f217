"""The `phases:` section: phases run one after another, each with one arrival process saying *when*
requests are sent (the shapes' maths is in latscope/arrivals.py; plan.py turns these into offsets)."""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from latscope.scenario.base import Duration, Model, PositiveDuration

Spacing = Literal["poisson", "even"]
"""How arrivals are spread under a rate (arrivals.py): Poisson gaps, or evenly."""


class ConstantArrival(Model):
    """Evenly spaced requests at `rate` per second."""

    type: Literal["constant"] = "constant"
    rate: float = Field(gt=0)


class PoissonArrival(Model):
    """A Poisson process: exponential gaps, `rate` per second on average."""

    type: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0)


class BurstArrival(Model):
    """On/off: `burst_rate` for `burst_length` at the start of every `period`, `base_rate` otherwise."""

    type: Literal["burst"] = "burst"
    base_rate: float = Field(ge=0)
    burst_rate: float = Field(gt=0)
    burst_length: PositiveDuration
    period: Duration
    spacing: Spacing = "poisson"

    @field_validator("period")
    @classmethod
    def _period_longer_than_burst(cls, period: float, info: ValidationInfo) -> float:
        burst_length = info.data.get("burst_length")  # absent when burst_length itself was invalid
        if burst_length is not None and period <= burst_length:
            raise ValueError(f"period ({period:g} s) must be longer than burst_length ({burst_length:g} s)")
        return period


class MmppArrival(Model):
    """Random bursts: a 2-state Markov-modulated Poisson process (exponential state lengths)."""

    type: Literal["mmpp"] = "mmpp"
    base_rate: float = Field(ge=0)
    burst_rate: float = Field(gt=0)
    mean_burst_length: PositiveDuration
    mean_gap: PositiveDuration


class RampArrival(Model):
    """A linear change of rate from `from_rate` to `to_rate` over the phase."""

    type: Literal["ramp"] = "ramp"
    from_rate: float = Field(ge=0)
    to_rate: float = Field(ge=0)
    spacing: Spacing = "poisson"

    @field_validator("to_rate")
    @classmethod
    def _not_both_zero(cls, to_rate: float, info: ValidationInfo) -> float:
        if to_rate == 0 and info.data.get("from_rate") == 0:
            raise ValueError("from_rate and to_rate cannot both be 0 (the phase would send nothing)")
        return to_rate


class StepsArrival(Model):
    """A staircase: `rates[0]` for `step`, then `rates[1]` for `step`, ..."""

    type: Literal["steps"] = "steps"
    rates: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    step: PositiveDuration
    spacing: Spacing = "poisson"


class SpikeArrival(Model):
    """`base_rate`, with one spike at `spike_rate` from `at` for `length`."""

    type: Literal["spike"] = "spike"
    base_rate: float = Field(ge=0)
    spike_rate: float = Field(gt=0)
    at: Duration
    length: PositiveDuration
    spacing: Spacing = "poisson"


class IdleArrival(Model):
    """No requests at all for the phase's duration: the quiet stretch after which a target that
    scales to zero (unloads its model, stops its replicas) has to come back. The first request after
    an idle phase is measured on its own (summary.json cold_start.scale_from_zero)."""

    type: Literal["idle"] = "idle"


class UsersArrival(Model):
    """Closed loop: `users` concurrent users, each sending one session (or one request, for a class
    without sessions) after another, the next as soon as the last ended, for the phase's duration.
    They start evenly spread over `ramp`. The offered load then follows the server: a slow server
    lowers its own load (coordinated omission), so achieved throughput and service time are what such
    a phase measures, not open-loop latency. Every LLM benchmark calls this "concurrency"."""

    type: Literal["users"] = "users"
    users: int = Field(ge=1, le=100_000)
    ramp: Duration = 0.0


class TraceLengths(Model):
    """Per-request lengths from a trace's columns (the Azure trace: ContextTokens, GeneratedTokens).
    They replace the workload class's prompt_tokens / output_tokens for the phase's requests, after
    `scale` (to fit a smaller model's context) and the caps."""

    prompt_column: str | None = None
    output_column: str | None = None
    scale: float = Field(1.0, gt=0)
    max_prompt: int | None = Field(None, ge=1, le=2**31 - 1)  # lengths are int32 in the plan
    max_output: int | None = Field(None, ge=1, le=2**31 - 1)


class TraceArrival(Model):
    """Arrival times replayed from a file (relative paths: from the scenario's folder): a CSV with a
    time column (`format: csv`), an agent trace (`format: agents`: JSON lines of agent jobs, their starts,
    rounds and sub-agents, latscope/agent_trace.py; the phase's classes must be agent classes), or a Mooncake trace (`format: mooncake`: JSON lines of timestamp ms,
    input_length, output_length and hash_ids of 512-token blocks), whose prompts are built so that
    equal block ids are equal text and different ids different text (latscope/mooncake.py): the
    server sees exactly the trace's prefix sharing. `scale` (mooncake) shrinks the blocks and
    lengths for a small server, keeping the block structure."""

    type: Literal["trace"] = "trace"
    file: str = Field(min_length=1)
    format: Literal["csv", "mooncake", "agents"] = "csv"
    time_column: str | None = None
    speedup: float = Field(1.0, gt=0)
    start: Duration = 0.0  # skip the trace's first `start` seconds
    lengths: TraceLengths | None = None  # per-request prompt/output lengths from the trace's columns (csv), caps
    scale: float = Field(1.0, gt=0, le=1)  # mooncake: block size and lengths times this

    @model_validator(mode="after")
    def _options_of_its_format(self) -> TraceArrival:
        if self.format == "mooncake" and (self.time_column is not None or self.lengths is not None and (
                self.lengths.prompt_column or self.lengths.output_column or self.lengths.scale != 1)):
            raise ValueError("a Mooncake trace brings its own times and lengths: leave out time_column and lengths' "
                             "columns and scale (scale shrinks them; lengths.max_prompt and max_output cap them)")
        if self.format == "csv" and self.scale != 1:
            raise ValueError("scale is for format: mooncake; a CSV trace's lengths scale with lengths.scale")
        if self.format == "agents" and (self.time_column is not None or self.lengths is not None or self.scale != 1):
            raise ValueError("an agent trace brings its jobs' starts and every round's lengths (agent_trace.py): leave "
                             "out time_column, lengths and scale")
        return self


Arrival = Annotated[
    Union[
        ConstantArrival,
        PoissonArrival,
        BurstArrival,
        MmppArrival,
        RampArrival,
        StepsArrival,
        SpikeArrival,
        IdleArrival,
        UsersArrival,
        TraceArrival,
    ],
    Field(discriminator="type"),
]
ARRIVAL_TYPES = tuple(m.model_fields["type"].default for m in get_args(get_args(Arrival)[0]))


class Phase(Model):
    """One stretch of the run with one arrival process. Phases run one after another."""

    name: str = Field(min_length=1)
    duration: PositiveDuration | None = None  # required, except for a trace (then it truncates)
    warmup: bool = False  # sent, but excluded from the statistics
    arrival: Arrival
    classes: list[str] | None = Field(None, min_length=1)  # only these workload classes (default: all, by weight)

    @model_validator(mode="after")
    def _duration_required(self) -> Phase:
        if self.duration is None and self.arrival.type != "trace":
            raise ValueError("duration is required (only a trace phase may leave it out, and then lasts as long as the trace)")
        return self
