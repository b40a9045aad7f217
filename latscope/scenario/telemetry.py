"""The `telemetry:` section: what is sampled during the run (latscope/telemetry/ does the sampling)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from latscope.scenario.base import URL_CREDENTIALS, Duration, Model, PositiveDuration, check_http_url, check_unique


PROMETHEUS_MAPPINGS = ("dcgm", "triton", "reference-server", "vllm", "sglang", "tgi", "llama.cpp")


class PrometheusMetric(Model):
    """How one exported sample becomes a telemetry metric: its name in telemetry.parquet (one of
    results.schema.TELEMETRY_METRICS for GPU metrics, SERVER_SIGNALS for an inference server's, or a
    name of its own), a scale, the label naming the device, how series of one device combine, and
    what kind of value it is. A gauge is written as it is; the other kinds compare two scrapes:
    `rate` (a counter, per second), `per` (this counter's increase over that counter's: a mean per
    event, e.g. Triton's queue microseconds per request), and, for a histogram (the exported name is
    the family's, without _bucket/_sum/_count), `quantile` (interpolated in the buckets' increase, as
    Prometheus's histogram_quantile does) or `mean` (increase of _sum over increase of _count)."""

    metric: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    scale: float = 1.0
    rate: bool = False
    per: str | None = Field(None, min_length=1)
    quantile: Annotated[float, Field(gt=0, lt=1)] | None = None
    mean: bool = False
    device_label: str | None = None
    aggregate: Literal["sum", "mean", "max"] = "sum"

    @model_validator(mode="after")
    def _one_kind(self) -> PrometheusMetric:
        kinds = [k for k, on in (("rate", self.rate), ("per", self.per is not None),
                                 ("quantile", self.quantile is not None), ("mean", self.mean)) if on]
        if len(kinds) > 1:
            raise ValueError(f"a metric is one kind of value: choose one of {', '.join(kinds)}")
        return self

    @property
    def histogram(self) -> bool:
        """Read from a histogram's _bucket/_sum/_count samples."""
        return self.quantile is not None or self.mean


def _entries(name: str, entry: Any) -> list[PrometheusMetric]:
    """One exported name's entries: a PrometheusMetric (or its fields) or a list of them (one
    exported sample can feed several metrics: a histogram's p50 and p99, say)."""
    out = []
    for one in entry if isinstance(entry, list) else [entry]:
        try:
            out.append(one if isinstance(one, PrometheusMetric) else PrometheusMetric.model_validate(one))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"{name}{'.' + where if where else ''}: {first['msg']}") from None
    if not out:
        raise ValueError(f"{name}: an empty list maps the sample to nothing")
    return out


class PrometheusSource(Model):
    """A Prometheus endpoint scraped during the run (DCGM exporter, Triton, the reference server's
    /metrics): a shipped mapping by name, or {exported name: PrometheusMetric}."""

    name: str = Field("prometheus", pattern=r"^[A-Za-z0-9_.-]+$")  # the `source` column
    url: Annotated[str, URL_CREDENTIALS]
    # A shipped mapping's name or an inline {name: PrometheusMetric}; checked by _mapping (a pydantic
    # union would report every failed branch of it).
    mapping: Annotated[
        str | dict[str, Any],
        WithJsonSchema({"anyOf": [{"enum": list(PROMETHEUS_MAPPINGS)},
                                  {"type": "object", "additionalProperties": {"anyOf": [
                                      PrometheusMetric.model_json_schema(),
                                      {"type": "array", "items": PrometheusMetric.model_json_schema()}]}}]}),
    ] = "reference-server"
    timeout: PositiveDuration = 2.0  # one scrape; a slower endpoint is a gap in its samples
    interval: PositiveDuration | None = None  # default: telemetry.interval

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_http_url(url)

    @field_validator("mapping")
    @classmethod
    def _mapping(cls, mapping: str | dict) -> str | dict[str, PrometheusMetric]:
        if isinstance(mapping, str):
            if mapping not in PROMETHEUS_MAPPINGS:
                raise ValueError(f"expected one of {', '.join(PROMETHEUS_MAPPINGS)} or an inline mapping")
            return mapping
        if not mapping:
            raise ValueError(f"an inline mapping needs at least one metric (or name one of {', '.join(PROMETHEUS_MAPPINGS)})")
        out: dict[str, PrometheusMetric | list[PrometheusMetric]] = {}
        for name, entry in mapping.items():
            entries = _entries(name, entry)
            out[name] = entries if isinstance(entry, list) else entries[0]
        return out


def _one_or_list(value: Any) -> Any:
    """`prometheus: {url: ..., mapping: vllm}`: one source without the list around it."""
    return [value] if isinstance(value, dict) else value


class Telemetry(Model):
    """What is sampled during the run, every `interval`: local GPUs through NVML (`auto`: when NVML
    starts, else one warning; `true`: the run fails without it), latscope's own CPU, memory and
    event-loop lag (`host`), and Prometheus endpoints."""

    interval: Annotated[Duration, Field(ge=0.05)] = 0.25
    nvml: Literal["auto", True, False] = "auto"
    host: bool = True
    # One source as a mapping, or a list of them (the one-line form: `prometheus: {url: ..., mapping: vllm}`).
    prometheus: Annotated[
        list[PrometheusSource],
        BeforeValidator(_one_or_list, json_schema_input_type=PrometheusSource | list[PrometheusSource]),
    ] = []

    @field_validator("prometheus")
    @classmethod
    def _unique_sources(cls, sources: list[PrometheusSource]) -> list[PrometheusSource]:
        names = [s.name for s in sources]
        check_unique(names, "prometheus source")
        for reserved in ("nvml", "host"):
            if reserved in names:
                raise ValueError(f"{reserved!r} is the name of a built-in telemetry source; name the prometheus source otherwise")
        return sources
