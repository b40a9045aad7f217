"""Shipped Prometheus mappings: which exported metric becomes which telemetry metric.

A mapping is plain data, the same shape a scenario may give inline:

    {exported sample name: {"metric": name written to telemetry.parquet,
                            "scale": multiplier (default 1),
                            "rate": True for a counter to write as a per-second rate between scrapes,
                            "device_label": label whose value names the device (default: none),
                            "aggregate": "sum" | "mean" | "max" over series of the same device (default sum)}}

A counter's name matches with or without `_total`. GPU metrics use the names of
`latscope.results.schema.TELEMETRY_METRICS`; other metrics (queue depth, request rates) keep names of their own.
`DEVICE_HEADER` names a response header that identifies the answering process, for series without
a device label (the reference server's replicas each serve their own /metrics on one port).
"""

from __future__ import annotations

MiB = 1024 * 1024

# NVIDIA DCGM exporter (dcgm-exporter), fields of its default and profiling counter sets.
# PROF_* ratios are 0..1; FB_USED is MiB; PROF_PCIE_*_BYTES are already bytes per second.
DCGM: dict[str, dict] = {
    "DCGM_FI_DEV_GPU_UTIL": {"metric": "gpu_util_pct", "device_label": "gpu"},
    "DCGM_FI_PROF_DRAM_ACTIVE": {"metric": "mem_bw_util_pct", "scale": 100.0, "device_label": "gpu"},
    "DCGM_FI_DEV_MEM_COPY_UTIL": {"metric": "mem_util_pct", "device_label": "gpu"},
    "DCGM_FI_PROF_SM_ACTIVE": {"metric": "sm_active_pct", "scale": 100.0, "device_label": "gpu"},
    "DCGM_FI_PROF_SM_OCCUPANCY": {"metric": "sm_occupancy_pct", "scale": 100.0, "device_label": "gpu"},
    "DCGM_FI_DEV_FB_USED": {"metric": "mem_used_bytes", "scale": MiB, "device_label": "gpu"},
    "DCGM_FI_DEV_POWER_USAGE": {"metric": "power_w", "device_label": "gpu"},
    "DCGM_FI_DEV_SM_CLOCK": {"metric": "sm_clock_mhz", "device_label": "gpu"},
    "DCGM_FI_DEV_GPU_TEMP": {"metric": "temp_c", "device_label": "gpu"},
    "DCGM_FI_PROF_PCIE_RX_BYTES": {"metric": "pcie_rx_bytes_s", "device_label": "gpu"},
    "DCGM_FI_PROF_PCIE_TX_BYTES": {"metric": "pcie_tx_bytes_s", "device_label": "gpu"},
}

# Triton Inference Server's /metrics (port 8002). GPU utilization is 0..1; GPUs are named by UUID.
TRITON: dict[str, dict] = {
    "nv_gpu_utilization": {"metric": "gpu_util_pct", "scale": 100.0, "device_label": "gpu_uuid"},
    "nv_gpu_memory_used_bytes": {"metric": "mem_used_bytes", "device_label": "gpu_uuid"},
    "nv_gpu_power_usage": {"metric": "power_w", "device_label": "gpu_uuid"},
    "nv_inference_request_success": {"metric": "requests_s", "rate": True},
    "nv_inference_request_failure": {"metric": "request_failures_s", "rate": True},
    "nv_inference_count": {"metric": "inferences_s", "rate": True},
    "nv_inference_exec_count": {"metric": "executions_s", "rate": True},
    "nv_inference_pending_request_count": {"metric": "queue_depth"},
}

# latscope's reference server (reference_server/metrics.py, gpu_metrics.py). Its
# `memory_bandwidth_utilization_percent` is NVML's utilization.memory: mem_util_pct, not bandwidth.
REFERENCE_SERVER: dict[str, dict] = {
    "latscope_ref_gpu_utilization_percent": {"metric": "gpu_util_pct", "device_label": "gpu"},
    "latscope_ref_gpu_memory_bandwidth_utilization_percent": {"metric": "mem_util_pct", "device_label": "gpu"},
    "latscope_ref_gpu_memory_used_bytes": {"metric": "mem_used_bytes", "device_label": "gpu"},
    "latscope_ref_gpu_power_watts": {"metric": "power_w", "device_label": "gpu"},
    "latscope_ref_queue_depth": {"metric": "queue_depth"},
    "latscope_ref_in_flight_requests": {"metric": "in_flight_requests"},
    "latscope_ref_active_sequences": {"metric": "active_sequences"},
    "latscope_ref_waiting_sequences": {"metric": "waiting_sequences"},
    "latscope_ref_requests": {"metric": "requests_s", "rate": True},
    "latscope_ref_generated_tokens": {"metric": "generated_tokens_s", "rate": True},
}

MAPPINGS: dict[str, dict[str, dict]] = {"dcgm": DCGM, "triton": TRITON, "reference-server": REFERENCE_SERVER}
DEVICE_HEADER: dict[str, str] = {"reference-server": "X-Replica-Id"}
