"""What a stranger can do to a real node's web port: each attack ends its own
connection at most, and the node keeps answering PING and /healthz."""

from __future__ import annotations

import base64
import json
import select
import socket
import struct
import time

import pytest
import trio
import trio_websocket
import wsproto
import wsproto.events as wse

from .conftest import NodeProcess

pytestmark = pytest.mark.slow

WAIT_S = 10.0


def web_port(node: NodeProcess) -> int:
    return node.port + 1000


def ping(node: NodeProcess, password: str = "") -> None:
    """A fresh RESP connection gets PONG within a second."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=1.0) as s:
        if password:
            s.sendall(f"AUTH {password}\r\n".encode())
            assert s.recv(64) == b"+OK\r\n"
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


def still_serving(node: NodeProcess, password: str = "") -> None:
    assert node.proc is not None and node.proc.poll() is None, "the node exited"
    ping(node, password)
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


# ---------------------------------------------------- Host and DNS rebinding

GOOD_KEY = base64.b64encode(b"0123456789abcdef").decode()


def upgrade(key: str = GOOD_KEY, origin: str | None = None) -> bytes:
    lines = [
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return "".join(f"{line}\r\n" for line in lines).encode()


def first_status(node: NodeProcess, target: str, host: str, extra: bytes = b"") -> int:
    """The status of a request; the connection is closed after the head
    (a 101 would otherwise stay open)."""
    with socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n".encode() + extra + b"\r\n")
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, head
            head += chunk
        return status_of(head)


def test_a_dns_rebinding_host_is_refused(node_factory: object) -> None:
    node: NodeProcess = node_factory("--requirepass", "s3cret")  # type: ignore[operator]
    port = web_port(node)
    auth = b"Authorization: Bearer s3cret\r\n"
    rebound = f"rebind.example:{port}"
    same_origin = upgrade(origin=f"http://{rebound}")
    # Origin and Host agree (the page's own name, now resolving to the node):
    # refused anyway, before the password is asked (no Basic prompt on the
    # attacker's page) and before the upgrade.
    for target in ("/", "/metrics", "/static/dashboard.js", "/nope"):
        assert first_status(node, target, rebound) == 421
        assert first_status(node, target, rebound, auth) == 421
    assert first_status(node, "/ws", rebound, same_origin) == 421
    assert first_status(node, "/ws", rebound, same_origin + auth) == 421
    response = get(node, "/", host=rebound)
    assert b"web-allowed-hosts" in response and b"connection: close" in response.lower()
    for host in ("Rebind.Example", "rebind.example.", "localhost.rebind.example", "[::1"):
        assert first_status(node, "/", host, auth) in (400, 421)
    # /healthz answers whatever the Host: probes by address or by any name.
    for host in (rebound, "10.0.0.7:8711", "lb-probe"):
        response = get(node, "/healthz", host=host)
        assert status_of(response) == 200 and response.endswith(b"ok\n")
    # The node's own names and addresses are served.
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
        assert first_status(node, "/", host, auth) == 200, host
        assert first_status(node, "/ws", host, upgrade(origin=f"http://{host}")) == 101, host
        assert first_status(node, "/ws", host, upgrade()) == 101, host
    still_serving(node, "s3cret")


def test_web_allowed_hosts_adds_names(node_factory: object) -> None:
    node: NodeProcess = node_factory("--web-allowed-hosts", "disque.example")  # type: ignore[operator]
    port = web_port(node)
    assert first_status(node, "/", f"disque.example:{port}") == 200
    assert first_status(node, "/", "DISQUE.example") == 200
    assert first_status(node, "/", "ops.example") == 421
    with socket.create_connection(("127.0.0.1", node.port), timeout=WAIT_S) as s:
        assert resp(s, b"CONFIG SET web-allowed-hosts ops.example\r\n") == b"+OK\r\n"
    assert first_status(node, "/", "ops.example") == 200
    assert first_status(node, "/metrics", "disque.example") == 421  # replaced, not added
    host = f"ops.example:{port}"
    assert first_status(node, "/ws", host, upgrade(origin=f"http://{host}")) == 101
    with socket.create_connection(("127.0.0.1", node.port), timeout=WAIT_S) as s:
        assert resp(s, b"CONFIG SET web-allowed-hosts *\r\n") == b"+OK\r\n"
    assert first_status(node, "/", "anything.example") == 200
    # The Origin rule still applies to /ws: a page of another origin is refused.
    evil = upgrade(origin="http://evil.example")
    assert first_status(node, "/ws", "anything.example", evil) == 403


@pytest.mark.parametrize(
    "key",
    [
        "!!",
        "not base64 at all",
        base64.b64encode(b"0123456789abcde").decode(),  # 15 bytes
        base64.b64encode(b"0123456789abcdefg").decode(),  # 17 bytes
        base64.b64encode(b"0123456789abcdef").decode().rstrip("="),  # unpadded
        "=" * 24,
    ],
)
def test_a_malformed_websocket_key_gets_400(node: NodeProcess, key: str) -> None:
    response = get(node, "/ws", extra=upgrade(key=key))
    assert status_of(response) == 400
    assert b"Sec-WebSocket-Key must be the base64 of 16 bytes" in response
    assert first_status(node, "/ws", "127.0.0.1", upgrade()) == 101


# ------------------------------------------- what the fuzzer found (kept)


def test_head_on_ws_gets_an_answer_without_body(node: NodeProcess) -> None:
    """HEAD /ws was answered 405/426 with a body, which h11 refuses after a
    HEAD request: the connection ended with a logged error."""
    for extra in (b"", upgrade()):
        with socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S) as s:
            s.sendall(b"HEAD /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"\r\n")
            data = b""
            while chunk := s.recv(4096):  # the node closes after /ws
                data += chunk
        assert status_of(data) in (405, 426)
        assert data.endswith(b"\r\n\r\n") and data.count(b"\r\n\r\n") == 1  # no body
    still_serving(node)
    assert "Traceback" not in node_log(node)


async def test_ids_a_reply_cannot_carry_do_not_end_the_session(node: NodeProcess) -> None:
    """An id "\\ud800" (a lone surrogate) made the reply unencodable as UTF-8,
    and 1e400 (inf) as JSON: the session ended with a logged error."""
    url = f"ws://127.0.0.1:{web_port(node)}/ws"
    async with trio_websocket.open_websocket_url(url) as conn:
        with trio.fail_after(WAIT_S):
            await conn.send_message('{"id": "\\ud800", "cmd": ["PING"]}')
            assert json.loads(await conn.get_message()) == {"id": "\ud800", "result": "PONG"}
            await conn.send_message('{"id": 1e400, "cmd": ["PING"]}')
            reply = json.loads(await conn.get_message())
            assert reply["id"] is None and "out of range" in reply["error"]
            await conn.send_message('{"id": 1, "subscribe": ["\\udfff"]}')
            assert "unknown topic" in json.loads(await conn.get_message())["error"]
            await conn.send_message('{"id": 2, "cmd": ["PING"]}')
            assert json.loads(await conn.get_message()) == {"id": 2, "result": "PONG"}
    still_serving(node)
    assert "Traceback" not in node_log(node)


def test_a_ping_after_the_node_began_closing_is_not_a_bug(node: NodeProcess) -> None:
    """An oversized message makes the node close the socket (1009); a ping
    right behind it reached trio-websocket's reader in its closing state,
    whose pong wsproto refuses (python-trio/trio-websocket#184): logged as
    an unexpected error until the boundary knew it for a peer's doing."""
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", web_port(node)), timeout=WAIT_S) as s:
            ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
            s.sendall(ws.send(wse.Request(host="127.0.0.1", target="/ws")))
            ws.receive_data(s.recv(4096))
            assert [type(e) for e in ws.events()] == [wse.AcceptConnection]
            too_big = ws.send(wse.TextMessage(data="x" * ((1 << 20) + 10)))
            s.sendall(too_big + ws.send(wse.Ping(payload=b"p")) * 3)
            read_response(s)  # until the node closes
    still_serving(node)
    assert "Traceback" not in node_log(node)
