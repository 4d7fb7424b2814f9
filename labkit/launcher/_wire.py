"""Framed messages over Unix sockets between the launcher, its zygote and the ranks.

A frame is an 8-byte big-endian length followed by a pickle. File descriptors travel beside
a frame with SCM_RIGHTS (``socket.send_fds``), so pipes made by the launcher reach the ranks
without touching the file system or the network.
"""

from __future__ import annotations

import pickle
import socket
import struct

_HEADER = struct.Struct(">Q")


def send_msg(sock: socket.socket, obj: object, fds: list[int] | None = None) -> None:
    """Send one pickled object (and optionally file descriptors) as a frame."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    frame = _HEADER.pack(len(data)) + data
    if fds:
        # The descriptors ride on the first byte of the frame; the rest follows normally.
        socket.send_fds(sock, [frame[:1]], fds)
        sock.sendall(frame[1:])
    else:
        sock.sendall(frame)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes; raise EOFError if the peer closes first."""
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_msg(sock: socket.socket, max_fds: int = 0) -> tuple[object, list[int]]:
    """Receive one frame (blocking). Returns the object and any descriptors sent with it."""
    fds: list[int] = []
    if max_fds:
        first, fds, _flags, _addr = socket.recv_fds(sock, 1, max_fds)
        if not first:
            raise EOFError("peer closed the connection")
        header = first + recv_exact(sock, _HEADER.size - 1)
    else:
        header = recv_exact(sock, _HEADER.size)
    (length,) = _HEADER.unpack(header)
    return pickle.loads(recv_exact(sock, length)), fds


class FrameReader:
    """Incremental frame decoder for a non-blocking socket read from a select loop."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """Add bytes just read; return every complete message decoded so far."""
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buf)
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            out.append(pickle.loads(bytes(self._buf[_HEADER.size : end])))
            del self._buf[:end]
        return out
