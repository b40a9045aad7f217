"""The command line: exit codes and messages, through real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from aiohttp import web

from conftest import MINIMAL as GOOD
from conftest import REPO, free_port, scenario_dict, serve

LATSCOPE = [sys.executable, "-m", "latscope.cli"]


def latscope(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*LATSCOPE, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path




def test_unknown_field_exits_2_naming_line_and_field(tmp_path):
    path = write(tmp_path, GOOD.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  timout: 3\n"))
    r = latscope("run", str(path))
    assert r.returncode == 2
    assert f"{path}:4" in r.stderr and "target.timout" in r.stderr


def test_negative_rate_exits_2_naming_line_and_field(tmp_path):
    path = write(tmp_path, GOOD.replace("rate: 5", "rate: -5"))
    r = latscope("run", str(path))
    assert r.returncode == 2
    assert f"{path}:7" in r.stderr and "phases[0].arrival.rate" in r.stderr


def test_bad_yaml_exits_2_naming_line(tmp_path):
    path = write(tmp_path, GOOD.replace("{type: constant, rate: 5}", "{type: constant, rate: 5"))
    r = latscope("validate", str(path))
    assert r.returncode == 2
    assert str(path) in r.stderr


def test_missing_file_and_bad_set_exit_2(tmp_path):
    assert latscope("run", str(tmp_path / "nope.yaml")).returncode == 2
    path = write(tmp_path, GOOD)
    r = latscope("validate", str(path), "--set", "phases.0.arrival.rate=-1")
    assert r.returncode == 2 and "--set" in r.stderr


def test_validate_prints_the_plan(tmp_path):
    r = latscope("validate", str(write(tmp_path, GOOD)))
    assert r.returncode == 0, r.stderr
    assert "5 requests" in r.stdout


def test_validate_counts_sessions_turns_and_users(tmp_path):
    """Sessions plan their turns (chat_sessions.yaml: 33 sessions of 4 turns); a closed-loop phase plans users."""
    r = latscope("validate", str(REPO / "scenarios" / "chat_sessions.yaml"), "--set",
                 "phases.1.arrival={type: users, users: 8, ramp: 2s}")
    assert r.returncode == 0, r.stderr
    assert "33 arrivals" in r.stdout and "132 requests planned" in r.stdout
    assert "33 open-loop sessions, 132 turns (mean 4.0 a session), think time p50" in r.stdout
    assert "8 users     closed loop" in r.stdout


def test_validate_lists_actions_with_their_times_and_no_secret(tmp_path):
    path = write(tmp_path, GOOD + "actions:\n"
                 "  - {name: scale, at: 0.2, command: 'kubectl scale --token ${SCALE_TOKEN} deploy/x --replicas 3'}\n"
                 "  - {name: hook, at: 0.1, http: {url: 'http://127.0.0.1:9/admin', json: {}}}\n")
    r = latscope("validate", str(path), env={"SCALE_TOKEN": "s3cret-value"})
    assert r.returncode == 0, r.stderr
    assert "  action scale           at     0.2 s  command kubectl scale --token <redacted> deploy/x --replicas 3" in r.stdout
    assert "  action hook            at     0.1 s  http POST http://127.0.0.1:9/admin" in r.stdout
    assert "s3cret-value" not in r.stdout


def test_shipped_scenarios_are_valid_and_launch_the_reference_server():
    for path in sorted((REPO / "scenarios").glob("*.yaml")):
        r = latscope("validate", str(path), env={"LATSCOPE_REF_ADMIN_TOKEN": "t0ken"})  # scale_up's admin action needs one
        assert r.returncode == 0, f"{path.name}: {r.stderr}"
        data = yaml.safe_load(path.read_text())
        if path.stem in ("smoke", "burst", "scale_up"):
            assert "python -m reference_server serve" in data["target"]["launch"]["command"], path.name
        if path.stem == "adapter_mix":  # each class's model is said (a class without one takes the target's)
            assert re.search(r"class tenant-a-rag .*/v1/chat/completions  model tenant-a\n", r.stdout), r.stdout
            assert re.search(r"class tenant-c .*/v1/chat/completions  model tenant-c\n", r.stdout), r.stdout


def test_schema_is_json_schema():
    r = latscope("schema")
    schema = json.loads(r.stdout)
    assert "phases" in schema["properties"]


def test_run_prints_summary_and_exits_0(target, tmp_path):
    url = target(delay_ms=1)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict(url, tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 20}}],
                                                 slos=[{"metric": "latency", "stat": "p99", "limit_ms": 1000}])))
    r = latscope("run", str(path), "--workers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "latency" in r.stdout and "SLO PASS latency/all p99_ms" in r.stdout
    assert "measurement: " in r.stdout
    run_dir = next((tmp_path / "results").glob("test-*"))
    assert json.loads((run_dir / "summary.json").read_text())["slo"][0]["passed"] is True


def _status_app(ok_query: str | None = None) -> web.Application:
    """Answers 500 to everything, or 200 to a request whose query holds `ok_query`."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=200 if ok_query and ok_query in request.query else 500, text="model exploded")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def test_a_run_where_every_request_failed_exits_1_stamped_invalid_naming_the_kinds(tmp_path):
    """No request succeeded, so no latency was measured: exit 1 (not 0), summary.json invalid with
    the reason, and the console names the errors' kinds and an example. Against a port nothing
    listens on (connect errors) and a target answering 500 to everything (http_5xx)."""
    phases = [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 10}}]
    with serve(_status_app()) as url500:
        for url, kind, example in ((f"http://127.0.0.1:{free_port()}", "connect", "cannot connect"),
                                   (url500, "http_5xx", "HTTP 500 Internal Server Error")):
            out = tmp_path / kind
            path = write(tmp_path, yaml.safe_dump(scenario_dict(url, tmp_path, phases)))
            r = latscope("run", str(path), "--workers", "1", "--out", str(out))
            console = r.stdout + r.stderr
            assert r.returncode == 1, console
            summary = json.loads((out / "summary.json").read_text())
            assert summary["partial"] is False and summary["validity"] == "invalid"
            assert summary["requests"]["sent"] == summary["errors"][kind] == 5
            (reason,) = [r for r in summary["validity_reasons"] if r.startswith("no request succeeded")]
            assert reason.startswith(f"no request succeeded: 5 sent, 5 errors ({kind} 5): no latency was measured; e.g. {kind}: ")
            assert example in reason
            assert f"errors by kind: {kind} 5" in console and "INVALID" in console and example in console
            assert "Traceback" not in console


def test_a_run_with_a_success_exits_0_even_when_most_requests_fail(tmp_path):
    """The other side: a request that succeeded measured latency, so errors alone are no exit 1."""
    with serve(_status_app("ok")) as url:
        data = scenario_dict(url, tmp_path, [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 10}}],
                             workload={"classes": [{"name": "ok", "path": "/?ok=1", "weight": 1},
                                                   {"name": "bad", "path": "/", "weight": 1}]})
        r = latscope("run", str(write(tmp_path, yaml.safe_dump(data))), "--workers", "1", "--out", str(tmp_path / "r"))
    assert (tmp_path / "r" / "summary.json").is_file(), r.stdout + r.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["requests"]["completed"] >= 1 and summary["errors"]["http_5xx"] >= 1, summary["requests"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(x.startswith("no request succeeded") for x in summary["validity_reasons"])
