"""latscope against an independent tool (NVIDIA aiperf) on the same reference server, same sitting.

    python3 -m venv /tmp/venv-aiperf && /tmp/venv-aiperf/bin/pip install aiperf   # once (~1.2 GB, ~2 min)
    python benchmarks/compare_aiperf.py [--rounds 2] [--requests 300] [--rate 3]

Starts one reference server, then alternates latscope and aiperf (latscope, aiperf, latscope, aiperf
…) with the same open-loop constant rate, the same 128-token prompts asking for 32 tokens over the
streaming /v1/completions API, and 10 warm-up requests each that neither counts. Alternating spreads
slow drift of this shared machine over both tools. Compares p50/p99 of each round pooled:

| latscope | aiperf 0.13 | definition |
| --- | --- | --- |
| ttft | time_to_first_token | request → first content chunk (latscope from the intended send time) |
| itl | inter_chunk_latency | every gap between content chunks |
| tpot | inter_token_latency | (e2e − ttft) / (tokens − 1), per request |
| latency | request_latency | end to end |

aiperf's clock starts when it actually sends; latscope's at the intended time (its send lag, tens of
µs, is in the table). The recipe for aiperf offline (local tokenizer, HF_HUB_OFFLINE unset) is in
benchmarks/independent_tool.md; run_independent_tool.py runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import run_independent_tool  # noqa: E402
from common import (  # noqa: E402
    fmt, free_port, machine_facts, machine_line, markdown_table, server_process, update_results_md, write_report_json,
)
from latscope.results.hlog import read_hlog  # noqa: E402
from latscope.recorder import merge, values_at  # noqa: E402
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402

SECTION_TITLE = "## latscope vs aiperf (benchmarks/compare_aiperf.py)"
PAIRS = (("ttft", "ttft_ms"), ("itl", "chunk_gap_ms"), ("tpot", "itl_ms"), ("latency", "e2e_ms"))
WARMUP = 10


def latscope_run(url: str, rate: float, requests: int, out: Path) -> Path:
    warmup_s, measure_s = WARMUP / rate, requests / rate
    scenario = {
        "name": "vs-aiperf", "seed": 1,
        "target": {"url": url, "protocol": "openai", "model": "decoder", "timeout": 60,
                   "openai": {"api": "completions", "stream": True, "include_usage": True}},
        "workload": {"classes": [{"name": "c", "prompt_tokens": 128, "output_tokens": 32}]},
        "phases": [{"name": "warmup", "duration": warmup_s, "warmup": True, "arrival": {"type": "constant", "rate": rate}},
                   {"name": "measure", "duration": measure_s, "arrival": {"type": "constant", "rate": rate}}],
    }
    return run_scenario(scenario_from_dict(scenario), out=out, workers=1).run_dir


def latscope_percentiles(run_dirs: list[Path]) -> dict:
    """{metric: {"p50", "p99"}} in ms, pooled over the runs' measured (non-warm-up) intervals."""
    out = {}
    for metric, _ in (*PAIRS, ("send_lag", None)):
        hists = []
        for run_dir in run_dirs:
            warmup_end = json.loads((run_dir / "summary.json").read_text())["phases"][1]["start_s"]
            hists += [h for tag, start, _, h in read_hlog(run_dir / "histograms.hlog") if tag == f"{metric}/all" and start >= warmup_end]
        values = values_at(merge(hists), [50.0, 99.0])
        out[metric] = {"p50": values[50.0] / 1000, "p99": values[99.0] / 1000}
    return out


def aiperf_percentiles(records: list[Path]) -> dict:
    """{aiperf metric: {"p50", "p99"}} in ms, pooled over rounds from the per-request export."""
    import numpy as np

    pooled: dict[str, list[float]] = {"ttft_ms": [], "chunk_gap_ms": [], "itl_ms": [], "e2e_ms": [], "send_lag_ms": []}
    for path in records:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            meta, m = record.get("metadata", {}), record.get("metrics", {})
            if meta.get("benchmark_phase") != "profiling":  # warm-up requests
                continue
            pooled["send_lag_ms"].append((meta["request_start_ns"] - meta["credit_issued_ns"]) / 1e6)
            for key, name in (("ttft_ms", "time_to_first_token"), ("itl_ms", "inter_token_latency"), ("e2e_ms", "request_latency")):
                if name in m:
                    pooled[key].append(float(m[name]["value"]))
            if "inter_chunk_latency" in m:
                pooled["chunk_gap_ms"] += [float(v) for v in m["inter_chunk_latency"]["value"]]
    return {k: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))} for k, v in pooled.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="measured requests per run")
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--tool-venv", type=Path, default=Path("/tmp/venv-aiperf"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    report = {"machine": machine_facts(("latscope", "numpy")), "rate": args.rate, "requests_per_run": args.requests, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="latscope-vs-aiperf-") as tmp:
        work = Path(tmp)
        command = [sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "-1",
                   "--cache-dir", str(work / "cache")]
        with server_process(command, f"{url}/v2/health/ready", work / "server.log"):
            runs, records = [], []
            for i in range(args.rounds):
                print(f"round {i + 1}: latscope …", flush=True)
                runs.append(latscope_run(url, args.rate, args.requests, work / f"latscope-{i}"))
                print(f"round {i + 1}: aiperf …", flush=True)
                run_independent_tool.main(["--url", url, "--rate", str(args.rate), "--requests", str(args.requests),
                                           "--prompt-tokens", "128", "--output-tokens", "32", "--warmup-requests", str(WARMUP),
                                           "--out", str(work / f"aiperf-{i}"), "--tool-venv", str(args.tool_venv)])
                records.append(work / f"aiperf-{i}" / "aiperf" / "profile_export.jsonl")
            report["latscope"], report["aiperf"] = latscope_percentiles(runs), aiperf_percentiles(records)
            report["rounds_detail"] = [{"latscope": latscope_percentiles([run]), "aiperf": aiperf_percentiles([record])}
                                       for run, record in zip(runs, records)]
            report["aiperf_version"] = run_independent_tool.tool_version(args.tool_venv / "bin" / "python")
    rows = []
    for ours, theirs in PAIRS:
        for p in ("p50", "p99"):
            a, b = report["latscope"][ours][p], report["aiperf"][theirs][p]
            rows.append([f"{ours} {p}", fmt(a), fmt(b), f"{(a - b) / b:+.1%}"])
    text = (f"{SECTION_TITLE}\n\nMachine: {machine_line(report['machine'])}; aiperf {report['aiperf_version']}\n\n"
            f"Reference server /v1/completions, streaming, 128-token prompts → 32 tokens, constant {args.rate:g} req/s, "
            f"{args.rounds} × {args.requests} measured requests per tool, alternating, pooled:\n\n"
            + markdown_table(["metric", "latscope ms", "aiperf ms", "difference"], rows)
            + f"\n\nSend lag p50/p99: latscope {fmt(report['latscope']['send_lag']['p50'], 3)} / {fmt(report['latscope']['send_lag']['p99'], 3)} ms, "
              f"aiperf {fmt(report['aiperf'].get('send_lag_ms', {}).get('p50'))} / {fmt(report['aiperf'].get('send_lag_ms', {}).get('p99'))} ms.\n")
    spread = "; ".join(
        f"{ours} p99 per round: latscope " + " / ".join(fmt(r["latscope"][ours]["p99"]) for r in report["rounds_detail"])
        + ", aiperf " + " / ".join(fmt(r["aiperf"][theirs]["p99"]) for r in report["rounds_detail"])
        for ours, theirs in PAIRS)
    text += f"\nRound to round (how much p99 moves between runs of one tool): {spread} ms.\n"
    print(text)
    write_report_json(report, args.out, "compare_aiperf")
    if not args.no_results_md:
        update_results_md(text, SECTION_TITLE)


if __name__ == "__main__":
    main()
