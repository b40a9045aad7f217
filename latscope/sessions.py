"""Sessions: what each conversation of a run will send, turn by turn, decided from the seed.

A workload class with a `session` (scenario/workload.py) sends conversations. Each session is
drawn whole, up front, like every other request of the plan:

    turns        T ~ session.turns (1 without; a ShareGPT conversation: its human turns, at most T)
    per turn k   prompt_tokens_k ~ class.prompt_tokens, output_tokens_k ~ class.output_tokens,
                 item_k (which synthetic text / which conversation), think_k ~ session.think_time
                 (think_1 = 0: the first turn is sent at the session's arrival)
    per session  prefix ∈ {0 … variants − 1} (the shared system prompt it opens with; −1: none)

An agent class's jobs are drawn the same way (WorkloadClass.conversation: rounds are turns, tool
latencies think times), except that rounds 2…T's new text is the tool result: prompt_tokens_k ~
agent.tool_result_tokens when given. A job's sub-agents (agent.fan_out) are drawn when it fans out,
from a stream of the job's own (`sub_agents`).

Only *when* turns 2…T go is left to the run: turn k + 1 is intended at the end of turn k's answer
plus think_{k+1} (its latency counts from then), which is what a person at a chat window does. An open-loop
phase's arrivals are session starts; a closed-loop phase (`arrival: {type: users}`) has one plan row
per user, and each user draws session after session (class, then turns) from its own seeded stream,
`user_session`, so the same seed gives the same sessions whichever worker runs the user.

Nothing here knows about the wire or the clock: plan.py calls `draw_sessions`, the worker's
conversation bookkeeping (chat.py) calls `user_session`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latscope.scenario import Scenario
from latscope.scenario.workload import MAX_FAN_OUT, MAX_TURNS, ThinkDist, WorkloadClass
from latscope.workload import draw_lengths


@dataclass(frozen=True)
class Turns:
    """Planned turns, flattened: session j's are [first[j], first[j] + count[j])."""

    first: np.ndarray  # int64 per session
    count: np.ndarray  # int16 per session
    prefix: np.ndarray  # int32 per session: its shared-prefix variant, -1: none
    prompt_tokens: np.ndarray  # int32 per turn: the new text's length
    output_tokens: np.ndarray  # int32 per turn (0: not set)
    think_s: np.ndarray  # float64 per turn: the pause before it (0 for a first turn)
    item: np.ndarray  # int64 per turn: which synthetic text or conversation it takes
    job: np.ndarray  # int64 per session: the agent trace job it replays (agent_trace.py; -1: drawn)

    def __len__(self) -> int:
        return len(self.first)

    def of(self, j: int) -> slice:
        start = int(self.first[j])
        return slice(start, start + int(self.count[j]))


def draw_think(dist: ThinkDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` think times in seconds (float64, ≥ 0)."""
    match dist.dist:
        case "fixed":
            return np.full(n, dist.value)
        case "uniform":
            return rng.uniform(dist.min, dist.max, size=n)
        case "exponential":
            return rng.exponential(dist.mean, size=n)
        case "lognormal":  # as for lengths: sigma² = ln(1 + std²/mean²), mu = ln(mean) − sigma²/2
            sigma2 = np.log1p((dist.std / dist.mean) ** 2)
            return rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
    raise AssertionError(f"unhandled think-time distribution {dist.dist}")


def draw_sessions(scenario: Scenario, c: int, n: int, rng: np.random.Generator, default_prompt: int,
                  human_turns: list[int] | None, wc: WorkloadClass | None = None) -> Turns:
    """`n` sessions of class `c` (or of `wc`, a class drawn in its place: a sub-agent). `default_prompt`:
    the prompt length when the class gives none (the protocol's default); `human_turns`: each ShareGPT
    conversation's number of human turns, when the class plays a dataset's conversations."""
    wc = wc or scenario.workload.effective_classes()[c]
    session = wc.conversation
    where = ("workload", "classes", c)
    item0 = rng.integers(0, 2**62, size=n, dtype=np.int64)  # a session's first item (its conversation)
    if session is not None and session.turns is not None:
        with scenario.about((*where, "session", "turns", "file")):
            count = np.minimum(draw_lengths(session.turns, n, rng, scenario), MAX_TURNS)
    else:
        count = np.full(n, MAX_TURNS if human_turns is not None and session is not None else 1, np.int32)
    if human_turns is not None:  # a conversation has as many turns as it has human turns, at most
        count = np.minimum(count, np.asarray(human_turns, np.int32)[item0 % len(human_turns)])
    count = count.astype(np.int16)
    first = np.concatenate(([0], np.cumsum(count[:-1], dtype=np.int64))) if n else np.empty(0, np.int64)
    total = int(count.sum())
    lengths = []
    for field in ("prompt_tokens", "output_tokens"):
        dist = getattr(wc, field)
        if dist is None:
            lengths.append(np.full(total, default_prompt if field == "prompt_tokens" and wc.dataset is None else 0,
                                   np.int32))
        else:
            with scenario.about((*where, field, "file")):
                lengths.append(draw_lengths(dist, total, rng, scenario))
    if wc.agent is not None and wc.agent.tool_result_tokens is not None:  # rounds 2… carry a tool result
        later = np.ones(total, bool)
        later[first] = False
        with scenario.about((*where, "agent", "tool_result_tokens", "file")):
            lengths[0][later] = draw_lengths(wc.agent.tool_result_tokens, int(later.sum()), rng, scenario)
    think = draw_think(session.think_time, total, rng) if session is not None else np.zeros(total)
    think[first] = 0.0
    item = rng.integers(0, 2**62, size=total, dtype=np.int64)
    if human_turns is not None:  # turn k of a session plays its conversation's k-th human turn
        item = np.repeat(item0, count)
    shared = session.shared_prefix if session is not None else None
    prefix = rng.integers(0, shared.variants, size=n).astype(np.int32) if shared else np.full(n, -1, np.int32)
    return Turns(first, count, prefix, lengths[0], lengths[1], think, item, np.full(n, -1, np.int64))


def sub_agents(scenario: Scenario, c: int, entropy: int, job: int, default_prompt: int) -> Turns:
    """Job `job`'s sub-agents at its fan-out (agent.fan_out of class `c`): how many, and each one's
    rounds, lengths and tool waits, from a stream of the job's own (`entropy`: the run's session seed),
    so the same seed gives the same sub-agents whichever worker runs the job."""
    wc = scenario.workload.effective_classes()[c]
    fan_out = wc.agent.fan_out
    rng = np.random.default_rng([entropy, 1 << 40, job])  # no user's stream: those are [entropy, user, k]
    where = ("workload", "classes", c, "agent", "fan_out")
    with scenario.about((*where, "agents", "file")):
        k = min(int(draw_lengths(fan_out.agents, 1, rng, scenario)[0]), MAX_FAN_OUT)
    sub = wc.model_copy(update={"agent": wc.agent.sub_agent(), "prompt_tokens": fan_out.prompt_tokens or wc.prompt_tokens})
    with scenario.about(where):
        return draw_sessions(scenario, c, k, rng, default_prompt, None, sub)


def user_session(scenario: Scenario, entropy: int, user: int, k: int, classes: np.ndarray, weights: np.ndarray,
                 default_prompt: list[int], human_turns: list[list[int] | None]) -> tuple[int, Turns]:
    """A closed-loop user's `k`-th session (from 0): its class (among `classes`, by `weights`) and
    turns, from a stream of its own (`entropy`: the run's session seed, then user and k)."""
    rng = np.random.default_rng([entropy, user, k])
    c = int(classes[rng.choice(len(classes), p=weights)])
    return c, draw_sessions(scenario, c, 1, rng, default_prompt[c], human_turns[c])
