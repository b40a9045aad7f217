"""Agent traces: recorded agent jobs, one JSON object a line, replayed by a phase's
`arrival: {type: trace, format: agents, file: ...}` and written from a scenario's agent class
(`latscope agent-trace`, `write_trace`). docs/agents.md shows the format:

    {"job": "a1", "start_s": 12.5, "block_tokens": 512,
     "rounds": [{"new_tokens": 812, "output_tokens": 64, "blocks": [7, 8]},
                {"new_tokens": 300, "output_tokens": 40, "tool_s": 1.2}, ...],
     "sub_agents": {"at_round": 1, "jobs": [{"rounds": [...]}, ...]}}

- `start_s` (≥ 0): when the job started, seconds from the trace's start; lines may come in any order.
- `rounds` (1…64, in order): `new_tokens`, what the round adds to the context (round 1: the task; later:
  the tool result); `output_tokens`, the answer's length (sent as max_tokens); `tool_s`, how long the
  tools ran before the round (≥ 0, at most 3,600; round 1's, and that of the round after a fan-out, whose
  tool was the sub-agents, are not waited).
- `sub_agents` (optional): after round `at_round` (before the job's last), `jobs` (1…16) start at once,
  each with its own `rounds`, no start_s and no sub-agents (one level).
- `blocks` (optional, per round): Mooncake-style hash ids of the round's new text, `block_tokens` tokens
  each (the line's, default 512; new_tokens at most as many blocks hold): equal ids are equal text,
  different ids different text, across every job and sub-agent of the trace (mooncake.block_prompt), so
  shared context (a common task preamble, the same file read twice) reaches the server as shared text.
- `job`: any id, for the reader's reference. Other fields are ignored (a recorder may keep more).

A replay keeps the recorded structure (each job's rounds, their lengths and tool waits, its sub-agents at
their round) and the job starts' schedule; the answers, and so when each later round goes, are the
server's. Each round's text is synthetic (its blocks' text where it has blocks, else new text as an agent
class's), its length the trace's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from latscope.errors import ScenarioError
from latscope.mooncake import BLOCK_SIZE, POOL_WORDS, id_capacity
from latscope.scenario import Scenario
from latscope.scenario.workload import MAX_FAN_OUT, MAX_LENGTH, MAX_THINK_S, MAX_TURNS
from latscope.sessions import Turns
from latscope.workload import VOCABULARY

MAX_LINE_BYTES = 1 << 20  # one job's line: 64 rounds and 16 sub-agents of 64 rounds fit in far less


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TraceRound(_Model):
    new_tokens: int = Field(ge=1, le=MAX_LENGTH)
    output_tokens: int = Field(ge=1, le=MAX_LENGTH)
    tool_s: float = Field(0.0, ge=0, le=MAX_THINK_S)
    blocks: tuple[int, ...] | None = Field(None, min_length=1)


class TraceSubAgent(_Model):
    rounds: list[TraceRound] = Field(min_length=1, max_length=MAX_TURNS)


class TraceFanOut(_Model):
    at_round: int = Field(ge=1)
    jobs: list[TraceSubAgent] = Field(min_length=1, max_length=MAX_FAN_OUT)


class TraceJob(_Model):
    job: str | int | None = None
    start_s: float = Field(ge=0)
    block_tokens: int = Field(BLOCK_SIZE, ge=1, le=POOL_WORDS)
    rounds: list[TraceRound] = Field(min_length=1, max_length=MAX_TURNS)
    sub_agents: TraceFanOut | None = None

    @model_validator(mode="after")
    def _fan_out_before_the_last_round(self) -> TraceJob:
        if self.sub_agents is not None and self.sub_agents.at_round >= len(self.rounds):
            raise ValueError(f"sub_agents.at_round {self.sub_agents.at_round}: the sub-agents report to the round after "
                             f"it, and the job has {len(self.rounds)} rounds")
        return self

    @model_validator(mode="after")
    def _blocks_spell_their_rounds(self) -> TraceJob:
        """Each round's blocks hold its new text and are ids its text can spell (mooncake.id_capacity)."""
        capacity = id_capacity(self.block_tokens, len(VOCABULARY))
        subs = self.sub_agents.jobs if self.sub_agents is not None else []
        for where, rounds in (("rounds", self.rounds), *((f"sub_agents.jobs.{i}.rounds", s.rounds) for i, s in enumerate(subs))):
            for k, r in enumerate(rounds):
                if r.blocks is None:
                    continue
                if r.new_tokens > len(r.blocks) * self.block_tokens:
                    raise ValueError(f"{where}.{k}: new_tokens {r.new_tokens} is more than its {len(r.blocks)} blocks of "
                                     f"{self.block_tokens} tokens hold")
                if not all(0 <= b < capacity for b in r.blocks):
                    raise ValueError(f"{where}.{k}.blocks: ids must be in [0, {capacity:,}) with blocks of "
                                     f"{self.block_tokens} tokens")
        return self


@dataclass(frozen=True)
class AgentTrace:
    path: Path
    jobs: list[TraceJob]  # by start_s
    lines: list[int]  # each job's line in the file


def read_trace(path: str | Path, max_jobs: int) -> AgentTrace:
    """The trace at `path`, checked line by line (a ScenarioError names the file, the line and the field),
    at most `max_jobs` jobs (limits.max_planned_requests). Read once per process and file version."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        raise ScenarioError(f"agent trace {path}: not found") from None
    return _read(path, stat.st_mtime_ns, stat.st_size, max_jobs)


@lru_cache(maxsize=4)
def _read(path: Path, mtime_ns: int, size: int, max_jobs: int) -> AgentTrace:
    jobs: list[tuple[float, int, TraceJob]] = []
    try:
        with path.open("rb") as file:
            for n, line in enumerate(iter(lambda: file.readline(MAX_LINE_BYTES + 1), b""), 1):
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    raise ScenarioError(f"agent trace {path}: line {n}: over {MAX_LINE_BYTES:,} bytes")
                if not line.strip():
                    continue
                try:
                    job = TraceJob.model_validate(json.loads(line))
                except (ValueError, RecursionError) as exc:
                    raise ScenarioError(f"agent trace {path}: line {n}: {_why(exc)}") from None
                if len(jobs) == max_jobs:
                    raise ScenarioError(f"agent trace {path}: line {n}: more than {max_jobs:,} jobs "
                                        "(limits.max_planned_requests)")
                jobs.append((job.start_s, n, job))
    except OSError as exc:
        raise ScenarioError(f"agent trace {path}: cannot read it ({exc})") from None
    if not jobs:
        raise ScenarioError(f"agent trace {path}: no jobs (the file is empty or blank)")
    jobs.sort(key=lambda j: (j[0], j[1]))
    return AgentTrace(path, [j for *_, j in jobs], [n for _, n, _ in jobs])


def phase_trace(scenario: Scenario, phase: int) -> AgentTrace:
    """The agent trace phase `phase` replays, read with the bound arrivals.phase_offsets reads it with
    (limits.max_planned_requests), so the plan and a worker's sessions find it parsed already."""
    return read_trace(scenario.resolve_path(scenario.phases[phase].arrival.file), scenario.limits.max_planned_requests)


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return f"not JSON ({exc})"


def round_blocks(job: TraceJob, rounds: list[TraceRound], k: int) -> tuple[np.ndarray, int] | None:
    """Round `k`'s (from 1) blocks of `rounds` (a job's, or one of its sub-agents') as Request.blocks
    takes them: (ids, tokens a block); None when it has none."""
    blocks = rounds[k - 1].blocks
    return (np.array(blocks, np.int64), job.block_tokens) if blocks is not None else None


def turns_of(jobs: list[TraceJob] | list[TraceSubAgent], item0: int, index: np.ndarray | None = None) -> Turns:
    """`jobs` as a Turns table (sessions.py): their rounds' lengths and tool waits, each round's text a new
    item (from `item0` on: a different synthetic text for every round of the replay); `index`: each
    job's place in its trace (Turns.job; None: -1, a sub-agent)."""
    rounds = [job.rounds for job in jobs]
    count = np.array([len(r) for r in rounds], np.int16)
    first = np.concatenate(([0], np.cumsum(count[:-1], dtype=np.int64))) if len(count) else np.empty(0, np.int64)
    flat = [r for job in rounds for r in job]
    think = np.array([r.tool_s for r in flat], np.float64)
    think[first] = 0.0
    return Turns(first, count, np.full(len(count), -1, np.int32), np.array([r.new_tokens for r in flat], np.int32),
                 np.array([r.output_tokens for r in flat], np.int32), think,
                 item0 + np.arange(len(flat), dtype=np.int64) * 7919,
                 np.asarray(index, np.int64) if index is not None else np.full(len(count), -1, np.int64))
