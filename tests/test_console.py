"""The live progress display prints each notable event (actions, new replicas, restarts) once, as text."""

from __future__ import annotations

import io

from rich.console import Console

from latscope.console import ProgressDisplay, event_line
from latscope.run import Progress


def progress(events: list[dict], seen: int) -> Progress:
    return Progress(elapsed_s=1.0, duration_s=10.0, phase="p", offered_rps=10.0, achieved_rps=10.0, in_flight=0, sent=10,
                    completed=10, errors=0, p50_ms=1.0, p99_ms=2.0, stopping=None, recent_events=events, events_seen=seen)


def test_event_lines_say_what_happened():
    assert event_line({"event": "action_end", "t_s": 15.0, "name": "add", "kind": "http", "ok": True, "status": 202,
                       "duration_s": 0.02}) == "   15.0 s  action add (http) ok, status 202 in 0.02 s"
    assert event_line({"event": "action_end", "t_s": 5.0, "name": "scale", "kind": "command", "ok": False,
                       "exit_code": 3, "duration_s": 0.1, "error": "exited with code 3"}) == \
        "    5.0 s  action scale (command) FAILED, exit code 3 in 0.10 s: exited with code 3"
    assert event_line({"event": "replica_first_seen", "t_s": 16.5, "replica": "r1-9", "latency_ms": 372.2}) == \
        "   16.5 s  new replica r1-9, first response 372 ms"
    assert event_line({"event": "first_after_idle", "t_s": 10.2, "idle_gap_s": 6.05, "latency_ms": 190.0, "error": None}) == \
        "   10.2 s  first request after 6.0 s idle: 190 ms"
    assert event_line({"event": "target_ready", "t_s": None, "after_s": 2.4}) == " before t=0  target ready after 2.40 s"


def test_each_event_is_printed_once_and_markup_from_a_target_is_shown_as_text():
    out = io.StringIO()
    display = ProgressDisplay(Console(file=out, width=200), enabled=True)  # not a terminal: plain lines
    first = {"event": "replica_first_seen", "t_s": 0.1, "replica": "[bold]r0[/bold]", "latency_ms": 5.0}
    second = {"event": "action_end", "t_s": 2.0, "name": "a", "kind": "http", "ok": True, "status": 200, "duration_s": 0.01}
    with display:
        display(progress([first], 1))
        display(progress([first], 1))  # nothing new
        display(progress([first, second], 2))
    text = out.getvalue()
    assert text.count("new replica [bold]r0[/bold], first response 5 ms") == 1
    assert text.count("action a (http) ok, status 200") == 1
    assert text.index("new replica") < text.index("action a")


def test_the_final_summary_says_the_goodput_in_one_line_and_goodput_slos_in_their_units():
    from latscope.console import print_summary

    summary = {"scenario": "s", "metrics": {}, "requests": {"sent": 1000, "completed": 1000, "errors": 0, "dropped": 0, "late": 0},
               "throughput": {"offered_rps": 75.0, "achieved_rps": 75.0}, "errors": {}, "validity": "valid",
               "validity_reasons": [], "partial": False,
               "goodput": {"all": {"good": 987, "total": 1000, "fraction": 0.987, "rps": 74.0, "output_tokens_per_s": 1234.4}},
               "slo": [{"metric": "goodput", "class": "all", "stat": "fraction", "limit": 0.99, "value": 0.987, "passed": False,
                        "direction": "min"},
                       {"metric": "latency", "class": "all", "stat": "p99_ms", "limit": 100, "value": 41.234, "passed": True}]}
    out = io.StringIO()
    print_summary(Console(file=out, width=200), summary, "results/x")
    text = out.getvalue()
    assert "goodput: 98.7% of requests met every objective (987 of 1,000), 74.0 req/s, 1,234 output tokens/s\n" in text
    assert "SLO FAIL goodput/all fraction 98.7% ≥ 99.0%" in text and "SLO PASS latency/all p99_ms 41.23 ≤ 100" in text
    out = io.StringIO()
    print_summary(Console(file=out, width=200), {**summary, "goodput": {}, "slo": []}, "results/x")
    assert "goodput" not in out.getvalue()


def test_reasoning_tokens_ttfot_and_empty_answers_get_a_line_per_class():
    from latscope.console import answers_lines

    summary = {"requests_by_class": {"think": {"completed": 4, "empty": 0}, "terse": {"completed": 9, "empty": 3},
                                     "plain": {"completed": 5}},  # an older summary: no `empty`
               "tokens": {"think": {"output_tokens": 420, "reasoning_tokens": 400}, "terse": {"output_tokens": 6}},
               "metrics": {"ttfot": {"think": {"p50_ms": 812.5}}, "ttft": {"think": {"p50_ms": 40.25}}}}
    assert answers_lines(summary) == [
        "answers think: 400 reasoning tokens of 420 output tokens · TTFOT p50 812.50 ms (TTFT p50 40.25 ms)",
        "answers terse: 3 empty answers (completed with 0 output tokens, no TTFT)"]


def test_scale_from_zero_is_said_after_a_real_idle_stretch_only_of_a_target_with_replicas(tmp_path):
    """Two real runs with an idle phase: the target that names its replica (X-Replica-Id) gets its
    "scale from zero after idle" line; the one that names none (nothing to scale) does not, unless
    its first request after idle really was cold (then the slowdown is worth saying either way)."""
    from aiohttp import web

    from conftest import scenario_dict, serve
    from latscope.console import print_summary
    from latscope.run import run_scenario
    from latscope.scenario import scenario_from_dict

    def app(replica: str | None) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"ok": True}, headers={"X-Replica-Id": replica} if replica else {})

        application = web.Application()
        application.router.add_post("/infer", handle)
        return application

    phases = [{"name": "a", "duration": 0.5, "arrival": {"type": "constant", "rate": 20}},
              {"name": "pause", "duration": 0.3, "arrival": {"type": "idle"}},
              {"name": "wake", "duration": 0.5, "arrival": {"type": "constant", "rate": 20}}]
    said = {}
    for replica in ("r0", None):
        with serve(app(replica)) as url:
            summary = run_scenario(scenario_from_dict(scenario_dict(url, tmp_path, phases)), workers=1).summary
        (wake,) = summary["cold_start"]["scale_from_zero"]
        out = io.StringIO()
        print_summary(Console(file=out, width=200), summary, tmp_path)
        said[replica] = ("scale from zero after idle, phase wake" in out.getvalue(), wake["cold"])
    assert said["r0"][0] is True
    assert said[None][0] is bool(said[None][1])  # not said for a wake that was not cold
