"""An agent trace (agent_trace.py's format) written from a scenario: the jobs its agent classes would
send, as its plan draws them (`latscope agent-trace`).

Each open-loop job of the plan is one line, in start order: `job` (its plan row: the X-Request-Id of its
round 1), `class`, `start_s` (its intended time on the run's clock), its `rounds` (new_tokens,
output_tokens, tool_s: the plan's turns) and, for a class that fans out, its `sub_agents` as a run would
draw them (sessions.sub_agents: the same seed, the same sub-agents). Replayed with
`arrival: {type: trace, format: agents}`, the file sends what the scenario would have, round for round;
edited, or written by a recorder of real agents in the same format, it sends what they did.
"""

from __future__ import annotations

import json
from pathlib import Path

from latscope.plan import Plan, build_plan, default_prompt
from latscope.scenario import Scenario
from latscope.sessions import Turns, sub_agents


def _rounds(turns: Turns, j: int) -> list[dict]:
    at = turns.of(j)
    return [{"new_tokens": int(p), "output_tokens": int(o), **({"tool_s": round(float(t), 6)} if k else {})}
            for k, (p, o, t) in enumerate(zip(turns.prompt_tokens[at], turns.output_tokens[at], turns.think_s[at]))]


def trace_lines(scenario: Scenario, plan: Plan | None = None) -> list[str]:
    """The trace's lines (JSON, no newline): every open-loop job of the scenario's agent classes."""
    plan = plan or build_plan(scenario)
    classes = scenario.workload.effective_classes()
    turns, lines = plan.turns, []
    if turns is None:
        return lines
    for row in range(len(plan)):
        j, c = int(plan.session[row]), int(plan.cls[row])
        if j < 0 or classes[c].agent is None:
            continue
        job: dict = {"job": row, "class": classes[c].name, "start_s": round(float(plan.offsets_s[row]), 6),
                     "rounds": _rounds(turns, j)}
        fan_out = classes[c].agent.fan_out
        if fan_out is not None and turns.job[j] < 0:
            subs = sub_agents(scenario, c, plan.session_seed, j, default_prompt(scenario, c))
            job["sub_agents"] = {"at_round": fan_out.at_round, "jobs": [{"rounds": _rounds(subs, i)} for i in range(len(subs))]}
        lines.append(json.dumps(job, separators=(",", ":")))
    return lines


def write_trace(scenario: Scenario, path: Path) -> int:
    """Write the scenario's agent trace to `path`; the number of jobs."""
    lines = trace_lines(scenario)
    path.write_text("".join(line + "\n" for line in lines))
    return len(lines)
