"""A simulated inference engine with switches that inject one known cause of a long latency tail.

    python -m latscope.targets.causes --port 0 --slots 8 --slow-replica 2 --slow-replica-ms 40

It exists to prove `latscope explain` right: each switch below makes the tail by one cause that the
test knows, and explain must name it (tests/analysis/test_explain_causes.py). It speaks the OpenAI
wire format (POST /v1/chat/completions and /v1/completions, streamed or not) and simulates an engine
in virtual time, as targets/queue.py does, so the box's own scheduling cannot bend it:

- `--replicas R` replicas (requests go round-robin: replica `i mod R`), each a FIFO queue in front of
  `--slots S` slots. A request that arrives at `a` (monotonic, after its body is read) starts at
  `s = max(a, the replica's earliest free slot)` and holds that slot until its last token;
- its prefill takes `--base-ms + --per-prompt-token-ms × uncached prompt tokens` (plus
  `--slow-replica-ms` on replica `--slow-replica`), then each output token `--per-token-ms`;
- `--jitter-ms J` adds an exponential time of mean J to each prefill, i.i.d. (seeded): a tail that no
  single cause makes, as a clean engine's is;
- `--pause-every P --pause-ms D`: the whole engine stalls for D ms every P s (from the start): work
  in a stall does not advance, so a request whose prefill or decode overlaps one takes D ms longer,
  and one that would start in a stall starts when it ends;
- `--prefix-cache-tokens N`: the first N prompt tokens are a cache hit (`cached_tokens` in usage,
  not prefilled), except for a `--cache-miss-fraction` of the requests (seeded), which pay the
  whole prompt.

Prompt tokens are the prompt's whitespace-separated words (latscope's synthetic prompts are words).
Each response carries `Server-Timing: queue;dur=<s − a>, compute;dur=<ms>` and `X-Replica-Id`. A
whole answer's compute is prefill and decode; a stream's headers leave with its first token, so its
compute is the prefill only (the header covers the start of a stream). Usage has `prompt_tokens`,
`completion_tokens` and `prompt_tokens_details.cached_tokens`. GET /metrics is vLLM's Prometheus
exposition (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc — the
running requests' tokens over `--kv-cache-tokens` —, vllm:num_preemptions_total, prefix-cache,
token counters, and the TTFT, queue-time and end-to-end histograms); GET /health answers ready.

Binds 127.0.0.1 by default, bounds request bodies, prints `ready http://HOST:PORT` once listening.
Imports nothing from latscope (targets/ are programs of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import deque
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from latscope.targets.echo import serve
from latscope.targets.stream import prompt_words

MAX_BODY_BYTES = 1 << 20
MAX_TOKENS = 10_000
MODEL = "latscope-causes"
LABELS = ("model_name", "engine")  # as vLLM labels its series (one engine here)
BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)


@dataclass(frozen=True)
class Engine:
    """The simulated engine's parameters (the command line's switches)."""

    slots: int = 8
    replicas: int = 1
    base_ms: float = 5.0
    per_prompt_token_ms: float = 0.0
    per_token_ms: float = 1.0
    jitter_ms: float = 0.0
    tokens: int = 16
    slow_replica: int = -1
    slow_replica_ms: float = 0.0
    pause_every_s: float = 0.0
    pause_ms: float = 0.0
    prefix_cache_tokens: int = 0
    cache_miss_fraction: float = 0.0
    kv_cache_tokens: int = 100_000
    seed: int = 0


@dataclass
class Job:
    """One request's simulated life, in monotonic seconds: arrival, start, first token, end."""

    arrival: float
    start: float
    first: float
    tokens: list[float]
    end: float
    replica: int
    prompt: int
    cached: int
    output: int


class Simulator:
    """The engine in virtual time: replicas' slots, stalls, the prefix cache, and what /metrics shows."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.started = time.monotonic()
        self.free = [[self.started] * engine.slots for _ in range(engine.replicas)]  # each slot's free-at time
        self.next_replica = 0
        self.rng = random.Random(engine.seed)
        self.live: deque[Job] = deque()  # jobs not yet ended, for the gauges (pruned at each scrape)
        # what /metrics shows, under vLLM's names and labels (prometheus_client writes the exposition)
        self.registry = CollectorRegistry()

        def metric(kind: type, name: str, **kw: object):  # noqa: ANN202 - the one child (labels) of a metric
            return kind(f"vllm:{name}", name.replace("_", " "), LABELS, registry=self.registry, **kw).labels(MODEL, "0")

        self.gauges = {name: metric(Gauge, name) for name in ("num_requests_running", "num_requests_waiting",
                                                               "kv_cache_usage_perc")}
        self.counters = {name: metric(Counter, name) for name in ("prompt_tokens", "generation_tokens",
                                                                   "prefix_cache_queries", "prefix_cache_hits",
                                                                   "request_success", "num_preemptions")}
        self.histograms = {name: metric(Histogram, name, buckets=BUCKETS_S) for name in (
            "time_to_first_token_seconds", "request_queue_time_seconds", "e2e_request_latency_seconds")}

    def _resume(self, t: float) -> float:
        """`t`, or the end of the stall it falls in."""
        every, pause = self.e.pause_every_s, self.e.pause_ms / 1000
        if every <= 0 or pause <= 0:
            return t
        into = (t - self.started) % every
        return t + (pause - into) if into < pause else t

    def _work(self, t: float, seconds: float) -> float:
        """When `seconds` of work started at `t` ends, stalls not counting as work."""
        every, pause = self.e.pause_every_s, self.e.pause_ms / 1000
        t = self._resume(t)
        if every <= 0 or pause <= 0:
            return t + seconds
        while True:  # run up to the next stall; if the work is not done, skip the stall and go on
            next_stall = self.started + ((t - self.started) // every + 1) * every
            if t + seconds <= next_stall:
                return t + seconds
            seconds -= next_stall - t
            t = next_stall + pause

    def admit(self, prompt: int, output: int) -> Job:
        """Queue one request that arrived now; its whole simulated life, decided at once (FIFO)."""
        e, now = self.e, time.monotonic()
        replica, self.next_replica = self.next_replica, (self.next_replica + 1) % e.replicas
        cached = min(e.prefix_cache_tokens, prompt)
        if cached and self.rng.random() < e.cache_miss_fraction:
            cached = 0
        slots = self.free[replica]
        slot = min(range(e.slots), key=slots.__getitem__)
        start = self._resume(max(now, slots[slot]))
        prefill_ms = e.base_ms + e.per_prompt_token_ms * (prompt - cached)
        if e.jitter_ms > 0:
            prefill_ms += self.rng.expovariate(1 / e.jitter_ms)
        if replica == e.slow_replica:
            prefill_ms += e.slow_replica_ms
        first = self._work(start, prefill_ms / 1000)
        tokens = [first]
        for _ in range(output - 1):
            tokens.append(self._work(tokens[-1], e.per_token_ms / 1000))
        job = Job(now, start, first, tokens, tokens[-1], replica, prompt, cached, output)
        slots[slot] = job.end
        self.live.append(job)
        c = self.counters
        c["prompt_tokens"].inc(prompt)
        c["prefix_cache_queries"].inc(prompt)
        c["prefix_cache_hits"].inc(cached)
        return job

    def finished(self, job: Job) -> None:
        """Count a request whose answer is written (its histograms' observations)."""
        self.counters["generation_tokens"].inc(job.output)
        self.counters["request_success"].inc()
        self.histograms["time_to_first_token_seconds"].observe(job.first - job.arrival)
        self.histograms["request_queue_time_seconds"].observe(job.start - job.arrival)
        self.histograms["e2e_request_latency_seconds"].observe(job.end - job.arrival)

    def metrics(self) -> str:
        """vLLM's exposition text, now."""
        now = time.monotonic()
        while self.live and self.live[0].end <= now:  # FIFO per replica; a rough prune, exact counts below
            self.live.popleft()
        live = [j for j in self.live if j.end > now]
        running = [j for j in live if j.start <= now]
        waiting = sum(1 for j in live if j.start > now)
        kv = min(1.0, sum(j.prompt + j.output for j in running) / max(1, self.e.kv_cache_tokens))
        for name, value in (("num_requests_running", len(running)), ("num_requests_waiting", waiting),
                            ("kv_cache_usage_perc", kv)):
            self.gauges[name].set(value)
        return generate_latest(self.registry).decode()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": None}}, status=status)


async def _until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def make_app(engine: Engine) -> web.Application:
    """The target's aiohttp application."""
    sim = Simulator(engine)

    async def complete(request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        try:
            req = json.loads(await request.read())
            if not isinstance(req, dict):
                raise ValueError("the body must be a JSON object")
            given = [req.get(k) for k in (("max_completion_tokens", "max_tokens") if chat else ("max_tokens",))]
            output = next((v for v in given if v is not None), engine.tokens)
            if type(output) is not int or not 1 <= output <= MAX_TOKENS:
                raise ValueError(f"max_tokens must be an integer in 1..{MAX_TOKENS}")
            prompt = prompt_words(req.get("messages") if chat else req.get("prompt"))
            stream = bool(req.get("stream"))
            include_usage = not stream or bool((req.get("stream_options") or {}).get("include_usage"))
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            return _error(400, str(exc))
        job = sim.admit(prompt, output)
        usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
                 "prompt_tokens_details": {"cached_tokens": job.cached}}
        meta = {"id": f"cmpl-{os.getpid()}-{id(job)}", "created": int(time.time()),
                "model": str(req.get("model", MODEL))}
        queue_ms = (job.start - job.arrival) * 1000
        compute_ms = ((job.first if stream else job.end) - job.start) * 1000
        headers = {"Server-Timing": f"queue;dur={queue_ms:.3f}, compute;dur={compute_ms:.3f}",
                   "X-Replica-Id": f"replica-{job.replica}"}
        if not stream:
            await _until(job.end)
            text = "".join(f" tok{i}" for i in range(output))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            sim.finished(job)
            return web.json_response({**meta, "object": "chat.completion" if chat else "text_completion",
                                      "choices": [choice], "usage": usage}, headers=headers)
        await _until(job.first)
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        for i, due in enumerate(job.tokens):
            await _until(due)
            choice = ({"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None} if chat
                      else {"index": 0, "text": f" tok{i}", "finish_reason": None})
            if i == output - 1:
                choice["finish_reason"] = "length"
            data = b"data: " + json.dumps({**meta, "object": obj, "choices": [choice]}).encode() + b"\n\n"
            if i == output - 1:
                if include_usage:
                    last = {**meta, "object": obj, "choices": [], "usage": usage}
                    data += b"data: " + json.dumps(last).encode() + b"\n\n"
                data += b"data: [DONE]\n\n"
            await response.write(data)
        sim.finished(job)
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready", "pid": os.getpid()})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "latscope"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=sim.metrics(), content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8767, help="0 picks a free one (printed on the ready line)")
    p.add_argument("--slots", type=int, default=8, help="requests one replica serves at once")
    p.add_argument("--replicas", type=int, default=1, help="replicas, each its own queue and slots (round-robin)")
    p.add_argument("--base-ms", type=float, default=5.0, help="prefill's fixed cost")
    p.add_argument("--per-prompt-token-ms", type=float, default=0.0, help="prefill's cost per uncached prompt token")
    p.add_argument("--per-token-ms", type=float, default=1.0, help="decode's cost per output token")
    p.add_argument("--jitter-ms", type=float, default=0.0,
                   help="mean of an exponential extra prefill time, i.i.d. per request (seeded): a clean tail")
    p.add_argument("--tokens", type=int, default=16, help="output tokens when the request sets no max_tokens")
    p.add_argument("--slow-replica", type=int, default=-1, help="this replica (0-based) is slow")
    p.add_argument("--slow-replica-ms", type=float, default=0.0, help="what the slow replica adds to each prefill")
    p.add_argument("--pause-every", type=float, default=0.0, metavar="S", help="a whole-engine stall every S s")
    p.add_argument("--pause-ms", type=float, default=0.0, help="each stall's length")
    p.add_argument("--prefix-cache-tokens", type=int, default=0, help="leading prompt tokens that hit the cache")
    p.add_argument("--cache-miss-fraction", type=float, default=0.0, help="requests that miss the cache (seeded)")
    p.add_argument("--kv-cache-tokens", type=int, default=100_000, help="KV-cache size, for kv_cache_usage_perc")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    times = (a.base_ms, a.per_prompt_token_ms, a.per_token_ms, a.jitter_ms, a.slow_replica_ms, a.pause_every,
             a.pause_ms)
    if a.slots < 1 or a.replicas < 1 or not 0 <= a.cache_miss_fraction <= 1 or min(times) < 0:
        p.error("slots and replicas must be >= 1, times >= 0, cache-miss-fraction in [0, 1]")
    if a.slow_replica >= a.replicas:
        p.error(f"--slow-replica must be below --replicas ({a.replicas}): replicas are numbered from 0")
    if a.pause_ms > 0 and a.pause_every * 1000 <= a.pause_ms:
        p.error("--pause-every must be longer than --pause-ms")
    engine = Engine(a.slots, a.replicas, a.base_ms, a.per_prompt_token_ms, a.per_token_ms, a.jitter_ms, a.tokens,
                    a.slow_replica, a.slow_replica_ms, a.pause_every, a.pause_ms, a.prefix_cache_tokens,
                    a.cache_miss_fraction, a.kv_cache_tokens, a.seed)
    serve(make_app(engine), a.host, a.port)


if __name__ == "__main__":
    main()
