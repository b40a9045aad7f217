"""A test server whose /metrics answers like an inference engine's: vLLM, SGLang, TGI, llama.cpp's
server, Triton. Metric names, types and labels are those the projects document (the sources are
cited in latscope/telemetry/mappings.py): counters with `_total`, histograms as `_bucket{le=...}`,
`_sum`, `_count`, labels like `model_name` and vLLM's `engine`.

The page moves one step per scrape, so every value is known: the j-th answer (j = 0, 1, ...) shows
the state after j steps. Gauges are functions of j; each counter grows by a fixed amount a step;
each histogram gets the same observations every step (TTFT_OBS, ...), so the quantiles of what one
scrape-to-scrape window saw are fixed numbers, worked out by hand below (EXPECTED_WINDOW).

    python -m ... is not needed: `serve_engine(name)` (a context manager) gives the /metrics URL.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from aiohttp import web

from conftest import serve

# Bucket bounds (s) for every engine's latency histograms here; the engines' own defaults differ,
# the interpolation does not care. Triton's first-response histogram is in ms (the same bounds × 1000).
BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# One step's observations (s). Their buckets' increase per step:
#   TTFT   le 0.01:0  0.05:3  0.1:7  0.25:8  0.5:9  1:10  2.5:10  +Inf:10   sum 1.59
#   queue  le 0.01:3  0.05:4  (then 4)                                     sum 0.027
#   e2e    le 0.5:1   1:1     2.5:4  +Inf:4                                sum 6.2
TTFT_OBS = (0.02, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09, 0.2, 0.3, 0.7)
QUEUE_OBS = (0.001, 0.002, 0.004, 0.02)
E2E_OBS = (0.5, 1.5, 2.0, 2.2)
SLOW_TTFT_OBS = (3.0, 3.0)  # vLLM's second engine: two first tokens above the highest finite bound

# What one window (two consecutive scrapes) gives, in ms. histogram_quantile: rank = q × n; in the
# bucket the rank reaches, lower + width × (rank − count below) / (count in the bucket).
#   TTFT  p50: rank 5 in (0.05, 0.1], 3 below, 4 in it: 0.05 + 0.05 × 2/4 = 0.075 s
#         p99: rank 9.9 in (0.5, 1], 9 below, 1 in it:  0.5 + 0.5 × 0.9 = 0.95 s (the true 99th of
#              these ten is 0.66 s: the error is bounded by the bucket's width, 0.5 s here)
#         mean: 1.59 / 10 = 0.159 s
#   queue p50: rank 2 in (0, 0.01], 3 in it: 0.01 × 2/3 s;  p99: rank 3.96 in (0.01, 0.05]: 0.01 +
#              0.04 × 0.96 = 0.0484 s;  mean 0.027 / 4 = 0.00675 s
#   e2e   p50: rank 2 in (1, 2.5], 1 below, 3 in it: 1 + 1.5/3 = 1.5 s;  p99: rank 3.96: 1 + 1.5 ×
#              2.96/3 = 2.48 s;  mean 6.2 / 4 = 1.55 s
#   vLLM's TTFT, its two engines merged (12 a step, 2 of them in +Inf):
#         p50: rank 6 in (0.05, 0.1]: 0.05 + 0.05 × 3/4 = 0.0875 s;  p99: rank 11.88 in +Inf: the
#              highest finite bound, 2.5 s;  mean (1.59 + 6) / 12 = 0.6325 s
TTFT_MS = {"server_ttft_p50_ms": 75.0, "server_ttft_p99_ms": 950.0, "server_ttft_mean_ms": 159.0}
QUEUE_MS = {"server_queue_time_p50_ms": 20 / 3, "server_queue_time_p99_ms": 48.4, "server_queue_time_mean_ms": 6.75}
E2E_MS = {"server_e2e_p50_ms": 1500.0, "server_e2e_p99_ms": 2480.0, "server_e2e_mean_ms": 1550.0}
VLLM_TTFT_MS = {"server_ttft_p50_ms": 87.5, "server_ttft_p99_ms": 2500.0, "server_ttft_mean_ms": 632.5}


def _labels(labels: dict[str, str], **more: str) -> str:
    items = {**labels, **more}
    return "{" + ",".join(f'{k}="{v}"' for k, v in items.items()) + "}" if items else ""


class Page:
    """Exposition text, family by family (HELP and TYPE once, then the series)."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def _family(self, name: str, kind: str) -> list[str]:
        return self.families.setdefault(name, (kind, []))[1]

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self._family(name, "gauge").append(f"{name}{_labels(labels)} {value!r}")

    def counter(self, name: str, total: float, **labels: str) -> None:
        """`name` without _total: the sample is `<name>_total`, as prometheus_client and the Rust
        metrics exporter write counters."""
        self._family(f"{name}_total", "counter").append(f"{name}_total{_labels(labels)} {total!r}")

    def histogram(self, name: str, observations: tuple[float, ...], steps: int, bounds: tuple[float, ...] = BOUNDS,
                  **labels: str) -> None:
        """The cumulative histogram after `steps` steps of `observations` each."""
        lines = self._family(name, "histogram")
        for bound in (*bounds, float("inf")):
            below = sum(1 for o in observations if o <= bound) * steps
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f"{name}_bucket{_labels(labels, le=le)} {float(below)!r}")
        lines.append(f"{name}_sum{_labels(labels)} {sum(observations) * steps!r}")
        lines.append(f"{name}_count{_labels(labels)} {float(len(observations) * steps)!r}")

    def text(self) -> str:
        out = []
        for name, (kind, lines) in self.families.items():
            out += [f"# HELP {name} {name.replace('_', ' ')}", f"# TYPE {name} {kind}", *lines]
        return "\n".join(out) + "\n"


# Each step: +1 preemption, +100 prompt tokens (the prefix cache's queries), +40 of them hits, +50
# generated tokens; per engine series (vLLM has two engines: twice that on the page).
PREEMPT, PROMPT, HITS, GENERATED = 1, 100, 40, 50


def vllm(j: int) -> str:
    """vLLM V1 (docs.vllm.ai "Production Metrics"), two data-parallel engines, the renamed gauges and
    counters under both names, as the versions that deprecated the old names export them."""
    p = Page()
    for engine in ("0", "1"):
        lab = {"model_name": "m", "engine": engine}
        p.gauge("vllm:num_requests_running", float(j if engine == "0" else 1), **lab)
        p.gauge("vllm:num_requests_waiting", float(j % 4 if engine == "0" else 0), **lab)
        kv = 0.1 * (j % 5) + (0.0 if engine == "0" else 0.2)
        p.gauge("vllm:gpu_cache_usage_perc", kv, **lab)
        p.gauge("vllm:kv_cache_usage_perc", kv, **lab)
        p.counter("vllm:num_preemptions", float(PREEMPT * j), **lab)
        for prefix in ("gpu_", ""):
            p.counter(f"vllm:{prefix}prefix_cache_queries", float(PROMPT * j), **lab)
            p.counter(f"vllm:{prefix}prefix_cache_hits", float(HITS * j), **lab)
        p.counter("vllm:prompt_tokens", float(PROMPT * j), **lab)
        p.counter("vllm:generation_tokens", float(GENERATED * j), **lab)
        p.histogram("vllm:time_to_first_token_seconds", TTFT_OBS if engine == "0" else SLOW_TTFT_OBS, j, **lab)
        p.histogram("vllm:request_queue_time_seconds", QUEUE_OBS, j, **lab)
        p.histogram("vllm:e2e_request_latency_seconds", E2E_OBS, j, **lab)
        p.histogram("vllm:iteration_tokens_total", (1.0, 8.0), j, bounds=(1.0, 8.0, 16.0), **lab)  # not mapped
    return p.text()


def sglang(j: int) -> str:
    """SGLang with --enable-metrics (docs "Production Metrics"; srt/metrics/collector.py)."""
    p = Page()
    lab = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    p.gauge("sglang:num_running_reqs", float(j + 1), **lab)
    p.gauge("sglang:num_queue_reqs", float(j % 4), **lab)
    p.gauge("sglang:token_usage", 0.1 * (j % 5) + 0.1, **lab)
    p.gauge("sglang:cache_hit_rate", 0.4, **lab)  # not mapped: a ratio since start, not this moment's
    p.counter("sglang:num_retracted_requests", float(PREEMPT * j), **lab)
    p.counter("sglang:prompt_tokens", float(PROMPT * j), **lab)
    p.counter("sglang:cached_tokens", float(HITS * j), **{**lab, "cache_source": "device"})
    p.counter("sglang:generation_tokens", float(GENERATED * j), **lab)
    p.histogram("sglang:time_to_first_token_seconds", TTFT_OBS, j, **lab)
    p.histogram("sglang:queue_time_seconds", QUEUE_OBS, j, **lab)
    p.histogram("sglang:e2e_request_latency_seconds", E2E_OBS, j, **lab)
    return p.text()


def tgi(j: int) -> str:
    """text-generation-inference (docs "Metrics"): unlabelled, histograms in seconds without a unit
    suffix; the token histograms' _sum samples count tokens."""
    p = Page()
    p.gauge("tgi_queue_size", float(j % 4))
    p.gauge("tgi_batch_current_size", float(j + 1))
    p.gauge("tgi_batch_current_max_tokens", 4096.0)
    p.histogram("tgi_request_input_length", (PROMPT / 2, PROMPT / 2), j, bounds=(10.0, 100.0, 1000.0))
    p.histogram("tgi_request_generated_tokens", (GENERATED / 2, GENERATED / 2), j, bounds=(10.0, 100.0, 1000.0))
    p.histogram("tgi_request_queue_duration", QUEUE_OBS, j)
    p.histogram("tgi_request_duration", E2E_OBS, j)
    p.histogram("tgi_batch_forward_duration", (0.01,), j, method="decode")  # not mapped
    return p.text()


def llama_cpp(j: int) -> str:
    """llama.cpp's llama-server --metrics (tools/server/README.md): no labels, no histograms."""
    p = Page()
    p.counter("llamacpp:prompt_tokens", float(PROMPT * j))
    p.counter("llamacpp:prompt_seconds", 0.5 * j)
    p.counter("llamacpp:tokens_predicted", float(GENERATED * j))
    p.gauge("llamacpp:prompt_tokens_seconds", 200.0)
    p.gauge("llamacpp:kv_cache_usage_ratio", 0.1 * (j % 5) + 0.1)
    p.gauge("llamacpp:requests_processing", float(j + 1))
    p.gauge("llamacpp:requests_deferred", float(j % 4))
    p.gauge("llamacpp:n_busy_slots_per_decode", 1.5)
    return p.text()


# Triton: per step, 4 successful requests, each 1 ms in the queue, 5 ms of compute and 7.5 ms in all.
TRITON_REQUESTS, TRITON_QUEUE_US, TRITON_COMPUTE_US, TRITON_REQUEST_US = 4, 1000, 5000, 7500


def triton(j: int) -> str:
    """Triton's :8002/metrics (user_guide/metrics.md): cumulative µs counters, per model and version;
    the first-response histogram (ms) with --metrics-config histogram_latencies=true."""
    p = Page()
    lab = {"model": "llm", "version": "1"}
    p.counter("nv_inference_request_success", float(TRITON_REQUESTS * j), **lab)
    p.counter("nv_inference_request_failure", 0.0, **lab, reason="BACKEND")
    p.counter("nv_inference_queue_duration_us", float(TRITON_QUEUE_US * TRITON_REQUESTS * j), **lab)
    p.counter("nv_inference_compute_infer_duration_us", float(TRITON_COMPUTE_US * TRITON_REQUESTS * j), **lab)
    p.counter("nv_inference_request_duration_us", float(TRITON_REQUEST_US * TRITON_REQUESTS * j), **lab)
    p.gauge("nv_inference_pending_request_count", float(j % 4), **lab)
    p.histogram("nv_inference_first_response_histogram_ms", tuple(o * 1000 for o in TTFT_OBS), j,
                bounds=tuple(b * 1000 for b in BOUNDS), **lab)
    return p.text()


PAGES: dict[str, Callable[[int], str]] = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "llama.cpp": llama_cpp,
                                          "triton": triton}


@contextmanager
def serve_engine(engine: str) -> Iterator[str]:
    """The engine's /metrics URL on 127.0.0.1; each GET is the next step."""
    step = {"j": 0}
    lock = threading.Lock()

    async def handler(request: web.Request) -> web.Response:
        with lock:
            j = step["j"]
            step["j"] += 1
        return web.Response(text=PAGES[engine](j), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    with serve(app) as url:
        yield f"{url}/metrics"
