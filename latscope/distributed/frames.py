"""How frames are carried: a 4-byte big-endian length, then a msgpack map `{"t": type, ...}`.

Two hops carry the same frames. Between a Locust process and its latscope child (the coordinator
beside the master, a node beside each worker) they go over a socketpair; through Locust, the relays
put the same map in a custom message (`latscope:down` from the master, `latscope:up` from a worker)
without decoding its payload. This module imports nothing but msgpack: the Locust processes import
it, and they must stay light (a relay that blocks misses Locust's heartbeats).
"""

from __future__ import annotations

import socket
import struct

import msgpack

WIRE_VERSION = 2  # bumped whenever a frame changes meaning: a node of another wire version is refused
MAX_FRAME = 1 << 30  # a frame's declared length above this is a broken peer, not a plan
_LENGTH = struct.Struct(">I")


class PeerGone(Exception):
    """The other end of a frame socket closed (its process exited, or was killed)."""


def pack(frame: dict) -> bytes:
    return msgpack.packb(frame, use_bin_type=True)


def unpack(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def send_frame(sock: socket.socket, frame: dict) -> None:
    data = pack(frame)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> dict:
    """The next frame (blocking); PeerGone at end of stream."""
    return recv_sized(sock)[0]


def recv_sized(sock: socket.socket) -> tuple[dict, int]:
    """The next frame and its size on the wire, in bytes."""
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    if length > MAX_FRAME:
        raise PeerGone(f"a frame of {length} bytes: not a latscope peer")
    return unpack(_recv_exactly(sock, length)), _LENGTH.size + length


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise PeerGone("closed")
        buf += chunk
    return bytes(buf)


