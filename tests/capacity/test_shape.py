"""Scaling a scenario's traffic by one factor: every rate scales, the shape and the rest stay, and
the step's rate is the expected arrivals of the measured phases over their duration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latscope.arrivals import expected_arrivals, phase_offsets
from latscope.capacity.shape import measured_rate, measured_seconds, scaled
from latscope.plan import build_plan
from latscope.scenario import scenario_from_dict

from conftest import DATA, scenario_dict

ARRIVALS = [
    {"type": "constant", "rate": 40},
    {"type": "poisson", "rate": 40},
    {"type": "burst", "base_rate": 10, "burst_rate": 100, "burst_length": 2, "period": 7},
    {"type": "mmpp", "base_rate": 10, "burst_rate": 100, "mean_burst_length": 1, "mean_gap": 3},
    {"type": "ramp", "from_rate": 10, "to_rate": 70},
    {"type": "steps", "rates": [10, 30, 50], "step": 4},
    {"type": "spike", "base_rate": 10, "spike_rate": 90, "at": 3, "length": 2},
]


def scenario(arrival: dict, tmp_path, duration: float = 20):
    phases = [{"name": "warm", "duration": 2, "warmup": True, "arrival": {"type": "constant", "rate": 5}},
              {"name": "m", "duration": duration, "arrival": arrival}]
    return scenario_from_dict(scenario_dict("http://127.0.0.1:9", tmp_path, phases))


@pytest.mark.parametrize("arrival", ARRIVALS, ids=[a["type"] for a in ARRIVALS])
def test_expected_arrivals_match_what_the_plans_send(arrival, tmp_path):
    # Over 200 seeds of a 20 s phase the mean realized count must sit within 4 standard errors of Λ:
    # a Poisson count has variance Λ (an MMPP's is larger: its spread is measured, not assumed).
    s = scenario(arrival, tmp_path)
    phase = s.phases[1]
    expected = expected_arrivals(phase.arrival, phase.duration, s.resolve_path)
    counts = np.array([len(phase_offsets(phase.arrival, phase.duration, np.random.default_rng(seed), s.resolve_path)[0])
                       for seed in range(200)])
    if arrival.get("spacing", "poisson") == "even" or arrival["type"] == "constant":
        assert abs(counts[0] - expected) <= 1
    else:
        assert abs(counts.mean() - expected) <= 4 * counts.std(ddof=1) / math.sqrt(len(counts)), (counts.mean(), expected)


def test_the_trace_rate_is_its_count(tmp_path):
    arrival = {"type": "trace", "file": str(DATA / "azure_llm_conv_trace.csv"), "speedup": 2.0}
    s = scenario(arrival, tmp_path, duration=30)
    n = len(phase_offsets(s.phases[1].arrival, 30, np.random.default_rng(0), s.resolve_path)[0])
    assert measured_rate(s) == pytest.approx(n / 30)


@pytest.mark.parametrize("arrival", ARRIVALS, ids=[a["type"] for a in ARRIVALS])
def test_scaling_multiplies_every_rate_and_keeps_the_rest(arrival, tmp_path):
    s = scenario(arrival, tmp_path)
    big = scaled(s, 2.5)
    assert measured_rate(big) == pytest.approx(2.5 * measured_rate(s))
    assert big.phases[0].arrival.rate == 12.5  # warm-up scales with the step
    assert s.phases[1].arrival == scenario(arrival, tmp_path).phases[1].arrival  # the original is untouched
    assert (big.seed, big.slos, big.target) == (s.seed, s.slos, s.target)
    for key in ("period", "burst_length", "step", "at", "length", "mean_gap", "mean_burst_length"):
        if key in arrival:  # time fields keep the shape's timing
            assert getattr(big.phases[1].arrival, key) == getattr(s.phases[1].arrival, key)


def test_step_duration_stretches_the_measured_phases_only(tmp_path):
    s = scenario({"type": "poisson", "rate": 40}, tmp_path)
    short = scaled(s, 1.0, measured_s=5)
    assert measured_seconds(short) == pytest.approx(5) and short.phases[0].duration == 2
    plan = build_plan(short)
    assert plan.duration_s == pytest.approx(7)


def test_scaling_keeps_the_loaders_record_of_secrets(tmp_path, monkeypatch):
    from latscope.scenario import load_scenario, redacted_yaml

    monkeypatch.setenv("TOKEN", "s3cret-value")
    f = tmp_path / "s.yaml"
    f.write_text("name: t\ntarget: {url: 'http://127.0.0.1:9', headers: {Authorization: 'Bearer ${TOKEN}'}}\n"
                 "phases: [{name: p, duration: 2, arrival: {type: poisson, rate: 10}}]\n")
    big = scaled(load_scenario(f), 3.0)
    text = redacted_yaml(big)
    assert "s3cret-value" not in text and "rate: 30.0" in text
