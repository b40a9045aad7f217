"""`latscope init [URL]`: a starter scenario a newcomer edits rather than writes.

Given a URL, the endpoint is asked what it is (probe.py: OpenAI, KServe v2 REST or gRPC, else plain
HTTP) and the starter (starters.py) speaks that protocol to that model; with `use_case`, the preset
of that name (presets.py) is pointed at it instead. Without a URL, the starter launches latscope's
reference server, so it runs on a fresh machine. Either way the text is checked to validate before
it is returned: what `init` writes, `latscope run` takes.

A dead port, a timeout or a port speaking something else is not an error: the starter is then plain
HTTP to that URL, and `Starter.warning` says what was tried and what happened. Credentials in the
URL are used for the probe and never written: the file reads them from the environment.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from latscope.errors import ScenarioError
from latscope.init.presets import preset_names, preset_protocol, preset_text, retarget
from latscope.init.probe import TIMEOUT_S, Found, Probe, probe
from latscope.init.starters import REF_ENCODER, REF_GRPC, REF_HTTP, Endpoint, starter_text
from latscope.scenario import scenario_from_dict
from latscope.scenario.base import check_url_text
from latscope.scenario.protocols import PROTOCOLS
from latscope.scenario.redact import redact_url

__all__ = ["DEFAULT_FILE", "Starter", "check_options", "check_out_file", "make_starter", "preset_names", "write_starter"]

DEFAULT_FILE = "latscope.yaml"
USER_VAR, PASSWORD_VAR = "TARGET_USER", "TARGET_PASSWORD"  # where a starter reads the URL's credentials from
_WORDS = {"openai": "an OpenAI-compatible server", "kserve-v2": "a KServe v2 server (REST)",
          "kserve-v2-grpc": "a KServe v2 server (gRPC)", "http": "an HTTP server",
          "openai-responses": "an OpenAI-compatible server (for its Responses API)",
          "anthropic-messages": "an OpenAI-compatible server (for its Anthropic Messages API)",
          "openai-embeddings": "an OpenAI-compatible server (for its embeddings)",
          "rerank": "an OpenAI-compatible server (for its rerank API)"}
# Protocols the probe does not ask for by their own routes: written for a server that answered as
# OpenAI-compatible (vLLM and the reference server serve them beside /v1/models).
OPENAI_FAMILY = ("openai-responses", "anthropic-messages", "openai-embeddings", "rerank")


@dataclass
class Starter:
    """A starter scenario's text and what a person should be told about it."""

    text: str
    protocol: str
    model: str | None
    url: str  # the target URL, as shown (no user or password: the file reads those from the environment)
    notes: list[str] = field(default_factory=list)  # what was found, a line each
    warning: str | None = None  # the endpoint could not be probed, or did not confirm what was asked for


def make_starter(url: str | None = None, *, use_case: str | None = None, protocol: str | None = None,
                 model: str | None = None, file_name: str = DEFAULT_FILE, timeout: float = TIMEOUT_S) -> Starter:
    """The starter scenario for the endpoint at `url` (probed), or for the reference server when
    `url` is None. `use_case` starts from that preset; `protocol` picks one when the endpoint speaks
    several (or insists on one the probe did not find); `model` names the model. `file_name` is what
    the comments tell the user to run. ScenarioError (exit 2) for bad input."""
    check_options(url, use_case, protocol, model)  # before any probe
    preset = preset_text(use_case) if use_case is not None else None
    if url is None:
        starter = _reference_starter(use_case, preset, protocol or "openai", model, file_name)
    else:
        starter = _probed_starter(url, use_case, preset, protocol, model, file_name, timeout)
    _check(starter.text)
    return starter


def check_options(url: str | None, use_case: str | None, protocol: str | None, model: str | None) -> None:
    """ScenarioError for options that cannot make a starter: a URL of another scheme, an unknown
    preset or protocol, both at once, a model name that cannot go into a request."""
    if url is not None and urlsplit(_with_scheme(url)).scheme not in ("http", "https", "grpc", "grpcs"):
        raise ScenarioError(f"expected a URL like http://127.0.0.1:8000 or grpc://127.0.0.1:8001, got {redact_url(url)!r}")
    if use_case is not None and protocol is not None:
        raise ScenarioError("give --use-case or --protocol, not both: a preset speaks its own protocol")
    if protocol is not None and protocol not in PROTOCOLS:
        raise ScenarioError(f"unknown protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if use_case is not None:
        preset_text(use_case)  # an unknown name: the error lists the presets
    if model is not None:
        try:
            check_url_text(model, "a model name")
        except ValueError as exc:
            raise ScenarioError(f"--model: {exc}") from None


def check_out_file(path: Path, force: bool = False) -> None:
    """ScenarioError when a file is at `path` already and `force` is not given: checked before the
    endpoint is probed (the command says it at once) and again when writing."""
    if path.exists() and not force:
        raise ScenarioError(f"{path} exists already: pass --force to overwrite it, or -o to write another file")


def write_starter(starter: Starter, path: Path, force: bool = False) -> None:
    """Write the starter to `path`; ScenarioError when a file is there already (unless `force`) or
    the path cannot be written."""
    check_out_file(path, force)
    try:
        path.write_text(starter.text, encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot write {path}: {exc.strerror or exc}") from None


def _check(text: str) -> None:
    """The starter validates as `latscope run` would load it (its ${VAR:-} read from this environment)."""
    try:
        scenario_from_dict(yaml.safe_load(text), source="the starter scenario")
    except ScenarioError as exc:
        raise ScenarioError(f"the starter does not validate: {exc}") from None


def _reference_starter(use_case: str | None, preset: str | None, protocol: str, model: str | None,
                       file_name: str) -> Starter:
    """No URL: a starter that launches the reference server on 127.0.0.1 (or the preset as shipped)."""
    if preset is not None:
        header = _comment([f"Written by `latscope init --use-case {use_case}`: the preset as shipped. It launches "
                           "latscope's reference server (pip install 'latscope[server]'); to test your own endpoint "
                           f"instead, run `latscope init http://HOST:PORT --use-case {use_case}`. "
                           f"Then: latscope validate {file_name}; latscope run {file_name}"]) + "#\n"
        data = yaml.safe_load(preset)
        return Starter(header + preset, preset_protocol(preset), data["target"].get("model"), data["target"]["url"],
                       [f"the {use_case} preset, launching the reference server"])
    url = f"grpc://127.0.0.1:{REF_GRPC}" if protocol == "kserve-v2-grpc" else f"http://127.0.0.1:{REF_HTTP}"
    default_model = {"openai": "decoder", "openai-responses": "decoder", "anthropic-messages": "decoder",
                     "http": None}.get(protocol, "encoder")  # kserve-v2*, embeddings and rerank: the encoder
    endpoint = Endpoint(protocol, url, model=model or default_model, inputs=REF_ENCODER, launch=True,
                        path="/v2/models/encoder/infer" if protocol == "http" else "/")
    header = [f"latscope starter scenario, written by `latscope init` without a URL: it launches latscope's reference "
              f"server on 127.0.0.1:{REF_HTTP} and sends it {_what(protocol)}, so it runs on a fresh machine.",
              "For your own endpoint: `latscope init http://HOST:PORT` (it asks the endpoint what it speaks)."]
    return Starter(starter_text(endpoint, header, file_name), protocol, endpoint.model, url,
                   [f"the reference server (launched), {protocol}" + (f", model {endpoint.model}" if endpoint.model else "")])


def _comment(lines: list[str]) -> str:
    return "".join(f"# {part}\n" for line in lines for part in textwrap.wrap(line, 100))


def _what(protocol: str) -> str:
    return {"openai": "streaming chat completions", "kserve-v2": "KServe v2 inference requests",
            "kserve-v2-grpc": "KServe v2 gRPC inference requests", "http": "plain HTTP requests",
            "openai-responses": "streaming Responses API requests", "anthropic-messages": "streaming Messages API requests",
            "openai-embeddings": "embeddings requests", "rerank": "rerank requests"}[protocol]


def _probed_starter(url: str, use_case: str | None, preset: str | None, protocol: str | None, model: str | None,
                    file_name: str, timeout: float) -> Starter:
    url = _with_scheme(url)
    try:
        result = probe(url, model, timeout)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    parts = urlsplit(url)
    shown = redact_url(urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])))  # no user:password@
    wanted = preset_protocol(preset) if preset is not None else protocol
    chosen, warning = _choose(result, wanted, url, model, shown)
    probed = chosen in result.found or (warning is None and chosen.protocol in OPENAI_FAMILY)
    notes = [f"found {_WORDS[chosen.protocol]}: {chosen.detail}"] if probed else []
    notes += [f"also speaks {f.protocol}" + (f" (model {f.model})" if f.model else "") + f": --protocol {f.protocol}"
              for f in result.found if f is not chosen and f.protocol != "http" and preset is None]
    notes += result.hints
    if result.problem and result.found:
        notes.append(f"probing stopped early: {result.problem}")
    written_url, credential_note = _written_url(chosen.url, url)
    if credential_note:
        notes.append(credential_note)
    if preset is not None:
        text, changes = retarget(preset, written_url, chosen.protocol, chosen.model, chosen.inputs)
        header = [f"Written by `latscope init {shown} --use-case {use_case}`: the {use_case} preset, pointed at that "
                  "endpoint. Changed from the preset: " + "; ".join(changes) + ".",
                  "The preset's notes follow (its SLOs are the use case's targets; its commands name the preset's "
                  f"own file). Then: latscope validate {file_name}; latscope run {file_name}"]
        text = _comment(header) + "#\n" + text
    else:
        endpoint = Endpoint(chosen.protocol, written_url, model=chosen.model, inputs=chosen.inputs,
                            method=chosen.method, path=chosen.path or "/")
        text = starter_text(endpoint, _header(shown, chosen, result, warning), file_name)
    return Starter(text, chosen.protocol, chosen.model, chosen.url, notes, warning)


def _with_scheme(url: str) -> str:
    return url if "://" in url else f"http://{url}"  # `latscope init localhost:8000`


def _choose(result: Probe, wanted: str | None, url: str, model: str | None, shown: str) -> tuple[Found, str | None]:
    """The protocol to write and, when the endpoint did not confirm it, a warning saying why."""
    tried = ", ".join(dict.fromkeys(t.split(":", 1)[0] for t in result.tried))
    failed = f"could not probe {shown} (tried {tried}): {result.problem}" if result.problem and not result.found else None
    if wanted is not None:
        for f in result.found:
            if f.protocol == wanted or (wanted == "kserve-v2" and f.protocol == "kserve-v2-grpc"):
                return f, None
            if wanted in OPENAI_FAMILY and f.protocol == "openai":  # its own route is not probed
                return replace(f, protocol=wanted, model=model or f.model,
                               detail=f"{f.detail} ({wanted}'s own route not probed)"), None
        spoke = ", ".join(f.protocol for f in result.found if f.protocol != "http") or "plain HTTP only"
        why = failed or f"{shown} did not answer as {wanted} (it answered: {spoke})"
        return _unconfirmed(wanted, url, model), f"{why}; wrote the {wanted} scenario asked for: check it before a run"
    if result.found:
        return result.found[0], None
    return _unconfirmed("http", url, model), f"{failed}; wrote a plain-HTTP starter to that URL"


def _unconfirmed(protocol: str, url: str, model: str | None) -> Found:
    """What to write when the endpoint did not say: the URL's host and port in `protocol`'s scheme."""
    parts = urlsplit(url)
    if protocol == "kserve-v2-grpc":
        scheme = "grpcs" if parts.scheme in ("https", "grpcs") else "grpc"
    else:
        scheme = "https" if parts.scheme in ("https", "grpcs") else "http"
    bare = urlunsplit((scheme, parts.netloc.rpartition("@")[2], "", "", ""))  # no user:password@
    path = parts.path if protocol == "http" and parts.path and scheme.startswith("http") else "/"
    return Found(protocol, bare, "not confirmed by the endpoint", model=model, path=path)


def _written_url(target: str, given: str) -> tuple[str, str | None]:
    """`target` as the file should hold it: a user and password the given URL carried become ${VAR}
    references (an http(s) URL; gRPC has no place for them), never the values."""
    parts = urlsplit(given)
    if parts.username is None and parts.password is None:
        return target, None
    if target.startswith(("grpc://", "grpcs://")):
        return target, "the URL's user and password are not written: for gRPC, put a token in target.api_key: ${TOKEN}"
    scheme, rest = target.split("://", 1)
    return (f"{scheme}://${{{USER_VAR}:-}}:${{{PASSWORD_VAR}:-}}@{rest}",
            f"the URL's user and password are not written: the file reads them from ${USER_VAR} and ${PASSWORD_VAR}")


def _header(shown: str, chosen: Found, result: Probe, warning: str | None) -> list[str]:
    lines = [f"latscope starter scenario, written by `latscope init {shown}`."]
    if warning is not None:
        lines += [f"Warning: {warning}.", "Check the URL and, once the endpoint is up, rerun `latscope init URL --force`."]
    elif chosen.protocol == "http":
        lines.append(f"Found a plain HTTP endpoint ({chosen.detail}): it answered neither as OpenAI (GET /v1/models) nor "
                     "as KServe v2 (GET /v2), so this file sends plain HTTP requests.")
    else:
        lines += [f"Found {_WORDS[chosen.protocol]}: {chosen.detail}.",
                  f"This file sends it {_what(chosen.protocol)}" + (f" for model {chosen.model}." if chosen.model else ".")]
        for other in (f.protocol for f in result.found if f is not chosen and f.protocol != "http"):
            lines.append(f"It also speaks {other}: `latscope init {shown} --protocol {other} --force` for that.")
    return lines
