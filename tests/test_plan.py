"""The plan's idle stretches (plan.after_idle): the requests measured on their own as the first after idle."""

from __future__ import annotations

import numpy as np

from latscope.plan import IDLE_GAP_S, after_idle, build_plan
from latscope.scenario import scenario_from_dict


def _plan(cls: dict, phases: list[dict]):
    return build_plan(scenario_from_dict({"target": {"url": "http://127.0.0.1:9", "protocol": "openai", "model": "m"},
                                          "workload": {"classes": [{"name": "c", "prompt_tokens": 10, **cls}]},
                                          "phases": phases}))


def test_a_gap_between_sessions_that_their_later_turns_fill_is_no_idle_stretch():
    """One session every 1 / 0.15 = 6.7 s (a gap over IDLE_GAP_S = 5 s): alone, every request after the
    first comes after idle; as sessions of 5 turns 3 s of thinking apart (12 s each), the target is
    never idle, so none does (a sessions run against a server with nothing to scale printed "scale from
    zero after idle" lines). Three turns 1 s apart (2 s of a 6.7 s gap): quiet for 4.7 s, under 5 s."""
    phases = [{"name": "p", "duration": 60, "arrival": {"type": "constant", "rate": 0.15}}]
    rows, gaps = after_idle(_plan({}, phases))
    assert rows.tolist() == list(range(1, 9)) and np.allclose(gaps, 1 / 0.15) and IDLE_GAP_S == 5.0
    for session in ({"turns": 5, "think_time": 3}, {"turns": 3, "think_time": 1}):
        rows, _ = after_idle(_plan({"session": session}, phases))
        assert rows.tolist() == [], session
    rows, gaps = after_idle(_plan({"session": {"turns": 2, "think_time": 0.5}}, phases))  # quiet 6.2 s of 6.7
    assert rows.tolist() == list(range(1, 9)) and np.allclose(gaps, 1 / 0.15 - 0.5)


def test_an_idle_phase_counts_unless_something_before_it_still_runs():
    idle = [{"name": "a", "duration": 2, "arrival": {"type": "constant", "rate": 5}},
            {"name": "i", "duration": 1, "arrival": {"type": "idle"}},
            {"name": "b", "duration": 2, "arrival": {"type": "constant", "rate": 5}}]
    rows, gaps = after_idle(_plan({}, idle))
    assert rows.tolist() == [10] and np.allclose(gaps, 1.2)  # b's first request, 1 s + one 0.2 s spacing after a's last
    # closed-loop users send until their phase ends: the idle phase after them is idle from then on
    users = [{**idle[0], "arrival": {"type": "users", "users": 2}}, {**idle[1], "duration": 6}, idle[2]]
    plan = _plan({}, users)
    rows, gaps = after_idle(plan)
    assert rows.tolist() == [2] and np.allclose(gaps, 6.0)
    # sessions whose turns (4 × 1 s of thinking) outlast the 1 s idle phase: it is not idle
    rows, _ = after_idle(_plan({"session": {"turns": 5, "think_time": 1}}, idle))
    assert 10 not in rows.tolist()
