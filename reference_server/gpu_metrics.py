"""GPU metrics on /metrics, read from NVML at scrape time, when this host has an NVIDIA GPU.

Reading at scrape time (a Prometheus collector) rather than from a sampling thread keeps the server
free of background work: the numbers are as fresh as the scrape interval asks. No driver, no GPU or
no nvidia-ml-py: one log line at start-up and no GPU series, never an error.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "latscope_ref_gpu"


class GpuCollector(Collector):
    """Utilization, memory-bandwidth utilization, memory used and power of every visible GPU."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        families = {
            "util": GaugeMetricFamily(f"{PREFIX}_utilization_percent",
                                      "NVML utilization.gpu: percent of time a kernel was running", labels=["gpu"]),
            "membw": GaugeMetricFamily(f"{PREFIX}_memory_bandwidth_utilization_percent",
                                       "NVML utilization.memory: percent of time device memory was read or written "
                                       "(DCGM's MEM_COPY_UTIL)", labels=["gpu"]),
            "mem": GaugeMetricFamily(f"{PREFIX}_memory_used_bytes", "Device memory in use", labels=["gpu"]),
            "power": GaugeMetricFamily(f"{PREFIX}_power_watts", "Board power draw", labels=["gpu"]),
        }
        for index, handle in enumerate(self.handles):
            label = [str(index)]
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                power_mw = nvml.nvmlDeviceGetPowerUsage(handle)
            except nvml.NVMLError as exc:  # a GPU that fell off the bus: skip it this scrape, say why
                log.warning("GPU %d: NVML read failed: %s", index, exc)
                continue
            families["util"].add_metric(label, rates.gpu)
            families["membw"].add_metric(label, rates.memory)
            families["mem"].add_metric(label, memory.used)
            families["power"].add_metric(label, power_mw / 1000)
        yield from families.values()


def gpu_collector(nvml: ModuleType | None = None) -> GpuCollector | None:
    """A collector for this host's GPUs, or None (logged with the reason) when there are none."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        collector = GpuCollector(nvml)
    except ImportError:
        log.info("GPU metrics off: nvidia-ml-py is not installed")
        return None
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses per driver state; all mean "no GPU here"
        log.info("GPU metrics off: NVML unavailable (%s)", exc)
        return None
    if not collector.handles:
        log.info("GPU metrics off: NVML sees no GPU")
        return None
    log.info("GPU metrics on: %d GPU(s) via NVML", len(collector.handles))
    return collector
