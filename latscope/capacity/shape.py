"""A scenario's traffic shape, scaled by one factor: what `latscope capacity` runs at each step.

The measured (non-warm-up) phases give the shape — Poisson, bursts, a ramp, a trace — with their
relative rates; every rate of every phase is multiplied by the same factor f, so the shape stays
and only its height changes. The warm-up phases are scaled too, so that each step's measured phases
start from the state the step's own load leaves the target in (a queue warmed at a tenth of the
load would flatter the first seconds of the measurement). A trace is scaled by its `speedup`.

The step's rate is the measured phases' expected arrivals over their duration
(arrivals.expected_arrivals: what the rates promise, not one seeded draw), so a step at 200 req/s
offers exactly twice a step at 100 req/s.
"""

from __future__ import annotations

import numpy as np

from latscope.arrivals import expected_arrivals, phase_offsets
from latscope.plan import replay_limits
from latscope.scenario import Scenario

# The fields of each arrival model that are rates (per second): what a factor multiplies.
RATE_FIELDS = {
    "constant": ("rate",), "poisson": ("rate",), "burst": ("base_rate", "burst_rate"),
    "mmpp": ("base_rate", "burst_rate"), "ramp": ("from_rate", "to_rate"), "steps": ("rates",),
    "spike": ("base_rate", "spike_rate"), "idle": (), "trace": ("speedup",),
    "users": (),  # closed loop has no rate: `latscope capacity` refuses it
}


def _durations(scenario: Scenario) -> list[float]:
    """Each phase's duration in seconds (a trace phase without one: as long as its trace)."""
    out = []
    for i, p in enumerate(scenario.phases):
        if p.duration is not None:
            out.append(p.duration)
        else:
            with scenario.about(("phases", i, "arrival", "file")):  # a trace's problem names the line that named it
                out.append(phase_offsets(p.arrival, None, np.random.default_rng(0), scenario.resolve_path,
                                         replay_limits(scenario))[1])
    return out


def measured_seconds(scenario: Scenario) -> float:
    """How long the measured (non-warm-up) phases last together."""
    return sum(d for p, d in zip(scenario.phases, _durations(scenario)) if not p.warmup)


def measured_rate(scenario: Scenario) -> float:
    """The measured phases' expected requests per second (their expected arrivals / their duration)."""
    durations = _durations(scenario)
    total = sum(d for p, d in zip(scenario.phases, durations) if not p.warmup)
    limits = replay_limits(scenario)
    count = sum(expected_arrivals(p.arrival, d, scenario.resolve_path, limits)
                for p, d in zip(scenario.phases, durations) if not p.warmup)
    return count / total if total else 0.0


def scaled(scenario: Scenario, factor: float, measured_s: float | None = None) -> Scenario:
    """A copy of `scenario` with every rate times `factor`, and, given `measured_s`, the measured
    phases' durations stretched together to last that long (their proportions kept). Everything
    else — seed, classes, SLOs, the `${VAR}` record that keeps secrets out of results — is kept."""
    copy = scenario.model_copy(deep=True)
    durations = _durations(scenario)  # a trace phase's reads its file: once
    measured = sum(d for p, d in zip(scenario.phases, durations) if not p.warmup)
    stretch = measured_s / measured if measured_s else 1.0
    for phase, duration in zip(copy.phases, durations):
        a = phase.arrival
        for name in RATE_FIELDS[a.type]:
            value = getattr(a, name)
            setattr(a, name, [r * factor for r in value] if isinstance(value, list) else value * factor)
        if not phase.warmup and stretch != 1.0:
            phase.duration = duration * stretch
    return copy
