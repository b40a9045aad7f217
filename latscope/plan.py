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
from latscope.workload import draw_lengths, seed_streams

DEFAULT_PROMPT_TOKENS = 32  # an openai class that gives neither prompt_tokens nor a dataset
# A gap of at least this long in the schedule (a trace's lull) counts as idle, like an idle phase:
# long enough for a target that scales to zero to have done so on a short timeout.
IDLE_GAP_S = 5.0


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
    # What each request asks for (see workload.py): prompt and answer length in tokens (0: none),
    # and a random index picking its dataset row / tensor / synthetic-text offset.
    prompt_tokens: np.ndarray  # int32
    output_tokens: np.ndarray  # int32
    item: np.ndarray  # int64

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


def _phase_offsets(phase: Phase, scenario: Scenario, rng: np.random.Generator) -> tuple[np.ndarray, float, dict]:
    """Intended offsets within one phase, the phase's duration, and per-request lengths the phase's
    arrivals bring along ({"prompt_tokens"/"output_tokens": int32 array}, from a trace's columns)."""
    a = phase.arrival
    d = phase.duration
    match a.type:
        case "constant":
            return arrivals.constant(a.rate, d), d, {}
        case "poisson":
            return arrivals.poisson(a.rate, d, rng), d, {}
        case "burst":
            return arrivals.burst(a.base_rate, a.burst_rate, a.burst_length, a.period, d, a.spacing, rng), d, {}
        case "mmpp":
            return arrivals.mmpp(a.base_rate, a.burst_rate, a.mean_burst_length, a.mean_gap, d, rng), d, {}
        case "ramp":
            return arrivals.ramp(a.from_rate, a.to_rate, d, a.spacing, rng), d, {}
        case "steps":
            return arrivals.steps(a.rates, a.step, d, a.spacing, rng), d, {}
        case "spike":
            return arrivals.spike(a.base_rate, a.spike_rate, a.at, a.length, d, a.spacing, rng), d, {}
        case "idle":
            return np.empty(0, dtype=np.float64), d, {}
        case "trace":
            path = scenario.resolve_path(a.file)
            trace = arrivals.read_trace(path, a.time_column)
            offsets = arrivals.trace_offsets(trace, a.speedup, a.start, d)
            if d is None:  # the phase lasts as long as the (sped-up) trace
                d = float(offsets[-1]) + 1e-6 if len(offsets) else 0.0
            lengths = {}
            if (spec := a.lengths) is not None:
                rows = arrivals.trace_rows(trace, a.speedup, a.start, d)  # the rows behind `offsets`, in order
                for key, column, cap in (("prompt_tokens", spec.prompt_column, spec.max_prompt),
                                         ("output_tokens", spec.output_column, spec.max_output)):
                    if column is not None:
                        values = arrivals.trace_lengths(trace, column, path)[rows]
                        scaled = np.maximum(1, np.rint(values * spec.scale)) if spec.scale != 1 else values
                        lengths[key] = np.where(values > 0, np.minimum(scaled, cap or np.iinfo(np.int32).max), 0).astype(np.int32)
            return offsets, d, lengths
    raise AssertionError(f"unhandled arrival type {a.type}")


def build_plan(scenario: Scenario) -> Plan:
    """The whole run's schedule. Deterministic for a given scenario (seed included)."""
    seeds = seed_streams(scenario)
    chunks, phase_ids, phases, trace_lengths = [], [], [], []
    start = 0.0
    for i, phase in enumerate(scenario.phases):
        offsets, duration, lengths = _phase_offsets(phase, scenario, np.random.default_rng(seeds[i]))
        chunks.append(offsets + start)
        phase_ids.append(np.full(len(offsets), i, dtype=np.int16))
        phases.append(PhasePlan(phase.name, start, duration, phase.warmup))
        trace_lengths.append(lengths)
        start += duration
    offsets_s = np.concatenate(chunks) if chunks else np.empty(0)
    phase = np.concatenate(phase_ids) if phase_ids else np.empty(0, dtype=np.int16)
    n = len(offsets_s) if scenario.limits.max_requests is None else min(len(offsets_s), scenario.limits.max_requests)
    offsets_s, phase = offsets_s[:n], phase[:n]

    classes = scenario.workload.effective_classes()
    weights = np.array([c.weight for c in classes], dtype=float)
    class_rng = np.random.default_rng(seeds[len(scenario.phases)])
    cls = class_rng.choice(len(classes), size=n, p=weights / weights.sum()).astype(np.int16)
    names = [c.name for c in classes]
    for i, p in enumerate(scenario.phases):  # a phase limited to some classes draws among those only
        if p.classes is not None:
            allowed = np.array([names.index(name) for name in dict.fromkeys(p.classes)])
            mine = np.flatnonzero(phase == i)
            cls[mine] = class_rng.choice(allowed, size=len(mine), p=weights[allowed] / weights[allowed].sum())

    rng = np.random.default_rng(seeds[len(scenario.phases) + 1])
    prompt_tokens, output_tokens = np.zeros(n, np.int32), np.zeros(n, np.int32)
    for c, wc in enumerate(classes):
        mine = np.flatnonzero(cls == c)
        prompt = wc.prompt_tokens
        if prompt is None and wc.dataset is None and scenario.endpoint(c).protocol == "openai":
            prompt_tokens[mine] = DEFAULT_PROMPT_TOKENS
        elif prompt is not None:
            prompt_tokens[mine] = draw_lengths(prompt, len(mine), rng, scenario)
        if wc.output_tokens is not None:
            output_tokens[mine] = draw_lengths(wc.output_tokens, len(mine), rng, scenario)
    for target, key in ((prompt_tokens, "prompt_tokens"), (output_tokens, "output_tokens")):
        if any(key in lengths for lengths in trace_lengths):  # a trace's lengths win over the class's
            values = np.concatenate([lengths.get(key, np.zeros(len(ids), np.int32))
                                     for lengths, ids in zip(trace_lengths, phase_ids)])[:n]
            target[values > 0] = values[values > 0]
    item = rng.integers(0, 2**62, size=n, dtype=np.int64)
    return Plan(offsets_s, phase, cls, phases, names, prompt_tokens, output_tokens, item)


def after_idle(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The requests that come after a quiet stretch, and how long it was (seconds, from the
    previous request's intended time, or from the run's start): the first request after each idle
    phase, and after any gap of at least IDLE_GAP_S in the schedule. Each is measured on its own
    (engine probes): the first request after an idle stretch is the one that pays for a target
    that scaled to zero, and a histogram interval would blur it into the requests after it."""
    if not len(plan):
        return np.empty(0, np.int64), np.empty(0)
    gaps = np.diff(plan.offsets_s, prepend=0.0)
    idle_phases = {i for i, p in enumerate(plan.phases) if p.duration_s > 0 and not np.any(plan.phase == i)}
    after_idle_phase = np.zeros(len(plan), bool)
    first_of_phase = np.flatnonzero(np.diff(plan.phase.astype(np.int64), prepend=-1) != 0)
    for i in first_of_phase:
        previous = int(plan.phase[i - 1]) if i else -1
        after_idle_phase[i] = any(previous < p < int(plan.phase[i]) for p in idle_phases)
    chosen = np.flatnonzero(after_idle_phase | (gaps >= IDLE_GAP_S))
    return chosen, gaps[chosen]

