"""Local NVIDIA GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Per GPU and sample: utilization, memory used, power, SM clock, PCIe rx/tx, temperature, and — where
the GPU has GPM (GPU Performance Monitoring, Hopper and later) — DRAM-bandwidth utilization, SM
activity and SM occupancy, computed by NVML between the previous sample and this one. Without GPM
the only memory figure NVML has is `utilization.memory` (the share of time the memory controller
was busy — not bandwidth); it is written as `mem_util_pct`, never as `mem_bw_util_pct`.

The NVML module is a parameter, so tests pass a fake; the real one is `pynvml`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from latscope.telemetry import Sample, TelemetryUnavailable

log = logging.getLogger(__name__)

NAME = "nvml"
KIB = 1024  # nvmlDeviceGetPcieThroughput answers in KB/s (KiB: 1024 bytes)
# GPM metric id attribute of the NVML module -> our metric name
GPM_METRICS = (
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "mem_bw_util_pct"),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_pct"),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_pct"),
)


def _text(value: Any) -> str:
    """NVML strings come back as bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    gpm: list | None = None  # [previous sample, next sample] while GPM works on this GPU
    unsupported: set[str] = field(default_factory=set)  # reads this GPU refused with NotSupported


class NvmlSampler:
    """Samples every GPU NVML sees. Build it with `open_nvml`."""

    name = NAME

    def __init__(self, nvml: ModuleType, gpus: list[_Gpu]):
        self.nvml = nvml
        self.gpus = gpus

    # -- one sample ---------------------------------------------------------------------------

    def sample(self) -> list[Sample]:
        out: list[Sample] = []
        for gpu in self.gpus:
            device = f"gpu{gpu.index}"
            out += [(device, metric, value) for metric, value in self._basic(gpu)]
            if gpu.gpm is not None:
                out += [(device, metric, value) for metric, value in self._gpm(gpu)]
        return out

    def _read(self, gpu: _Gpu, what: str, read) -> Any:
        """read(), or None when this GPU does not support it (asked once, then skipped for the run)."""
        if what in gpu.unsupported:
            return None
        try:
            return read()
        except self.nvml.NVMLError_NotSupported:
            gpu.unsupported.add(what)
            log.info("NVML: GPU %d does not report %s", gpu.index, what)
            return None

    def _basic(self, gpu: _Gpu) -> list[tuple[str, float]]:
        nvml, h = self.nvml, gpu.handle
        out: list[tuple[str, float]] = []
        rates = self._read(gpu, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if rates is not None:
            out.append(("gpu_util_pct", float(rates.gpu)))
            if gpu.gpm is None:  # with GPM, DRAM bandwidth is measured properly instead
                out.append(("mem_util_pct", float(rates.memory)))
        memory = self._read(gpu, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        if memory is not None:
            out.append(("mem_used_bytes", float(memory.used)))
        readings = (
            ("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW
            ("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            ("temp_c", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            # Each PCIe read counts bytes over a 20 ms window inside the call.
            ("pcie_rx_bytes_s", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES) * KIB),
            ("pcie_tx_bytes_s", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES) * KIB),
        )
        for metric, read in readings:
            value = self._read(gpu, metric, read)
            if value is not None:
                out.append((metric, float(value)))
        return out

    def _gpm(self, gpu: _Gpu) -> list[tuple[str, float]]:
        """GPM metrics between the previous sample and one taken now. A GPU whose GPM stops working
        falls back to NVML's memory-utilization counter for the rest of the run (logged once)."""
        nvml = self.nvml
        previous, current = gpu.gpm
        try:
            nvml.nvmlGpmSampleGet(gpu.handle, current)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, current
            for i, (attr, _) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = getattr(nvml, attr)
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            log.warning("NVML: GPM on GPU %d failed (%s); using the memory-utilization counter instead", gpu.index, exc)
            _free_gpm(nvml, gpu)
            return []
        gpu.gpm = [current, previous]  # this sample is the next one's start
        return [
            (metric, float(request.metrics[i].value))
            for i, (_, metric) in enumerate(GPM_METRICS)
            if request.metrics[i].nvmlReturn == nvml.NVML_SUCCESS
        ]

    # -- environment and teardown -------------------------------------------------------------

    def environment(self) -> list[dict]:
        """summary.json's environment.gpus: index, name, uuid, memory_total_bytes, driver, gpm."""
        nvml = self.nvml
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            driver = None
        out = []
        for gpu in self.gpus:
            entry: dict[str, Any] = {"index": gpu.index, "device": f"gpu{gpu.index}"}
            for key, read in (
                ("name", lambda: _text(nvml.nvmlDeviceGetName(gpu.handle))),
                ("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(gpu.handle))),
                ("memory_total_bytes", lambda: int(nvml.nvmlDeviceGetMemoryInfo(gpu.handle).total)),
            ):
                try:
                    entry[key] = read()
                except nvml.NVMLError:
                    entry[key] = None
            entry["driver"] = driver
            entry["gpm"] = gpu.gpm is not None
            out.append(entry)
        return out

    def close(self) -> None:
        for gpu in self.gpus:
            _free_gpm(self.nvml, gpu)
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _free_gpm(nvml: ModuleType, gpu: _Gpu) -> None:
    for sample in gpu.gpm or ():
        try:
            nvml.nvmlGpmSampleFree(sample)
        except nvml.NVMLError:
            pass
    gpu.gpm = None


def _start_gpm(nvml: ModuleType, gpu: _Gpu) -> None:
    """Two GPM sample buffers and a first sample, when the GPU supports GPM (else gpu.gpm stays None).
    Drivers older than GPM lack the functions (NVMLError_FunctionNotFound): no GPM either."""
    try:
        if not nvml.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
            return
        gpu.gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        nvml.nvmlGpmSampleGet(gpu.handle, gpu.gpm[0])
    except (nvml.NVMLError, AttributeError) as exc:
        log.info("NVML: no GPM on GPU %d (%s)", gpu.index, exc)
        _free_gpm(nvml, gpu)


def open_nvml(nvml: ModuleType | None = None) -> NvmlSampler:
    """An NVML sampler over every visible GPU. Raises TelemetryUnavailable, with a reason a person
    can read, when nvidia-ml-py, the driver or a GPU is missing."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            raise TelemetryUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # LibraryNotFound, DriverNotLoaded, NoPermission, ...
        raise TelemetryUnavailable(f"NVML did not start: {exc}; no NVIDIA driver or GPU on this host?") from None
    try:
        gpus = [_Gpu(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    except nvml.NVMLError as exc:
        nvml.nvmlShutdown()
        raise TelemetryUnavailable(f"NVML could not list the GPUs: {exc}") from None
    if not gpus:
        nvml.nvmlShutdown()
        raise TelemetryUnavailable("NVML sees no GPU")
    for gpu in gpus:
        _start_gpm(nvml, gpu)
    return NvmlSampler(nvml, gpus)
