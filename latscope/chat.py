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

Closed-loop users (`arrival: {type: users}`): a user's plan row starts its first session at the row's
intended time, and each session that ends (any way but cut) starts the user's next one at once,
while the user's phase lasts. A user's k-th session is sessions.user_session(…, user, k): the same
sessions whichever worker runs it.

Request numbers (`seq`, the X-Request-Id): a session's turn 1 is its plan row; its later turns come
after the plan's rows, in the order of the plan's session table (the rows schedule.parquet gives
them); closed-loop requests come after those: user u's m-th request is base + m·users + u.
"""

from __future__ import annotations

import numpy as np

from latscope.intervals import IntervalRecorder
from latscope.plan import Plan, default_prompt, human_turns
from latscope.records import Conversation, Outcome, Request
from latscope.results.schema import (SESSIONS_ABANDONED, SESSIONS_COMPLETED, SESSIONS_CUT, SESSIONS_HISTORY_LIMIT,
                                     SESSIONS_STARTED, TURNS_NOT_SENT)
from latscope.scenario import Scenario
from latscope.scenario.workload import Session
from latscope.sessions import Turns, user_session

USER_RETRY_NS = 100_000_000  # after an abandoned session, a closed-loop user starts its next one this much later


class _Live:
    """A session in progress: where its turns are (`turns`, session `j`), the next turn's number, the
    bytes of its history counted in the worker's total (`counted`)."""

    __slots__ = ("conv", "turns", "j", "next_turn", "warmup", "started", "counted")

    def __init__(self, conv: Conversation, turns: Turns, j: int, warmup: bool) -> None:
        self.conv, self.turns, self.j, self.warmup = conv, turns, j, warmup
        self.next_turn = 1
        self.started = False  # its turn 1 went (or was dropped at the cap): counted started
        self.counted = 0


class Conversations:
    """Turns sessions' answers into their next turns (the module docstring), for one worker."""

    def __init__(self, scenario: Scenario, plan: Plan, t0_ns: int, measure: IntervalRecorder) -> None:
        self.scenario, self.plan, self.measure = scenario, plan, measure
        self.end_ns = t0_ns + int(plan.duration_s * 1e9)  # no turn is sent after the run's planned end
        self.t0_ns = t0_ns
        classes = scenario.workload.effective_classes()
        self._carry = [c.session is None or c.session.history == "carry" for c in classes]
        self._max_history = [(c.session or Session()).max_history_bytes for c in classes]
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
        if plan.user is not None:  # what closed-loop users draw from (sessions.user_session)
            self._default_prompt = [default_prompt(scenario, c) for c in range(len(classes))]
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
        self._live[conv.id] = state
        request.turn, request.session = 1, conv
        return request

    def starting(self, request: Request) -> None:
        """A session's turn 1 is being sent (or dropped at the cap): the session counts as started. Not
        before: the engine prepares turn 1 ahead, and a session whose turn 1 never went never began."""
        state = self._live[request.session.id]
        state.started = True
        self.measure.count(state.conv.cls, state.warmup, SESSIONS_STARTED)

    def after(self, request: Request, outcome: Outcome | None) -> Request | None:
        """A session turn ended (`outcome` None: it was dropped at the cap, never sent): its next turn,
        due at the answer's end plus its think time, or the user's next session; None when neither."""
        state = self._live[request.session.id]
        conv = state.conv
        if outcome is None or outcome.error is not None:
            self._end(state, SESSIONS_ABANDONED, conv.turns - request.turn)
        elif request.turn >= conv.turns:
            self._end(state, SESSIONS_COMPLETED, 0)
            self.measure.record_session(conv.cls, state.warmup, (outcome.end_ns - conv.started_ns) // 1000)
        elif conv.carry and self._over_bound(state):  # `new`: the history never grows (a system prompt at most)
            self._end(state, SESSIONS_HISTORY_LIMIT, conv.turns - request.turn)
        else:
            t = state.turns.first[state.j] + request.turn  # the next turn's place in the table
            intended = outcome.end_ns + int(state.turns.think_s[t] * 1e9)
            if intended > self.end_ns:
                self._end(state, SESSIONS_CUT, conv.turns - request.turn)
                return None
            return self._turn(state, intended)
        if conv.user < 0:
            return None
        end_ns = outcome.end_ns if outcome is not None else request.intended_ns
        if outcome is None or outcome.error is not None:  # no hot loop against a failing target
            end_ns += USER_RETRY_NS
        return self._user_next(conv.user, end_ns, state.warmup)

    def stop(self, unsent: list[Request]) -> None:
        """The run is over: every session still going is cut, its turns not sent counted (`unsent`:
        turns the engine holds that never went; the others up to next_turn went)."""
        waiting = {r.session.id for r in unsent if r.session is not None}
        for state in list(self._live.values()):
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

    def _end(self, state: _Live, how: int, not_sent: int) -> None:
        del self._live[state.conv.id]
        self._carried -= state.counted
        state.counted, state.conv.history, state.conv.carried = 0, None, 0  # its memory goes now
        self.measure.count(state.conv.cls, state.warmup, how)
        if not_sent:
            self.measure.count(state.conv.cls, state.warmup, TURNS_NOT_SENT, not_sent)

    def _turn(self, state: _Live, intended_ns: int) -> Request:
        """The session's next turn as a Request, intended at `intended_ns`."""
        conv, turns, k = state.conv, state.turns, state.next_turn
        t = int(turns.first[state.j]) + k - 1
        if conv.user >= 0:
            m = self._user_requests[conv.user]
            self._user_requests[conv.user] = m + 1
            seq = self._user_base + m * self._users + conv.user
        else:
            seq = self._later_base + t - state.j - 1  # later turns only: each session before has count − 1
        state.next_turn = k + 1
        return Request(seq, intended_ns, conv.cls, state.warmup, int(turns.prompt_tokens[t]), int(turns.output_tokens[t]),
                       int(turns.item[t]), turn=k, session=conv)

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
