"""Workload: what each request carries (lengths drawn by the plan, payloads built in the worker)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from latscope.errors import ScenarioError
from latscope.plan import build_plan
from latscope.scenario.protocols import DEFAULT_PROMPT_TOKENS
from latscope.records import Request
from latscope.scenario import scenario_from_dict
from latscope.workload import VOCABULARY, Payloads, draw_lengths, salt_record, with_run_salt

from conftest import DATA


def _scenario(classes: list[dict], phases: list[dict] | None = None, protocol: str = "openai", base: str = "") -> dict:
    data = {
        "target": {"url": "http://127.0.0.1:9", "protocol": protocol, "model": "m"},
        "phases": phases or [{"name": "p", "duration": 100, "arrival": {"type": "constant", "rate": 200}}],
        "workload": {"classes": classes},
    }
    return data


def test_length_distributions_have_the_asked_moments_and_bounds():
    rng = np.random.default_rng(0)
    n = 200_000
    s = scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": {"dist": "uniform", "min": 10, "max": 20}}]))
    uniform = draw_lengths(s.workload.classes[0].prompt_tokens, n, rng, s)
    # Mean of n uniform draws on 10..20: standard error sqrt(10)/sqrt(n) ≈ 0.007.
    assert uniform.min() == 10 and uniform.max() == 20 and abs(uniform.mean() - 15) < 0.05
    logn = scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": {"dist": "lognormal", "mean": 300, "std": 150}}]))
    values = draw_lengths(logn.workload.classes[0].prompt_tokens, n, rng, logn)
    # Sample mean of n lognormal draws: standard error 150/sqrt(n) ≈ 0.34 tokens; 1.5 allows rounding.
    assert abs(values.mean() - 300) < 1.5 and abs(values.std() - 150) < 3
    assert np.median(values) < 300  # right-skewed, as prompt lengths are
    normal = scenario_from_dict(_scenario([{"name": "a", "output_tokens": {"dist": "normal", "mean": 50, "std": 40, "min": 5, "max": 80}}]))
    clipped = draw_lengths(normal.workload.classes[0].output_tokens, n, rng, normal)
    assert clipped.min() == 5 and clipped.max() == 80


def test_empirical_lengths_come_from_the_file(tmp_path):
    (tmp_path / "lengths.csv").write_text("n\n7\n9\n")
    data = _scenario([{"name": "a", "prompt_tokens": {"dist": "empirical", "file": str(tmp_path / "lengths.csv"), "column": "n"}}])
    s = scenario_from_dict(data)
    values = draw_lengths(s.workload.classes[0].prompt_tokens, 1000, np.random.default_rng(1), s)
    assert set(values.tolist()) == {7, 9}
    data["workload"]["classes"][0]["prompt_tokens"]["column"] = "missing"
    with pytest.raises(ScenarioError, match="no column 'missing'"):
        build_plan(scenario_from_dict(data))


def test_plan_draws_lengths_per_class_and_is_reproducible():
    data = _scenario([
        {"name": "chat", "weight": 3, "prompt_tokens": 100, "output_tokens": {"dist": "uniform", "min": 1, "max": 50}},
        {"name": "bare"},
    ])
    plan = build_plan(scenario_from_dict(data))
    chat, bare = plan.cls == 0, plan.cls == 1
    assert (plan.prompt_tokens[chat] == 100).all() and (plan.prompt_tokens[bare] == DEFAULT_PROMPT_TOKENS).all()
    assert plan.output_tokens[chat].min() >= 1 and plan.output_tokens[chat].max() <= 50 and (plan.output_tokens[bare] == 0).all()
    again = build_plan(scenario_from_dict(data))
    assert np.array_equal(plan.output_tokens, again.output_tokens) and np.array_equal(plan.item, again.item)


def test_http_classes_carry_no_lengths():
    plan = build_plan(scenario_from_dict(_scenario([{"name": "a"}], protocol="http")))
    assert not plan.prompt_tokens.any() and not plan.output_tokens.any()


def test_trace_columns_give_each_request_its_lengths():
    trace = DATA / "azure_llm_conv_trace.csv"
    lengths = {"prompt_column": "ContextTokens", "output_column": "GeneratedTokens"}
    phases = [{"name": "replay", "duration": 20, "arrival": {"type": "trace", "file": str(trace), "start": 60, "lengths": lengths}}]
    plan = build_plan(scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": 5}], phases)))
    import pandas as pd

    frame = pd.read_csv(trace)
    t = pd.to_datetime(frame["TIMESTAMP"])
    seconds = (t - t.min()).dt.total_seconds()
    rows = frame[(seconds >= 60) & (seconds < 80)]
    assert len(plan) == len(rows) > 0
    assert plan.prompt_tokens.tolist() == rows["ContextTokens"].tolist()
    assert plan.output_tokens.tolist() == rows["GeneratedTokens"].tolist()
    lengths.update(scale=0.125, max_prompt=100)
    small = build_plan(scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": 5}], phases)))
    expected = np.minimum(np.maximum(1, np.rint(rows["ContextTokens"].to_numpy() * 0.125)), 100)
    assert small.prompt_tokens.tolist() == expected.tolist() and small.prompt_tokens.max() == 100
    assert small.output_tokens.tolist() == np.maximum(1, np.rint(rows["GeneratedTokens"].to_numpy() * 0.125)).tolist()


def test_trace_column_typo_is_named():
    phases = [{"name": "replay", "duration": 5, "arrival": {"type": "trace", "file": str(DATA / "azure_llm_conv_trace.csv"),
               "lengths": {"prompt_column": "Context"}}}]
    with pytest.raises(ScenarioError, match="no column 'Context'.*ContextTokens"):
        build_plan(scenario_from_dict(_scenario([{"name": "a"}], phases)))


def test_synthetic_prompts_have_the_asked_word_count_and_differ_by_item():
    payloads = Payloads(scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": 10, "output_tokens": 4}])))
    one = payloads.get(Request(0, 0, 0, False, prompt_tokens=300, output_tokens=4, item=12345))
    two = payloads.get(Request(1, 0, 0, False, prompt_tokens=300, output_tokens=4, item=999))
    assert len(one.prompt.split()) == 300 and one.max_tokens == 4
    assert set(one.prompt.split()) <= set(VOCABULARY)
    assert one.prompt != two.prompt
    longer = payloads.synthetic_prompt(200_000, 5)  # longer than the text it is cut from: wraps around
    assert len(longer.split()) == 200_000


def test_dataset_prompts_text_and_sharegpt(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"text": "first prompt"}\n{"other": 1}\n{"text": "second prompt"}\n')
    (tmp_path / "s.json").write_text(json.dumps([
        {"conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]},
        {"conversations": []},
    ]))
    s = scenario_from_dict(_scenario([
        {"name": "t", "dataset": {"file": str(tmp_path / "p.jsonl")}},
        {"name": "g", "dataset": {"file": str(tmp_path / "s.json"), "format": "sharegpt"}},
    ]))
    payloads = Payloads(s)
    assert {payloads.get(Request(0, 0, 0, False, item=i)).prompt for i in range(4)} == {"first prompt", "second prompt"}
    assert payloads.get(Request(0, 0, 1, False, item=7)).prompt == "hello there"


def test_dataset_problems_name_the_file(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": \n')
    (tmp_path / "empty.jsonl").write_text('{"prompt": "x"}\n')
    for name, message in (("bad.jsonl", "not JSON lines"), ("empty.jsonl", "no rows with a text field 'text'"), ("none.jsonl", "not found")):
        s = scenario_from_dict(_scenario([{"name": "t", "dataset": {"file": str(tmp_path / name)}}]))
        with pytest.raises(ScenarioError, match=f"{name}.*{message}|{message}"):
            Payloads(s)


def test_tensors_random_within_bounds_or_from_npy(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.int32).reshape(2, 3))
    s = scenario_from_dict(_scenario([{"name": "k", "tensors": [
        {"name": "a", "datatype": "FP32", "shape": [4, 384], "low": -1, "high": 1},
        {"name": "ids", "datatype": "INT64", "shape": [1, 8], "low": 0, "high": 100},
        {"name": "f", "npy": str(tmp_path / "x.npy")},
    ]}], protocol="kserve-v2"))
    tensors = Payloads(s).get(Request(0, 0, 0, False, item=3)).tensors
    a, ids, f = tensors
    assert a.array.shape == (4, 384) and a.array.dtype == np.float32 and -1 <= a.array.min() and a.array.max() < 1
    assert ids.datatype == "INT64" and ids.array.dtype == np.int64 and 0 <= ids.array.min() and ids.array.max() < 100
    assert f.datatype == "INT32" and f.array.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_phase_can_send_only_some_classes():
    phases = [{"name": "both", "duration": 10, "arrival": {"type": "constant", "rate": 100}},
              {"name": "only-b", "duration": 10, "arrival": {"type": "constant", "rate": 100}, "classes": ["b"]}]
    plan = build_plan(scenario_from_dict(_scenario([{"name": "a", "weight": 9}, {"name": "b"}], phases)))
    first, second = plan.cls[plan.phase == 0], plan.cls[plan.phase == 1]
    assert (second == 1).all() and len(second) == 1000
    # 1,000 draws with P(b) = 0.1: 100 expected, standard deviation ≈ 9.5
    assert 60 < (first == 1).sum() < 140
    with pytest.raises(ScenarioError, match=r"phases\[1\].classes\[0\]: 'c' is not a workload class"):
        phases[1]["classes"] = ["c"]
        scenario_from_dict(_scenario([{"name": "a"}, {"name": "b"}], phases))


def _salted(salt) -> Payloads:
    data = _scenario([{"name": "chat", "prompt_tokens": 40, "session": {"turns": 2, "shared_prefix": {"tokens": 24, "variants": 3}}},
                      {"name": "plain", "prompt_tokens": {"dist": "uniform", "min": 5, "max": 60}}])
    return Payloads(scenario_from_dict({**data, "seed": 11, "prompt_salt": salt}))


def test_a_salt_changes_the_words_and_nothing_else():
    """Two runs with different salts send other text, of the same lengths, with the same sharing:
    equal shared prefixes stay equal within a run and different ones different; Mooncake block ids
    equal ↔ block text equal. The same salt (or `none`) sends the same text again; every word is
    still one of VOCABULARY (one token each)."""
    requests = [Request(i, 0, 1, False, prompt_tokens=5 + i % 50, item=i * 7919) for i in range(200)]
    block_ids = [[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2, 3]]  # prompts 0 and 3 equal, 0 and 1 share two blocks
    mooncake = [Request(0, 0, 1, False, prompt_tokens=3 * 16, blocks=(ids, 16)) for ids in block_ids]

    def texts(payloads: Payloads) -> tuple[list[str], list[str], list[list[str]]]:
        prompts = [payloads.get(r).prompt for r in requests]
        prefixes = [payloads.prefix(0, v) for v in (0, 1, 2, 0)]
        blocks = [payloads.get(r).prompt.split(" ") for r in mooncake]
        return prompts, prefixes, [[" ".join(w[k * 16:(k + 1) * 16]) for k in range(3)] for w in blocks]

    one, again, two, none, unsalted = (texts(_salted(s)) for s in (1, 1, 2, "none", "run"))
    assert one == again and none == unsalted  # a fixed salt repeats; `run` unresolved (no run drew one) is the seed's text
    for a, b in ((one, two), (one, none)):
        assert all(x != y for x, y in zip(a[0], b[0])) and a[1] != b[1] and a[2] != b[2]
        assert [len(p.split(" ")) for p in a[0]] == [len(p.split(" ")) for p in b[0]] == [r.prompt_tokens for r in requests]
        assert [len(p.split(" ")) for p in a[1]] == [len(p.split(" ")) for p in b[1]] == [24] * 4
    for prompts, prefixes, blocks in (one, two, none):
        assert set(" ".join(prompts + prefixes).split(" ")) <= set(VOCABULARY)
        assert prefixes[0] == prefixes[3] and len(set(prefixes[:3])) == 3  # one variant, one text
        flat = {(i, k): text for i, b in enumerate(blocks) for k, text in enumerate(b)}
        ids = {(i, k): block_ids[i][k] for i in range(4) for k in range(3)}
        assert all((flat[p] == flat[q]) == (ids[p] == ids[q]) for p in flat for q in flat)  # equal ids ↔ equal text


def test_each_run_draws_its_own_salt_and_says_which():
    base = scenario_from_dict(_scenario([{"name": "a", "prompt_tokens": 10}]))
    drawn = [with_run_salt(base) for _ in range(3)]
    assert len({d.prompt_salt for d in drawn}) == 3 and all(isinstance(d.prompt_salt, int) for d in drawn)
    assert [salt_record(d)["mode"] for d in drawn] == ["run"] * 3 and salt_record(drawn[0])["value"] == drawn[0].prompt_salt
    fixed = scenario_from_dict({**_scenario([{"name": "a", "prompt_tokens": 10}]), "prompt_salt": 42})
    assert with_run_salt(fixed) is fixed and salt_record(fixed) == {"mode": "fixed", "value": 42}
    none = scenario_from_dict({**_scenario([{"name": "a", "prompt_tokens": 10}]), "prompt_salt": "none"})
    assert salt_record(with_run_salt(none)) == {"mode": "none", "value": None}
    # the plan (times, lengths, items) is the seed's alone: a salt changes the words only
    plans = [build_plan(s) for s in (base, drawn[0], none)]
    for p in plans[1:]:
        assert np.array_equal(p.offsets_s, plans[0].offsets_s) and np.array_equal(p.prompt_tokens, plans[0].prompt_tokens)
        assert np.array_equal(p.item, plans[0].item)
