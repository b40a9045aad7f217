"""A hostile HTTP target for the tests, on raw asyncio: each path misbehaves in its own way. It serves
from a background thread on 127.0.0.1 (`serve_hostile()` yields its base URL).

    /endless                  200, chunked, a body that never ends
    /v2/models/big/infer      200, a KServe binary response whose output declares shape [10**12, 10**12]
    /huge                     200, Content-Length: 10**12, then body bytes for as long as the client reads
    anything else             500 whose JSON error message repeats the Authorization and X-Api-Key headers
    /v1/chat/completions      200, an SSE stream of token chunks that never sends [DONE] and never ends

The endless ones write until the client hangs up (a write fails), so a client that reads forever
holds the server forever too: the test's own timeout then says so.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from typing import Iterator

PIECE = b"x" * 65536
TOKEN = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n' * 256
BIG_SHAPE = [10**12, 10**12]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]] | None:
    """(path, headers by lower-case name) of the next request, its body read and dropped; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get("content-length", "0")))
    return path, headers


async def _forever(writer: asyncio.StreamWriter, piece: bytes) -> None:
    while True:
        writer.write(piece)
        await writer.drain()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _kserve_big() -> bytes:
    header = json.dumps({"model_name": "big", "outputs": [
        {"name": "y", "datatype": "BYTES", "shape": BIG_SHAPE, "parameters": {"binary_data_size": 8}}]}).encode()
    body = header + b"\x04\x00\x00\x00abcd"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: %d\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(header), len(body), body))


def _echo(headers: dict[str, str]) -> bytes:
    said = f"{headers.get('authorization', '')} / {headers.get('x-api-key', '')}"
    body = json.dumps({"error": f"invalid credentials: {said}"}).encode()
    return b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while (request := await _read_request(reader)) is not None:
            path, headers = request
            if path.startswith("/endless"):
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                await _forever(writer, _chunk(PIECE))
            elif path.startswith("/huge"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % 10**12)
                await _forever(writer, PIECE)
            elif path == "/v1/chat/completions":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                await _forever(writer, _chunk(TOKEN))
            elif path.startswith("/v2/models/big/infer"):
                writer.write(_kserve_big())
            else:
                writer.write(_echo(headers))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@contextmanager
def serve_hostile() -> Iterator[str]:
    """The hostile target on a free loopback port, served from a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(_handle, "127.0.0.1", 0), loop).result(10)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        async def stop() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
