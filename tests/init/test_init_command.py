"""`latscope init [URL]` against real endpoints: the reference server (one process for the module,
speaking OpenAI, KServe v2 REST and gRPC), a plain HTTP server, a dead port, a port that speaks
something else and one that never answers. Every file written validates, and runs: each run is cut
to a 0.3 s warm-up and 1 s measured (`load_scenario` overrides, as `--set` does) and must complete
requests with no errors."""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from aiohttp import web
from click.testing import CliRunner

from latscope.cli import main
from latscope.init import make_starter
from latscope.run import run_scenario
from latscope.scenario import load_scenario
from latscope.scenario.protocols import PROTOCOLS
from latscope.targets.echo import make_app

from conftest import REPO, free_port, serve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_server"))  # refserver.py: shared helpers
import refserver  # noqa: E402

cache, logs = refserver.cache, refserver.logs  # module-scoped fixtures, bound here so pytest finds them

SHORT = ["phases.0.duration=0.3s", "phases.1.duration=1s", "output.report=false"]


@pytest.fixture(scope="module")
def ref(cache: Path, logs: Path) -> Iterator[refserver.Server]:
    """The reference server: OpenAI (decoder) and KServe v2 REST (encoder) on one port, gRPC on another."""
    with refserver.running_with_grpc(cache, logs, "--max-queue-delay-us", "0") as server:
        yield server


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """latscope's demo target: any method, any path, 200 with a JSON body."""
    with serve(make_app(delay_ms=1)) as url:
        yield url


def _raw_server(answer: bytes | None) -> Iterator[int]:
    """A TCP port that sends `answer` to each connection and closes it (None: says nothing, keeps it open)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if answer is None:
                held.append(conn)
                continue
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in held:
        conn.close()


@pytest.fixture(scope="module")
def garbage() -> Iterator[int]:
    yield from _raw_server(b"\x17\x03\x01 not HTTP at all\r\n")


@pytest.fixture(scope="module")
def silent() -> Iterator[int]:
    yield from _raw_server(None)


def init(tmp_path: Path, *args: str, name: str = "latscope.yaml"):
    """`latscope init ARGS -o tmp_path/NAME`, in process: (result, the file)."""
    out = tmp_path / name
    result = CliRunner().invoke(main, ["init", *args, "-o", str(out)])
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result, out


def run_short(path: Path, tmp_path: Path, *sets: str) -> dict:
    """The written scenario, run shortened; its summary, which must count completed requests and no errors."""
    scenario = load_scenario(path, [*SHORT, f"output.dir={tmp_path / 'results'}", *sets])
    summary = run_scenario(scenario, workers=1).summary
    assert not summary["partial"], summary.get("abort_reason")
    requests = summary["requests"]
    assert requests["completed"] > 0 and requests["errors"] == 0, (requests, summary.get("error_examples"))
    assert requests["completed"] == requests["sent"]
    return summary


# ---- the reference server ---------------------------------------------------------------------------

def test_openai_endpoint_gets_a_streaming_chat_starter_that_runs(ref, tmp_path):
    result, path = init(tmp_path, ref.url)
    assert result.exit_code == 0, result.output + result.stderr
    assert "found an OpenAI-compatible server: GET /v1/models listed 1 model: decoder" in result.output
    assert "also speaks kserve-v2 (model encoder): --protocol kserve-v2" in result.output
    assert f"latscope validate {path}" in result.output and f"latscope run {path}" in result.output
    text = path.read_text()
    assert text.startswith("# latscope starter scenario") and "# What to change first:" in text
    scenario = load_scenario(path)
    t = scenario.target
    assert (t.protocol, t.url, t.model, t.openai.stream, t.launch) == ("openai", ref.url, "decoder", True, None)
    assert {(s.metric, s.stat) for s in scenario.slos} == {("ttft", "p99"), ("latency", "p99")}
    assert [p.warmup for p in scenario.phases] == [True, False] and scenario.phases[1].arrival.type == "poisson"
    assert scenario.phases[1].duration == 30
    summary = run_short(path, tmp_path, "phases.1.arrival.rate=6")
    assert summary["metrics"]["ttft"]["all"]["count"] > 0


@pytest.mark.parametrize("protocol, model", [("openai-responses", None), ("anthropic-messages", None),
                                             ("openai-embeddings", "encoder"), ("rerank", "encoder")])
def test_a_protocol_of_the_openai_family_is_written_for_an_openai_compatible_server_and_runs(ref, tmp_path, protocol, model):
    """The probe finds the OpenAI API (GET /v1/models); a protocol served beside it is written for that
    URL without a warning (its own route is not probed), with the listed model unless --model names one."""
    result, path = init(tmp_path, ref.url, "--protocol", protocol, *(["--model", model] if model else []))
    assert result.exit_code == 0, result.output + result.stderr
    assert f"({protocol}'s own route not probed)" in result.output and "warning" not in result.output.lower()
    t = load_scenario(path).target
    assert (t.protocol, t.url, t.model) == (protocol, ref.url, model or "decoder")
    summary = run_short(path, tmp_path, "phases.1.arrival.rate=4")
    assert summary["metrics"]["latency"]["all"]["count"] > 0
    if protocol in ("openai-embeddings", "rerank"):
        assert summary["batch"]["embed" if protocol == "openai-embeddings" else "rerank"]["items"] > 0
    else:
        assert summary["metrics"]["ttft"]["all"]["count"] > 0


def test_kserve_rest_starter_fills_the_models_inputs_and_runs(ref, tmp_path):
    result, path = init(tmp_path, ref.url, "--protocol", "kserve-v2")
    assert result.exit_code == 0, result.output + result.stderr
    scenario = load_scenario(path)
    assert (scenario.target.protocol, scenario.target.model) == ("kserve-v2", "encoder")
    tensors = scenario.workload.classes[0].tensors
    # From GET /v2/models/encoder: INT64 [-1, -1] inputs, made [1, 16].
    assert [(t.name, t.datatype, t.shape) for t in tensors] == [("input_ids", "INT64", [1, 16]),
                                                                ("attention_mask", "INT64", [1, 16])]
    run_short(path, tmp_path)


def test_a_kserve_path_in_the_url_picks_kserve_without_a_flag(ref, tmp_path):
    result, path = init(tmp_path, f"{ref.url}/v2/models/encoder/infer")
    assert result.exit_code == 0 and "found a KServe v2 server (REST): GET /v2 named latscope-ref" in result.output
    scenario = load_scenario(path)
    assert (scenario.target.protocol, scenario.target.url, scenario.target.model) == ("kserve-v2", ref.url, "encoder")


def test_grpc_starter_asks_server_and_model_metadata_and_runs(ref, tmp_path):
    result, path = init(tmp_path, f"grpc://{ref.grpc}")
    assert result.exit_code == 0, result.output + result.stderr
    assert "found a KServe v2 server (gRPC): gRPC ServerMetadata answered (latscope-ref" in result.output
    scenario = load_scenario(path)
    t = scenario.target
    assert (t.protocol, t.url, t.model) == ("kserve-v2-grpc", f"grpc://{ref.grpc}", "encoder")
    assert [x.name for x in scenario.workload.classes[0].tensors] == ["input_ids", "attention_mask"]
    run_short(path, tmp_path)


def test_a_grpc_port_given_as_http_is_recognised_by_its_http2_answer(ref, tmp_path):
    result, path = init(tmp_path, f"http://{ref.grpc}")
    assert result.exit_code == 0 and not result.stderr, result.stderr
    assert load_scenario(path).target.protocol == "kserve-v2-grpc"
    assert load_scenario(path).target.url == f"grpc://{ref.grpc}"


def test_use_case_preset_is_pointed_at_the_endpoint_with_its_notes_and_slos(ref, tmp_path):
    result, path = init(tmp_path, ref.url, "--use-case", "fraud_scoring")
    assert result.exit_code == 0, result.output + result.stderr
    text = path.read_text()
    assert "# fraud_scoring: real-time fraud scoring." in text  # the preset's own notes, kept
    assert "target.launch: removed" in text.split("\nname:")[0]
    scenario = load_scenario(path)
    assert scenario.name == "fraud_scoring" and scenario.target.launch is None
    assert (scenario.target.protocol, scenario.target.url) == ("kserve-v2", ref.url)
    assert {(s.stat, s.limit_ms) for s in scenario.slos} == {("p50", 8), ("p99", 42)}
    run_short(path, tmp_path, "phases.1.arrival.rate=20")


def test_a_kserve_preset_goes_over_grpc_for_a_grpc_url(ref, tmp_path):
    result, path = init(tmp_path, f"grpc://{ref.grpc}", "--use-case", "recommendation")
    assert result.exit_code == 0, result.output + result.stderr
    scenario = load_scenario(path)
    assert (scenario.target.protocol, scenario.target.url, scenario.target.launch) == (
        "kserve-v2-grpc", f"grpc://{ref.grpc}", None)


# ---- other endpoints ----------------------------------------------------------------------------------

def test_plain_http_server_gets_a_plain_http_starter_that_runs(echo, tmp_path):
    result, path = init(tmp_path, f"{echo}/predict")
    assert result.exit_code == 0 and not result.stderr, result.stderr
    assert "Found a plain HTTP endpoint (GET /predict answered 200)" in path.read_text()
    t = load_scenario(path).target
    assert (t.protocol, t.url, t.method, t.path) == ("http", echo, "GET", "/predict")
    run_short(path, tmp_path)


def test_dead_port_warns_in_one_line_and_writes_a_plain_http_starter(echo, tmp_path):
    port = free_port()
    # A real process: exit status and stderr as a user sees them.
    out = tmp_path / "dead.yaml"
    r = subprocess.run([sys.executable, "-m", "latscope.cli", "init", f"http://127.0.0.1:{port}", "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    warning = r.stderr.strip()
    assert warning == (f"warning: could not probe http://127.0.0.1:{port} (tried GET /v1/models): nothing listens on "
                       f"127.0.0.1:{port} (connection refused); wrote a plain-HTTP starter to that URL")
    scenario = load_scenario(out)
    assert (scenario.target.protocol, scenario.target.url, scenario.target.method) == ("http", f"http://127.0.0.1:{port}", "POST")
    assert "connection refused" in out.read_text().split("\nname:")[0]  # the file says so too
    run_short(out, tmp_path, f"target.url={echo}")  # what it sends is runnable once pointed at a live server


def test_a_port_speaking_something_else_warns_and_writes_a_plain_http_starter(garbage, echo, tmp_path):
    result, path = init(tmp_path, f"http://127.0.0.1:{garbage}")
    assert result.exit_code == 0
    assert f"127.0.0.1:{garbage} does not speak HTTP: it answered GET /v1/models with" in result.stderr
    assert load_scenario(path).target.protocol == "http"
    result, path = init(tmp_path, f"grpc://127.0.0.1:{garbage}", name="grpc.yaml")
    assert result.exit_code == 0
    assert f"127.0.0.1:{garbage} accepted the connection but did not answer gRPC ServerMetadata" in result.stderr
    scenario = load_scenario(path)
    assert (scenario.target.protocol, scenario.target.url) == ("http", f"http://127.0.0.1:{garbage}")
    run_short(path, tmp_path, f"target.url={echo}")


def test_a_port_that_never_answers_times_out_quickly(silent):
    started = time.monotonic()
    starter = make_starter(f"http://127.0.0.1:{silent}", timeout=0.3)
    assert time.monotonic() - started < 5
    assert starter.protocol == "http" and "did not answer GET /v1/models within 0.3 s" in starter.warning


def test_a_protocol_asked_for_but_not_found_is_written_with_a_warning(echo, tmp_path):
    result, path = init(tmp_path, echo, "--protocol", "openai")
    assert result.exit_code == 0 and f"{echo} did not answer as openai (it answered: plain HTTP only); wrote the openai" in result.stderr
    scenario = load_scenario(path)
    assert scenario.target.protocol == "openai" and scenario.target.model == "MODEL"
    assert "# CHANGE: the model's name" in path.read_text()


def test_a_server_that_wants_a_key_gets_a_hint(tmp_path):
    async def unauthorized(request: web.Request) -> web.Response:
        return web.json_response({"error": "missing key"}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", unauthorized)
    with serve(app) as url:
        result, path = init(tmp_path, url)
    assert result.exit_code == 0 and load_scenario(path).target.protocol == "http"
    assert ("GET /v1/models answered 401: an OpenAI-compatible server that wants a key? Export OPENAI_API_KEY and "
            "rerun with --protocol openai --model NAME") in result.output


def test_credentials_in_the_url_are_used_but_never_written(tmp_path):
    seen: list[str | None] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    with serve(app) as url:
        host = url.removeprefix("http://")
        result, path = init(tmp_path, f"http://alice:s3cret-pw@{host}")
    assert result.exit_code == 0
    assert seen and set(seen) == {"Basic " + base64.b64encode(b"alice:s3cret-pw").decode()}  # the probe used them
    text = path.read_text()
    assert "s3cret-pw" not in text + result.output + result.stderr and "alice" not in text
    assert "${TARGET_USER:-}:${TARGET_PASSWORD:-}@" in text
    assert load_scenario(path).target.url == f"http://:@{host}"  # validates with the variables unset


# ---- without a URL ------------------------------------------------------------------------------------

def test_without_a_url_the_starter_launches_the_reference_server_and_runs(cache, tmp_path):
    result, path = init(tmp_path)
    assert result.exit_code == 0, result.output + result.stderr
    scenario = load_scenario(path)
    launch = scenario.target.launch
    assert launch.command == "python -m reference_server serve --http-port 8765 --grpc-port -1"
    assert launch.ready_url == "http://127.0.0.1:8765/v2/health/ready" and scenario.target.url == "http://127.0.0.1:8765"
    assert (scenario.target.protocol, scenario.target.model) == ("openai", "decoder")
    port = free_port()  # run as written, on a free port rather than 8765
    run_short(path, tmp_path, f"target.url=http://127.0.0.1:{port}", f"target.launch.ready_url=http://127.0.0.1:{port}/v2/health/ready",
              f"target.launch.command={launch.command.replace('8765', str(port))} --layers 2 --cache-dir {cache}",
              "phases.1.arrival.rate=6")


@pytest.mark.parametrize("protocol", ["kserve-v2", "kserve-v2-grpc", "http", "openai-responses", "anthropic-messages",
                                      "openai-embeddings", "rerank"])
def test_without_a_url_every_protocol_has_a_starter_that_validates(protocol, tmp_path):
    result, path = init(tmp_path, "--protocol", protocol)
    assert result.exit_code == 0, result.output + result.stderr
    scenario = load_scenario(path)
    assert scenario.target.protocol == protocol and scenario.target.launch is not None
    # the reference server's model for it: the decoder generates, the encoder embeds and reranks
    assert scenario.target.model == {"openai-responses": "decoder", "anthropic-messages": "decoder"}.get(
        protocol, None if protocol == "http" else "encoder")
    streaming = protocol in ("openai-responses", "anthropic-messages")
    assert {s.metric for s in scenario.slos} == ({"ttft", "latency"} if streaming else {"latency"})


def test_use_case_without_a_url_writes_the_preset_as_shipped(tmp_path):
    result, path = init(tmp_path, "--use-case", "streaming_chat")
    assert result.exit_code == 0
    preset = (REPO / "latscope" / "presets" / "streaming_chat.yaml").read_text()
    assert path.read_text().endswith(preset) and load_scenario(path).target.launch is not None


# ---- bad input ----------------------------------------------------------------------------------------

def test_unknown_use_case_exits_2_listing_the_presets(tmp_path):
    result, path = init(tmp_path, "http://127.0.0.1:9", "--use-case", "fraud")
    assert result.exit_code == 2 and not path.exists()
    assert ("unknown use case 'fraud': the presets are clinical_alert, document_intake, fraud_scoring, ivr_routing, "
            "recommendation, streaming_chat") in result.stderr


def test_an_existing_file_is_kept_without_force(tmp_path):
    path = tmp_path / "latscope.yaml"
    path.write_text("mine\n")
    result, _ = init(tmp_path)
    assert result.exit_code == 2 and f"{path} exists already: pass --force" in result.stderr
    assert path.read_text() == "mine\n"
    result, _ = init(tmp_path, "--force")
    assert result.exit_code == 0 and load_scenario(path).target.launch is not None


def test_a_url_of_another_scheme_exits_2(tmp_path):
    result, path = init(tmp_path, "ftp://127.0.0.1:21")
    assert result.exit_code == 2 and "expected a URL like http://127.0.0.1:8000" in result.stderr and not path.exists()


def test_the_protocol_choices_are_latscopes_protocols():
    option = next(p for p in main.commands["init"].params if p.name == "protocol")
    assert set(option.type.choices) == set(PROTOCOLS)
