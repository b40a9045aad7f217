"""Keeping secrets out of what a scenario shows: the resolved scenario.yaml written next to the
results, error messages, and what actions record. Also the scenario's JSON Schema export.

What is secret is declared on the schema's fields (base.SECRET, SECRET_BY_NAME, URL_CREDENTIALS);
`is_secret` and `redacts_url` find a data path's field by walking the schema from `Scenario` down,
so a field typed with a marker is redacted wherever it sits, with no list of paths to keep up.
"""

from __future__ import annotations

import os
import re
from types import UnionType
from typing import Any, Iterator, Sequence, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from latscope.scenario.base import (CREDENTIAL_NAME, REFERENCE, SECRET, SECRET_BY_NAME, URL_CREDENTIALS, DataPath,
                                    model_field, split_credentials, unwrap)
from latscope.scenario.schema import Scenario

REDACTED = "<redacted>"
_URL_PASSWORD = re.compile(r"(?P<user>://[^/@:\s]*:)(?P<password>[^/@\s]+)@")
_QUERY_PARAM = re.compile(r"(?P<key>[?&][^=&#\s]*=)(?P<value>[^&#\s]*)")


def _field_at(path: DataPath) -> tuple[FieldInfo | None, str | int | None]:
    """The schema field that `path` leads to, and the key when the path ends in an entry of a
    mapping field ((None, None) when the path leaves the schema's models)."""
    tp: Any = Scenario
    field, key = None, None
    for item in path:
        tp = unwrap(tp)
        if get_origin(tp) in (Union, UnionType):  # a union of models (arrivals): the member that has the field
            tp = next((m for m in get_args(tp) if model_field(m, item) is not None), None)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field, key = model_field(tp, item), None
            if field is None:
                return None, None
            tp = field.annotation
        elif get_origin(tp) is list and isinstance(item, int):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict and key is None:
            tp, key = get_args(tp)[1], item
        else:
            return None, None
    return field, key


def is_secret(path: DataPath) -> bool:
    """Whether the value at `path` is a credential: a SECRET field, or an entry of a SECRET_BY_NAME
    mapping whose name looks like one."""
    field, key = _field_at(path)
    if field is None:
        return False
    if key is None:
        return SECRET in field.metadata
    return SECRET_BY_NAME in field.metadata and bool(CREDENTIAL_NAME.search(str(key)))


def redacts_url(path: DataPath) -> bool:
    """Whether the value at `path` is a URL_CREDENTIALS field."""
    field, key = _field_at(path)
    return field is not None and key is None and URL_CREDENTIALS in field.metadata


def redact_url(text: str) -> str:
    """The password of a URL's userinfo, and query parameters named like credentials, redacted."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['user']}{REDACTED}@", text)
    return _QUERY_PARAM.sub(lambda m: m["key"] + (REDACTED if CREDENTIAL_NAME.search(m["key"]) and m["value"] else m["value"]), text)


def redacted_yaml(scenario: Scenario) -> str:
    """The resolved scenario (defaults filled in, overrides applied) as YAML, safe to share.

    Values that came from `${VAR}` are written back as written (`Bearer ${API_KEY}`), so the
    environment's secrets never reach the results and the file still works with the same
    environment. Credential-like header and env values written literally become "<redacted>", and
    URL passwords too. Secrets elsewhere (say, in `launch.command`) are not detected.
    """
    data = scenario.model_dump(mode="json", by_alias=True)
    templates = scenario.templates

    def visit(value: Any, path: DataPath) -> Any:
        if path in templates:
            value = templates[path]
            if is_secret(path):  # a template's default may be a literal secret
                value = re.sub(r"(\$\{[A-Za-z_][A-Za-z0-9_]*:-)[^}]+\}", rf"\g<1>{REDACTED}}}", value)
        elif isinstance(value, str) and is_secret(path):
            value = REDACTED
        if isinstance(value, str) and redacts_url(path):
            value = redact_url(value)
        if isinstance(value, dict):
            return {k: visit(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v, (*path, i)) for i, v in enumerate(value)]
        return value

    header = f"# latscope scenario, resolved from {scenario.source or 'a dict'}; relative paths are relative to {scenario.base_dir}\n"
    return header + yaml.safe_dump(visit(data, ()), sort_keys=False, allow_unicode=True, width=100)


def action_secrets(scenario: Scenario) -> list[str]:
    """Strings that must not appear in what an action's run records (its output, a response, an
    error): what each `${VAR}` in an action expanded to, and the secret values of actions written
    literally (credential-like header and env values). Longest first, so a value holding another is
    replaced whole. Values under 4 characters are left out: scrubbing them would blank ordinary digits."""
    found: set[str] = set()
    for path, template in scenario.templates.items():
        if path[:1] == ("actions",):
            found.update(_expansions(template))
    actions = scenario.model_dump(mode="json", by_alias=True, include={"actions"}).get("actions", [])
    found.update(value for path, value in _strings(actions, ("actions",)) if is_secret(path))
    return _scrub_list(found)


def secret_values(scenario: Scenario) -> list[str]:
    """Every string of the scenario that must not appear in anything latscope writes or shows, and
    so not in what a target sends back either (a server that echoes the API key in its error message):
    action_secrets, and on the target's side the values of secret fields (api_key, credential-like
    headers and launch env) — with the credential alone when a value is `<scheme> <credential>`
    (`Bearer …`), since a target may echo either — what each `${VAR}` in such a field or in a URL's
    userinfo expanded to, URL passwords and the Basic credentials URL userinfo is sent as, and
    credential-like query parameter values. Longest first;
    values under 4 characters left out (as action_secrets). Workers scrub with it before anything
    leaves them (see `scrub`)."""
    found = set(action_secrets(scenario))
    for path, template in scenario.templates.items():
        if is_secret(path):
            found.update(_expansions(template))
        elif redacts_url(path) and "@" in template:
            found.update(_expansions(template.rsplit("@", 1)[0]))
    for path, value in _strings(scenario.model_dump(mode="json", by_alias=True), ()):
        if is_secret(path):
            found.update(_credential(value))
        elif redacts_url(path):
            found.update(_url_secrets(value))
    return _scrub_list(found)


def _credential(value: str) -> tuple[str, str]:
    """A credential as sent, and without its scheme (`Bearer <token>`: a target may echo either)."""
    return value, value.split(" ", 1)[-1]


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` with every one of `secrets` (secret_values, action_secrets: longest first) replaced by
    <redacted>: the one way latscope keeps secrets out of what a target, a command or an error said."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _expansions(template: str) -> Iterator[str]:
    """What each `${VAR}` of `template` expands to now (its default when VAR is unset or empty)."""
    for match in REFERENCE.finditer(template):
        if (name := match.group("name")) is None:
            continue
        value = os.environ.get(name)
        yield (match.group("default") if (value is None or value == "") and match.group("default") is not None
               else value or "")


def _url_secrets(url: str) -> Iterator[str]:
    """A URL's password, the Basic credential its userinfo is sent as (split_credentials), and its
    credential-like query parameter values."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        yield password
    basic = split_credentials(url)[1]
    if basic:
        yield from _credential(basic)
    for match in _QUERY_PARAM.finditer(url):
        if CREDENTIAL_NAME.search(match["key"]):
            yield match["value"]


def _scrub_list(found: set[str]) -> list[str]:
    """Secrets to scrub: longest first, so a value holding another is replaced whole; none under 4
    characters (scrubbing those would blank ordinary digits)."""
    return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)


def _strings(value: Any, path: DataPath) -> Iterator[tuple[DataPath, str]]:
    """Every string in nested dicts and lists, with its data path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))


def scenario_json_schema() -> dict:
    """JSON Schema of a scenario file, for editor completion and validation (`latscope schema`)."""
    schema = Scenario.model_json_schema(by_alias=True)
    schema.pop("title", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "latscope scenario", **schema}
