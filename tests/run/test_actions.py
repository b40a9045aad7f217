"""Scenario actions (latscope/run/actions.py): commands, HTTP calls and target restarts at planned times
of real runs, their events, secret scrubbing, stopping early, and the schema's error messages."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import plotly.graph_objects as go
import pytest
from aiohttp import web

from latscope.errors import ScenarioError
from latscope.plan import action_times
from latscope.report.figures import add_phases_and_events
from latscope.results import read_events
from helpers import read_summary
from latscope.run import run_scenario
from latscope.scenario import load_scenario, scenario_from_dict

from conftest import MINIMAL, free_port, scenario_dict, serve

PY = sys.executable
SECRET = "s3cr3t-token-8f2a91"  # what ${LATSCOPE_TEST_ACTION_TOKEN} holds in these runs
LITERAL_KEY = "literal-key-7d41c0"


def _data(url: str, tmp_path: Path, phases: list[dict], actions: list[dict], **extra) -> dict:
    return scenario_dict(url, tmp_path, phases, actions=actions,
                         output={"dir": str(tmp_path / "results"), "report": False}, **extra)


def _by(events: list[dict], kind: str) -> dict[str, dict]:
    return {e["name"]: e for e in events if e["event"] == kind}


def _recorder() -> tuple[web.Application, list[dict]]:
    """/admin/replicas records each call and answers 202; /fail answers 500; /echo answers with the
    request's credential headers (so a leak would show in the recorded response)."""
    calls: list[dict] = []

    async def replicas(request: web.Request) -> web.Response:
        calls.append({"headers": dict(request.headers), "json": await request.json(), "method": request.method})
        return web.json_response({"accepted": True}, status=202)

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=f"auth={request.headers.get('Authorization')} key={request.headers.get('X-Api-Key')}")

    app = web.Application()
    app.router.add_post("/admin/replicas", replicas)
    app.router.add_route("*", "/fail", fail)
    app.router.add_get("/echo", echo)
    return app, calls


# ---- the acceptance test -------------------------------------------------------------------------


def test_command_and_http_actions_at_5s_run_within_50ms_of_their_time(target, tmp_path, monkeypatch):
    monkeypatch.setenv("LATSCOPE_TEST_ACTION_TOKEN", SECRET)
    marker = tmp_path / "scaled.txt"
    app, calls = _recorder()
    with serve(app) as admin:
        data = _data(target(delay_ms=1), tmp_path, [{"name": "p", "duration": 7, "arrival": {"type": "constant", "rate": 5}}], [
            {"name": "scale", "at": "5s",
             "command": ["python", "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('scaled')", str(marker)]},
            {"name": "add-replica", "at": "5s",
             "http": {"method": "POST", "url": f"{admin}/admin/replicas",
                      "headers": {"Authorization": "Bearer ${LATSCOPE_TEST_ACTION_TOKEN}"},
                      "json": {"prewarm": False}, "expect": [202]}},
        ])
        result = run_scenario(scenario_from_dict(data), workers=1)
    events = read_events(result.run_dir)
    starts, ends = _by(events, "action_start"), _by(events, "action_end")
    for name, kind in (("scale", "command"), ("add-replica", "http")):
        assert starts[name]["kind"] == kind and starts[name]["planned_at_s"] == 5.0
        assert abs(starts[name]["t_s"] - 5.0) <= 0.050, starts[name]
        assert ends[name]["ok"] is True, ends[name]
    assert ends["scale"]["exit_code"] == 0
    assert ends["add-replica"]["status"] == 202 and json.loads(ends["add-replica"]["response"]) == {"accepted": True}
    assert marker.read_text() == "scaled"
    assert len(calls) == 1 and calls[0]["method"] == "POST" and calls[0]["json"] == {"prewarm": False}
    assert calls[0]["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert calls[0]["headers"]["Content-Type"] == "application/json"
    assert result.summary["partial"] is False
    assert SECRET not in (result.run_dir / "events.jsonl").read_text()


# ---- one run with failing actions, a `when`, and secrets ------------------------------------------


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """A 3 s run (phases `first` 1 s, `second` 2 s) with actions that fail each way, one timed by
    `when`, and two that try to leak a ${VAR} token."""
    tmp_path = tmp_path_factory.mktemp("mixed")
    os.environ["LATSCOPE_TEST_ACTION_TOKEN"] = SECRET
    app, _ = _recorder()
    try:
        with serve(app) as admin, serve(_target_app()) as url:
            phases = [{"name": "first", "duration": 1, "arrival": {"type": "constant", "rate": 5}},
                      {"name": "second", "duration": 2, "arrival": {"type": "constant", "rate": 5}}]
            actions = [
                {"name": "exit3", "at": 0.2, "command": ["python", "-c", "import sys; print('bad input'); sys.exit(3)"]},
                {"name": "slow", "at": 0.2, "timeout": "500ms", "command": ["python", "-c", "import time; time.sleep(30)"]},
                {"name": "refused", "at": 0.2, "http": {"url": f"http://127.0.0.1:{free_port()}/x"}},
                {"name": "status", "at": 0.2, "http": {"url": f"{admin}/fail", "body": "x"}},
                {"name": "leak-cmd", "at": 0.3, "env": {"T": "${LATSCOPE_TEST_ACTION_TOKEN}"},
                 "command": ["python", "-c", "import os, sys; print('env=' + os.environ['T']); print('arg=' + sys.argv[1])",
                             "${LATSCOPE_TEST_ACTION_TOKEN}"]},
                {"name": "leak-http", "at": 0.3,
                 "http": {"url": f"{admin}/echo", "headers": {"Authorization": "Bearer ${LATSCOPE_TEST_ACTION_TOKEN}",
                                                              "X-Api-Key": LITERAL_KEY}}},
                {"name": "basic", "at": 0.3,  # URL userinfo: sent as basic authentication, echoed back scrubbed
                 "http": {"url": admin.replace("://", "://ops:${LATSCOPE_TEST_ACTION_TOKEN}@") + "/echo"}},
                {"name": "later", "when": {"phase": "second", "after": "500ms"}, "command": "python -c pass"},
            ]
            scenario = scenario_from_dict(_data(url, tmp_path, phases, actions))
            started = time.monotonic()
            result = run_scenario(scenario, workers=1)
            wall = time.monotonic() - started
    finally:
        del os.environ["LATSCOPE_TEST_ACTION_TOKEN"]
    return scenario, result, read_events(result.run_dir), wall


def _target_app() -> web.Application:
    from latscope.targets.echo import make_app

    return make_app(delay_ms=1)


def test_failed_actions_are_recorded_and_the_run_completes(mixed_run):
    _, result, events, wall = mixed_run
    ends = _by(events, "action_end")
    assert result.summary["partial"] is False and result.summary["abort_reason"] is None
    assert ends["exit3"]["ok"] is False and ends["exit3"]["exit_code"] == 3
    assert ends["exit3"]["error"] == "exited with code 3" and ends["exit3"]["output"].strip() == "bad input"
    # Killed at its 0.5 s timeout (SIGTERM), not left to sleep its 30 s.
    assert ends["slow"]["ok"] is False and ends["slow"]["exit_code"] == -signal.SIGTERM
    assert ends["slow"]["error"] == "timed out after 0.5 s; killed"
    assert 0.5 <= ends["slow"]["duration_s"] < 1.5
    assert ends["refused"]["ok"] is False and ends["refused"]["status"] is None
    assert "Connection refused" in ends["refused"]["error"] and ends["refused"]["error"].startswith("GET http://127.0.0.1:")
    assert ends["status"]["ok"] is False and ends["status"]["status"] == 500 and ends["status"]["response"] == "boom"
    assert ends["status"]["error"] == "unexpected status 500 (expected 2xx)"
    assert ends["later"]["ok"] is True and ends["later"]["exit_code"] == 0
    assert not [e for e in events if e["event"] == "action_skipped"]
    assert wall < 15


def test_when_resolves_to_the_phase_start_plus_after(mixed_run):
    scenario, _, events, _ = mixed_run
    assert action_times(scenario)[-1] == 1.5  # phase `second` starts at 1 s, plus 500 ms
    start = _by(events, "action_start")["later"]
    assert start["planned_at_s"] == 1.5 and abs(start["t_s"] - 1.5) <= 0.050
    second = next(e for e in events if e["event"] == "phase_start" and e["phase"] == "second")
    assert second["planned_at_s"] == 1.0


def test_secrets_from_env_never_reach_events_or_scenario_yaml(mixed_run):
    _, result, events, _ = mixed_run
    text = (result.run_dir / "events.jsonl").read_text()
    saved = (result.run_dir / "scenario.yaml").read_text()
    ends = _by(events, "action_end")
    assert ends["leak-cmd"]["ok"] is True
    assert ends["leak-cmd"]["output"].splitlines() == ["env=<redacted>", "arg=<redacted>"]
    assert ends["leak-http"]["response"] == "auth=<redacted> key=<redacted>"  # the whole header value
    assert ends["basic"]["ok"] is True and ends["basic"]["response"] == "auth=<redacted> key=None"
    for secret in (SECRET, LITERAL_KEY):
        assert secret not in text and secret not in saved
    # Templates are written back as written; a literal credential-like header is redacted.
    assert "Authorization: Bearer ${LATSCOPE_TEST_ACTION_TOKEN}" in saved and "T: ${LATSCOPE_TEST_ACTION_TOKEN}" in saved
    assert "X-Api-Key: <redacted>" in saved


def test_report_time_axis_names_actions_and_marks_failures_red(mixed_run):
    _, result, events, _ = mixed_run
    fig = go.Figure()
    add_phases_and_events(fig, read_summary(result.run_dir), events)
    labels = {a.text: a.font.color for a in fig.layout.annotations}
    assert labels["exit3 (command, failed)"] == "#d62728"
    assert labels["later (command)"] != "#d62728"
    assert not any("action end" in text or "target" in text for text in labels)  # action_end is not drawn twice
    action_times = {e["t_s"] for e in events if e["event"].startswith("action_")}
    lines = [s for s in fig.layout.shapes if s.type == "line" and s.x0 in action_times]
    assert len(lines) == 8  # one per action: at its start, not again at its end


# ---- restart of a launched target ---------------------------------------------------------------

TINY_SERVER = """\
import http.server, os, sys, time
port, pids = int(sys.argv[1]), sys.argv[2]
with open(pids, "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(0.5)  # a slow start: the restart leaves a gap that requests fall into


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
print("serving", os.getpid(), flush=True)
server.serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_restart_of_the_launched_target_mid_run(tmp_path):
    port = free_port()
    script, pids = tmp_path / "tiny.py", tmp_path / "pids.txt"
    script.write_text(TINY_SERVER)
    data = {
        "name": "restart",
        "target": {"url": f"http://127.0.0.1:{port}", "timeout": 2,
                   "launch": {"command": ["python", str(script), str(port), str(pids)],
                              "ready_url": f"http://127.0.0.1:{port}/"}},
        "phases": [{"name": "p", "duration": 5, "arrival": {"type": "constant", "rate": 20}}],
        "actions": [{"name": "redeploy", "at": "2s", "restart": True}],
        "output": {"dir": str(tmp_path / "results"), "report": False},
    }
    result = run_scenario(scenario_from_dict(data), workers=1)
    events = read_events(result.run_dir)
    named = [e for e in events if e["event"].startswith(("target_", "action_"))]
    kinds = [e["event"] for e in named]
    assert kinds == ["target_launch", "target_ready", "action_start", "target_stopped", "target_launch",
                     "target_ready", "action_end", "target_stopped"]
    start, stopped, launch, ready, end = named[2:7]
    assert abs(start["t_s"] - 2.0) <= 0.050
    assert 2.0 <= stopped["t_s"] <= launch["t_s"] < ready["t_s"] < 5.0
    assert ready["after_s"] >= 0.5 and ready["after_s"] == pytest.approx(ready["t_s"] - launch["t_s"], abs=0.002)
    assert end["ok"] is True and end["ready_after_s"] == ready["after_s"]
    s = result.summary
    assert s["partial"] is False and s["abort_reason"] is None
    assert s["errors"]["connect"] >= 5  # the >= 0.5 s gap at 20 req/s: refused, counted, not a crash
    assert s["requests"]["completed"] >= 60
    first, second = map(int, pids.read_text().split())
    assert first != second and not _alive(first) and not _alive(second)
    assert (result.run_dir / "target.log").read_text().count("serving") == 2
    cold = s["cold_start"]  # the restart, measured: down from the action to ready again, errors meanwhile
    (restart,) = cold["restarts"]
    assert (restart["action"], restart["issued_at_s"], restart["ready_at_s"]) == ("redeploy", start["t_s"], ready["t_s"])
    assert restart["down_s"] == pytest.approx(ready["t_s"] - start["t_s"], abs=1e-6)
    assert restart["errors_while_down"] == s["errors"]["connect"]  # every refused request fell in the gap
    assert restart["first_count"] >= 20 and restart["steady_count"] > 0
    launch = cold["target_launch"]  # the first launch, on the run's clock: before t = 0
    assert launch["launched_at_s"] < 0 and launch["ready_s"] == pytest.approx(named[1]["after_s"], abs=0.002)
    assert launch["ready_s"] < launch["first_response_s"] < -launch["launched_at_s"] + 1.0


# ---- stopping early --------------------------------------------------------------------------------


def test_stopping_the_run_skips_pending_actions_and_kills_running_commands(target, tmp_path):
    pidfile = tmp_path / "long.pid"
    data = _data(target(delay_ms=1), tmp_path, [{"name": "p", "duration": 20, "arrival": {"type": "constant", "rate": 5}}], [
        {"name": "long", "at": 0.3, "timeout": "60s",
         "command": ["python", "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)",
                     str(pidfile)]},
        {"name": "pending", "at": "15s", "command": "python -c pass"},
    ])
    interrupted: list[float] = []

    def interrupt() -> None:  # Ctrl-C once the long command runs
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        interrupted.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    result = run_scenario(scenario_from_dict(data), workers=1)
    stop_took = time.monotonic() - interrupted[0]
    events = read_events(result.run_dir)
    assert result.summary["partial"] is True and "SIGINT" in result.summary["abort_reason"]
    skipped = _by(events, "action_skipped")
    assert list(skipped) == ["pending"] and "SIGINT" in skipped["pending"]["reason"]
    assert skipped["pending"]["planned_at_s"] == 15.0
    long = _by(events, "action_end")["long"]
    assert long["ok"] is False and long["exit_code"] == -signal.SIGTERM and "stopped when the run ended" in long["error"]
    assert not _alive(int(pidfile.read_text()))
    assert stop_took < 8.0


# ---- scenario errors -------------------------------------------------------------------------------


def _error(tmp_path: Path, actions: str, launch: bool = False) -> tuple[Path, str]:
    text = MINIMAL
    if launch:
        text = text.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  launch: {command: python -m x}\n")
    path = tmp_path / "scenario.yaml"
    path.write_text(text + "actions:\n" + textwrap.dedent(actions))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return path, str(info.value)


def test_both_at_and_when_is_an_error_on_when(tmp_path):
    path, message = _error(tmp_path, """\
      - name: a
        at: 0.5
        when: {phase: p}
        command: echo hi
    """)
    assert f"{path}:11: actions[0].when: give `at` (seconds from the run's start) or `when` (a phase start), not both" in message


def test_no_kind_or_two_kinds_is_an_error(tmp_path):
    path, message = _error(tmp_path, """\
      - name: a
        at: 0.5
    """)
    assert f"{path}:9: actions[0]: give exactly one of command, http or restart: true (got none)" in message
    path, message = _error(tmp_path, """\
      - name: a
        at: 0.5
        command: echo hi
        http: {url: http://127.0.0.1:1/x}
    """)
    assert f"{path}:9: actions[0]: give exactly one of command, http or restart: true (got command and http)" in message


def test_unknown_phase_is_an_error_on_the_phase(tmp_path):
    path, message = _error(tmp_path, """\
      - name: a
        command: echo hi
        when:
          phase: hold
    """)
    assert f"{path}:12: actions[0].when.phase: 'hold' is not a phase (known: p)" in message


def test_restart_without_a_launched_target_is_an_error(tmp_path):
    path, message = _error(tmp_path, """\
      - name: a
        at: 0.5
        restart: true
    """)
    assert f"{path}:11: actions[0].restart: restart needs a launched target (target.launch); this scenario has none" in message
    path = tmp_path / "ok.yaml"
    path.write_text(MINIMAL.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  launch: {command: python -m x}\n")
                    + "actions:\n  - {name: a, at: 0.5, restart: true}\n")
    assert load_scenario(path).actions[0].kind == "restart"


def test_an_action_past_the_end_would_never_run(tmp_path):
    path, message = _error(tmp_path, """\
      - name: a
        at: 5s
        command: echo hi
    """)
    assert f"{path}:10: actions[0].at: the action would never run: it is planned at 5 s and the phases end at 1 s" in message
    path, message = _error(tmp_path, """\
      - name: a
        when: {phase: p, after: 2s}
        command: echo hi
    """)
    assert f"{path}:10: actions[0].when.after: the action would never run: it is planned at 2 s and the phases end at 1 s" in message


def test_other_action_field_errors(tmp_path):
    path, message = _error(tmp_path, """\
      - {name: a, at: 0.5, command: echo hi}
      - {name: a, at: 0.5, command: "  "}
      - {name: "b c", at: 0.5, http: {url: ftp://x/, json: {}, body: "y"}}
    """)
    assert f"{path}:10: actions[1].command: the command is empty" in message
    assert f"{path}:11: actions[2].name: an action name may use only letters, digits, '_', '.' and '-'" in message
    assert f"{path}:11: actions[2].http.url: expected an http:// or https:// URL with a host" in message
    path, message = _error(tmp_path, """\
      - {name: a, at: 0.5, command: echo hi}
      - {name: a, at: 0.5, http: {url: "http://127.0.0.1:1/", json: {}, body: "y"}}
    """)
    assert f"{path}:10: actions[1].http: give json (sent as JSON) or body (sent as is), not both" in message
    path, message = _error(tmp_path, """\
      - {name: a, at: 0.5, command: echo hi}
      - {name: a, at: 0.6, command: echo hi}
    """)
    assert f"{path}:8: actions: action names must be unique; repeated: a" in message
