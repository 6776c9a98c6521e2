"""What a stranger can do to a real node's web port: each attack ends its own
connection at most, and the node keeps answering PING and /healthz."""

from __future__ import annotations

import select
import socket
import struct
import time

import pytest

from .conftest import NodeProcess

pytestmark = pytest.mark.slow

WAIT_S = 10.0


def web_port(node: NodeProcess) -> int:
    return node.port + 1000


def ping(node: NodeProcess) -> None:
    """A fresh RESP connection gets PONG within a second."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=1.0) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(64) == b"+PONG\r\n"


def read_response(s: socket.socket, limit: int = 1 << 20) -> bytes:
    """What the node sends until it closes (or ``limit`` bytes, or the
    Content-Length of a first response is complete)."""
    data = b""
    while len(data) < limit:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and len(body) >= int(value):
                    return data
    return data


def http(node: NodeProcess, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S) as s:
        s.sendall(request)
        return read_response(s)


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:100]
    return int(response.split(b" ", 2)[1])


def get(node: NodeProcess, target: str, host: str = "127.0.0.1", extra: bytes = b"") -> bytes:
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\n".encode() + extra + b"\r\n"
    return http(node, request)


def healthz(node: NodeProcess) -> None:
    response = get(node, "/healthz")
    assert status_of(response) == 200 and response.endswith(b"\r\n\r\nok\n")


def still_serving(node: NodeProcess) -> None:
    assert node.proc is not None and node.proc.poll() is None, "the node exited"
    ping(node)
    healthz(node)


# ------------------------------------------------- peers that hang up early

CUT_REQUESTS = {
    # The body is announced, one byte of it sent: curl --max-time 1 -H
    # "Content-Length: 1000" -d x made the node exit, 5 times in 5.
    "short body": b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx",
    "truncated headers": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc",
    "cut chunked body": (
        b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10\r\n0123"
    ),
    "cut request line": b"GET /heal",
}


def send_and_hang_up(node: NodeProcess, data: bytes, how: str) -> None:
    s = socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S)
    try:
        s.sendall(data)
        if how == "wait":
            time.sleep(0.2)  # the node is waiting for the rest, as with curl
        elif how == "reset":
            # Close with a RST rather than a FIN.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        s.close()


@pytest.mark.parametrize("cut", sorted(CUT_REQUESTS))
def test_a_client_that_hangs_up_mid_request_ends_only_its_connection(
    node: NodeProcess, cut: str
) -> None:
    for how in ("now", "wait", "reset") * 4:
        send_and_hang_up(node, CUT_REQUESTS[cut], how)
    time.sleep(0.3)  # the node notices the last ones
    still_serving(node)
    # A half-closed peer (shutdown of its sending side) gets the 400.
    with socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S) as s:
        s.sendall(CUT_REQUESTS[cut])
        s.shutdown(socket.SHUT_WR)
        assert status_of(read_response(s)) == 400
    still_serving(node)
    assert "Traceback" not in node_log(node)


def node_log(node: NodeProcess) -> str:
    """What the node logged so far (the process is stopped to read it all)."""
    assert node.proc is not None
    node.kill()
    return node.output()


# ------------------------------------------------------------- maxclients


def resp(s: socket.socket, command: bytes) -> bytes:
    s.sendall(command)
    return s.recv(256)


def test_web_connections_count_against_maxclients(node_factory: object) -> None:
    node: NodeProcess = node_factory("--maxclients", "20")  # type: ignore[operator]
    kept = socket.create_connection(("127.0.0.1", node.port), timeout=WAIT_S)
    idle = [socket.create_connection(("127.0.0.1", web_port(node))) for _ in range(40)]
    try:
        # 1 RESP client + 19 HTTP connections make 20: the other 21 are told
        # 503 at once and closed; the first 19 stay open, waiting for requests.
        refused: list[socket.socket] = []
        deadline = time.monotonic() + WAIT_S
        while len(refused) < 21 and time.monotonic() < deadline:
            pending = [s for s in idle if s not in refused]
            readable, _, _ = select.select(pending, [], [], 0.1)
            for s in readable:
                s.settimeout(WAIT_S)
                answer = read_response(s)
                assert status_of(answer) == 503
                assert answer.endswith(b"\r\n\r\nmax number of clients reached\n")
                refused.append(s)
        waiting = [s for s in idle if s not in refused]
        assert waiting == idle[:19]
        assert select.select(waiting, [], [], 0.5)[0] == []  # nothing said to them
        # The node still answers its clients; a new one is refused as usual.
        assert resp(kept, b"PING\r\n") == b"+PONG\r\n"
        with socket.create_connection(("127.0.0.1", node.port), timeout=WAIT_S) as s:
            assert s.recv(256) == b"-ERR max number of clients reached\r\n"
        assert status_of(get(node, "/healthz")) == 503
        # A connection that holds a place is served.
        waiting[0].settimeout(WAIT_S)
        waiting[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(read_response(waiting[0])) == 200
        info = resp(kept, b"INFO stats\r\n")
        while b"rejected_connections:" not in info:
            info += kept.recv(65536)
        rejected = int(info.split(b"rejected_connections:")[1].split(b"\r\n")[0])
        assert rejected >= 23
    finally:
        for s in idle:
            s.close()
    # Once they are closed, new connections are served again.
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            still_serving(node)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    for _ in range(30):
        healthz(node)  # sequential connections free their place when they end
    ping(node)
    kept.close()
