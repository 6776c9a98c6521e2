"""What a stranger can send a real node: each attack ends its own
connection at most, and the node keeps answering everyone else."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import attrs
import pytest

from disque_trio.protocol import bus
from disque_trio.server.peers import INBOUND_PER_NODE

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
        try:
            chunk = s.recv(limit)
        except ConnectionResetError:
            break  # closed with our input unread: a reset, not a FIN
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


class BusStranger:
    """A raw socket on a node's bus port that speaks the frame format and
    the handshake, with the cluster secret given (or none)."""

    def __init__(self, node: NodeProcess, secret: bytes = b"", node_id: str = "ab" * 20) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
        self.node_id = node_id
        mine = bus.Handshake(node_id, "127.0.0.1", 1, 2, b"s" * bus.NONCE_LEN)
        self.sock.sendall(bus.encode_frame(mine))
        decoder = bus.FrameDecoder()
        received: list[bus.Message] = []
        while len(received) < 2:
            data = self.sock.recv(65536)
            assert data, "the node closed the connection during the handshake"
            decoder.feed(data)
            while (msg := decoder.next_message()) is not None:
                received.append(msg)
        theirs, auth = received
        assert isinstance(theirs, bus.Handshake) and isinstance(auth, bus.Auth)
        proof = bus.handshake_proof(secret, b"connector", mine, theirs)
        self.sock.sendall(bus.encode_frame(bus.Auth(proof)))

    def send(self, msg: bus.Message) -> None:
        self.sock.sendall(bus.encode_frame(msg))

    def closed_by_node(self) -> bool:
        self.sock.settimeout(10)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def cluster_nodes(node: NodeProcess) -> list[str]:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"CLUSTER NODES\r\n")
        header = b""
        while not header.endswith(b"\r\n"):
            header += s.recv(1)
        size = int(header[1:-2])
        body = b""
        while len(body) < size + 2:
            body += s.recv(65536)
    return body[:size].decode().splitlines()


STOLEN = bus.JobData(
    id="D-abababab-" + "A" * 24 + "-05a1",
    queue="q",
    body=b"stolen",
    repl=1,
    ctime=1,
    ttl=600,
    delay=0,
    retry=60,
    nacks=0,
    deliveries=0,
    nodes_delivered=("ab" * 20,),
)


@pytest.mark.parametrize(
    "fields", [{"ttl": 2**64 - 1}, {"retry": 2**64 - 1}, {"delay": 2**32}, {"nacks": 2**64 - 1}]
)
def test_repljob_with_out_of_range_numbers_closes_that_link_only(
    node_factory: object, fields: dict[str, int]
) -> None:
    """With the AOF on, a REPLJOB whose TTL was 2**64-1 made the AOF
    writer raise OverflowError out of the bus task and the node exited."""
    node: NodeProcess = node_factory("--appendonly", "yes")  # type: ignore[operator]
    stranger = BusStranger(node)
    try:
        stranger.send(bus.Meet(stranger.node_id, 0))
        stranger.send(bus.ReplJob(attrs.evolve(STOLEN, **fields)))
        assert stranger.closed_by_node()
    finally:
        stranger.close()
    assert ping_time(node) < 2.0
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"JSCAN\r\n")
        reply = s.recv(1024)
    assert b"D-abababab" not in reply  # the job was not taken
    assert node.proc is not None and node.proc.poll() is None


def info_field(node: NodeProcess, field: str) -> str:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"INFO\r\n")
        text = b""
        while not text.endswith(b"\r\n\r\n") or text.count(b"\r\n") < 3:
            text += s.recv(65536)
    for line in text.decode().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1]
    raise AssertionError(f"{field} not in INFO")


def sends_until_closed(s: socket.socket, data: bytes, limit: int) -> bool:
    """Send ``data`` over and over, at most ``limit`` bytes: True once the
    node closed the connection (a timeout error if it never does)."""
    sent = 0
    try:
        while sent < limit:
            s.sendall(data)
            sent += len(data)
        s.settimeout(5)
        return s.recv(1) == b""
    except (BrokenPipeError, ConnectionResetError):
        return True


def test_query_buffer_limit_closes_a_client_that_floods_input(
    node_factory: object,
) -> None:
    """A client blocked in GETJOB that kept sending had 1.57 GB buffered and
    stayed connected; past client-query-buffer-limit it is disconnected,
    blocked or not."""
    node: NodeProcess = node_factory("--client-query-buffer-limit", "2mb")  # type: ignore[operator]
    blocked = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    big_bulk = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    try:
        blocked.sendall(b"GETJOB TIMEOUT 60000 FROM nothing-here\r\n")
        assert sends_until_closed(blocked, b"PING\r\n" * 10_000, 64 << 20)
        big_bulk.sendall(b"*2\r\n$4\r\nECHO\r\n$100000000\r\n")
        assert sends_until_closed(big_bulk, b"x" * 65536, 64 << 20)
    finally:
        blocked.close()
        big_bulk.close()
    assert ping_time(node) < 2.0
    assert info_field(node, "client_query_buffer_limit_disconnections") == "2"


@pytest.mark.parametrize("given", [b"", b"wrong secret"])
def test_without_the_cluster_secret_a_stranger_cannot_meet(
    node_factory: object, given: bytes
) -> None:
    node: NodeProcess = node_factory("--cluster-secret", "s3cret")  # type: ignore[operator]
    stranger = BusStranger(node, given)
    try:
        stranger.send(bus.Meet(stranger.node_id, 0))
        assert stranger.closed_by_node()
    finally:
        stranger.close()
    assert len(cluster_nodes(node)) == 1
    assert ping_time(node) < 2.0


def test_with_the_cluster_secret_a_node_may_meet(node_factory: object) -> None:
    node: NodeProcess = node_factory("--cluster-secret", "s3cret")  # type: ignore[operator]
    stranger = BusStranger(node, b"s3cret")
    try:
        stranger.send(bus.Meet(stranger.node_id, 0))
        deadline = time.monotonic() + 10
        while len(cluster_nodes(node)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(line.startswith(stranger.node_id) for line in cluster_nodes(node))
    finally:
        stranger.close()


def test_strangers_that_never_meet_hold_little(node_factory: object) -> None:
    """Eight handshaken connections with no MEET held 529 MB of frames in
    progress; now such a link may send 256 KB frames at most, and no more
    than 64 of them wait at once."""
    node: NodeProcess = node_factory()  # type: ignore[operator]
    big = BusStranger(node)
    try:
        big.sock.sendall((64 << 20).to_bytes(4, "big") + b"x" * 65536)
        assert big.closed_by_node()
    finally:
        big.close()
    strangers = [BusStranger(node, node_id=f"{n:040x}") for n in range(1, 65)]
    try:
        extra = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
        extra.sendall(bus.encode_frame(bus.Handshake("ff" * 20, "127.0.0.1", 1, 2, b"x" * 16)))
        assert read_until_closed(extra) == b""  # refused before any handshake
        extra.close()
        assert ping_time(node) < 2.0
    finally:
        for stranger in strangers:
            stranger.close()
    time.sleep(0.5)
    BusStranger(node).close()  # room again once they left


def test_a_known_node_holds_a_few_inbound_links_the_newest(node_factory: object) -> None:
    """Without a cluster secret, one MEET let a stranger open bus links
    under that node's ID, each holding a descriptor (1,010 of them under
    ulimit -n 1024 left the node unable to answer). A node may hold
    INBOUND_PER_NODE inbound links (its link, plus a MEET connection or a
    reconnection for a moment): the oldest goes beyond that."""
    node: NodeProcess = node_factory()  # type: ignore[operator]
    first = BusStranger(node)
    first.send(bus.Meet(first.node_id, 0))
    deadline = time.monotonic() + 10
    while not any(line.startswith(first.node_id) for line in cluster_nodes(node)):
        assert time.monotonic() < deadline, "the MEET was not taken"
        time.sleep(0.05)
    links = [first]
    try:
        for _ in range(30):
            links.append(BusStranger(node, node_id=first.node_id))
            if len(links) > INBOUND_PER_NODE:
                assert links[-1 - INBOUND_PER_NODE].closed_by_node()  # the oldest goes
        for newest in links[-INBOUND_PER_NODE:]:
            newest.send(bus.Ping(newest.node_id, 0))
            newest.sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                newest.sock.recv(1)  # the newest stay open
        replaced = int(cluster_info(node)["cluster_stats_replaced_links"])
        assert replaced == len(links) - INBOUND_PER_NODE
        assert ping_time(node) < 2.0
    finally:
        for link in links:
            link.close()


def cluster_info(node: NodeProcess) -> dict[str, str]:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"CLUSTER INFO\r\n")
        text = b""
        while not text.endswith(b"\r\n\r\n"):
            text += s.recv(65536)
    lines = text.split(b"\r\n", 1)[1].decode().splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line)


def test_addjob_with_huge_numbers_is_refused_with_the_aof_on(node_factory: object) -> None:
    """ADDJOB ... RETRY 9223372036854775807 with the AOF on got no reply:
    the connection closed and the job stayed in memory with no AOF record."""
    node: NodeProcess = node_factory("--appendonly", "yes")  # type: ignore[operator]
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        for option in (b"RETRY", b"TTL", b"DELAY"):
            s.sendall(b"ADDJOB q body 0 %b 9223372036854775807\r\n" % option)
            assert s.recv(1024) == b"-ERR %b is too large: at most 4294967295 seconds\r\n" % option
        s.sendall(b"INFO jobs\r\n")
        info = s.recv(4096)
    assert b"registered_jobs:0" in info
    aof = node.workdir / "disque.aof"
    assert not aof.exists() or aof.read_bytes() == b""


def open_many(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        sockets.append(s)
    return sockets


def test_out_of_descriptors_the_node_lowers_maxclients_and_survives(
    node_factory: object,
) -> None:
    """With ulimit -n 1024 and the default maxclients, about 1,012 idle
    connections made the node exit with EMFILE; 1,100 to the bus port too.
    Now maxclients is fitted to the limit at start (and said so), the
    clients past it get the original's error, and the bus port's strangers
    are turned away: the node keeps serving."""
    node: NodeProcess = node_factory(nofile=1024)  # type: ignore[operator]
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"CONFIG GET maxclients\r\n")
        reply = s.recv(1024)
    maxclients = int(reply.split(b"\r\n")[4])
    assert 1 <= maxclients < 1024 - 100
    clients = open_many(node.port, 1100)
    try:
        refused = 0
        for s in clients[maxclients:]:
            refused += read_until_closed(s) == b"-ERR max number of clients reached\r\n"
        assert refused >= 1100 - maxclients - 1  # the config connection may linger
    finally:
        for s in clients:
            s.close()
    time.sleep(0.5)
    assert ping_time(node) < 2.0
    strangers = open_many(node.port + 10000, 1100)
    try:
        assert ping_time(node) < 2.0
    finally:
        for s in strangers:
            s.close()
    time.sleep(0.5)
    assert ping_time(node) < 2.0
    node.kill(signal.SIGTERM)
    out = node.output()
    assert f"maxclients lowered from 10000 to {maxclients}" in out
    assert "Traceback" not in out


def test_getjob_from_a_million_queues_is_refused_at_once(node: NodeProcess) -> None:
    """It held the event loop for 17 s (the original: 5 s)."""
    names = [b"q%d" % i for i in range(1_000_000)]
    parts = [
        b"*%d\r\n$6\r\nGETJOB\r\n$7\r\nTIMEOUT\r\n$4\r\n2000\r\n$4\r\nFROM\r\n" % (4 + len(names))
    ]
    parts += [b"$%d\r\n%b\r\n" % (len(n), n) for n in names]
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        s.sendall(b"".join(parts))
        reply = s.recv(1024)
        assert reply == b"-ERR too many queues: GETJOB takes at most 10000\r\n"
        s.sendall(b"PING\r\n")
        assert s.recv(64) == b"+PONG\r\n"
    assert ping_time(node) < 2.0


def rss_of(node: NodeProcess) -> int:
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_goes_back_after_debug_flushall(node_factory: Any) -> None:
    """RSS stayed at 1.08 GB after DEBUG FLUSHALL while used_memory fell
    to 1 MB (the allocator kept its arenas); and an idle node's
    mem_fragmentation_ratio read 33."""
    node = node_factory("--enable-debug-command", "local")
    started = rss_of(node)
    assert float(info_field(node, "mem_fragmentation_ratio")) < 1.5
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        batch = b"".join(b"ADDJOB q%d 0123456789 0\r\n" % (i % 100) for i in range(10_000))
        for _ in range(20):
            s.sendall(batch)
            replies = b""
            while replies.count(b"\r\n") < 10_000:  # +D-... CRLF each
                replies += s.recv(1 << 20)
    full = rss_of(node)
    assert full > started + (80 << 20)  # 200,000 jobs
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        s.sendall(b"DEBUG FLUSHALL\r\n")
        assert s.recv(64) == b"+OK\r\n"
    assert rss_of(node) - started < (full - started) // 3
