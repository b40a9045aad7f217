"""What `latscope init URL` learns about an endpoint before it writes a starter scenario: which of
latscope's protocols the endpoint speaks, which model it serves and (KServe v2) that model's inputs.

Why ask the server: a newcomer knows the URL, rarely the protocol's name or the model's inputs, and
the server can say. Each probe is one short request (TIMEOUT_S) to the host and port given, never
anywhere else, carrying only the credentials the URL itself holds (no key from the environment):

  http(s)://  GET /v1/models (OpenAI), GET /v2/health/ready and GET /v2 (KServe v2 REST) with the
              model from /v2/models, /v2/repository/index or the server's answer about an unknown
              model, then GET /v2/models/NAME for its inputs; GET of the URL's own path (plain HTTP).
              A port that answers HTTP/2 frames (a gRPC server) is asked again over gRPC.
  grpc(s)://  ServerMetadata, ServerReady, ModelMetadata (KServe v2 gRPC).

A dead port, a timeout or a port that speaks something else ends the probing with one line saying
what was tried and what happened (`Probe.problem`); nothing here raises for what a server does.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import quote, unquote, urlsplit

from latscope.scenario.base import split_credentials

TIMEOUT_S = 2.0
MAX_BODY_BYTES = 1 << 20  # what a probe reads of an answer: a model list, a model's metadata
# KServe v2's gRPC API has no model listing (REST has GET /v2/models, Triton's repository index). Over
# gRPC, init asks for a model no server serves: a server whose NOT_FOUND answer names the one it does
# ("unknown model 'x'; this server serves 'encoder'", the reference server's) gives the name; else --model.
PROBE_MODEL = "latscope-init-probe"
_SERVES = re.compile(r"serves '([A-Za-z0-9_.-]+)'")
_API_PREFIX = re.compile(r"^(?P<prefix>.*?)/v[12](?:/|$)")  # http://host/gateway/v1/... -> /gateway


@dataclass(frozen=True)
class Input:
    """One input tensor as a KServe v2 model's metadata gives it (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass
class Found:
    """One protocol the endpoint answered in, and what it said."""

    protocol: str  # a name from scenario/protocols.py PROTOCOLS
    url: str  # what target.url should be: scheme://host:port[prefix], no userinfo; grpc://host:port for gRPC
    detail: str  # how we know, in words: "GET /v1/models listed 1 model"
    model: str | None = None
    models: list[str] = field(default_factory=list)  # every model the server named
    inputs: list[Input] | None = None  # KServe v2: the model's inputs, when its metadata answered
    method: str = "POST"  # plain HTTP: the method the starter sends
    path: str = ""  # plain HTTP: the path the starter sends to


@dataclass
class Probe:
    """What probing one URL found: the protocols it speaks (best first), a line per thing tried, and
    why nothing could be learnt when that is so (a dead port, a timeout, not HTTP)."""

    found: list[Found] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    problem: str | None = None
    hints: list[str] = field(default_factory=list)  # what the answers suggest a person try


class _NoAnswer(Exception):
    """The request got no HTTP answer; the message says why, in one line."""

    def __init__(self, message: str, http2: bool = False) -> None:
        super().__init__(message)
        self.http2 = http2  # the port answered with an HTTP/2 frame: a gRPC server, likely


@dataclass
class _Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def probe(url: str, model: str | None = None, timeout: float = TIMEOUT_S) -> Probe:
    """Ask the endpoint at `url` what it is. `model`, when given, is the model to look at (the
    server's own list is used otherwise). Raises ValueError for a URL that is not http(s):// or
    grpc(s):// with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "grpc", "grpcs") or not parts.hostname:
        raise ValueError(f"expected a URL like http://127.0.0.1:8000 or grpc://127.0.0.1:8001, got {url!r}")
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        raise ValueError(f"the URL's port is not a number from 1 to 65535: {url!r}") from None
    if port is None:
        raise ValueError(f"a grpc:// URL needs a port, like grpc://127.0.0.1:8001 (got {url!r})")
    if parts.scheme.startswith("grpc"):
        return _probe_grpc(parts.hostname, port, parts.scheme == "grpcs", model, timeout)
    return _probe_http(url, port, model, timeout)


# ---- HTTP -----------------------------------------------------------------------------------------


class _Http:
    """GETs and POSTs to one host and port, a fresh connection each, every failure a _NoAnswer."""

    def __init__(self, url: str, port: int, timeout: float) -> None:
        bare, self.authorization = split_credentials(url)
        parts = urlsplit(bare)
        self.host, self.port, self.tls, self.timeout = parts.hostname or "", port, parts.scheme == "https", timeout
        self.where = f"{parts.hostname}:{port}"

    def ask(self, method: str, path: str, body: bytes | None = None) -> _Answer:
        headers = {"Accept": "application/json", "User-Agent": "latscope-init"}
        if self.authorization:
            headers["Authorization"] = self.authorization
        if body is not None:
            headers["Content-Type"] = "application/json"
        kind = http.client.HTTPSConnection if self.tls else http.client.HTTPConnection
        connection = kind(self.host, self.port, timeout=self.timeout)
        what = f"{method} {path}"
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return _Answer(response.status, response.read(MAX_BODY_BYTES))
        except ConnectionRefusedError:
            raise _NoAnswer(f"nothing listens on {self.where} (connection refused)") from None
        except socket.gaierror as exc:
            raise _NoAnswer(f"cannot resolve the host {self.host!r} ({exc.strerror or exc})") from None
        except (TimeoutError, socket.timeout):
            raise _NoAnswer(f"{self.where} did not answer {what} within {self.timeout:g} s") from None
        except ssl.SSLError as exc:
            raise _NoAnswer(f"TLS with {self.where} failed ({exc.reason or exc})") from None
        except http.client.BadStatusLine as exc:  # also RemoteDisconnected: closed without a word
            first = str(exc.line or "").encode("latin-1", "replace")
            if not first:
                raise _NoAnswer(f"{self.where} accepted the connection and closed it without an HTTP answer to {what}") from None
            if _http2_frame(first):
                raise _NoAnswer(f"{self.where} answered {what} with HTTP/2 frames, not HTTP/1.1", http2=True) from None
            raise _NoAnswer(f"{self.where} does not speak HTTP: it answered {what} with {first[:40]!r}") from None
        except (http.client.HTTPException, ConnectionError) as exc:
            raise _NoAnswer(f"{self.where} closed the connection without an HTTP answer to {what} ({exc})") from None
        except OSError as exc:
            raise _NoAnswer(f"cannot connect to {self.where} ({exc.strerror or exc})") from None
        finally:
            connection.close()


def _http2_frame(data: bytes) -> bool:
    """Whether `data` starts like an HTTP/2 server's first frame (SETTINGS, type 4, on stream 0):
    what a gRPC server sends to a client that opened with HTTP/1.1."""
    return len(data) >= 9 and data[3] == 4 and data[5:9] == b"\x00\x00\x00\x00"


def _probe_http(url: str, port: int, model: str | None, timeout: float) -> Probe:
    result = Probe()
    client = _Http(url, port, timeout)
    parts = urlsplit(split_credentials(url)[0])
    path = parts.path.rstrip("/")
    match = _API_PREFIX.match(path)
    prefix = match["prefix"] if match else ""
    base = f"{parts.scheme}://{parts.netloc}{prefix}"

    def ask(method: str, where: str, body: bytes | None = None) -> _Answer:
        """The answer to `method where` (a path from the host), noted in `tried`; _NoAnswer, noted too."""
        try:
            answer = client.ask(method, where, body)
        except _NoAnswer as exc:
            result.tried.append(f"{method} {where}: {exc}")
            raise
        result.tried.append(f"{method} {where}: {answer.status}")
        return answer

    def api(method: str, where: str, body: bytes | None = None) -> _Answer:
        return ask(method, prefix + where, body)  # under the URL's prefix: http://host/gateway/v1/models

    try:
        first = api("GET", "/v1/models")
    except _NoAnswer as exc:
        if exc.http2:
            grpc_probe = _probe_grpc(client.host, port, client.tls, model, timeout)
            grpc_probe.tried[:0] = result.tried
            if grpc_probe.found:
                return grpc_probe
        result.problem = str(exc)
        return result
    try:
        if found := _openai(first, base, model):
            result.found.append(found)
        elif first.status in (401, 403):
            result.hints.append(f"GET {prefix}/v1/models answered {first.status}: an OpenAI-compatible server that wants a "
                                "key? Export OPENAI_API_KEY and rerun with --protocol openai --model NAME")
        if found := _kserve(api, base, model, path):
            result.found.append(found)
        page = ask("GET", path or "/")
        result.found.append(Found("http", f"{parts.scheme}://{parts.netloc}", f"GET {path or '/'} answered {page.status}",
                                  method="GET" if 200 <= page.status < 300 else "POST", path=path or "/"))
    except _NoAnswer as exc:  # it answered the first request but not a later one
        result.problem = str(exc)
    if match and path[len(prefix):].startswith("/v2"):  # the URL named KServe's API: it goes first
        result.found.sort(key=lambda f: f.protocol != "kserve-v2")
    return result


def _openai(answer: _Answer, base: str, model: str | None) -> Found | None:
    """OpenAI's model list, {"data": [{"id": ...}, ...]}, or None when that is not what came back."""
    doc = answer.json()
    if answer.status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return None
    ids = [m["id"] for m in doc["data"] if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    listed = f"GET /v1/models listed {len(ids)} model{'s' * (len(ids) != 1)}" + (f": {', '.join(ids[:5])}" if ids else "")
    return Found("openai", base, listed, model=model or (ids[0] if ids else None), models=ids)


def _kserve(ask: Callable[..., _Answer], base: str, model: str | None, path: str) -> Found | None:
    """KServe v2 REST: ready, then the model (given, in the URL's path, listed, or named by the
    server), then its inputs; None when /v2 is not there."""
    ready = ask("GET", "/v2/health/ready")
    meta = ask("GET", "/v2")
    doc = meta.json() if meta.status == 200 else None
    if not (isinstance(doc, dict) and isinstance(doc.get("name"), str) and "version" in doc):
        return None  # the spec's server metadata, {name, version, extensions}: not a catch-all's 200
    detail = f"GET /v2 named {doc['name']} {doc['version']}".rstrip() + f", GET /v2/health/ready answered {ready.status}"
    named = re.search(r"/v2/models/([^/]+)", path)  # http://host:port/v2/models/NAME/infer
    models: list[str] = []
    if model is None and named is None:
        models = _kserve_models(ask)
    chosen = model or (unquote(named[1]) if named else models[0] if models else None)
    inputs = None
    if chosen is not None:
        answer = ask("GET", f"/v2/models/{quote(chosen, safe='')}")
        inputs = _inputs(answer.json()) if answer.status == 200 else None
    return Found("kserve-v2", base, detail, model=chosen, models=models or ([chosen] if chosen else []), inputs=inputs)


def _kserve_models(ask: Callable[..., _Answer]) -> list[str]:
    """The models a server lists: KServe's GET /v2/models ({"models": [...]}), else Triton's POST
    /v2/repository/index ([{"name": ...}, ...])."""
    listed = ask("GET", "/v2/models").json()
    if isinstance(listed, dict) and isinstance(listed.get("models"), list):
        return [m for m in listed["models"] if isinstance(m, str) and m]
    index = ask("POST", "/v2/repository/index", b"{}").json()
    if isinstance(index, list):
        return [m["name"] for m in index if isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"]]
    return []


def _inputs(doc: Any) -> list[Input] | None:
    """The inputs of a model metadata document (REST JSON, or a gRPC response made a dict)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        return None
    out = []
    for t in doc["inputs"]:
        if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("datatype"), str):
            shape = t.get("shape") if isinstance(t.get("shape"), list) else []
            out.append(Input(t["name"], t["datatype"], tuple(int(d) for d in shape if isinstance(d, int))))
    return out


# ---- gRPC -----------------------------------------------------------------------------------------


def _probe_grpc(host: str, port: int, tls: bool, model: str | None, timeout: float) -> Probe:
    """KServe v2 over gRPC (inference.GRPCInferenceService), with the reference server's messages."""
    import grpc  # only a gRPC probe pays for it

    from reference_server import proto

    result = Probe()
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:  # grpc retries a refused connection until the deadline: say "refused" at once instead
        socket.create_connection((host, port), timeout).close()
    except ConnectionRefusedError:
        result.problem = f"nothing listens on {where} (connection refused)"
    except (TimeoutError, socket.timeout):
        result.problem = f"{where} did not accept a connection within {timeout:g} s"
    except OSError as exc:
        result.problem = f"cannot connect to {where} ({exc.strerror or exc})"
    if result.problem:
        result.tried.append(f"TCP connect: {result.problem}")
        return result

    options = [("grpc.enable_http_proxy", 0)]  # only the host given, never a proxy from the environment
    channel = grpc.secure_channel(where, grpc.ssl_channel_credentials(), options) if tls else grpc.insecure_channel(where, options)

    def call(rpc_name: str, **fields: Any):
        request_type, response_type = proto.METHODS[rpc_name]
        rpc = channel.unary_unary(proto.method_path(rpc_name), request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=response_type.FromString)
        try:
            response = rpc(request_type(**fields), timeout=timeout)
        except grpc.RpcError as exc:
            result.tried.append(f"gRPC {rpc_name}: {exc.code().name}: {(exc.details() or '')[:200]}")
            raise
        result.tried.append(f"gRPC {rpc_name}: OK")
        return response

    scheme = "grpcs" if tls else "grpc"
    try:
        try:
            meta = call("ServerMetadata")
        except grpc.RpcError as exc:
            code = exc.code()
            result.problem = (f"{where} speaks gRPC but not KServe v2 (ServerMetadata: UNIMPLEMENTED)"
                              if code is grpc.StatusCode.UNIMPLEMENTED else
                              f"{where} did not answer gRPC ServerMetadata within {timeout:g} s"
                              if code is grpc.StatusCode.DEADLINE_EXCEEDED else
                              f"{where} accepted the connection but did not answer gRPC ServerMetadata "
                              f"({code.name}: {(exc.details() or '')[:200]})")
            return result
        detail = f"gRPC ServerMetadata answered ({meta.name} {meta.version})".replace(" )", ")")
        try:
            call("ServerReady")
        except grpc.RpcError:
            pass
        models: list[str] = []
        if model is None:
            try:
                call("ModelMetadata", name=PROBE_MODEL)
            except grpc.RpcError as exc:
                models = _SERVES.findall(exc.details() or "")
        chosen = model or (models[0] if models else None)
        inputs = None
        if chosen is not None:
            try:
                response = call("ModelMetadata", name=chosen)
                inputs = _inputs({"inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                                             for t in response.inputs]})
            except grpc.RpcError:
                pass
        result.found.append(Found("kserve-v2-grpc", f"{scheme}://{where}", detail, model=chosen,
                                  models=models or ([chosen] if chosen else []), inputs=inputs))
        return result
    finally:
        channel.close()
