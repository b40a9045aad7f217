"""Scenario → Plan: every request of the run, decided before the first one is sent.

The plan is a set of parallel arrays (intended send time, phase, workload class), generated from
the scenario's seed, so the same scenario always offers the same load and the realized schedule
can be saved next to the results. Workers rebuild the same plan from the scenario and take every
N-th request, so the merged stream they send is exactly the planned process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latscope import arrivals
from latscope.scenario import Phase, Scenario


@dataclass(frozen=True)
class PhasePlan:
    name: str
    start_s: float
    duration_s: float
    warmup: bool


@dataclass(frozen=True)
class Plan:
    offsets_s: np.ndarray  # float64, seconds from run start, non-decreasing
    phase: np.ndarray  # int16 phase index per request
    cls: np.ndarray  # int16 workload class index per request
    phases: list[PhasePlan]
    class_names: list[str]

    @property
    def duration_s(self) -> float:
        last = self.phases[-1]
        return last.start_s + last.duration_s

    @property
    def warmup(self) -> np.ndarray:
        """Bool per request: does it belong to a warm-up phase?"""
        flags = np.array([p.warmup for p in self.phases], dtype=bool)
        return flags[self.phase]

    def __len__(self) -> int:
        return len(self.offsets_s)

    def worker_slice(self, index: int, workers: int) -> np.ndarray:
        """Indices of the requests worker `index` of `workers` sends (round robin keeps each worker's
        share spread evenly over time, and the union is the whole plan)."""
        return np.arange(index, len(self), workers)


def _phase_offsets(phase: Phase, scenario: Scenario, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Intended offsets within one phase and the phase's duration."""
    a = phase.arrival
    d = phase.duration
    match a.type:
        case "constant":
            return arrivals.constant(a.rate, d), d
        case "poisson":
            return arrivals.poisson(a.rate, d, rng), d
        case "burst":
            return arrivals.burst(a.base_rate, a.burst_rate, a.burst_length, a.period, d, a.spacing, rng), d
        case "mmpp":
            return arrivals.mmpp(a.base_rate, a.burst_rate, a.mean_burst_length, a.mean_gap, d, rng), d
        case "ramp":
            return arrivals.ramp(a.from_rate, a.to_rate, d, a.spacing, rng), d
        case "steps":
            return arrivals.steps(a.rates, a.step, d, a.spacing, rng), d
        case "spike":
            return arrivals.spike(a.base_rate, a.spike_rate, a.at, a.length, d, a.spacing, rng), d
        case "trace":
            trace = arrivals.read_trace(scenario.resolve_path(a.file), a.time_column)
            offsets = arrivals.trace_offsets(trace, a.speedup, a.start, d)
            if d is None:  # the phase lasts as long as the (sped-up) trace
                d = float(offsets[-1]) + 1e-6 if len(offsets) else 0.0
            return offsets, d
    raise AssertionError(f"unhandled arrival type {a.type}")


def build_plan(scenario: Scenario) -> Plan:
    """The whole run's schedule. Deterministic for a given scenario (seed included)."""
    seeds = np.random.SeedSequence(scenario.seed).spawn(len(scenario.phases) + 1)
    chunks, phase_ids, phases = [], [], []
    start = 0.0
    for i, phase in enumerate(scenario.phases):
        offsets, duration = _phase_offsets(phase, scenario, np.random.default_rng(seeds[i]))
        chunks.append(offsets + start)
        phase_ids.append(np.full(len(offsets), i, dtype=np.int16))
        phases.append(PhasePlan(phase.name, start, duration, phase.warmup))
        start += duration
    offsets_s = np.concatenate(chunks) if chunks else np.empty(0)
    phase = np.concatenate(phase_ids) if phase_ids else np.empty(0, dtype=np.int16)
    if scenario.limits.max_requests is not None:
        offsets_s, phase = offsets_s[: scenario.limits.max_requests], phase[: scenario.limits.max_requests]

    classes = scenario.workload.effective_classes()
    weights = np.array([c.weight for c in classes], dtype=float)
    class_rng = np.random.default_rng(seeds[-1])
    cls = class_rng.choice(len(classes), size=len(offsets_s), p=weights / weights.sum()).astype(np.int16)
    return Plan(offsets_s, phase, cls, phases, [c.name for c in classes])
