"""Scenario actions: run the scenario's `actions` (a command, an HTTP call, a target restart) at
their planned times on the run's clock, and record each one in events.jsonl.

One scheduler thread sleeps until each action's time (a coarse wait until ~2 ms before, then a
short precise one) and starts the action on a thread of its own, so a slow command never delays
the next action. An action that fails is recorded and logged as a warning; it never ends the run.

Events (t_s on the run clock):
    action_start   {name, kind, planned_at_s}                at the actual start
    action_end     {name, kind, ok, duration_s, ...}         command: exit_code, output;
                                                             http: status, response;
                                                             restart: ready_after_s; error when not ok
    action_skipped {name, reason, planned_at_s}              its time never came before the run ended
    target_stopped / target_launch / target_ready            around a restart, as for the first launch

Whatever an action's `${VAR}`s expanded to (a token) is replaced by "<redacted>" in what is
recorded: `output`, `response` and `error` (see scenario.redact.secret_values).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Protocol

from latscope import results
from latscope.errors import RunError
from latscope.plan import Plan, action_times
from latscope.run.launch import LaunchedTarget, command_argv, start_target, stop_group, stop_target, url_request
from latscope.run.parts import RunPart
from latscope.scenario import Action, Scenario, scrub, secret_values

log = logging.getLogger("latscope.actions")

TEXT_LIMIT = 2000  # characters of a command's output (the last) or a response (the first) kept
PRECISE_S = 0.002  # the last stretch before an action's time is waited out precisely
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL of a command's process group
STOP_JOIN_S = 8.0  # how long stop() waits for running actions (a restart may be stopping a target: 5 s)


class TargetHost(Protocol):
    """What holds the launched target (the run): a restart replaces `target`."""

    target: LaunchedTarget | None
    target_cores: set[int] | None  # the cores a (re)started target is pinned to (launch.core_split)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


class ActionRunner(RunPart):
    """Runs a scenario's actions against the run's clock, as a run part (parts.py): `start(t0_ns)`
    once t=0 is known; `stop(reason)` when the run ends (pending actions are recorded as skipped,
    running commands killed). `restarting` and `target_lock` let the run tell a restart from a
    target that died."""

    def __init__(self, scenario: Scenario, plan: Plan, events: results.EventLog, host: TargetHost,
                 cancelled: Callable[[], bool] = lambda: False):
        """`cancelled`: the run is stopping (an abort); no further action starts, stop() records them."""
        self.scenario, self.events, self.host, self._cancelled = scenario, events, host, cancelled
        self.times = action_times(scenario, plan)
        self.secrets = secret_values(scenario)
        self.target_lock = threading.Lock()
        self.restarting = False  # read under target_lock
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._started: set[int] = set()  # indices whose thread was started
        self._finished: set[int] = set()  # indices whose action_end (or abandonment) was recorded
        self._threads: dict[int, threading.Thread] = {}
        self._procs: dict[int, subprocess.Popen] = {}
        self._start_ns: dict[int, int] = {}
        self._scheduler: threading.Thread | None = None
        self._t0_ns = 0
        # A restart appends to the first launch's log, even after a restart that failed.
        self._target_log = host.target.log_path if host.target is not None else None

    # -- scheduling -------------------------------------------------------------------------

    def start(self, t0_ns: int) -> None:
        """Start the scheduler: action i starts at perf_counter_ns t0_ns + times[i] seconds."""
        self._t0_ns = t0_ns
        if self.scenario.actions:
            self._scheduler = threading.Thread(target=self._schedule, name="latscope-actions", daemon=True)
            self._scheduler.start()

    def _schedule(self) -> None:
        for i in sorted(range(len(self.times)), key=lambda i: self.times[i]):
            due_ns = self._t0_ns + int(self.times[i] * 1e9)
            if not self._wait_until(due_ns):
                return
            with self._lock:
                if self._stopping.is_set() or self._cancelled():
                    return
                thread = threading.Thread(target=self._run_one, args=(i,), name=f"latscope-action-{i}", daemon=True)
                self._started.add(i)
                self._threads[i] = thread
                thread.start()  # under the lock: stop() never sees a thread that is not started yet

    def _wait_until(self, due_ns: int) -> bool:
        """Sleep until perf_counter_ns() >= due_ns; False when stopped first."""
        while (left := (due_ns - time.perf_counter_ns()) / 1e9) > PRECISE_S:
            if self._stopping.wait(left - PRECISE_S):
                return False
        while time.perf_counter_ns() < due_ns:  # at most ~2 ms
            time.sleep(0)
        return not self._stopping.is_set()

    # -- one action -------------------------------------------------------------------------

    def _run_one(self, i: int) -> None:
        action = self.scenario.actions[i]
        start_ns = self._start_ns[i] = time.perf_counter_ns()
        kind = action.kind
        self.events.emit("action_start", at_ns=start_ns, name=action.name, kind=kind, planned_at_s=round(self.times[i], 6))
        try:
            if kind == "command":
                fields = self._command(i, action)
            elif kind == "http":
                fields = self._http(action)
            else:
                fields = self._restart(action)
        except Exception as exc:  # noqa: BLE001 - an action's bug must not end the run
            fields = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if "error" in fields:
            fields["error"] = _one_line(self.scrub(fields["error"]))
        self._finish(i, action, kind, (time.perf_counter_ns() - start_ns) / 1e9, fields)

    def _finish(self, i: int, action: Action, kind: str, duration_s: float, fields: dict[str, Any]) -> None:
        with self._lock:
            if i in self._finished:
                return
            self._finished.add(i)
        self.events.emit("action_end", name=action.name, kind=kind, ok=fields.pop("ok"), duration_s=round(duration_s, 4), **fields)
        if "error" in fields:
            log.warning("action %s (%s) failed: %s", action.name, kind, fields["error"])

    def scrub(self, text: str) -> str:
        """`text` with every secret of the scenario replaced by <redacted> (scenario.scrub)."""
        return scrub(text, self.secrets)

    def _command(self, i: int, action: Action) -> dict[str, Any]:
        argv = command_argv(action.command)
        with self._lock:  # started and registered at once: stop() kills every command it lets start
            if self._stopping.is_set():
                return {"ok": False, "exit_code": None, "output": "", "error": "the run ended before it could start"}
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.scenario.resolve_path(action.cwd or "."),
                    env={**os.environ, **action.env},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: a timeout or stop() kills all of it
                )
            except OSError as exc:
                return {"ok": False, "exit_code": None, "output": "", "error": f"cannot run {argv[0]}: {exc}"}
            self._procs[i] = proc
        error = None
        try:
            out, _ = proc.communicate(timeout=action.timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc, KILL_GRACE_S)
            error = f"timed out after {action.timeout:g} s; killed"
            try:
                out, _ = proc.communicate(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:  # a grandchild that left the group holds the pipe
                out = b""
        finally:
            with self._lock:
                self._procs.pop(i, None)
        code = proc.returncode
        if error is None and code != 0 and self._stopping.is_set():
            error = f"stopped when the run ended (exit code {code})"
        elif error is None and code != 0:
            error = f"exited with code {code}"
        output = self.scrub(out.decode("utf-8", "replace"))[-TEXT_LIMIT:]
        return {"ok": error is None, "exit_code": code, "output": output, **({"error": error} if error else {})}

    def _http(self, action: Action) -> dict[str, Any]:
        call = action.http
        headers = dict(call.headers)
        data = None
        if call.json_ is not None:
            data = json.dumps(call.json_).encode()
            if not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = "application/json"
        elif call.body is not None:
            data = call.body.encode()
        request = url_request(call.url, headers, data=data, method=call.method)
        try:
            with urllib.request.urlopen(request, timeout=action.timeout) as response:
                status, raw = response.status, response.read(4 * TEXT_LIMIT + 4096)
        except urllib.error.HTTPError as exc:  # a status urllib counts as an error (4xx, 5xx)
            status = exc.code
            try:
                raw = exc.read(4 * TEXT_LIMIT + 4096)
            except OSError:
                raw = b""
        except urllib.error.URLError as exc:
            reason = exc.reason
            text = "timed out" if isinstance(reason, TimeoutError) else str(reason)
            return {"ok": False, "status": None, "response": "", "error": f"{call.method} {call.url}: {text}"}
        except (TimeoutError, OSError) as exc:
            text = f"timed out after {action.timeout:g} s" if isinstance(exc, TimeoutError) else str(exc)
            return {"ok": False, "status": None, "response": "", "error": f"{call.method} {call.url}: {text}"}
        ok = status in call.expect if call.expect else 200 <= status < 300
        body = self.scrub(raw.decode("utf-8", "replace"))[:TEXT_LIMIT]
        fields: dict[str, Any] = {"ok": ok, "status": status, "response": body}
        if not ok:
            expected = ", ".join(map(str, call.expect)) if call.expect else "2xx"
            fields["error"] = f"unexpected status {status} (expected {expected})"
        return fields

    def _restart(self, action: Action) -> dict[str, Any]:
        """Stop the launched target and start it again; the run does not count the stop as the
        target going away (restarting, under target_lock)."""
        launch = self.scenario.target.launch
        deadline = time.monotonic() + action.timeout
        with self.target_lock:
            self.restarting = True
            old = self.host.target
        new = None
        try:
            if old is not None:
                stop_target(old)
                self.events.emit("target_stopped", exit_code=old.exit_code())
            try:
                new = start_target(launch, self.scenario.resolve_path(launch.cwd or "."), self._target_log,
                                   should_stop=lambda: self._stopping.is_set() or time.monotonic() > deadline,
                                   cores=self.host.target_cores)
            except RunError as exc:
                why = (f"not ready within the action's timeout ({action.timeout:g} s)" if time.monotonic() > deadline
                       else str(exc).splitlines()[0])
                return {"ok": False, "ready_after_s": None, "error": f"the target did not come back: {why}"}
            self.events.emit("target_launch", at_ns=new.started_ns)
            self.events.emit("target_ready", at_ns=new.ready_ns, after_s=round(new.ready_after_s, 4))
            return {"ok": True, "ready_after_s": round(new.ready_after_s, 4)}
        finally:
            with self.target_lock:
                # A restart that failed leaves no target: the run goes on (its requests fail to
                # connect) and has nothing to stop at the end.
                self.host.target = new
                self.restarting = False

    # -- the end ----------------------------------------------------------------------------

    def stop(self, reason: str | None) -> None:
        """Cancel actions whose time has not come (action_skipped), kill running commands' process
        groups (SIGTERM, then SIGKILL) and wait for running actions, at most ~STOP_JOIN_S; one still
        running after that (an HTTP call within its timeout) is recorded as abandoned. `reason`: why the
        run was cut short, None when it ran to its end."""
        reason = reason or "the run ended before the action's time"
        with self._lock:
            self._stopping.set()
            started = set(self._started)
            procs = list(self._procs.values())
        if self._scheduler is not None:
            self._scheduler.join(timeout=1.0)
        for i, action in enumerate(self.scenario.actions):
            if i not in started:
                self.events.emit("action_skipped", name=action.name, reason=reason, planned_at_s=round(self.times[i], 6))
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_JOIN_S
        kill_at = time.monotonic() + KILL_GRACE_S
        for i, thread in list(self._threads.items()):
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(timeout=0.05)
                if time.monotonic() >= kill_at:
                    with self._lock:
                        left = list(self._procs.values())
                    for proc in left:
                        _signal_group(proc, signal.SIGKILL)
            if thread.is_alive():
                action = self.scenario.actions[i]
                self._finish(i, action, action.kind, (time.perf_counter_ns() - self._start_ns.get(i, time.perf_counter_ns())) / 1e9,
                             {"ok": False, "error": f"still running when the run ended ({reason}); abandoned"})


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

