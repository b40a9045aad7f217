"""The search's arithmetic: doubling, bisection, the undecided band, when it is done and why, how
many steps remain, and how long a step would decide an undecided SLO."""

from __future__ import annotations

import math

import pytest

from latscope.capacity.search import STOPS, band, decide_seconds, next_rate, steps_left, stop_reason


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
        "max_steps": 4, "interrupted": 4, "run_failed": 4, "undecided_band": 0, "target_down": 1}


def test_doubling_goes_on_from_the_highest_undecided_rate_not_from_the_confident_low():
    # 100 passed, 200 was undecided after its looks: it is no fail, so the search keeps doubling, from 200
    assert next_rate(100, None, 0.05, None, [200]) == 400
    assert next_rate(100, None, 0.05, 300, [200]) == 300  # capped at max_rate
    assert next_rate(100, None, 0.05, 200, [200]) is None  # undecided at max_rate: nothing left to try
    assert stop_reason(100, None, 0.05, 200, [200]) == "undecided_band"
    assert stop_reason(200, None, 0.05, 200, []) == "max_rate"
    assert next_rate(100, None, 0.05, None, [50]) == 200  # an undecided rate under low is not in the band


def test_once_both_ends_exist_it_bisects_the_wider_gap_beside_the_band():
    # low 100, band 120..130, high 200: gaps [100, 120] (20 %) and [130, 200] (54 %): the wider is above
    assert band(100, 200, [130, 120, 90, 210]) == [120, 130]
    assert next_rate(100, 200, 0.05, None, [120, 130]) == 165
    # gaps [100, 120] (20 %) and [130, 140] (7.7 %): below
    assert next_rate(100, 140, 0.05, None, [120, 130]) == 110
    # no band: the plain bisection of [low, high]
    assert next_rate(100, 200, 0.05, None, []) == next_rate(100, 200, 0.05, None) == 150


def test_precision_is_only_ever_the_confident_ends_and_a_wide_band_stops_as_such():
    # both gaps within 5 %, but low 100 and high 120 are 20 % apart: the band is the answer, not a precision
    undecided = [104, 108, 112, 116]
    assert next_rate(100, 120, 0.05, None, undecided) is None
    assert stop_reason(100, 120, 0.05, None, undecided) == "undecided_band"
    # the confident ends within the precision: done, whatever undecided rates lie between them
    assert next_rate(100, 104, 0.05, None, [102]) is None
    assert stop_reason(100, 104, 0.05, None, [102]) == "precision"
    # a gap beside the band still wider than the precision: the search goes on there
    assert next_rate(100, 120, 0.05, None, [110, 112]) == 105


def test_the_step_length_that_would_decide_is_the_measured_length_times_the_squared_interval_ratio():
    # p99 38 ms [30, 44] against 40 ms, 16 s pooled: the side facing the limit is the upper, 6 ms wide,
    # the value 2 ms from the limit: intervals shrink as 1/sqrt(n), so 16 * (6 / 2)^2 = 144 s
    assert decide_seconds(16, 38, 30, 44, 40) == pytest.approx(144)
    # over the limit: the lower side faces it, 45 [41, 52] vs 40: 16 * (4 / 5)^2
    assert decide_seconds(16, 45, 41, 52, 40) == pytest.approx(16 * 0.64)
    assert decide_seconds(16, 38, 30, None, 40) is None  # an open upper bound: no estimate
    assert decide_seconds(16, 40, 30, 50, 40) is None  # on the limit: no length decides it
    # within a hair of it: (10 / 0.3)² = 1111 times the data, past MAX_DECIDE_FACTOR (1000): none either
    assert decide_seconds(16, 39.7, 30, 49.7, 40) is None and decide_seconds(16, 39.6, 30, 49.6, 40) == pytest.approx(16 * 625)
    assert decide_seconds(16, None, None, None, 40) is None
