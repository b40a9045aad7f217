"""The NVML sampler against a fake NVML module (this VM has no GPU), and the real pynvml's no-driver path."""

from __future__ import annotations

import logging
import time

import pandas as pd
import pynvml
import pytest

from latscope.errors import RunError
from latscope.results import EventLog, read_events
from latscope.scenario import Telemetry as TelemetryConfig
from latscope.results.schema import TELEMETRY_METRICS as METRICS
from latscope.telemetry import TelemetryUnavailable
from latscope.telemetry.nvml import open_nvml
from latscope.telemetry.session import TelemetrySession

from fake_nvml import FakeGpu, FakeNvml


def readings(sampler) -> dict[tuple[str, str], float]:
    return {(device, metric): value for device, metric, value in sampler.sample()}


def test_gpm_gpu_reports_dram_bandwidth_and_sm_metrics_between_two_samples():
    gpu = FakeGpu(gpm=True)
    nvml = FakeNvml(gpus=[gpu])
    sampler = open_nvml(nvml)
    nvml.advance(gpu, 0.25, dram=0.62, sm=0.91, occupancy=0.33)
    r = readings(sampler)
    assert r[("gpu0", "mem_bw_util_pct")] == pytest.approx(62.0)
    assert r[("gpu0", "sm_active_pct")] == pytest.approx(91.0)
    assert r[("gpu0", "sm_occupancy_pct")] == pytest.approx(33.0)
    assert ("gpu0", "mem_util_pct") not in r  # GPM measured bandwidth: the coarse counter is not written
    assert r[("gpu0", "gpu_util_pct")] == 87.0
    assert r[("gpu0", "power_w")] == 312.5  # mW -> W
    assert r[("gpu0", "pcie_rx_bytes_s")] == 2_000 * 1024  # KB/s -> B/s
    assert r[("gpu0", "pcie_tx_bytes_s")] == 500 * 1024
    assert r[("gpu0", "mem_used_bytes")] == 30 * 2**30
    assert r[("gpu0", "sm_clock_mhz")] == 1980 and r[("gpu0", "temp_c")] == 64
    assert {metric for _, metric in r} <= METRICS.keys()
    # The next sample covers only the time since this one (the two GPM buffers swap).
    nvml.advance(gpu, 0.25, dram=0.10, sm=0.20, occupancy=0.05)
    r = readings(sampler)
    assert r[("gpu0", "mem_bw_util_pct")] == pytest.approx(10.0)
    assert r[("gpu0", "sm_active_pct")] == pytest.approx(20.0)
    sampler.close()
    assert all(s.freed for s in nvml.samples) and len(nvml.samples) == 2 and nvml.shutdowns == 1


def test_gpu_without_gpm_writes_memory_utilization_labelled_as_such():
    nvml = FakeNvml(gpus=[FakeGpu(gpm=False, util_memory=41), FakeGpu(gpm=True)])
    sampler = open_nvml(nvml)
    r = readings(sampler)
    assert r[("gpu0", "mem_util_pct")] == 41.0
    assert ("gpu0", "mem_bw_util_pct") not in r and ("gpu0", "sm_active_pct") not in r
    assert ("gpu1", "mem_util_pct") not in r  # the GPM GPU next to it still measures bandwidth
    assert [s.gpu for s in nvml.samples if s.gpu is not None] == [nvml.gpus[1]] * 2


def test_unsupported_reads_are_skipped_and_a_failing_gpm_falls_back_to_the_counter(caplog):
    gpu = FakeGpu(gpm=True, no_pcie=True)
    nvml = FakeNvml(gpus=[gpu])
    sampler = open_nvml(nvml)
    nvml.advance(gpu, 0.25, dram=0.5, sm=0.5, occupancy=0.5)
    r = readings(sampler)
    assert ("gpu0", "pcie_rx_bytes_s") not in r and ("gpu0", "power_w") in r
    gpu.gpm_fails = True
    with caplog.at_level(logging.WARNING):
        r = readings(sampler)
    assert ("gpu0", "mem_bw_util_pct") not in r
    assert "GPM on GPU 0 failed" in caplog.text
    assert all(s.freed for s in nvml.samples)
    r = readings(sampler)
    assert r[("gpu0", "mem_util_pct")] == gpu.util_memory and ("gpu0", "mem_bw_util_pct") not in r


def test_environment_lists_each_gpu():
    nvml = FakeNvml(gpus=[FakeGpu(), FakeGpu(name="NVIDIA L4", uuid="GPU-l4", gpm=False, mem_total=23 * 2**30)])
    gpus = open_nvml(nvml).environment()
    assert gpus == [
        {"index": 0, "device": "gpu0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-1111-2222-3333-444444444444",
         "memory_total_bytes": 80 * 2**30, "driver": "550.54.15", "gpm": True},
        {"index": 1, "device": "gpu1", "name": "NVIDIA L4", "uuid": "GPU-l4", "memory_total_bytes": 23 * 2**30,
         "driver": "550.54.15", "gpm": False},
    ]


def test_no_gpu_is_unavailable_not_an_error():
    with pytest.raises(TelemetryUnavailable, match="no GPU"):
        open_nvml(FakeNvml(gpus=[]))


def real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(real_nvml_works(), reason="this host has a working NVIDIA driver")
def test_real_pynvml_without_a_driver_is_one_event_and_one_warning(tmp_path, caplog):
    events = EventLog(tmp_path / "events.jsonl")
    with caplog.at_level(logging.WARNING, logger="latscope.telemetry"):
        telemetry = TelemetrySession.from_config(TelemetryConfig(nvml="auto", host=False), events, 1.0)
        telemetry.start(0)
        telemetry.stop()
    events.close()
    unavailable = [e for e in read_events(tmp_path) if e["event"] == "telemetry_unavailable"]
    assert len(unavailable) == 1 and unavailable[0]["source"] == "nvml"
    assert "NVML" in unavailable[0]["reason"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no nvml samples" in warnings[0].getMessage()
    assert telemetry.gpus == [] and telemetry.samplers == []


def test_nvml_true_without_nvml_fails_the_run_before_it_starts(tmp_path):
    events = EventLog(tmp_path / "events.jsonl")
    with pytest.raises(RunError, match="telemetry.nvml is true"):
        TelemetrySession.from_config(TelemetryConfig(nvml=True), events, 1.0,
                              nvml=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))


def test_a_fake_gpu_is_sampled_on_its_thread_and_written(tmp_path):
    events = EventLog(tmp_path / "events.jsonl")
    nvml = FakeNvml(gpus=[FakeGpu(gpm=False)])
    telemetry = TelemetrySession.from_config(TelemetryConfig(interval=0.05, host=False), events, 1.0, nvml=nvml)
    assert telemetry.gpus[0]["uuid"].startswith("GPU-")
    t0 = time.perf_counter_ns()
    telemetry.start(t0)
    time.sleep(0.5)
    telemetry.stop()
    telemetry.write(tmp_path)
    df = pd.read_parquet(tmp_path / "telemetry.parquet")
    util = df[(df.metric == "gpu_util_pct")]
    assert set(df.source) == {"nvml"} and set(df.device) == {"gpu0"}
    assert 5 <= len(util) <= 12  # 0.5 s at 20 Hz, with room for a slow CI machine
    assert (util.value == 87.0).all() and util.t_s.between(0, 0.6).all() and util.t_s.is_monotonic_increasing
    assert nvml.shutdowns == 1


@pytest.mark.skipif(not real_nvml_works(), reason="needs an NVIDIA driver and GPU (runs on the device machine)")
def test_real_nvml_samples_every_gpu_of_this_host():
    # The real nvidia-ml-py against a real driver: every GPU named, and each sample carries
    # utilization, memory in use and power with physically possible values.
    sampler = open_nvml()
    try:
        gpus = sampler.environment()
        assert gpus and all(g["name"] for g in gpus)
        time.sleep(0.3)  # GPM metrics are the difference of two samples
        sampler.sample()
        time.sleep(0.3)
        samples = sampler.sample()
    finally:
        sampler.close()
    by_metric: dict[str, list[float]] = {}
    for device, metric, value in samples:
        assert device.startswith("gpu")
        by_metric.setdefault(metric, []).append(value)
    assert len(by_metric["gpu_util_pct"]) == len(gpus)
    assert all(0 <= v <= 100 for v in by_metric["gpu_util_pct"])
    assert all(v > 0 for v in by_metric["mem_used_bytes"]) and all(v > 0 for v in by_metric["power_w"])
