"""What one worker measured, interval by interval: each request's `Outcome` becomes histogram values
and counters here, and `take()` hands them over as one `IntervalReport` per interval.

The engine (engine.py) decides *when* requests go and nothing else; this module decides what their
outcomes *mean*, following the timing rules (DESIGN.md), all from the intended time of the plan:

    latency      = end − intended                (what a user waited; success only)
    service_time = end − actual send             (success only)
    send_lag     = actual send − intended        (every sent request: how late the client was)
    ttft         = first token − intended;  itl = each gap between token chunks;
    tpot         = (end − first token) / (tokens − 1)            (streams)
    ttfot        = first content token − intended               (streams with a content chunk)
    reasoning_time = first content token − first token          (streams that reasoned, then answered)
    content_tpot = (end − first content token) / (content tokens − 1)   (streams, content tokens > 1)
    encode, decode, server.<part> as measured;  network = service_time − decode − server total
    client_inclusive = latency + the part of the encode done before the intended time
                     (what a caller that builds each request when it is due would wait: the engine
                     prepares ahead, so `latency` holds no encode unless the client was late, and
                     then that encode is send lag, inside latency already)

A token chunk is reasoning (a reasoning model's thinking: Outcome.reasoning_chunks of them) or
content (the answer itself; the first one's read time is Outcome.content_ns), and `token_ns` holds
both. A "token" above is any token chunk, so ttft is the first of either kind, and equals ttfot when
the stream did not reason; reasoning_time is recorded only when it did (reasoning_chunks > 0).
content tokens = output tokens − reasoning tokens, where the reasoning tokens are the server's usage
count (Outcome.reasoning_tokens) when it said, else the reasoning chunks counted.

An empty answer (completed, 0 output tokens: a stream that ended without a token chunk, a whole
answer with nothing in it) counts in `empty` and has no ttft, ttfot or tpot: it is counted only when
its count is known (a stream, the server's usage, or the tokenizer) and it is not a batch request
(Outcome.items: embeddings' inputs, rerank's documents, which add up in `items`).

Values are µs (integer division of ns). A failed request counts under its error kind and keeps a
few distinct messages; it adds nothing to the latency histograms. What the target said (an error
message, a replica id, a Server-Timing name) is scrubbed of the scenario's secrets here, before it
leaves the worker (scenario.scrub): a server that echoes the API key puts it nowhere.

Goodput (DistServe's): a request of a class with objectives (Scenario.goodput_objectives) is *good*
when it succeeded and met every objective of its class, judged here, exactly, one request at a time
(never from percentiles), on the same µs values the histograms get:

    latency = end − intended;  ttft = first token chunk − intended (no chunks: ttft = latency)
    ttfot   = first content chunk − intended               (no content chunk: ttfot = latency)
    tpot    = (end − first token) // (tokens − 1)          (met with ≤ 1 token)
    itl     = the request's longest gap between token chunks  (met with < 2 chunks)

each met when value_us <= objective_ms × 1000. A good request counts in `good` and its output
tokens in `good_output_tokens` (results.schema.COUNTERS); a failed, dropped or cancelled one never.

A session's turn k is also recorded by turn: latency, ttft, itl and tpot under `turn.<metric>` with
the class `<class>#k`, and its counters (completed, errors, prompt tokens, cached prompt tokens, the
prompt tokens of answers that said how many were cached) in the report's `turns`. The prefix-cache
hit rate is cached / cache_reported_prompt_tokens: only answers whose server said count.

Agents: every completed answer's tool calls count in `tool_calls` (those whose arguments are no JSON
object in `tool_calls_invalid` too); an agent's completed job (chat.py) is recorded by `record_job`. A
round that missed its class's goodput objectives (or failed: its job ends) marks its job not good
(`Conversation.missed`; a sub-agent's round marks the job it reports to).
"""

from __future__ import annotations

from latscope.records import Conversation, IntervalReport, Outcome, Probe, Request
from latscope.recorder import Recorder
from latscope.request_log import NULL, RequestLog
from latscope.results.schema import (CACHE_REPORTED, CACHED_TOKENS, CANCELLED, COMPLETED, COUNTERS, EMPTY, ERROR_INDEX,
                                     GOOD, GOOD_OUTPUT_TOKENS, ITEMS, MAX_REPLICA_CLASSES, OTHER_REPLICAS, OUTPUT_TOKENS,
                                     OUTPUT_TOKENS_USAGE, PROMPT_TOKENS, REASONING_TOKENS, REPLICA_METRIC, TURN_CACHED,
                                     TURN_COMPLETED, TURN_COUNTERS, TURN_ERRORS, TURN_PROMPT, TURN_REPORTED, replica_class,
                                     turn_class)
from latscope.results.schema import (OUTPUT_BY_TOKENIZER, OUTPUT_CHECKED, OUTPUT_FROM_CHUNKS, OUTPUT_FROM_USAGE,
                                     OUTPUT_LONG, OUTPUT_SHORT, OUTPUT_SHORT_TOKENS, OUTPUT_UNCOUNTED, PROMPT_ABOVE,
                                     PROMPT_ABOVE_MAX, PROMPT_BELOW, PROMPT_BELOW_MAX, PROMPT_CHECKED, PROMPT_DIFFER,
                                     PROMPT_FROM_PLAN, PROMPT_FROM_USAGE)
from latscope.results.schema import (JOB_CACHED_TOKENS, JOB_CONTEXT_TOKENS, JOB_PROMPT_TOKENS, JOB_REQUESTS, JOB_ROUNDS,
                                     JOBS_GOOD, TOOL_CALLS, TOOL_CALLS_INVALID)
from latscope.scenario import scrub

MAX_ERROR_EXAMPLES = 5  # distinct error messages kept per kind
NO_LIMIT = 1 << 62  # an objective that is not set: every value meets it

GoodputLimits = tuple[int, int, int, int, int]  # goodput objectives in µs: (ttft, tpot, itl, latency, ttfot), NO_LIMIT when unset


def goodput_limits(objectives: dict[str, float] | None) -> GoodputLimits | None:
    """A class's goodput objectives ({"ttft_ms": 500.0, ...}, as Scenario.goodput_objectives gives
    them) as whole µs, the histograms' unit: floor(ms × 1000), so `value_us <= limit` is
    `value_us <= objective_ms × 1000` for every integer value_us. None: the class has none."""
    if not objectives:
        return None
    return tuple(int(objectives[name] * 1000 + 1e-6) if name in objectives else NO_LIMIT  # type: ignore[return-value]
                 for name in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "ttfot_ms"))


class IntervalRecorder:
    """Records outcomes into the current interval; `take()` ends the interval."""

    def __init__(self, class_names: list[str], probes: frozenset[int] = frozenset(),
                 goodput: list[dict[str, float] | None] | None = None, secrets: list[str] | None = None):
        self.class_names = class_names
        self.secrets = secrets or []  # scenario.secret_values: scrubbed from what the target said
        self._part_names: dict[str, str] = {}  # a Server-Timing name -> its metric name, scrubbed once
        self.probes = probes  # plan indices of requests reported one by one (plan.after_idle)
        # per class index: its goodput objectives in µs (goodput_limits), None for a class without
        self.goodput = [goodput_limits(g) for g in goodput] if goodput else [None] * len(class_names)
        self.recorder = Recorder()
        self.counters: dict[tuple[int, bool], list[int]] = {}
        self.turns: dict[tuple[int, int, bool], list[int]] = {}  # (class, turn, warm-up) -> TURN_COUNTERS
        self._turn_names: dict[tuple[int, int], str] = {}  # (class, turn) -> its class#turn name
        self.error_examples: dict[str, list[str]] = {}  # for the whole run, not per interval
        # replica id -> (perf_counter_ns, latency µs or None for an error) of its first response, since the last report
        self.replicas_new: dict[str, tuple[int, int | None]] = {}
        self.first_ok: tuple[int, int] | None = None  # (end ns, latency µs) of this worker's first successful response
        self.probes_new: list[Probe] = []  # outcomes of probe requests, since the last report
        self._replica_classes: dict[str, str] = {}  # replica id -> its class under REPLICA_METRIC
        self.log: RequestLog | None = None  # the per-request records (request_log.py), when the run keeps them

    def _row(self, cls: int, warmup: bool) -> list[int]:
        """This interval's counters of (class, warmup)."""
        row = self.counters.get((cls, warmup))
        if row is None:
            row = self.counters[(cls, warmup)] = [0] * len(COUNTERS)
        return row

    def count(self, cls: int, warmup: bool, counter: int, n: int = 1) -> None:
        """`n` more of `counter` (an index of COUNTERS: SENT, DROPPED, ...) for (class, warmup)."""
        self._row(cls, warmup)[counter] += n

    def record(self, request: Request, outcome: Outcome) -> None:
        """A sent request's outcome."""
        name, warm = self.class_names[request.cls], request.warmup
        record = self.recorder.record
        if request.turn and request.session.reports_to is None:  # by round: a job's own, not its sub-agents'
            self._record_turn(request, outcome)
        send_lag_us = (outcome.sent_ns - request.intended_ns) // 1000
        record("send_lag", name, send_lag_us, warm)
        latency_us = (outcome.end_ns - request.intended_ns) // 1000
        service_us = encode_us = inclusive_us = decode_us = network_us = NULL
        tokens = (NULL, NULL, NULL)
        if request.seq in self.probes:
            self.probes_new.append(Probe(request.seq, outcome.end_ns, latency_us, outcome.error, outcome.replica))
        replica = outcome.replica
        if replica is not None:
            replica = self._replica_classes.get(replica) or self._first_seen(
                replica, outcome.end_ns, latency_us if outcome.error is None else None)
        if outcome.error is None:
            self.count(request.cls, warm, COMPLETED)
            self._record_sources(request, outcome)
            if self.first_ok is None:
                self.first_ok = (outcome.end_ns, latency_us)
            record("latency", name, latency_us, warm)
            if replica is not None:
                record(REPLICA_METRIC, replica, latency_us, warm)
            service_ns = outcome.end_ns - outcome.sent_ns
            service_us = service_ns // 1000
            record("service_time", name, service_us, warm)
            if outcome.items:  # a batch request (embeddings, rerank): its items and input tokens, nothing generated
                row = self._row(request.cls, warm)
                row[ITEMS] += outcome.items
                row[PROMPT_TOKENS] += outcome.prompt_tokens or request.prompt_tokens
            elif (outcome.token_ns is not None or outcome.output_tokens or outcome.tokens_from_usage
                    or outcome.output_by_tokenizer):
                tokens = self._record_tokens(request, outcome, name)
            encode_ns = outcome.encode_ns
            if encode_ns:
                encode_us = encode_ns // 1000
                record("encode", name, encode_us, warm)
                ahead_ns = min(encode_ns, max(0, request.intended_ns - request.prepared_ns + encode_ns))
                inclusive_us = (outcome.end_ns - request.intended_ns + ahead_ns) // 1000
                record("client_inclusive", name, inclusive_us, warm)
            if outcome.decode_ns:
                decode_us = outcome.decode_ns // 1000
                record("decode", name, decode_us, warm)
            if outcome.server_timing:
                for part, ms in outcome.server_timing.items():
                    record(self._part_names.get(part) or self._part_metric(part), name, ms * 1000, warm)
                if not outcome.token_ns:  # a stream's Server-Timing covers only its start
                    server_ms = outcome.server_timing.get("total") or sum(outcome.server_timing.values())
                    rest_ns = service_ns - outcome.decode_ns - int(server_ms * 1e6)
                    network_us = max(0, rest_ns) // 1000
                    record("network", name, network_us, warm)
            limits = self.goodput[request.cls]
            if limits is not None and _is_good(request, outcome, latency_us, limits):
                row = self._row(request.cls, warm)
                row[GOOD] += 1
                row[GOOD_OUTPUT_TOKENS] += outcome.output_tokens or len(outcome.token_ns or ())
            elif limits is not None and request.session is not None:  # its job is not good either (chat.py)
                (request.session.reports_to or request.session).missed = True
        else:
            self.count(request.cls, warm, ERROR_INDEX[outcome.error])
            examples = self.error_examples.setdefault(outcome.error, [])
            if len(examples) < MAX_ERROR_EXAMPLES:
                reason = scrub(outcome.reason, self.secrets)
                if reason not in examples:
                    examples.append(reason)
            latency_us = NULL
        if self.log is not None:
            self.log.add(request, outcome, (latency_us, service_us, send_lag_us, encode_us, decode_us, network_us,
                                            inclusive_us), tokens)

    def cancelled(self, request: Request) -> None:
        """A sent request cancelled at the teardown (in flight when the run was torn down)."""
        self.count(request.cls, request.warmup, CANCELLED)
        if self.log is not None:
            self.log.cancelled(request)

    def _part_metric(self, part: str) -> str:
        """The metric of a Server-Timing part, its name scrubbed (once per name)."""
        metric = self._part_names[part] = f"server.{scrub(part, self.secrets)}"
        return metric

    def _first_seen(self, replica: str, end_ns: int, latency_us: int | None) -> str:
        """Note a replica's first response; its class under REPLICA_METRIC (see replica_class)."""
        seen = scrub(replica, self.secrets)
        self.replicas_new[seen] = (end_ns, latency_us)
        cls = replica_class(seen) if len(self._replica_classes) < MAX_REPLICA_CLASSES else OTHER_REPLICAS
        self._replica_classes[replica] = cls
        return cls

    def _record_tokens(self, request: Request, outcome: Outcome, name: str) -> tuple[int, int, int]:
        """Streams: TTFT from the intended time, every inter-token gap, TPOT, and from the first content
        chunk TTFOT, reasoning time and content TPOT. All: the token counters (the module docstring).
        (ttft, tpot, the worst gap) µs as recorded, NULL where not."""
        record, warm, times = self.recorder.record, request.warmup, outcome.token_ns
        tokens = outcome.output_tokens or len(times or ())
        reasoning = outcome.reasoning_tokens if outcome.reasoning_tokens >= 0 else outcome.reasoning_chunks
        ttft_us = tpot_us = worst_us = NULL
        if times:
            first = times[0]
            ttft_us = (first - request.intended_ns) // 1000
            record("ttft", name, ttft_us, warm)
            previous = first
            for t in times[1:]:
                gap_us = (t - previous) // 1000
                record("itl", name, gap_us, warm)
                if gap_us > worst_us:
                    worst_us = gap_us
                previous = t
            if tokens > 1:
                tpot_us = (outcome.end_ns - first) // 1000 // (tokens - 1)
                record("tpot", name, tpot_us, warm)
            content = outcome.content_ns
            if content:
                record("ttfot", name, (content - request.intended_ns) // 1000, warm)
                if outcome.reasoning_chunks:
                    record("reasoning_time", name, (content - first) // 1000, warm)
                if tokens - reasoning > 1:
                    record("content_tpot", name, (outcome.end_ns - content) // 1000 // (tokens - reasoning - 1), warm)
        row = self._row(request.cls, warm)
        row[TOOL_CALLS] += outcome.tool_calls
        row[TOOL_CALLS_INVALID] += outcome.tool_calls_invalid
        row[REASONING_TOKENS] += reasoning
        if not tokens and not outcome.items:
            row[EMPTY] += 1
        row[PROMPT_TOKENS] += outcome.prompt_tokens or request.prompt_tokens
        row[OUTPUT_TOKENS] += tokens
        if outcome.tokens_from_usage:
            row[OUTPUT_TOKENS_USAGE] += tokens
        if outcome.cached_tokens >= 0:
            row[CACHED_TOKENS] += outcome.cached_tokens
            row[CACHE_REPORTED] += outcome.prompt_tokens
        return ttft_us, tpot_us, worst_us

    def _record_turn(self, request: Request, outcome: Outcome) -> None:
        """A session turn's outcome, by turn (the module docstring)."""
        key = (request.cls, request.turn)
        name = self._turn_names.get(key) or self._turn_names.setdefault(key, turn_class(self.class_names[request.cls], request.turn))
        row = self.turns.get((*key, request.warmup))
        if row is None:
            row = self.turns[(*key, request.warmup)] = [0] * len(TURN_COUNTERS)
        if outcome.error is not None:
            row[TURN_ERRORS] += 1
            return
        row[TURN_COMPLETED] += 1
        row[TURN_PROMPT] += outcome.prompt_tokens or request.prompt_tokens
        if outcome.cached_tokens >= 0:
            row[TURN_CACHED] += outcome.cached_tokens
            row[TURN_REPORTED] += outcome.prompt_tokens
        record, warm, intended = self.recorder.record, request.warmup, request.intended_ns
        record("turn.latency", name, (outcome.end_ns - intended) // 1000, warm)
        times = outcome.token_ns
        if times:
            record("turn.ttft", name, (times[0] - intended) // 1000, warm)
            if outcome.content_ns:
                record("turn.ttfot", name, (outcome.content_ns - intended) // 1000, warm)
            for a, b in zip(times, times[1:]):
                record("turn.itl", name, (b - a) // 1000, warm)
            tokens = outcome.output_tokens or len(times)
            if tokens > 1:
                record("turn.tpot", name, (outcome.end_ns - times[0]) // 1000 // (tokens - 1), warm)

    def _record_sources(self, request: Request, outcome: Outcome) -> None:
        """A completed request's token counts: where they came from, and the server's against the plan
        (results.schema.TOKEN_SOURCE_COUNTERS). Only requests that carry tokens (a planned prompt or
        max_tokens, a count the server said, token chunks) count; a batch request's (Outcome.items) prompt
        only. A session's turns are not compared with the plan: they send more than their planned new text."""
        planned, said = request.prompt_tokens, outcome.prompt_from_usage or outcome.prompt_tokens > 0
        streamed = outcome.token_ns is not None
        if not (planned or request.output_tokens or said or streamed or outcome.output_tokens
                or outcome.output_by_tokenizer):
            return
        row = self._row(request.cls, request.warmup)
        if said:
            row[PROMPT_FROM_USAGE] += 1
            if planned and request.session is None:  # a session's turn also sends its history and shared prefix
                diff = outcome.prompt_tokens - planned
                row[PROMPT_CHECKED] += 1
                if diff:
                    row[PROMPT_DIFFER] += 1
                    at, top = (PROMPT_ABOVE, PROMPT_ABOVE_MAX) if diff > 0 else (PROMPT_BELOW, PROMPT_BELOW_MAX)
                    row[at] += abs(diff)
                    row[top] = max(row[top], abs(diff))  # MAX_COUNTERS: merged by the larger (add_counters)
        elif planned:
            row[PROMPT_FROM_PLAN] += 1
        if outcome.items:  # a batch request (embeddings, rerank) generates nothing
            return
        if outcome.tokens_from_usage or outcome.output_by_tokenizer:
            row[OUTPUT_FROM_USAGE if outcome.tokens_from_usage else OUTPUT_BY_TOKENIZER] += 1
            asked, got = request.output_tokens, outcome.output_tokens
            if asked:
                row[OUTPUT_CHECKED] += 1
                if got < asked:
                    row[OUTPUT_SHORT] += 1
                    row[OUTPUT_SHORT_TOKENS] += asked - got
                elif got > asked:
                    row[OUTPUT_LONG] += 1
        elif streamed:
            row[OUTPUT_FROM_CHUNKS] += 1
        else:
            row[OUTPUT_UNCOUNTED] += 1

    def record_session(self, cls: int, warmup: bool, duration_us: int) -> None:
        """A completed session's duration (turn 1's intended time to its last answer's end)."""
        self.recorder.record("session_duration", self.class_names[cls], duration_us, warmup)

    def record_job(self, cls: int, warmup: bool, job: Conversation, rounds: int, context_tokens: int,
                   duration_us: int, good: bool) -> None:
        """An agent's completed job (chat.py): its time, and its critical path's model and tool parts
        (their sums are the job time: each round is intended at the last answer's end + its tool wait),
        its rounds and requests, the context of its last round, the prompt and cached tokens of its rounds,
        whether it met every objective (`good`)."""
        name, record = self.class_names[cls], self.recorder.record
        record("job_time", name, duration_us, warmup)
        record("job_model_time", name, job.model_ns // 1000, warmup)
        record("job_tool_time", name, job.tool_ns // 1000, warmup)
        row = self._row(cls, warmup)
        row[JOB_ROUNDS] += rounds
        row[JOB_CONTEXT_TOKENS] += context_tokens
        row[JOB_PROMPT_TOKENS] += job.prompt_tokens
        row[JOB_CACHED_TOKENS] += job.cached_tokens
        row[JOBS_GOOD] += good
        row[JOB_REQUESTS] += job.requests

    def record_generator(self, metric: str, value_us: int, warmup: bool) -> None:
        """A measurement of the generator itself (loop_lag, gc_pause), under class "all"; one that just
        ended (the engine records them as they end), so the request log can lay it over requests."""
        self.recorder.record(metric, "all", value_us, warmup)
        if self.log is not None:
            self.log.stall(value_us)

    def take(self, interval: int, in_flight: int) -> IntervalReport:
        """Everything recorded since the last take, as interval `interval`'s report; starts the next."""
        histograms, clamped = self.recorder.snapshot()
        counters, self.counters = self.counters, {}
        replicas, self.replicas_new = self.replicas_new, {}
        probes, self.probes_new = self.probes_new, []
        turns, self.turns = self.turns, {}
        if self.log is not None:
            self.log.on_interval()
        return IntervalReport(interval, histograms, clamped, counters, in_flight, replicas, probes, self.first_ok,
                              turns=turns)


def _is_good(request: Request, outcome: Outcome, latency_us: int, limits: GoodputLimits) -> bool:
    """Whether a successful request met every goodput objective of its class (the module docstring)."""
    ttft_max, tpot_max, itl_max, latency_max, ttfot_max = limits
    if latency_us > latency_max:
        return False
    times = outcome.token_ns
    if not times:  # the whole answer is its first token: ttft = ttfot = latency, no gaps, tpot (end − end) = 0
        return latency_us <= ttft_max and latency_us <= ttfot_max
    first = times[0]
    if (first - request.intended_ns) // 1000 > ttft_max:
        return False
    if ttfot_max != NO_LIMIT and ((outcome.content_ns or outcome.end_ns) - request.intended_ns) // 1000 > ttfot_max:
        return False
    tokens = outcome.output_tokens or len(times)
    if tokens > 1 and (outcome.end_ns - first) // 1000 // (tokens - 1) > tpot_max:
        return False
    if itl_max != NO_LIMIT:
        previous = first
        for t in times[1:]:
            if (t - previous) // 1000 > itl_max:
                return False
            previous = t
    return True
