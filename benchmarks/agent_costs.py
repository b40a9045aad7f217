"""The per-round client cost of an agent job's long context (`python benchmarks/sessions.py --agents`, part 2).

One agent Conversation (protocol openai, chat, streamed) whose context grows round by round: a 64-token
task, then each round the model's answer (a little text and a tool call whose arguments hold 200 words)
and a 2,000-token tool result, with 8 declared tools of 2,000 schema tokens in all sent every round. At
contexts of ~1k, 10k, 50k and 100k tokens: `OpenAIClient.prepare` (the `encode` metric: the body built
from the kept, serialized context) and `_remember` (the answer with its tool call appended), next to the
naive way, `json.dumps` (and `orjson.dumps`) of every message as a dict each round, and a plain copy of
the context. Medians of repeated calls; the body is checked to parse to the naive document.
"""

from __future__ import annotations

import json
import statistics
import time

import orjson

from common import markdown_table, median_ns
from latscope.protocols.openai import OpenAIClient
from latscope.protocols.tools import CHAT, declared
from latscope.records import Conversation, Request
from latscope.scenario import scenario_from_dict
from latscope.workload import Payloads

CONTEXT_TARGETS = (1_000, 10_000, 50_000, 100_000)
TASK_TOKENS, RESULT_TOKENS, ANSWER_WORDS, ARGUMENT_WORDS = 64, 2_000, 20, 200
TOOLS = {"count": 8, "schema_tokens": 2_000}


def context_cost(reps: int) -> list[dict]:
    """The rows of the table: one per context target (the module docstring)."""
    spec = {"name": "agent-context", "seed": 17,
            "target": {"url": "http://127.0.0.1:9", "protocol": "openai", "model": "bench",
                       "openai": {"api": "chat", "stream": True, "include_usage": True}},
            "workload": {"classes": [{"name": "coder", "prompt_tokens": TASK_TOKENS, "output_tokens": 64,
                                      "agent": {"rounds": 64, "tools": TOOLS, "tool_result_tokens": RESULT_TOKENS}}]},
            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
    scenario = scenario_from_dict(spec)
    payloads = Payloads(scenario)
    client = OpenAIClient(scenario, [0], payloads)
    cls = client._classes[0]
    conv = Conversation(0, 0, True, -1, 64, 0)
    rest = {"max_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
            "tools": declared(CHAT, payloads.tool_descriptions(0))}
    messages: list[dict] = []  # the naive way: every message a dict, the whole body dumped each round
    tokens, k, rows, targets = 0, 0, [], list(CONTEXT_TARGETS)
    while targets:
        k += 1
        length = TASK_TOKENS if k == 1 else RESULT_TOKENS
        request = Request(k, 0, 0, False, length, 64, 104729 * k, turn=k, session=conv)
        text = payloads.get(request).prompt
        pending = conv.calls
        if pending:
            messages.append({"role": "tool", "tool_call_id": pending[0][0], "content": text})
        else:
            messages.append({"role": "user", "content": text})
        tokens += length
        if tokens >= targets[0]:
            targets.pop(0)
            mark = None if conv.history is None else len(conv.history)
            prepare_ns = []
            for _ in range(reps):  # a prepare adds the round's text to the context: taken back after each
                conv.calls = pending
                client.prepare(request)
                prepare_ns.append(request.encode_ns)
                if mark is None:
                    conv.history = None
                else:
                    del conv.history[mark:]
            conv.calls = pending
            client.prepare(request)
            doc = {"model": "bench", "messages": messages, **rest}
            dumps = lambda: json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()  # noqa: E731
            body = request.wire[request.wire.index(b"\r\n\r\n") + 4:]
            assert json.loads(body) == json.loads(dumps()), "the incremental body is not the naive one"
            context = conv.history
            rows.append({"round": k, "context_tokens": tokens, "context_kib": len(context) / 1024,
                         "body_kib": len(body) / 1024, "prepare_us": statistics.median(prepare_ns) / 1e3,
                         "json_dumps_us": median_ns(dumps, reps) / 1e3,
                         "orjson_dumps_us": median_ns(lambda: orjson.dumps(doc), reps) / 1e3,
                         "copy_us": median_ns(lambda: bytes(context), reps) / 1e3})
        else:
            client.prepare(request)
        answer = payloads.synthetic_prompt(ANSWER_WORDS, 7919 * k)
        call = (f"call_{k}", "tool_0", json.dumps({"query": payloads.synthetic_prompt(ARGUMENT_WORDS, 31 * k)}))
        started = time.perf_counter_ns()
        OpenAIClient._remember(cls, request, answer, None, [call])
        if rows and rows[-1]["round"] == k:
            rows[-1]["remember_us"] = (time.perf_counter_ns() - started) / 1e3
        messages.append({"role": "assistant", "content": answer, "tool_calls": [
            {"id": call[0], "type": "function", "function": {"name": call[1], "arguments": call[2]}}]})
        tokens += ANSWER_WORDS + ARGUMENT_WORDS
    return rows


def context_table(rows: list[dict]) -> str:
    return markdown_table(
        ["round", "context tokens", "context KiB", "body KiB", "prepare (`encode`) µs", "`_remember` µs",
         "copy of the context µs", "naive json.dumps µs", "naive orjson.dumps µs", "json.dumps / prepare"],
        [[str(r["round"]), f"{r['context_tokens']:,}", f"{r['context_kib']:.0f}", f"{r['body_kib']:.0f}",
          f"{r['prepare_us']:.1f}", f"{r.get('remember_us', 0):.1f}", f"{r['copy_us']:.1f}", f"{r['json_dumps_us']:,.0f}",
          f"{r['orjson_dumps_us']:,.0f}", f"{r['json_dumps_us'] / r['prepare_us']:.0f}×"] for r in rows])
