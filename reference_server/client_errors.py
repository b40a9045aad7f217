"""What the HTTP front ends (the model's, the OpenAI-compatible one, the admin API) share about a client's
mistakes on the wire: a body that cannot be read, and aiohttp's log of the requests it refuses itself.

A client's mistake is a 4xx with a message, never a 500, and never a traceback in the server's log (which
is kept for the server's own bugs); a client that goes away is one INFO line. Three things got in the way:
- `request.read()` raises `RequestPayloadError` for a body its Content-Encoding does not decode (bytes
  that are not gzip under `Content-Encoding: gzip`) or a chunked body that breaks off; `read_body` turns
  it into `BodyUnreadable`, which each front end answers 400 in its own error shape.
- `request.read()` raises ConnectionResetError ("Connection lost") when the client closes its connection
  before the whole body came; `read_body` turns it into `ClientGone`, which the model's front end (its
  middleware catches every other exception as a bug) logs as one INFO line: there is no one to answer.
  (Escaping a handler, aiohttp itself drops it as a premature disconnection, at DEBUG.)
- aiohttp answers 400 by itself to a request its parser refuses (a bad header, a bad Content-Length, an
  encoding it cannot decode), and logs each one at ERROR with a traceback, on the logger the runner is
  given; and when a body did not decode, the read aiohttp makes after the answer (to drain it) logs the
  same error again. `LOG` is that logger for every runner here (`AppRunner(..., logger=LOG)`, aiohttp's
  documented option); its filter rewrites those records into one INFO line with the reason. Anything else
  aiohttp logs there (a 500 from a bug) keeps its traceback.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError


class BodyTooLarge(Exception):
    """The body is over the front end's limit (answered 413 with the flag to change)."""


class BodyUnreadable(ValueError):
    """The body cannot be read as sent; the message says why (answered 400)."""


class ClientGone(ConnectionResetError):
    """The client closed its connection before it had sent the whole body (aiohttp raises
    ConnectionResetError "Connection lost" from the read): nobody is left to answer, and nothing went
    wrong here. The message says how much of the body came; a front end logs it as one INFO line."""


_STATUS_PREFIX = re.compile(r"^\d{3}, message:\s*")  # how aiohttp's HTTP errors print: "400, message:\n  why"


def reason(exc: BaseException) -> str:
    """The first line of what aiohttp says went wrong, without its "400, message:" prefix."""
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    text = _STATUS_PREFIX.sub("", str(text)).strip()
    return text.splitlines()[0].rstrip(":") if text else type(exc).__name__


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, decoded as its Content-Encoding says. Raises BodyTooLarge past `max_bytes` (declared,
    or reached while reading a chunked or compressed body) and BodyUnreadable when it cannot be decoded."""
    if (request.content_length or 0) > max_bytes:
        raise BodyTooLarge
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge from None
    except web.RequestPayloadError as exc:
        raise BodyUnreadable(f"cannot read the request body: {reason(exc)}") from None
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError too (a subclass)
        declared = "" if request.content_length is None else f" of {request.content_length}"
        raise ClientGone(f"the client closed the connection while sending its request body ({request.method} "
                         f"{request.path}, {request.content.total_bytes}{declared} bytes came)") from None


def _client_fault(exc: BaseException | None) -> BaseException | None:
    """`exc`, or the cause it wraps, when it is a client's mistake aiohttp refused: a 4xx HTTP error from its
    parser, or a body that did not decode."""
    for _ in range(5):  # a short cause chain; never loops on a cycle
        if exc is None or isinstance(exc, web.RequestPayloadError) or (
                isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class _OneLineForClientMistakes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        fault = _client_fault(record.exc_info[1]) if record.exc_info else None
        if fault is not None:
            record.args = (reason(fault), record.getMessage())  # aiohttp's words, before `msg` changes
            record.msg = "malformed request (a client's mistake, not a server error): %s [aiohttp: %s]"
            record.exc_info = record.exc_text = None
            if record.levelno > logging.INFO:  # down to INFO, never up (aiohttp logs some at DEBUG already)
                record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


LOG = logging.getLogger("reference_server.http")
LOG.addFilter(_OneLineForClientMistakes())
