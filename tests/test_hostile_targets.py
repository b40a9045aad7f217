"""Hostile targets (tests/hostile_target.py, a real server on loopback): a response that never ends,
an enormous one, a KServe binary response that declares a shape of 10**24 elements, an endless SSE
stream, and a server that echoes the API key in its error message. A real `latscope run` against
each: every sent request counted (completed, an error or cancelled), the endless and enormous ones
cut at limits.max_response_bytes as `protocol` errors, the worker's memory bounded, and the key
nowhere — not in any file of the results directory, not on the console.

Besides: a request whose headers would inject a line is never written (each client checks it
again, whatever the scenario's validation did), and an exception escaping a client is a counted
error, not a request that vanishes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from conftest import REPO
from hostile_target import serve_hostile
from latscope.records import Outcome, Request
from latscope.scenario import scenario_from_dict

SECRET = "sk-hostile-Zq9xW4"  # the API key (target.api_key: ${HOSTILE_KEY})
HEADER_SECRET = "hdr-secret-7Kp2"  # a header's credential (X-Api-Key: ${HOSTILE_HEADER})
LIMIT = 4_000_000  # limits.max_response_bytes of the run: small, so the endless responses end quickly
PER_CLASS = 3
# Peak RSS of the run (the parent and its worker, the largest of them): ~200 MB here. Without the
# response limit the worker grew past 2.3 GB against /huge in 6 s.
MAX_RSS_MB = 450
# Runs `latscope run` and prints the largest resident set of it and its workers (waited-for children).
MEASURED = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(p.returncode)")


def _hostile_scenario(url: str, out: Path) -> dict:
    tensors = [{"name": "x", "shape": [1, 4]}]
    classes = [
        {"name": "endless", "url": f"{url}/endless"},  # plain HTTP, a chunked body without end
        {"name": "huge", "url": f"{url}/huge", "protocol": "kserve-v2", "model": "m", "tensors": tensors},
        {"name": "big_shape", "protocol": "kserve-v2", "model": "big", "kserve": {"binary": True}, "tensors": tensors},
        {"name": "echo", "protocol": "kserve-v2", "model": "echo", "tensors": tensors,  # a 500 repeating the keys
         "headers": {"X-Api-Key": "${HOSTILE_HEADER}"}},
        {"name": "sse", "protocol": "openai", "model": "m"},  # a stream that never ends
    ]
    rate = 10
    return {
        "name": "hostile", "seed": 3,
        "target": {"url": url, "timeout": 8, "api_key": "${HOSTILE_KEY}"},
        "workload": {"classes": classes},
        "phases": [{"name": c["name"], "duration": PER_CLASS / rate, "classes": [c["name"]],
                    "arrival": {"type": "constant", "rate": rate}} for c in classes],
        "limits": {"max_response_bytes": LIMIT},
        "output": {"dir": str(out)},
    }


def test_a_run_against_hostile_targets_counts_everything_bounds_memory_and_leaks_no_secret(tmp_path):
    with serve_hostile() as url:
        scenario = tmp_path / "hostile.yaml"
        scenario.write_text(yaml.safe_dump(_hostile_scenario(url, tmp_path / "results")))
        env = {**os.environ, "HOSTILE_KEY": SECRET, "HOSTILE_HEADER": HEADER_SECRET}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", MEASURED, sys.executable, "-m", "latscope.cli", "run", str(scenario),
                               "--workers", "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1, console  # every request failed: the run measured no latency
    assert "Traceback" not in console and "no request succeeded: 15 sent, 15 errors (http_5xx 3, protocol 12): no latency" in console
    maxrss_mb = int(console.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024
    print(f"hostile run: {took:.1f} s, peak RSS {maxrss_mb:.0f} MB")
    assert maxrss_mb < MAX_RSS_MB

    (run_dir,) = (tmp_path / "results").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    r = s["requests"]
    assert r["sent"] == 5 * PER_CLASS and r["unaccounted"] == 0
    assert r["sent"] == r["completed"] + r["errors"] + r["cancelled"]
    assert r["completed"] == 0 and r["cancelled"] == 0
    assert {c: v["errors"] for c, v in s["requests_by_class"].items()} == dict.fromkeys(
        ("endless", "huge", "big_shape", "echo", "sse"), PER_CLASS)
    assert s["errors"] == {"connect": 0, "timeout": 0, "http_4xx": 0, "http_5xx": PER_CLASS, "protocol": 4 * PER_CLASS}
    protocol = s["error_examples"]["protocol"]
    assert f"response larger than limits.max_response_bytes ({LIMIT:,} bytes): cut, connection dropped" in protocol
    assert any(m.startswith("invalid tensor response: output 'y'") and "cannot hold" in m for m in protocol)
    assert s["error_examples"]["http_5xx"] == [
        "HTTP 500 Internal Server Error: invalid credentials: Bearer <redacted> / <redacted>"]

    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"summary.json", "events.jsonl", "report.html", "summary.md", "scenario.yaml"} <= {p.name for p in written}
    for secret in (SECRET, HEADER_SECRET):
        leaked = [p.name for p in written if secret.encode() in p.read_bytes()]
        assert leaked == [] and secret not in console, secret


def test_a_launched_target_that_prints_its_key_leaks_it_neither_to_target_log_nor_to_the_console(tmp_path):
    """The launched target's own output (target.log, and the last lines the error quotes when it dies
    before it is ready) is scrubbed like everything else a target says. Its output also holds text
    that would be rich markup: printed as is, never interpreted."""
    blurt = "import os, sys; print('my token is', os.environ['API_TOKEN'], '[/bold]', flush=True); sys.exit(3)"
    data = {"name": "blurt", "target": {"url": "http://127.0.0.1:9", "launch": {
                "command": [sys.executable, "-c", blurt], "ready_url": "http://127.0.0.1:9/ready",
                "env": {"API_TOKEN": "${BLURT_TOKEN}"}}},
            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
            "output": {"dir": str(tmp_path / "results")}}
    scenario = tmp_path / "blurt.yaml"
    scenario.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "latscope.cli", "run", str(scenario)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "BLURT_TOKEN": SECRET})
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in console
    assert "exited with code 3 before it was ready" in console and "my token is <redacted> [/bold]" in console
    (run_dir,) = (tmp_path / "results").iterdir()
    assert (run_dir / "target.log").read_text() == "my token is <redacted> [/bold]\n"
    assert SECRET not in console


# -- a request that would inject a header line is never written --------------------------------------


async def _listen(received: list[bytes]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("where", ["header", "api_key", "method", "path"])
def test_clients_refuse_cr_lf_and_nul_before_writing_a_byte(where):
    """The scenario refuses these at validation; here the scenario is changed after it (as code that
    builds one may), and each HTTP client, and gRPC's, still writes nothing: the request is a counted
    `protocol` error whose reason names where, never the value."""
    from latscope.protocols import client_class

    received: list[bytes] = []
    evil = f"v{SECRET}\r\nX-Injected: 1\x00"

    async def main() -> list[Outcome]:
        server = await _listen(received)
        port = server.sockets[0].getsockname()[1]
        data = {"target": {"url": f"http://127.0.0.1:{port}", "model": "m", "timeout": 2},
                "workload": {"classes": [
                    {"name": "http"}, {"name": "openai", "protocol": "openai"},
                    {"name": "kserve", "protocol": "kserve-v2", "tensors": [{"name": "x", "shape": [1, 2]}]},
                    {"name": "grpc", "protocol": "kserve-v2-grpc", "url": f"grpc://127.0.0.1:{port}",
                     "tensors": [{"name": "x", "shape": [1, 2]}]}]},
                "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
        scenario = scenario_from_dict(data)
        target = scenario.target
        if where == "header":
            target.headers["X-Evil"] = evil
        elif where == "api_key":
            target.api_key = evil
        elif where == "method":
            target.method = "POST\r\nX-Injected: 1"
        else:
            target.path = "/x\r\nX-Injected: 1"
        from latscope.workload import Payloads

        payloads = Payloads(scenario)
        outcomes = []
        for c, protocol in enumerate(("http", "openai", "kserve-v2", "kserve-v2-grpc")):
            if protocol != "http" and where in ("method", "path"):
                continue  # the other protocols' method and path are their own (POST, from the API or model)
            cls = client_class(protocol)
            client = cls(scenario, [c], payloads) if protocol != "http" else cls(scenario, [c])
            await client.open()
            outcomes.append(await client.send(Request(0, time.perf_counter_ns(), c, False, 3, 2)))
            await client.close()
        await asyncio.sleep(0.05)
        server.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert received == []
    for outcome in outcomes:
        assert outcome.error == "protocol" and outcome.reason.startswith("not sent: "), outcome
        assert "CR, LF or NUL" in outcome.reason and SECRET not in outcome.reason


# -- an exception escaping a client is a counted error ---------------------------------------------


def test_an_exception_from_a_client_is_a_counted_error_not_a_lost_request():
    from latscope.engine import Engine
    from latscope.protocols.callable import CallableClient
    from latscope.results.schema import COUNTERS

    async def handler(request: Request) -> Outcome | None:
        if request.seq % 2:
            raise ValueError(f"Maximum allowed dimension exceeded ({SECRET})")
        return None

    reports = []

    async def main() -> Engine:
        n = 6
        t0 = time.perf_counter_ns() + 10_000_000
        ints = np.zeros(n, np.int64)
        engine = Engine(CallableClient(handler), t0 + np.arange(n, dtype=np.int64) * 2_000_000, np.arange(n),
                        np.zeros(n, np.int16), np.zeros(n, bool), (ints, ints, ints), ["default"], [],
                        t0_ns=t0, interval_s=0.1, max_in_flight=10, overflow="queue", drain_timeout_s=2.0,
                        report=reports.append, should_stop=lambda: False, precise_timer=False, secrets=[SECRET])
        not_sent, examples = await engine.run()
        assert not_sent == 0
        assert examples == {"protocol": ["the client failed: ValueError: Maximum allowed dimension exceeded "
                                         "(<redacted>)"]}
        return engine

    engine = asyncio.run(main())
    counts = dict(zip(COUNTERS, np.sum([row for rep in reports for row in rep.counters.values()], axis=0).tolist()))
    assert (counts["sent"], counts["completed"], counts["protocol"]) == (6, 3, 3)
    assert engine.unaccounted == 0


# -- gRPC: the response limit is the channel's receive limit ------------------------------------------


def test_grpc_response_over_the_limit_is_a_protocol_error_naming_the_limit():
    from latscope.protocols.kserve_grpc import MODEL_INFER, KServeGrpcClient
    from latscope.workload import Payloads
    from reference_server import proto

    service, method = MODEL_INFER.strip("/").split("/")
    big = proto.ModelInferResponse(model_name="m")
    big.outputs.add(name="y", datatype="UINT8", shape=[2_000_000])
    big.raw_output_contents.append(b"\0" * 2_000_000)
    answer = big.SerializeToString()

    async def infer(request: bytes, context) -> bytes:
        return answer

    async def main() -> Outcome:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            service, {method: grpc.unary_unary_rpc_method_handler(infer)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        data = {"target": {"url": f"grpc://127.0.0.1:{port}", "protocol": "kserve-v2-grpc", "model": "m", "timeout": 5},
                "workload": {"classes": [{"name": "c", "tensors": [{"name": "x", "shape": [1, 2]}]}]},
                "limits": {"max_response_bytes": 1_000_000},
                "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
        scenario = scenario_from_dict(data)
        client = KServeGrpcClient(scenario, [0], Payloads(scenario))
        await server.start()
        await client.open()
        try:
            return await client.send(Request(0, time.perf_counter_ns(), 0, False))
        finally:
            await client.close()
            await server.stop(None)

    outcome = asyncio.run(main())
    assert outcome.error == "protocol"
    assert outcome.reason.startswith("response larger than limits.max_response_bytes (1,000,000 bytes) (gRPC "
                                     "RESOURCE_EXHAUSTED"), outcome.reason


# -- what is scrubbed ---------------------------------------------------------------------------------


def test_secret_values_hold_every_credential_as_sent_and_bare(monkeypatch):
    """Whatever a target could echo: an API key, a credential header (as sent and without its
    scheme), what ${VAR} expanded to, the Basic credentials made from a URL's userinfo, a URL's
    password and a credential-like query value; never an ordinary header value."""
    from latscope.scenario import scrub, secret_values

    monkeypatch.setenv("HOSTILE_PASS", "pw-from-env-1")
    phases = [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]
    keyed = scenario_from_dict({"target": {"url": "http://127.0.0.1:9/", "api_key": "ak-987654", "headers": {
        "X-Token": "Token lit-token-123", "X-Trace": "plain-value"}}, "phases": phases})
    secrets = secret_values(keyed)
    assert {"ak-987654", "Token lit-token-123", "lit-token-123"} <= set(secrets) and "plain-value" not in secrets
    assert scrub("denied Bearer ak-987654 for plain-value", secrets) == "denied Bearer <redacted> for plain-value"

    userinfo = scenario_from_dict({"target": {"url": "http://u:${HOSTILE_PASS}@127.0.0.1:9/?api_key=qk-123456&x=1"},
                                   "phases": phases})
    secrets = secret_values(userinfo)
    basic = userinfo.endpoint(0).headers["Authorization"]  # the URL's userinfo, sent as Basic credentials
    assert {"pw-from-env-1", "qk-123456", basic, basic.split()[1]} <= set(secrets)
    assert scrub(f"denied {basic} (pw-from-env-1)", secrets) == "denied <redacted> (<redacted>)"


def test_requests_that_do_not_add_up_are_reported_loudly(tmp_path):
    """A worker that reports requests sent but never counted again (WorkerDone.unaccounted: a bug)
    shows in summary.json, as an event, and on the console — never silently."""
    from rich.console import Console

    from latscope import results
    from latscope.console import print_summary
    from latscope.plan import build_plan
    from latscope.run.summary import RunFacts, write_results

    scenario = scenario_from_dict({"target": {"url": "http://127.0.0.1:9"},
                                   "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 2}}]})
    facts = RunFacts(scenario, build_plan(scenario), 1, None, time.time(), unaccounted=2)
    summary = write_results(tmp_path, facts, results.EventLog(tmp_path / results.EVENTS))
    assert summary["requests"]["unaccounted"] == 2
    assert summary["validity"] == "invalid" and any("counted neither" in r for r in summary["validity_reasons"])
    assert [e["unaccounted"] for e in results.read_events(tmp_path) if e["event"] == "accounting_mismatch"] == [2]
    console = Console(record=True, width=200)
    print_summary(console, summary, tmp_path)
    assert "2 request(s) sent but counted neither completed, nor an error, nor cancelled" in console.export_text()
