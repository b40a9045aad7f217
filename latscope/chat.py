"""A worker's sessions in progress: which turn comes next, and when.

The plan decided every session's turns (sessions.py); what it could not decide is when turns 2…T
go, since that depends on the answers. Here, in the worker, each answer decides it:

    turn k + 1 is intended at  end of turn k's answer + think_{k+1}

and is handed back to the engine, which sends it then, open loop like any request (its latency runs
from that intended time; if the client is late, it is send lag). A session ends one of four ways,
each counted under its class (results.schema.SESSION_COUNTERS):

- completed: its last turn was answered (its duration, turn 1's intended time → the last answer's
  end, is recorded as `session_duration`);
- abandoned: a turn failed (any error) or was dropped at the in-flight cap: the later turns are not
  sent (`turns_not_sent`), as a person would not carry on with a broken chat (a closed-loop user
  starts its next session USER_RETRY_NS later, not at once: no hot loop against a dead target);
- cut: its next turn would be due after the run's planned end (or the run was stopped): not sent;
- history_limit (only a session that carries its history): after an answer, its history as the
  client keeps it (`Conversation.carried`: the earlier turns and answers, in bytes) is over its
  class's session.max_history_bytes, or the histories of all the worker's sessions together are
  over limits.max_carried_bytes_per_worker (this answer's session is the one that ends): the later
  turns are not sent, as for abandoned. The answered turn was sent and counted like any other, so
  the engine's accounting holds; a target answering with megabytes a turn costs the worker one
  answer's memory, not a history that grows until the machine kills it.

Whichever way a session ends, its history is let go at once. What the history holds is the client's
business (protocols/openai.py `_remember`): each turn and the answer as the server gave it, without a
reasoning model's reasoning unless the class's `session.carry_reasoning` says to keep it.

An agent's job is a session (scenario/workload.py `Agent`, docs/agents.md: rounds are turns, tool waits
think times): a completed job is also recorded as a job (IntervalRecorder.record_job) with its critical
path, which is exactly its rounds' latencies (answer end − intended) and the tool waits between them
(each round is intended at the answer before it + its tool wait), summed as they happen. A job that
fans out (agent.fan_out, or its agent trace's sub_agents) starts its sub-agents when round `at_round` is
answered, each a session of its own intended then (sessions.sub_agents draws them from the job's own
stream; not counted as sessions: they are part of the job); its next round is intended at the last
one's end, carrying their final answers (Conversation.reports), and its critical path takes that
sub-agent's. A sub-agent that fails, passes its history bound or would go after the run's end ends the
job the same way (abandoned, history_limit, cut) once its siblings have stopped.

Closed-loop users (`arrival: {type: users}`): a user's plan row starts its first session at the row's
intended time, and each session that ends (any way but cut) starts the user's next one at once,
while the user's phase lasts. A user's k-th session is sessions.user_session(…, user, k): the same
sessions whichever worker runs it.

Request numbers (`seq`, the X-Request-Id): a session's turn 1 is its plan row; its later turns come
after the plan's rows, in the order of the plan's session table (the rows schedule.parquet gives
them); closed-loop requests come after those: user u's m-th request is base + m·users + u; a sub-agent's
are numbered from results.schema.SUB_AGENT_BASE, by its job, its index and its round.
"""

from __future__ import annotations

import numpy as np

from latscope.agent_trace import TraceJob, TraceRound, phase_trace, round_blocks, turns_of
from latscope.intervals import IntervalRecorder
from latscope.plan import Plan, default_prompt, human_turns
from latscope.records import Conversation, Outcome, Request
from latscope.results.schema import (SESSIONS_ABANDONED, SESSIONS_COMPLETED, SESSIONS_CUT, SESSIONS_HISTORY_LIMIT,
                                     SESSIONS_STARTED, SUB_AGENT_BASE, TURNS_NOT_SENT)
from latscope.scenario import Scenario
from latscope.scenario.workload import MAX_FAN_OUT, MAX_TURNS, Session
from latscope.sessions import Turns, sub_agents, user_session

USER_RETRY_NS = 100_000_000  # after an abandoned session, a closed-loop user starts its next one this much later


class _Live:
    """A session in progress: where its turns are (`turns`, session `j`), the next turn's number, the
    bytes of its history counted in the worker's total (`counted`); a sub-agent's job (`parent`); a job
    that fanned out: its sub-agents still running (`waiting`), the last one's end and critical path,
    and how one of them ended the job early (`failed`, a SESSION_COUNTERS index; -1: none did)."""

    __slots__ = ("conv", "turns", "j", "next_turn", "warmup", "started", "counted", "parent", "waiting", "ends_ns",
                 "critical", "failed", "replay", "rounds")

    def __init__(self, conv: Conversation, turns: Turns, j: int, warmup: bool, parent: _Live | None = None) -> None:
        self.conv, self.turns, self.j, self.warmup, self.parent = conv, turns, j, warmup, parent
        self.next_turn = 1
        self.started = False  # its turn 1 went (or was dropped at the cap): counted started
        self.counted = 0
        self.waiting, self.ends_ns, self.critical, self.failed = 0, 0, (0, 0), -1
        self.replay: TraceJob | None = None  # the agent trace job it replays, or its sub-agent's job
        self.rounds: list[TraceRound] | None = None  # the rounds it replays (their blocks: agent_trace.round_blocks)


class Conversations:
    """Turns sessions' answers into their next turns (the module docstring), for one worker."""

    def __init__(self, scenario: Scenario, plan: Plan, t0_ns: int, measure: IntervalRecorder) -> None:
        self.scenario, self.plan, self.measure = scenario, plan, measure
        self.end_ns = t0_ns + int(plan.duration_s * 1e9)  # no turn is sent after the run's planned end
        self.t0_ns = t0_ns
        classes = scenario.workload.effective_classes()
        sessions = [c.conversation for c in classes]
        self._carry = [s is None or s.history == "carry" for s in sessions]
        self._max_history = [(s or Session()).max_history_bytes for s in sessions]
        self._agent = [c.agent is not None for c in classes]
        self._max_job_us = [int(c.agent.max_job_time * 1e6) if c.agent and c.agent.max_job_time else None
                            for c in classes]
        self._max_carried = scenario.limits.max_carried_bytes_per_worker
        self._carried = 0  # the bytes of the live sessions' histories, as last seen after their answers
        turns = plan.turns
        n_later = 0 if turns is None else len(turns.prompt_tokens) - len(turns)
        self._later_base = len(plan)  # seq of later turns: after the rows, in session-table order
        self._user_base = len(plan) + n_later  # seq of closed-loop requests: after those
        self._users = int((plan.user >= 0).sum()) if plan.user is not None else 0
        self._user_requests: dict[int, int] = {}  # user -> requests made
        self._user_sessions: dict[int, int] = {}  # user -> sessions started
        self._user_end_ns: dict[int, int] = {}  # user -> its phase's end
        self._user_phase: dict[int, int] = {}  # user -> its phase's index
        self._phase_classes: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # phase -> its classes and their weights
        self._live: dict[int, _Live] = {}  # conversation id -> state
        self._open_sessions = len(turns) if turns is not None else 0
        self._default_prompt = [default_prompt(scenario, c) for c in range(len(classes))]
        self._fan_out_round = [c.agent.fan_out.at_round if c.agent and c.agent.fan_out else 0 for c in classes]
        if plan.user is not None:  # what closed-loop users draw from (sessions.user_session)
            self._human_turns = [human_turns(scenario, c) for c in range(len(classes))]

    @property
    def live(self) -> int:
        """Sessions begun and not ended: the engine keeps going while there are any."""
        return len(self._live)

    def begin(self, request: Request) -> Request | None:
        """A plan row as the engine's first request of it: the row itself, a session's turn 1, or a
        closed-loop user's first request (None: a user whose phase is over)."""
        row = request.seq
        if self.plan.user is not None and (user := int(self.plan.user[row])) >= 0:
            self._user_phase[user] = int(self.plan.phase[row])
            phase = self.plan.phases[self._user_phase[user]]
            self._user_end_ns[user] = self.t0_ns + int((phase.start_s + phase.duration_s) * 1e9)
            return self._user_next(user, request.intended_ns, request.warmup)
        if self.plan.session is None or (j := int(self.plan.session[row])) < 0:
            return request
        turns = self.plan.turns
        conv = Conversation(j, request.cls, self._carry[request.cls], int(turns.prefix[j]), int(turns.count[j]),
                            request.intended_ns)
        state = _Live(conv, turns, j, request.warmup)
        state.next_turn = 2
        if turns.job[j] >= 0:
            state.replay = phase_trace(self.scenario, int(self.plan.phase[row])).jobs[int(turns.job[j])]
            state.rounds = state.replay.rounds
            request.blocks = round_blocks(state.replay, state.rounds, 1)
        self._live[conv.id] = state
        request.turn, request.session = 1, conv
        return request

    def starting(self, request: Request) -> None:
        """A session's turn 1 is being sent (or dropped at the cap): the session counts as started. Not
        before: the engine prepares turn 1 ahead, and a session whose turn 1 never went never began.
        A sub-agent is part of its job, not counted apart."""
        state = self._live[request.session.id]
        state.started = True
        if state.parent is None:
            self.measure.count(state.conv.cls, state.warmup, SESSIONS_STARTED)

    def after(self, request: Request, outcome: Outcome | None) -> list[Request]:
        """A session turn ended (`outcome` None: it was dropped at the cap, never sent): its next turn,
        due at the answer's end plus its think time, a job's sub-agents, or the user's next session."""
        state = self._live[request.session.id]
        conv = state.conv
        if outcome is not None:  # sent: a request of its job
            (conv.reports_to or conv).requests += 1
        if outcome is not None and outcome.error is None:  # a job's critical path (agents)
            conv.model_ns += outcome.end_ns - request.intended_ns
            if outcome.cached_tokens >= 0:
                conv.prompt_tokens += outcome.prompt_tokens
                conv.cached_tokens += outcome.cached_tokens
        if state.parent is not None:
            return self._sub_agent_after(state, request, outcome)
        if outcome is None or outcome.error is not None:
            self._end(state, SESSIONS_ABANDONED, conv.turns - request.turn)
        elif request.turn >= conv.turns:
            duration_us = (outcome.end_ns - conv.started_ns) // 1000
            if self._agent[conv.cls]:
                limit = self._max_job_us[conv.cls]
                good = not conv.missed and (limit is None or duration_us <= limit)
                self.measure.record_job(conv.cls, state.warmup, conv, request.turn,
                                        outcome.prompt_tokens or request.prompt_tokens, duration_us, good)
            self._end(state, SESSIONS_COMPLETED, 0)
            self.measure.record_session(conv.cls, state.warmup, duration_us)
        elif conv.carry and self._over_bound(state):  # `new`: the history never grows (a system prompt at most)
            self._end(state, SESSIONS_HISTORY_LIMIT, conv.turns - request.turn)
        elif self._fan_out_at(state) == request.turn:
            return self._fan_out(state, outcome.end_ns)
        else:
            t = state.turns.first[state.j] + request.turn  # the next turn's place in the table
            intended = outcome.end_ns + int(state.turns.think_s[t] * 1e9)
            if intended > self.end_ns:
                self._end(state, SESSIONS_CUT, conv.turns - request.turn)
                return []
            conv.tool_ns += intended - outcome.end_ns
            return [self._turn(state, intended)]
        failed = outcome is None or outcome.error is not None
        return self._user_after(conv, outcome.end_ns if outcome is not None else request.intended_ns, failed, state.warmup)

    def stop(self, unsent: list[Request]) -> None:
        """The run is over: every session still going is cut, its turns not sent counted (`unsent`:
        turns the engine holds that never went; the others up to next_turn went). A job waiting for its
        sub-agents is cut with the rounds after its fan-out; the sub-agents go with it."""
        waiting = {r.session.id for r in unsent if r.session is not None}
        for state in list(self._live.values()):
            if state.parent is not None:
                self._end(state, None, 0)
                continue
            if not state.started:  # prepared, never sent: it never began
                del self._live[state.conv.id]
                continue
            sent = state.next_turn - 1 - (state.conv.id in waiting)
            self._end(state, SESSIONS_CUT, state.conv.turns - sent)

    # -- inside ---------------------------------------------------------------------------

    def _over_bound(self, state: _Live) -> bool:
        """After an answer: is the session's history, or all the worker's together, past its bound?"""
        conv = state.conv
        self._carried += conv.carried - state.counted
        state.counted = conv.carried
        return conv.carried > self._max_history[conv.cls] or self._carried > self._max_carried

    def _user_after(self, conv: Conversation, end_ns: int, failed: bool, warmup: bool) -> list[Request]:
        """A session ended: its closed-loop user's next one (none for an open-loop session)."""
        if conv.user < 0:
            return []
        if failed:  # no hot loop against a failing target
            end_ns += USER_RETRY_NS
        follow = self._user_next(conv.user, end_ns, warmup)
        return [follow] if follow is not None else []

    def _fan_out_at(self, state: _Live) -> int:
        """The round after which a job fans out (0: it does not): its trace's, or its class's."""
        if state.replay is not None:
            return state.replay.sub_agents.at_round if state.replay.sub_agents is not None else 0
        return self._fan_out_round[state.conv.cls]

    def _fan_out(self, state: _Live, at_ns: int) -> list[Request]:
        """A job's round `at_round` was answered: its sub-agents (sessions.sub_agents, or its trace's) start
        now, each with a context of its own (turn 1 of each, intended at `at_ns`)."""
        conv = state.conv
        if state.replay is not None:
            turns = turns_of(state.replay.sub_agents.jobs, (SUB_AGENT_BASE + conv.id * MAX_FAN_OUT) * MAX_TURNS)
        else:
            turns = sub_agents(self.scenario, conv.cls, self.plan.session_seed, conv.id, self._default_prompt[conv.cls])
        state.waiting, state.ends_ns = len(turns), at_ns
        first = []
        for i in range(len(turns)):
            sub = Conversation(SUB_AGENT_BASE + conv.id * MAX_FAN_OUT + i, conv.cls, True, -1, int(turns.count[i]), at_ns,
                               conv.user, reports_to=conv)
            self._live[sub.id] = child = _Live(sub, turns, i, state.warmup, state)
            if state.replay is not None:
                child.replay, child.rounds = state.replay, state.replay.sub_agents.jobs[i].rounds
            first.append(self._turn(child, at_ns))
        return first

    def _sub_agent_after(self, state: _Live, request: Request, outcome: Outcome | None) -> list[Request]:
        """A sub-agent's round ended: its next round, or its end; once the job's last sub-agent has
        ended, the job's next round (at that end, carrying their final answers) or the job's end, the
        way the first of them to fail ended it (abandoned, history_limit, cut)."""
        job, conv = state.parent, state.conv
        if job.failed >= 0:  # a sibling ended the job: this one stops too
            pass
        elif outcome is None or outcome.error is not None:
            job.failed = SESSIONS_ABANDONED
        elif request.turn >= conv.turns:
            if outcome.end_ns >= job.ends_ns:  # the last to end is the critical path
                job.ends_ns, job.critical = outcome.end_ns, (conv.model_ns, conv.tool_ns)
            job.conv.reports.append(conv.answer)
        elif self._over_bound(state):
            job.failed = SESSIONS_HISTORY_LIMIT
        else:
            t = state.turns.first[state.j] + request.turn
            intended = outcome.end_ns + int(state.turns.think_s[t] * 1e9)
            if intended <= self.end_ns:
                conv.tool_ns += intended - outcome.end_ns
                return [self._turn(state, intended)]
            job.failed = SESSIONS_CUT
        self._end(state, None, 0)
        job.waiting -= 1
        if job.waiting:
            return []
        jconv = job.conv
        if job.failed >= 0 or job.ends_ns > self.end_ns:
            self._end(job, job.failed if job.failed >= 0 else SESSIONS_CUT, jconv.turns - (job.next_turn - 1))
            return self._user_after(jconv, job.ends_ns, job.failed == SESSIONS_ABANDONED, job.warmup)
        jconv.model_ns += job.critical[0]
        jconv.tool_ns += job.critical[1]
        return [self._turn(job, job.ends_ns)]

    def _end(self, state: _Live, how: int | None, not_sent: int) -> None:
        """A session ends `how` (a SESSION_COUNTERS index; None: a sub-agent, counted with its job)."""
        del self._live[state.conv.id]
        self._carried -= state.counted
        state.counted, state.conv.history, state.conv.carried = 0, None, 0  # its memory goes now
        if how is None:
            return
        self.measure.count(state.conv.cls, state.warmup, how)
        if not_sent:
            self.measure.count(state.conv.cls, state.warmup, TURNS_NOT_SENT, not_sent)

    def _turn(self, state: _Live, intended_ns: int) -> Request:
        """The session's next turn as a Request, intended at `intended_ns`."""
        conv, turns, k = state.conv, state.turns, state.next_turn
        t = int(turns.first[state.j]) + k - 1
        if conv.id >= SUB_AGENT_BASE:
            seq = SUB_AGENT_BASE + (conv.id - SUB_AGENT_BASE) * MAX_TURNS + k - 1
        elif conv.user >= 0:
            m = self._user_requests[conv.user]
            self._user_requests[conv.user] = m + 1
            seq = self._user_base + m * self._users + conv.user
        else:
            seq = self._later_base + t - state.j - 1  # later turns only: each session before has count − 1
        state.next_turn = k + 1
        blocks = round_blocks(state.replay, state.rounds, k) if state.rounds is not None else None
        return Request(seq, intended_ns, conv.cls, state.warmup, int(turns.prompt_tokens[t]), int(turns.output_tokens[t]),
                       int(turns.item[t]), blocks, turn=k, session=conv)

    def _user_next(self, user: int, at_ns: int, warmup: bool) -> Request | None:
        """A closed-loop user's next session, starting at `at_ns` (None: its phase is over)."""
        if at_ns >= self._user_end_ns[user]:
            return None
        k = self._user_sessions.get(user, 0)
        self._user_sessions[user] = k + 1
        self._user_requests.setdefault(user, 0)
        classes, weights = self._user_classes(user)
        c, turns = user_session(self.scenario, self.plan.session_seed, user, k, classes, weights,
                                self._default_prompt, self._human_turns)
        conv = Conversation(self._open_sessions + k * self._users + user, c, self._carry[c], int(turns.prefix[0]),
                            int(turns.count[0]), at_ns, user)
        state = _Live(conv, turns, 0, warmup)
        self._live[conv.id] = state
        return self._turn(state, at_ns)

    def _user_classes(self, user: int) -> tuple[np.ndarray, np.ndarray]:
        """The classes a user's sessions are drawn from (its phase's, by weight), worked out once a phase."""
        i = self._user_phase[user]
        if i not in self._phase_classes:
            phase, classes = self.scenario.phases[i], self.scenario.workload.effective_classes()
            allowed = [j for j, c in enumerate(classes) if phase.classes is None or c.name in phase.classes]
            weights = np.array([classes[j].weight for j in allowed], float)
            self._phase_classes[i] = (np.array(allowed), weights / weights.sum())
        return self._phase_classes[i]
