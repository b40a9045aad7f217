"""GPU and host telemetry sampled during a run, written to telemetry.parquet (t_s, source,
device, metric, value) on the run's clock.

Every source writes the same metric names (TELEMETRY_METRICS in results/schema.py: name -> label,
unit), so the report and the analysis need not know where a sample came from. Sources, each a `Sampler` on its own thread
(session.py runs them for one run):

| source | module | samples |
| --- | --- | --- |
| `nvml` | nvml.py | local NVIDIA GPUs (GPM bandwidth and SM metrics where the GPU has them) |
| `host` | host.py | CPU and memory of latscope's own processes, and each worker's event-loop lag |
| a Prometheus source's name | prometheus.py | any /metrics page through a mapping (mappings.py: DCGM, vLLM, SGLang, TGI, llama.cpp, Triton, the reference server) |

A new source is a `Sampler` in a module of its own, a field under the scenario's `telemetry:`
(latscope/scenario/telemetry.py) and an arm in `TelemetrySession.from_config`.
"""

from __future__ import annotations

from typing import Protocol

Sample = tuple[str, str, float]
"""(device, metric, value): one reading of a sampler, e.g. ("gpu0", "power_w", 312.5)."""


class Sampler(Protocol):
    """What every telemetry source is. `sample()` is called from the source's own sampling thread
    (see session.py), never from the run's collect loop, so it may block — up to its own timeout."""

    name: str  # the `source` column: "nvml", "host", or the Prometheus source's name

    def sample(self) -> list[Sample]:
        """The readings of this instant. Raises on a failed read (the session records a gap)."""
        ...

    def close(self) -> None: ...


class TelemetryUnavailable(Exception):
    """A source cannot sample on this host (no NVIDIA driver, no GPU, ...): the run goes on without it."""
