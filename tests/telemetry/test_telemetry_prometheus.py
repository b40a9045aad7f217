"""Prometheus scrapes over real HTTP on 127.0.0.1: a DCGM exporter page through the shipped mapping,
counters as rates, a slow and a failing endpoint, and the reference server's real /metrics."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from latscope.results import EventLog, read_events
from latscope.scenario import Telemetry as TelemetryConfig
from latscope.telemetry.prometheus import PrometheusSampler
from latscope.telemetry.session import TelemetrySession

from conftest import serve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402
from refserver import http, json_body, running_server, token_inputs  # noqa: E402

cache, logs = refserver.cache, refserver.logs  # module-scoped fixtures, bound here so pytest finds them

DCGM_TEXT = (Path(__file__).parent / "data" / "dcgm_exporter.txt").read_text()


def metrics_app(body) -> web.Application:
    """An app whose /metrics answers body() (text) or raises what body() raises."""
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=await body(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app


def test_dcgm_exporter_page_through_the_shipped_mapping():
    async def body():
        return DCGM_TEXT

    with serve(metrics_app(body)) as url:
        rows = {(d, m): v for d, m, v in PrometheusSampler("dcgm", f"{url}/metrics", "dcgm").sample()}
    assert rows[("gpu0", "gpu_util_pct")] == 93.0
    assert rows[("gpu0", "mem_bw_util_pct")] == pytest.approx(63.5211)  # PROF ratio 0..1 -> %
    assert rows[("gpu0", "mem_util_pct")] == 38.0  # MEM_COPY_UTIL: the coarse counter, kept apart
    assert rows[("gpu0", "sm_active_pct")] == pytest.approx(81.2345)
    assert rows[("gpu0", "sm_occupancy_pct")] == pytest.approx(25.4102)
    assert rows[("gpu0", "mem_used_bytes")] == 30780 * 2**20  # MiB -> B
    assert rows[("gpu0", "power_w")] == 412.731
    assert rows[("gpu0", "sm_clock_mhz")] == 1980 and rows[("gpu0", "temp_c")] == 61
    assert rows[("gpu0", "pcie_rx_bytes_s")] == 734529013 and rows[("gpu0", "pcie_tx_bytes_s")] == 118873941
    assert rows[("gpu1", "power_w")] == 71.25 and rows[("gpu1", "sm_clock_mhz")] == 345
    assert len(rows) == 22  # 11 mapped fields x 2 GPUs; FB_FREE and XID_ERRORS are not mapped


def test_counters_become_rates_between_scrapes_and_a_reset_gives_none():
    total = {"v": 1000.0}

    async def body():
        return f"# TYPE jobs counter\njobs_total{{worker=\"a\"}} {total['v']}\njobs_total{{worker=\"b\"}} 5\n"

    mapping = {"jobs": {"metric": "jobs_s", "rate": True}}
    with serve(metrics_app(body)) as url:
        sampler = PrometheusSampler("p", f"{url}/metrics", mapping)
        t_before_1 = time.monotonic()
        assert sampler.sample() == []  # a rate needs two scrapes
        t_after_1 = time.monotonic()
        total["v"] += 300
        time.sleep(0.2)
        t_before_2 = time.monotonic()
        [(device, metric, rate)] = sampler.sample()
        t_after_2 = time.monotonic()
        total["v"] = 10.0  # the server restarted
        assert sampler.sample() == []
    assert (device, metric) == ("server", "jobs_s")  # series without a device label are summed
    assert 300 / (t_after_2 - t_before_1) <= rate <= 300 / (t_before_2 - t_after_1)


def test_slow_and_failing_endpoints_are_gaps_not_crashes(tmp_path, caplog):
    state = {"mode": "slow"}

    async def body():
        if state["mode"] == "slow":
            await asyncio.sleep(1.0)
        if state["mode"] == "error":
            raise web.HTTPInternalServerError()
        return "up 1\n"

    events = EventLog(tmp_path / "events.jsonl")
    with serve(metrics_app(body)) as url, caplog.at_level(logging.WARNING, logger="latscope.telemetry"):
        config = TelemetryConfig.model_validate({"interval": 0.05, "nvml": False, "host": True, "prometheus": [
            {"name": "flaky", "url": f"{url}/metrics", "mapping": {"up": {"metric": "up"}}, "timeout": 0.2}]})
        telemetry = TelemetrySession.from_config(config, events, 1.0)  # host on: the host's own CPU, no processes
        telemetry.start(time.perf_counter_ns())
        time.sleep(0.6)
        state["mode"] = "error"
        time.sleep(0.3)
        state["mode"] = "ok"
        time.sleep(0.4)
        started = time.monotonic()
        telemetry.stop()
        stop_s = time.monotonic() - started
    events.close()
    rows = telemetry.rows
    series = {key: sid for key, sid in rows.keys.items()}
    host_rows = sum(1 for sid in rows.series if sid == series[("host", "system", "cpu_pct")])
    assert host_rows >= 15  # 1.3 s at 20 Hz: the host source kept sampling while "flaky" hung
    assert sum(1 for sid in rows.series if sid == series[("flaky", "server", "up")]) >= 2  # back after it recovered
    kinds = [(e["event"], e.get("source")) for e in read_events(tmp_path)]
    assert kinds.count(("telemetry_gap", "flaky")) == 1  # one streak: timeouts, then HTTP 500s
    assert kinds.count(("telemetry_resumed", "flaky")) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flaky" in warnings[0]
    assert stop_s < 0.2 + 2.0


def test_reference_server_metrics_scraped_from_the_real_server(cache, logs):
    with running_server(logs, "--http-port", "0", "--layers", "2", "--no-generator", "--cache-dir", str(cache)) as server:
        sampler = PrometheusSampler("ref", f"{server.url}/metrics", "reference-server", timeout=5)
        t_before_1 = time.monotonic()
        first = sampler.sample()
        t_after_1 = time.monotonic()
        n = 5
        for _ in range(n):
            status, headers, _ = http("POST", server.infer_url, json_body(*token_inputs(rows=1, seq=8)))
            assert status == 200
        t_before_2 = time.monotonic()
        second = {(d, m): v for d, m, v in sampler.sample()}
        t_after_2 = time.monotonic()
    replica = headers["X-Replica-Id"]
    assert {(d, m) for d, m, _ in first} >= {(replica, "queue_depth"), (replica, "in_flight_requests")}
    assert second[(replica, "queue_depth")] == 0.0
    assert second[(replica, "in_flight_requests")] == 1.0  # the scrape itself is in flight
    # n inferences and the first scrape (counted once its response was sent) between the two scrapes
    rate = second[(replica, "requests_s")]
    assert (n + 1) / (t_after_2 - t_before_1) <= rate <= (n + 1) / (t_before_2 - t_after_1)
    assert not any(d.startswith("gpu") for d, _ in second)  # no GPU on this host: no GPU series
    # Its histograms, per window: n one-row requests one after another, each its own backend run
    assert second[(replica, "batch_size")] == 1.0
    assert 0 < second[(replica, "server_compute_mean_ms")] < 1000
    queue = [second[(replica, f"server_queue_time_{s}_ms")] for s in ("p50", "p99", "mean")]
    assert all(0 <= q < 1000 for q in queue) and queue[0] <= queue[1]
    assert (replica, "server_ttft_p50_ms") not in second  # no generation requests: no TTFT window


def test_credentials_in_the_url_are_sent_as_basic_auth():
    async def handler(request: web.Request) -> web.Response:
        ok = request.headers.get("Authorization") == "Basic Ym9iOnMzY3JldA=="  # bob:s3cret
        return web.Response(text=f"authorized {int(ok)}\n")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    with serve(app) as url:
        sampler = PrometheusSampler("p", url.replace("http://", "http://bob:s3cret@") + "/metrics",
                                    {"authorized": {"metric": "authorized"}})
        assert sampler.sample() == [("server", "authorized", 1.0)]
    assert "s3cret" not in sampler.url
