"""What the server tells about its own timing: Prometheus metrics and the per-response Server-Timing header.

latscope scrapes /metrics during a run and parses Server-Timing per request, so the split of a
request's latency into queue / deserialize / compute / serialize comes from the server itself.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import time
from collections import defaultdict
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from reference_server.gpu_metrics import gpu_collector

PREFIX = "latscope_ref"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def server_timing(*, queue_ns: int, deser_ns: int, compute_ns: int, ser_ns: int, batch: int) -> str:
    """A W3C Server-Timing value, durations in milliseconds with microsecond precision:
    queue = enqueue to backend run start (batch formation, padding), deser = parsing and validating the
    body already read, compute = the backend run of the whole batch, ser = encoding the response body,
    batch = rows in that run. Body transfer and handler overhead are in none of them."""
    parts = [f"{name};dur={ns / 1e6:.3f}" for name, ns in
             (("queue", queue_ns), ("deser", deser_ns), ("compute", compute_ns), ("ser", ser_ns))]
    return ", ".join([*parts, f'batch;desc="{batch}"'])


class GcPauseCollector(Collector):
    """Python garbage-collection pauses, by generation, from gc.callbacks.

    The callback only updates plain Python numbers: taking a prometheus_client lock inside a gc
    callback could deadlock when a collection starts while that same (non-reentrant) lock is held."""

    def __init__(self) -> None:
        self._started = 0.0
        self._counts: dict[int, list[int]] = defaultdict(lambda: [0] * (len(GC_BUCKETS) + 1))
        self._sums: dict[int, float] = defaultdict(float)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self._counts[generation][bisect.bisect_left(GC_BUCKETS, pause)] += 1
        self._sums[generation] += pause

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._callback)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(f"{PREFIX}_gc_pause_seconds", "Python garbage-collection pauses",
                                       labels=["generation"])
        for generation, counts in sorted(self._counts.items()):
            cumulative = list(itertools.accumulate(counts))
            buckets = [(str(b), c) for b, c in zip(GC_BUCKETS, cumulative)] + [("+Inf", cumulative[-1])]
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family


class Metrics:
    """Every metric the server exports, in its own registry (so several servers can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.request_seconds = Histogram(f"{PREFIX}_request_duration_seconds",
                                         "Time from request received to response ready, by endpoint",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram(f"{PREFIX}_queue_duration_seconds",
                                       "Per request: enqueue to start of the backend run of its batch",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.compute_seconds = Histogram(f"{PREFIX}_compute_duration_seconds", "Per batch: backend run time",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(f"{PREFIX}_batch_size", "Rows per backend run", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.in_flight = Gauge(f"{PREFIX}_in_flight_requests", "HTTP requests being handled", registry=r)
        self._request_counters: dict[tuple[str, int], Counter] = {}  # on_request's label children
        self._request_durations: dict[str, Histogram] = {}
        self.model_load_seconds = Gauge(f"{PREFIX}_model_load_seconds", "Time to load the model into its backend",
                                        ["model", "backend"], registry=r)
        # Cold starts (lifecycle.py): how and when the model got loaded, warmed up, unloaded; when this replica was ready.
        self.model_loads = Counter(f"{PREFIX}_model_loads", "Model loads by reason: prewarm (before taking traffic), "
                                   "first_request (lazy, --no-prewarm), idle_reload (after an --idle-unload)",
                                   ["model", "reason"], registry=r)
        self.model_unloads = Counter(f"{PREFIX}_model_unloads", "Model unloads after --idle-unload seconds idle",
                                     ["model"], registry=r)
        self.model_loaded = Gauge(f"{PREFIX}_model_loaded", "1 while the model is loaded in this replica",
                                  ["model"], registry=r)
        self.model_warmup_seconds = Gauge(f"{PREFIX}_model_warmup_seconds",
                                          "Time of the warm-up runs before taking traffic (--prewarm)",
                                          ["model", "backend"], registry=r)
        self.replica_start_time = Gauge(f"{PREFIX}_replica_start_timestamp_seconds",
                                        "Unix time the supervisor started this replica's process", ["replica"],
                                        registry=r)
        self.replica_ready_time = Gauge(f"{PREFIX}_replica_ready_timestamp_seconds",
                                        "Unix time this replica started accepting connections", ["replica"],
                                        registry=r)
        # The server points this at its batcher with set_function (the batcher needs on_batch first).
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Requests waiting for the inference thread", registry=r)
        # Text generation (openai_api.py, generation.py); the server points the two gauges at its generator.
        self.generation_requests = Counter(f"{PREFIX}_generation_requests", "Generation requests admitted, by API "
                                           "(completions, chat, responses, messages) and streaming", ["api", "stream"], registry=r)
        self.tool_calls = Counter(f"{PREFIX}_tool_calls", "Generation requests answered with a tool call, by API "
                                  "(chat, responses, messages)", ["api"], registry=r)
        self.generated_tokens = Counter(f"{PREFIX}_generated_tokens", "Tokens generated (by prefills and decode "
                                        "steps; an adapter's thrown-away runs make none)", registry=r)
        self.ttft_seconds = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Generation: request received to "
                                      "first token generated", buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_seconds = Histogram(f"{PREFIX}_prefill_duration_seconds", "Per prefill run (one or more "
                                         "prompts): backend run time", buckets=LATENCY_BUCKETS, registry=r)
        self.decode_step_seconds = Histogram(f"{PREFIX}_decode_step_duration_seconds", "Per decode step: backend "
                                             "run time", buckets=LATENCY_BUCKETS, registry=r)
        self.decode_batch_size = Histogram(f"{PREFIX}_decode_batch_size", "Sequences per decode step",
                                           buckets=BATCH_BUCKETS, registry=r)
        self.active_sequences = Gauge(f"{PREFIX}_active_sequences", "Sequences being decoded", registry=r)
        self.waiting_sequences = Gauge(f"{PREFIX}_waiting_sequences", "Generation requests waiting for a "
                                       "sequence slot", registry=r)
        # Prefix caching (prefix_cache.py): hit rate = hits / queries, both in prompt tokens (vLLM's two counters).
        self.prefix_cache_queries = Counter(f"{PREFIX}_prefix_cache_queries_tokens", "Prompt tokens prefilled "
                                            "(cached or computed)", registry=r)
        self.prefix_cache_hits = Counter(f"{PREFIX}_prefix_cache_hits_tokens", "Prompt tokens taken from the "
                                         "prefix cache instead of computed", registry=r)
        self.prefix_cache_evictions = Counter(f"{PREFIX}_prefix_cache_evicted_blocks", "Prefix-cache blocks "
                                              "evicted (least recently used) to make room", registry=r)
        self.prefix_cache_bytes = Gauge(f"{PREFIX}_prefix_cache_bytes", "Bytes of keys and values held by the "
                                        "prefix cache", registry=r)
        self.prefix_cache_capacity_bytes = Gauge(f"{PREFIX}_prefix_cache_capacity_bytes", "Bound of the prefix "
                                                 "cache (--prefix-cache-mb); 0: off", registry=r)
        self.gc = GcPauseCollector()
        r.register(self.gc)
        gpus = gpu_collector()  # None (and a log line) without an NVIDIA GPU
        if gpus is not None:
            r.register(gpus)

    def on_request(self, endpoint: str, status: int, seconds: float) -> None:
        """One HTTP request answered (both HTTP paths call it). Label children are looked up once per (endpoint,
        status): prometheus_client's labels() validates and locks on every call. Both key sets are bounded:
        endpoints are the routes' canonical names (or "unmatched"), statuses are codes."""
        counter = self._request_counters.get((endpoint, status))
        if counter is None:
            counter = self._request_counters[endpoint, status] = self.requests.labels(endpoint, str(status))
        counter.inc()
        duration = self._request_durations.get(endpoint)
        if duration is None:
            duration = self._request_durations[endpoint] = self.request_seconds.labels(endpoint)
        duration.observe(seconds)

    def on_batch(self, rows: int, compute_ns: int) -> None:
        """Batcher observer: one call per backend run, from the inference thread."""
        self.batch_size.observe(rows)
        self.compute_seconds.observe(compute_ns / 1e9)

    def on_prefill(self, rows: int, tokens: int, compute_ns: int) -> None:
        """Generator observer: one call per prefill run, inference thread."""
        self.prefill_seconds.observe(compute_ns / 1e9)

    def on_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Generator observer: one call per prefill run, prompt tokens and those taken from the prefix cache."""
        self.prefix_cache_queries.inc(prompt_tokens)
        self.prefix_cache_hits.inc(cached_tokens)

    def on_decode_step(self, rows: int, compute_ns: int) -> None:
        """Generator observer: one call per decode step (rows: the sequences it ran), inference thread."""
        self.decode_batch_size.observe(rows)
        self.decode_step_seconds.observe(compute_ns / 1e9)

    def on_tokens(self, tokens: int) -> None:
        """Generator observer: tokens handed to their requests (by a prefill or a decode step), inference thread."""
        self.generated_tokens.inc(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
