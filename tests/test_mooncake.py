"""Tests for latscope.mooncake: reading Mooncake traces, replay windows, scaling, and prompt text
whose shared prefixes are exactly the trace's shared hash-id prefixes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import DATA
from latscope import arrivals, mooncake
from latscope.errors import ScenarioError
from latscope.mooncake import (ReplayLimits, block_prompt, id_capacity, line_bytes, mooncake_offsets, mooncake_rows,
                               read_mooncake, scaled_lengths)
from latscope.workload import VOCABULARY

MOONCAKE_TRACE = DATA / "mooncake_conversation_trace.jsonl"
WORDS = tuple(VOCABULARY)


@pytest.fixture(scope="module")
def real() -> mooncake.MooncakeTrace:
    return read_mooncake(MOONCAKE_TRACE)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def request(timestamp=0, input_length=1000, output_length=10, hash_ids=None) -> str:
    if hash_ids is None:
        hash_ids = list(range(math.ceil(input_length / 512)))
    return json.dumps({"timestamp": timestamp, "input_length": input_length,
                       "output_length": output_length, "hash_ids": hash_ids})


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


def test_reads_the_real_trace(real):
    rows = [json.loads(line) for line in MOONCAKE_TRACE.read_text().splitlines()]
    assert len(real) == len(rows) == 12_031
    assert real.offset_s.dtype == np.float64 and real.input_length.dtype == np.int64
    assert real.output_length.dtype == real.hash_ids.dtype == real.hash_start.dtype == np.int64
    stamps = np.array([r["timestamp"] for r in rows])
    np.testing.assert_array_equal(real.offset_s, (stamps - stamps.min()) / 1000)
    assert real.offset_s[:3].tolist() == [0.0, 0.0, 0.0] and real.offset_s[-1] == pytest.approx(3536.999)
    np.testing.assert_array_equal(real.input_length, [r["input_length"] for r in rows])
    np.testing.assert_array_equal(real.output_length, [r["output_length"] for r in rows])
    # CSR: starts at 0, one id a block of 512 tokens, ends at the flat array's length
    assert real.hash_start[0] == 0 and real.hash_start[-1] == len(real.hash_ids) == 288_500
    np.testing.assert_array_equal(np.diff(real.hash_start), -(-real.input_length // 512))
    for i in (0, 1, 2, 5_000, 12_030):
        assert real.ids(i).tolist() == rows[i]["hash_ids"]
    assert real.ids(0).tolist() == list(range(14)) and real.ids(1).tolist()[:2] == [0, 14]
    assert real.hash_ids.max() == 182_789 and real.block_size == 512


def test_reading_the_real_trace_is_fast(real):
    started = time.perf_counter()
    read_mooncake(MOONCAKE_TRACE)
    assert time.perf_counter() - started < 2.0  # about 0.1 s; generous for a loaded machine


def test_reads_a_small_trace_in_file_order_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, request(2500, 600, 5, [7, 8]), "", request(1500, 1, 0, [7]), "  ",
                 request(1500.5, 1024, 3, [1, 2]))
    trace = read_mooncake(path)
    assert trace.offset_s.tolist() == [1.0, 0.0, 0.0005]
    assert trace.input_length.tolist() == [600, 1, 1024] and trace.output_length.tolist() == [5, 0, 3]
    assert trace.hash_ids.tolist() == [7, 8, 7, 1, 2] and trace.hash_start.tolist() == [0, 2, 3, 5]
    assert trace.ids(1).tolist() == [7]


def test_block_size_can_be_set(tmp_path):
    path = write(tmp_path, request(0, 33, 1, [0, 1, 2]))
    assert read_mooncake(path, block_size=16).block_size == 16
    with pytest.raises(ScenarioError, match="needs ceil"):
        read_mooncake(path)


BAD_LINES = {
    "not JSON": ('{"timestamp": 0,', "not JSON"),
    "not an object": ("[1, 2, 3]", "expected a JSON object, got list"),
    "missing field": ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing field 'hash_ids'"),
    "negative timestamp": (request(timestamp=-1), "timestamp -1"),
    "string timestamp": (request(timestamp="0"), "timestamp '0'"),
    "boolean timestamp": ('{"timestamp": true, "input_length": 5, "output_length": 1, "hash_ids": [0]}',
                          "timestamp True"),
    "zero input_length": (request(input_length=0, hash_ids=[]), "input_length 0 is not an int >= 1"),
    "negative input_length": (request(input_length=-5, hash_ids=[]), "input_length -5"),
    "float input_length": (request(input_length=5.0, hash_ids=[0]), "input_length 5.0"),
    "negative output_length": (request(output_length=-1), "output_length -1 is not an int in [0, 2^31 - 1]"),
    "output_length past int32": (request(output_length=2**31), "output_length 2147483648 is not an int in [0, 2^31 - 1]"),
    "hash_ids not a list": (request(input_length=5, hash_ids=3), "hash_ids is int"),
    "too few hash_ids": (request(input_length=1025, hash_ids=[0, 1]),
                         "hash_ids has 2 ids but input_length 1025 needs ceil(1025/512) = 3"),
    "too many hash_ids": (request(input_length=512, hash_ids=[0, 1]), "hash_ids has 2 ids but input_length 512 needs"),
    "string hash id": (request(input_length=600, hash_ids=[0, "1"]), "hash_ids holds '1'"),
    "float hash id": (request(input_length=600, hash_ids=[0, 1.0]), "hash_ids holds 1.0"),
    "negative hash id": (request(input_length=600, hash_ids=[0, -3]), "hash_ids holds -3"),
    "huge hash id": (request(input_length=600, hash_ids=[0, 2**63]), "hash_ids holds 9223372036854775808"),
}


@pytest.mark.parametrize("line, message", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_bad_lines_name_the_file_and_the_line(tmp_path, line, message):
    path = write(tmp_path, request(0), "", request(5), line, request(9))  # the bad line is line 4
    with pytest.raises(ScenarioError) as info:
        read_mooncake(path)
    text = str(info.value)
    assert text.startswith(f"trace file {path}: line 4: ")
    assert message in text


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_a_trace_without_requests_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=f"trace file {path}: no requests"):
        read_mooncake(path)


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(ScenarioError, match="not found"):
        read_mooncake(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------------------------------------
# the scenario's limits, on the trace, when the scenario is checked (validate and run alike)
# ---------------------------------------------------------------------------------------------

LIMITS = ReplayLimits(max_prompt_tokens=1_000_000, max_requests=10_000_000, max_duration_s=31 * 86400.0,
                      vocabulary_size=len(WORDS))


def test_max_ids_is_the_most_blocks_a_prompt_within_the_limit_has():
    # n ids make a prompt of at least (n - 1)·b + 1 tokens (n - 1 full blocks and one token)
    for b in (512, 64, 3, 1):
        n = LIMITS.max_ids(b)
        assert (n - 1) * b + 1 <= 1_000_000 < n * b + 1
    assert LIMITS.max_ids(512) == 1_954
    # a limit raised past int32 is int32 all the same: lengths are int32 in the plan
    assert dataclasses.replace(LIMITS, max_prompt_tokens=10**12).max_ids(512) == 2**22


def test_a_request_with_more_ids_than_the_limit_is_refused_by_its_input_length(tmp_path):
    path = write(tmp_path, request(0), request(5, 3 * 512 + 1), request(9))
    assert len(read_mooncake(path, max_ids=4)) == 3
    with pytest.raises(ScenarioError) as info:
        read_mooncake(path, max_ids=3)
    assert str(info.value).startswith(f"trace file {path}: line 2: input_length 1,537 is 4 blocks of 512 tokens; a "
                                      "request may have at most 3 hash_ids (limits.max_prompt_tokens")


def test_a_line_is_read_only_as_far_as_its_ids_may_go(tmp_path):
    """A line longer than max_ids ids can take is refused from its first line_bytes bytes: the JSON is
    never parsed (here it is not even JSON), and the lines after it are never read."""
    path = tmp_path / "trace.jsonl"
    limit = line_bytes(10)
    assert limit == 10 * 21 + 4096
    path.write_bytes(request(0).encode() + b"\n" + b"[" * (limit + 1) + b"\n" + b"not JSON\n")
    with pytest.raises(ScenarioError) as info:
        read_mooncake(path, max_ids=10)
    assert str(info.value).startswith(f"trace file {path}: line 2: the line is over 4,306 bytes, more than its "
                                      "hash_ids can take; a request may have at most 10 hash_ids")
    # a line of exactly the most ids, each as long as an id gets, is read
    ids = [2**63 - 1 - i for i in range(10)]
    path.write_text(request(0, 10 * 512, 1, ids) + "\n")
    assert len(path.read_text()) < limit and read_mooncake(path, max_ids=10).hash_ids.tolist() == ids


def mooncake_scenario(trace: Path, limits: dict | None = None, duration: float | None = None, **arrival):
    from latscope.scenario import scenario_from_dict

    phase = {"name": "replay", "arrival": {"type": "trace", "format": "mooncake", "file": str(trace), **arrival}}
    return scenario_from_dict({
        "target": {"protocol": "openai", "url": "http://127.0.0.1:9", "model": "m"},
        "phases": [{**phase, **({"duration": duration} if duration else {})}], **({"limits": limits} if limits else {})})


def plan_error(scenario) -> str:
    from latscope.plan import build_plan

    with pytest.raises(ScenarioError) as info:
        build_plan(scenario)
    return str(info.value)


def test_a_prompt_over_max_prompt_tokens_names_its_line_and_a_cap_lets_it_through(tmp_path):
    from latscope.plan import build_plan

    path = write(tmp_path, request(0, 600), request(1, 1024), request(2, 1000))
    message = plan_error(mooncake_scenario(path, {"max_prompt_tokens": 1000}))
    assert (f"phases[0].arrival.file: trace file {path}: line 2: input_length 1,024 makes a prompt of 1,024 tokens "
            "(blocks of 512); the limit is 1,000 (limits.max_prompt_tokens)") in message
    plan = build_plan(mooncake_scenario(path, {"max_prompt_tokens": 1000}, lengths={"max_prompt": 1000}))
    assert plan.prompt_tokens.tolist() == [600, 1000, 1000]


def test_an_id_its_prompt_text_cannot_spell_names_its_line_and_block(tmp_path):
    from latscope.plan import build_plan

    small = id_capacity(3, len(WORDS))  # blocks of 3 tokens (scale 3/512) spell 141^3 ids
    path = write(tmp_path, request(0, 1000, 1, [0, small - 1]), request(1, 1100, 1, [0, 1, small]))
    message = plan_error(mooncake_scenario(path, scale=3 / 512))
    assert (f"trace file {path}: line 2: hash_ids holds 2,803,221 (block 3): blocks of 3 tokens spell at most "
            "2,803,221 distinct ids (0 to 2,803,220)") in message
    build_plan(mooncake_scenario(path))  # blocks of 512 tokens spell 141^4 ids
    # blocks past a capped prompt are never built, so their ids are never spelled
    build_plan(mooncake_scenario(path, scale=3 / 512, lengths={"max_prompt": 6}))


def test_a_replay_too_long_or_too_big_names_the_request_past_the_limit(tmp_path):
    from latscope.plan import build_plan

    path = write(tmp_path, request(0), request(2_000), request(1_000), request(9_000_000_000_000_000))
    message = plan_error(mooncake_scenario(path))
    assert (f"trace file {path}: line 4: this request comes 9e+12 s into the replay; a phase lasts at most 2,678,400 s "
            "(31 days)") in message
    assert build_plan(mooncake_scenario(path, duration=10)).duration_s == 10  # a duration cuts the window
    assert len(build_plan(mooncake_scenario(path, speedup=10**8))) == 4  # 90,000 s at 10^8 times the speed
    message = plan_error(mooncake_scenario(path, {"max_planned_requests": 2}, duration=10))
    assert (f"trace file {path}: line 2: the replay would send 3 requests, this one past the limit of 2 "
            "(limits.max_planned_requests)") in message  # in replay order: lines 1, 3, then 2


def test_a_csv_trace_whose_replay_is_too_long_is_refused_too(tmp_path):
    from latscope.plan import build_plan
    from latscope.scenario import scenario_from_dict

    path = tmp_path / "trace.csv"
    path.write_text("timestamp\n0\n1.5\n9000000000000\n")
    phase = {"name": "replay", "arrival": {"type": "trace", "file": str(path), "time_column": "timestamp"}}
    scenario = scenario_from_dict({"target": {"url": "http://127.0.0.1:9"}, "phases": [phase]})
    assert f"trace file {path}: its replay would last 9e+12 s; a phase lasts at most 2,678,400 s" in plan_error(scenario)
    phase["duration"] = 5
    assert len(build_plan(scenario_from_dict({"target": {"url": "http://127.0.0.1:9"}, "phases": [phase]}))) == 2


# ---------------------------------------------------------------------------------------------
# replay windows
# ---------------------------------------------------------------------------------------------


def test_start_speedup_and_duration(tmp_path):
    stamps = [2500, 0, 1000, 1000, 4000]  # file order is not time order
    trace = read_mooncake(write(tmp_path, *(request(t) for t in stamps)))
    assert mooncake_rows(trace).tolist() == [1, 2, 3, 0, 4]  # by time, file order on ties
    np.testing.assert_allclose(mooncake_offsets(trace), [0, 1, 1, 2.5, 4])
    # from trace second 1, twice as fast, for 1 s of phase time: offsets (t - 1) / 2 < 1
    assert mooncake_rows(trace, speedup=2, start=1, duration=1).tolist() == [2, 3, 0]
    np.testing.assert_allclose(mooncake_offsets(trace, speedup=2, start=1, duration=1), [0, 0, 0.75])
    assert mooncake_rows(trace, start=1.5).tolist() == [0, 4]
    assert mooncake_rows(trace, duration=2.5).tolist() == [1, 2, 3]  # 2.5 itself is out
    assert mooncake_rows(trace, start=10).tolist() == []
    with pytest.raises(ValueError, match="speedup"):
        mooncake_rows(trace, speedup=0)


@pytest.mark.parametrize("speedup, start, duration",
                         [(1, 0, None), (10, 0, 60), (3, 1200.5, 100), (0.5, 3000, None)])
def test_windows_match_the_csv_trace_replay(real, speedup, start, duration):
    frame = pd.DataFrame({"offset_s": real.offset_s})
    np.testing.assert_array_equal(mooncake_rows(real, speedup, start, duration),
                                  arrivals.trace_rows(frame, speedup, start, duration))
    np.testing.assert_array_equal(mooncake_offsets(real, speedup, start, duration),
                                  arrivals.trace_offsets(frame, speedup, start, duration))


# ---------------------------------------------------------------------------------------------
# scaling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.3, 1 / 8, 1 / 100, 1 / 512, 1e-4])
def test_scaling_keeps_the_block_structure(real, scale):
    rows = mooncake_rows(real)
    prompt, output, b = scaled_lengths(real, rows, scale)
    assert prompt.dtype == np.int64 and output.dtype == np.int64
    assert b == max(1, round(512 * scale))
    blocks = np.diff(real.hash_start)[rows]
    assert np.all((blocks - 1) * b < prompt) and np.all(prompt <= blocks * b)  # n blocks, n - 1 full
    np.testing.assert_array_equal(-(-prompt // b), blocks)
    assert np.all(output >= 1)  # every output_length in this trace is >= 1
    if scale == 1.0:
        np.testing.assert_array_equal(prompt, real.input_length[rows])
        np.testing.assert_array_equal(output, real.output_length[rows])


def test_scaling_by_hand(tmp_path):
    trace = read_mooncake(write(tmp_path, request(0, 1024 + 100, 0), request(1, 512, 3), request(2, 1, 2000),
                                request(3, 512 + 4, 5)))
    prompt, output, b = scaled_lengths(trace, np.arange(4), 1 / 8)
    assert b == 64
    # 2 full blocks + rint(12.5) = 12 (half to even); 1 full block; a 1-token block stays 1 token;
    # a 4-token last block rounds to 0 and is clamped to 1
    assert prompt.tolist() == [128 + 12, 64, 1, 64 + 1]
    assert output.tolist() == [0, 1, 250, 1]  # 0 stays 0 (unset); else at least 1
    assert scaled_lengths(trace, np.array([3, 0]), 1.0)[0].tolist() == [516, 1124]
    for scale in (0, -1, 1.5):
        with pytest.raises(ValueError, match="scale"):
            scaled_lengths(trace, np.arange(4), scale)


# ---------------------------------------------------------------------------------------------
# prompt text
# ---------------------------------------------------------------------------------------------


def reference_block(h: int, b: int, words: tuple[str, ...], seed: int) -> list[str]:
    """The module docstring's construction, written out plainly with Python ints."""
    mask = (1 << 64) - 1

    def mix(x):
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    v, q = len(words), 1 << 16
    s = mix(seed & mask)
    r = lambda i: mix((s + i) & mask) % v  # noqa: E731
    w = min(b, 4)
    o = mix(s ^ mix(h)) % (q - b + 1)
    return [words[((h // v**p) % v + r(p)) % v] if p < w else words[r(o + p)] for p in range(b)]


@pytest.mark.parametrize("h, b, seed", [(0, 1, 0), (140, 1, 0), (5, 3, 7), (182_789, 64, 0), (3, 512, -1),
                                        (395_254_160, 4, 2**70), (12_345, 10, 99)])
def test_block_text_is_the_documented_construction(h, b, seed):
    assert block_prompt([h], b, b, WORDS, seed).split(" ") == reference_block(h, b, WORDS, seed)


def test_prompts_have_exactly_the_asked_number_of_words():
    ids = [3, 1, 4, 1, 5]
    for b in (1, 2, 5, 64):
        full = block_prompt(ids, len(ids) * b, b, WORDS, 0).split(" ")
        for n in range(1, len(ids) * b + 1):
            text = block_prompt(ids, n, b, WORDS, 0)
            assert "  " not in text and text == text.strip()
            assert text.split(" ") == full[:n]  # a shorter prompt is a prefix of a longer one
    assert set(full) <= set(WORDS)
    # blocks past the cut are not built: an id too large for 1-word blocks does no harm there
    assert block_prompt([0, 10**9], 1, 1, WORDS, 0) == block_prompt([0], 1, 1, WORDS, 0)
    for n in (0, 11):
        with pytest.raises(ValueError, match="prompt_tokens"):
            block_prompt([0, 1], n, 5, WORDS, 0)
    with pytest.raises(ValueError, match="block_tokens"):
        block_prompt([0], 1, 0, WORDS, 0)


def test_the_key_property_on_the_real_trace(real):
    """For every pair of the first 300 replayed requests at scale 1/8: the number k of shared
    leading hash ids is the number of shared leading full blocks of text, and the block after
    them differs when both requests have it in full."""
    rows = mooncake_rows(real)[:300]
    prompt, _, b = scaled_lengths(real, rows, 1 / 8)
    assert b == 64
    ids = [real.ids(r).tolist() for r in rows]
    words = []
    for hashes, n in zip(ids, prompt.tolist()):
        text = block_prompt(hashes, n, b, WORDS, 7)
        words.append(text.split(" "))
        assert len(words[-1]) == n
    full = [len(w) // b for w in words]
    blocks = [[" ".join(w[j * b : (j + 1) * b]) for j in range(f)] for w, f in zip(words, full)]

    sharing = 0
    for i, j in itertools.combinations(range(len(rows)), 2):
        k = 0
        while k < min(len(ids[i]), len(ids[j])) and ids[i][k] == ids[j][k]:
            k += 1
        sharing += k > 0
        m = min(k * b, len(words[i]), len(words[j]))
        assert words[i][:m] == words[j][:m]
        if k < min(full[i], full[j]):
            assert words[i][k * b : (k + 1) * b] != words[j][k * b : (k + 1) * b]
        shared_text = 0  # leading full blocks of equal text
        while shared_text < min(full[i], full[j]) and blocks[i][shared_text] == blocks[j][shared_text]:
            shared_text += 1
        assert shared_text == min(k, full[i], full[j])
    assert sharing > 1_000  # the window does exercise prefix sharing

    # and across the window: equal ids <-> equal text, block for block (full blocks), and a partial
    # last block is the start of its id's text
    text_of, id_of = {}, {}
    for hashes, bl in zip(ids, blocks):
        for h, text in zip(hashes, bl):
            assert text_of.setdefault(h, text) == text and id_of.setdefault(text, h) == h
    for hashes, w, f in zip(ids, words, full):
        if len(w) > f * b and hashes[f] in text_of:
            assert text_of[hashes[f]].split(" ")[: len(w) - f * b] == w[f * b :]


def test_determinism_and_seeds():
    ids = list(range(20))
    first = block_prompt(ids, 20 * 64 - 10, 64, WORDS, 3)
    mooncake._block_text.cache_clear()
    mooncake._stream.cache_clear()
    assert block_prompt(ids, 20 * 64 - 10, 64, list(WORDS), 3) == first  # a list vocabulary too
    assert block_prompt(np.array(ids), 20 * 64 - 10, 64, WORDS, np.int64(3)) == first  # numpy ids and seed
    others = {block_prompt(ids, 20 * 64 - 10, 64, WORDS, seed) for seed in range(4, 14)}
    assert len(others) == 10 and first not in others
    # a different seed changes every block, not just the prompt as a whole
    a = block_prompt(ids, 20 * 64, 64, WORDS, 0).split(" ")
    c = block_prompt(ids, 20 * 64, 64, WORDS, 1).split(" ")
    assert all(a[j * 64 : (j + 1) * 64] != c[j * 64 : (j + 1) * 64] for j in range(20))


@pytest.mark.parametrize("b", [1, 2])
def test_every_id_within_capacity_gets_its_own_block(b):
    capacity = id_capacity(b, len(WORDS))
    assert capacity == len(WORDS) ** b
    texts = {block_prompt([h], b, b, WORDS, 5) for h in range(capacity)}
    assert len(texts) == capacity  # exhaustive: 141 one-word blocks, 19,881 two-word blocks
    with pytest.raises(ValueError, match=f"ids must be in \\[0, {capacity}\\)"):
        block_prompt([capacity], b, b, WORDS, 5)


def test_different_ids_give_different_blocks():
    v = len(WORDS)
    assert id_capacity(3, v) == 2_803_221 and id_capacity(64, v) == id_capacity(4, v) == 395_254_161
    # ids that agree in some base-v digits, neighbours, and the ends of the range
    ids = sorted({*range(2_000), *(d * v**p for p in range(4) for d in range(1, 40)),
                  *(h + v**3 for h in range(200)), 182_789, v**4 - 1, v**4 - 2})
    for b in (4, 64):
        texts = [block_prompt([h], b, b, WORDS, 0) for h in ids]
        assert len(set(texts)) == len(ids)
    with pytest.raises(ValueError, match="does not fit"):
        block_prompt([v**4], 64, 64, WORDS, 0)


def test_a_bad_vocabulary_is_refused():
    for words in (["a"], ["a", "b", "a"], ["a", "b c"], ["a", ""]):
        with pytest.raises(ValueError, match="word"):
            block_prompt([0], 1, 1, words, 0)


def test_an_8k_token_prompt_takes_well_under_a_millisecond_once_its_blocks_are_cached():
    ids = list(range(1000, 1016))  # 16 blocks of 512: 8,192 tokens
    block_prompt(ids, 8_192, 512, WORDS, 0)
    calls = 200
    started = time.perf_counter()
    for _ in range(calls):
        block_prompt(ids, 8_192, 512, WORDS, 0)
    assert (time.perf_counter() - started) / calls < 1e-3  # about 5 µs


def test_a_mooncake_phase_sends_prompts_that_share_exactly_what_the_trace_shares(real):
    """A scenario's Mooncake phase, through the plan and the worker's payloads (as the engine hands
    them each request's blocks): for every pair of the window's requests, the leading block ids they
    share, k, are exactly their shared leading full blocks of text, and the lengths are the scaled ones."""
    from latscope.engine import Engine
    from latscope.plan import build_plan
    from latscope.records import Request
    from latscope.scenario import scenario_from_dict
    from latscope.workload import Payloads

    scenario = scenario_from_dict({
        "target": {"protocol": "openai", "url": "http://127.0.0.1:9", "model": "m"},
        "phases": [{"name": "replay", "duration": 30, "arrival": {
            "type": "trace", "format": "mooncake", "file": str(MOONCAKE_TRACE), "start": 600, "speedup": 4, "scale": 1 / 32}}]})
    plan = build_plan(scenario)
    ids, start, block_tokens = plan.blocks
    assert len(plan) > 100 and set(block_tokens) == {16}
    engine = Engine(None, np.zeros(len(plan), np.int64), np.arange(len(plan)), plan.cls, plan.warmup,
                    (plan.prompt_tokens, plan.output_tokens, plan.item), plan.class_names, [], t0_ns=0, interval_s=1,
                    max_in_flight=1, overflow="queue", drain_timeout_s=1, report=print, should_stop=bool,
                    precise_timer=False, blocks=plan.blocks)
    requests: list[Request] = list(engine._planned())
    payloads = Payloads(scenario)
    words = [payloads.get(r).prompt.split(" ") for r in requests]
    assert [len(w) for w in words] == plan.prompt_tokens.tolist()
    b = 16
    for i in range(len(requests)):
        for j in range(i + 1, len(requests)):
            a_ids, b_ids = requests[i].blocks[0], requests[j].blocks[0]
            k = 0
            while k < min(len(a_ids), len(b_ids)) and a_ids[k] == b_ids[k]:
                k += 1
            full = min(len(words[i]), len(words[j])) // b  # full blocks both prompts have
            shared_text = 0
            while shared_text < full and words[i][shared_text * b:(shared_text + 1) * b] == words[j][shared_text * b:(shared_text + 1) * b]:
                shared_text += 1
            assert shared_text == min(k, full), (i, j)
