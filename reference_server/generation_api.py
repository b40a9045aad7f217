"""Mounting text generation: the built-in decoder (built or reused from the cache, loaded and warmed up on ONNX
Runtime), its continuous-batching generator, and every front end over it on /v1: openai_api.py
(/v1/completions, /v1/chat/completions, /v1/models), responses_api.py (/v1/responses) and messages_api.py
(/v1/messages), sharing the served model names (the decoder and its --adapter names), --reasoning-tokens and
--tool-call-rate."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from reference_server import messages_api, openai_api, responses_api
from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.decoder import DecoderConfig, cached_decode_step, cached_decoder
from reference_server.errors import StartupError
from reference_server.generation import Generator, warm_up
from reference_server.http_server import REPLICA_ID
from reference_server.metrics import Metrics
from reference_server.prefix_cache import PrefixCache
from reference_server.text_api import TextModels

if TYPE_CHECKING:
    from reference_server.config import ServerConfig

log = logging.getLogger(__name__)


def mount_generator(app: web.Application, config: ServerConfig, metrics: Metrics) -> Generator | None:
    """With --generator (the default): build or reuse the decoder, load and warm it up on ONNX Runtime, add the
    /v1 generation routes to `app` (before it starts) and return the generator for the caller to start() and stop()."""
    if not config.generator:
        log.info("generator: off (--no-generator); no generation routes")
        return None
    if config.generator_name in dict(config.adapters):
        raise StartupError(f"--adapter {config.generator_name}=…: that is the decoder's own name (--generator-name)")
    decoder = DecoderConfig() if config.decoder_layers is None else DecoderConfig(layers=config.decoder_layers)
    started = time.perf_counter()
    cache_dir = config.cache_dir.expanduser() / "decoder"  # beside the encoder's file
    path, reused = cached_decoder(decoder, cache_dir)
    step_path, _ = cached_decode_step(decoder, cache_dir)  # the same weights; built or reused with it
    log.info("generator %s: built-in decoder, %d layers, hidden %d, context %d, %s %s (and its decode step graph) "
             "in %.2f s", config.generator_name, decoder.layers, decoder.hidden, decoder.max_context,
             "reused cached" if reused else "built", path, time.perf_counter() - started)
    started = time.perf_counter()
    try:
        backend, step = OnnxRuntimeBackend(path, config.threads), OnnxRuntimeBackend(step_path, config.threads)
        backend.load()
        step.load()
        load_s = time.perf_counter() - started
        warm_up(backend.run, step.run_into, decoder)
    except Exception as exc:  # noqa: BLE001 - onnx/onnxruntime raise many types; name the file and stop
        raise StartupError(f"onnxruntime cannot load the decoder {path} or {step_path.name}: {exc}") from None
    metrics.model_load_seconds.labels(config.generator_name, backend.name).set(load_s)
    log.info("generator %s: %s; loaded in %.2f s, warmed up in %.3f s", config.generator_name, backend.describe(),
             load_s, time.perf_counter() - started - load_s)
    prefix_cache = PrefixCache(config.prefix_cache_mb * 2**20, on_evict=metrics.prefix_cache_evictions.inc)
    generator = Generator(backend.run, step.run_into, decoder, max_sequences=config.max_sequences,
                          max_waiting=config.max_queue, max_prefill_tokens=config.max_prefill_tokens,
                          on_prefill=metrics.on_prefill, on_step=metrics.on_decode_step, prefix_cache=prefix_cache,
                          on_prompt=metrics.on_prompt, on_tokens=metrics.on_tokens)
    metrics.active_sequences.set_function(generator.active)
    metrics.waiting_sequences.set_function(generator.waiting)
    metrics.prefix_cache_bytes.set_function(lambda: prefix_cache.bytes_in_use)
    metrics.prefix_cache_capacity_bytes.set(prefix_cache.capacity_bytes)

    models = TextModels(config.generator_name, dict(config.adapters))
    shared = dict(max_body_bytes=config.max_body_bytes, max_tokens_limit=config.max_tokens_limit,
                  reasoning_tokens=config.reasoning_tokens, replica_id=app[REPLICA_ID],
                  tool_call_rate=config.tool_call_rate)
    openai_api.add_routes(app, openai_api.OpenAIRoutes(generator, models, metrics, chat=False, **shared),
                          openai_api.OpenAIRoutes(generator, models, metrics, chat=True, **shared))
    responses_api.add_routes(app, responses_api.ResponsesRoutes(generator, models, metrics, **shared))
    messages_api.add_routes(app, messages_api.MessagesRoutes(generator, models, metrics, **shared))
    log.info("generator %s: continuous batching, at most %d sequences, %d waiting, %d prompt tokens prefilled per step, "
             "max_tokens <= %d, prefix cache "
             "%s, %d reasoning tokens by default, tool call rate %g; POST /v1/completions, /v1/chat/completions, "
             "/v1/responses, /v1/messages", config.generator_name, config.max_sequences, config.max_queue,
             config.max_prefill_tokens, config.max_tokens_limit,
             f"{config.prefix_cache_mb} MiB" if config.prefix_cache_mb else "off (--prefix-cache-mb 0)",
             config.reasoning_tokens, config.tool_call_rate)
    for name, factor in config.adapters:
        log.info("adapter %s: over %s, cost factor %g (model runs per token)", name, config.generator_name, factor)
    return generator
