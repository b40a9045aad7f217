"""The starter scenarios `latscope init` writes: one per protocol, as commented YAML a newcomer reads
top to bottom, what to change first at the top.

Text, not a dumped dict, because the comments are the point: they say which numbers are placeholders
(the rate, the SLOs, what a request carries) and how to find better ones. Every starter has the same
traffic: a short warm-up, then ~30 s of Poisson arrivals at a modest rate, and one SLO placeholder
(p99 latency; p99 TTFT too for streaming). Values from the server (URL, model, input names) are
written as YAML scalars that cannot break the file (`scalar`).
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass

import yaml

from latscope.init.probe import Input
from latscope.scenario.workload import DTYPES

WARMUP_S, MEASURED_S = 3, 30
# req/s: modest, for an endpoint we know nothing of
RATE = {"openai": 2, "openai-responses": 2, "anthropic-messages": 2, "openai-embeddings": 10, "rerank": 5, "kserve-v2": 10,
        "kserve-v2-grpc": 10, "http": 10}
STREAMING = ("openai", "openai-responses", "anthropic-messages")  # answers streamed token by token: TTFT
BATCH = ("openai-embeddings", "rerank")
SEQUENCE = 16  # what a -1 (any size) dimension of a KServe input becomes, after the batch dimension

# The reference server a starter without a URL launches, as scenarios/smoke.yaml does.
REF_HTTP, REF_GRPC = 8765, 8766
REF_ENCODER = [Input("input_ids", "INT64", (1, SEQUENCE)), Input("attention_mask", "INT64", (1, SEQUENCE))]
REF_RANGES = {"input_ids": (1000, 8000), "attention_mask": (1, 2)}  # token ids the encoder knows; a full mask


@dataclass
class Endpoint:
    """What a starter points at: a protocol, the URL to write, and what that protocol needs."""

    protocol: str
    url: str
    model: str | None = None
    inputs: list[Input] | None = None  # KServe v2: None when the model's metadata was not to be had
    method: str = "POST"  # http
    path: str = "/"  # http
    launch: bool = False  # start the reference server (a starter without a URL)


def scalar(value: str) -> str:
    """`value` as a YAML scalar: bare when YAML reads it back as the same string, else JSON-quoted
    (a JSON string is a YAML double-quoted scalar)."""
    if re.fullmatch(r"[A-Za-z0-9_./:@%+=-]+", value):
        try:
            if yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def starter_text(endpoint: Endpoint, header: list[str], file_name: str) -> str:
    """The whole file: `header` (what init found, as comment lines), what to change first, and the
    scenario for `endpoint`."""
    rate = RATE[endpoint.protocol]
    lines = [f"# {part}".rstrip() for line in header for part in textwrap.wrap(line, 100) or [""]]
    lines += ["#", "# What to change first:",
              f"#   1. phases: the rate of the measured phase ({rate} req/s here). Start below what you expect the",
              "#      endpoint to take; `latscope capacity " + file_name + "` then finds the highest rate that meets the SLOs.",
              "#   2. slos: the limits your users need. The ones below are placeholders, not advice.",
              f"#   3. {_WHAT_TO_SEND[endpoint.protocol]}",
              "# Then:",
              f"#   latscope validate {file_name}     # what it would send",
              f"#   latscope run {file_name}          # ~{WARMUP_S + MEASURED_S} s; a results directory with summary.json and report.html",
              "name: starter",
              f"description: {scalar(_DESCRIPTION[endpoint.protocol].format(model=endpoint.model or 'MODEL'))}",
              "seed: 1"]
    lines += _target(endpoint)
    lines += _workload(endpoint)
    lines += _traffic(endpoint.protocol, rate)
    return "\n".join(lines) + "\n"


_WHAT_TO_SEND = {
    "openai": "workload: prompt and answer lengths (tokens) like your traffic's; target.model if it serves several.",
    "openai-responses": "workload: prompt and answer lengths (tokens) like your traffic's; target.model if it serves several.",
    "anthropic-messages": "workload: prompt and answer lengths (tokens) like your traffic's (output_tokens is max_tokens).",
    "openai-embeddings": "workload: inputs per request (batch) and each input's length (prompt_tokens) like your traffic's.",
    "rerank": "workload: documents per request (batch), their length (prompt_tokens) and the query's (query_tokens).",
    "kserve-v2": "workload.classes[0].tensors: the shapes and value ranges your model expects (random values in [low, high)).",
    "kserve-v2-grpc": "workload.classes[0].tensors: the shapes and value ranges your model expects (random values in [low, high)).",
    "http": "target.method, target.path and workload.body: one request as your endpoint takes it.",
}
_DESCRIPTION = {
    "openai": "Streaming chat completions to {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "openai-responses": "Streaming Responses API requests to {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "anthropic-messages": "Streaming Messages API requests to {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "openai-embeddings": "Embeddings requests to {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "rerank": "Rerank requests to {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "kserve-v2": "KServe v2 inference on {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "kserve-v2-grpc": "KServe v2 gRPC inference on {model}: a short warm-up, then 30 s of Poisson arrivals.",
    "http": "Plain HTTP requests: a short warm-up, then 30 s of Poisson arrivals.",
}


def _target(e: Endpoint) -> list[str]:
    lines = ["target:", f"  url: {scalar(e.url)}"]
    if e.protocol == "http":
        lines += [f"  method: {e.method}", f"  path: {scalar(e.path or '/')}",
                  "  timeout: 10s",
                  "  # headers: {Authorization: \"Bearer ${API_TOKEN}\"}   # a secret from the environment: never written to results"]
    else:
        lines.append(f"  protocol: {e.protocol}")
        model = scalar(e.model) if e.model else "MODEL  # CHANGE: the model's name (rerun `latscope init URL --model NAME`)"
        lines.append(f"  model: {model}")
        if e.protocol in STREAMING or e.protocol in BATCH:
            if "@" in e.url:  # a user and password, sent as basic authentication: no key besides
                lines.append("  # The URL's user and password are sent as basic authentication (from the environment).")
            elif not e.launch and e.protocol == "anthropic-messages":
                lines.append("  api_key: ${ANTHROPIC_API_KEY:-}   # sent as x-api-key when set; never written to results")
            elif not e.launch:
                lines.append("  api_key: ${OPENAI_API_KEY:-}   # sent as a bearer token when set; never written to results")
            lines += {"openai": ["  openai: {api: chat, stream: true, include_usage: true}"],
                      "openai-responses": ["  openai: {stream: true}   # the usage comes with response.completed"],
                      "anthropic-messages": ["  anthropic: {stream: true}"]}.get(e.protocol, [])
            lines.append("  timeout: 60s" if e.protocol in STREAMING else "  timeout: 30s")
        else:
            lines.append("  timeout: 10s")
    if e.launch:
        grpc = f"{REF_GRPC}" if e.protocol == "kserve-v2-grpc" else "-1"
        lines += ["  # latscope starts its reference server (pip install 'latscope[server]') before the run and",
                  "  # stops it after. To test your own endpoint: `latscope init http://HOST:PORT`, or set",
                  "  # target.url (and target.model) and delete this launch section.",
                  "  launch:",
                  f"    command: python -m reference_server serve --http-port {REF_HTTP} --grpc-port {grpc}",
                  f"    ready_url: http://127.0.0.1:{REF_HTTP}/v2/health/ready",
                  "    ready_timeout: 60s",
                  "    cpus: 1  # a core of its own, latscope's workers the rest: a small machine's run stays valid"]
    return lines


def _workload(e: Endpoint) -> list[str]:
    if e.protocol == "http":
        if e.method == "GET":
            return ["# GET sends no body. For a POST, set target.method: POST and the JSON to send:",
                    "# workload:", "#   body: {inputs: [1, 2, 3]}"]
        if e.launch:  # the reference server's encoder, over plain HTTP as scenarios/smoke.yaml sends it
            ids = ", ".join(str(1000 + 37 * i) for i in range(SEQUENCE))
            return ["workload:", "  body:", "    inputs:",
                    f"      - {{name: input_ids, datatype: INT64, shape: [1, {SEQUENCE}], data: [{ids}]}}",
                    f"      - {{name: attention_mask, datatype: INT64, shape: [1, {SEQUENCE}], data: [{', '.join(['1'] * SEQUENCE)}]}}"]
        return ["workload:", "  body: {inputs: [1, 2, 3]}   # CHANGE: the JSON one request of yours carries (sent as is)"]
    if e.protocol == "openai-embeddings":
        return ["workload:", "  classes:", "    - name: embed",
                "      # 1 to 8 inputs a request (drawn per request), each of 32-128 tokens.",
                "      batch: {dist: uniform, min: 1, max: 8}",
                "      prompt_tokens: {dist: uniform, min: 32, max: 128}"]
    if e.protocol == "rerank":
        return ["workload:", "  classes:", "    - name: rerank",
                "      # A 16-token query and 8 documents of 32-96 tokens a request.",
                "      batch: 8", "      query_tokens: 16",
                "      prompt_tokens: {dist: uniform, min: 32, max: 96}"]
    if e.protocol in STREAMING:
        return ["workload:", "  classes:", "    - name: chat",
                "      # Prompts of ~128 tokens (log-normal: a long right tail), answers of 16-128 tokens.",
                "      prompt_tokens: {dist: lognormal, mean: 128, std: 96, min: 16, max: 512}",
                "      output_tokens: {dist: uniform, min: 16, max: 128}"]
    lines = ["workload:", "  classes:", "    - name: infer"]
    if e.inputs:
        lines += ["      # The model's inputs as its metadata gives them; a dimension of any size (-1) became "
                  f"1 (batch) or {SEQUENCE}.",
                  "      tensors:"]
        lines += [tensor_line(t, e.launch) for t in e.inputs]
    else:
        lines += ["      # CHANGE: the model's inputs (its metadata was not to be had): one line per input tensor.",
                  "      tensors:",
                  f"        - {{name: INPUT0, datatype: FP32, shape: [1, {SEQUENCE}]}}"]
    return lines


def tensor_line(t: Input, reference: bool) -> str:
    """One tensors[] line: a -1 dimension made concrete, random values in a range that fits the name."""
    shape = [d if d > 0 else (1 if i == 0 else SEQUENCE) for i, d in enumerate(t.shape)] or [1]
    datatype, note = t.datatype, ""
    if datatype not in DTYPES:
        datatype, note = "FP32", f"  # CHANGE: the model takes {t.datatype}; latscope sends numeric tensors only"
    text = f"        - {{name: {scalar(t.name)}, datatype: {datatype}, shape: [{', '.join(map(str, shape))}]"
    low_high = REF_RANGES.get(t.name) if reference else None
    if low_high is None and DTYPES[datatype].kind in "iu":
        low_high = (1, 2) if "mask" in t.name.lower() else (0, 100)  # a full mask; small ids any vocabulary has
    if low_high is not None:
        text += f", low: {low_high[0]}, high: {low_high[1]}"
    return text + "}" + note


def _traffic(protocol: str, rate: int) -> list[str]:
    lines = ["phases:",
             "  # Warm-up: connections, caches and the server's first requests; sent, but excluded from the statistics.",
             f"  - {{name: warmup, duration: {WARMUP_S}s, warmup: true, arrival: {{type: constant, rate: {rate}}}}}",
             "  # CHANGE the rate (req/s). Poisson arrivals: independent users, sent on time whatever the server does.",
             f"  - {{name: steady, duration: {MEASURED_S}s, arrival: {{type: poisson, rate: {rate}}}}}",
             "slos:  # CHANGE: placeholders; `latscope gate` and the report judge the run against these"]
    if protocol in STREAMING:
        lines += ["  - {metric: ttft, class: all, stat: p99, limit_ms: 500}       # time to first token",
                  "  - {metric: latency, class: all, stat: p99, limit_ms: 5000}   # the whole answer"]
    else:
        lines.append(f"  - {{metric: latency, class: all, stat: p99, limit_ms: {500 if protocol in BATCH else 100}}}")
    return lines
