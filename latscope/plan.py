"""Scenario → Plan: every request of the run, decided before the first one is sent.

The plan is a set of parallel arrays (intended send time, phase, workload class), generated from
the scenario's seed, so the same scenario always offers the same load and the realized schedule
can be saved next to the results. Workers rebuild the same plan from the scenario and take every
N-th request, so the merged stream they send is exactly the planned process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latscope import arrivals
from latscope.agent_trace import phase_trace, turns_of
from latscope.mooncake import ReplayLimits
from latscope.scenario import PROTOCOLS, LengthDist, Phase, Scenario
from latscope.scenario.base import DataPath
from latscope.sessions import Turns, draw_sessions
from latscope.workload import (SESSION_STREAM, VOCABULARY, class_prompts, draw_lengths, plays_conversations,
                               read_conversations, seed_streams)

# A gap of at least this long in the schedule (a trace's lull) counts as idle, like an idle phase:
# long enough for a target that scales to zero to have done so on a short timeout.
IDLE_GAP_S = 5.0
# The most rate changes (burst cycles, MMPP state switches) one phase may have: each is a segment of
# the arrival engine's piecewise rate, a few float64s in several arrays.
MAX_SEGMENTS = 1_000_000
# The longest one phase may last, a trace phase's replay included (31 days): a typo such as `duration:
# 1e9s` on an idle phase, or a trace whose timestamps jump by years, is an error, not a run that never ends.
MAX_DURATION_S = 31 * 86400.0


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
    # Sessions (sessions.py): the row's session in `turns` (-1: a request on its own; a session row's
    # lengths and item above are its first turn's), and the closed-loop user a row starts (-1: none;
    # such a row is no request: its user draws sessions of its own while its phase lasts).
    session: np.ndarray | None = None  # int64 per row, None: no sessions
    turns: Turns | None = None
    user: np.ndarray | None = None  # int32 per row, None: no closed-loop phase
    session_seed: int = 0  # the entropy closed-loop users draw their sessions from (sessions.user_session)
    # A Mooncake trace's prompt blocks (mooncake.py): row i's block ids are hash_ids[hash_start[i]:hash_start[i + 1]],
    # each block block_tokens[i] tokens (0: the row's prompt is not built from blocks)
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (hash_ids, hash_start, block_tokens)

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

    @property
    def planned_requests(self) -> np.ndarray:
        """Requests each row plans (int64): 1, a session's turns, or 0 for a closed-loop user's row
        (what its user sends depends on the server's speed)."""
        weights = np.ones(len(self), np.int64)
        if self.session is not None and self.turns is not None:
            mine = self.session >= 0
            weights[mine] = self.turns.count[self.session[mine]]
        if self.user is not None:
            weights[self.user >= 0] = 0
        return weights

    @property
    def closed_loop(self) -> bool:
        return self.user is not None

    def worker_slice(self, index: int, workers: int) -> np.ndarray:
        """Indices of the requests worker `index` of `workers` sends (round robin keeps each worker's
        share spread evenly over time, and the union is the whole plan)."""
        return np.arange(index, len(self), workers)


def build_plan(scenario: Scenario) -> Plan:
    """The whole run's schedule. Deterministic for a given scenario (seed included).

    Raises ScenarioError, naming the scenario's file, line and field, when the plan would be too big
    (check_plan_size) or a file the scenario names (a trace, a lengths file) does not load."""
    check_plan_size(scenario)
    seeds = seed_streams(scenario)
    limits = replay_limits(scenario)
    chunks, phase_ids, phases, trace_lengths = [], [], [], []
    start = 0.0
    for i, phase in enumerate(scenario.phases):
        with scenario.about(("phases", i, "arrival", "file")):  # a trace file's problem: which line named it
            offsets, duration, lengths = arrivals.phase_offsets(phase.arrival, phase.duration,
                                                                np.random.default_rng(seeds[i]), scenario.resolve_path,
                                                                limits)
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
        if prompt is None and wc.dataset is None:  # the protocol's default prompt (openai), if it has one
            prompt_tokens[mine] = default_prompt(scenario, c)
        elif prompt is not None:
            prompt_tokens[mine] = _draw(scenario, ("workload", "classes", c, "prompt_tokens"), prompt, len(mine), rng)
        if wc.output_tokens is not None:
            output_tokens[mine] = _draw(scenario, ("workload", "classes", c, "output_tokens"), wc.output_tokens, len(mine), rng)
        for key in ("batch", "query_tokens"):  # drawn per request in the worker (protocols/batch.py): a file loads here
            if (dist := getattr(wc, key)) is not None and dist.dist == "empirical":
                _draw(scenario, ("workload", "classes", c, key), dist, 1, np.random.default_rng(0))
    for target, key in ((prompt_tokens, "prompt_tokens"), (output_tokens, "output_tokens")):
        if any(key in lengths for lengths in trace_lengths):  # a trace's lengths win over the class's
            values = np.concatenate([lengths.get(key, np.zeros(len(ids), np.int32))
                                     for lengths, ids in zip(trace_lengths, phase_ids)])[:n]
            target[values > 0] = values[values > 0]
    _check_prompts(scenario, prompt_tokens, cls, phase)
    item = rng.integers(0, 2**62, size=n, dtype=np.int64)
    blocks = _blocks(trace_lengths, phase_ids, n)
    _dataset_lengths(scenario, cls, item, prompt_tokens, blocks)
    users = _users(scenario, phase)
    replayed = _agent_jobs(scenario, trace_lengths, phase_ids, n)
    session, turns = _sessions(scenario, cls, users, seeds, prompt_tokens, output_tokens, item, replayed)
    return Plan(offsets_s, phase, cls, phases, names, prompt_tokens, output_tokens, item, session, turns, users,
                int(seeds[len(scenario.phases) + SESSION_STREAM].generate_state(1, np.uint64)[0]), blocks)


def _dataset_lengths(scenario: Scenario, cls: np.ndarray, item: np.ndarray, prompt_tokens: np.ndarray,
                     blocks: tuple | None) -> None:
    """A dataset class's rows get their prompt's token count (workload.tokenizer: workload.class_prompts),
    the row the worker sends being item % the prompts kept; a Mooncake row sends its blocks instead."""
    for c, wc in enumerate(scenario.workload.effective_classes()):
        if wc.dataset is None or scenario.workload.tokenizer is None:
            continue
        lengths = class_prompts(scenario, c).tokens
        rows = np.flatnonzero((cls == c) & (blocks[2] == 0 if blocks is not None else True))
        prompt_tokens[rows] = lengths[item[rows] % len(lengths)]


def replay_limits(scenario: Scenario) -> ReplayLimits:
    """What the scenario lets a trace phase ask for (its limits, MAX_DURATION_S, the prompts' vocabulary):
    arrivals.phase_offsets checks a trace against these as it reads it."""
    return ReplayLimits(scenario.limits.max_prompt_tokens, scenario.limits.max_planned_requests, MAX_DURATION_S,
                        len(VOCABULARY))


def _blocks(trace_lengths: list[dict[str, np.ndarray]], phase_ids: list[np.ndarray],
            n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The Mooncake phases' block ids of the plan's first `n` rows, as one CSR (other rows: none)."""
    if not any("hash_ids" in lengths for lengths in trace_lengths):
        return None
    ids, counts, block_tokens = [], [], []
    for lengths, rows in zip(trace_lengths, phase_ids):
        if "hash_ids" in lengths:
            ids.append(lengths["hash_ids"])
            counts.append(np.diff(lengths["hash_start"]))
            block_tokens.append(lengths["block_tokens"])
        else:
            counts.append(np.zeros(len(rows), np.int64))
            block_tokens.append(np.zeros(len(rows), np.int32))
    counts_n = np.concatenate(counts)[:n]
    start = np.concatenate(([0], np.cumsum(counts_n))).astype(np.int64)
    return np.concatenate(ids)[: start[-1]], start, np.concatenate(block_tokens)[:n]


def _users(scenario: Scenario, phase: np.ndarray) -> np.ndarray | None:
    """Each row's closed-loop user (numbered across the run), -1 for an arrival; None without users phases."""
    closed = np.array([p.arrival.type == "users" for p in scenario.phases], bool)
    if not closed.any():
        return None
    rows = closed[phase]
    users = np.full(len(phase), -1, np.int32)
    users[rows] = np.arange(int(rows.sum()), dtype=np.int32)
    return users


def _agent_jobs(scenario: Scenario, trace_lengths: list[dict[str, np.ndarray]], phase_ids: list[np.ndarray],
                n: int) -> list | None:
    """Each of the first `n` rows' agent trace job (agent_trace.TraceJob) and its place in the trace, for the
    rows of an agent trace phase (None elsewhere); None when no phase replays one."""
    if not any("agent_job" in lengths for lengths in trace_lengths):
        return None
    jobs: list = []
    for i, (lengths, ids) in enumerate(zip(trace_lengths, phase_ids)):
        if "agent_job" in lengths:
            trace = phase_trace(scenario, i)
            jobs += [(trace.jobs[j], int(j)) for j in lengths["agent_job"]]
        else:
            jobs += [None] * len(ids)
    return jobs[:n]


def _sessions(scenario: Scenario, cls: np.ndarray, users: np.ndarray | None, seeds: list, prompt_tokens: np.ndarray,
              output_tokens: np.ndarray, item: np.ndarray, replayed: list | None) -> tuple[np.ndarray | None, Turns | None]:
    """The open-loop session rows' sessions (class by class), their first turns written into the rows; an
    agent trace phase's rows replay their jobs (`replayed`: each row's, None where a row draws its own)."""
    classes = scenario.workload.effective_classes()
    if not any(c.conversation for c in classes):
        return None, None
    rng = np.random.default_rng(seeds[len(scenario.phases) + SESSION_STREAM].spawn(1)[0])
    session = np.full(len(cls), -1, np.int64)
    parts: list[Turns] = []
    count = 0
    for c, wc in enumerate(classes):
        if wc.conversation is None:
            continue
        mine = np.flatnonzero((cls == c) & (users < 0 if users is not None else True))
        replay = np.array([replayed[r] is not None for r in mine], bool) if replayed is not None else np.zeros(len(mine), bool)
        for rows, replays in ((mine[~replay], False), (mine[replay], True)):
            if not replays:
                drawn = draw_sessions(scenario, c, len(rows), rng, default_prompt(scenario, c), human_turns(scenario, c))
            elif len(rows):  # its trace's jobs (their places in the trace, for their sub-agents: chat.py)
                jobs = [replayed[r] for r in rows]
                drawn = turns_of([job for job, _ in jobs], int(rng.integers(0, 2**40)), np.array([j for _, j in jobs]))
            else:
                continue
            session[rows] = count + np.arange(len(rows))
            first = drawn.first
            prompt_tokens[rows], output_tokens[rows], item[rows] = (drawn.prompt_tokens[first], drawn.output_tokens[first],
                                                                    drawn.item[first])
            parts.append(drawn)
            count += len(rows)
    starts = np.cumsum([0] + [len(p.prompt_tokens) for p in parts[:-1]])
    turns = Turns(np.concatenate([p.first + s for p, s in zip(parts, starts)]),
                  *(np.concatenate([getattr(p, f) for p in parts])
                    for f in ("count", "prefix", "prompt_tokens", "output_tokens", "think_s", "item", "job")))
    return session, turns


def default_prompt(scenario: Scenario, c: int) -> int:
    """The prompt length of a class that gives none and has no dataset: its protocol's default (openai)."""
    return PROTOCOLS[scenario.endpoint(c).protocol].default_prompt_tokens


def human_turns(scenario: Scenario, c: int) -> list[int] | None:
    """How many human turns each of a class's ShareGPT conversations has, when its sessions play them."""
    wc = scenario.workload.effective_classes()[c]
    if not plays_conversations(wc):
        return None
    with scenario.about(("workload", "classes", c, "dataset", "file")):
        return [len(t) for t in read_conversations(scenario.resolve_path(wc.dataset.file))]


def _draw(scenario: Scenario, path: DataPath, dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """draw_lengths, a lengths file's problem named by the scenario field that points to it."""
    with scenario.about((*path, "file")):
        return draw_lengths(dist, n, rng, scenario)


def check_plan_size(scenario: Scenario) -> None:
    """Refuse a plan too big to build, before building any of it: the phases' expected number of
    requests (arrivals.expected_arrivals, closed forms) against limits.max_planned_requests, a
    burst or MMPP phase's rate changes against MAX_SEGMENTS, and each phase's duration against
    MAX_DURATION_S. A trace phase counts as nothing here: it is as big as its file, which the plan
    reads once (and checks then: arrivals.phase_offsets' `limits`)."""
    counts = []
    for i, phase in enumerate(scenario.phases):
        a, d = phase.arrival, phase.duration
        changes = {"burst": lambda: math.ceil(d / a.period), "mmpp": lambda: 2 * d / (a.mean_gap + a.mean_burst_length)}
        if a.type in changes and (segments := changes[a.type]()) > MAX_SEGMENTS:
            field_name = "period" if a.type == "burst" else "mean_gap"
            raise scenario.problem(("phases", i, "arrival", field_name), f"over its {d:g} s this phase would change rate "
                                   f"~{segments:.3g} times; the most is {MAX_SEGMENTS:,} (a longer {field_name} or a shorter duration)")
        counts.append(0.0 if a.type == "trace" else arrivals.expected_arrivals(a, d, scenario.resolve_path))
    limit = scenario.limits.max_planned_requests
    if sum(counts) > limit:
        i = max(range(len(counts)), key=counts.__getitem__)
        phase = scenario.phases[i]
        raise scenario.problem(_too_many_because(phase, i, limit),
                               f"this scenario would plan ~{sum(counts):.3g} requests (phase {phase.name!r}: ~{counts[i]:.3g} "
                               f"in {phase.duration:g} s); the limit is {limit:,} (limits.max_planned_requests)")
    for i, phase in enumerate(scenario.phases):
        if phase.duration is not None and phase.duration > MAX_DURATION_S:
            raise scenario.problem(("phases", i, "duration"), f"{phase.duration:g} s; a phase lasts at most "
                                   f"{MAX_DURATION_S:,.0f} s ({MAX_DURATION_S / 86400:g} days)")


def _too_many_because(phase: Phase, i: int, limit: int) -> DataPath:
    """The field to blame for a phase that plans too many requests: its peak rate, unless that rate
    would fit the limit for an hour (then it is the duration that is off)."""
    a = phase.arrival
    rates = {(name,): getattr(a, name) for name in _RATE_FIELDS if hasattr(a, name)}
    if a.type == "steps":
        rates = {("rates", j): r for j, r in enumerate(a.rates)}
    field_path, peak = max(rates.items(), key=lambda item: item[1])
    return ("phases", i, "duration") if peak * 3600 <= limit else ("phases", i, "arrival", *field_path)


_RATE_FIELDS = ("rate", "burst_rate", "spike_rate", "to_rate", "from_rate", "base_rate")


def _check_prompts(scenario: Scenario, prompt_tokens: np.ndarray, cls: np.ndarray, phase: np.ndarray) -> None:
    """Each prompt within limits.max_prompt_tokens: a worker builds every synthetic prompt whole
    (prompt_tokens: 1e9 would be a 5 GB string per request). Blames the class or the trace phase
    the longest prompt came from."""
    limit = scenario.limits.max_prompt_tokens
    if not len(prompt_tokens) or (longest := int(prompt_tokens.max())) <= limit:
        return
    at = int(prompt_tokens.argmax())
    arrival = scenario.phases[int(phase[at])].arrival
    if arrival.type == "trace" and arrival.lengths is not None and arrival.lengths.prompt_column is not None:
        path: DataPath = ("phases", int(phase[at]), "arrival", "lengths", "prompt_column")
        hint = " (lengths.max_prompt caps them)"
    else:
        path, hint = ("workload", "classes", int(cls[at]), "prompt_tokens"), ""
    raise scenario.problem(path, f"prompts of up to {longest:,} tokens; the limit is {limit:,} (limits.max_prompt_tokens){hint}")


def schedule_table(plan: Plan) -> dict[str, np.ndarray]:
    """schedule.parquet's columns (results.schema.SCHEDULE_COLUMNS): the plan's rows, then its
    sessions' later turns (intended_s NaN: due think_s after the answer before), so that row i is the
    request whose seq is i (chat.py numbers them so). A session's row is its turn 1; a closed-loop
    user's row has turn −1 (it is no request)."""
    n = len(plan)
    session = plan.session if plan.session is not None else np.full(n, -1, np.int64)
    turn = np.where(session >= 0, 1, 0).astype(np.int16)
    if plan.user is not None:
        turn[plan.user >= 0] = -1
    think = np.zeros(n)
    columns = {"intended_s": plan.offsets_s, "phase": plan.phase, "cls": plan.cls, "prompt_tokens": plan.prompt_tokens,
               "output_tokens": plan.output_tokens, "session": session, "turn": turn, "think_s": think}
    if plan.turns is not None and len(plan.turns):
        t = plan.turns
        later = np.ones(len(t.prompt_tokens), bool)
        later[t.first] = False  # turn 1 of each session is its row
        owner = np.repeat(np.arange(len(t)), t.count)  # each turn's session
        row_of = np.empty(len(t), np.int64)
        row_of[session[session >= 0]] = np.flatnonzero(session >= 0)
        rows = row_of[owner[later]]
        index = np.arange(len(t.prompt_tokens)) - t.first[owner] + 1  # each turn's number
        extra = {"intended_s": np.full(int(later.sum()), np.nan), "phase": plan.phase[rows], "cls": plan.cls[rows],
                 "prompt_tokens": t.prompt_tokens[later], "output_tokens": t.output_tokens[later], "session": owner[later],
                 "turn": index[later].astype(np.int16), "think_s": t.think_s[later]}
        columns = {k: np.concatenate([v, extra[k]]) for k, v in columns.items()}
    names = {"phase": np.array([p.name for p in plan.phases]), "cls": np.array(plan.class_names)}
    return {"intended_s": columns["intended_s"],
            "phase": names["phase"][columns["phase"]] if len(columns["phase"]) else np.array([], str),
            "class": names["cls"][columns["cls"]] if len(columns["cls"]) else np.array([], str),
            **{k: columns[k] for k in ("prompt_tokens", "output_tokens", "session", "turn", "think_s")}}


def after_idle(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The requests that come after a quiet stretch, and how long it was (seconds, from the end of
    what the plan knows was still going on before it, or from the run's start): the first request
    after each idle phase, and after any quiet gap of at least IDLE_GAP_S in the schedule. Each is
    measured on its own (engine probes): the first request after an idle stretch is the one that
    pays for a target that scaled to zero, and a histogram interval would blur it into the requests
    after it. A session keeps the target busy between its rows (its later turns, at least its think
    times long: `busy_until`), and a closed-loop user until its phase ends, so the gap between two
    rows of such a run is no idle stretch unless nothing before it was still going on."""
    if not len(plan):
        return np.empty(0, np.int64), np.empty(0)
    busy = np.maximum.accumulate(busy_until(plan))
    gaps = plan.offsets_s - np.concatenate(([0.0], busy[:-1]))
    idle_phases = {i for i, p in enumerate(plan.phases) if p.duration_s > 0 and not np.any(plan.phase == i)}
    after_idle_phase = np.zeros(len(plan), bool)
    first_of_phase = np.flatnonzero(np.diff(plan.phase.astype(np.int64), prepend=-1) != 0)
    for i in first_of_phase:
        previous = int(plan.phase[i - 1]) if i else -1
        after_idle_phase[i] = gaps[i] > 0 and any(previous < p < int(plan.phase[i]) for p in idle_phases)
    chosen = np.flatnonzero(after_idle_phase | (gaps >= IDLE_GAP_S))
    return chosen, gaps[chosen]


def busy_until(plan: Plan) -> np.ndarray:
    """Per row, the earliest time (run clock, s) the plan knows the target is still busy with it: its
    intended time; for a session, that plus its turns' think times (each later turn waits for an
    answer, then thinks); for a closed-loop user, the end of its phase."""
    until = plan.offsets_s.astype(np.float64, copy=True)
    if plan.session is not None and plan.turns is not None and len(plan.turns):
        mine = plan.session >= 0
        t = plan.turns
        total = np.concatenate(([0.0], np.cumsum(t.think_s)))
        think = total[t.first + t.count.astype(np.int64)] - total[t.first]  # each session's think times
        until[mine] += think[plan.session[mine]]
    if plan.user is not None:
        users = plan.user >= 0
        ends = np.array([p.start_s + p.duration_s for p in plan.phases])
        until[users] = np.maximum(until[users], ends[plan.phase[users]])
    return until


def action_times(scenario: Scenario, plan: Plan | None = None) -> list[float]:
    """Each action's planned time in seconds on the run clock (0 = the first intended send), in the
    order of `scenario.actions`: `at`, or its phase's planned start plus `after`. `plan` saves building
    the plan again (a trace phase's length is only known from it)."""
    if not scenario.actions:
        return []
    starts = {p.name: p.start_s for p in (plan or build_plan(scenario)).phases}
    return [a.at if a.at is not None else starts[a.when.phase] + a.when.after for a in scenario.actions]
