"""What every part of the scenario schema is built from: the base model, durations, the checks that
several sections share, the markers that declare a field secret, and the problem type that lets a
check across fields name the field it is about.

Secret-ness is declared on the fields themselves (`Annotated[..., SECRET]`), so a new header map is
redacted because of how it is typed, not because someone remembered to add it to a list of paths;
redact.py reads the markers by walking the schema along a data path.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Annotated, Any, Union, get_args, get_origin
from types import UnionType
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

DataPath = tuple[str | int, ...]  # a place in the loaded data: ("phases", 0, "arrival", "rate")

# --------------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------------

_DURATION_HINT = "expected a duration like 30s, 2m, 500ms or a number of seconds"

# Units in this order, each at most once: "1h", "2m", "1m30s", "1.5s", "250ms", "1h2m3s4ms".
# `m(?!s)` keeps the minutes group from eating the "m" of "ms".
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?\s*"
    r"(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?\s*"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?\s*"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?"
)
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _parse_duration(value: Any) -> Any:
    """Seconds as a float, from a number of seconds or a string such as "1m30s".

    Numeric strings ("30") are accepted too: a value from `${VAR}` interpolation is always a string.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PydanticCustomError("duration", _DURATION_HINT)
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION_RE.fullmatch(text)
            if not text or match is None or not any(match.groupdict().values()):
                if text.startswith("-"):
                    raise PydanticCustomError("duration", "a duration cannot be negative") from None
                raise PydanticCustomError("duration", _DURATION_HINT) from None
            seconds = sum(float(n) * _UNIT_SECONDS[unit] for unit, n in match.groupdict().items() if n)
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise PydanticCustomError("duration", _DURATION_HINT)
    if seconds < 0:
        raise PydanticCustomError("duration", "a duration cannot be negative")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(_parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(h|m|s|ms)\s*)+$|^\s*\d+(\.\d+)?\s*$"},
            ],
            "description": "seconds, or a string like 250ms, 30s, 2m, 1h, 1m30s",
        }
    ),
]
"""Seconds (float). Accepts a number of seconds or "250ms", "30s", "2m", "1h", "1m30s"; never negative."""

PositiveDuration = Annotated[Duration, Field(gt=0)]

# --------------------------------------------------------------------------------------------------
# Secrets: markers on fields (read by redact.py)
# --------------------------------------------------------------------------------------------------


class Secret:
    """Field marker: the value is a credential (an API key). Redacted in the resolved scenario.yaml,
    in error messages, and from what actions record."""

    def __repr__(self) -> str:
        return "SECRET"


class SecretByName:
    """Field marker on a {name: value} mapping (headers, env): a value is a credential when its name
    looks like one (CREDENTIAL_NAME: Authorization, X-Api-Key, TOKEN, ...)."""

    def __repr__(self) -> str:
        return "SECRET_BY_NAME"


class UrlCredentials:
    """Field marker on a URL: its userinfo password and credential-like query parameters are
    redacted where the scenario is shown."""

    def __repr__(self) -> str:
        return "URL_CREDENTIALS"


SECRET, SECRET_BY_NAME, URL_CREDENTIALS = Secret(), SecretByName(), UrlCredentials()
CREDENTIAL_NAME = re.compile(r"authorization|api[-_]?key|token|cookie|secret|passw(or)?d|credential", re.IGNORECASE)

# `$${` is a literal `${`; a `${` matching neither form is reported rather than sent as is.
REFERENCE = re.compile(r"\$\$\{|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|\$\{")
"""The `${VAR}` / `${VAR:-default}` syntax: load.py expands it, redact.py finds what it expanded to."""

# --------------------------------------------------------------------------------------------------
# The base model and the checks that several sections share
# --------------------------------------------------------------------------------------------------

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


class Model(BaseModel):
    """Base of every scenario model.

    extra="forbid": a misspelt field (`timout:`) is an error, not silently ignored.
    coerce_numbers_to_str: `PORT: 8765` in an env or header mapping is meant as the string "8765".
    allow_inf_nan=False: `.inf` is valid YAML but never a sensible rate.
    """

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------------
# What goes on the wire as text: no character that would end a header or the request line
# --------------------------------------------------------------------------------------------------

# A URL, path or model name is written into the request line: a space or a control character there
# ends it early, and urlsplit silently drops tabs and line breaks, so they are refused before it sees them.
_NOT_IN_URL = re.compile(r"[\x00-\x20\x7f]")
_NOT_IN_HEADER = re.compile(r"[\r\n\x00]")  # CR or LF would end the header and start another
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
UNSAFE = "unsafe_characters"  # the error type: load.py never echoes such a value (it may hold a secret)


def _named(char: str) -> str:
    return {"\r": "CR", "\n": "LF", "\x00": "NUL", " ": "a space", "\t": "a tab"}.get(char, f"U+{ord(char):04X}")


def check_url_text(text: str, what: str = "a URL") -> str:
    """`text`, unless it holds a space or a control character (it goes into the request line)."""
    if found := _NOT_IN_URL.search(text):
        raise PydanticCustomError(UNSAFE, f"{what} cannot contain {_named(found.group())} (control characters and "
                                          "spaces would break the request line; percent-encode them, e.g. %20)")
    return text


def check_header_value(value: str) -> str:
    """A header value (also an API key, a content type): no CR, LF or NUL, from wherever it came
    (the file, --set, ${ENV}): sent as is, they would let the value add headers of its own."""
    if found := _NOT_IN_HEADER.search(value):
        raise PydanticCustomError(UNSAFE, f"a header value cannot contain {_named(found.group())} (it would end the "
                                          "header and start another: header injection)")
    return value


def check_header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise PydanticCustomError(UNSAFE, "a header name may use only letters, digits and !#$%&'*+-.^_`|~ (no "
                                          "spaces, colons or control characters)")
    return name


def check_process_text(text: str) -> str:
    """A command's word, an environment variable or a folder for a process: no NUL (the OS ends the
    string there, and Python refuses to start the process at all)."""
    if "\x00" in text:
        raise PydanticCustomError(UNSAFE, "a command, environment value or folder cannot contain NUL")
    return text


ProcessText = Annotated[str, AfterValidator(check_process_text)]
HeaderValue = Annotated[str, AfterValidator(check_header_value)]
HeaderName = Annotated[str, AfterValidator(check_header_name)]
Headers = dict[HeaderName, HeaderValue]
"""A {name: value} header mapping whose names and values cannot smuggle in another header."""
ModelName = Annotated[str, AfterValidator(lambda name: check_url_text(name, "a model name"))]  # KServe: in the path


def check_http_url(url: str) -> str:
    check_url_text(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host, like http://127.0.0.1:8000")
    try:
        _ = parts.port  # urlsplit parses the port lazily; a bad one raises here
    except ValueError:
        raise ValueError("the URL's port is not a number from 0 to 65535") from None
    return url


def split_credentials(url: str) -> tuple[str, str | None]:
    """(the URL without `user:password@`, the `Authorization: Basic ...` value they make, or None).

    Written into a request as is, userinfo would go out in the Host header (`Host: user:pw@host`),
    to the target and to every proxy's log; as basic authentication it is a header the scenario's
    redaction knows to be a secret."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}"


def check_method(method: str) -> str:
    method = method.upper()
    if method not in HTTP_METHODS:
        raise ValueError(f"expected one of {', '.join(HTTP_METHODS)}")
    return method


def check_path(path: str) -> str:
    """A request path is appended to the URL as is, so "infer" would give "http://hostinfer"."""
    if path and not path.startswith("/"):
        raise ValueError(f"a path must start with '/' (write /{path})")
    return check_url_text(path, "a path")


def check_unique(names: list[str], what: str) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(duplicates)}")


class ProblemAt(ValueError):
    """A problem found by a check across fields, with the data path of the field it is about (so the
    error names that field's line rather than the scenario's)."""

    def __init__(self, path: DataPath, message: str):
        super().__init__(f"{dotted(path)}: {message}")
        self.path, self.message = path, message


def dotted(path: DataPath) -> str:
    """("phases", 1, "arrival", "rate") -> "phases[1].arrival.rate"."""
    text = ""
    for item in path:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else str(item))
    return text


def model_field(model: Any, name: str | int) -> FieldInfo | None:
    """The field of the model class `model` that a scenario file calls `name` (its alias, else its
    name); None when there is none, or `model` is not a model. Schema walks step with it."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    return next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)


def unwrap(tp: Any) -> Any:
    """Annotated[X, ...] -> X and X | None -> X: the type a schema walk steps into."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]
        else:
            return tp
