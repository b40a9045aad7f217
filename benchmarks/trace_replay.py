"""Is the client on time when the traffic is a real LLM trace with long prompts? Send lag of one worker.

    python benchmarks/trace_replay.py                          # this checkout, 3 runs (~4 min)
    python benchmarks/trace_replay.py --before ../old --runs 3 # an older checkout too, alternating

Replays 60 s of Microsoft's Azure LLM conversation trace (`data/azure_llm_conv_trace.csv`,
from minute 10) sped up 20×, with every request's prompt and answer length as the trace gives them,
unscaled (prompts up to ~7,000 tokens; ~120 req/s, 42 % of the gaps under 1 ms), as streaming
/v1/completions, against `latscope.targets.stream` (first token after 20 ms, then one every 20 ms:
~24,000 token chunks/s to parse), with `latscope run --workers 1`, the real CLI in its own process.
Each run's summary.json gives send lag (actual send − intended send), the client's `encode` (building
each request's JSON body from a prompt of up to 7,000 words), event-loop lag, GC pauses and the
run's validity stamp. With --before DIR, runs of both checkouts alternate (before, this, before,
this, …) so drift of the shared machine falls on both; the older checkout is run from its own
directory with this venv (PYTHONPATH), so only latscope's code differs.

What it shows: whether building requests ahead of their intended time (engine.py's look-ahead
window) keeps the encode off the send path, and what else makes a send late on this machine.

Writes benchmarks/out/trace_replay-<time>.json and its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from common import (  # noqa: E402
    fmt, free_port, git_commit, machine_facts, machine_line, markdown_table, update_results_md, write_report_json,
)

SECTION_TITLE = "## trace replay send lag (benchmarks/trace_replay.py)"
TRACE = REPO / "data" / "azure_llm_conv_trace.csv"
METRICS = ("send_lag", "encode", "loop_lag", "gc_pause")


def scenario_yaml(port: int) -> str:
    return f"""name: trace-replay-20x
seed: 3
target:
  url: http://127.0.0.1:{port}
  protocol: openai
  model: m
  openai: {{api: completions, stream: true}}
  timeout: 60s
  launch:
    command: {sys.executable} -m latscope.targets.stream --port {port} --ttft-ms 20 --itl-ms 20
    ready_url: http://127.0.0.1:{port}/health
    ready_timeout: 30s
workload:
  classes:
    - {{name: conversation, prompt_tokens: 128, output_tokens: 32}}
phases:
  - name: replay
    duration: 60s
    arrival:
      type: trace
      file: {TRACE}
      start: 10m
      speedup: 20
      lengths: {{prompt_column: ContextTokens, output_column: GeneratedTokens}}
limits: {{max_in_flight: 4096}}
"""


def one_run(checkout: Path, work: Path) -> dict:
    """`latscope run --workers 1` of the trace from `checkout`; the numbers of its summary.json."""
    scenario = work / "trace.yaml"
    scenario.write_text(scenario_yaml(free_port()))
    out = work / "run"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-m", "latscope", "run", str(scenario), "--workers", "1", "--out", str(out)],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"latscope run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    row = {"validity": summary["validity"], "requests": summary["requests"]["completed"],
           "offered_rps": summary["throughput"]["offered_rps"]}
    for metric in METRICS:
        stats = summary["metrics"].get(metric, {}).get("all", {})
        row[metric] = {k: stats.get(k) for k in ("count", "p50_ms", "p99_ms", "p999_ms", "max_ms")}
    return row


def report_md(report: dict) -> str:
    rows = []
    for run in report["runs"]:
        s, e, l, g = (run[m] for m in METRICS)
        rows.append([run["checkout"], f"{run['requests']:,}", f"{run['offered_rps']:.1f}",
                     f"{fmt(s['p50_ms'], 3)} / {fmt(s['p99_ms'], 3)} / {fmt(s['max_ms'])}",
                     f"{fmt(e['p50_ms'], 3)} / {fmt(e['p99_ms'], 3)} / {fmt(e['max_ms'])}",
                     f"{fmt(l['p99_ms'], 3)} / {fmt(l['max_ms'])}", f"{g['count'] or 0} / {fmt(g['max_ms'])}", run["validity"]])
    table = markdown_table(["checkout", "requests", "req/s", "send lag p50 / p99 / max ms", "encode p50 / p99 / max ms",
                            "loop lag p99 / max ms", "GC pauses / max ms", "stamped"], rows)
    return f"""{SECTION_TITLE}

Run {report['finished_at']} with `python benchmarks/trace_replay.py{report['args']}` on {machine_line(report['machine'])}

60 s of the Azure LLM conversation trace from minute 10, sped up 20×, lengths unscaled (prompts up to
~7,000 tokens), streaming /v1/completions to `latscope.targets.stream` (20 ms to the first token, then
20 ms apart), `latscope run --workers 1` (the real CLI), one row per run; checkouts alternate. Send lag
= actual send − intended; encode = building the request's body; the stamp is the run's validity (send
lag p99 ≤ 1 ms and loop lag p99 ≤ 5 ms: valid).

{table}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="also run this (older) checkout, e.g. a `git worktree`")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    if not TRACE.is_file():
        raise SystemExit(f"the trace is not at {TRACE} (the shared data folder beside the repository)")
    checkouts = ([(f"before ({git_commit(args.before)})", args.before.resolve())] if args.before else []) + \
                [(f"this ({git_commit(REPO)})", REPO)]
    runs = []
    for i in range(args.runs):
        for name, checkout in checkouts:
            with tempfile.TemporaryDirectory() as work:
                row = {"checkout": name, **one_run(checkout, Path(work))}
            runs.append(row)
            s = row["send_lag"]
            print(f"  {name} run {i + 1}: send lag p99 {s['p99_ms']:.3f} ms, max {s['max_ms']:.2f} ms, "
                  f"encode p99 {row['encode']['p99_ms']:.3f} ms, {row['validity']}", flush=True)
    extra = (f" --before {args.before}" if args.before else "") + (f" --runs {args.runs}" if args.runs != 3 else "")
    report = {"finished_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": extra,
              "machine": machine_facts(("latscope", "uvloop", "httptools", "numpy")), "runs": runs}
    json_file = write_report_json(report, args.out, "trace_replay")
    section = report_md(report)
    print(section)
    if not args.no_results_md:
        update_results_md(section, SECTION_TITLE)
    print(f"wrote {json_file}")


if __name__ == "__main__":
    main()
