"""The two records that flow between the engine and the protocols.

A `Request` is what the engine decides (when and what to send); an `Outcome` is what a protocol
observed (when it went out, when it ended, how it went). Like vegeta's `Result`, nothing else crosses
from the attack side to the recording side, so protocols never record and the engine never parses.
"""

from __future__ import annotations

from dataclasses import dataclass

# Error kinds, in the order summary.json lists them. Every failed request gets exactly one.
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "protocol")


@dataclass(slots=True)
class Request:
    seq: int  # position in the run's planned schedule (0-based, across all workers)
    intended_ns: int  # perf_counter_ns when it should be sent (the open-loop clock)
    cls: int  # index into the scenario's workload classes
    warmup: bool  # belongs to a warm-up phase: recorded apart, kept out of statistics
    prompt_tokens: int = 0  # planned prompt length in tokens (0: the class sends no prompt)
    output_tokens: int = 0  # planned output length, sent as max_tokens (0: not set)
    item: int = 0  # which dataset row / tensor of the class's pool (taken modulo the pool's size)


@dataclass(slots=True)
class Outcome:
    sent_ns: int  # perf_counter_ns when the protocol began sending (before taking or opening a connection)
    end_ns: int  # perf_counter_ns when the whole response was read (or the failure was seen)
    status: int = 0  # HTTP status (0 when no response)
    error: str | None = None  # one of ERROR_KINDS, None on success
    reason: str = ""  # human-readable detail for errors
    bytes_out: int = 0
    bytes_in: int = 0
    # Streaming (token) responses. A "token" is a chunk that carried generated text: servers may pack
    # several tokens in one chunk, so the ITL gaps are between chunks as the client saw them.
    token_ns: list[int] | None = None  # perf_counter_ns of every token chunk's arrival, in order
    output_tokens: int = 0  # from the server's usage when it sent one, else the token chunks counted
    tokens_from_usage: bool = False
    prompt_tokens: int = 0  # the server's usage.prompt_tokens (0 when not reported)
    # Serialization, timed by the client around its own encode/decode (0: not measured).
    encode_ns: int = 0
    decode_ns: int = 0
    server_timing: dict[str, float] | None = None  # Server-Timing durations (ms) by name
    replica: str | None = None  # the replica that answered (X-Replica-Id), when the server says
