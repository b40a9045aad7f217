"""`latscope-ref` / `python -m reference_server`: flags (each with a LATSCOPE_REF_* env fallback) -> ServerConfig."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from reference_server.backends import BACKENDS
from reference_server.config import MAX_REPLICAS, ServerConfig, parse_adapter
from reference_server.errors import StartupError
from reference_server.model import DEFAULT_CACHE
from reference_server.supervisor import replica_main, supervise


def _option(*decls: str, env: str | None = None, **kwargs):
    """A click option that falls back to LATSCOPE_REF_<NAME> (NAME from the flag unless `env` is given)."""
    name = env or decls[0].lstrip("-").upper().replace("-", "_")
    return click.option(*decls, envvar=f"LATSCOPE_REF_{name}", show_envvar=True, show_default=True, **kwargs)


def _adapters(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    adapters: dict[str, float] = {}
    for spec in value:
        try:
            name, factor = parse_adapter(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if name in adapters:
            raise click.BadParameter(f"{name!r} is named twice", ctx, param)
        adapters[name] = factor
    return tuple(adapters.items())


@click.group()
def main() -> None:
    """latscope's reference inference server (KServe v2 REST and gRPC; ONNX Runtime)."""


@main.command()
@_option("--host", default="127.0.0.1", help="Address to listen on.")
@_option("--http-port", type=click.IntRange(0, 65535), default=8000,
         help="HTTP port; 0 picks a free one (printed on the 'ready' line).")
@_option("--grpc-port", type=click.IntRange(-1, 65535), default=None,
         help="KServe v2 gRPC port; 0 picks a free one (printed on the 'ready-grpc' line), -1 turns gRPC off "
              "[default: 8001; if 8001 is taken, gRPC stays off with a warning].")
@_option("--model", type=click.Path(dir_okay=False, path_type=Path), default=None,
         help="ONNX file to serve instead of the built-in encoder.")
@_option("--model-name", default="encoder", help="Name the model is served under (/v2/models/NAME).")
@_option("--backend", type=click.Choice(BACKENDS), default="auto",
         help="What runs the model; auto picks the best available and logs why.")
@_option("--max-batch-size", type=click.IntRange(min=1), default=32,
         help="Most rows per backend run; 1 turns dynamic batching off.")
@_option("--max-queue-delay-us", type=click.IntRange(min=0), default=0,
         help="How long the oldest waiting request may wait for others to join its batch; 0: a batch is "
              "what waits when the model becomes free.")
@_option("--batch-policy", type=click.Choice(["cost", "all"]), default="cost",
         help="How many of the waiting compatible requests a run takes: cost = the count that minimises their "
              "expected latency under the batch costs learned online (a pair is split where a row costs nearly "
              "a run); all = every one of them.")
@_option("--max-queue", type=click.IntRange(min=1), default=256,
         help="Requests that may wait; past it, 429 with Retry-After.")
@_option("--max-body-bytes", type=click.IntRange(min=1), default=16 * 1024 * 1024,
         help="Largest request body; past it, 413.")
@_option("--threads", type=click.IntRange(min=1), default=None,
         help="Backend intra-op threads [default: one per CPU core it may run on].")
@_option("--builtin", type=click.Choice(["encoder", "identity"]), default="encoder",
         help="Built-in model to serve when no --model is given: the transformer encoder, or an identity "
              "(FP32 x [batch, 384] -> y) whose every millisecond is transport and serialization.")
@_option("--layers", type=click.IntRange(min=1), default=None,
         help="Transformer layers of the built-in encoder [default: 6].")
@_option("--extra-latency-ms", type=click.FloatRange(min=0), default=0.0,
         help="Sleep this long in every infer request, outside every Server-Timing part: "
              "simulates a slower build for regression tests. Costs latency, not CPU.")
@_option("--cache-dir", env="CACHE", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_CACHE,
         help="Where the built-in model is cached, one file per build parameters.")
@_option("--replicas", type=click.IntRange(1, MAX_REPLICAS), default=1,
         help="Replica processes sharing the port (SO_REUSEPORT), each with its own model and batcher.")
@_option("--admin-port", type=click.IntRange(0, 65535), default=8002,
         help="Port of the admin API (list/add/remove replicas); 0 picks a free one (printed on 'ready-admin').")
@_option("--admin-token", default=None,
         help="Bearer token the admin API requires; without one the admin API is off.")
@_option("--prewarm/--no-prewarm", env="PREWARM", default=True,
         help="Load and warm up the model before a replica accepts traffic; --no-prewarm accepts at once and "
              "loads on the first request (the cold-start trap).")
@_option("--idle-unload", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
         help="Unload the model after this long without a request; the next request reloads it [default: off].")
@_option("--generator/--no-generator", env="GENERATOR", default=True,
         help="Serve the built-in text decoder on the OpenAI-compatible /v1/completions and /v1/chat/completions.")
@_option("--generator-name", default="decoder", help="Model name of the decoder on the /v1 routes.")
@_option("--decoder-layers", type=click.IntRange(min=1), default=None,
         help="Transformer layers of the built-in decoder [default: 4].")
@_option("--max-sequences", type=click.IntRange(min=1), default=64,
         help="Sequences decoded together (continuous batching); more wait, up to --max-queue, then 429.")
@_option("--max-prefill-tokens", type=click.IntRange(min=1), default=128,
         help="Prompt tokens prefilled between two decode steps; a longer prompt is prefilled in chunks of this "
              "many, so running streams get a token between chunks (smaller: shorter stalls, slower long prompts).")
@_option("--max-tokens-limit", type=click.IntRange(min=1), default=512,
         help="Largest max_tokens a generation request may ask for (the context, 1024 tokens, also bounds it).")
@_option("--prefix-cache-mb", type=click.IntRange(min=0), default=256,
         help="MiB of prompt-prefix keys and values the decoder keeps for reuse (blocks of 16 tokens, least "
              "recently used evicted first); 0 turns prefix caching off.")
@_option("--reasoning-tokens", type=click.IntRange(min=0), default=0,
         help="Reasoning tokens a chat, responses or messages answer starts with unless the request asks for "
              "another count (they count toward its max_tokens, as OpenAI and Anthropic count them).")
@_option("--tool-call-rate", type=click.FloatRange(0, 1), default=1.0,
         help="Chance that a chat, responses or messages request declaring tools is answered with a call of one of "
              "them (the same tokens, as the call's JSON arguments) instead of text; decided per request by a "
              "Random seeded 0.")
@_option("--adapter", "adapters", env="ADAPTER", multiple=True, callback=_adapters, metavar="NAME=FACTOR",
         help="A named adapter over the decoder (repeatable): model NAME on the generation APIs, costing FACTOR "
              "(1 to 16) model runs per token. Env: space-separated.")
def serve(**flags) -> None:
    """Serve the model until SIGTERM/SIGINT; prints 'ready http://HOST:PORT' once it accepts traffic."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(supervise(ServerConfig(**flags)))
    except StartupError as exc:
        raise click.ClickException(str(exc)) from None


@main.command(hidden=True)
@click.option("--index", type=int, required=True)
@click.option("--parent-pid", type=int, required=True)
def replica(index: int, parent_pid: int) -> None:
    """One replica, started by `serve` (its config arrives on stdin); not for direct use."""
    replica_main(index, parent_pid)
