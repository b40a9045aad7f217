"""Whole runs: interruptions, dead and misbehaving targets, launched targets. Real processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from aiohttp import web

from latscope.results.hlog import read_hlog
from latscope.results import read_events
from helpers import read_summary, run_cli_until
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

from conftest import free_port, scenario_dict, serve

LATSCOPE = [sys.executable, "-m", "latscope.cli"]


def assert_complete_results(run_dir: Path) -> dict:
    """Every file of the results contract exists and parses."""
    summary = read_summary(run_dir)
    for name in ("scenario.yaml", "histograms.hlog", "timeseries.parquet", "events.jsonl", "schedule.parquet"):
        assert (run_dir / name).is_file(), name
    yaml.safe_load((run_dir / "scenario.yaml").read_text())
    list(read_hlog(run_dir / "histograms.hlog"))
    pd.read_parquet(run_dir / "timeseries.parquet")
    pd.read_parquet(run_dir / "schedule.parquet")
    read_events(run_dir)
    assert not list(run_dir.glob(".*.tmp")), "temporary files left behind"
    return summary


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_run_leaves_complete_partial_results(target, tmp_path, sig):
    url = target(delay_ms=1)
    data = scenario_dict(url, tmp_path, [{"name": "long", "duration": 30, "arrival": {"type": "poisson", "rate": 100}}])
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    code, output = run_cli_until(path, out, 3, sig, workers=2)
    assert code == 1, output
    summary = assert_complete_results(out)
    assert summary["partial"] is True
    assert signal.Signals(sig).name in summary["abort_reason"]
    # About 3 s of a 30 s run was measured, and nothing was lost on the way out.
    assert 150 < summary["requests"]["completed"] < 1000
    assert summary["requests"]["not_sent"] > 2000
    assert summary["metrics"]["latency"]["all"]["count"] == summary["requests"]["completed"]
    assert any(e["event"] == "abort" for e in read_events(out))


def test_refused_connections_are_counted_not_fatal(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    data = scenario_dict(url, tmp_path, [{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 50}}])
    s = run_scenario(scenario_from_dict(data), workers=1).summary
    assert s["partial"] is False
    assert s["errors"]["connect"] == s["requests"]["sent"] == 100
    assert s["requests"]["completed"] == 0
    assert "latency" not in s["metrics"]
    assert "cannot connect" in s["error_examples"]["connect"][0]


def _status_app() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        n = int(request.query.get("n", "0"))
        return web.Response(status={0: 200, 1: 404, 2: 503}[n % 3])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def test_http_errors_timeouts_and_garbage_are_classified(tmp_path):
    with serve(_status_app()) as url:
        data = scenario_dict(
            url, tmp_path, [{"name": "p", "duration": 1.5, "arrival": {"type": "constant", "rate": 20}}],
            workload={"classes": [{"name": f"c{i}", "path": f"/x?n={i}"} for i in range(3)]},
        )
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    by_class = s["requests_by_class"]
    assert s["errors"]["http_4xx"] == by_class["c1"]["sent"] > 0
    assert s["errors"]["http_5xx"] == by_class["c2"]["sent"] > 0
    assert s["requests"]["completed"] == by_class["c0"]["sent"] > 0
    assert s["error_examples"]["http_5xx"][0].startswith("HTTP 503")

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"this is not HTTP\r\n\r\n")
        await writer.drain()
        writer.close()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response()

    slow_app = web.Application()
    slow_app.router.add_route("*", "/{tail:.*}", slow)
    with serve(slow_app) as slow_url:
        data = scenario_dict(slow_url, tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 10}}])
        data["target"]["timeout"] = 0.2
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    assert s["errors"]["timeout"] == 10

    port = free_port()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(garbage, "127.0.0.1", port))
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        data = scenario_dict(f"http://127.0.0.1:{port}", tmp_path,
                             [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 10}}])
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert s["errors"]["protocol"] == 10, s["error_examples"]


def test_overflow_drop_counts_dropped_requests(target, tmp_path):
    url = target(delay_ms=200)
    data = scenario_dict(url, tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 50}}],
                         limits={"max_in_flight": 2, "overflow": "drop"})
    s = run_scenario(scenario_from_dict(data), workers=1).summary
    # 2 slots, each busy 200 ms: at most ~2 per 200 ms get through = about 10 of 50 in 1 s.
    assert s["requests"]["dropped"] >= 30
    assert s["requests"]["sent"] + s["requests"]["dropped"] == 50
    assert s["validity"] == "degraded"


def _launch_scenario(tmp_path: Path, port: int, duration: float) -> dict:
    return {
        "name": "launched",
        "target": {
            "url": f"http://127.0.0.1:{port}",
            "launch": {
                "command": f"python -m latscope.targets.echo --port {port} --delay-ms 1",
                "ready_url": f"http://127.0.0.1:{port}/health",
            },
        },
        "phases": [{"name": "p", "duration": duration, "arrival": {"type": "constant", "rate": 20}}],
        "output": {"dir": str(tmp_path)},
    }


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_launched_target_is_started_and_stopped(tmp_path):
    port = free_port()
    result = run_scenario(scenario_from_dict(_launch_scenario(tmp_path, port, 1.0)), workers=1)
    s = result.summary
    assert s["requests"]["completed"] == 20
    assert s["generator"]["target_ready_after_s"] > 0
    events = read_events(result.run_dir)
    names = [e["event"] for e in events]
    assert names.index("target_launch") < names.index("target_ready") < names.index("run_start")
    # on the run's clock: before t = 0, ready after the time the summary gives
    launch, ready = events[names.index("target_launch")], events[names.index("target_ready")]
    assert launch["t_s"] < ready["t_s"] < 0 and launch["t_s"] == s["generator"]["target_launched_at_s"]
    assert ready["t_s"] - launch["t_s"] == pytest.approx(s["generator"]["target_ready_after_s"], abs=2e-4)
    assert "target_stopped" in names
    assert _port_is_free(port), "the launched target must be stopped after the run"


def test_a_readiness_url_with_userinfo_is_polled_with_basic_auth(tmp_path):
    """urllib would put `user:pw@` into the Host header (and fail on it): latscope sends it as basic
    authentication, so a readiness URL that needs credentials works."""
    from latscope.errors import RunError

    port = free_port()
    data = _launch_scenario(tmp_path, port, 0.5)
    data["target"]["launch"]["ready_url"] = f"http://probe:s3cret-pw@127.0.0.1:{port}/health"
    result = run_scenario(scenario_from_dict(data), workers=1)
    assert result.summary["requests"]["completed"] == 10 and result.summary["generator"]["target_ready_after_s"] < 10
    assert "s3cret-pw" not in (result.run_dir / "scenario.yaml").read_text()
    # One that never answers: the error and the summary name the URL, never its password.
    data["target"]["launch"].update(ready_url=f"http://probe:s3cret-pw@127.0.0.1:{free_port()}/health", ready_timeout=1)
    data["output"]["dir"] = str(tmp_path / "never")
    with pytest.raises(RunError) as info:
        run_scenario(scenario_from_dict(data), workers=1)
    assert "not ready at http://probe:<redacted>@127.0.0.1:" in str(info.value) and "s3cret-pw" not in str(info.value)
    (run_dir,) = (tmp_path / "never").iterdir()
    assert "s3cret-pw" not in "".join(p.read_text(errors="replace") for p in run_dir.iterdir() if p.is_file())


def test_launched_target_dying_mid_run_ends_the_run_partial(tmp_path):
    from latscope.errors import RunError

    port = free_port()
    scenario = scenario_from_dict(_launch_scenario(tmp_path, port, 20.0))
    killer = subprocess.Popen([sys.executable, "-c", f"""
import json, os, signal, time, urllib.request
for _ in range(400):
    try:
        pid = json.load(urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=0.5))['pid']
        break
    except OSError:
        time.sleep(0.05)
time.sleep(4)  # worker start-up (~1.5 s) plus a few seconds of traffic
os.kill(pid, signal.SIGKILL)
"""])
    with pytest.raises(RunError, match="target exited"):
        run_scenario(scenario, workers=1)
    killer.wait(10)
    run_dir = next(tmp_path.glob("launched-*"))
    summary = assert_complete_results(run_dir)
    assert summary["partial"] is True
    assert summary["requests"]["completed"] > 10


def test_target_that_fails_to_launch_is_a_clear_run_error(tmp_path):
    from latscope.errors import RunError

    data = _launch_scenario(tmp_path, free_port(), 1.0)
    data["target"]["launch"]["command"] = ["python", "-c", "import sys; print('model file missing'); sys.exit(3)"]
    with pytest.raises(RunError, match=r"exited with code 3 before it was ready(.|\n)*model file missing"):
        run_scenario(scenario_from_dict(data), workers=1)
    summary = assert_complete_results(next(tmp_path.glob("launched-*")))
    assert summary["partial"] is True and "exited with code 3" in summary["abort_reason"]
    assert summary["requests"]["sent"] == 0
