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


@dataclass(slots=True)
class Outcome:
    sent_ns: int  # perf_counter_ns when the protocol began sending (before taking or opening a connection)
    end_ns: int  # perf_counter_ns when the whole response was read (or the failure was seen)
    status: int = 0  # HTTP status (0 when no response)
    error: str | None = None  # one of ERROR_KINDS, None on success
    reason: str = ""  # human-readable detail for errors
    bytes_out: int = 0
    bytes_in: int = 0
