"""reference_server's decoder: tokens/s under continuous batching against its own decode-step ceiling.

    python benchmarks/generation.py            # ~8 min
    python benchmarks/generation.py --quick    # ~2 min, to check the script works

1. **The ceiling**: the built-in decoder (4 layers, hidden 256) alone in ONNX Runtime, 1 thread, on the core
   the server gets: one decode step of n sequences at a context of PROMPT + OUTPUT/2 tokens, for n up to
   the server's 64 sequences. A decode step gives each of its n sequences one token, so the model alone
   makes n / s(n) tokens/s; the ceiling is the best of those whose step still fits the inter-token SLO
   (s(n) <= ITL_LIMIT_MS). It leaves out prefill, which the server must also run: a bound, not a target.
2. **The server**: `latscope capacity` with OpenAI streaming completions (PROMPT-token prompts, exactly
   OUTPUT tokens each), Poisson arrivals, SLO inter-token latency p99 <= ITL_LIMIT_MS; the server launched
   by the scenario on a core of its own (`target.launch.cpus: 1`, 1 ONNX Runtime thread), latscope on the
   other. Its tokens/s is the output tokens per second of the highest passing step.

Traffic to 127.0.0.1 only. Results: a table on stdout, JSON under benchmarks/out/, and the "generation"
section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO, ceiling, fmt, free_port, machine_facts, machine_line, markdown_table, model_alone_ms, update_results_md,
    write_report_json,
)

sys.path.insert(0, str(REPO))
from latscope.capacity import CapacityOptions, find_capacity  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402
from reference_server.decoder import DecoderConfig, cached_decoder, past_names  # noqa: E402
from reference_server.model import DEFAULT_CACHE  # noqa: E402

TITLE = "## reference_server generation (benchmarks/generation.py)"
PROMPT, OUTPUT = 16, 64  # tokens per request
ITL_LIMIT_MS = 50.0
SEQUENCES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # decode batch sizes; 64 is the server's --max-sequences


def step_curve(seconds: float) -> dict[int, float]:
    """{sequences: median ms of one decode step} of the decoder alone (common.model_alone_ms), at a context of
    PROMPT + OUTPUT/2 tokens."""
    cfg = DecoderConfig()
    model, _ = cached_decoder(cfg, DEFAULT_CACHE.expanduser())
    context = PROMPT + OUTPUT // 2
    rng = np.random.default_rng(0)
    feeds = []
    for n in SEQUENCES:
        past = rng.standard_normal((n, cfg.heads, context, cfg.head_dim)).astype(np.float32) * 0.1
        feeds.append({"input_ids": np.ones((n, 1), np.int64), "position_ids": np.full((n, 1), context, np.int64),
                      "attention_mask": np.ones((n, context + 1), np.int64),
                      **{name: past for name in past_names(cfg.layers)}})
    return dict(zip(SEQUENCES, model_alone_ms(model, feeds, seconds)))


def decoder_ceiling(curve: dict[int, float]) -> dict:
    """The best tokens per second of a decode step that fits the inter-token SLO: max n / s(n), s(n) <= SLO."""
    n, ms, tokens_per_s = ceiling(curve, ITL_LIMIT_MS)
    return {"sequences": n, "step_ms": round(ms, 3), "tokens_per_s": round(tokens_per_s, 1)}


def scenario(rate: float, warmup_s: float, measure_s: float, runs: Path) -> dict:
    port = free_port()
    arrival = {"type": "poisson", "rate": rate}
    return {
        "name": "generation", "seed": 4,
        "target": {"url": f"http://127.0.0.1:{port}", "protocol": "openai", "model": "decoder", "timeout": "60s",
                   "openai": {"api": "completions", "stream": True},
                   "launch": {"command": ["python", "-m", "reference_server", "serve", "--http-port", str(port),
                                          "--grpc-port", "-1", "--threads", "1"],
                              "ready_url": f"http://127.0.0.1:{port}/v2/health/ready", "ready_timeout": "120s",
                              "cwd": str(REPO), "cpus": 1}},
        "workload": {"classes": [{"name": "gen", "prompt_tokens": PROMPT, "output_tokens": OUTPUT}]},
        "phases": [{"name": "warm", "duration": warmup_s, "warmup": True, "arrival": arrival},
                   {"name": "measure", "duration": measure_s, "arrival": arrival}],
        "slos": [{"metric": "itl", "stat": "p99", "limit_ms": ITL_LIMIT_MS}],
        "telemetry": {"nvml": False, "host": False},
        "validity": {"degraded_send_lag_p99_ms": 3},  # as benchmarks/reference_server.py: a shared core
        "output": {"dir": str(runs), "report": False, "save_schedule": False},
    }


def server_capacity(start: float, warmup_s: float, measure_s: float, max_steps: int, work: Path) -> dict:
    found = find_capacity(scenario_from_dict(scenario(start, warmup_s, measure_s, work / "runs")), work / "capacity",
                          CapacityOptions(precision=0.05, max_steps=max_steps, workers=1))
    steps = [{"rate": s["rate_rps"], "verdict": s["verdict"], "counted_as": s["counted_as"],
              "itl_p99_ms": s["slos"][0]["value"] if s.get("slos") else None,
              "output_tokens_per_s": s.get("output_tokens_per_s"), "note": s.get("note")} for s in found["steps"]]
    at = next((s for s in steps if s["counted_as"] == "pass" and s["rate"] == found["max_rate_rps"]), None)
    return {"max_rps": found["max_rate_rps"], "tokens_per_s": at and at["output_tokens_per_s"],
            "stopped": found["stopped"], "steps": steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args(argv)
    facts = machine_facts(("onnxruntime", "numpy", "aiohttp", "latscope"))
    print(f"machine: {machine_line(facts)}", flush=True)
    curve = step_curve(0.05 if args.quick else 0.5)
    bound = decoder_ceiling(curve)
    print(f"ceiling: {bound['tokens_per_s']} tokens/s ({bound['sequences']} sequences, {bound['step_ms']} ms a step)",
          flush=True)
    start = round(bound["tokens_per_s"] / OUTPUT / 4, 1)  # a quarter of the ceiling's request rate
    with tempfile.TemporaryDirectory(prefix="latscope-bench-gen-") as tmp:
        found = server_capacity(start, 2 if args.quick else 3, 5 if args.quick else 20, 3 if args.quick else 7,
                                Path(tmp))
    tokens = found["tokens_per_s"]
    print(f"server: {fmt(found['max_rps'], 2)} req/s, {fmt(tokens, 1)} tokens/s ({found['stopped']})", flush=True)
    report = {"machine": facts, "quick": args.quick, "curve_ms": curve, "ceiling": bound, "server": found}
    write_report_json(report, args.out, "generation")
    curve_rows = [[str(n), f"{ms:.2f}", f"{n / ms * 1e3:.0f}"] for n, ms in curve.items()]
    step_rows = [[f"{s['rate']:g}", fmt(s["itl_p99_ms"], 1), fmt(s["output_tokens_per_s"], 1), s["verdict"]]
                 for s in found["steps"]]
    section = f"""{TITLE}

Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python benchmarks/generation.py{' --quick' if args.quick else ''}` on \
{machine_line(facts)}. CPU only.

The built-in decoder (4 layers, hidden 256) alone, ONNX Runtime with 1 thread on the server's core: one decode
step of n sequences at a context of {PROMPT + OUTPUT // 2} tokens (each sequence gets one token per step).

{markdown_table(["sequences", "step ms", "tokens/s"], curve_rows)}

Ceiling (best n / s(n) with a step of at most {ITL_LIMIT_MS:g} ms, prefill left out): **{bound['tokens_per_s']} tokens/s**
({bound['sequences']} sequences, {bound['step_ms']:.1f} ms a step).

The server (continuous batching, up to 64 sequences; launched on a core of its own, 1 thread; latscope on the
other core): `latscope capacity` with streaming completions of {PROMPT} prompt tokens and exactly {OUTPUT} output
tokens, Poisson arrivals, SLO inter-token latency p99 <= {ITL_LIMIT_MS:g} ms:

{markdown_table(["rate, req/s", "ITL p99 ms", "output tokens/s", "verdict"], step_rows)}

**{fmt(tokens, 1)} tokens/s at {fmt(found['max_rps'], 2)} req/s: {f"{tokens / bound['tokens_per_s']:.0%}" if tokens else "–"} of the
ceiling** (search stopped: {found['stopped']}). Raw numbers: `{report['json_file']}`.
"""
    print("\n" + section)
    if not args.no_results_md and not args.quick:
        update_results_md(section, TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
