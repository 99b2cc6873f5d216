"""Rank 0's line to each other rank: length-prefixed pickles over a TCP socket; the other ranks
write back only their answers to rank tasks (rank_tasks.py).

A socket rather than a torch.distributed broadcast because the other ranks wait for the next step
for as long as the engine is idle, which a collective's timeout would cut short; and because a
closed socket is how each side learns at once that the other died (kill -9 included): the other
ranks read EOF when rank 0 goes, and rank 0's watcher (executor.py), which reads the answers, reads
EOF when a rank goes.
"""
from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any

_LENGTH = struct.Struct("!Q")


class ChannelClosed(ConnectionError):
    """The other end went away."""


def listen(host: str) -> socket.socket:
    server = socket.create_server((host, 0))
    server.listen()
    return server


def accept(server: socket.socket, timeout_s: float) -> tuple[socket.socket, int]:
    """One rank's connection and the rank it announces."""
    server.settimeout(timeout_s)
    conn, _ = server.accept()
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn, recv(conn)


def connect(host: str, port: int, rank: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send([conn], rank)
    return conn


def send(conns: list[socket.socket], message: Any) -> None:
    """Pickles once, writes to every connection."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    frame = _LENGTH.pack(len(data)) + data
    for conn in conns:
        conn.sendall(frame)


def _read(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other end closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(conn: socket.socket) -> Any:
    (length,) = _LENGTH.unpack(_read(conn, _LENGTH.size))
    return pickle.loads(_read(conn, length))
