"""The records that flow out of a worker, in pipeline order.

A `Request` is what the engine decides (when and what to send); an `Outcome` is what a protocol
observed (when it went out, when it ended, how it went). Like vegeta's `Result`, nothing else crosses
from the attack side to the recording side, so protocols never record and the engine never parses.

An `IntervalReport` is what a worker measured in one reporting interval (intervals.py makes it from
the outcomes); it crosses from the worker process to the run's parent (run/collector.py), pickled
through a queue, with the other worker messages below. Times are perf_counter_ns (CLOCK_MONOTONIC:
one clock for every process of the machine), durations µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latscope.recorder import Sparse


@dataclass(slots=True)
class Request:
    seq: int  # position in the run's planned schedule (0-based, across all workers)
    intended_ns: int  # perf_counter_ns when it should be sent (the open-loop clock)
    cls: int  # index into the scenario's workload classes
    warmup: bool  # belongs to a warm-up phase: recorded apart, kept out of statistics
    prompt_tokens: int = 0  # planned prompt length in tokens (0: the class sends no prompt)
    output_tokens: int = 0  # planned output length, sent as max_tokens (0: not set)
    item: int = 0  # which dataset row / tensor of the class's pool (taken modulo the pool's size)
    blocks: tuple[Any, int] | None = None  # a Mooncake trace's prompt: (its block ids, tokens a block); see mooncake.py
    turn: int = 0  # a session's turn, from 1 (0: not part of a session)
    session: Conversation | None = None  # the session it is a turn of
    # Filled by the client's `prepare`, ahead of the intended time (the engine's look-ahead window),
    # so that at that time sending is a stamp and a write.
    wire: Any = None  # the request ready to go, in the client's own form (bytes for HTTP); None: not prepared
    wire_bytes: int = 0  # its size, which the look-ahead window bounds
    encode_ns: int = 0  # how long the client took to build it: the `encode` metric (0: nothing encoded)
    prepared_ns: int = 0  # perf_counter_ns when it was ready


@dataclass(slots=True)
class Outcome:
    sent_ns: int  # perf_counter_ns when the protocol began sending (before taking or opening a connection)
    end_ns: int  # perf_counter_ns when the whole response was read (or the failure was seen)
    status: int = 0  # HTTP status (0 when no response)
    error: str | None = None  # one of results.schema.ERROR_KINDS, None on success
    reason: str = ""  # human-readable detail for errors
    bytes_out: int = 0
    bytes_in: int = 0
    # Streaming (token) responses. A "token" is a chunk that carried generated text: servers may pack
    # several tokens in one chunk, so the ITL gaps are between chunks as the client saw them.
    token_ns: list[int] | None = None  # perf_counter_ns of every token chunk's arrival, in order
    output_tokens: int = 0  # from the server's usage when it sent one, else the token chunks counted
    tokens_from_usage: bool = False
    prompt_tokens: int = 0  # the server's usage.prompt_tokens (0 when not reported)
    # Serialization, timed by the client around its own work (0: not measured): the encode is the
    # request's (Request.encode_ns, done in `prepare`), reported here with the rest.
    encode_ns: int = 0
    decode_ns: int = 0
    server_timing: dict[str, float] | None = None  # Server-Timing durations (ms) by name
    replica: str | None = None  # the replica that answered (X-Replica-Id), when the server says
    cached_tokens: int = -1  # prompt tokens the server took from its prefix cache (usage.prompt_tokens_details); -1: not said
    first_byte_ns: int = 0  # perf_counter_ns when the response's first bytes arrived (0: unknown)
    connection: int = -1  # which of the client's connections carried it (-1: unknown)
    # Reasoning streams: chunks that carried reasoning (chat `reasoning_content` / `reasoning`, Responses
    # `response.reasoning_*.delta`, Messages `thinking_delta`) are in token_ns with the content chunks;
    # the answer itself starts at content_ns.
    reasoning_chunks: int = 0  # token chunks that carried reasoning, not answer text
    content_ns: int = 0  # perf_counter_ns of the first chunk of the answer itself (0: none, or not a stream)
    reasoning_tokens: int = -1  # the server's usage count of reasoning tokens (-1: not said)
    prompt_from_usage: bool = False  # prompt_tokens is the server's own count (usage), not the plan's
    output_by_tokenizer: bool = False  # output_tokens counted by workload.tokenizer on the answer's text
    items: int = 0  # a batch protocol's items in the request: embeddings' inputs, rerank's documents (0: none)
    tool_calls: int = 0  # the tool calls the answer made (streamed: their arguments accumulated)
    tool_calls_invalid: int = 0  # of those, the ones whose arguments do not parse as a JSON object


@dataclass(slots=True)
class Conversation:
    """One session in progress in a worker (chat.py keeps them; sessions.py planned their turns).
    The client builds each turn from it and adds the turn, and after a successful answer the answer,
    to `history`, in the client's own form (for the OpenAI client: the serialized messages so far),
    so a long history is appended to, never serialized again. `carried` is that history's size in
    bytes, which the client keeps up to date and chat.py bounds (session.max_history_bytes,
    limits.max_carried_bytes_per_worker). An agent's job is one too (docs/agents.md)."""

    id: int  # the session's number: the plan row it started from, or a closed-loop user's next
    cls: int
    carry: bool  # each turn carries the earlier turns and their answers
    prefix: int  # shared-prefix variant, -1: none
    turns: int  # how many turns it plans
    started_ns: int  # turn 1's intended time
    user: int = -1  # the closed-loop user running it (-1: an open-loop session)
    history: Any = None  # the client's form of the turns so far, and the one being sent (None: none yet)
    carried: int = 0  # bytes `history` holds (the client's count)
    # An agent's job (docs/agents.md): the tool calls of the last answer, (id, name) each, which the next
    # round's tool result answers (the client sets them with the answer and takes them with the next
    # round); its sub-agents' reports; its critical path so far (chat.py): rounds' latencies and tool
    # waits, prompt and cached tokens.
    calls: tuple[tuple[str, str], ...] = ()
    reports_to: Conversation | None = None  # a sub-agent: the job it reports to (its last answer, `answer`, kept for it)
    answer: str = ""
    reports: list[str] = field(default_factory=list)  # a job's sub-agents' final answers, for its next round
    missed: bool = False  # a round of the job (or of its sub-agents) missed the class's goodput objectives
    requests: int = 0  # the requests the job sent, its sub-agents' included
    model_ns: int = 0
    tool_ns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Probe:
    """The outcome of a request that came after an idle stretch (plan.after_idle), reported on its own."""

    seq: int  # position in the planned schedule
    end_ns: int
    latency_us: int
    error: str | None  # an error kind, None on success
    replica: str | None


@dataclass(slots=True)
class IntervalReport:
    """One worker's measurements of one interval, [k·interval_s, (k+1)·interval_s) on the run's clock.
    Every worker sends one per interval, even an empty one, so interval k is complete once all have."""

    interval: int  # k
    histograms: dict[tuple[str, str, bool], Sparse]  # (metric, class name, warm-up) -> the non-zero counters recorded
    clamped: dict[str, int]  # metric -> values clamped to the histogram's range
    counters: dict[tuple[int, bool], list[int]]  # (class index, warm-up) -> results.schema.COUNTERS
    in_flight: int  # requests in flight at the interval's end
    replicas: dict[str, tuple[int, int | None]]  # replica id -> (end_ns, latency µs; None: an error) of its first response
    probes: list[Probe]
    first_ok: tuple[int, int] | None  # (end_ns, latency µs) of this worker's first successful response so far
    worker: int = -1  # set by the worker process that sends it
    turns: dict[tuple[int, int, bool], list[int]] = field(default_factory=dict)  # (class, turn, warm-up) -> results.schema.TURN_COUNTERS


@dataclass(slots=True)
class WorkerReady:
    worker: int
    planned: int  # requests of the plan this worker will send


@dataclass(slots=True)
class WorkerDone:
    """A worker's last message, after its last IntervalReport."""

    worker: int
    not_sent: int  # planned requests it did not send (the run was stopped)
    error_examples: dict[str, list[str]] = field(default_factory=dict)  # error kind -> distinct messages (a few)
    unaccounted: int = 0  # requests sent but counted neither completed, an error nor cancelled: a bug when not 0


@dataclass(slots=True)
class WorkerFailed:
    worker: int
    error: str  # the traceback


WorkerMessage = IntervalReport | WorkerReady | WorkerDone | WorkerFailed

