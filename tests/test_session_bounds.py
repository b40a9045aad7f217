"""Chat sessions against targets whose answers a session cannot carry as they are: answers of
megabytes (the carried history is bounded per session and per worker, and the worker's memory with
it) and an answer holding a lone UTF-16 surrogate (a `protocol` error that says so). Real runs
(worker processes) against real servers on loopback."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psutil
import pytest
from aiohttp import web

from conftest import serve
from latscope.analysis.run_data import load_run
from latscope.console import sessions_lines
from latscope.report.html import report_html
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

MB = 1_000_000


def make_big_app(log: list[int], answer_bytes: int, text: str = "") -> web.Application:
    """Answers every chat request with `answer_bytes` of text (a whole JSON answer, or SSE when the
    request asks for a stream, in 64 KB token chunks), or with `text` when given; logs how many user
    messages each request carried (its turn)."""
    body = text or "w " * (answer_bytes // 2)
    whole = json.dumps({"choices": [{"message": {"role": "assistant", "content": body}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
    pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    events = b"".join(b"data: %s\n\n" % json.dumps({"choices": [{"delta": {"content": p}}]}).encode() for p in pieces)

    async def complete(request: web.Request) -> web.StreamResponse:
        doc = json.loads(await request.read())
        log.append(sum(m["role"] == "user" for m in doc["messages"]))
        if not doc.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(events + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def scenario(url: str, tmp_path, session: dict, sessions: int, limits: dict | None = None, stream: bool = False) -> dict:
    """`sessions` sessions started in the first 0.5 s, then 0.5 s for them to finish (they take ms)."""
    return {
        "name": "big", "seed": 3,
        "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 10,
                   "openai": {"api": "chat", "stream": stream, "include_usage": False}},
        "workload": {"classes": [{"name": "chat", "prompt_tokens": 8, "output_tokens": 2,
                                  "session": {"think_time": "0s", **session}}]},
        "phases": [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 2 * sessions}},
                   {"name": "tail", "duration": 0.5, "arrival": {"type": "idle"}}],
        "limits": {"timer": "coarse", **(limits or {})},
        "output": {"dir": str(tmp_path / "results"), "report": False},
    }


def worker_peak(data: dict) -> tuple[int, dict]:
    """Run `data` with one worker; (the worker's peak RSS in bytes, the summary). The peak is the
    kernel's own high-water mark (/proc/PID/status VmHWM: exact, not sampled), read every 10 ms
    while the worker lives; the largest child process is the worker."""
    peaks: dict[int, int] = {}
    done = threading.Event()

    def watch() -> None:
        me = psutil.Process()
        while not done.wait(0.01):
            for child in me.children():
                try:
                    status = Path(f"/proc/{child.pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        peaks[child.pid] = max(peaks.get(child.pid, 0), int(line.split()[1]) * 1024)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_scenario(scenario_from_dict(data), workers=1)
    finally:
        done.set()
        watcher.join(5)
    return max(peaks.values()), result.summary


def test_a_session_carrying_megabyte_answers_ends_at_its_bound_and_the_worker_stays_small(tmp_path):
    """Five 10-turn sessions against a server answering every turn with 2 MB. Carried without a bound,
    each history would grow to 20 MB (100 MB, and a copy of each in the request being sent). With
    session.max_history_bytes 3 MB, every session ends `history_limit` right after its 2nd answer (1
    answer: ~2 MB ≤ 3 MB; 2: ~4 MB > 3 MB): exactly 2 turns sent each, 8 not sent, counted and named
    in summary.json; no error, a complete results directory. Memory: against the same run with
    `history: new` (two turns each: the same answers in flight, nothing carried), the worker's peak
    RSS grows by at most 3 × sessions × (bound + one answer) — a history, the next turn's request
    built from it, and the transient copy while that is built: 75 MB. Measured: +7 MB; without the
    bounds the same run adds ~130 MB in its one second (and 1.8 GB with the issue's 16 MB answers)."""
    log: list[int] = []
    bound, answer, sessions = 3 * MB, 2 * MB, 5
    with serve(make_big_app(log, answer)) as url:
        base_peak, base = worker_peak(scenario(url, tmp_path / "new", {"turns": 2, "history": "new"}, sessions))
        log.clear()
        peak, summary = worker_peak(scenario(url, tmp_path / "carry", {"turns": 10, "max_history_bytes": bound}, sessions))
    assert base["sessions"]["chat"]["completed"] == sessions  # the same answers in flight, nothing carried
    chat = summary["sessions"]["chat"]
    assert (chat["started"], chat["history_limit"], chat["completed"], chat["abandoned"], chat["cut"]) == (
        sessions, sessions, 0, 0, 0)
    assert chat["turns_not_sent"] == summary["requests"]["not_sent"] == 8 * sessions
    assert summary["requests"]["sent"] == summary["requests"]["completed"] == 2 * sessions
    assert sum(summary["errors"].values()) == 0 and not summary["partial"] and summary["requests"]["unaccounted"] == 0
    assert sorted(log) == [1] * sessions + [2] * sessions  # the server saw turns 1 and 2 of each, nothing after
    allowed = 3 * sessions * (bound + answer)
    assert peak - base_peak <= allowed, (peak / MB, base_peak / MB, allowed / MB)


def test_the_workers_carried_histories_together_are_bounded(tmp_path):
    """Four 8-turn sessions started within 40 ms, 3 MB answers, 0.3 s think time; each session may
    carry 8 MiB, the worker only 4 MiB in all. Alone, a session would send 3 turns (its history
    passes 8 MiB only with its 3rd answer, 9 MB). Here, while the first session to be answered holds
    its 3 MB through its think time, each other session's first answer takes the sum past 4 MiB and
    ends that session (`history_limit` after 1 turn); the first ends at its 2nd answer (6 MB). So
    every session ends `history_limit`, at least one after a single turn because of the others'
    histories (as planned: only the first sends 2), and every turn sent is counted once."""
    log: list[int] = []
    with serve(make_big_app(log, 3 * MB)) as url:
        data = scenario(url, tmp_path, {"turns": 8, "think_time": "0.3s"}, 4,
                        limits={"max_carried_bytes_per_worker": 4 << 20})
        data["phases"] = [{"name": "p", "duration": 0.05, "arrival": {"type": "constant", "rate": 80}},
                          {"name": "tail", "duration": 1, "arrival": {"type": "idle"}}]
        result = run_scenario(scenario_from_dict(data), workers=1)
    summary = result.summary
    chat = summary["sessions"]["chat"]
    assert chat["started"] == chat["history_limit"] == 4 and log.count(1) == 4 and max(log) == 2
    assert log.count(2) < 4, log  # some session ended after one turn: the sum, not its own history, ended it
    assert summary["requests"]["sent"] == len(log) and chat["turns_not_sent"] == 8 * 4 - len(log)
    assert sum(summary["errors"].values()) == 0 and summary["requests"]["unaccounted"] == 0
    # named where the other session ends are: the console's line, the report's table and timeline
    assert "0 cut, 4 at the history limit, " in sessions_lines(summary)[0]
    page = report_html(load_run(result.run_dir))
    section = page[page.index('<section id="sessions">'):]
    assert '<th class=n>cut</th><th class=n>history limit</th>' in section and "<td class=n>4</td>" in section
    marker = '<script type="application/json" id="latscope-figures">'
    start = page.index(marker) + len(marker)
    traces = json.loads(page[start:page.index("</script>", start)])["figures"]["plot-sessions"]["data"]
    assert "history limit per interval" in {t["name"] for t in traces}


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_in_a_carried_answer_is_the_targets_protocol_error(tmp_path, stream):
    """The server answers with text holding a lone UTF-16 surrogate, escaped in JSON ("\\ud800"),
    which json.loads accepts and UTF-8 cannot encode: each turn 1 is a `protocol` error that names the
    surrogate (not "the client failed: UnicodeEncodeError"), its session is abandoned, turn 2 is
    never sent, and the run ends normally."""
    log: list[int] = []
    with serve(make_big_app(log, 0, text="fine until \ud800 here")) as url:
        data = scenario(url, tmp_path, {"turns": 3}, 2, stream=stream)
        summary = run_scenario(scenario_from_dict(data), workers=1).summary
    assert log == [1, 1]
    assert summary["errors"]["protocol"] == 2 == summary["requests"]["sent"]
    [example] = summary["error_examples"]["protocol"]
    assert example.startswith("the answer holds a lone UTF-16 surrogate (\\ud800, at character 11 of its text)")
    assert "client failed" not in json.dumps(summary)
    chat = summary["sessions"]["chat"]
    assert chat["abandoned"] == chat["started"] == 2 and chat["turns_not_sent"] == 4 and not summary["partial"]
