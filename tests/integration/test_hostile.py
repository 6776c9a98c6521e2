"""What a stranger can send a real node: each attack ends its own
connection at most, and the node keeps answering everyone else."""

from __future__ import annotations

import socket
import time

import pytest

from .conftest import NodeProcess

pytestmark = pytest.mark.slow


def ping_time(node: NodeProcess) -> float:
    """Seconds a fresh connection takes to get PONG."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(64) == b"+PONG\r\n"
    return time.monotonic() - started


def read_until_closed(s: socket.socket, limit: int = 1 << 16) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = s.recv(limit)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize(
    "header", [b"*2147483648\r\n", b"*4294967295\r\n", b"*1\r\n*2147483648\r\n"]
)
def test_huge_multibulk_headers_are_refused_at_once(node: NodeProcess, header: bytes) -> None:
    """13 bytes once held the event loop for 5 s each (hiredis allocated
    the array first); eight of them froze a node for 30 s."""
    sockets = [socket.create_connection(("127.0.0.1", node.port), timeout=10) for _ in range(8)]
    try:
        for s in sockets:
            s.sendall(header)
        assert ping_time(node) < 2.0
        for s in sockets:
            reply = read_until_closed(s)
            assert reply.startswith(b"-ERR Protocol error: ")
    finally:
        for s in sockets:
            s.close()
    assert ping_time(node) < 2.0
