"""A launched target with cores of its own (`target.launch.cpus`): the target is pinned to the last
cores, latscope and its workers to the rest, the default worker count is what is left, and the
parent gets its cores back afterwards. Real processes; Linux only (affinity is a Linux call)."""

from __future__ import annotations

import json
import os
import urllib.request

import psutil
import pytest

from conftest import free_port
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity (Linux) and at least two usable cores",
)


def test_launched_target_gets_its_own_core_and_latscope_the_rest(tmp_path):
    port = free_port()
    cores = sorted(os.sched_getaffinity(0))
    data = {
        "name": "pinned",
        "target": {
            "url": f"http://127.0.0.1:{port}",
            "launch": {
                "command": f"python -m latscope.targets.echo --port {port}",
                "ready_url": f"http://127.0.0.1:{port}/health",
                "cpus": 1,
            },
        },
        "phases": [{"name": "p", "duration": 1.0, "arrival": {"type": "constant", "rate": 20}}],
        "output": {"dir": str(tmp_path), "interval": 0.25},
    }
    seen: dict[str, set[int]] = {}

    def look(_progress) -> None:
        if "target" not in seen:
            pid = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2))["pid"]
            seen["target"] = os.sched_getaffinity(pid)
            seen["parent"] = os.sched_getaffinity(0)
            workers = [c for c in psutil.Process().children() if "spawn_main" in " ".join(c.cmdline())]
            assert len(workers) == len(cores) - 1
            seen["workers"] = set().union(*(os.sched_getaffinity(w.pid) for w in workers))

    result = run_scenario(scenario_from_dict(data), on_progress=look)
    assert seen["target"] == {cores[-1]}
    assert seen["parent"] == seen["workers"] == set(cores[:-1])
    assert result.summary["generator"]["workers"] == len(cores) - 1
    assert result.summary["requests"]["completed"] == 20
    assert sorted(os.sched_getaffinity(0)) == cores, "the parent gets every core back after the run"
