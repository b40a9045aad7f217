"""The search's arithmetic: doubling, bisection, when it is done, and how many steps remain."""

from __future__ import annotations

import math

import pytest

from latscope.capacity.search import STOPS, next_rate, steps_left


def test_doubles_until_a_fail_capped_at_max_rate():
    assert next_rate(100, None, 0.05, None) == 200
    assert next_rate(100, None, 0.05, 150) == 150
    assert next_rate(150, None, 0.05, 150) is None  # the SLOs hold at --max-rate: done


def test_bisects_until_the_bracket_is_within_the_precision_of_its_lower_end():
    assert next_rate(100, 200, 0.05, None) == 150
    assert next_rate(100, 105, 0.05, None) is None  # 5 % of 100
    assert next_rate(100, 105.01, 0.05, None) == pytest.approx(102.505)


def test_a_search_without_a_passing_rate_cannot_go_on():
    with pytest.raises(ValueError):
        next_rate(None, 100, 0.05, None)


def test_steps_left_is_the_worst_case_number_of_bisections():
    # from a bracket [r, 2r], width 100 % of its low end: halvings to reach 5 % = ceil(log2(1 / 0.05)) = 5
    assert steps_left(100, 200, 0.05) == math.ceil(math.log2(1 / 0.05)) == 5
    assert steps_left(100, 104, 0.05) == 0
    assert steps_left(None, 200, 0.05) is None and steps_left(100, None, 0.05) is None
    low, high, n = 100.0, 200.0, 0
    while next_rate(low, high, 0.05, None) is not None:  # every bisection failing is the longest way
        high, n = next_rate(low, high, 0.05, None), n + 1
    assert n == steps_left(100, 200, 0.05)


def test_every_stop_has_an_exit_code_and_words():
    assert {name: code for name, (code, _) in STOPS.items()} == {
        "precision": 0, "max_rate": 0, "slo_fails_at_lowest_rate": 1, "inconclusive": 4, "generator_limit": 4,
        "max_steps": 4, "interrupted": 4, "run_failed": 4}
