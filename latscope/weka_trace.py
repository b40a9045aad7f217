"""Recorded agent sessions in the WEKA KV-cache-tester trace format, turned into an agent trace
(agent_trace.py's format) that `arrival: {type: trace, format: agents}` replays (`latscope weka-trace`).

The WEKA format is the one SemiAnalysis's published coding-agent corpora use (`cc-traces-weka-*`) and
aiperf's agentic replay reads: one JSON object per session (a `.json` file, a directory of them, or JSON
lines), with `id`, `block_size` (tokens a hash id stands for), `hash_id_scope` (`local`: ids per session;
`global`: one namespace for the corpus) and `requests`, in order, each either an API call (`type` "n" or
"s") with `t` (s from the session's start), `in` (the whole input, tokens), `out`, `hash_ids` (the
input's blocks), `think_time` (the client's delay before it, s) and `api_time`, or a sub-agent (`type`
"subagent", `status`, its own nested `requests`).

What becomes of a session (a job; what latscope cannot replay is dropped and counted, never guessed):

- each API call is a round: `output_tokens` = out (at least 1); `new_tokens` = in − (the previous call's
  in + out), at least 1 (round 1: in), what the recorded context grew by besides the answer;
  `tool_s` = think_time, else the gap after the previous call (t − its t − its api_time, at least 0);
  `blocks` = the input's hash ids past those of the previous call's input, where they hold the new
  tokens (else none: that round's text is new), renumbered 0, 1, … in the order first met (equal
  ids stay equal: within a session for `local` ids, across the corpus for `global` ones), so that the
  text can spell them (mooncake.id_capacity);
- the sub-agents recorded between two calls start after the first of them (`at_round`), each one's
  calls its rounds; only a session's first such group is kept (agent_trace.py: one fan-out a job), and
  sub-agents of sub-agents and `async_launched` ones (the parent did not wait) are dropped;
- a session starts `start_s` into the trace: job starts are not in the format, so they are drawn,
  Poisson at `rate` a second from `seed`; rounds and sub-agents' rounds past 64 are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from latscope.errors import ScenarioError
from latscope.mooncake import id_capacity
from latscope.scenario.workload import MAX_FAN_OUT, MAX_THINK_S, MAX_TURNS
from latscope.workload import VOCABULARY

CALLS = ("n", "s")


@dataclass
class Dropped:
    """What a conversion left out, by why."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, why: str, n: int = 1) -> None:
        if n:
            self.counts[why] = self.counts.get(why, 0) + n


def sessions(source: Path) -> Iterator[tuple[str, dict]]:
    """The sessions at `source` (a .json file, a directory of them, or a JSON-lines file), each with where
    it came from ("file" or "file:line")."""
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() == ".json")
        if not files:
            raise ScenarioError(f"WEKA trace {source}: no .json files in the directory")
        for path in files:
            yield str(path), _load(path.read_bytes(), str(path))
        return
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"WEKA trace {source}: cannot read it ({exc})") from None
    if source.suffix.lower() == ".json":
        yield str(source), _load(data, str(source))
        return
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            yield f"{source}:{n}", _load(line, f"{source}: line {n}")


def _load(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ScenarioError(f"WEKA trace {where}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise ScenarioError(f"WEKA trace {where}: not a session (an object with a `requests` list)")
    return doc


def _number(entry: dict, key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ScenarioError(f"WEKA trace {where}: `{key}` must be a number ≥ 0, got {value!r}")
    return value


def _rounds(calls: list[dict], where: str, scope: Any, block_tokens: int, ids: dict, dropped: Dropped) -> list[dict]:
    """A session's (or sub-agent's) calls as rounds (the module docstring); `ids`: the renumbering of
    (scope, hash id), `scope` the session's index for local ids, None for global ones."""
    rounds: list[dict] = []
    previous: dict | None = None
    capacity = id_capacity(block_tokens, len(VOCABULARY))
    for i, call in enumerate(calls):
        at = f"{where}: requests[{i}]"
        total, out = int(_number(call, "in", at)), int(_number(call, "out", at))
        hashes = call.get("hash_ids") or []
        if not isinstance(hashes, list) or not all(isinstance(h, int) and h >= 0 for h in hashes):
            raise ScenarioError(f"WEKA trace {at}: `hash_ids` must be a list of integers ≥ 0")
        if previous is None:
            new, tool_s, fresh = max(1, total), 0.0, hashes
        else:
            new = max(1, total - int(previous["in"]) - int(previous["out"]))
            if call.get("think_time") is not None:
                tool_s = _number(call, "think_time", at)
            else:
                ended = _number(previous, "t", at) + (_number(previous, "api_time", at) if previous.get("api_time") is not None
                                                      else 0.0)
                tool_s = max(0.0, _number(call, "t", at) - ended)
            tool_s = min(tool_s, MAX_THINK_S)
            fresh = hashes[len(previous.get("hash_ids") or []):]
        round_: dict[str, Any] = {"new_tokens": new, "output_tokens": max(1, out)}
        if previous is not None:
            round_["tool_s"] = round(tool_s, 6)
        blocks = [ids.setdefault((scope, h), len(ids)) for h in fresh]
        if blocks and new <= len(blocks) * block_tokens and all(b < capacity for b in blocks):
            round_["blocks"] = blocks
        elif fresh:
            dropped.add("rounds whose new text was sent without its recorded blocks (too few, or ids past what "
                        "the text can spell)")
        rounds.append(round_)
        previous = call
    if len(rounds) > MAX_TURNS:
        dropped.add(f"rounds past {MAX_TURNS} in a job or sub-agent", len(rounds) - MAX_TURNS)
    return rounds[:MAX_TURNS]


def job(session: dict, where: str, index: int, start_s: float, ids: dict, dropped: Dropped) -> dict | None:
    """One session as an agent trace job (a line of agent_trace.py's format); None when it made no call.
    `ids`: the corpus's renumbering of hash ids so far (the module docstring)."""
    block_tokens = max(1, int(_number(session, "block_size", where)))
    scope = None if session.get("hash_id_scope") == "global" else index  # local ids: this session's own
    calls: list[dict] = []
    groups: list[tuple[int, list[dict]]] = []  # (calls before it, its sub-agents)
    for i, entry in enumerate(session["requests"]):
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind in CALLS:
            calls.append(entry)
        elif kind == "subagent":
            if entry.get("status") == "async_launched":
                dropped.add("async_launched sub-agents (the parent did not wait for them)")
                continue
            inner = [r for r in entry.get("requests") or [] if isinstance(r, dict) and r.get("type") in CALLS]
            dropped.add("sub-agents of sub-agents", sum(1 for r in entry.get("requests") or []
                                                        if isinstance(r, dict) and r.get("type") == "subagent"))
            if groups and groups[-1][0] == len(calls):
                groups[-1][1].append(entry | {"requests": inner})
            else:
                groups.append((len(calls), [entry | {"requests": inner}]))
        else:
            raise ScenarioError(f"WEKA trace {where}: requests[{i}]: `type` must be n, s or subagent, got {kind!r}")
    if not calls:
        dropped.add("sessions without an API call")
        return None
    line: dict[str, Any] = {"job": session.get("id", index), "start_s": round(start_s, 6), "block_tokens": block_tokens,
                            "rounds": _rounds(calls, where, scope, block_tokens, ids, dropped)}
    usable = [(at, subs) for at, subs in groups if 1 <= at < len(line["rounds"]) and any(s["requests"] for s in subs)]
    dropped.add("fan-outs after a job's first, before its first call or after its last",
                len(groups) - min(1, len(usable)))
    if usable:
        at, subs = usable[0]
        jobs = [{"rounds": _rounds(s["requests"], f"{where}: sub-agent {s.get('agent_id', k)}", scope, block_tokens,
                                   ids, dropped)} for k, s in enumerate(subs) if s["requests"]]
        dropped.add(f"sub-agents past {MAX_FAN_OUT} in a fan-out", max(0, len(jobs) - MAX_FAN_OUT))
        line["sub_agents"] = {"at_round": at, "jobs": jobs[:MAX_FAN_OUT]}
    return line


def convert(source: Path, rate: float, seed: int = 0) -> tuple[list[str], Dropped]:
    """The agent trace lines of the WEKA sessions at `source`, their starts Poisson at `rate` a second."""
    rng = np.random.default_rng(seed)
    dropped, lines, start, ids = Dropped(), [], 0.0, {}
    for index, (where, session) in enumerate(sessions(source)):
        line = job(session, where, index, start, ids, dropped)
        if line is not None:
            lines.append(json.dumps(line, separators=(",", ":")))
            start += float(rng.exponential(1 / rate))
    return lines, dropped
