"""What the server runs with: ServerConfig (the CLI's flags, validated by click), its limits, and the model
file it names.

Shared by both processes: the supervisor (supervisor.py) reads it, resolves the model once and hands it
to every replica (pickled on the replica's stdin); each replica's server.serve() reads it again. So it
lives apart from both, and imports neither.

resolve_model(config) is the ONNX file to serve: `--model FILE` as given (checked to exist), else the
built-in model from `--cache-dir`, built on a cache miss. The supervisor calls it first, so the
replicas' calls hit the cache.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from reference_server.errors import StartupError
from reference_server.model import DEFAULT_CACHE, EncoderConfig, IdentityConfig, cached_encoder, cached_identity

log = logging.getLogger(__name__)

MAX_ADAPTER_FACTOR = 16.0  # an adapter's model runs per token, at most
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
MAX_REPLICAS = 32  # the admin API refuses to run more at once (each one is a process with its own model)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = None  # None: 8001, or no gRPC (warning) when taken; 0: any free port; -1: no gRPC
    model: Path | None = None  # None: the built-in encoder
    model_name: str = "encoder"
    backend: str = "auto"
    max_batch_size: int = 32
    max_queue_delay_us: int = 0
    batch_policy: str = "cost"  # how many waiting requests a run takes (batcher.py): "cost" or "all"
    max_queue: int = 256
    max_body_bytes: int = 16 * 1024 * 1024
    threads: int | None = None  # None: one per CPU core
    builtin: str = "encoder"  # the built-in model when `model` is None: "encoder" or "identity"
    layers: int | None = None  # None: the encoder's default; only for the built-in model
    extra_latency_ms: float = 0.0
    cache_dir: Path = DEFAULT_CACHE  # where the built-in model is cached
    # Replicas and cold starts (supervisor.py, lifecycle.py, admin.py).
    replicas: int = 1  # replica processes sharing the port(s) with SO_REUSEPORT
    admin_port: int = 8002  # the supervisor's admin API; 0 = any free port
    admin_token: str | None = field(default=None, repr=False)  # None: admin API off
    prewarm: bool = True  # load + warm up before accepting traffic; False: load on the first request
    idle_unload: float | None = None  # seconds without a request before the model is unloaded
    # Text generation (openai_api.py, generation.py): the built-in decoder on the OpenAI-compatible /v1 routes.
    generator: bool = True
    generator_name: str = "decoder"
    decoder_layers: int | None = None  # None: the decoder's default
    max_sequences: int = 64  # sequences decoded together; more wait (up to max_queue, then 429)
    max_tokens_limit: int = 512  # largest max_tokens a request may ask for
    # Prompt tokens prefilled between two decode steps; a longer prompt is prefilled in chunks (generation.py).
    max_prefill_tokens: int = 128
    # MiB of cached prompt-prefix keys and values (prefix_cache.py); 0 = off. 256 MiB holds 2048 blocks of the
    # default decoder (128 KiB per 16 tokens), 32k tokens: 32 full 1024-token conversations, half of what the
    # decode batch itself can hold (64 sequences x 1024 tokens x 8 KiB = 512 MiB), small for any host.
    prefix_cache_mb: int = 256
    reasoning_tokens: int = 0  # reasoning tokens of a chat / responses / messages answer unless the request says
    tool_call_rate: float = 1.0  # in [0, 1]: chance that a request declaring tools is answered with a tool call
    # Named adapters over the decoder: (name, cost factor) pairs, factor = model runs per token (generation.py).
    adapters: tuple[tuple[str, float], ...] = ()


def parse_adapter(spec: str) -> tuple[str, float]:
    """`NAME=FACTOR` (the --adapter flag) -> (NAME, FACTOR); ValueError saying what is wrong."""
    name, sep, factor_text = spec.partition("=")
    if not sep or not _ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"{spec!r}: expected NAME=FACTOR, NAME of letters, digits and . _ : / - (e.g. "
                         f"'tenant-a=3')")
    try:
        factor = float(factor_text)
    except ValueError:
        raise ValueError(f"{spec!r}: the cost factor {factor_text!r} is not a number") from None
    if not 1 <= factor <= MAX_ADAPTER_FACTOR:
        raise ValueError(f"{spec!r}: the cost factor must be in [1, {MAX_ADAPTER_FACTOR:g}] (model runs per token)")
    return name, factor


def resolve_model(config: ServerConfig) -> Path:
    """The ONNX file to serve: the user's, or the built-in encoder from the cache (built on a miss)."""
    if config.model is not None:
        if config.layers is not None:
            raise StartupError("--layers only applies to the built-in encoder, not to --model FILE")
        if not config.model.is_file():
            raise StartupError(f"--model {config.model}: no such file")
        log.info("model %s: user file %s", config.model_name, config.model)
        return config.model
    if config.builtin == "identity":
        path, reused = cached_identity(IdentityConfig(), config.cache_dir.expanduser())
        log.info("model %s: built-in identity, %s %s", config.model_name, "reused cached" if reused else "built", path)
        return path
    encoder = EncoderConfig() if config.layers is None else EncoderConfig(layers=config.layers)
    started = time.perf_counter()
    path, reused = cached_encoder(encoder, config.cache_dir.expanduser())
    log.info("model %s: built-in encoder, %d layers, %s %s in %.2f s", config.model_name, encoder.layers,
             "reused cached" if reused else "built", path, time.perf_counter() - started)
    return path
