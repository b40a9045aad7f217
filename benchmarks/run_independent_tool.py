"""Run NVIDIA aiperf (an independent load generator) against an OpenAI-compatible endpoint.

Used to cross-check latscope's TTFT / ITL / e2e numbers on the reference server: run this
and latscope against the same server in the same sitting, at the same open-loop rate,
prompt and output length, and compare p50/p99. See benchmarks/independent_tool.md.

This script starts nothing but aiperf (and, when ``--tokenizer`` is not given, the tokenizer
builder, run with the tool venv's Python). The server must already be running.

    python benchmarks/run_independent_tool.py --url http://127.0.0.1:8799 --rate 3 \
        --requests 150 --prompt-tokens 128 --output-tokens 32 --out /tmp/aiperf-run \
        --tool-venv /tmp/venv-aiperf

Prints and writes ``OUT/independent_tool.json``::

    {"tool": "aiperf", "version": "0.13.0", "ttft_ms": {"p50": .., "p99": ..},
     "itl_ms": {...}, "e2e_ms": {...}, "requests": 150, "rate": 3.0, ...}

Definitions (aiperf 0.13, per request; percentiles over requests unless noted):

* ``ttft_ms``: first *content* chunk minus the moment aiperf actually sent the request (not the
  scheduled time: the scheduling lag is reported separately as ``send_lag_ms``).
* ``itl_ms``: aiperf's "Inter Token Latency" = (e2e - TTFT) / (output tokens - 1), one value per
  request -- the same definition as latscope's ``tpot``.
* ``chunk_gap_ms``: aiperf's "Inter Chunk Latency", every gap between consecutive content
  chunks, pooled over all requests -- the same definition as latscope's ``itl``.
* ``e2e_ms``: aiperf's "Request Latency", send to the last *content* chunk (the usage chunk and
  ``[DONE]`` are not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOKENIZER_BUILDER = HERE / "tokenizer_for_reference_server.py"
TOOL = "aiperf"


def tool_version(python: Path) -> str:
    """The installed aiperf version in the tool venv."""
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def tool_env() -> dict[str, str]:
    """Environment for aiperf: nothing may reach the Hugging Face Hub.

    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE must be *unset* for aiperf 0.13: with them set it
    resolves ``--tokenizer`` through ``snapshot_download(local_files_only=True)``, which rejects
    a local directory ("Repo id must be in the form ..."). Without them a local directory goes
    straight to ``AutoTokenizer.from_pretrained(dir)``, which makes no network call.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["DO_NOT_TRACK"] = "1"
    return env


def build_tokenizer(python: Path, venv: Path, out_dir: Path) -> Path:
    """Build the one-token-per-word tokenizer with the tool venv's Python (it has `tokenizers`)."""
    cmd = [str(python), str(TOKENIZER_BUILDER), str(out_dir)]
    corpus = sorted(venv.glob("lib/python*/site-packages/aiperf/dataset/generator/assets/shakespeare.txt"))
    if corpus:  # only makes the prompts look like English; token counts do not depend on it
        cmd += ["--corpus", str(corpus[0])]
    subprocess.run(cmd, check=True, env={**tool_env(), "HF_HUB_OFFLINE": "1"})
    return out_dir


def aiperf_command(args: argparse.Namespace, aiperf: Path, tokenizer: Path, artifacts: Path) -> list[str]:
    """The aiperf command line: open-loop fixed rate, streaming, exact prompt/output lengths."""
    cmd = [
        str(aiperf), "profile",
        "--model", args.model,
        "--url", args.url,
        "--endpoint-type", args.endpoint_type,
        "--streaming",
        "--use-legacy-max-tokens",          # send max_tokens (the server also takes max_completion_tokens)
        "--tokenizer", str(tokenizer),
        "--request-rate", str(args.rate),   # rate only, no --concurrency: open loop
        "--arrival-pattern", args.arrival,
        "--request-count", str(args.requests),
        "--isl", str(args.prompt_tokens),   # stddev defaults to 0: every prompt exactly this long
        "--osl", str(args.output_tokens),   # max_tokens; the server always returns exactly that many
        "--random-seed", str(args.seed),
        "--output-artifact-dir", str(artifacts),
        "--ui-type", "none",
        "--no-server-metrics",              # do not scrape the server's /metrics during the run
        "--no-gpu-telemetry",
    ]
    if args.warmup_requests:
        cmd += ["--warmup-request-count", str(args.warmup_requests)]
    return cmd


def pct(metric: dict[str, Any]) -> dict[str, float]:
    """p50/p99 (and mean) of one aiperf metric, in its own unit (ms for latencies)."""
    return {"p50": round(metric["p50"], 3), "p99": round(metric["p99"], 3), "mean": round(metric["avg"], 3)}


def summarize(export: dict[str, Any], args: argparse.Namespace, version: str, cmd: list[str]) -> dict[str, Any]:
    """Reduce aiperf's profile_export_aiperf.json to the comparison record."""
    return {
        "tool": TOOL,
        "version": version,
        "ttft_ms": pct(export["time_to_first_token"]),
        "itl_ms": pct(export["inter_token_latency"]),
        "e2e_ms": pct(export["request_latency"]),
        "chunk_gap_ms": pct(export["inter_chunk_latency"]),
        "send_lag_ms": pct(export["credit_to_start_latency"]) if "credit_to_start_latency" in export else None,
        "requests": int(export["request_count"]["avg"]),
        "errors": len(export.get("error_summary") or []),
        "error_rate_pct": export.get("request_error_rate", {}).get("avg"),
        "rate": args.rate,
        "achieved_rate": round(export["request_throughput"]["avg"], 3),
        "arrival": args.arrival,
        "endpoint_type": args.endpoint_type,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "output_tokens_p50": export.get("output_sequence_length", {}).get("p50"),
        "warmup_requests": args.warmup_requests,
        "start_time": export.get("start_time"),
        "end_time": export.get("end_time"),
        "definitions": {
            "ttft_ms": "first content chunk - request sent (per request)",
            "itl_ms": "(e2e - ttft) / (output_tokens - 1) per request (= latscope tpot)",
            "chunk_gap_ms": "every gap between content chunks, all requests pooled (= latscope itl)",
            "e2e_ms": "request sent -> last content chunk (per request)",
            "send_lag_ms": "scheduled (credit issued) -> request sent",
        },
        "command": cmd,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8799", help="server base URL (no /v1)")
    p.add_argument("--rate", type=float, default=3.0, help="open-loop request rate (req/s)")
    p.add_argument("--requests", type=int, default=150, help="requests to measure")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, required=True, help="directory for aiperf artifacts + summary")
    p.add_argument("--tool-venv", type=Path, default=Path("/tmp/venv-aiperf"), help="venv with aiperf")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="tokenizer dir (default: build one into OUT/tokenizer)")
    p.add_argument("--model", default="decoder")
    p.add_argument("--endpoint-type", choices=("completions", "chat"), default="completions")
    p.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    p.add_argument("--warmup-requests", type=int, default=0, help="sent first, excluded from stats")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    venv = args.tool_venv.resolve()
    python, aiperf = venv / "bin" / "python", venv / "bin" / "aiperf"
    if not aiperf.exists():
        sys.exit(f"{aiperf} not found: python3 -m venv {venv} && {venv}/bin/pip install aiperf")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer.resolve() if args.tokenizer else build_tokenizer(python, venv, out / "tokenizer")
    artifacts = out / "aiperf"

    cmd = aiperf_command(args, aiperf, tokenizer, artifacts)
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    budget_s = 180 + (args.requests + args.warmup_requests) / args.rate * 2
    started = time.monotonic()
    with open(out / "aiperf.log", "w") as log:
        proc = subprocess.run(cmd, env=tool_env(), stdout=log, stderr=subprocess.STDOUT, timeout=budget_s)
    export_path = artifacts / "profile_export_aiperf.json"
    if proc.returncode != 0 or not export_path.exists():
        tail = (out / "aiperf.log").read_text(errors="replace")[-3000:]
        sys.exit(f"aiperf failed (rc={proc.returncode}); see {out / 'aiperf.log'}\n{tail}")

    summary = summarize(json.loads(export_path.read_text()), args, tool_version(python), cmd)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    (out / "independent_tool.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
