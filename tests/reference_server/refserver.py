"""What the reference-server tests share: `python -m reference_server serve` as a real process (started on
loopback, its ready lines read from stdout, stopped with SIGTERM), plain HTTP calls, Server-Timing and
Prometheus parsing, KServe v2 request building for the built-in encoder, the `cache`/`logs` fixtures, and the
decoder's two graphs loaded in process (`decoder_backends`).

A plain module, not a conftest.py: tests/conftest.py is imported as `conftest` (tests import from it with
`from conftest import ...`); a second conftest.py here, outside any package, would replace it in
sys.modules once pytest loads it, and every test module collected after this folder (tests/test_cli.py,
...) would then import the wrong one. The fixtures are imported by the modules that use them:
`from refserver import cache, logs`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import REPO

READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 45
MODEL = "encoder"  # the built-in encoder's model name
HIDDEN = 384  # and the width of its 'embedding' output


# --- the server as a process ---------------------------------------------------------------------------

@dataclass
class Server:
    """A started `serve`: its addresses come from its stdout ready lines, its stderr goes to `log`."""

    proc: subprocess.Popen
    log: Path
    lines: list[str] = field(default_factory=list)  # its stdout, line by line, kept up to date
    url: str = ""  # http://HOST:PORT, from 'ready http://HOST:PORT'
    grpc: str = ""  # HOST:PORT, from 'ready-grpc HOST:PORT' ('' with gRPC off)
    admin: str = ""  # http://HOST:PORT, from 'ready-admin http://HOST:PORT' ('' with the admin API off)

    @property
    def infer_url(self) -> str:
        return f"{self.url}/v2/models/{MODEL}/infer"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(logs: Path, *args: str, need: tuple[str, ...] = ("ready",)) -> Server:
    """`python -m reference_server serve *args`, waited for until its stdout has shown a line of each kind
    in `need` ('ready', 'ready-grpc', 'ready-admin'). A reader thread keeps draining stdout, so the pipe
    never fills. LATSCOPE_REF_* variables are left out of its environment: only `args` configure it."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"server-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATSCOPE_REF_")}
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "reference_server", "serve", *args],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    server = Server(proc, log)
    changed = threading.Condition()  # notified on every line, and at the end of stdout
    ended = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            with changed:
                server.lines.append(line.rstrip("\n"))
                changed.notify_all()
        proc.stdout.close()
        with changed:
            ended.set()
            changed.notify_all()

    def ready() -> dict[str, str]:
        return dict(line.split(" ", 1) for line in server.lines if " " in line)

    threading.Thread(target=read, daemon=True).start()
    with changed:
        changed.wait_for(lambda: ended.is_set() or set(need) <= ready().keys(), READY_TIMEOUT_S)
        lines = ready()
    if not set(need) <= lines.keys():
        returncode = stop_server(server)
        pytest.fail(f"server not ready in {READY_TIMEOUT_S} s (exit {returncode}), stdout {server.lines}:\n"
                    f"{server.log_text()}")
    server.url, server.grpc, server.admin = (lines.get(k, "") for k in ("ready", "ready-grpc", "ready-admin"))
    return server


def stop_server(server: Server) -> int:
    """SIGTERM; the exit status. Every process is gone afterwards, its replicas too (killed if they had to be)."""
    pids = children(server.proc.pid)
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        raise
    finally:
        wait_for(lambda: not any(alive(p) for p in pids), 10, f"replica processes {pids} to exit")


@contextmanager
def running_server(logs: Path, *args: str, need: tuple[str, ...] = ("ready",)) -> Iterator[Server]:
    """A started server (see start_server); on exit SIGTERM must end it with status 0."""
    server = start_server(logs, *args, need=need)
    try:
        yield server
    finally:
        returncode = stop_server(server)
    assert returncode == 0, server.log_text()


@contextmanager
def running_with_grpc(cache: Path, logs: Path, *flags: str) -> Iterator[Server]:
    """The encoder server with HTTP and gRPC on ports it picks (`--http-port 0 --grpc-port 0`)."""
    with running_server(logs, "--http-port", "0", "--grpc-port", "0", "--layers", "2", "--cache-dir", str(cache),
                        *flags, need=("ready", "ready-grpc")) as server:
        assert f"grpc listening on {server.grpc}" in server.log_text()
        yield server


def decoder_backends(cfg, where: Path):
    """The decoder of DecoderConfig `cfg` as the server loads it: (prefill graph's, decode step graph's) ONNX Runtime
    backends, 1 thread, built in `where`; the generator runs `[0].run` and `[1].run_into`."""
    from reference_server.backends.onnxruntime import OnnxRuntimeBackend
    from reference_server.decoder import cached_decode_step, cached_decoder

    loaded = (OnnxRuntimeBackend(cached_decoder(cfg, where)[0], threads=1),
              OnnxRuntimeBackend(cached_decode_step(cfg, where)[0], threads=1))
    for backend in loaded:
        backend.load()
    return loaded


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """The first true value of predicate(), polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


def children(pid: int) -> set[int]:
    """Pids whose parent is `pid` (from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The model cache (--cache-dir) of one test module's servers."""
    return tmp_path_factory.mktemp("ref-cache")


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """Where one test module's servers write their stderr."""
    return tmp_path_factory.mktemp("ref-logs")


@pytest.fixture(scope="module")
def identity(cache: Path, logs: Path) -> Iterator[Server]:
    """The built-in identity model (FP32 x [batch, 384] -> y) over HTTP and gRPC, no batching delay:
    every millisecond is transport and serialization."""
    with running_server(logs, "--http-port", "0", "--grpc-port", "0", "--builtin", "identity", "--model-name",
                        "identity", "--no-generator", "--max-queue-delay-us", "0", "--cache-dir", str(cache),
                        need=("ready", "ready-grpc")) as server:
        yield server


# --- talking to it -------------------------------------------------------------------------------------

def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 30):
    """(status, headers, body) on a fresh connection (urllib sends Connection: close); 4xx/5xx are answers,
    not exceptions."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def post_json(url: str, doc) -> tuple[int, dict, bytes]:
    return http("POST", url, json.dumps(doc).encode(), {"Content-Type": "application/json"})


def _timing_params(value: str) -> Iterator[tuple[str, str, str]]:
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for param in params:
            key, _, text = param.partition("=")
            yield name, key, text


def server_timing(value: str) -> dict[str, str]:
    """name -> dur (ms, as text) or desc, from a W3C Server-Timing value."""
    return {name: text.strip('"') for name, _, text in _timing_params(value)}


def server_timing_ms(value: str) -> dict[str, float]:
    """name -> dur (ms) of the entries of a W3C Server-Timing value that have one."""
    return {name: float(text) for name, key, text in _timing_params(value) if key == "dur"}


def scrape(url: str) -> str:
    """The Prometheus text of `url`/metrics."""
    return http("GET", f"{url}/metrics")[2].decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of one metric that carry all of `labels` (0 when none), from Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{")
                and all(f'{k}="{v}"' in line for k, v in labels.items())):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- KServe v2 requests for the built-in encoder, and its answers --------------------------------------

def token_inputs(rows: int, seq: int, seed: int = 0, pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random ids; the last `pad` positions of the last row are masked out."""
    ids = np.random.default_rng(seed).integers(0, 8192, size=(rows, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    if pad:
        mask[-1, -pad:] = 0
    return ids, mask


def json_body(ids: np.ndarray, mask: np.ndarray, **parameters) -> bytes:
    inputs = [{"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
              for n, a in (("input_ids", ids), ("attention_mask", mask))]
    return json.dumps({"inputs": inputs, "parameters": parameters}).encode()


def binary_body(ids: np.ndarray, mask: np.ndarray, **parameters) -> tuple[bytes, dict[str, str]]:
    inputs = [{"name": n, "shape": list(a.shape), "datatype": "INT64", "parameters": {"binary_data_size": a.nbytes}}
              for n, a in (("input_ids", ids), ("attention_mask", mask))]
    header = json.dumps({"inputs": inputs, "parameters": parameters}).encode()
    return (header + ids.astype("<i8").tobytes() + mask.astype("<i8").tobytes(),
            {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})


def embedding(headers, body: bytes) -> np.ndarray:
    """The 'embedding' output of a JSON or binary infer response."""
    header_length = headers.get("Inference-Header-Content-Length")
    doc = json.loads(body[:int(header_length)] if header_length else body)
    (out,) = doc["outputs"]
    assert out["name"] == "embedding" and out["datatype"] == "FP32"
    if "data" in out:
        return np.array(out["data"], np.float32).reshape(out["shape"])
    size = out["parameters"]["binary_data_size"]
    return np.frombuffer(body[int(header_length):], "<f4", count=size // 4).reshape(out["shape"])
