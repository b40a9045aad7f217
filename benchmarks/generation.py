"""reference_server's decoder: tokens/s under continuous batching against its own decode-step ceiling.

    python benchmarks/generation.py                    # ~10 min
    python benchmarks/generation.py --before ../old    # also the server of another checkout, same sitting (~+7 min)
    python benchmarks/generation.py --quick            # ~2 min, to check the script works

1. **The ceiling**: the built-in decoder (4 layers, hidden 256) alone in ONNX Runtime, 1 thread, on the core
   the server gets: one decode step of n sequences at a context of PROMPT + OUTPUT/2 tokens, for n up to
   the server's 64 sequences, through both of its graphs (decoder.py): the prefill graph (Concat: the whole
   cache written anew) and the decode step graph the server runs (GroupQueryAttention, the cache updated in
   place). A decode step gives each of its n sequences one token, so the model alone makes n / s(n)
   tokens/s; the ceiling is the best of those, either graph, whose step still fits the inter-token SLO
   (s(n) <= ITL_LIMIT_MS): taking the faster graph, a change of graph can only raise the bar. It leaves out
   prefill, which the server must also run: a bound, not a target.
2. **The server**: `latscope capacity` with OpenAI streaming completions (PROMPT-token prompts, exactly
   OUTPUT tokens each), Poisson arrivals, SLOs inter-token latency p99 <= ITL_LIMIT_MS, TTFT p99 <= TTFT_LIMIT_MS (keeping up) and errors <= 1 %; the server launched
   by the scenario on a core of its own (`target.launch.cpus: 1`, 1 ONNX Runtime thread), latscope on the
   other. Its tokens/s is the output tokens per second of the highest passing step. The search starts at a
   quarter of the ceiling's request rate (a search never goes below its start) and has 12 steps: on this box
   steps near the knee often stay undecided through three looks, and 7 steps ended between 48 and 60 req/s,
   unresolved. With `--before DIR` the reference server of that checkout is searched the same way, in the
   same sitting.
3. **A long prompt arriving mid-run**: the server alone on its core (1 thread), this script's own streaming
   client on the other. First a LONG_PROMPT-token prompt alone on the idle server (max_tokens 1): its TTFT
   is its prefill time, median of a few. Then STALL_STREAMS closed-loop streams (PROMPT tokens in, OUTPUT
   out, a new one as each ends) decode together; after a quiet stretch (their inter-token gaps: the baseline)
   a fresh LONG_PROMPT-token prompt arrives, several times, one at a time. The running streams' gaps that
   overlap an injection (from its arrival to its first token) are the injected ones; the ratio the issue
   bounds by 1/2 is (ITL p99 injected - ITL p99 baseline) / the long prompt's prefill time.

Traffic to 127.0.0.1 only. Results: a table on stdout, JSON under benchmarks/out/, and the "generation"
section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO, ceiling, cpus, fmt, free_port, git_commit, machine_facts, machine_line, markdown_table, model_alone_ms,
    server_process, update_results_md, write_report_json,
)

sys.path.insert(0, str(REPO))
from latscope.capacity import CapacityOptions, find_capacity  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402
from reference_server.decoder import (DecoderConfig, cached_decode_step, cached_decoder, past_names,  # noqa: E402
                                      present_names)
from reference_server.model import DEFAULT_CACHE  # noqa: E402

TITLE = "## reference_server generation (benchmarks/generation.py)"
PROMPT, OUTPUT = 16, 64  # tokens per request
ITL_LIMIT_MS = 50.0
TTFT_LIMIT_MS = 500.0  # what "keeping up" means: a stream starts within ~10 steps of its arrival
SEQUENCES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # decode batch sizes; 64 is the server's --max-sequences
LONG_PROMPT = 512  # tokens of the prompt that arrives mid-run
STALL_STREAMS = 32  # streams decoding while it arrives (half the server's 64 sequences)


def step_curves(seconds: float) -> dict[str, dict[int, float]]:
    """{graph: {sequences: median ms of one decode step}} of the decoder alone (common.model_alone_ms), every
    sequence at a context of PROMPT + OUTPUT/2 tokens: "prefill graph" (its Concat decode step, the cache
    written anew) and "decode step graph" (in place, its cache arrays with room for OUTPUT/2 more columns)."""
    cfg = DecoderConfig()
    prefill_graph, _ = cached_decoder(cfg, DEFAULT_CACHE.expanduser())
    step_graph, _ = cached_decode_step(cfg, DEFAULT_CACHE.expanduser())
    context = PROMPT + OUTPUT // 2
    rng = np.random.default_rng(0)
    concat, in_place = [], []
    for n in SEQUENCES:
        past = rng.standard_normal((n, cfg.heads, context, cfg.head_dim)).astype(np.float32) * 0.1
        one = {"input_ids": np.ones((n, 1), np.int64), "position_ids": np.full((n, 1), context, np.int64)}
        concat.append({**one, "attention_mask": np.ones((n, context + 1), np.int64),
                       **{name: past for name in past_names(cfg.layers)}})
        room = np.zeros((n, cfg.heads, context + OUTPUT // 2, cfg.head_dim), np.float32)
        room[:, :, :context] = past
        in_place.append({**one, "seqlens_k": np.full(n, context, np.int32),
                         "total_sequence_length": np.array(context + 1, np.int32),
                         **{name: room.copy() for name in past_names(cfg.layers)}})
    shared = dict(zip(present_names(cfg.layers), past_names(cfg.layers)))
    return {"prefill graph": dict(zip(SEQUENCES, model_alone_ms(prefill_graph, concat, seconds))),
            "decode step graph": dict(zip(SEQUENCES, model_alone_ms(step_graph, in_place, seconds, shared)))}


def decoder_ceiling(curves: dict[str, dict[int, float]]) -> dict:
    """The best tokens per second of a decode step that fits the inter-token SLO, either graph: max n / s(n),
    s(n) <= SLO."""
    (n, ms, tokens_per_s), graph = max(((ceiling(curve, ITL_LIMIT_MS), graph) for graph, curve in curves.items()),
                                       key=lambda found: found[0][2])
    return {"sequences": n, "step_ms": round(ms, 3), "tokens_per_s": round(tokens_per_s, 1), "graph": graph}


def scenario(rate: float, warmup_s: float, measure_s: float, runs: Path, server: Path = REPO) -> dict:
    """The capacity search's scenario, its server the reference server of the checkout `server`."""
    port = free_port()
    arrival = {"type": "poisson", "rate": rate}
    launch = {"command": ["python", "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "-1",
                          "--threads", "1"],
              "ready_url": f"http://127.0.0.1:{port}/v2/health/ready", "ready_timeout": "120s", "cwd": str(server),
              "cpus": 1}
    if server != REPO:
        launch["env"] = {"PYTHONPATH": str(server)}
    return {
        "name": "generation", "seed": 4,
        "target": {"url": f"http://127.0.0.1:{port}", "protocol": "openai", "model": "decoder", "timeout": "60s",
                   "openai": {"api": "completions", "stream": True}, "launch": launch},
        "workload": {"classes": [{"name": "gen", "prompt_tokens": PROMPT, "output_tokens": OUTPUT}]},
        "phases": [{"name": "warm", "duration": warmup_s, "warmup": True, "arrival": arrival},
                   {"name": "measure", "duration": measure_s, "arrival": arrival}],
        # ITL alone no longer bounds a step since the decoder stopped copying its whole cache (issue 34): past
        # saturation, 64 sequences still step in ~12 ms and the excess waits for a slot, so a step "passed" at
        # 164 req/s serving 2,963 of 10,496 tokens/s offered. A server that keeps up starts each stream within
        # a few steps; a backlog growing for 20 s takes its TTFT p99 past TTFT_LIMIT_MS within seconds.
        "slos": [{"metric": "itl", "stat": "p99", "limit_ms": ITL_LIMIT_MS},
                 {"metric": "ttft", "stat": "p99", "limit_ms": TTFT_LIMIT_MS},
                 {"stat": "error_rate", "max": 0.01}],
        "telemetry": {"nvml": False, "host": False},
        "validity": {"degraded_send_lag_p99_ms": 3},  # as benchmarks/reference_server.py: a shared core
        "output": {"dir": str(runs), "report": False, "save_schedule": False},
    }


def server_capacity(start: float, warmup_s: float, measure_s: float, max_steps: int, work: Path,
                    server: Path = REPO, tries: int = 2) -> dict:
    """`latscope capacity` on the server; a search latscope ends with `generator_limit` (one step's send lag over
    its mark, a moment of this 2-core box's own) is run again, once, as in benchmarks/reference_server.py."""
    out = Path(tempfile.mkdtemp(prefix="capacity-", dir=work))
    found = find_capacity(scenario_from_dict(scenario(start, warmup_s, measure_s, work / "runs", server)), out,
                          CapacityOptions(precision=0.05, max_steps=max_steps, workers=1))
    if found["stopped"] == "generator_limit" and tries > 1:
        print("  the generator fell behind in one step; searching again", flush=True)
        return server_capacity(start, warmup_s, measure_s, max_steps, work, server, tries - 1)
    steps = [{"rate": s["rate_rps"], "verdict": s["verdict"], "counted_as": s["counted_as"],
              "itl_p99_ms": s["slos"][0]["value"] if s.get("slos") else None,
              "ttft_p99_ms": s["slos"][1]["value"] if len(s.get("slos") or []) > 1 else None,
              "output_tokens_per_s": s.get("output_tokens_per_s"), "note": s.get("note")} for s in found["steps"]]
    at = next((s for s in steps if s["counted_as"] == "pass" and s["rate"] == found["max_rate_rps"]), None)
    return {"max_rps": found["max_rate_rps"], "tokens_per_s": at and at["output_tokens_per_s"],
            "stopped": found["stopped"], "steps": steps}


async def _stream(session, url: str, prompt: list[int], max_tokens: int) -> list[int]:
    """One streamed completion (token-id prompt): perf_counter_ns at which each token's SSE event was read."""
    body = {"model": "decoder", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    times: list[int] = []
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"completion answered {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                times.append(time.perf_counter_ns())
    return times


async def _long_prompt_run(url: str, streams: int, injections: int, quiet_s: float, spacing_s: float) -> dict:
    """Section 3 of the module docstring against the server at `url`: every number in ms."""
    import aiohttp

    rng = np.random.default_rng(34)
    vocab = DecoderConfig().vocab
    fresh = lambda n: [int(t) for t in rng.integers(0, vocab, n)]  # noqa: E731 - never a prefix-cache hit
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        alone = []
        for _ in range(5):
            sent = time.perf_counter_ns()
            alone.append(((await _stream(session, url, fresh(LONG_PROMPT), 1))[0] - sent) / 1e6)
        gaps: list[tuple[int, int]] = []  # (end ns, gap ns) of every running stream's inter-token gap
        stop = asyncio.Event()

        async def running() -> None:
            while not stop.is_set():
                times = await _stream(session, url, fresh(PROMPT), OUTPUT)
                gaps.extend((b, b - a) for a, b in zip(times, times[1:]))

        tasks = [asyncio.create_task(running()) for _ in range(streams)]
        try:
            await asyncio.sleep(2.0)  # the batch fills
            quiet = (time.perf_counter_ns(), time.perf_counter_ns() + int(quiet_s * 1e9))
            await asyncio.sleep(quiet_s)
            windows = []
            for _ in range(injections):
                sent = time.perf_counter_ns()
                windows.append((sent, (await _stream(session, url, fresh(LONG_PROMPT), 1))[0]))
                await asyncio.sleep(spacing_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    baseline = [g for end, g in gaps if quiet[0] < end <= quiet[1]]
    injected = [g for end, g in gaps if any(end > a and end - g < b for a, b in windows)]
    prefill = float(np.median(alone))
    p99 = lambda xs: float(np.percentile(xs, 99)) / 1e6 if xs else None  # noqa: E731
    base_p99, injected_p99 = p99(baseline), p99(injected)
    rise = injected_p99 - base_p99 if base_p99 is not None and injected_p99 is not None else None
    return {"streams": streams, "long_prompt_tokens": LONG_PROMPT, "prefill_alone_ms": round(prefill, 2),
            "prefill_alone_runs_ms": [round(x, 2) for x in alone], "injections": injections,
            "itl_p99_baseline_ms": base_p99 and round(base_p99, 2),
            "itl_p99_injected_ms": injected_p99 and round(injected_p99, 2),
            "itl_max_injected_ms": round(max(injected) / 1e6, 2) if injected else None,
            "gaps_baseline": len(baseline), "gaps_injected": len(injected),
            "rise_ms": rise and round(rise, 2), "ratio": rise and round(rise / prefill, 3)}


def long_prompt_stall(quick: bool, work: Path, server_flags: list[str] | None = None) -> dict:
    """A LONG_PROMPT-token prompt arriving while STALL_STREAMS streams decode (section 3 of the docstring)."""
    port = free_port()
    client_cpu, server_cpu = cpus()
    command = [sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "-1",
               "--threads", "1", *(server_flags or [])]
    with server_process(command, f"http://127.0.0.1:{port}/v2/health/ready", work / "server.log", server_cpu):
        pinned = client_cpu is not None and hasattr(os, "sched_setaffinity")
        before = os.sched_getaffinity(0) if pinned else None
        if pinned:
            os.sched_setaffinity(0, {client_cpu})
        try:
            return asyncio.run(_long_prompt_run(f"http://127.0.0.1:{port}", STALL_STREAMS, 3 if quick else 8,
                                                2.0 if quick else 5.0, 0.5))
        finally:
            if pinned:
                os.sched_setaffinity(0, before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--only-long-prompt", action="store_true",
                        help="run section 3 only (no ceiling, no capacity search; no RESULTS.md)")
    parser.add_argument("--before", type=Path, help="a checkout whose reference server is searched too (same sitting)")
    parser.add_argument("--server-flag", action="append", default=[],
                        help="extra flag for the server of section 3 (repeatable), e.g. "
                             "--server-flag=--max-prefill-tokens=4096")
    args = parser.parse_args(argv)
    if args.only_long_prompt:
        with tempfile.TemporaryDirectory(prefix="latscope-bench-gen-") as tmp:
            long = long_prompt_stall(args.quick, Path(tmp), args.server_flag)
        print(long, flush=True)
        return 0
    facts = machine_facts(("onnxruntime", "numpy", "aiohttp", "latscope"))
    print(f"machine: {machine_line(facts)}", flush=True)
    curves = step_curves(0.05 if args.quick else 0.5)
    bound = decoder_ceiling(curves)
    print(f"ceiling: {bound['tokens_per_s']} tokens/s ({bound['sequences']} sequences, {bound['step_ms']} ms a step, "
          f"{bound['graph']})", flush=True)
    start = round(bound["tokens_per_s"] / OUTPUT / 4, 1)  # a quarter of the ceiling's request rate
    phases = (2, 5, 3) if args.quick else (3, 20, 12)  # warm-up s, measured s, steps
    with tempfile.TemporaryDirectory(prefix="latscope-bench-gen-") as tmp:
        found = server_capacity(start, *phases, Path(tmp))
        tokens = found["tokens_per_s"]
        print(f"server: {fmt(found['max_rps'], 2)} req/s, {fmt(tokens, 1)} tokens/s ({found['stopped']})", flush=True)
        before = None
        if args.before:
            before = {"commit": git_commit(args.before),
                      **server_capacity(start, *phases, Path(tmp), args.before.resolve())}
            print(f"before ({before['commit']}): {fmt(before['max_rps'], 2)} req/s, {fmt(before['tokens_per_s'], 1)} "
                  f"tokens/s ({before['stopped']})", flush=True)
        long = long_prompt_stall(args.quick, Path(tmp), args.server_flag)
    print(f"long prompt: {long}", flush=True)
    report = {"machine": facts, "quick": args.quick, "curves_ms": curves, "ceiling": bound, "server": found,
              "before": before, "long_prompt": long}
    write_report_json(report, args.out, "generation")
    concat, in_place = curves["prefill graph"], curves["decode step graph"]
    curve_rows = [[str(n), f"{concat[n]:.2f}", f"{n / concat[n] * 1e3:.0f}", f"{in_place[n]:.2f}",
                   f"{n / in_place[n] * 1e3:.0f}"] for n in SEQUENCES]
    searches = [("this checkout", found)] + ([(f"before ({before['commit']})", before)] if before else [])
    step_rows = [[name, f"{s['rate']:g}", fmt(s["itl_p99_ms"], 1), fmt(s.get("ttft_p99_ms"), 1),
                  fmt(s["output_tokens_per_s"], 1), s["verdict"]] for name, search in searches for s in search["steps"]]
    of_ceiling = lambda t: f"{t / bound['tokens_per_s']:.0%}" if t else "–"  # noqa: E731
    verdicts = "; ".join(f"{name}: **{fmt(search['tokens_per_s'], 1)} tokens/s at {fmt(search['max_rps'], 2)} req/s, "
                         f"{of_ceiling(search['tokens_per_s'])} of the ceiling** (search stopped: {search['stopped']})"
                         for name, search in searches)
    section = f"""{TITLE}

Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python benchmarks/generation.py{' --quick' if args.quick else ''}` on \
{machine_line(facts)}. CPU only.

The built-in decoder (4 layers, hidden 256) alone, ONNX Runtime with 1 thread on the server's core: one decode
step of n sequences at a context of {PROMPT + OUTPUT // 2} tokens (each sequence gets one token per step), through
the prefill graph (Concat: the whole cache written anew each step) and through the decode step graph the server
runs (GroupQueryAttention, the cache updated in place; reference_server/decoder.py).

{markdown_table(["sequences", "prefill graph: step ms", "tokens/s", "decode step graph: step ms", "tokens/s"], curve_rows)}

Ceiling (best n / s(n) with a step of at most {ITL_LIMIT_MS:g} ms, either graph, prefill left out):
**{bound['tokens_per_s']} tokens/s** ({bound['sequences']} sequences, {bound['step_ms']:.1f} ms a step, {bound['graph']}).

The server (continuous batching, up to 64 sequences; launched on a core of its own, 1 thread; latscope on the
other core): `latscope capacity` with streaming completions of {PROMPT} prompt tokens and exactly {OUTPUT} output
tokens, Poisson arrivals, SLOs inter-token latency p99 <= {ITL_LIMIT_MS:g} ms, TTFT p99 <= {TTFT_LIMIT_MS:g} ms (the server
keeps up: past saturation the excess waits for a sequence slot while ITL stays low) and errors <= 1 %:

{markdown_table(["server", "rate, req/s", "ITL p99 ms", "TTFT p99 ms", "output tokens/s", "verdict"], step_rows)}

{verdicts}.

A {LONG_PROMPT}-token prompt arriving mid-run (the server alone on its core, this script's client on the other):
alone on the idle server its TTFT (its prefill) is {fmt(long['prefill_alone_ms'], 1)} ms (median of 5). While {long['streams']} closed-loop
streams ({PROMPT} tokens in, {OUTPUT} out) decode, it arrives {long['injections']} times. The running streams' ITL p99 is
{fmt(long['itl_p99_baseline_ms'], 1)} ms without it ({long['gaps_baseline']} gaps) and {fmt(long['itl_p99_injected_ms'], 1)} ms over the gaps that overlap an
injection ({long['gaps_injected']} gaps, longest {fmt(long['itl_max_injected_ms'], 1)} ms): **it raises their ITL p99 by {fmt(long['rise_ms'], 1)} ms,
{fmt(long['ratio'], 2)} of its own prefill time** (issue 34 asks for under 0.5).
Raw numbers: `{report['json_file']}`.
"""
    print("\n" + section)
    if not args.no_results_md and not args.quick:
        update_results_md(section, TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
