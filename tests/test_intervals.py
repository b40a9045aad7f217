"""intervals.py's rules for reasoning streams, empty answers and batch items, one outcome at a time,
with times chosen so every value is under 2,048 µs, where the histograms are exact (HDR's 3
significant digits: 2,048 sub-buckets of 1 µs), so each assertion is the integer of the rule."""

from __future__ import annotations

from latscope.intervals import IntervalRecorder
from latscope.recorder import from_sparse
from latscope.records import Outcome, Request
from latscope.results.schema import COMPLETED, COUNTERS, EMPTY, GOOD, ITEMS, OUTPUT_TOKENS, PROMPT_TOKENS, REASONING_TOKENS

US = 1_000


def _record(outcome: Outcome, goodput: dict | None = None) -> tuple[dict[str, list[int]], list[int]]:
    """(metric -> its values, the counters) of one request of class 0 intended at t = 0."""
    recorder = IntervalRecorder(["c"], goodput=[goodput])
    recorder.record(Request(0, 0, 0, False, prompt_tokens=7), outcome)
    report = recorder.take(0, 0)
    values = {}
    for (metric, _, _), sparse in report.histograms.items():
        h = from_sparse(*sparse)
        values[metric] = [v for v in range(h.get_min_value(), h.get_max_value() + 1) for _ in range(h.get_count_at_value(v))]
    return values, report.counters.get((0, False), [0] * len(COUNTERS))


def _reasoning_stream(**usage) -> Outcome:
    # two reasoning chunks (1,000.999 and 1,200 µs), then three content chunks from 1,500.5 µs; end at 1,900 µs
    times = [1_000_999, 1_200_000, 1_500_500, 1_700_000, 1_800_000]
    return Outcome(0, 1_900_000, token_ns=times, output_tokens=len(times), reasoning_chunks=2, content_ns=times[2], **usage)


def test_ttfot_reasoning_time_and_content_tpot_of_a_reasoning_stream():
    values, row = _record(_reasoning_stream())
    assert values["ttft"] == [1000]  # the first chunk of either kind
    assert values["ttfot"] == [1500]  # 1,500,500 ns // 1000
    assert values["reasoning_time"] == [499]  # (1,500,500 − 1,000,999) // 1000
    assert values["content_tpot"] == [(1_900_000 - 1_500_500) // 1000 // (3 - 1)] == [199]
    assert values["tpot"] == [(1_900_000 - 1_000_999) // 1000 // 4] == [224]
    assert row[REASONING_TOKENS] == 2 and row[OUTPUT_TOKENS] == 5 and row[EMPTY] == 0


def test_the_servers_reasoning_count_wins_over_the_chunks():
    # usage: 9 output tokens, 6 of them reasoning (3 tokens a reasoning chunk): 3 content tokens
    values, row = _record(_with(output_tokens=9, reasoning_tokens=6))
    assert row[REASONING_TOKENS] == 6 and row[OUTPUT_TOKENS] == 9
    assert values["content_tpot"] == [199]  # (9 − 6) content tokens, as without usage


def _with(**fields) -> Outcome:
    outcome = _reasoning_stream()
    for k, v in fields.items():
        setattr(outcome, k, v)
    outcome.tokens_from_usage = True
    return outcome


def test_a_stream_without_reasoning_has_ttfot_equal_to_ttft_and_no_reasoning_time():
    times = [1_000_000, 1_100_000, 1_300_000]
    values, row = _record(Outcome(0, 1_300_000, token_ns=times, output_tokens=3, content_ns=times[0]))
    assert values["ttfot"] == values["ttft"] == [1000] and "reasoning_time" not in values
    assert values["content_tpot"] == values["tpot"] == [150]
    assert row[REASONING_TOKENS] == 0


def test_a_stream_that_only_reasoned_has_no_ttfot():
    values, row = _record(Outcome(0, 1_300_000, token_ns=[1_000_000, 1_100_000], output_tokens=2, reasoning_chunks=2))
    assert values["ttft"] == [1000] and not {"ttfot", "reasoning_time", "content_tpot"} & values.keys()
    assert row[REASONING_TOKENS] == 2


def test_empty_answers_count_apart_with_their_prompt_and_no_ttft():
    for outcome in (Outcome(0, 1_000_000, token_ns=[]),  # a stream that ended without a token chunk
                    Outcome(0, 1_000_000, prompt_tokens=9, tokens_from_usage=True)):  # a whole answer, usage 0
        values, row = _record(outcome)
        assert row[COMPLETED] == row[EMPTY] == 1 and row[PROMPT_TOKENS] == (outcome.prompt_tokens or 7)
        assert values.keys() == {"latency", "service_time", "send_lag"}
    # Not empty: an answer whose count nobody knows (a whole answer without usage, plain HTTP), and a batch request.
    for outcome in (Outcome(0, 1_000_000), Outcome(0, 1_000_000, prompt_tokens=12, tokens_from_usage=True, items=4)):
        _, row = _record(outcome)
        assert row[COMPLETED] == 1 and row[EMPTY] == 0
    assert _record(Outcome(0, 1_000_000, items=4))[1][ITEMS] == 4
    assert _record(Outcome(0, 1_000_000, items=4, error="timeout"))[1][ITEMS] == 0  # completed requests only


def test_a_ttfot_objective_judges_the_answers_first_token():
    stream = _reasoning_stream()  # ttft 1.000 ms, ttfot 1.500 ms
    assert _record(_reasoning_stream(), {"ttfot_ms": 1.5})[1][GOOD] == 1
    assert _record(stream, {"ttfot_ms": 1.499})[1][GOOD] == 0
    assert _record(_reasoning_stream(), {"ttft_ms": 1.0, "ttfot_ms": 2})[1][GOOD] == 1
    # no content chunk (it only reasoned) or no chunk at all: ttfot = latency (1.9 ms / 1 ms)
    only_reasoning = Outcome(0, 1_900_000, token_ns=[1_000_000], output_tokens=1, reasoning_chunks=1)
    assert _record(only_reasoning, {"ttfot_ms": 1.899})[1][GOOD] == 0
    assert _record(Outcome(0, 1_000_000, output_tokens=3, tokens_from_usage=True), {"ttfot_ms": 1})[1][GOOD] == 1
