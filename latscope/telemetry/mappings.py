"""Shipped Prometheus mappings: which exported metric becomes which telemetry metric.

A mapping is plain data, the same shape a scenario may give inline:

    {exported name: entry, or a list of entries (one exported sample feeding several metrics)}
    entry = {"metric": name written to telemetry.parquet,
             "scale": multiplier (default 1),
             "rate": True for a counter to write as a per-second rate between scrapes,
             "per": another counter: this counter's increase over that one's, between scrapes,
             "quantile": q (0 < q < 1) of a histogram's new observations between scrapes,
             "mean": True for a histogram's mean between scrapes (increase of _sum over _count),
             "device_label": label whose value names the device (default: none),
             "aggregate": "sum" | "mean" | "max" over series of the same device (default sum)}

A counter's name matches with or without `_total`; a histogram entry names the family (its samples
are `<name>_bucket{le=...}`, `<name>_sum`, `<name>_count`), and its series (labels other than
`le`) are merged by adding their buckets. When several exported names give one metric (an engine
that renamed a metric and exports both names for a while), the name listed first that the page has
wins, so nothing is counted twice.

GPU metrics use the names of `latscope.results.schema.TELEMETRY_METRICS`; an inference server's
own signals use `SERVER_SIGNALS` (requests running and waiting, KV-cache usage in %, preemptions,
prefix cache and token rates, batch size, and its TTFT / queue-time / end-to-end histograms as
per-scrape p50, p99 and mean in ms: `histogram_ms`). Each mapping cites where its names are
documented. `DEVICE_HEADER` names a response header that identifies the answering process, for
series without a device label (the reference server's replicas each serve their own /metrics on
one port).
"""

from __future__ import annotations

MiB = 1024 * 1024
SECONDS_TO_MS = 1000.0
US_TO_MS = 0.001


def histogram_ms(signal: str, to_ms: float) -> list[dict]:
    """A latency histogram as three per-scrape metrics in ms: `<signal>_p50_ms`, `<signal>_p99_ms`
    (interpolated in the buckets, telemetry/histograms.py) and `<signal>_mean_ms` (exact, from
    _sum/_count). `to_ms`: the exported unit in ms (1000 for seconds)."""
    return [{"metric": f"{signal}_p50_ms", "quantile": 0.5, "scale": to_ms},
            {"metric": f"{signal}_p99_ms", "quantile": 0.99, "scale": to_ms},
            {"metric": f"{signal}_mean_ms", "mean": True, "scale": to_ms}]


# NVIDIA DCGM exporter (dcgm-exporter), fields of its default and profiling counter sets.
# PROF_* ratios are 0..1; FB_USED is MiB; PROF_PCIE_*_BYTES are already bytes per second.
DCGM: dict[str, dict | list[dict]] = {
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
# https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html
# Its latencies are cumulative microsecond counters ("Latencies" table: request, queue, compute input /
# infer / output durations), so a scrape-to-scrape mean per successful request is the most they give;
# the first-response histogram (ms) exists with `--metrics-config histogram_latencies=true` (decoupled
# models; for a streaming LLM backend it is the first chunk, i.e. TTFT as the server sees it).
TRITON: dict[str, dict | list[dict]] = {
    "nv_gpu_utilization": {"metric": "gpu_util_pct", "scale": 100.0, "device_label": "gpu_uuid"},
    "nv_gpu_memory_used_bytes": {"metric": "mem_used_bytes", "device_label": "gpu_uuid"},
    "nv_gpu_power_usage": {"metric": "power_w", "device_label": "gpu_uuid"},
    "nv_inference_request_success": {"metric": "requests_s", "rate": True},
    "nv_inference_request_failure": {"metric": "request_failures_s", "rate": True},
    "nv_inference_count": {"metric": "inferences_s", "rate": True},
    "nv_inference_exec_count": {"metric": "executions_s", "rate": True},
    "nv_inference_pending_request_count": {"metric": "queue_depth"},
    "nv_inference_queue_duration_us": {"metric": "server_queue_time_mean_ms", "per": "nv_inference_request_success",
                                       "scale": US_TO_MS},
    "nv_inference_compute_infer_duration_us": {"metric": "server_compute_mean_ms", "per": "nv_inference_request_success",
                                               "scale": US_TO_MS},
    "nv_inference_request_duration_us": {"metric": "server_e2e_mean_ms", "per": "nv_inference_request_success",
                                         "scale": US_TO_MS},
    "nv_inference_first_response_histogram_ms": histogram_ms("server_ttft", 1.0),
}

# latscope's reference server (reference_server/metrics.py, gpu_metrics.py). Its
# `memory_bandwidth_utilization_percent` is NVML's utilization.memory: mem_util_pct, not bandwidth.
# Its request-duration histogram is left out: it is labelled by endpoint and holds the /metrics scrapes too.
REFERENCE_SERVER: dict[str, dict | list[dict]] = {
    "latscope_ref_gpu_utilization_percent": {"metric": "gpu_util_pct", "device_label": "gpu"},
    "latscope_ref_gpu_memory_bandwidth_utilization_percent": {"metric": "mem_util_pct", "device_label": "gpu"},
    "latscope_ref_gpu_memory_used_bytes": {"metric": "mem_used_bytes", "device_label": "gpu"},
    "latscope_ref_gpu_power_watts": {"metric": "power_w", "device_label": "gpu"},
    "latscope_ref_queue_depth": {"metric": "queue_depth"},
    "latscope_ref_in_flight_requests": {"metric": "in_flight_requests"},
    "latscope_ref_active_sequences": [{"metric": "active_sequences"}, {"metric": "requests_running"}],
    "latscope_ref_waiting_sequences": {"metric": "waiting_sequences"},
    "latscope_ref_requests": {"metric": "requests_s", "rate": True},
    "latscope_ref_generated_tokens": {"metric": "generation_tokens_s", "rate": True},
    "latscope_ref_prefix_cache_queries_tokens": [{"metric": "prefix_cache_queries_s", "rate": True},
                                                 {"metric": "prompt_tokens_s", "rate": True}],
    "latscope_ref_prefix_cache_hits_tokens": {"metric": "prefix_cache_hits_s", "rate": True},
    "latscope_ref_time_to_first_token_seconds": histogram_ms("server_ttft", SECONDS_TO_MS),
    "latscope_ref_queue_duration_seconds": histogram_ms("server_queue_time", SECONDS_TO_MS),
    "latscope_ref_compute_duration_seconds": {"metric": "server_compute_mean_ms", "mean": True, "scale": SECONDS_TO_MS},
    "latscope_ref_batch_size": {"metric": "batch_size", "mean": True},
}

# vLLM's OpenAI server, /metrics on its API port. https://docs.vllm.ai/en/stable/usage/metrics/ (the
# metric table; code: vllm/v1/metrics/loggers.py, before V1 vllm/engine/metrics.py). Labels: model_name
# and, in V1, engine (one per data-parallel engine): series are summed, KV-cache usage averaged, and
# histograms merged. Renames kept both ways (newer name first): gpu_cache_usage_perc became
# kv_cache_usage_perc, gpu_prefix_cache_{queries,hits} became prefix_cache_{queries,hits}.
VLLM: dict[str, dict | list[dict]] = {
    "vllm:num_requests_running": {"metric": "requests_running"},
    "vllm:num_requests_waiting": {"metric": "queue_depth"},
    "vllm:kv_cache_usage_perc": {"metric": "kv_cache_usage_pct", "scale": 100.0, "aggregate": "mean"},  # 1 = 100 %
    "vllm:gpu_cache_usage_perc": {"metric": "kv_cache_usage_pct", "scale": 100.0, "aggregate": "mean"},
    "vllm:num_preemptions": {"metric": "preemptions_s", "rate": True},
    "vllm:prefix_cache_queries": {"metric": "prefix_cache_queries_s", "rate": True},  # in tokens
    "vllm:gpu_prefix_cache_queries": {"metric": "prefix_cache_queries_s", "rate": True},
    "vllm:prefix_cache_hits": {"metric": "prefix_cache_hits_s", "rate": True},
    "vllm:gpu_prefix_cache_hits": {"metric": "prefix_cache_hits_s", "rate": True},
    "vllm:prompt_tokens": {"metric": "prompt_tokens_s", "rate": True},
    "vllm:generation_tokens": {"metric": "generation_tokens_s", "rate": True},
    "vllm:time_to_first_token_seconds": histogram_ms("server_ttft", SECONDS_TO_MS),
    "vllm:request_queue_time_seconds": histogram_ms("server_queue_time", SECONDS_TO_MS),  # time in WAITING
    "vllm:e2e_request_latency_seconds": histogram_ms("server_e2e", SECONDS_TO_MS),
}

# SGLang with --enable-metrics, /metrics on its API port.
# https://docs.sglang.ai/references/production_metrics.html (code: python/sglang/srt/metrics/collector.py).
# token_usage is the KV pool's used fraction; the prefix cache's queries are its prompt tokens, its hits
# cached_tokens_total; retractions (a running request sent back to the queue) are its preemptions.
SGLANG: dict[str, dict | list[dict]] = {
    "sglang:num_running_reqs": {"metric": "requests_running"},
    "sglang:num_queue_reqs": {"metric": "queue_depth"},
    "sglang:token_usage": {"metric": "kv_cache_usage_pct", "scale": 100.0, "aggregate": "mean"},
    "sglang:num_retracted_requests": {"metric": "preemptions_s", "rate": True},
    "sglang:prompt_tokens": [{"metric": "prompt_tokens_s", "rate": True},
                             {"metric": "prefix_cache_queries_s", "rate": True}],
    "sglang:cached_tokens": {"metric": "prefix_cache_hits_s", "rate": True},
    "sglang:generation_tokens": {"metric": "generation_tokens_s", "rate": True},
    "sglang:time_to_first_token_seconds": histogram_ms("server_ttft", SECONDS_TO_MS),
    "sglang:queue_time_seconds": histogram_ms("server_queue_time", SECONDS_TO_MS),
    "sglang:e2e_request_latency_seconds": histogram_ms("server_e2e", SECONDS_TO_MS),
}

# Hugging Face text-generation-inference, /metrics on its port.
# https://huggingface.co/docs/text-generation-inference/reference/metrics (code: router/src/).
# It exports no TTFT histogram. The per-request token histograms' _sum samples are counters of tokens.
TGI: dict[str, dict | list[dict]] = {
    "tgi_queue_size": {"metric": "queue_depth"},
    "tgi_batch_current_size": [{"metric": "batch_size"}, {"metric": "requests_running"}],
    "tgi_request_input_length_sum": {"metric": "prompt_tokens_s", "rate": True},
    "tgi_request_generated_tokens_sum": {"metric": "generation_tokens_s", "rate": True},
    "tgi_request_queue_duration": histogram_ms("server_queue_time", SECONDS_TO_MS),
    "tgi_request_duration": histogram_ms("server_e2e", SECONDS_TO_MS),
}

# llama.cpp's llama-server with --metrics. https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md
# ("GET /metrics"). No histograms. kv_cache_usage_ratio is in older builds only (1 = 100 %);
# n_busy_slots_per_decode is the average number of sequences per llama_decode call: its batch.
LLAMA_CPP: dict[str, dict | list[dict]] = {
    "llamacpp:requests_processing": {"metric": "requests_running"},
    "llamacpp:requests_deferred": {"metric": "queue_depth"},
    "llamacpp:kv_cache_usage_ratio": {"metric": "kv_cache_usage_pct", "scale": 100.0},
    "llamacpp:prompt_tokens_total": {"metric": "prompt_tokens_s", "rate": True},
    "llamacpp:tokens_predicted_total": {"metric": "generation_tokens_s", "rate": True},
    "llamacpp:n_busy_slots_per_decode": {"metric": "batch_size"},
}

MAPPINGS: dict[str, dict[str, dict | list[dict]]] = {
    "dcgm": DCGM, "triton": TRITON, "reference-server": REFERENCE_SERVER,
    "vllm": VLLM, "sglang": SGLANG, "tgi": TGI, "llama.cpp": LLAMA_CPP,
}
DEVICE_HEADER: dict[str, str] = {"reference-server": "X-Replica-Id"}
