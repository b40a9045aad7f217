"""The scenario: what to hit, with what traffic, for how long.

This module owns the scenario *schema* (pydantic v2 models; the engine reads their attributes) and
everything between a YAML file and a validated `Scenario`:

    read file -> parse YAML (keeping line numbers) -> --set overrides -> ${VAR} interpolation
              -> pydantic validation -> Scenario

Every problem found on the way is reported as a `ScenarioError` whose lines each name the file, the
line, the field and what was expected, e.g.

    invalid scenario scenarios/burst.yaml (1 problem):
    scenarios/burst.yaml:33: phases[1].arrival.rate: Input should be greater than 0 (got -5)

pydantic reports *where* in the data a problem is (its error `loc`), not where in the file; so the
YAML is composed into a node tree (each node keeps its `start_mark`) and the `loc` is walked down
that tree to find the line. Values written by `--set` have no line and say so instead.

Also here: `scenario_json_schema` (for editor completion) and `redacted_yaml` (the resolved scenario
saved next to the results, with secrets taken out). Nothing here does I/O beyond reading the file.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, Sequence, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from latscope.errors import ScenarioError

if TYPE_CHECKING:
    from latscope.plan import Plan

__all__ = [
    "ARRIVAL_TYPES",
    "Action",
    "ActionWhen",
    "HttpCall",
    "Arrival",
    "BurstArrival",
    "ConstantArrival",
    "Dataset",
    "Duration",
    "Endpoint",
    "KServeOptions",
    "Launch",
    "LengthDist",
    "Limits",
    "MmppArrival",
    "OpenAIOptions",
    "Output",
    "Phase",
    "PoissonArrival",
    "PrometheusMetric",
    "PrometheusSource",
    "RampArrival",
    "Scenario",
    "SpikeArrival",
    "Slo",
    "StepsArrival",
    "Target",
    "Telemetry",
    "TensorSpec",
    "TraceArrival",
    "TraceLengths",
    "Validity",
    "Workload",
    "WorkloadClass",
    "apply_overrides",
    "load_scenario",
    "redacted_yaml",
    "scenario_from_dict",
    "scenario_json_schema",
]

# --------------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------------

_DURATION_HINT = "expected a duration like 30s, 2m, 500ms or a number of seconds"

# Units in this order, each at most once: "1h", "2m", "1m30s", "1.5s", "250ms", "1h2m3s4ms".
# `m(?!s)` keeps the minutes group from eating the "m" of "ms".
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?\s*"
    r"(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?\s*"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?\s*"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?"
)
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _parse_duration(value: Any) -> Any:
    """Seconds as a float, from a number of seconds or a string such as "1m30s".

    Numeric strings ("30") are accepted too: a value from `${VAR}` interpolation is always a string.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PydanticCustomError("duration", _DURATION_HINT)
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION_RE.fullmatch(text)
            if not text or match is None or not any(match.groupdict().values()):
                if text.startswith("-"):
                    raise PydanticCustomError("duration", "a duration cannot be negative") from None
                raise PydanticCustomError("duration", _DURATION_HINT) from None
            seconds = sum(float(n) * _UNIT_SECONDS[unit] for unit, n in match.groupdict().items() if n)
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise PydanticCustomError("duration", _DURATION_HINT)
    if seconds < 0:
        raise PydanticCustomError("duration", "a duration cannot be negative")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(_parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(h|m|s|ms)\s*)+$|^\s*\d+(\.\d+)?\s*$"},
            ],
            "description": "seconds, or a string like 250ms, 30s, 2m, 1h, 1m30s",
        }
    ),
]
"""Seconds (float). Accepts a number of seconds or "250ms", "30s", "2m", "1h", "1m30s"; never negative."""

PositiveDuration = Annotated[Duration, Field(gt=0)]
Spacing = Literal["poisson", "even"]
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


class _Model(BaseModel):
    """Base of every scenario model.

    extra="forbid": a misspelt field (`timout:`) is an error, not silently ignored.
    coerce_numbers_to_str: `PORT: 8765` in an env or header mapping is meant as the string "8765".
    allow_inf_nan=False: `.inf` is valid YAML but never a sensible rate.
    """

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)


def _check_http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host, like http://127.0.0.1:8000")
    try:
        _ = parts.port  # urlsplit parses the port lazily; a bad one raises here
    except ValueError:
        raise ValueError("the URL's port is not a number from 0 to 65535") from None
    return url


def _check_method(method: str) -> str:
    method = method.upper()
    if method not in HTTP_METHODS:
        raise ValueError(f"expected one of {', '.join(HTTP_METHODS)}")
    return method


def _check_path(path: str) -> str:
    """A request path is appended to the URL as is, so "infer" would give "http://hostinfer"."""
    if path and not path.startswith("/"):
        raise ValueError(f"a path must start with '/' (write /{path})")
    return path


# --------------------------------------------------------------------------------------------------
# Target
# --------------------------------------------------------------------------------------------------


class Launch(_Model):
    """A target process latscope starts before the run and stops after it."""

    command: str | list[str]  # a string is split with shlex when the target is launched
    ready_url: str | None = None
    ready_timeout: Duration = 60.0
    env: dict[str, str] = {}
    cwd: str | None = None  # relative to the scenario file's folder

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, command: str | list[str]) -> str | list[str]:
        if not (command.strip() if isinstance(command, str) else command):
            raise ValueError("the command is empty")
        return command

    @field_validator("ready_url")
    @classmethod
    def _ready_url_is_http(cls, url: str | None) -> str | None:
        return None if url is None else _check_http_url(url)


PROTOCOLS = ("http", "openai", "kserve-v2", "kserve-v2-grpc")
Protocol = Literal["http", "openai", "kserve-v2", "kserve-v2-grpc"]


def _check_url(url: str, protocol: str) -> str:
    """http(s):// for the HTTP protocols; grpc:// (plain) or grpcs:// (TLS) for kserve-v2-grpc."""
    if protocol != "kserve-v2-grpc":
        return _check_http_url(url)
    parts = urlsplit(url)
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError("kserve-v2-grpc needs a grpc://host:port (or grpcs:// for TLS) URL, like grpc://127.0.0.1:8001")
    try:
        if parts.port is None:
            raise ValueError
    except ValueError:
        raise ValueError("a grpc:// URL needs a port from 1 to 65535, like grpc://127.0.0.1:8001") from None
    return url


class OpenAIOptions(_Model):
    """How requests to an OpenAI-compatible server look. `extra_body` is merged into every request
    (temperature, vLLM's `ignore_eos`, ...)."""

    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    include_usage: bool = True  # ask for the final usage chunk (stream_options.include_usage)
    extra_body: dict[str, Any] = {}


class KServeOptions(_Model):
    """KServe v2 / Open Inference Protocol options: `binary` uses the binary tensor extension (REST)
    for inputs and outputs; `outputs` names the outputs to ask for (default: all)."""

    binary: bool = False
    version: str | None = None
    outputs: list[str] = []


class Target(_Model):
    """The endpoint under test, and how to talk to it (`protocol`)."""

    protocol: Protocol = "http"  # before url: the URL is checked against it
    url: str
    method: str = "GET"
    path: str = ""  # default for openai: /v1/chat/completions or /v1/completions; kserve-v2: /v2/models/<model>/infer
    headers: dict[str, str] = {}  # also gRPC metadata (lower-cased) for kserve-v2-grpc
    timeout: PositiveDuration = 30.0
    model: str | None = None  # the `model` of OpenAI requests; the model name of KServe v2 requests
    api_key: str | None = None  # sent as "Authorization: Bearer ..."; use ${ENV}, never a literal
    openai: OpenAIOptions = OpenAIOptions()
    kserve: KServeOptions = KServeOptions()
    launch: Launch | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str, info: ValidationInfo) -> str:
        return _check_url(url, info.data.get("protocol", "http"))

    @field_validator("method")
    @classmethod
    def _method(cls, method: str) -> str:
        return _check_method(method)

    @field_validator("path")
    @classmethod
    def _path(cls, path: str) -> str:
        return _check_path(path)


# --------------------------------------------------------------------------------------------------
# Arrival processes: *when* requests are sent (see arrivals.py for the shapes)
# --------------------------------------------------------------------------------------------------


class ConstantArrival(_Model):
    """Evenly spaced requests at `rate` per second."""

    type: Literal["constant"] = "constant"
    rate: float = Field(gt=0)


class PoissonArrival(_Model):
    """A Poisson process: exponential gaps, `rate` per second on average."""

    type: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0)


class BurstArrival(_Model):
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


class MmppArrival(_Model):
    """Random bursts: a 2-state Markov-modulated Poisson process (exponential state lengths)."""

    type: Literal["mmpp"] = "mmpp"
    base_rate: float = Field(ge=0)
    burst_rate: float = Field(gt=0)
    mean_burst_length: PositiveDuration
    mean_gap: PositiveDuration


class RampArrival(_Model):
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


class StepsArrival(_Model):
    """A staircase: `rates[0]` for `step`, then `rates[1]` for `step`, ..."""

    type: Literal["steps"] = "steps"
    rates: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    step: PositiveDuration
    spacing: Spacing = "poisson"


class SpikeArrival(_Model):
    """`base_rate`, with one spike at `spike_rate` from `at` for `length`."""

    type: Literal["spike"] = "spike"
    base_rate: float = Field(ge=0)
    spike_rate: float = Field(gt=0)
    at: Duration
    length: PositiveDuration
    spacing: Spacing = "poisson"


class IdleArrival(_Model):
    """No requests at all for the phase's duration: the quiet stretch after which a target that
    scales to zero (unloads its model, stops its replicas) has to come back. The first request after
    an idle phase is measured on its own (summary.json cold_start.scale_from_zero)."""

    type: Literal["idle"] = "idle"


class TraceLengths(_Model):
    """Per-request lengths from a trace's columns (the Azure trace: ContextTokens, GeneratedTokens).
    They replace the workload class's prompt_tokens / output_tokens for the phase's requests, after
    `scale` (to fit a smaller model's context) and the caps."""

    prompt_column: str | None = None
    output_column: str | None = None
    scale: float = Field(1.0, gt=0)
    max_prompt: int | None = Field(None, ge=1)
    max_output: int | None = Field(None, ge=1)


class TraceArrival(_Model):
    """Arrival times replayed from a CSV file (relative paths: from the scenario's folder)."""

    type: Literal["trace"] = "trace"
    file: str = Field(min_length=1)
    time_column: str | None = None
    speedup: float = Field(1.0, gt=0)
    start: Duration = 0.0  # skip the trace's first `start` seconds
    lengths: TraceLengths | None = None  # per-request prompt/output lengths from the trace's columns


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
        TraceArrival,
    ],
    Field(discriminator="type"),
]
ARRIVAL_TYPES = tuple(m.model_fields["type"].default for m in get_args(get_args(Arrival)[0]))


class Phase(_Model):
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


# --------------------------------------------------------------------------------------------------
# Workload: *what* each request is
# --------------------------------------------------------------------------------------------------


class FixedLength(_Model):
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)


class UniformLength(_Model):
    """Uniform integers from `min` to `max`, both included."""

    dist: Literal["uniform"] = "uniform"
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


class NormalLength(_Model):
    """Normal with this mean and standard deviation (tokens), rounded, clipped to [min, max]."""

    dist: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(1, ge=1)
    max: int | None = Field(None, ge=1)


class LognormalLength(_Model):
    """Log-normal with this mean and standard deviation *in tokens* (not of the log), rounded,
    clipped to [min, max]: the long right tail of real prompt and answer lengths."""

    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    std: float = Field(gt=0)
    min: int = Field(1, ge=1)
    max: int | None = Field(None, ge=1)


class EmpiricalLength(_Model):
    """Lengths drawn (with replacement) from a file: a CSV column, a JSONL field, or one number per
    line of a text file."""

    dist: Literal["empirical"] = "empirical"
    file: str = Field(min_length=1)
    column: str | None = None  # CSV column or JSONL field (required for those)


LengthDist = Annotated[
    Union[FixedLength, UniformLength, NormalLength, LognormalLength, EmpiricalLength], Field(discriminator="dist")
]

LENGTH_DISTS = tuple(m.model_fields["dist"].default for m in get_args(get_args(LengthDist)[0]))


def _length(value: Any) -> Any:
    """`prompt_tokens: 128` is short for `{dist: fixed, value: 128}`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Length = Annotated[LengthDist, BeforeValidator(_length)]


class Dataset(_Model):
    """Prompts from a JSONL file: `format: text` takes the string in `field` of each line;
    `format: sharegpt` takes each conversation's first human turn (`conversations[].from/value`)."""

    file: str = Field(min_length=1)
    format: Literal["text", "sharegpt"] = "text"
    field: str = "text"


class TensorSpec(_Model):
    """One input tensor of a KServe v2 request: random values (seeded) or the contents of a .npy file."""

    name: str = Field(min_length=1)
    datatype: Literal["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
                      "FP16", "FP32", "FP64"] = "FP32"
    shape: list[Annotated[int, Field(ge=1)]] = Field(default=[], min_length=0)
    npy: str | None = None  # a .npy file; its shape and dtype win
    low: float = 0.0  # random values are uniform in [low, high) (integers: high excluded)
    high: float = 1.0

    @model_validator(mode="after")
    def _shape_or_file(self) -> TensorSpec:
        if self.npy is None and not self.shape:
            raise ValueError("give a shape (like [1, 384]) for random values, or an npy file")
        return self


class WorkloadClass(_Model):
    """A kind of request, drawn with probability proportional to `weight` and recorded separately.

    Unset endpoint fields fall back to the target's (protocol, url, method, path, model, openai,
    kserve) or the workload's (body); headers add to the target's. What a request carries depends on
    the protocol: `body` (http); `prompt_tokens`/`output_tokens` or a `dataset` (openai); `tensors`
    (kserve-v2, kserve-v2-grpc).
    """

    name: str
    weight: float = Field(1.0, gt=0)
    protocol: Protocol | None = None
    url: str | None = None
    method: str | None = None
    path: str | None = None
    headers: dict[str, str] = {}
    model: str | None = None
    openai: OpenAIOptions | None = None
    kserve: KServeOptions | None = None
    body: Any = None
    prompt_tokens: Length | None = None
    output_tokens: Length | None = None
    dataset: Dataset | None = None
    tensors: list[TensorSpec] = []

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        # Class names become histogram tags ("latency/small") and column values.
        if not _NAME_RE.fullmatch(name):
            raise ValueError("a class name may use only letters, digits, '_', '.' and '-'")
        if name == "all":
            raise ValueError("'all' is reserved for the aggregate of all classes")
        return name

    @field_validator("method")
    @classmethod
    def _method(cls, method: str | None) -> str | None:
        return None if method is None else _check_method(method)

    @field_validator("path")
    @classmethod
    def _path(cls, path: str | None) -> str | None:
        return None if path is None else _check_path(path)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None, info: ValidationInfo) -> str | None:
        protocol = info.data.get("protocol")
        if url is None or protocol is None:  # checked against the target's protocol by the scenario
            return url
        return _check_url(url, protocol)

    @model_validator(mode="after")
    def _one_prompt_source(self) -> WorkloadClass:
        if self.dataset is not None and self.prompt_tokens is not None:
            raise ValueError("give prompt_tokens (synthetic prompts) or a dataset, not both")
        return self


class Workload(_Model):
    """Request bodies and classes. A mapping or list body is sent as JSON, a string as is."""

    body: Any = None
    content_type: str | None = None
    classes: list[WorkloadClass] = []

    @field_validator("classes")
    @classmethod
    def _unique_names(cls, classes: list[WorkloadClass]) -> list[WorkloadClass]:
        _check_unique([c.name for c in classes], "class")
        return classes

    def effective_classes(self) -> list[WorkloadClass]:
        """The classes requests are drawn from: one class named "default" when none are given."""
        return list(self.classes) or [WorkloadClass(name="default")]


def _check_unique(names: list[str], what: str) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(duplicates)}")


# --------------------------------------------------------------------------------------------------
# Limits, SLOs, output, validity thresholds
# --------------------------------------------------------------------------------------------------


class Limits(_Model):
    """Caps on the generator, and how it keeps time. Past `max_in_flight`, requests wait for a slot
    ("queue") or are dropped. `timer: precise` sends within microseconds of the schedule at the cost
    of up to 1 ms of CPU per request; `coarse` uses event-loop timers only (about 1 ms late at p99,
    no CPU while idle): pick it when the generator shares a small machine with the target."""

    max_in_flight: int = Field(10000, ge=1)
    max_requests: int | None = Field(None, ge=1)
    overflow: Literal["queue", "drop"] = "queue"
    timer: Literal["precise", "coarse"] = "precise"


SLO_TIME_STATS = ("p50", "p90", "p95", "p99", "p99.9", "max", "mean")
SLO_RUN_STATS = ("error_rate", "throughput")  # of the whole run, not of a metric


class Slo(_Model):
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


class Output(_Model):
    """Where results go and how often interval statistics are taken."""

    dir: str = "results"
    interval: Annotated[Duration, Field(ge=0.1)] = 1.0
    save_schedule: bool = True
    report: bool = True  # report.html + summary.md at the end (`latscope report` can write them later)


class Validity(_Model):
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


# --------------------------------------------------------------------------------------------------
# Telemetry (latscope/telemetry/)
# --------------------------------------------------------------------------------------------------

PROMETHEUS_MAPPINGS = ("dcgm", "triton", "reference-server")


class PrometheusMetric(_Model):
    """How one exported sample becomes a telemetry metric: its name in telemetry.parquet (one of
    latscope.telemetry.METRICS for GPU metrics, or a name of its own), a scale, whether it is a
    counter to turn into a per-second rate, the label naming the device, and how series of one
    device combine."""

    metric: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    scale: float = 1.0
    rate: bool = False
    device_label: str | None = None
    aggregate: Literal["sum", "mean", "max"] = "sum"


class PrometheusSource(_Model):
    """A Prometheus endpoint scraped during the run (DCGM exporter, Triton, the reference server's
    /metrics): a shipped mapping by name, or {exported name: PrometheusMetric}."""

    name: str = Field("prometheus", pattern=r"^[A-Za-z0-9_.-]+$")  # the `source` column
    url: str
    # A shipped mapping's name or an inline {name: PrometheusMetric}; checked by _mapping (a pydantic
    # union would report every failed branch of it).
    mapping: Annotated[
        str | dict[str, Any],
        WithJsonSchema({"anyOf": [{"enum": list(PROMETHEUS_MAPPINGS)},
                                  {"type": "object", "additionalProperties": PrometheusMetric.model_json_schema()}]}),
    ] = "reference-server"
    timeout: PositiveDuration = 2.0  # one scrape; a slower endpoint is a gap in its samples
    interval: PositiveDuration | None = None  # default: telemetry.interval

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _check_http_url(url)

    @field_validator("mapping")
    @classmethod
    def _mapping(cls, mapping: str | dict) -> str | dict[str, PrometheusMetric]:
        if isinstance(mapping, str):
            if mapping not in PROMETHEUS_MAPPINGS:
                raise ValueError(f"expected one of {', '.join(PROMETHEUS_MAPPINGS)} or an inline mapping")
            return mapping
        if not mapping:
            raise ValueError(f"an inline mapping needs at least one metric (or name one of {', '.join(PROMETHEUS_MAPPINGS)})")
        out = {}
        for name, entry in mapping.items():
            try:
                out[name] = entry if isinstance(entry, PrometheusMetric) else PrometheusMetric.model_validate(entry)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"{name}{'.' + where if where else ''}: {first['msg']}") from None
        return out


class Telemetry(_Model):
    """What is sampled during the run, every `interval`: local GPUs through NVML (`auto`: when NVML
    starts, else one warning; `true`: the run fails without it), latscope's own CPU, memory and
    event-loop lag (`host`), and Prometheus endpoints."""

    interval: Annotated[Duration, Field(ge=0.05)] = 0.25
    nvml: Literal["auto", True, False] = "auto"
    host: bool = True
    prometheus: list[PrometheusSource] = []

    @field_validator("prometheus")
    @classmethod
    def _unique_sources(cls, sources: list[PrometheusSource]) -> list[PrometheusSource]:
        names = [s.name for s in sources]
        _check_unique(names, "prometheus source")
        for reserved in ("nvml", "host"):
            if reserved in names:
                raise ValueError(f"{reserved!r} is the name of a built-in telemetry source; name the prometheus source otherwise")
        return sources


# --------------------------------------------------------------------------------------------------
# Actions: things done to the system under test at set times of the run (latscope/actions.py)
# --------------------------------------------------------------------------------------------------


class ActionWhen(_Model):
    """An action's time given as "when phase `phase` starts, plus `after`"."""

    phase: str = Field(min_length=1)
    after: Duration = 0.0


class HttpCall(_Model):
    """An HTTP request an action makes (an admin API, a webhook). `json` is sent as JSON, `body` as
    is; `expect` lists the status codes that count as success (default: any 2xx)."""

    model_config = ConfigDict(populate_by_name=True)

    method: str | None = None  # default: POST with a json/body, GET without
    url: str
    headers: dict[str, str] = {}
    json_: Any = Field(None, alias="json")  # "json" would shadow BaseModel.json
    body: str | None = None
    expect: list[Annotated[int, Field(ge=100, le=599)]] = []

    @field_validator("method")
    @classmethod
    def _method(cls, method: str | None) -> str | None:
        return None if method is None else _check_method(method)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _check_http_url(url)

    @model_validator(mode="after")
    def _one_body(self) -> HttpCall:
        if self.json_ is not None and self.body is not None:
            raise ValueError("give json (sent as JSON) or body (sent as is), not both")
        if self.method is None:
            self.method = "GET" if self.json_ is None and self.body is None else "POST"
        return self


ACTION_KINDS = ("command", "http", "restart")


class Action(_Model):
    """Something done at one time of the run: a shell command (run without a shell), an HTTP call,
    or a restart of the launched target. `at` counts from the run's start (t=0, the first intended
    send); `when` from a phase's start. Its start and outcome go to events.jsonl."""

    name: str
    at: Duration | None = None
    when: ActionWhen | None = None
    command: str | list[str] | None = None  # a string is split with shlex; `python` means latscope's interpreter
    env: dict[str, str] = {}  # added to the command's environment
    cwd: str | None = None  # the command's folder, relative to the scenario file's folder
    http: HttpCall | None = None
    restart: bool = False  # restart target.launch
    timeout: PositiveDuration = 30.0

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME_RE.fullmatch(name):
            raise ValueError("an action name may use only letters, digits, '_', '.' and '-'")
        return name

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, command: str | list[str] | None) -> str | list[str] | None:
        if command is not None and not (command.strip() if isinstance(command, str) else command):
            raise ValueError("the command is empty")
        return command

    @property
    def kind(self) -> str:
        """"command", "http" or "restart" (the scenario checks there is exactly one)."""
        return "command" if self.command is not None else "http" if self.http is not None else "restart"

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Any) -> dict:
        # The resolved scenario.yaml shows an action as written: no `when: null`, `restart: false`, ...
        unset = {"at": None, "when": None, "command": None, "http": None, "restart": False, "env": {}, "cwd": None}
        return {k: v for k, v in handler(self).items() if k not in unset or v != unset[k]}


def _check_actions(scenario: Scenario) -> None:
    """Each action has one time and one kind, names a phase that exists, can restart a target, and
    falls inside the planned run. Problems name the field they are about."""
    phases = [p.name for p in scenario.phases]
    durations = [p.duration for p in scenario.phases]
    starts = {p.name: sum(durations[:i]) if None not in durations[:i] else None for i, p in enumerate(scenario.phases)}
    total = None if None in durations else sum(durations)
    for i, action in enumerate(scenario.actions):
        where: DataPath = ("actions", i)
        if action.at is not None and action.when is not None:
            raise _ProblemAt((*where, "when"), "give `at` (seconds from the run's start) or `when` (a phase start), not both")
        if action.at is None and action.when is None:
            raise _ProblemAt(where, "needs a time: `at: 20s` (from the run's start) or `when: {phase: NAME, after: 2s}`")
        kinds = [k for k in ACTION_KINDS if getattr(action, k) not in (None, False)]
        if len(kinds) != 1:
            got = f"got {' and '.join(kinds)}" if kinds else "got none"
            raise _ProblemAt(where, f"give exactly one of command, http or restart: true ({got})")
        if (action.env or action.cwd is not None) and action.command is None:
            raise _ProblemAt((*where, "env" if action.env else "cwd"), "env and cwd apply to a command action only")
        if action.restart and scenario.target.launch is None:
            raise _ProblemAt((*where, "restart"), "restart needs a launched target (target.launch); this scenario has none")
        if action.when is not None and action.when.phase not in phases:
            raise _ProblemAt((*where, "when", "phase"), f"{action.when.phase!r} is not a phase (known: {', '.join(phases)})")
        planned = action.at if action.at is not None else (
            None if starts[action.when.phase] is None else starts[action.when.phase] + action.when.after)
        if total is not None and planned is not None and planned > total:
            field_path = (*where, "at") if action.at is not None else (*where, "when", "after")
            raise _ProblemAt(field_path, f"the action would never run: it is planned at {planned:g} s and the phases end at {total:g} s")


# --------------------------------------------------------------------------------------------------
# The scenario
# --------------------------------------------------------------------------------------------------


class _ProblemAt(ValueError):
    """A problem found by a check across fields, with the data path of the field it is about (so the
    error names that field's line rather than the scenario's)."""

    def __init__(self, path: tuple[str | int, ...], message: str):
        super().__init__(f"{_dotted(path)}: {message}")
        self.path, self.message = path, message


@dataclass(frozen=True)
class Endpoint:
    """A workload class's resolved endpoint (see Scenario.endpoint)."""

    protocol: str
    url: str
    method: str
    path: str
    headers: dict[str, str]
    timeout: float
    model: str | None
    api_key: str | None
    openai: OpenAIOptions
    kserve: KServeOptions


class Scenario(_Model):
    """A latscope scenario: what to hit, with what traffic, for how long."""

    name: str | None = None  # load_scenario fills in the file's stem
    description: str = ""
    seed: int = 0
    target: Target
    phases: list[Phase] = Field(min_length=1)
    workload: Workload = Workload()
    limits: Limits = Limits()
    slos: list[Slo] = []
    output: Output = Output()
    validity: Validity = Validity()
    telemetry: Telemetry = Telemetry()
    actions: list[Action] = []

    # Set by the loader, not part of the schema. The base directory makes relative paths (trace
    # file, launch cwd) mean "next to the scenario file" wherever latscope is started from.
    _source: Path | None = PrivateAttr(default=None)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    # data path -> the string as written before ${VAR} interpolation, for redacted_yaml
    _templates: dict[tuple[str | int, ...], str] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        # The name becomes part of the results directory's name.
        if name is not None and not _NAME_RE.fullmatch(name):
            raise ValueError("a scenario name may use only letters, digits, '_', '.' and '-'")
        return name

    @field_validator("phases")
    @classmethod
    def _unique_phase_names(cls, phases: list[Phase]) -> list[Phase]:
        _check_unique([p.name for p in phases], "phase")
        return phases

    @model_validator(mode="after")
    def _phase_classes_exist(self) -> Scenario:
        known = [c.name for c in self.workload.effective_classes()]
        for i, phase in enumerate(self.phases):
            for j, name in enumerate(phase.classes or ()):
                if name not in known:
                    raise _ProblemAt(("phases", i, "classes", j), f"{name!r} is not a workload class (known: {', '.join(known)})")
        return self

    @field_validator("actions")
    @classmethod
    def _unique_action_names(cls, actions: list[Action]) -> list[Action]:
        _check_unique([a.name for a in actions], "action")
        return actions

    @model_validator(mode="after")
    def _actions_fit(self) -> Scenario:
        _check_actions(self)
        return self

    @field_validator("slos")
    @classmethod
    def _slo_classes_exist(cls, slos: list[Slo], info: ValidationInfo) -> list[Slo]:
        # A misspelt class would otherwise make an SLO that can never be evaluated.
        workload = info.data.get("workload")
        if workload is not None:
            known = ["all", *(c.name for c in workload.effective_classes())]
            for i, slo in enumerate(slos):
                if slo.class_ not in known:
                    raise ValueError(f"slos[{i}].class {slo.class_!r} is not a workload class (known: {', '.join(known)})")
        return slos

    @model_validator(mode="after")
    def _classes_fit_their_protocol(self) -> Scenario:
        for i, cls in enumerate(self.workload.effective_classes()):
            where: DataPath = ("workload", "classes", i) if self.workload.classes else ("target",)
            protocol = cls.protocol or self.target.protocol
            if cls.url is not None and cls.protocol is None:
                try:
                    _check_url(cls.url, protocol)
                except ValueError as exc:
                    raise _ProblemAt((*where, "url"), str(exc)) from None
            if protocol != "http" and (cls.model or self.target.model) is None:
                raise _ProblemAt(where, f"protocol {protocol} needs a model name (target.model or the class's model)")
            if protocol.startswith("kserve") and not cls.tensors:
                raise _ProblemAt(where, f"protocol {protocol} needs tensors (the inputs to send)")
            if protocol == "kserve-v2-grpc" and cls.protocol is not None and cls.url is None and self.target.protocol != protocol:
                raise _ProblemAt(where, "a class that switches to kserve-v2-grpc needs its own url (grpc://host:port)")
        return self

    def endpoint(self, cls: int) -> Endpoint:
        """Where and how requests of workload class `cls` go: the class's settings over the target's."""
        c, t = self.workload.effective_classes()[cls], self.target
        protocol = c.protocol or t.protocol
        model = c.model or t.model
        if c.path is not None:
            path = c.path
        elif t.path or protocol == "http":
            path = t.path
        elif protocol == "openai":
            api = (c.openai or t.openai).api
            path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        else:
            kserve = c.kserve or t.kserve
            path = f"/v2/models/{model}" + (f"/versions/{kserve.version}" if kserve.version else "") + "/infer"
        return Endpoint(
            protocol=protocol,
            url=c.url or t.url,
            method=c.method or ("POST" if protocol != "http" else t.method),
            path=path,
            headers={**t.headers, **c.headers},
            timeout=t.timeout,
            model=model,
            api_key=t.api_key,
            openai=c.openai or t.openai,
            kserve=c.kserve or t.kserve,
        )

    def action_times(self, plan: Plan | None = None) -> list[float]:
        """Each action's planned time in seconds on the run clock (0 = the first intended send), in
        the order of `actions`: `at`, or its phase's planned start plus `after`. `plan` saves building
        the plan again (a trace phase's length is only known from it)."""
        if not self.actions:
            return []
        if plan is None:
            from latscope.plan import build_plan  # plan.py imports this module

            plan = build_plan(self)
        starts = {p.name: p.start_s for p in plan.phases}
        return [a.at if a.at is not None else starts[a.when.phase] + a.when.after for a in self.actions]

    def action_secrets(self) -> list[str]:
        """Strings that must not appear in what an action's run records (its output, a response,
        an error): what each `${VAR}` in an action expanded to, and credential-like header and env
        values of actions written literally. Longest first, so a value holding another is replaced
        whole. Values under 4 characters are left out: scrubbing them would blank ordinary digits."""
        found: set[str] = set()
        for path, template in self._templates.items():
            if path[:1] != ("actions",):
                continue
            for match in _REFERENCE.finditer(template):
                if (name := match.group("name")) is None:
                    continue
                value = os.environ.get(name)
                found.add(match.group("default") if (value is None or value == "") and match.group("default") is not None
                          else value or "")
        for i, action in enumerate(self.actions):
            maps = [(("actions", i, "env"), action.env)] + ([(("actions", i, "http", "headers"), action.http.headers)]
                                                            if action.http else [])
            for prefix, values in maps:
                found.update(v for k, v in values.items() if _is_secret_path((*prefix, k)))
        return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)

    @property
    def source(self) -> Path | None:
        """The file this scenario was loaded from (None when built from a dict)."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the scenario are resolved against."""
        return self._base_dir

    def resolve_path(self, p: str) -> Path:
        """`p` (e.g. a trace file) as an absolute path: relative paths count from `base_dir`."""
        path = Path(p).expanduser()
        return path if path.is_absolute() else self._base_dir / path


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------

DataPath = tuple[str | int, ...]  # a place in the loaded data: ("phases", 0, "arrival", "rate")


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read, override, interpolate and validate the scenario file at `path`.

    Raises ScenarioError, one line per problem, each naming the file, line and field.
    """
    label = str(path)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {label}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario file {label}: {getattr(exc, 'strerror', None) or exc}") from None

    root, data = _parse_yaml(text, label)
    if not isinstance(data, dict):
        found = "the file is empty" if data is None else f"found {_yaml_type(data)}"
        raise ScenarioError(f"{label}: a scenario must be a mapping of fields (name:, target:, phases:, ...); {found}")
    data, set_by = _apply_overrides(data, overrides)
    if data.get("name") is None:
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem) or "scenario"

    scenario = _build(data, _Origin(label, root, set_by))
    scenario._source = path
    scenario._base_dir = path.absolute().parent
    return scenario


def scenario_from_dict(data: dict, source: str = "<dict>") -> Scenario:
    """A scenario from already-parsed data (programmatic use, tests). `source` labels error messages.

    Interpolation and error messages are as for a file, without line numbers. Relative paths resolve
    against the current directory. A missing name becomes "scenario".
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a mapping of fields; found {_yaml_type(data)}")
    data = _copy_tree(data)
    if data.get("name") is None:
        data["name"] = "scenario"
    return _build(data, _Origin(source))


def _build(data: dict, origin: _Origin) -> Scenario:
    """Interpolate and validate; shared by load_scenario and scenario_from_dict."""
    data, templates = _interpolate(data, origin)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        _raise_problems(origin, _validation_problems(exc, data, origin, templates))
    scenario._templates = templates
    return scenario


# ---- YAML -----------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps dates as strings: `name: 2024-06-01` is a name, and a date object in a
    request body could not be sent as JSON."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _parse_yaml(text: str, label: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for line numbers) and the data built from it, from one parse."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_duplicate_keys(root, label)
        return root, loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        raise ScenarioError(_yaml_error_message(exc, label)) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{label}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_error_message(exc: yaml.MarkedYAMLError, label: str) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark else label
    message = exc.problem or exc.context or "cannot parse"
    if exc.context and exc.problem:
        started = f" started at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        message += f" ({exc.context}{started})"
    if "\\t" in message or "\t" in message:
        message += "; YAML indentation must use spaces, not tabs"
    return f"{where}: invalid YAML: {message}"


def _check_duplicate_keys(node: yaml.Node, label: str, seen: set[int] | None = None) -> None:
    """PyYAML silently keeps the last of two equal keys; a second `phases:` is almost always a mistake."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if key.value in first_line:
                    raise ScenarioError(f"{label}:{line}: duplicate key {key.value!r} (first at line {first_line[key.value]})")
                first_line[key.value] = line
            _check_duplicate_keys(value, label, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, label, seen)


def _yaml_type(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _copy_tree(value: Any) -> Any:
    """A copy of nested dicts and lists. Unlike deepcopy it does not keep YAML aliases shared, so
    `--set` on one alias does not change the other."""
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return value


# ---- --set overrides ------------------------------------------------------------------------------


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """A copy of `data` with each `key.path=value` override applied, in order.

    Paths are dotted, with integer indices for lists (`phases.0.arrival.rate=50`). The value is read
    as YAML, so `50` is an int, `true` a bool, `[1, 2]` a list and `null` None. Missing mapping keys
    are created; an index out of range or a path through a scalar is a ScenarioError.
    """
    return _apply_overrides(data, overrides)[0]


def _apply_overrides(data: dict, overrides: Sequence[str]) -> tuple[dict, dict[DataPath, str]]:
    """apply_overrides, also returning which data path each override wrote (for error messages)."""
    data = _copy_tree(data)
    set_by: dict[DataPath, str] = {}
    for override in overrides:
        key, eq, raw = override.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"--set {override!r}: expected key.path=value, e.g. phases.0.arrival.rate=50")
        try:
            value = yaml.load(raw, Loader=_Loader)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ScenarioError(f"--set {override!r}: the value is not valid YAML ({problem}); quote it") from None
        path = _set_path(data, key.strip(), value, override)
        # A later override of a parent replaces what earlier ones wrote below it.
        set_by = {p: o for p, o in set_by.items() if p[: len(path)] != path}
        set_by[path] = override
    return data, set_by


def _set_path(data: dict, key: str, value: Any, override: str) -> DataPath:
    parts = key.split(".")
    if any(not part for part in parts):
        raise ScenarioError(f"--set {override!r}: empty component in the key path {key!r}")
    node: Any = data
    path: list[str | int] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i]) or "the scenario"
        if isinstance(node, dict):
            step: str | int = part
            if last:
                node[step] = value
            elif not isinstance(node.get(step), (dict, list)):
                if node.get(step) is not None:
                    raise ScenarioError(f"--set {override!r}: {'.'.join(parts[: i + 1])} is {_yaml_type(node[step])}, not a mapping or list")
                node[step] = {}  # create the missing mapping
        elif isinstance(node, list):
            if not re.fullmatch(r"\d+", part):
                raise ScenarioError(f"--set {override!r}: {where} is a list; expected an index, not {part!r}")
            step = int(part)
            if step >= len(node):
                raise ScenarioError(f"--set {override!r}: index {step} is out of range ({where} has {len(node)} item{'s' * (len(node) != 1)})")
            if last:
                node[step] = value
        else:
            raise ScenarioError(f"--set {override!r}: {where} is {_yaml_type(node)}, not a mapping or list")
        path.append(step)
        if not last:
            node = node[step]
    return tuple(path)


# ---- ${VAR} interpolation -------------------------------------------------------------------------

# `$${` is a literal `${`; a `${` matching neither form is reported rather than sent as is.
_REFERENCE = re.compile(r"\$\$\{|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|\$\{")


def _interpolate(data: Any, origin: _Origin) -> tuple[Any, dict[DataPath, str]]:
    """A copy of `data` with `${VAR}` and `${VAR:-default}` replaced from the environment in every
    string, and the original of each string that changed (keyed by data path)."""
    templates: dict[DataPath, str] = {}
    problems: list[tuple[DataPath, str]] = []

    def substitute(text: str, path: DataPath) -> str:
        def one(match: re.Match) -> str:
            if match.group(0) == "$${":
                return "${"
            name = match.group("name")
            if name is None:
                problems.append((path, "malformed ${...}: expected ${NAME} or ${NAME:-default} (write $${ for a literal ${)"))
                return match.group(0)
            value = os.environ.get(name)
            if value is None or (value == "" and match.group("default") is not None):
                if match.group("default") is not None:
                    return match.group("default")
                problems.append((path, f"environment variable {name} is not set (write ${{{name}:-default}} to give it a default)"))
                return match.group(0)
            return value

        result = _REFERENCE.sub(one, text)
        if result != text:
            templates[path] = text
        return result

    def walk(value: Any, path: DataPath) -> Any:
        if isinstance(value, str):
            return substitute(value, path) if "${" in value else value
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*path, i)) for i, v in enumerate(value)]
        return value

    data = walk(data, ())
    if problems:
        _raise_problems(origin, [origin.problem(path, message) for path, message in problems])
    return data, templates


# ---- error messages that point into the file ------------------------------------------------------


@dataclass
class _Origin:
    """Where a scenario's values came from: enough to point a problem at a line or a --set."""

    label: str  # the file as the user named it, or scenario_from_dict's `source`
    root: yaml.Node | None = None  # the composed YAML (None when built from a dict)
    set_by: dict[DataPath, str] = field(default_factory=dict)  # data path -> the --set that wrote it

    def problem(self, path: DataPath, message: str) -> tuple[float, str]:
        """(sort key, message line): "file:LINE: dotted.path: message"."""
        # The value was written by a --set, or by one at or below `path` where the file has nothing.
        override = next((self.set_by[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.set_by), None)
        line, found = (None, False) if override or self.root is None else _line_of(self.root, path)
        if override is None and not found:
            override = next((o for p, o in self.set_by.items() if p[: len(path)] == path), None)
        if override:
            where = f"{self.label} (from --set {override})"
        else:
            where = f"{self.label}:{line}" if line else self.label
        dotted = _dotted(path)
        return (line if line else math.inf), f"{where}: {dotted + ': ' if dotted else ''}{message}"


def _raise_problems(origin: _Origin, problems: list[tuple[float, str]]) -> NoReturn:
    lines = list(dict.fromkeys(message for _, message in sorted(problems, key=lambda p: p[0])))
    header = f"invalid scenario {origin.label} ({len(lines)} problem{'s' * (len(lines) != 1)}):"
    raise ScenarioError("\n".join([header, *lines]))


def _dotted(path: DataPath) -> str:
    """("phases", 1, "arrival", "rate") -> "phases[1].arrival.rate"."""
    text = ""
    for item in path:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else str(item))
    return text


def _line_of(root: yaml.Node, path: DataPath) -> tuple[int, bool]:
    """The 1-based line of the deepest part of `path` found in the YAML tree, and whether all of
    `path` was found.

    A mapping key's own line is used (so `timout:` points at itself and a block value at its key);
    a part that is not there (a missing field) leaves the line of its parent.
    """
    node, line = root, root.start_mark.line + 1
    for item in path:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(item)), None)
            if pair is None:
                return line, False
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int) and item < len(node.value):
            node = node.value[item]
            line = node.start_mark.line + 1
        else:
            return line, False
    return line, True


def _data_path(data: Any, loc: tuple[str | int, ...]) -> DataPath:
    """pydantic's error `loc` as a path into the data.

    pydantic puts union member tags in `loc`: the discriminator value ('phases', 0, 'arrival',
    'poisson', 'rate'), or a type for plain unions ('command', 'list[str]', 1). Those are not in
    the data and are dropped; a last item that is not in the data is a missing field and is kept.
    """
    path: list[str | int] = []
    node = data
    for i, item in enumerate(loc):
        if isinstance(node, dict) and item in node:
            path.append(item)
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            path.append(item)
            node = node[item]
        elif isinstance(node, dict) and i == len(loc) - 1 and item != node.get("type"):
            path.append(item)  # a missing field
            node = None
        # else: a union tag
    return tuple(path)


def _validation_problems(exc: ValidationError, data: dict, origin: _Origin, templates: dict[DataPath, str]) -> list[tuple[float, str]]:
    """One message line per pydantic error, rewritten where pydantic's own text is unhelpful."""
    problems = []
    for error in exc.errors(include_url=False):
        path = _data_path(data, error["loc"])
        kind, message = error["type"], error["msg"]
        show_input = kind != "missing"
        if kind == "missing":
            message = "required field is missing"
        elif kind == "extra_forbidden":
            allowed = _allowed_fields(error["loc"][:-1])
            close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            message = f"unknown field ({hint}allowed: {', '.join(allowed)})"
            show_input = False
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = error.get("ctx", {})
            tag = ctx.get("discriminator", "'type'").strip("'")
            known = LENGTH_DISTS if tag == "dist" else ARRIVAL_TYPES
            expected = ", ".join(re.findall(r"'([^']*)'", ctx.get("expected_tags", ""))) or ", ".join(known)
            if kind == "union_tag_invalid":
                path = (*path, tag)
                message = f"unknown {tag} {ctx['tag']!r} (allowed: {expected})"
            else:
                message = f"missing {tag!r} (one of: {expected})"
            show_input = False
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, _ProblemAt):  # a check across fields that knows which field is wrong
                path, message, show_input = cause.path, cause.message, False
        if show_input and not isinstance(error["input"], (dict, list)):
            message += f" (got {_show(error['input'], path, templates)})"
        problems.append(origin.problem(path, message))
    return problems


def _allowed_fields(loc: tuple[str | int, ...]) -> list[str]:
    """The field names (aliases) of the model that pydantic's `loc` points into, following model
    fields, list items, dict values and union tags from Scenario down."""
    tp: Any = Scenario
    for item in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = next((f.annotation for name, f in tp.model_fields.items() if (f.alias or name) == item), None)
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) in (Union, UnionType):  # a discriminated union: `item` is the tag
            tp = next((m for m in get_args(tp) if _type_tag(m) == item), None)
        else:
            return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _type_tag(model: Any) -> str | None:
    """The `type` literal of an arrival model; None for anything else."""
    type_field = getattr(model, "model_fields", {}).get("type")
    return type_field.default if type_field else None


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] -> X and X | None -> X."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]
        else:
            return tp


def _show(value: Any, path: DataPath, templates: dict[DataPath, str]) -> str:
    """A rejected value for an error message, without leaking secrets."""
    if path in templates:
        shown = "<redacted>" if _is_secret_path(path) else _redact_url(str(value))
        return f"{templates[path]} = {shown!r}"
    if isinstance(value, str):
        text = "<redacted>" if _is_secret_path(path) else _redact_url(value)
        return repr(text if len(text) <= 80 else text[:77] + "...")
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()  # as YAML writes them
    return repr(value)


# --------------------------------------------------------------------------------------------------
# JSON Schema and the redacted dump
# --------------------------------------------------------------------------------------------------


def scenario_json_schema() -> dict:
    """JSON Schema of a scenario file, for editor completion and validation (`latscope schema`)."""
    schema = Scenario.model_json_schema(by_alias=True)
    schema.pop("title", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "latscope scenario", **schema}


_REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"authorization|api[-_]?key|token|cookie|secret|passw(or)?d|credential", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<user>://[^/@:\s]*:)(?P<password>[^/@\s]+)@")
_QUERY_PARAM = re.compile(r"(?P<key>[?&][^=&#\s]*=)(?P<value>[^&#\s]*)")


def _is_secret_path(path: DataPath) -> bool:
    """A value in a header or env mapping (target, launch, class, action) whose name looks like a credential."""
    secret_maps = (("target", "headers"), ("target", "launch", "env"))
    if path == ("target", "api_key"):
        return True
    in_map = (path[:-1] in secret_maps
              or (len(path) == 5 and path[:2] == ("workload", "classes") and path[3] == "headers")
              or (len(path) == 4 and path[0] == "actions" and path[2] == "env")
              or (len(path) == 5 and path[0] == "actions" and path[2:4] == ("http", "headers")))
    return in_map and bool(_SECRET_NAME.search(str(path[-1])))


def _redact_url(text: str) -> str:
    """The password of a URL's userinfo, and query parameters named like credentials, redacted."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['user']}{_REDACTED}@", text)
    return _QUERY_PARAM.sub(lambda m: m["key"] + (_REDACTED if _SECRET_NAME.search(m["key"]) and m["value"] else m["value"]), text)


def redacted_yaml(scenario: Scenario) -> str:
    """The resolved scenario (defaults filled in, overrides applied) as YAML, safe to share.

    Values that came from `${VAR}` are written back as written (`Bearer ${API_KEY}`), so the
    environment's secrets never reach the results and the file still works with the same
    environment. Credential-like header and env values written literally become "<redacted>", and
    URL passwords too. Secrets elsewhere (say, in `launch.command`) are not detected.
    """
    data = scenario.model_dump(mode="json", by_alias=True)
    templates = scenario._templates

    def visit(value: Any, path: DataPath) -> Any:
        if path in templates:
            value = templates[path]
            if _is_secret_path(path):  # a template's default may be a literal secret
                value = re.sub(r"(\$\{[A-Za-z_][A-Za-z0-9_]*:-)[^}]+\}", rf"\g<1>{_REDACTED}}}", value)
        elif _is_secret_path(path) and isinstance(value, str):
            value = _REDACTED
        if isinstance(value, str) and (path in (("target", "url"), ("target", "launch", "ready_url"))
                                       or path[:2] == ("telemetry", "prometheus") and path[-1:] == ("url",)
                                       or path[:1] == ("actions",) and path[2:] == ("http", "url")):
            value = _redact_url(value)
        if isinstance(value, dict):
            return {k: visit(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v, (*path, i)) for i, v in enumerate(value)]
        return value

    header = f"# latscope scenario, resolved from {scenario.source or 'a dict'}; relative paths are relative to {scenario.base_dir}\n"
    return header + yaml.safe_dump(visit(data, ()), sort_keys=False, allow_unicode=True, width=100)
