"""A fake NVML module (the subset of pynvml that latscope.telemetry.nvml calls), for hosts without an
NVIDIA GPU. Each GPU's readings are plain attributes a test sets; GPM metrics between two samples
are computed from a per-GPU counter of "DRAM busy" so that two samples are needed, as with the real
library. The error classes are pynvml's own, so `except nvml.NVMLError_NotSupported` means the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVML_SUCCESS = pynvml.NVML_SUCCESS
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
NVML_GPM_METRIC_DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
NVML_GPM_METRIC_SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    gpm: bool = True
    util_gpu: int = 87
    util_memory: int = 41
    mem_used: int = 30 * 2**30
    mem_total: int = 80 * 2**30
    power_mw: int = 312_500
    sm_clock: int = 1980
    temp: int = 64
    pcie_rx_kb: int = 2_000  # KB/s
    pcie_tx_kb: int = 500
    no_pcie: bool = False  # NVML answers NotSupported
    # GPM: cumulative "active" counters; a metric is the share of the sample gap spent active.
    dram_active: float = 0.0
    sm_active: float = 0.0
    occupancy: float = 0.0
    ticks: float = 0.0
    gpm_fails: bool = False


@dataclass
class _Sample:
    gpu: FakeGpu | None = None
    values: tuple = ()
    freed: bool = False


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(8)]


@dataclass
class FakeNvml:
    """The module object: `FakeNvml(gpus=[FakeGpu()])`, or `FakeNvml(init_error=...)` for no driver."""

    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    init_error: Exception | None = None
    initialised: bool = False
    shutdowns: int = 0
    samples: list[_Sample] = field(default_factory=list)
    driver: bytes = b"550.54.15"

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __getattr__(self, name: str):  # the NVML_* constants
        if name.startswith("NVML_"):
            return globals()[name]
        raise AttributeError(name)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, g: FakeGpu) -> str:
        return g.name

    def nvmlDeviceGetUUID(self, g: FakeGpu) -> bytes:
        return g.uuid.encode()

    def nvmlDeviceGetUtilizationRates(self, g: FakeGpu):
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetMemoryInfo(self, g: FakeGpu):
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetPowerUsage(self, g: FakeGpu) -> int:
        return g.power_mw

    def nvmlDeviceGetClockInfo(self, g: FakeGpu, clock: int) -> int:
        assert clock == NVML_CLOCK_SM
        return g.sm_clock

    def nvmlDeviceGetTemperature(self, g: FakeGpu, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return g.temp

    def nvmlDeviceGetPcieThroughput(self, g: FakeGpu, counter: int) -> int:
        if g.no_pcie:
            raise NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.pcie_rx_kb if counter == NVML_PCIE_UTIL_RX_BYTES else g.pcie_tx_kb

    # -- GPM ----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, g: FakeGpu):
        return SimpleNamespace(version=1, isSupportedDevice=int(g.gpm))

    def nvmlGpmSampleAlloc(self) -> _Sample:
        sample = _Sample()
        self.samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: _Sample) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, g: FakeGpu, sample: _Sample) -> _Sample:
        if g.gpm_fails:
            raise NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        sample.gpu, sample.values = g, (g.ticks, g.dram_active, g.sm_active, g.occupancy)
        return sample

    def nvmlGpmMetricsGet(self, request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        a, b = request.sample1, request.sample2
        assert request.version == NVML_GPM_METRICS_GET_VERSION and a.gpu is b.gpu and not (a.freed or b.freed)
        span = b.values[0] - a.values[0]
        by_id = {NVML_GPM_METRIC_DRAM_BW_UTIL: 1, NVML_GPM_METRIC_SM_UTIL: 2, NVML_GPM_METRIC_SM_OCCUPANCY: 3}
        for m in request.metrics[: request.numMetrics]:
            k = by_id[m.metricId]
            m.value = 100.0 * (b.values[k] - a.values[k]) / span if span else 0.0
            m.nvmlReturn = NVML_SUCCESS if span else pynvml.NVML_ERROR_UNKNOWN
        return request

    def advance(self, g: FakeGpu, seconds: float, dram: float, sm: float, occupancy: float) -> None:
        """Let `seconds` pass on GPU `g` with these busy fractions (0..1)."""
        g.ticks += seconds
        g.dram_active += dram * seconds
        g.sm_active += sm * seconds
        g.occupancy += occupancy * seconds
