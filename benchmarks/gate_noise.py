"""Does the CI gate flake on noise? A/A pairs of a real scenario, judged by a naive rule and by latscope.

    python benchmarks/gate_noise.py                 # 10 pairs of 30 s runs: ~15 min
    python benchmarks/gate_noise.py --pairs 3 --duration 10   # a quick look

Every run is the same build: scenarios/smoke.yaml's request (the reference server's encoder),
Poisson arrivals at `--rate` req/s for `--duration` s after a 2 s warm-up,
against one reference server on 127.0.0.1 (`--server-flags`, default a one-layer encoder on one thread). The runs are paired (1st with 2nd, 3rd with 4th, ...):
the first of a pair is the baseline, the second the "new build". Nothing changed, so any failure is
a false alarm. Two gates judge each pair:

* naive: fail when the new p99 is more than 10 % above the baseline's (summary.json values), the
  static threshold most CI setups use;
* latscope: `latscope gate NEW --baseline BASE` with the default policy (p50 and p99, 10 % budget,
  2 % false-failure budget): exit 3 is a false failure, exit 4 an honest "cannot decide", 0 a pass.

Results: a table on stdout and benchmarks/results/gate_noise.json; the runs themselves stay under
benchmarks/out/gate_noise-<UTC time>/ (git-ignored) to be gated again. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, free_port, machine_facts, machine_line, markdown_table, server_process  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "gate_noise.json"


def latscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latscope.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**__import__("os").environ, "GITHUB_ACTIONS": ""})


def one_run(out: Path, url: str, rate: float, duration: float, workers: int) -> dict:
    res = latscope("run", str(REPO / "scenarios" / "smoke.yaml"), "--quiet", "--workers", str(workers), "--out", str(out),
                   "--set", f"target.url={url}", "--set", "target.launch=null", "--set", "phases.0.duration=2s",
                   "--set", f"phases.1.duration={duration}s", "--set", f"phases.1.arrival.rate={rate}",
                   "--set", "limits.timer=coarse", "--set", "slos=[]")
    if res.returncode != 0:
        raise RuntimeError(f"run failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--rate", type=float, default=100.0, help="req/s (Poisson)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--server-flags", default="--threads 1 --layers 1",
                    help="reference server flags (default: a one-layer encoder on one thread, so that the 2-core "
                         "machine's generator and server do not starve each other)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    facts = machine_facts(("hdrhistogram", "numpy", "onnxruntime"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows, pairs = [], []
    keep = REPO / "benchmarks" / "out" / f"gate_noise-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"  # git-ignored
    keep.mkdir(parents=True, exist_ok=True)
    tmp = str(keep)
    with server_process(
        [sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "0", *args.server_flags.split()],
        f"{url}/v2/health/ready", Path(tmp) / "server.log",
    ):
        for i in range(args.pairs):
            t0 = time.monotonic()
            base_dir, new_dir = Path(tmp) / f"pair{i}-base", Path(tmp) / f"pair{i}-new"
            base = one_run(base_dir, url, args.rate, args.duration, args.workers)
            new = one_run(new_dir, url, args.rate, args.duration, args.workers)
            b99, n99 = base["metrics"]["latency"]["all"]["p99_ms"], new["metrics"]["latency"]["all"]["p99_ms"]
            naive_fail = n99 > 1.10 * b99
            gate = latscope("gate", str(new_dir), "--baseline", str(base_dir))
            p99_line = next((l for l in gate.stdout.splitlines() if "regression  latency/all p99" in l), "")
            pair = {"pair": i, "base_p99_ms": b99, "new_p99_ms": n99, "p99_change": n99 / b99 - 1,
                    "naive": "fail" if naive_fail else "pass", "latscope_exit": gate.returncode,
                    "latscope_p99": p99_line.split()[0] if p99_line else None,
                    "validity": [base["validity"], new["validity"]], "n": [base["metrics"]["latency"]["all"]["count"],
                                                                          new["metrics"]["latency"]["all"]["count"]],
                    "latscope_output": gate.stdout}
            pairs.append(pair)
            verdict = {0: "pass", 1: "SLO", 3: "FAIL (regression)", 4: "inconclusive"}.get(gate.returncode, str(gate.returncode))
            rows.append([str(i), f"{b99:.2f}", f"{n99:.2f}", f"{n99 / b99 - 1:+.1%}", "FAIL" if naive_fail else "pass", verdict])
            print(f"pair {i}: base p99 {b99:.2f} ms, new {n99:.2f} ms ({n99 / b99 - 1:+.1%}); naive "
                  f"{'FAIL' if naive_fail else 'pass'}, latscope exit {gate.returncode} ({time.monotonic() - t0:.0f} s)", flush=True)

    naive_fails = sum(p["naive"] == "fail" for p in pairs)
    gate_fails = sum(p["latscope_exit"] == 3 for p in pairs)
    gate_inconclusive = sum(p["latscope_exit"] == 4 for p in pairs)
    table = markdown_table(["pair", "base p99 ms", "new p99 ms", "change", "naive (p99 ≤ +10 %)", "latscope gate"], rows)
    print()
    print(table)
    print(f"\nA/A false failures: naive {naive_fails}/{len(pairs)}, latscope {gate_fails}/{len(pairs)} "
          f"(inconclusive {gate_inconclusive}/{len(pairs)})")
    print(machine_line(facts))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "pairs": args.pairs, "duration_s": args.duration, "rate_rps": args.rate, "workers": args.workers,
        "server_flags": args.server_flags,
        "naive_false_failures": naive_fails, "latscope_false_failures": gate_fails,
        "latscope_inconclusive": gate_inconclusive, "machine": facts, "per_pair": pairs,
    }, indent=2, default=str) + "\n")
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")


if __name__ == "__main__":
    main()
