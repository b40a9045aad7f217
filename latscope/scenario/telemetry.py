"""The `telemetry:` section: what is sampled during the run (latscope/telemetry/ does the sampling)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, WithJsonSchema, field_validator

from latscope.scenario.base import URL_CREDENTIALS, Duration, Model, PositiveDuration, check_http_url, check_unique


PROMETHEUS_MAPPINGS = ("dcgm", "triton", "reference-server")


class PrometheusMetric(Model):
    """How one exported sample becomes a telemetry metric: its name in telemetry.parquet (one of
    results.schema.TELEMETRY_METRICS for GPU metrics, or a name of its own), a scale, whether it is a
    counter to turn into a per-second rate, the label naming the device, and how series of one
    device combine."""

    metric: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    scale: float = 1.0
    rate: bool = False
    device_label: str | None = None
    aggregate: Literal["sum", "mean", "max"] = "sum"


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
                                  {"type": "object", "additionalProperties": PrometheusMetric.model_json_schema()}]}),
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
        out = {}
        for name, entry in mapping.items():
            try:
                out[name] = entry if isinstance(entry, PrometheusMetric) else PrometheusMetric.model_validate(entry)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"{name}{'.' + where if where else ''}: {first['msg']}") from None
        return out


class Telemetry(Model):
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
        check_unique(names, "prometheus source")
        for reserved in ("nvml", "host"):
            if reserved in names:
                raise ValueError(f"{reserved!r} is the name of a built-in telemetry source; name the prometheus source otherwise")
        return sources
