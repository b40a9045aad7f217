"""The vocabulary of a results directory, in one place: every file name, column, counter, metric and
event that the files of a run are made of.

A results directory is the contract between measuring and analysing: what writes it (the engine,
the run) and what reads it (analysis, report, gate) meet here and nowhere else, so a reader never
imports the writer to learn the name of a column, and a renamed constant cannot quietly break the
reading of last month's runs. Names here are added, never renamed (summary.json's
`schema_version` says when a reader must be upgraded). Nothing here does anything; it is data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMA_VERSION = 1

# -- the files ------------------------------------------------------------------------------------

SUMMARY = "summary.json"  # what CI and other tools read (keys are added, never renamed)
SCENARIO = "scenario.yaml"  # the resolved scenario, secrets redacted
HLOG = "histograms.hlog"  # HdrHistogram interval log 1.3, one `Tag=metric/class` line per interval
TIMESERIES = "timeseries.parquet"  # one row per interval × metric × class (TIMESERIES_COLUMNS)
TELEMETRY = "telemetry.parquet"  # one row per sample (TELEMETRY_COLUMNS)
EVENTS = "events.jsonl"  # one JSON object a line (EVENT_TYPES below)
SCHEDULE = "schedule.parquet"  # the realized schedule: one row per planned request (SCHEDULE_COLUMNS)
NODES = "nodes.parquet"  # a distributed run's machines' health: one row per interval per node (NODE_COLUMNS)
REQUESTS = "requests.parquet"  # one row per request sent (REQUEST_COLUMNS)
REQUEST_PARTS = ".requests"  # the workers' part files of requests.parquet while the run lasts
EXPLAIN = "explain.json"  # `latscope explain`: why the tail is what it is (analysis/explain.py)
TARGET_LOG = "target.log"  # output of a target the scenario launched
REPORT = "report.html"  # written by `latscope run` and `latscope report`
SUMMARY_MD = "summary.md"  # the report's Markdown summary

# -- requests: outcomes and counters --------------------------------------------------------------

# Error kinds, in the order summary.json lists them. Every failed request gets exactly one.
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "protocol")

# Per-interval counters of each (class, warm-up) pair, in this order: in the workers' interval
# reports (as lists indexed by the constants below) and as timeseries.parquet columns. The token
# counters add up the tokens of completed requests (output_tokens_usage: those whose count came
# from the server's usage report rather than from counting chunks). The goodput counters: `good`,
# requests of a class with goodput objectives that succeeded and met every one (intervals.py judges
# each request as it completes), and `good_output_tokens`, their output tokens; 0 for a class
# without objectives. New counters go at the end (a counter's index never moves), and so do their
# timeseries.parquet columns (TIMESERIES_COLUMNS); a results directory written before a counter
# existed has no column for it, which readers take as absent, not as 0.
#
# Sessions (sessions.py, chat.py) and the prefix cache: `cached_tokens`, the prompt tokens the server
# said it took from its prefix cache (usage.prompt_tokens_details.cached_tokens), and
# `cache_reported_prompt_tokens`, the prompt tokens of the requests it said that of (the hit rate is
# their ratio); per session, counted under its class when it starts, and when it ends in one of three
# ways: completed (every turn answered), abandoned (a turn failed, or was dropped at the in-flight cap:
# its later turns are not sent), cut (its next turn was due after the run's planned end, or the run was
# stopped), history_limit (its carried history passed session.max_history_bytes, or the worker's
# histories together limits.max_carried_bytes_per_worker: its later turns are not sent; added last,
# so a file written before it lacks the column); `turns_not_sent`, the turns abandoned, cut and
# history_limit sessions did not send.
#
# Reasoning and answers (intervals.py): `reasoning_tokens`, the reasoning tokens among the output
# tokens of completed requests (the server's usage.completion_tokens_details.reasoning_tokens when it
# said, else the reasoning chunks counted); `empty`, completed answers with 0 output tokens (a stream
# that ended without a token chunk, a whole answer with nothing in it: completed, not errors, and
# without a TTFT); `items`, the items of completed batch requests (embeddings' inputs, rerank's
# documents: Outcome.items).
TOKEN_COUNTERS = ("prompt_tokens", "output_tokens", "output_tokens_usage")
GOODPUT_COUNTERS = ("good", "good_output_tokens")
CACHE_COUNTERS = ("cached_tokens", "cache_reported_prompt_tokens")
SESSION_COUNTERS = ("sessions_started", "sessions_completed", "sessions_abandoned", "sessions_cut", "turns_not_sent",
                    "sessions_history_limit")
REASONING_COUNTERS = ("reasoning_tokens", "empty", "items")
#
# Agents (intervals.py): `tool_calls`, the tool calls completed answers made, and `tool_calls_invalid`,
# those whose arguments did not parse as a JSON object (protocols/tools.py); of an agent class's
# completed jobs (chat.py; how many: sessions_completed), `job_rounds` (their rounds summed), `job_context_tokens` (the prompt
# tokens of each one's last round), `job_prompt_tokens` and `job_cached_tokens` (over their rounds
# whose server said what it cached: the jobs' cached share), `jobs_good` (those that met every objective:
# agent.max_job_time and, in each round, the class's goodput objectives), `job_requests` (the requests
# they sent, their sub-agents' included).
AGENT_COUNTERS = ("tool_calls", "tool_calls_invalid", "job_rounds", "job_context_tokens",
                  "job_prompt_tokens", "job_cached_tokens", "jobs_good", "job_requests")
#
# Where token counts came from, and how far the server's were from the plan (intervals.py, over
# completed requests; summary.json tokens.<class>.counts). Prompt: `prompt_from_usage` (the server
# said: usage), `prompt_from_plan` (it did not: the plan's count stands in, the tokenizer's for a
# dataset class with workload.tokenizer); of those with both (sessions' turns left out: they send a
# history and a shared prefix besides their planned text), `prompt_checked`, `prompt_differ`
# (server ≠ plan), `prompt_above` / `prompt_below` (sums of server − plan where positive / of plan −
# server where positive: mean = (above − below) / checked), `prompt_above_max` / `prompt_below_max`
# (the largest of each: MAX_COUNTERS, merged by taking the larger, never summed: add_counters).
# Output: `output_from_usage`, `output_by_tokenizer` (workload.tokenizer on the answer's text),
# `output_from_chunks` (a stream's chunks counted), `output_uncounted` (a whole answer that said
# nothing); of those with a max_tokens asked and a count from usage or the tokenizer,
# `output_checked`, `output_short` (fewer tokens than asked), `output_short_tokens` (the tokens they
# fell short by, summed), `output_long` (more than asked).
TOKEN_SOURCE_COUNTERS = ("prompt_from_usage", "prompt_from_plan", "prompt_checked", "prompt_differ", "prompt_above",
                         "prompt_below", "prompt_above_max", "prompt_below_max", "output_from_usage",
                         "output_by_tokenizer", "output_from_chunks", "output_uncounted", "output_checked",
                         "output_short", "output_short_tokens", "output_long")
MAX_COUNTERS = ("prompt_above_max", "prompt_below_max")
_FIRST_COUNTERS = ("sent", "completed", "dropped", "late", "cancelled", *ERROR_KINDS, *TOKEN_COUNTERS)
COUNTERS = (*_FIRST_COUNTERS, *GOODPUT_COUNTERS, *CACHE_COUNTERS, *SESSION_COUNTERS, *REASONING_COUNTERS,
            *TOKEN_SOURCE_COUNTERS, *AGENT_COUNTERS)
SENT, COMPLETED, DROPPED, LATE, CANCELLED = range(5)
ERROR_INDEX = {kind: 5 + i for i, kind in enumerate(ERROR_KINDS)}
PROMPT_TOKENS, OUTPUT_TOKENS, OUTPUT_TOKENS_USAGE = (COUNTERS.index(c) for c in TOKEN_COUNTERS)
GOOD, GOOD_OUTPUT_TOKENS = (COUNTERS.index(c) for c in GOODPUT_COUNTERS)
CACHED_TOKENS, CACHE_REPORTED = (COUNTERS.index(c) for c in CACHE_COUNTERS)
SESSIONS_STARTED, SESSIONS_COMPLETED, SESSIONS_ABANDONED, SESSIONS_CUT, TURNS_NOT_SENT, SESSIONS_HISTORY_LIMIT = (
    COUNTERS.index(c) for c in SESSION_COUNTERS)
REASONING_TOKENS, EMPTY, ITEMS = (COUNTERS.index(c) for c in REASONING_COUNTERS)
(PROMPT_FROM_USAGE, PROMPT_FROM_PLAN, PROMPT_CHECKED, PROMPT_DIFFER, PROMPT_ABOVE, PROMPT_BELOW, PROMPT_ABOVE_MAX,
 PROMPT_BELOW_MAX, OUTPUT_FROM_USAGE, OUTPUT_BY_TOKENIZER, OUTPUT_FROM_CHUNKS, OUTPUT_UNCOUNTED, OUTPUT_CHECKED,
 OUTPUT_SHORT, OUTPUT_SHORT_TOKENS, OUTPUT_LONG) = (COUNTERS.index(c) for c in TOKEN_SOURCE_COUNTERS)
MAX_INDEX = tuple(COUNTERS.index(c) for c in MAX_COUNTERS)
(TOOL_CALLS, TOOL_CALLS_INVALID, JOB_ROUNDS, JOB_CONTEXT_TOKENS, JOB_PROMPT_TOKENS,
 JOB_CACHED_TOKENS, JOBS_GOOD, JOB_REQUESTS) = (COUNTERS.index(c) for c in AGENT_COUNTERS)


def add_counters(total, row):  # numpy int64 arrays of COUNTERS (total None: none yet)
    """The one way two rows of COUNTERS merge (workers, intervals, nodes): summed, except MAX_COUNTERS,
    which take the larger. Returns the merged row (a new array)."""
    if total is None:
        return row.copy()
    merged = total + row
    merged[list(MAX_INDEX)] = [max(total[i], row[i]) for i in MAX_INDEX]
    return merged

# Per turn of a session (intervals.py, IntervalReport.turns): (class index, turn, warm-up) -> these
# counters of the turn's requests; summary.json's sessions.<class>.by_turn.
TURN_COUNTERS = ("completed", "errors", "prompt_tokens", "cached_tokens", "cache_reported_prompt_tokens")
TURN_COMPLETED, TURN_ERRORS, TURN_PROMPT, TURN_CACHED, TURN_REPORTED = range(len(TURN_COUNTERS))

# -- summary.json's goodput -------------------------------------------------------------------------
# `goodput`: {} when the scenario set no goodput objectives; else one entry per class that has
# objectives, and "all" (those classes together), each with GOODPUT_STATS (outside warm-up):
# good (requests that succeeded and met every objective), total (sent + dropped), fraction (good /
# total, null when total is 0), rps (good / measured window s), output_tokens_per_s (the good
# requests' output tokens / window); a class's entry also has `objectives` ({"ttft_ms": ..., ...},
# only those set). SLOs read fraction and rps (`metric: goodput`).
GOODPUT_STATS = ("good", "total", "fraction", "rps", "output_tokens_per_s")

# -- statistics and tables ------------------------------------------------------------------------

ALL = "all"  # the class of every request together (the lossless merge of the per-class histograms)
# The statistics of one histogram (recorder.summarize), as summary.json's per metric × class keys and
# timeseries.parquet's columns; ms, rounded to µs.
ROW_STATS = ("count", "min_ms", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99.9_ms", "max_ms")
# Columns are added at the end, so the columns of a file written by older code are a prefix of these.
TIMESERIES_COLUMNS = ("interval_start_s", "interval_s", "phase", "metric", "class", *ROW_STATS, "scheduled",
                      *_FIRST_COUNTERS, "errors", "in_flight", *GOODPUT_COUNTERS, *CACHE_COUNTERS, *SESSION_COUNTERS,
                      *REASONING_COUNTERS, *TOKEN_SOURCE_COUNTERS, *AGENT_COUNTERS)
TELEMETRY_COLUMNS = ("t_s", "source", "device", "metric", "value")
# A session's later turns follow its rows (intended_s NaN: each is due its think_s after the answer
# before it), so a request's `seq` (its X-Request-Id) is its row; a closed-loop phase plans no requests.
SCHEDULE_COLUMNS = ("intended_s", "phase", "class", "prompt_tokens", "output_tokens", "session", "turn", "think_s")
# A distributed run's node (one load machine) per interval, all classes: what it sent and completed,
# its own send-lag and loop-lag p99 (NaN: none recorded), its engines' CPU (% of one core, summed) and
# its clock's offset from the coordinator's (ms). summary.json generator.nodes has the whole-run view.
NODE_COLUMNS = ("interval_start_s", "node", "host", "status", "sent", "completed", "errors", "in_flight",
                "send_lag_p99_ms", "loop_lag_p99_ms", "cpu_pct", "clock_offset_ms")

# requests.parquet: one row per request SENT (warm-up flagged, not dropped), in each worker's
# completion order (sort by `row` for the schedule's). Times are integer µs on the run clock (since
# t0, the first intended send: the clock of timeseries, events and telemetry); durations are exactly
# the integer µs the histograms got (intervals.py), so percentiles from this file agree with
# summary.json's to HDR precision. Null: not applicable. Then one float64 column `server.<part>` per
# Server-Timing part any request carried (ms, as the server said; null where a request had none).
# summary.json `request_records`: {"file", "rows", "sampled", "fraction", "max_rows"} (output.requests:
# past max_rows planned requests each row is kept with probability fraction, decided per row up front).
REQUEST_COLUMNS: dict[str, str] = {
    "row": "int64: the schedule row (Request.seq: the row schedule.parquet and X-Request-Id say)",
    "class": "string: the workload class",
    "phase": "string: the phase (a session's later turn: the phase its intended time falls in)",
    "warmup": "bool: sent in a warm-up phase (kept out of the statistics)",
    "worker": "int32: the engine that sent it (global across a distributed run)",
    "node": "string: a distributed run's machine; null in a local run",
    "session": "int64: the session it is a turn of (null: not a session's turn)",
    "turn": "int32: its turn in the session, from 1 (0: not a turn)",
    "intended_us": "int64: when the plan (or the previous answer and think time) said to send it",
    "sent_us": "int64: when the client began sending it (null: cancelled before the client said)",
    "first_byte_us": "int64: when the response's first bytes arrived (null: unknown or none)",
    "first_token_us": "int64: a stream's first token chunk (null: not a stream)",
    "end_us": "int64: when the whole response was read, the failure seen, or the request cancelled",
    "error": "string: an ERROR_KINDS member, or `cancelled` (in flight when the run was torn down); null: success",
    "status": "int32: the HTTP (or gRPC) status; 0: none",
    "latency_us": "int64: end − intended (success only), as the `latency` histogram got it",
    "service_us": "int64: end − sent (success only)",
    "send_lag_us": "int64: sent − intended (every request the client stamped)",
    "encode_us": "int64: the client's encode of it (null: not measured)",
    "decode_us": "int64: the client's decode of the response (null: not measured)",
    "network_us": "int64: service − decode − the server's Server-Timing total (null: no Server-Timing, or a stream)",
    "ttft_us": "int64: first token chunk − intended (streams)",
    "tpot_us": "int64: (end − first token) // (output tokens − 1) (streams of more than one token)",
    "itl_max_us": "int64: the longest gap between two token chunks (streams of two chunks or more)",
    "client_inclusive_us": "int64: latency + the part of the encode done before the intended time",
    "prompt_tokens": "int32: the server's usage prompt tokens, else the planned prompt length",
    "output_tokens": "int32: the server's usage output tokens, else the token chunks counted (0: none)",
    "cached_tokens": "int32: prompt tokens the server took from its prefix cache (null: it did not say)",
    "replica": "string: the replica that answered (X-Replica-Id), scrubbed of secrets (null: not said)",
    "bytes_in": "int64: response body bytes",
    "bytes_out": "int64: request body bytes",
    "stall_us": "int64: the generator's own stalls (GC pauses, event-loop lag, each ≥ 1 ms) overlapping "
                "[intended, end], their union in µs (0: none)",
    "connection": "int32: which connection of its worker's client carried it (null: unknown)",
    "ttfot_us": "int64: first content chunk − intended, the answer's first token after any reasoning (streams with one)",
    "reasoning_tokens": "int32: the reasoning tokens among output_tokens (the server's usage, else reasoning chunks; 0: none)",
    "prompt_count": "string: where prompt_tokens came from: `usage` (the server's), `plan` (the plan's: workload.tokenizer's "
                    "for a dataset class); null: no prompt",
    "output_count": "string: where output_tokens came from: `usage`, `tokenizer` (workload.tokenizer on the answer's text), "
                    "`chunks` (a stream's chunks counted); null: not counted",
}
# A sub-agent of an agent's job (docs/agents.md) is a session of its own: its `session` in requests.parquet
# is SUB_AGENT_BASE + job · 16 + i (i: its index in the job's fan-out, 16: the most a fan-out starts), and
# its round k's `row` (request number, X-Request-Id) SUB_AGENT_BASE + (job · 16 + i) · 64 + k − 1.
SUB_AGENT_BASE = 1 << 40
REQUEST_SERVER_PREFIX = "server."  # then one float64 column per Server-Timing part (ms)

# -- metrics (histograms.hlog tags, summary.json "metrics", timeseries.parquet "metric") -----------


@dataclass(frozen=True)
class Metric:
    label: str  # how the report names it
    meaning: str  # what one value is (all are recorded in µs; summaries are in ms)


METRICS: dict[str, Metric] = {
    "latency": Metric("latency", "end − intended send time: what a user waited, open loop (no coordinated omission)"),
    "service_time": Metric("service time", "end − actual send time: the target's part, without the client's lateness"),
    "send_lag": Metric("send lag", "actual send − intended send time: how late the generator sent"),
    "ttft": Metric("TTFT", "first token chunk − intended send time (streams; a reasoning chunk counts)"),
    "ttfot": Metric("TTFOT", "time to first output token: first content chunk (the answer itself, not reasoning) "
                             "− intended send time (streams with a content chunk; = TTFT without reasoning)"),
    "reasoning_time": Metric("reasoning time", "first content chunk − first token chunk, per stream that reasoned "
                                               "(a reasoning chunk first) and then answered"),
    "itl": Metric("ITL", "each gap between two token chunks of a stream, as the client saw them"),
    "tpot": Metric("TPOT", "(end − first token chunk) / (output tokens − 1), per stream"),
    "content_tpot": Metric("content TPOT", "(end − first content chunk) / (content tokens − 1), content tokens = "
                                           "output − reasoning tokens, per stream of more than one"),
    "encode": Metric("client encode", "the client's own encoding of a request (serialization), done ahead of its "
                                      "intended time (engine.py), so not inside latency"),
    "client_inclusive": Metric("client-inclusive latency", "latency + the part of the encode done before the "
                                                           "intended time: what a caller that encodes when a request "
                                                           "is due would wait"),
    "network": Metric("network", "service time − decode − the server's Server-Timing total: the wire and "
                                 "what the server does not report (not for streams)"),
    "decode": Metric("client decode", "the client's own decoding of a response"),
    # --- summary.json lists the metrics above first, in this order, then every other one by name ---
    "gc_pause": Metric("gc_pause", "a garbage-collection pause in a worker (class all)"),
    "loop_lag": Metric("event-loop lag", "how much later than asked a worker's 10 ms timer fired (class all)"),
    "replica_latency": Metric("latency per replica", "latency, with the replica that answered (X-Replica-Id) as its "
                                                     "class (replica_class)"),
    "session_duration": Metric("session duration", "a completed session's turn-1 intended time → its last answer's end"),
    "job_time": Metric("job time", "an agent's completed job: its start (round 1's intended time) → its last "
                                   "answer's end, what the user waits for (= job_model_time + job_tool_time)"),
    "job_model_time": Metric("job model time", "the latencies of a completed job's rounds, summed: the model's "
                                               "part of its critical path"),
    "job_tool_time": Metric("job tool time", "the tool waits of a completed job, summed: the tools' part of its "
                                             "critical path"),
    "turn.<metric>": Metric("<metric> by turn", "latency, ttft, itl or tpot of a session's turns, the class "
                                                "`<class>#<turn>` (turn_class): turn 1 against later turns is the "
                                                "prefix cache's story"),
    "server.<part>": Metric("server.<part>", "one Server-Timing part as the server reported it (queue, compute, ...)"),
}
SUMMARY_FIRST = ("latency", "service_time", "send_lag", "ttft", "itl", "tpot", "ttfot", "reasoning_time",
                 "content_tpot", "encode", "network", "decode", "client_inclusive")


def summary_order(names: set[str] | list[str]) -> list[str]:
    """Metric names in summary.json's order: SUMMARY_FIRST as there, then the others by name."""
    return [m for m in SUMMARY_FIRST if m in names] + sorted(m for m in names if m not in SUMMARY_FIRST)


def metric_label(name: str) -> str:
    """The report's name of a metric (a Server-Timing part keeps its own name)."""
    return METRICS[name].label if name in METRICS else name


# The report's sections of metrics, in reading order, each with its metrics in the order a request
# meets them ("server.*" stands for every Server-Timing part). A metric in none of them goes to a
# last section, OTHER_GROUP.
METRIC_GROUPS = (
    ("Latency", ("latency", "service_time")),
    ("Streaming", ("ttft", "itl", "tpot", "ttfot", "reasoning_time", "content_tpot")),
    ("Where the service time goes (means add up; see Serialization)", ("network", "server.*", "decode")),
    ("Client serialization (encode is done ahead of the send)", ("encode", "client_inclusive")),
    ("Per replica (class = replica id)", ("replica_latency",)),
    ("Agents (jobs)", ("job_time", "job_model_time", "job_tool_time")),
    ("Sessions (class#turn)", ("session_duration", "turn.*")),
    ("Load generator health (should stay near zero)", ("send_lag", "loop_lag")),
)
OTHER_GROUP = "Other"

# Each replica's latency is also recorded under a metric of its own, class = the replica id (from the
# response's X-Replica-Id), so that a replica the target added mid-run, and its cold first requests,
# can be told apart from the rest. A target that put a fresh id on every response (say, a request id)
# would make a histogram per response: past MAX_REPLICA_CLASSES ids (per worker), new ones share OTHER_REPLICAS.
REPLICA_METRIC = "replica_latency"
TURN_METRICS = ("latency", "ttft", "itl", "tpot", "ttfot")
TURN_PREFIX = "turn."


def turn_class(cls: str, turn: int) -> str:
    """The class a session turn's `turn.<metric>` is recorded under: "chat#3" ('#' is no class name's)."""
    return f"{cls}#{turn}"


def split_turn_class(name: str) -> tuple[str, int]:
    cls, _, turn = name.rpartition("#")
    return cls, int(turn)


def of_workload_classes(metric: str) -> bool:
    """Whether a metric's classes are the workload's (with an "all" and counters), not replica ids or
    class#turn (whose "all" would repeat latency's)."""
    return metric != REPLICA_METRIC and not metric.startswith(TURN_PREFIX)

MAX_REPLICA_CLASSES = 64
OTHER_REPLICAS = "_other"
_TAG_UNSAFE = re.compile(r"[,\s/]+")


def replica_class(replica: str) -> str:
    """A replica id as an hlog-tag-safe class name: runs of ',', '/' and whitespace become '_'
    (hlog tags may hold neither ',' nor whitespace, and '/' separates metric from class), at most
    100 characters."""
    return _TAG_UNSAFE.sub("_", replica)[:100] or "_"


# -- telemetry.parquet's metrics --------------------------------------------------------------------

# name -> (label, unit). A source writes only what it can measure; a Prometheus mapping may add names
# of its own (queue_depth, requests_s, ...).
TELEMETRY_METRICS: dict[str, tuple[str, str]] = {
    "gpu_util_pct": ("GPU utilization", "%"),
    "mem_bw_util_pct": ("Memory-bandwidth utilization (DRAM, GPM)", "%"),
    "mem_util_pct": ("Memory-controller busy (NVML memory utilization, not bandwidth)", "%"),
    "sm_active_pct": ("SM activity", "%"),
    "sm_occupancy_pct": ("SM occupancy", "%"),
    "mem_used_bytes": ("GPU memory used", "B"),
    "power_w": ("Power", "W"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "pcie_rx_bytes_s": ("PCIe receive", "B/s"),
    "pcie_tx_bytes_s": ("PCIe transmit", "B/s"),
    "temp_c": ("Temperature", "°C"),
    "cpu_pct": ("CPU", "% of one core"),
    "rss_bytes": ("Resident memory", "B"),
    "loop_lag_p99_ms": ("Event-loop lag p99", "ms"),
}

# An inference server's own signals, as the shipped Prometheus mappings write them (telemetry/mappings.py:
# vLLM, SGLang, TGI, llama.cpp, Triton, the reference server), the same name whichever engine exports
# the thing: name -> one sentence. A `_s` metric is a per-second rate between two scrapes; the
# `server_*_ms` ones describe the requests the server finished between two scrapes (no sample when it
# finished none): p50/p99 interpolated in its histogram's buckets (off by at most the bucket's width,
# telemetry/histograms.py), the mean exact.
SERVER_SIGNALS: dict[str, str] = {
    "queue_depth": "Requests waiting in the server's queue, not yet running (vLLM num_requests_waiting, SGLang num_queue_reqs, ...).",
    "requests_running": "Requests the server is running now: in its batch, being prefilled or decoded.",
    "kv_cache_usage_pct": "How full the server's KV cache is, 0-100 %.",
    "preemptions_s": "Running requests the server preempted (SGLang: retracted) per second, to free KV cache; each is recomputed later.",
    "prefix_cache_queries_s": "Prompt tokens looked up in the server's prefix cache per second.",
    "prefix_cache_hits_s": "Prompt tokens found in the server's prefix cache per second (hit rate: hits / queries).",
    "prompt_tokens_s": "Prompt (prefill) tokens the server processed per second.",
    "generation_tokens_s": "Tokens the server generated per second.",
    "batch_size": "Sequences per forward pass or batch (TGI, llama.cpp: as exported; the reference server: the mean per scrape).",
    "server_ttft_p50_ms": "The server's own time to first token, median of the requests it served between two scrapes.",
    "server_ttft_p99_ms": "The server's own time to first token, 99th percentile between two scrapes.",
    "server_ttft_mean_ms": "The server's own time to first token, mean between two scrapes.",
    "server_queue_time_p50_ms": "Time requests waited in the server's queue before running, median between two scrapes.",
    "server_queue_time_p99_ms": "Time requests waited in the server's queue, 99th percentile between two scrapes.",
    "server_queue_time_mean_ms": "Time requests waited in the server's queue, mean between two scrapes.",
    "server_e2e_p50_ms": "The server's own end-to-end request time (arrival to last token), median between two scrapes.",
    "server_e2e_p99_ms": "The server's own end-to-end request time, 99th percentile between two scrapes.",
    "server_e2e_mean_ms": "The server's own end-to-end request time, mean between two scrapes.",
    "server_compute_mean_ms": "Compute (model execution) time per request or batch, mean between two scrapes (Triton, the reference server).",
    "requests_s": "Requests the server completed per second, by its own count.",
    "request_failures_s": "Requests the server failed per second (Triton).",
    "inferences_s": "Inferences per second (Triton: a request of batch n counts n).",
    "executions_s": "Model executions per second (Triton: inferences / executions is the mean dynamic batch).",
    "in_flight_requests": "HTTP requests the server is handling now (the reference server).",
    "active_sequences": "Sequences being decoded (the reference server; also written as requests_running).",
    "waiting_sequences": "Generation requests waiting for a sequence slot (the reference server).",
}

# -- events.jsonl -----------------------------------------------------------------------------------
# Every event has `event` (its name), `t_s` (seconds on the run's clock, 0 = the first intended send;
# negative before it, null when the run never got that far) and `wall` (ISO 8601, UTC), then its fields.


@dataclass(frozen=True)
class Event:
    fields: tuple[str, ...]  # every field it may carry besides event, t_s and wall
    writer: str  # the module that writes it
    meaning: str


EVENT_TYPES: dict[str, Event] = {
    "run_start": Event(("planned_requests", "workers"), "run/orchestrator.py",
                       "every worker is ready; t = 0 is the pool's start delay later (0.2 s on one machine)"),
    "phase_start": Event(("phase", "planned_at_s", "warmup"), "run/orchestrator.py",
                         "the run's clock passed a phase's planned start"),
    "target_launch": Event((), "run/orchestrator.py, run/actions.py",
                           "the launched target's process was started (the first launch, or a restart)"),
    "target_ready": Event(("after_s",), "run/orchestrator.py, run/actions.py",
                          "the launched target answered its ready_url, after_s after its launch"),
    "target_stopped": Event(("exit_code",), "run/orchestrator.py, run/actions.py",
                            "the launched target was stopped (the end of the run, or a restart)"),
    "first_response": Event(("latency_ms",), "run/orchestrator.py",
                            "the run's first successful response (cold-start analysis)"),
    "replica_first_seen": Event(("replica", "latency_ms"), "run/orchestrator.py",
                                "a replica id's first response; latency_ms null when it was an error"),
    "first_after_idle": Event(("request", "intended_s", "idle_gap_s", "phase", "latency_ms", "error", "replica"),
                              "run/orchestrator.py",
                              "the first request after an idle phase or a gap in the schedule, measured on its own"),
    "action_start": Event(("name", "kind", "planned_at_s"), "run/actions.py", "a scenario action started"),
    "action_end": Event(("name", "kind", "ok", "duration_s", "exit_code", "output", "status", "response",
                         "ready_after_s", "error"), "run/actions.py",
                        "a scenario action ended: a command's exit_code and output, an HTTP call's status and "
                        "response, a restart's ready_after_s; error when not ok"),
    "action_skipped": Event(("name", "reason", "planned_at_s"), "run/actions.py",
                            "an action whose time never came before the run ended"),
    "telemetry_unavailable": Event(("source", "reason"), "telemetry/session.py",
                                   "a telemetry source cannot sample on this host (no GPU, ...)"),
    "telemetry_gap": Event(("source", "reason"), "telemetry/session.py",
                           "a telemetry source started failing: no samples until telemetry_resumed"),
    "telemetry_resumed": Event(("source",), "telemetry/session.py", "a failing telemetry source answers again"),
    "telemetry_truncated": Event(("max_rows",), "telemetry/session.py",
                                 "telemetry.parquet is full; later samples are dropped"),
    "abort": Event(("reason",), "run/orchestrator.py",
                   "the run is being stopped early (signal, target gone, worker failed); summary.json is partial"),
    "accounting_mismatch": Event(("unaccounted",), "run/summary.py",
                                 "requests sent but counted neither completed, nor an error, nor cancelled (a latscope "
                                 "bug: summary.json requests.unaccounted says how many)"),
    "run_end": Event(("partial", "validity"), "run/summary.py", "the results are written; the last event"),
    # A distributed run (latscope/distributed/remote.py): its machines, each a `node`
    "node_joined": Event(("node", "host", "engines", "latscope", "locust"), "distributed/remote.py",
                         "a Locust worker is one of the run's machines (the roster is frozen at the start)"),
    "node_rejected": Event(("host", "reason"), "distributed/remote.py",
                           "a Locust worker was refused: it joined late, or runs another latscope or wire version"),
    "node_ready": Event(("node", "offset_ms", "bound_ms", "rtt_min_ms"), "distributed/remote.py",
                        "a node's engines are ready and its clock is measured (its offset from the coordinator's, "
                        "within ± bound)"),
    "node_started": Event(("node", "late_ms"), "distributed/remote.py",
                          "a node got its start (late_ms: how long after it was sent it arrived, on the node's clock)"),
    "node_lost": Event(("node", "host", "reason"), "distributed/remote.py",
                       "a node was lost mid-run (Locust stopped hearing its heartbeat, or it left)"),
    "node_failed": Event(("node", "host", "error"), "distributed/remote.py", "a node reported a failure"),
}

# -- a capacity search's directory (`latscope capacity`) ---------------------------------------------
# DIR/capacity.json (its own schema_version), DIR/capacity.html, and DIR/steps/NNN-<rate>/: one
# ordinary results directory per step. capacity.json's schema_version 2 (latscope capacity since the
# undecided band): `bracket` holds the two confident ends (low_rps: the highest rate that passed with
# confidence; high_rps: the lowest that failed with confidence) and the band between them
# (undecided_low_rps, undecided_high_rps; `undecided_rps` lists every rate undecided after its
# extensions); version 1 counted a rate undecided twice as a fail, so its high_rps may be one
# (analysis/capacity_gate.py reads both).
CAPACITY = "capacity.json"
CAPACITY_PAGE = "capacity.html"
CAPACITY_SCHEMA_VERSION = 2
STEPS_DIR = "steps"

# capacity.json's `stopped`: why the search ended -> (the exit code of `latscope capacity`, in words)
CAPACITY_STOPS = {
    "precision": (0, "the bracket is within the precision asked"),
    "max_rate": (0, "the SLOs hold at --max-rate: the capacity is at least that"),
    "undecided_band": (0, "the SLOs are undecided between the confident ends at this step length: the capacity is "
                          "at least the lower end"),
    "slo_fails_at_lowest_rate": (1, "the SLOs fail even at the lowest rate"),
    "inconclusive": (4, "the data cannot tell whether the SLOs hold even at the lowest rate"),
    "generator_limit": (4, "the load generator fell behind: the limit found is its own, not the target's"),
    "max_steps": (4, "--max-steps ran out before the bracket was narrow enough"),
    "interrupted": (4, "interrupted"),
    "run_failed": (4, "a step's run failed"),
    "target_down": (1, "the target stopped answering (every request of the step's last intervals failed to connect)"),
}
