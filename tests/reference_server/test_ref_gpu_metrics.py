"""GPU series on /metrics: against a fake NVML (no GPU here), and the real nvidia-ml-py without a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prometheus_client import CollectorRegistry, generate_latest

from reference_server.gpu_metrics import gpu_collector


class NVMLError(Exception):
    pass


def fake_nvml(gpus: int, init_error: bool = False, broken: int | None = None) -> SimpleNamespace:
    def init() -> None:
        if init_error:
            raise NVMLError("Driver Not Loaded")

    def utilization(handle: int):
        if handle == broken:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=40 + handle, memory=70 + handle)

    return SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=init, nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(h + 1) * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 250_500 + h * 1000,
    )


def scrape(collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_every_gpu_gets_utilization_bandwidth_memory_and_power():
    text = scrape(gpu_collector(fake_nvml(2)))
    assert 'latscope_ref_gpu_utilization_percent{gpu="0"} 40.0' in text
    assert 'latscope_ref_gpu_memory_bandwidth_utilization_percent{gpu="1"} 71.0' in text
    assert 'latscope_ref_gpu_memory_used_bytes{gpu="1"} 2.147483648e+09' in text
    assert 'latscope_ref_gpu_power_watts{gpu="0"} 250.5' in text


def test_a_gpu_that_fails_to_answer_is_skipped_not_fatal():
    text = scrape(gpu_collector(fake_nvml(2, broken=0)))
    assert 'gpu="0"' not in text and 'latscope_ref_gpu_utilization_percent{gpu="1"} 41.0' in text


def test_no_driver_or_no_gpu_means_no_collector(caplog):
    caplog.set_level("INFO")
    assert gpu_collector(fake_nvml(1, init_error=True)) is None
    assert gpu_collector(fake_nvml(0)) is None
    assert "NVML unavailable (Driver Not Loaded)" in caplog.text and "NVML sees no GPU" in caplog.text


def test_real_nvml_on_this_host_never_raises():
    # With a GPU this is a collector (checked on a GPU machine by scraping /metrics); without one, None.
    collector = gpu_collector()
    assert collector is None or collector.handles


def test_real_nvml_gpus_are_on_metrics_when_there_is_a_gpu():
    collector = gpu_collector()
    if collector is None:
        pytest.skip("needs an NVIDIA driver and GPU (runs on the device machine)")
    text = scrape(collector)
    for i in range(len(collector.handles)):
        assert f'latscope_ref_gpu_utilization_percent{{gpu="{i}"}}' in text
        assert f'latscope_ref_gpu_power_watts{{gpu="{i}"}}' in text
