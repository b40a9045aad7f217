"""How exact latscope's timings are, request by request, against the packets on the wire; and how far
NVIDIA aiperf (and guidellm, where it runs) sit from the same wire, same server, same sitting.

    python benchmarks/wire_truth.py [--requests 300] [--rate 20] [--no-peers] [--no-results-md] [--typed P,P]
    # ~70 s with --no-peers, ~135 s with aiperf and guidellm (--typed '': ~35 s less)

Needs tcpdump and root or CAP_NET_RAW (it says so and skips otherwise). One `latscope.targets.stream`
on 127.0.0.1 (first token 20 ms after it read the request, then one every 10 ms, one SSE event per
HTTP chunk per write) takes /v1/completions requests, 64-token prompts asking for 32 tokens, at a
constant open-loop rate: 20 warm-up requests, then `--requests` measured ones. `tcpdump -i lo -U
--immediate-mode -s 0 --time-stamp-precision=nano` records every packet of the server's port meanwhile,
and this script reads the pcap itself: each TCP direction is put back in order by sequence number (retransmitted
bytes counted once; a byte's time is the latest capture time of the packets up to and including the
one that first carried it), requests and responses are parsed from the byte streams (keep-alive, one
request at a time per connection) and each instant is the capture time of one packet:

    t_request        the packet holding the request's last byte (the server can start only then;
                     how long after its first byte is reported too: a client may write the head
                     and the body apart)
    t_first_byte     the packet holding the response's first byte
    t_content[i]     the packet holding the last byte of the i-th SSE event with text (choices[0].text
                     or choices[0].delta.content non-empty; a Responses API text delta; a Messages API
                     content_block_delta with text, thinking or partial_json: carries_text)
    t_last           the packet holding the response's last byte (the chunked `0\\r\\n\\r\\n`, or the
                     last byte of a Content-Length body)

    wire:      ttft = t_content[0] − t_request     e2e = t_last − t_request     ttfb = t_first_byte − t_request
               itl  = t_content[i] − t_content[i−1]   tpot = (t_last − t_content[0]) / (tokens − 1)

latscope runs in this process: its real Engine and its real OpenAI client (make_client), through a
wrapper that hands every call on and keeps each request's (seq, intended_ns, sent_ns, token_ns,
end_ns, output_tokens, error). With latscope's timing rules, all on perf_counter_ns:

    ttft = token_ns[0] − intended_ns      e2e = end_ns − intended_ns       itl = token_ns[i] − token_ns[i−1]
    tpot = (end_ns − token_ns[0]) / (tokens − 1)                            send lag = sent_ns − intended_ns
    non-streaming: ttfb = e2e (latscope's rule: a response without chunks has ttft = latency)

and the same again from sent_ns instead of intended_ns. Offsets are per request (per gap for itl):
latscope − wire, matched by the X-Request-Id header latscope sends (`target.request_id_header`; it
says when it fell back to matching by order). Packet times are CLOCK_REALTIME, latscope's
CLOCK_MONOTONIC; their difference R is read (the closest pair of ~200 reads) before and after each
capture, so each TTFT offset splits exactly into three parts:

    latscope ttft − wire ttft = send lag + (t_request − R − sent_ns) + (token_ns[0] + R − t_content[0])
                                           write path                   read delay

The stream target stamps each token's `t_ns` (perf_counter_ns) just before its write, so
t_content − R − t_ns (server write → packet) checks R: it must be small and positive.

The typed-event protocols (`--typed`, both by default: openai-responses, anthropic-messages) are measured
streaming too, the same way, against the test suite's events server (tests/protocols/events_server.py,
aiohttp, as a process on the server's CPU: the same first token 20 ms after the request, one every 10 ms,
32 text deltas, each event written on its own with its `t_ns`), each with its API's own body.

Acceptance bar: latscope's p50 and p99 of TTFT and e2e (ttfb and e2e for non-streaming) within
0.5 ms + 2 % of the wire's, and its ITL p50 within 0.2 ms of the wire's.

Peers (unless --no-peers), each against its own capture of the same server, same rate, counts and
lengths, streaming: aiperf, run by run_independent_tool.py, its per-request export matched to the wire
by the X-Request-ID it sends (ttft = time_to_first_token, e2e = request_latency, tpot =
inter_token_latency, itl = inter_chunk_latency); then guidellm, its per-request report matched by the
completion id the server sent (ttft = time_to_first_token_ms, e2e = request_latency, tpot =
inter_token_latency_ms; it keeps no per-gap times). Their numbers are taken as they report them, each
measured from its own send.
latscope and each peer get the same CPU (the first; the server the last) where there are two.

Writes benchmarks/out/wire_truth-<time>.json, benchmarks/out/wire_truth-section.md and its section of
benchmarks/RESULTS.md (not with --no-results-md). How to install the peers: benchmarks/wire_truth.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from bisect import bisect_right
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import run_independent_tool  # noqa: E402
from common import (  # noqa: E402
    cpus, fmt, free_port, machine_facts, machine_line, markdown_table, server_process, update_results_md, write_report_json,
)
import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from latscope.engine import Engine, settle_gc  # noqa: E402
from latscope.plan import build_plan  # noqa: E402
from latscope.protocols import Client, make_client  # noqa: E402
from latscope.records import Outcome, Request  # noqa: E402
from latscope.request_ids import request_row  # noqa: E402
from latscope.scenario import Scenario, scenario_from_dict  # noqa: E402

SECTION_TITLE = "## measured against the wire (benchmarks/wire_truth.py)"
# The typed-event protocols (OpenAI Responses, Anthropic Messages), streamed by the test suite's events server
TYPED_PROTOCOLS = ("openai-responses", "anthropic-messages")
EVENTS_SERVER = REPO / "tests" / "protocols" / "events_server.py"
PACKAGES = ("latscope", "uvloop", "httptools", "numpy")
WARMUP = 20
PROMPT_TOKENS, OUTPUT_TOKENS, TTFT_MS, ITL_MS = 64, 32, 20, 10
ID_HEADER = "X-Request-Id"
SYN, ACK = 0x02, 0x10
BAR_MS, BAR_SHARE, ITL_BAR_MS = 0.5, 0.02, 0.2


# -- the capture ---------------------------------------------------------------------------


class CaptureUnavailable(Exception):
    pass


@contextmanager
def capture(port: int, pcap: Path) -> Iterator[dict]:
    """tcpdump on lo for `port` while the block runs; yields a dict that gets its packet counts once it stopped."""
    command = ["tcpdump", "-i", "lo", "-w", str(pcap), "-U", "--immediate-mode", "-s", "0",
               "-B", "16384", "--time-stamp-precision=nano", f"tcp port {port}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said, deadline = b"", time.monotonic() + 10
    while b"listening on" not in said and time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stderr], [], [], 0.1)[0]:
            said += os.read(process.stderr.fileno(), 4096)
    if b"listening on" not in said:
        process.kill()
        rest = process.communicate()[1]
        raise CaptureUnavailable((said + rest).decode(errors="replace").strip() or "tcpdump did not start listening")
    counts: dict = {}
    try:
        yield counts
    finally:
        time.sleep(0.3)  # the last packets reach the file (--immediate-mode hands each over as it comes, -U writes it)
        process.send_signal(signal.SIGINT)
        try:
            said += process.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            process.kill()
            said += process.communicate()[1]
        for number, what in re.findall(rb"(\d+) packets? (captured|dropped by kernel)", said):
            counts[what.decode()] = int(number)


def capture_problem() -> str | None:
    """Why no capture is possible here (None when it is)."""
    if shutil.which("tcpdump") is None:
        return "tcpdump is not installed (apt-get install tcpdump); it also needs root or CAP_NET_RAW"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with capture(free_port(), Path(tmp) / "probe.pcap"):
                pass
        except CaptureUnavailable as exc:
            return f"tcpdump cannot capture on lo ({exc}); run as root or give tcpdump CAP_NET_RAW and CAP_NET_ADMIN"
    return None


def realtime_minus_monotonic() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC in ns (packet times minus perf_counter_ns), from the closest of 200 reads."""
    best = (1 << 62, 0)
    for _ in range(200):
        before, real, after = time.perf_counter_ns(), time.time_ns(), time.perf_counter_ns()
        best = min(best, (after - before, real - (before + after) // 2))
    return best[1]


@contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """This process, and what it starts meanwhile, on one CPU (nothing changes when `cpu` is None)."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# -- the pcap, the TCP byte streams, HTTP ------------------------------------------------------


@dataclass
class Side:
    isn: int | None = None
    segments: list[tuple[int, int, bytes]] = field(default_factory=list)  # (capture ns, seq, payload)


@dataclass
class Stream:
    """One direction's bytes in order; the bytes from starts[i] on became whole at times[i]."""

    data: bytes
    starts: list[int]
    times: list[int]

    def time_at(self, offset: int) -> int:
        return self.times[bisect_right(self.starts, offset) - 1]


@dataclass
class Exchange:
    method: str
    request_id: str | None
    request_first: int
    request_last: int
    status: int
    response_first: int
    response_last: int
    response_id: str | None  # the completion's "id" (the stream target's is unique per request)
    content: list[tuple[int, int | None]]  # per text event: (capture ns, the server's t_ns when it sent one)


def ip_offset(linktype: int, frame: bytes) -> int | None:
    """Where the IPv4 header starts in a frame of this link type (None: not IPv4)."""
    if linktype == 1:  # Ethernet (what Linux's lo gives)
        return 14 if frame[12:14] == b"\x08\x00" else None
    if linktype == 113:  # Linux cooked
        return 16 if frame[14:16] == b"\x08\x00" else None
    if linktype == 276:  # Linux cooked v2
        return 20 if frame[0:2] == b"\x08\x00" else None
    if linktype == 0:  # BSD loopback: the address family in host order
        return 4 if struct.unpack("=I", frame[:4])[0] == 2 else None
    if linktype in (12, 14, 101):  # raw IP
        return 0 if frame[0] >> 4 == 4 else None
    raise ValueError(f"pcap link type {linktype} is not handled")


def read_connections(pcap: Path, port: int) -> list[tuple[Side, Side]]:
    """Every TCP connection to `port` in a classic pcap, as (client → server, server → client); a SYN
    from the client starts a new one (a client port may be used again)."""
    data = pcap.read_bytes()
    endian, ns_per_unit = {b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),
                           b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1)}[data[:4]]
    linktype = struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF
    record = struct.Struct(endian + "IIII")
    live: dict[tuple[bytes, int], tuple[Side, Side]] = {}
    connections = []
    pos = 24
    while pos + record.size <= len(data):
        seconds, fraction, caplen, _ = record.unpack_from(data, pos)
        frame = data[pos + record.size : pos + record.size + caplen]
        pos += record.size + caplen
        ip = ip_offset(linktype, frame)
        if ip is None or frame[ip + 9] != 6:
            continue
        ihl, total = (frame[ip] & 15) * 4, struct.unpack_from("!H", frame, ip + 2)[0]
        tcp = ip + ihl
        sport, dport, seq = struct.unpack_from("!HHI", frame, tcp)
        flags, payload = frame[tcp + 13], frame[tcp + (frame[tcp + 12] >> 4) * 4 : ip + total]
        to_server = dport == port
        client = (frame[ip + 12 : ip + 16], sport) if to_server else (frame[ip + 16 : ip + 20], dport)
        if (to_server and flags & SYN and not flags & ACK) or client not in live:
            live[client] = (Side(), Side())
            connections.append(live[client])
        side = live[client][0 if to_server else 1]
        if flags & SYN:
            side.isn = seq
        elif payload:
            side.segments.append((seconds * 1_000_000_000 + fraction * ns_per_unit, seq, payload))
    return connections


def reassemble(side: Side) -> Stream:
    """The direction's bytes in sequence order, up to the first hole the capture left."""
    if not side.segments:
        return Stream(b"", [0], [0])
    base = side.isn + 1 if side.isn is not None else side.segments[0][1]
    data, starts, times, latest = bytearray(), [], [], 0
    for offset, ts, payload in sorted(((seq - base) % (1 << 32), ts, payload) for ts, seq, payload in side.segments):
        if offset + len(payload) <= len(data):
            continue  # bytes already had (a retransmission)
        if offset > len(data):
            break
        latest = max(latest, ts)  # in-order bytes are whole only once everything before them is
        starts.append(len(data))
        times.append(latest)
        data += payload[len(data) - offset :]
    return Stream(bytes(data), starts, times)


def head_fields(head: bytes) -> tuple[str, dict[str, str]]:
    """(first line, {lower-case header name: value})."""
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}


def requests_in(stream: Stream) -> list[tuple[str, str | None, int, int]]:
    """(method, request id, first byte ns, last byte ns) of each whole request in a client's stream."""
    data, out, pos = stream.data, [], 0
    while (head_end := data.find(b"\r\n\r\n", pos)) >= 0:
        line, headers = head_fields(data[pos:head_end])
        end = head_end + 4 + int(headers.get("content-length", "0"))
        if end > len(data):
            break
        out.append((line.split(" ", 1)[0], headers.get(ID_HEADER.lower()), stream.time_at(pos), stream.time_at(end - 1)))
        pos = end
    return out


def dechunk(data: bytes, pos: int) -> tuple[bytes, list[tuple[int, int]], int] | None:
    """A chunked body from `pos`: (body, [(body offset, stream offset) of each chunk], end), None if cut."""
    body, pieces = bytearray(), []
    while (line_end := data.find(b"\r\n", pos)) >= 0:
        size = int(data[pos:line_end].split(b";")[0], 16)
        start = line_end + 2
        if size == 0:  # no trailers: the empty line follows
            return (bytes(body), pieces, start + 2) if data[start : start + 2] == b"\r\n" else None
        if start + size + 2 > len(data):
            return None
        pieces.append((len(body), start))
        body += data[start : start + size]
        pos = start + size + 2
    return None


RESPONSES_DELTAS = ("response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta",
                    "response.reasoning_text.delta", "response.reasoning_summary_text.delta")


def carries_text(doc: dict) -> bool:
    """Whether an SSE event's JSON carries generated text (answer or reasoning): an OpenAI chunk's
    choices[0].text or delta.content, a Responses API text delta, a Messages API content_block_delta's
    text, thinking or partial_json."""
    kind = doc.get("type")
    if kind in RESPONSES_DELTAS:
        return bool(doc.get("delta"))
    if kind == "content_block_delta":
        delta = doc.get("delta") or {}
        return bool(delta.get("text") or delta.get("thinking") or delta.get("partial_json"))
    choice = (doc.get("choices") or [{}])[0]
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


def text_events(body: bytes, pieces: list[tuple[int, int]],
                stream: Stream) -> tuple[str | None, list[tuple[int, int | None]]]:
    """The completion's id, and (ns of the packet completing the event, server t_ns) of each SSE event
    carrying generated text."""
    offsets, out, pos, response_id = [p[0] for p in pieces], [], 0, None
    while (end := body.find(b"\n\n", pos)) >= 0:
        payload = b"".join(line[5:].strip() for line in body[pos:end].split(b"\n") if line.startswith(b"data:"))
        pos = end + 2
        if not payload.startswith(b"{"):
            continue  # [DONE]
        doc = json.loads(payload)
        response_id = response_id or doc.get("id")
        if carries_text(doc):
            piece = bisect_right(offsets, end + 1) - 1
            out.append((stream.time_at(pieces[piece][1] + end + 1 - pieces[piece][0]), doc.get("t_ns")))
    return response_id, out


def responses_in(stream: Stream) -> list[tuple[int, int, int, str | None, list[tuple[int, int | None]]]]:
    """(status, first byte ns, last byte ns, completion id, text events) of each whole response in a server's stream."""
    data, out, pos = stream.data, [], 0
    while (head_end := data.find(b"\r\n\r\n", pos)) >= 0:
        line, headers = head_fields(data[pos:head_end])
        start = head_end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = dechunk(data, start)
            if parsed is None:
                break
            body, pieces, end = parsed
        else:
            end = start + int(headers.get("content-length", "0"))
            body, pieces = data[start:end], [(0, start)]
            if end > len(data):
                break
        if headers.get("content-type", "").startswith("text/event-stream"):
            response_id, events = text_events(body, pieces, stream)
        else:
            response_id, events = (json.loads(body).get("id") if body.startswith(b"{") else None), []
        out.append((int(line.split(" ")[1]), stream.time_at(pos), stream.time_at(end - 1), response_id, events))
        pos = end
    return out


def wire_exchanges(pcap: Path, port: int) -> list[Exchange]:
    """Every whole request/response pair in the capture, in request order."""
    exchanges = []
    for up, down in read_connections(pcap, port):
        for request, response in zip(requests_in(reassemble(up)), responses_in(reassemble(down))):
            exchanges.append(Exchange(*request, *response))
    return sorted(exchanges, key=lambda e: e.request_first)


def wire_metrics(e: Exchange) -> dict:
    """The wire's numbers for one exchange, in ms (see the module docstring)."""
    m = {"e2e": (e.response_last - e.request_last) / 1e6, "ttfb": (e.response_first - e.request_last) / 1e6}
    times = [t for t, _ in e.content]
    if times:
        m["ttft"] = (times[0] - e.request_last) / 1e6
        m["itl"] = list(np.diff(times) / 1e6)
        if len(times) > 1:
            m["tpot"] = (e.response_last - times[0]) / 1e6 / (len(times) - 1)
    return m


# -- latscope, in this process ----------------------------------------------------------------------


@dataclass
class Record:
    seq: int
    warmup: bool
    intended_ns: int
    sent_ns: int
    token_ns: list[int]
    end_ns: int
    output_tokens: int
    error: str | None


class RecordingClient:
    """latscope's real client; keeps what every `send` returned. Everything else is handed on as it is."""

    def __init__(self, inner: Client) -> None:
        self.inner, self.records = inner, []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def send(self, request: Request) -> Outcome:
        outcome = await self.inner.send(request)
        self.records.append(Record(request.seq, request.warmup, request.intended_ns, outcome.sent_ns,
                                   list(outcome.token_ns or ()), outcome.end_ns, outcome.output_tokens, outcome.error))
        return outcome


async def run_engine(scenario: Scenario) -> list[Record]:
    """The scenario's plan through one real Engine in this process, with the settings a worker takes from
    the scenario (engine._worker; cf. protocols._hold); what each request's Outcome said."""
    plan = build_plan(scenario)
    client = RecordingClient(make_client(scenario))
    await client.open()
    t0 = time.perf_counter_ns() + 300_000_000
    windows = [(t0 + int(p.start_s * 1e9), t0 + int((p.start_s + p.duration_s) * 1e9)) for p in plan.phases if p.warmup]
    engine = Engine(client, t0 + (plan.offsets_s * 1e9).astype(np.int64), np.arange(len(plan)), plan.cls, plan.warmup,
                    (plan.prompt_tokens, plan.output_tokens, plan.item), plan.class_names, windows, t0_ns=t0,
                    interval_s=scenario.output.interval, max_in_flight=scenario.limits.max_in_flight,
                    overflow=scenario.limits.overflow, drain_timeout_s=scenario.target.timeout + 1.0,
                    report=lambda message: None, should_stop=lambda: False, precise_timer=scenario.limits.timer == "precise")
    settle_gc()  # as in a worker
    try:
        await engine.run()
    finally:
        await client.close()
    return client.records


def scenario_dict(url: str, stream: bool, rate: float, requests: int, out: Path, protocol: str = "openai") -> dict:
    """The run's scenario: openai /v1/completions against the stream target (its timing asked for in the
    body), or a typed-event protocol against the events server (timed by its command line; the body is
    the API's own)."""
    options: dict = {"stream": stream}
    if protocol == "openai":
        options.update(api="completions", extra_body={"ttft_ms": TTFT_MS, "itl_ms": ITL_MS})
        if stream:
            options["include_usage"] = True
    section = "anthropic" if protocol == "anthropic-messages" else "openai"
    return {
        "name": f"wire-truth-{protocol}-{'stream' if stream else 'whole'}", "seed": 1,
        "target": {"url": url, "protocol": protocol, "model": "bench", "timeout": 30, "request_id_header": ID_HEADER,
                   section: options},
        "workload": {"classes": [{"name": "c", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}]},
        "phases": [{"name": "warmup", "duration": WARMUP / rate, "warmup": True, "arrival": {"type": "constant", "rate": rate}},
                   {"name": "measure", "duration": requests / rate, "arrival": {"type": "constant", "rate": rate}}],
        "output": {"dir": str(out)},
    }


def latscope_metrics(r: Record, start_ns: int) -> dict:
    """latscope's numbers for one request in ms, its clock started at `start_ns` (intended or sent)."""
    m = {"e2e": (r.end_ns - start_ns) / 1e6}
    if r.token_ns:
        m["ttft"] = (r.token_ns[0] - start_ns) / 1e6
        m["itl"] = list(np.diff(r.token_ns) / 1e6)
        tokens = r.output_tokens or len(r.token_ns)
        if tokens > 1:
            m["tpot"] = (r.end_ns - r.token_ns[0]) / 1e6 / (tokens - 1)
    else:
        m["ttfb"] = m["e2e"]  # no chunks: ttft = latency
    return m


def match(records: list[Record], exchanges: list[Exchange]) -> tuple[list[tuple[Record, Exchange]], str]:
    """latscope's records paired with the wire's exchanges: by request id when the wire has them, else by order."""
    posts = [e for e in exchanges if e.method == "POST"]
    if posts and all(e.request_id is not None for e in posts):
        by_id = {request_row(e.request_id): e for e in posts}  # latscope's ids are UUIDs that say the row
        return [(r, by_id[r.seq]) for r in records if r.seq in by_id], f"the {ID_HEADER} header"
    ordered = sorted(records, key=lambda r: r.sent_ns)
    return list(zip(ordered, posts)), (f"order (no {ID_HEADER} on the wire: the n-th request latscope sent is the "
                                       f"n-th on the wire; {len(ordered)} records, {len(posts)} wire requests)")


def measure_latscope(url: str, port: int, stream: bool, args: argparse.Namespace, work: Path, cpu: int | None,
                     protocol: str = "openai") -> dict:
    name = ("stream" if stream else "whole") + ("" if protocol == "openai" else f"-{protocol}")
    scenario = scenario_from_dict(scenario_dict(url, stream, args.rate, args.requests, work / name, protocol))
    pcap = work / f"latscope-{name}.pcap"
    with capture(port, pcap) as counts, pinned(cpu):
        clock_before = realtime_minus_monotonic()
        records = uvloop.run(run_engine(scenario))
        clock_after = realtime_minus_monotonic()
    clock = (clock_before + clock_after) // 2
    pairs, matched_by = match(records, wire_exchanges(pcap, port))
    measured = [(r, e) for r, e in pairs if not r.warmup and r.error is None and e.status == 200]
    result = {
        "records": len(records), "errors": sum(r.error is not None for r in records), "matched_by": matched_by,
        "unmatched": sum(not r.warmup for r in records) - sum(not r.warmup for r, _ in pairs), "measured": len(measured),
        "packets": counts, "clock_drift_us": (clock_after - clock_before) / 1e3,
        "intended": compare([(latscope_metrics(r, r.intended_ns), wire_metrics(e)) for r, e in measured]),
        "sent": compare([(latscope_metrics(r, r.sent_ns), wire_metrics(e)) for r, e in measured]),
        "send_lag": spread([(r.sent_ns - r.intended_ns) / 1e6 for r, _ in measured]),
        "send_lag_worst": sorted(((r.sent_ns - r.intended_ns) / 1e6, r.seq) for r, _ in measured)[-5:][::-1],
        "write_path": spread([(e.request_last - clock - r.sent_ns) / 1e6 for r, e in measured]),
        "request_first_to_last_byte": spread([(e.request_last - e.request_first) / 1e6 for _, e in measured]),
        "read_delay_end": spread([(r.end_ns + clock - e.response_last) / 1e6 for r, e in measured]),
    }
    if stream:
        result["read_delay_first_token"] = spread([(r.token_ns[0] + clock - e.content[0][0]) / 1e6 for r, e in measured])
        result["server_write_to_packet"] = spread([(t - clock - t_ns) / 1e6 for _, e in measured for t, t_ns in e.content
                                                   if t_ns is not None])
    result["bar"], result["bar_from_sent"] = bar(result["intended"]), bar(result["sent"])
    return result


# -- peers ------------------------------------------------------------------------------------------


def aiperf_records(path: Path) -> dict[str, dict]:
    """aiperf's profiling (not warm-up) records by X-Request-ID: its own numbers in ms, as it reports them."""
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        meta, m = record.get("metadata", {}), record.get("metrics", {})
        if meta.get("benchmark_phase") != "profiling":
            continue
        mine = {key: float(m[name]["value"]) for key, name in
                (("ttft", "time_to_first_token"), ("e2e", "request_latency"), ("tpot", "inter_token_latency")) if name in m}
        mine["itl"] = [float(v) for v in m.get("inter_chunk_latency", {}).get("value", [])]
        if meta.get("credit_issued_ns") and meta.get("request_start_ns"):
            mine["send_lag"] = (meta["request_start_ns"] - meta["credit_issued_ns"]) / 1e6
        out[meta["x_request_id"]] = mine
    return out


def measure_aiperf(url: str, port: int, args: argparse.Namespace, work: Path, cpu: int | None) -> dict:
    venv = args.aiperf_venv
    if not (venv / "bin" / "aiperf").exists():
        return {"skipped": f"no {venv}/bin/aiperf (see benchmarks/wire_truth.md)"}
    out, pcap = work / "aiperf", work / "aiperf.pcap"
    try:
        with capture(port, pcap), pinned(cpu):
            run_independent_tool.main(["--url", url, "--rate", str(args.rate), "--requests", str(args.requests),
                                       "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
                                       "--warmup-requests", str(WARMUP), "--out", str(out), "--tool-venv", str(venv)])
    except SystemExit as exc:
        return {"failed": str(exc)[-2000:]}
    return peer_vs_wire(aiperf_records(out / "aiperf" / "profile_export.jsonl"), wire_exchanges(pcap, port),
                        lambda e: e.request_id, "the X-Request-ID header aiperf sends") | {
        "version": package_version(venv / "bin" / "python", "aiperf")}


def peer_vs_wire(theirs: dict[str, dict], exchanges: list[Exchange], key: Callable[[Exchange], str | None],
                 matched_by: str) -> dict:
    """A peer's per-request numbers (by an id) against the wire's for the same requests."""
    posts = [e for e in exchanges if e.method == "POST"]
    pairs = [(theirs[key(e)], wire_metrics(e)) for e in posts if key(e) in theirs and e.status == 200]
    return {"matched_by": matched_by, "records": len(theirs), "wire_requests": len(posts), "measured": len(pairs),
            "vs_wire": compare(pairs), "send_lag": spread([a["send_lag"] for a, _ in pairs if "send_lag" in a]),
            "request_first_to_last_byte": spread([(e.request_last - e.request_first) / 1e6 for e in posts])}


def package_version(python: Path, package: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                          capture_output=True, text=True).stdout.strip() or "?"


def guidellm_command(url: str, args: argparse.Namespace, tokenizer: Path, report: Path) -> list[str]:
    """guidellm 0.8's command line: open-loop constant rate, streaming /v1/completions, exact lengths; its
    warm-up requests are part of max_requests, and it measures only between its warm-up and cool-down."""
    return [str(args.guidellm_venv / "bin" / "guidellm"), "run",
            "--backend", f"kind=openai_http,target={url},model=bench,request_format=/v1/completions",
            "--profile", f"kind=constant,rate={args.rate:g},warmup={WARMUP},cooldown=0",
            "--constraint", f"kind=max_requests,count={WARMUP + args.requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
            "--output", f"kind=json,path={report}", "--disable-console-interactive"]


def guidellm_records(report: Path) -> dict[str, dict]:
    """guidellm's successful requests inside its measured window, by the completion id the server sent,
    its own numbers in ms: time_to_first_token_ms, request_latency (s), inter_token_latency_ms (its ITL is
    (last token − first token) / (tokens − 1), latscope's tpot); its send lag is request_dispatch_delay (s)."""
    benchmark = json.loads(report.read_text())["benchmarks"][0]
    window = benchmark["scheduler_metrics"]
    return {r["response_id"]: {"ttft": r["time_to_first_token_ms"], "e2e": r["request_latency"] * 1e3,
                               "tpot": r["inter_token_latency_ms"], "send_lag": r["request_dispatch_delay"] * 1e3}
            for r in benchmark["requests"]["successful"]
            if window["measure_start_time"] <= r["request_start_time"] <= window["measure_end_time"]}


def measure_guidellm(url: str, port: int, args: argparse.Namespace, work: Path, cpu: int | None) -> dict:
    venv = args.guidellm_venv
    if not (venv / "bin" / "guidellm").exists():
        return {"skipped": f"no {venv}/bin/guidellm (see benchmarks/wire_truth.md)"}
    report, pcap, log = work / "guidellm.json", work / "guidellm.pcap", work / "guidellm.log"
    tokenizer = run_independent_tool.build_tokenizer(venv / "bin" / "python", venv, work / "guidellm-tokenizer")
    command = guidellm_command(url, args, tokenizer, report)
    budget_s = 180 + (WARMUP + args.requests) / args.rate * 2
    try:
        with capture(port, pcap), pinned(cpu), log.open("w") as out:
            done = subprocess.run(command, env=run_independent_tool.tool_env(), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=budget_s)
    except subprocess.TimeoutExpired:
        return {"failed": f"guidellm ran past {budget_s:.0f} s", "command": command}
    if done.returncode != 0 or not report.exists():
        return {"failed": f"rc={done.returncode}: " + log.read_text(errors="replace")[-1500:], "command": command}
    return peer_vs_wire(guidellm_records(report), wire_exchanges(pcap, port), lambda e: e.response_id,
                        "the completion id the server sent (guidellm keeps it as response_id)") | {
        "version": package_version(venv / "bin" / "python", "guidellm"), "command": command}


# -- statistics and the report ------------------------------------------------------------------------


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)), "n": len(values)}


def flat(rows: list[dict], metric: str) -> list[float]:
    return [v for row in rows if metric in row for v in (row[metric] if metric == "itl" else [row[metric]])]


def compare(pairs: list[tuple[dict, dict]]) -> dict:
    """Per metric: the tool's and the wire's p50/p99 over the same requests, and of the per-request
    (per gap for itl) offset tool − wire."""
    out = {}
    for metric in ("ttft", "ttfb", "e2e", "itl", "tpot"):
        both = [(a, b) for a, b in pairs if metric in a and metric in b]
        if not both:
            continue
        if metric == "itl":
            offsets = [x - y for a, b in both if len(a["itl"]) == len(b["itl"]) for x, y in zip(a["itl"], b["itl"])]
        else:
            offsets = [a[metric] - b[metric] for a, b in both]
        out[metric] = {"tool": spread(flat([a for a, _ in both], metric)), "wire": spread(flat([b for _, b in both], metric)),
                       "offset": spread(offsets)}
    return out


def bar(comparison: dict) -> dict:
    """The acceptance bar, per check: (latscope, wire, allowed difference, holds)."""
    checks = {}
    for metric in ("ttft", "ttfb", "e2e"):
        for p in ("p50", "p99") if metric in comparison else ():
            ours, wire = comparison[metric]["tool"][p], comparison[metric]["wire"][p]
            allowed = BAR_MS + BAR_SHARE * wire
            checks[f"{metric} {p}"] = {"latscope": ours, "wire": wire, "allowed": allowed, "holds": abs(ours - wire) <= allowed}
    if "itl" in comparison:
        ours, wire = comparison["itl"]["tool"]["p50"], comparison["itl"]["wire"]["p50"]
        checks["itl p50"] = {"latscope": ours, "wire": wire, "allowed": ITL_BAR_MS, "holds": abs(ours - wire) <= ITL_BAR_MS}
    return checks


def metric_rows(comparison: dict, label: str = "",
                only: tuple[str, ...] = ("ttft", "ttfb", "e2e", "itl", "tpot")) -> list[list[str]]:
    rows = []
    for metric, c in ((m, c) for m, c in comparison.items() if m in only):
        off = c["offset"] or {}
        rows.append([f"{label}{metric}", fmt(c["tool"]["p50"], 3), fmt(c["wire"]["p50"], 3), fmt(c["tool"]["p99"], 3),
                     fmt(c["wire"]["p99"], 3), fmt(off.get("p50"), 3), fmt(off.get("p99"), 3)])
    return rows


def spread_text(s: dict | None) -> str:
    return "–" if s is None else f"{s['p50']:.3f} / {s['p99']:.3f}"


def latscope_md(name: str, r: dict) -> str:
    header = ["metric (ms)", "latscope p50", "wire p50", "latscope p99", "wire p99", "offset p50", "offset p99"]
    table = markdown_table(header, metric_rows(r["intended"]) + metric_rows(r["sent"], "from sent: ", ("ttft", "ttfb", "e2e")))
    worst = ", ".join(f"{ms:.2f} ms (request {seq})" for ms, seq in r["send_lag_worst"])
    parts = [f"send lag {spread_text(r['send_lag'])}, the largest {worst}", f"write path (sent → request's last packet) {spread_text(r['write_path'])}"]
    if "read_delay_first_token" in r:
        parts.append(f"read delay, first token (packet → latscope's stamp) {spread_text(r['read_delay_first_token'])}")
    parts.append(f"read delay, end {spread_text(r['read_delay_end'])}")
    parts.append(f"request's first → last byte on the wire {spread_text(r['request_first_to_last_byte'])}")
    if "server_write_to_packet" in r:
        parts.append(f"clock check, server write → packet {spread_text(r['server_write_to_packet'])}")
    return (f"**latscope, {name}** ({r['measured']} measured requests, matched by {r['matched_by']}, {r['unmatched']} "
            f"not found on the wire; {r['errors']} errors; "
            f"packets {r['packets']}):\n\n{table}\n\nParts of the offset, p50 / p99 ms: {'; '.join(parts)}.\n\n"
            f"Acceptance bar (latscope's numbers, from the intended time): {bar_text(r['bar'])}\n\n"
            f"The same bar from latscope's sent_ns (send lag left out): {bar_text(r['bar_from_sent'])}\n")


def typed_md(report: dict) -> str:
    """The typed-event protocols' sections (none when not measured)."""
    runs = [(p, report["latscope"][p]) for p in TYPED_PROTOCOLS if p in report["latscope"]]
    if not runs:
        return ""
    head = (f"**Typed-event streams** (`tests/protocols/events_server.py` on 127.0.0.1, aiohttp: the same timing, first "
            f"token {TTFT_MS} ms after the request, then one every {ITL_MS} ms, {OUTPUT_TOKENS} text deltas, each event "
            "in a write of its own; the wire's token = the packet completing a text-delta event: Responses "
            "`response.output_text.delta`, Messages `content_block_delta` with text):\n\n")
    return head + "\n".join(latscope_md(f"{protocol}, streaming", r) for protocol, r in runs)


def bar_text(checks: dict) -> str:
    each = "; ".join(f"{k} {c['latscope']:.3f} vs {c['wire']:.3f} (±{c['allowed']:.3f}) {'✓' if c['holds'] else '✗'}"
                     for k, c in checks.items())
    return f"{each}: **{'holds' if all(c['holds'] for c in checks.values()) else 'does not hold'}**."


def peer_md(name: str, p: dict) -> str:
    if "vs_wire" not in p:
        return f"**{name}**: not measured: {p.get('skipped') or p.get('failed')}\n"
    header = ["metric (ms)", f"{name} p50", "wire p50", f"{name} p99", "wire p99", "offset p50", "offset p99"]
    lag = f"; its send lag p50 / p99 {spread_text(p['send_lag'])} ms" if p.get("send_lag") else ""
    lag += f"; request's first → last byte on the wire {spread_text(p['request_first_to_last_byte'])} ms"
    return (f"**{name} {p['version']}** ({p['measured']} requests, matched by {p['matched_by']}{lag}):\n\n"
            f"{markdown_table(header, metric_rows(p['vs_wire']))}\n")


def report_md(report: dict) -> str:
    a = report["args"]
    peers = "\n".join(peer_md(name, p) for name, p in report["peers"].items()) or "Peers not run (--no-peers).\n"
    return f"""{SECTION_TITLE}

Machine: {machine_line(report['machine'])}

`latscope.targets.stream` on 127.0.0.1 (first token 20 ms after reading the request, then every 10 ms; one SSE
event per chunk per write), /v1/completions, 64-token prompts → 32 tokens, constant {a['rate']:g} req/s,
{WARMUP} warm-up + {a['requests']} measured requests per run; client on one CPU, server on the other.
Every packet on `lo` recorded by tcpdump (ns timestamps) and parsed here (TCP reassembled by sequence
number). Wire instants: request = packet with the request's last byte; first content = packet completing
the first SSE event with text; each token = packet completing its event; end = packet with the response's
last byte (`0\\r\\n\\r\\n`, or the end of a Content-Length body); ttfb = packet with the response's first byte.
latscope's rows time from the intended send (its rule), then from its sent_ns; offsets are per request
(per gap for itl), latscope − wire. The TTFT offset = send lag + write path + read delay (exactly; the
realtime−monotonic clock offset measured around each run).

{latscope_md('streaming', report['latscope']['stream'])}
{latscope_md('non-streaming (ttfb: latscope has none, its ttft = latency)', report['latscope']['whole'])}
{typed_md(report)}
**Peers against the wire**, same server, same sitting, each with its own capture, numbers as the tool reports them
(from its own send), streaming, same rate and lengths. aiperf: ttft = time_to_first_token, e2e = request_latency,
tpot = inter_token_latency, itl = inter_chunk_latency. guidellm: ttft = time_to_first_token_ms, e2e =
request_latency, tpot = inter_token_latency_ms (it keeps no per-gap times).

{peers}
Run time {report['wall_s']:.0f} s. JSON: `{report.get('json_file', '')}`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests per run (after 20 warm-up)")
    parser.add_argument("--rate", type=float, default=20.0, help="constant open-loop rate, req/s")
    parser.add_argument("--no-peers", action="store_true", help="latscope only, no aiperf / guidellm")
    parser.add_argument("--aiperf-venv", type=Path, default=Path("/tmp/venv-aiperf"))
    parser.add_argument("--guidellm-venv", type=Path, default=Path("/tmp/venv-guidellm"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--typed", default=",".join(TYPED_PROTOCOLS),
                        help="typed-event protocols to measure streaming too, comma-separated ('' for none)")
    args = parser.parse_args()
    typed = [p for p in args.typed.split(",") if p]
    if unknown := set(typed) - set(TYPED_PROTOCOLS):
        parser.error(f"--typed takes {', '.join(TYPED_PROTOCOLS)}, not {', '.join(sorted(unknown))}")
    started = time.monotonic()
    problem = capture_problem()
    if problem:
        print(f"wire_truth: skipped: {problem}")
        return
    report = {"machine": machine_facts(PACKAGES), "args": {"rate": args.rate, "requests": args.requests}, "latscope": {}, "peers": {}}
    client_cpu, server_cpu = cpus()
    with tempfile.TemporaryDirectory(prefix="latscope-wire-") as tmp:
        work, port = Path(tmp), free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "latscope.targets.stream", "--port", str(port), "--ttft-ms", str(TTFT_MS),
                   "--itl-ms", str(ITL_MS), "--tokens", str(OUTPUT_TOKENS)]
        with server_process(command, f"{url}/health", work / "stream.log", server_cpu):
            for stream in (True, False):
                print(f"latscope, {'streaming' if stream else 'non-streaming'} …", flush=True)
                report["latscope"]["stream" if stream else "whole"] = measure_latscope(url, port, stream, args, work, client_cpu)
            if not args.no_peers:
                print("aiperf …", flush=True)
                report["peers"]["aiperf"] = measure_aiperf(url, port, args, work, client_cpu)
                print("guidellm …", flush=True)
                report["peers"]["guidellm"] = measure_guidellm(url, port, args, work, client_cpu)
        if typed:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = [sys.executable, str(EVENTS_SERVER), "--port", str(port), "--ttft-ms", str(TTFT_MS),
                       "--itl-ms", str(ITL_MS), "--tokens", str(OUTPUT_TOKENS), "--reasoning", "0"]
            with server_process(command, f"{url}/health", work / "events.log", server_cpu):
                for protocol in typed:
                    print(f"latscope, {protocol} streaming …", flush=True)
                    report["latscope"][protocol] = measure_latscope(url, port, True, args, work, client_cpu, protocol)
    report["wall_s"] = time.monotonic() - started
    write_report_json(report, args.out, "wire_truth")
    text = report_md(report)
    print(text)
    (args.out / "wire_truth-section.md").write_text(text)
    if not args.no_results_md:
        update_results_md(text, SECTION_TITLE)


if __name__ == "__main__":
    main()
