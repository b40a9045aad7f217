"""Does latscope's NVML telemetry see a loaded GPU? A check of the real NVML path (the tests use a fake).

    python benchmarks/gpu_telemetry.py              # 15 s of GPU load, sampled at 4 Hz
    python benchmarks/gpu_telemetry.py --seconds 30

A PyTorch loop keeps GPU 0 busy — half the time FP16 matmuls (compute: GPU and SM utilization), half
the time large device-to-device copies (DRAM bandwidth) — while a short latscope run (built-in target
on 127.0.0.1, `telemetry.nvml: true`) samples NVML. Then telemetry.parquet is read back and, per
metric of gpu0, the mean and max while loaded are printed, with environment.gpus from summary.json.

Exit status: 0 when GPU utilization and the memory figure (GPM DRAM-bandwidth utilization where the
GPU has GPM, e.g. Hopper; else NVML's memory-utilization counter) were both non-zero; 1 when not;
2 when it cannot run here (no PyTorch, no CUDA device).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import free_port  # noqa: E402


def gpu_load(torch, stop: threading.Event, loaded: threading.Event) -> None:
    """Alternate ~0.25 s of matmuls and ~0.25 s of 1 GiB copies on cuda:0 until `stop`."""
    device = torch.device("cuda:0")
    a = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    src = torch.empty(256 * 2**20, device=device, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    loaded.set()
    while not stop.is_set():
        end = time.monotonic() + 0.25
        while time.monotonic() < end:
            torch.matmul(a, b)
            torch.cuda.synchronize()
        end = time.monotonic() + 0.25
        while time.monotonic() < end:
            dst.copy_(src)
            torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the loaded latscope run")
    parser.add_argument("--out", type=Path, help="results directory (default: a temporary one)")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("gpu_telemetry: PyTorch is not installed; this check needs it to load the GPU (pip install torch)")
        return 2
    if not torch.cuda.is_available():
        print("gpu_telemetry: PyTorch sees no CUDA device; this check needs an NVIDIA GPU")
        return 2

    from latscope.errors import LatscopeError
    from latscope.run import run_scenario
    from latscope.scenario import scenario_from_dict
    import pandas as pd

    out = args.out or Path(tempfile.mkdtemp(prefix="latscope-gpu-telemetry-")) / "run"
    port = free_port()
    scenario = scenario_from_dict({
        "name": "gpu-telemetry",
        "target": {"url": f"http://127.0.0.1:{port}", "method": "POST", "path": "/infer",
                   "launch": {"command": f"python -m latscope.targets.echo --port {port}",
                              "ready_url": f"http://127.0.0.1:{port}/health", "cwd": str(REPO)}},
        "phases": [{"name": "loaded", "duration": args.seconds, "arrival": {"type": "constant", "rate": 20}}],
        "telemetry": {"interval": 0.25, "nvml": True, "host": True},
        "output": {"dir": str(out.parent), "save_schedule": False},
    })

    stop, loaded = threading.Event(), threading.Event()
    load = threading.Thread(target=gpu_load, args=(torch, stop, loaded), daemon=True)
    load.start()
    if not loaded.wait(120):
        print("gpu_telemetry: the GPU load did not start within 120 s")
        return 1
    try:
        result = run_scenario(scenario, out=out, workers=1)
    except LatscopeError as exc:  # e.g. NVML not starting next to a CUDA that works: say it, do not trace
        print(f"gpu_telemetry: {exc}")
        return 1
    finally:
        stop.set()
        load.join(30)

    df = pd.read_parquet(result.run_dir / "telemetry.parquet")
    gpu = df[(df.source == "nvml") & (df.device == "gpu0") & df.t_s.between(0, args.seconds)]
    print(f"results: {result.run_dir}")
    print("environment.gpus:", json.dumps(result.summary["environment"]["gpus"], indent=2))
    print(f"{'metric':<20} {'samples':>8} {'mean':>14} {'max':>14}")
    for metric, values in gpu.groupby("metric").value:
        print(f"{metric:<20} {len(values):>8} {values.mean():>14,.2f} {values.max():>14,.2f}")
    peak = gpu.groupby("metric").value.max()
    memory_metric = "mem_bw_util_pct" if "mem_bw_util_pct" in peak else "mem_util_pct"
    util, memory = peak.get("gpu_util_pct", 0.0), peak.get(memory_metric, 0.0)
    ok = util > 0 and memory > 0
    print(f"{'OK' if ok else 'FAIL'}: max gpu_util_pct {util:.1f} %, max {memory_metric} {memory:.1f} %")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
