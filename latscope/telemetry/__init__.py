"""GPU and host telemetry sampled during a run, written to telemetry.parquet (t_s, source,
device, metric, value) on the run's clock.

Every source writes the same metric names, so the report and the analysis need not know where a
sample came from:
"""

from __future__ import annotations

from typing import Protocol

# name -> (label, unit). A source writes only what it can measure.
METRICS: dict[str, tuple[str, str]] = {
    "gpu_util_pct": ("GPU utilization", "%"),
    "mem_bw_util_pct": ("Memory-bandwidth utilization (DRAM, GPM)", "%"),
    "mem_util_pct": ("Memory-controller busy (NVML memory utilization, not bandwidth)", "%"),
    "sm_active_pct": ("SM activity", "%"),
    "sm_occupancy_pct": ("SM occupancy", "%"),
    "mem_used_bytes": ("GPU memory used", "B"),
    "power_w": ("Power", "W"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "pcie_rx_bytes_s": ("PCIe receive", "B/s"),
    "pcie_tx_bytes_s": ("PCIe transmit", "B/s"),
    "temp_c": ("Temperature", "°C"),
    "cpu_pct": ("CPU", "% of one core"),
    "rss_bytes": ("Resident memory", "B"),
    "loop_lag_p99_ms": ("Event-loop lag p99", "ms"),
}

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
