"""dashboards/: every PromQL query of every Grafana dashboard returns data from a real Prometheus that
scrapes a live `latscope run --metrics-port`, the real reference server (HTTP port and admin API) and a
DCGM exporter page; and the dashboards have the shape Grafana's import expects.

The DCGM exporter is the one stand-in: dcgm-exporter cannot run without an NVIDIA GPU and its driver,
so a small HTTP server on 127.0.0.1 serves tests/telemetry/data/dcgm_exporter.txt, a page captured
from a real exporter. Prometheus is Debian's `prometheus` package (.ci/run installs it); without the
binary the acceptance test skips, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from conftest import REPO, free_port, serve

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402
from refserver import running_server  # noqa: E402

cache, logs = refserver.cache, refserver.logs  # module-scoped fixtures, bound here so pytest finds them

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
DCGM_TEXT = (REPO / "tests" / "telemetry" / "data" / "dcgm_exporter.txt").read_text()
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
SCRAPE_S = 1
# What Grafana puts in for its built-in variables at a 1 s scrape interval ($__rate_interval is
# max($__interval + scrape interval, 4 x scrape interval)); the dashboard's own variables get "All".
GRAFANA_VARIABLES = {"$__rate_interval": "5s", "$__interval": "1s", "$__range": "1m"}
ADMIN_TOKEN = "dashboards-test-token"


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", ()))
    return out


def queries(dashboard: dict, annotations: bool = False) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target — or (annotation name, PromQL) of every annotation query
    (which Grafana runs as a range query over the dashboard's time range) — with Grafana variables
    substituted as Grafana would."""
    all_value = {v["name"]: v.get("allValue") or ".*" for v in dashboard.get("templating", {}).get("list", ())}
    if annotations:
        found = [(a["name"], a["expr"]) for a in dashboard.get("annotations", {}).get("list", ()) if a.get("expr")]
    else:
        found = [(panel["title"], target["expr"]) for panel in panels(dashboard) for target in panel.get("targets", ())]
    out = []
    for title, expr in found:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        for name, value in all_value.items():
            expr = re.sub(rf"\$\{{{name}(:[a-z]+)?\}}|\${name}\b", value, expr)
        out.append((title, expr))
    return out


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_importable_shaped(path: Path):
    dashboard = json.loads(path.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert 36 <= dashboard["schemaVersion"] <= 41 and dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {ids}"
    graphs = [p for p in panels(dashboard) if p["type"] != "row"]
    assert {p["title"] for p in panels(dashboard) if p["type"] == "row"} >= {"Load", "Reference server"}
    for panel in graphs:
        where = f"{path.name}: panel {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, where
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, where
        assert panel["targets"], where
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        assert all(t["expr"].strip() for t in panel["targets"]), where
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == "${DS_PROMETHEUS}", variable["name"]
    # no variable is used that the dashboard does not define (Grafana would leave it in the query)
    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, annotation["name"]
    used = {m for _, e in queries(dashboard) + queries(dashboard, annotations=True) for m in re.findall(r"\$\{?(\w+)", e)}
    assert not used, f"undefined variables {used}"


def _dcgm_app() -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=DCGM_TEXT, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        assert proc is None or proc.poll() is None, f"{what}: process exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def _prometheus_config(tmp_path: Path, targets: dict[str, str]) -> Path:
    """dashboards/prometheus.yml, the shipped example, pointed at this test's loopback ports."""
    config = yaml.safe_load((REPO / "dashboards" / "prometheus.yml").read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
    token = tmp_path / "admin_token"
    token.write_text(ADMIN_TOKEN)
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    config["global"]["scrape_interval"] = config["global"]["scrape_timeout"] = f"{SCRAPE_S}s"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _scenario(tmp_path: Path, url: str) -> Path:
    data = {
        "name": "dashboards",
        "seed": 1,
        "target": {"url": url, "path": "/v2/models/identity/infer", "method": "POST", "timeout": 5},
        "workload": {"classes": [
            {"name": "small", "weight": 2, "body": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 384], "data": [0.5] * 384}]}},
            {"name": "large", "weight": 1, "body": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 384], "data": [0.25] * 1536}]}},
        ]},
        "phases": [
            {"name": "warmup", "duration": 2, "warmup": True, "arrival": {"type": "constant", "rate": 10}},
            {"name": "steady", "duration": 10, "arrival": {"type": "poisson", "rate": 40}},
        ],
        # for the dashboard's action annotation: one action that succeeds, one that fails. Late enough
        # that Prometheus has scraped the live endpoint before (an annotation marks the counter's step
        # from 0 to 1, which a first scrape after the action would not see), early enough to be
        # published before the queries at 9 s.
        "actions": [{"name": "ping", "at": 6, "http": {"url": f"{url}/v2/health/ready"}},
                    {"name": "broken", "at": 7, "command": "python -c 'raise SystemExit(3)'"}],
        "output": {"dir": str(tmp_path / "results")},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_dashboard_query_returns_data_from_a_live_run(tmp_path, cache, logs):
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus not installed in CI (.ci/run installs it with apt-get)")
        pytest.skip("the `prometheus` binary is not installed (Debian: apt-get install prometheus; .ci/run does)")
    all_queries = [(path.name, title, expr) for path in DASHBOARDS for title, expr in queries(json.loads(path.read_text()))]
    assert len(all_queries) >= 20
    live_port, prom_port = free_port(), free_port()
    prom = run = None
    with running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--builtin", "identity", "--model-name",
                        "identity", "--no-generator", "--admin-port", "0", "--admin-token", ADMIN_TOKEN,
                        "--cache-dir", str(cache), need=("ready", "ready-admin")) as server, serve(_dcgm_app()) as dcgm:
        config = _prometheus_config(tmp_path, {
            "latscope": f"127.0.0.1:{live_port}",
            "latscope_ref": server.url.removeprefix("http://"),
            "latscope_ref_admin": server.admin.removeprefix("http://"),
            "dcgm": dcgm.removeprefix("http://"),
        })
        prom_api = f"http://127.0.0.1:{prom_port}"
        try:
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                                    stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))
            # Prometheus first: it then scrapes the live endpoint from its first second on
            _wait(lambda: urllib.request.urlopen(f"{prom_api}/-/ready", timeout=2).status == 200, 30, "Prometheus ready", prom)
            run = subprocess.Popen([sys.executable, "-m", "latscope.cli", "run", str(_scenario(tmp_path, server.url)),
                                    "--quiet", "--workers", "1", "--metrics-port", str(live_port), "--out", str(tmp_path / "run")],
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def elapsed() -> float:  # latscope's own elapsed time, as Prometheus last scraped it
                result = _get_json(f"{prom_api}/api/v1/query?query=latscope_run_elapsed_seconds")["data"]["result"]
                return float(result[0]["value"][1]) if result else 0.0

            _wait(lambda: elapsed() >= 9, 40, "latscope to be 9 s into its run, as scraped by Prometheus", run)
            at = time.time()  # during the steady phase: every series is live
            ups = _get_json(f"{prom_api}/api/v1/query?query=up&time={at}")["data"]["result"]
            assert {u["metric"]["job"]: u["value"][1] for u in ups} == dict.fromkeys(
                ["latscope", "latscope_ref", "latscope_ref_admin", "dcgm"], "1"), ups
            empty = []
            for dashboard, title, expr in all_queries:
                answer = _get_json(f"{prom_api}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}))
                assert answer["status"] == "success", f"{dashboard}: panel {title!r}: {expr}: {answer}"
                if not answer["data"]["result"]:
                    empty.append(f"{dashboard}: panel {title!r}: {expr}")
            assert not empty, "queries without data:\n" + "\n".join(empty)
            started = at - elapsed() - 5  # before the run's t = 0, as Prometheus saw it
            for dashboard in DASHBOARDS:
                for name, expr in queries(json.loads(dashboard.read_text()), annotations=True):
                    answer = _get_json(f"{prom_api}/api/v1/query_range?" + urllib.parse.urlencode(
                        {"query": expr, "start": started, "end": at, "step": 1}))
                    assert answer["status"] == "success", f"{dashboard.name}: annotation {name!r}: {expr}: {answer}"
                    marks = {(r["metric"]["action"], r["metric"]["outcome"]) for r in answer["data"]["result"]}
                    assert marks == {("ping", "ok"), ("broken", "failed")}, f"{dashboard.name}: annotation {name!r}: {marks}"
            # and the numbers are latscope's: the live phase and classes are the scenario's
            phase = _get_json(f"{prom_api}/api/v1/query?" + urllib.parse.urlencode({"query": "latscope_phase_info", "time": at}))
            assert [r["metric"]["phase"] for r in phase["data"]["result"]] == ["steady"]
            classes = _get_json(f"{prom_api}/api/v1/label/class/values")["data"]
            assert {"small", "large", "all"} <= set(classes)
            stdout, stderr = run.communicate(timeout=30)
            assert run.returncode == 0, stdout + stderr
            assert f"live metrics: http://127.0.0.1:{live_port}/metrics" in stderr
        finally:
            for proc in (run, prom):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
