"""Publish/subscribe on real nodes, with redis-py and raw sockets: one node,
RESP2 and RESP3, a three-node cluster (a node killed and restarted), and a
subscriber that does not read."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable

import pytest
import redis

from .conftest import NodeProcess, form_cluster

pytestmark = pytest.mark.slow


def conn(node: NodeProcess, **kwargs: object) -> redis.Redis:
    return redis.Redis(port=node.port, socket_timeout=10, decode_responses=True, **kwargs)  # type: ignore[arg-type]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def next_message(ps: redis.client.PubSub, timeout: float = 5.0) -> dict[str, object] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = ps.get_message(timeout=0.2)
        if msg is not None and msg["type"] in ("message", "pmessage"):
            return msg  # type: ignore[no-any-return]
    return None


def info_stats(r: redis.Redis) -> dict[str, str]:
    # redis-py parses INFO into a dict of typed values: as text, as sent.
    return {k: str(v) for k, v in r.info("stats").items()}


def test_one_node_channels_patterns_and_introspection(node: NodeProcess) -> None:
    r = conn(node)
    ps = r.pubsub()
    ps.subscribe("news", "sport")
    ps.psubscribe("n*")
    confirmations = [ps.get_message(timeout=2) for _ in range(3)]
    assert [(m["type"], m["channel"], m["data"]) for m in confirmations if m] == [
        ("subscribe", "news", 1),
        ("subscribe", "sport", 2),
        ("psubscribe", "n*", 3),
    ]
    # A client subscribed both ways counts twice, as in Redis.
    assert r.publish("news", "hello") == 2
    got = [next_message(ps), next_message(ps)]
    assert {(m["type"], m["channel"], m["data"]) for m in got if m} == {
        ("message", "news", "hello"),
        ("pmessage", "news", "hello"),
    }
    assert r.publish("nothing-here", "x") == 1  # the pattern only
    assert next_message(ps)["pattern"] == "n*"  # type: ignore[index]
    assert r.publish("other", "x") == 0
    assert sorted(r.pubsub_channels()) == ["news", "sport"]
    assert r.pubsub_channels("s*") == ["sport"]
    assert r.pubsub_numsub("news", "absent") == [("news", 1), ("absent", 0)]
    assert r.pubsub_numpat() == 1
    stats = info_stats(r)
    assert stats["pubsub_channels"] == "2" and stats["pubsub_patterns"] == "1"
    assert stats["pubsub_clients"] == "1" and stats["pubsub_published"] == "3"
    assert stats["pubsub_delivered"] == "3"
    ps.unsubscribe("news")
    ps.punsubscribe()
    wait_for(lambda: r.pubsub_numpat() == 0 and r.pubsub_channels() == ["sport"])
    ps.close()
    wait_for(lambda: r.pubsub_channels() == [], what="subscriptions gone with the connection")
    assert info_stats(r)["pubsub_clients"] == "0"


def raw(node: NodeProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", node.port), timeout=5)
    return s


def read_until(s: socket.socket, end: bytes, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(end) and len(data) < limit:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_resp2_subscriber_may_only_subscribe_ping_and_quit(node: NodeProcess) -> None:
    s = raw(node)
    s.sendall(b"SUBSCRIBE a\r\nGETJOB NOHANG FROM q\r\nPING\r\nPING hi\r\nQUIT\r\n")
    data = read_until(s, b"+OK\r\n")
    assert data == (
        b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"
        b"-ERR Can't execute 'getjob': only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT "
        b"are allowed in this context\r\n"
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
        b"*2\r\n$4\r\npong\r\n$2\r\nhi\r\n"
        b"+OK\r\n"
    )
    assert s.recv(10) == b""  # QUIT closed it
    s.close()
    # Unsubscribed from everything, it is a normal connection again.
    s = raw(node)
    s.sendall(b"SUBSCRIBE a\r\nUNSUBSCRIBE\r\nUNSUBSCRIBE\r\nQLEN q\r\n")
    data = read_until(s, b":0\r\n:0\r\n")
    assert data == (
        b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"
        b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:0\r\n"
        b"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n"
        b":0\r\n"
    )
    s.close()


def test_resp3_pushes_between_replies(node: NodeProcess) -> None:
    s = raw(node)
    s.sendall(b"HELLO 3\r\nPING\r\n")
    assert read_until(s, b"+PONG\r\n").startswith(b"%")  # HELLO's map, then PONG
    s.sendall(b"SUBSCRIBE c\r\nQLEN q\r\n")
    data = read_until(s, b":0\r\n")
    assert data == b">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n:0\r\n"
    conn(node).publish("c", "m")
    assert read_until(s, b"m\r\n") == b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n"
    s.close()
    # redis-py's RESP3 client reads them too.
    r3 = conn(node, protocol=3)
    ps = r3.pubsub()
    ps.subscribe("c")
    assert ps.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    conn(node).publish("c", "again")
    assert next_message(ps)["data"] == "again"  # type: ignore[index]
    ps.close()


def test_arity_and_bad_subcommands(node: NodeProcess) -> None:
    r = conn(node)
    for cmd in (("SUBSCRIBE",), ("PSUBSCRIBE",), ("PUBLISH", "a"), ("PUBSUB",)):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            r.execute_command(*cmd)
    with pytest.raises(redis.ResponseError, match="Try PUBSUB HELP"):
        r.execute_command("PUBSUB", "BOGUS")
    with pytest.raises(redis.ResponseError, match="Try PUBSUB HELP"):
        r.execute_command("PUBSUB", "NUMPAT", "extra")
    assert r.execute_command("PUBSUB", "HELP")[0].startswith("PUBSUB <subcommand>")
    assert r.ping()  # the node lives


def test_cluster_wide_and_a_node_killed(node_factory: object) -> None:
    nodes = form_cluster(node_factory, 3)
    subs = []
    for n in nodes:
        ps = conn(n).pubsub()
        ps.subscribe("events")
        assert ps.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
        subs.append(ps)
    # PUBLISH answers the receivers of the node it was sent to.
    assert conn(nodes[0]).publish("events", "one") == 1
    for ps in subs:
        assert next_message(ps)["data"] == "one"  # type: ignore[index]
    assert info_stats(conn(nodes[1]))["pubsub_received"] == "1"
    # A node killed: the survivors' subscribers still hear each other.
    assert nodes[2].proc is not None
    nodes[2].proc.send_signal(signal.SIGKILL)
    nodes[2].proc.wait()
    started = time.monotonic()
    assert conn(nodes[1]).publish("events", "two") == 1
    for ps in subs[:2]:
        assert next_message(ps)["data"] == "two"  # type: ignore[index]
    stopped = time.monotonic() - started
    assert stopped < 2.0, f"publishing stalled {stopped:.2f} s after a node was killed"
    subs[2].close()
    # Restarted, its new subscribers hear the others again once linked.
    nodes[2].start()
    fresh = conn(nodes[2]).pubsub()
    fresh.subscribe("events")
    fresh.get_message(timeout=2)

    def heard() -> bool:
        conn(nodes[0]).publish("events", "three")
        return next_message(fresh, timeout=0.3) is not None

    wait_for(heard, timeout=15, what="the restarted node's subscriber to hear node 0")
    for ps in [*subs[:2], fresh]:
        ps.close()


def metrics(port: int) -> dict[str, float]:
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        name: float(value)
        for name, value in re.findall(r"^(disque_pubsub_[^ ]+) (\S+)$", text, re.M)
    }


def test_a_subscriber_that_does_not_read_is_dropped(node_factory: object) -> None:
    from ..helpers import free_port

    web = free_port()
    node: NodeProcess = node_factory("--web-port", str(web))  # type: ignore[operator]
    r = conn(node)
    r.config_set("pubsub-output-buffer-limit", "256kb 0 0")
    assert r.config_get("pubsub-output-buffer-limit") == {
        "pubsub-output-buffer-limit": "262144 0 0"
    }
    slow = raw(node)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(b"SUBSCRIBE flood\r\n")
    read_until(slow, b":1\r\n")
    fast = conn(node).pubsub()
    fast.subscribe("flood")
    fast.get_message(timeout=2)
    body = "x" * 100_000
    started = time.monotonic()
    heard = 0
    for _ in range(400):  # 40 MB, far more than the socket buffers hold
        r.publish("flood", body)
        # The reading subscriber keeps up meanwhile, and hears every one.
        heard += next_message(fast) is not None
    took = time.monotonic() - started
    assert heard == 400
    wait_for(lambda: info_stats(r)["pubsub_clients_dropped"] == "1", what="the slow one dropped")
    assert info_stats(r)["pubsub_clients"] == "1"  # the reader stays
    assert took < 20, f"publishing took {took:.1f} s: held up by a slow subscriber?"
    # What the slow one got before it was cut ends with the connection closing.
    slow.settimeout(5)
    total = 0
    while chunk := slow.recv(1 << 20):
        total += len(chunk)
    assert total < 20_000_000
    slow.close()
    assert "pubsub-output-buffer-limit" in node.output()
    assert r.ping()
    exported = metrics(web)
    assert exported["disque_pubsub_dropped_clients_total"] == 1
    assert exported["disque_pubsub_subscribers"] == 1
    assert exported['disque_pubsub_messages_total{way="published"}'] == 400
    assert exported["disque_pubsub_channels"] == 1
    fast.close()


def test_malformed_input_ends_that_connection_only(node: NodeProcess) -> None:
    ps = conn(node).pubsub()
    ps.subscribe("c")
    ps.get_message(timeout=2)
    s = raw(node)
    s.sendall(b"SUBSCRIBE c\r\n*2\r\n$9\r\nSUBSCRIBE\r\n$99999999999\r\n")
    data = read_until(s, b"\r\n\r\n", limit=4096)
    s.settimeout(5)
    while chunk := s.recv(4096):
        data += chunk
    assert b"subscribe" in data and b"-ERR Protocol error" in data
    s.close()
    assert conn(node).publish("c", "still") == 1
    assert next_message(ps)["data"] == "still"  # type: ignore[index]
    ps.close()


def test_the_clients_subscription_moves_when_its_node_is_killed(node_factory: object) -> None:
    from disque_trio.client import Client, Message

    from .conftest import url_of

    nodes = form_cluster(node_factory, 3)
    with Client(url_of(nodes)) as client:
        sub = client.subscribe("jobs-done", patterns=["alerts.*"])
        address = sub.address
        assert address is not None
        other = next(n for n in nodes if n.port != address[1])
        with Client(f"127.0.0.1:{other.port}") as publisher:

            def heard(data: bytes) -> Message | None:
                publisher.publish("jobs-done", data)
                return sub.get_message(timeout=0.3)

            wait_for(lambda: heard(b"warm") is not None, what="the first message")
            while sub.get_message(timeout=0.2) is not None:
                pass  # the warm-up's extra copies
            publisher.publish("alerts.disk", b"full")
            assert sub.get_message(timeout=5) == Message("alerts.disk", b"full", "alerts.*")
            # Its node killed: it subscribes again on another node.
            victim = next(n for n in nodes if n.port == address[1])
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            started = time.monotonic()
            got: Message | None = None
            while got is None and time.monotonic() - started < 20:
                publisher.publish("jobs-done", b"after")
                got = sub.get_message(timeout=0.5)
            took = time.monotonic() - started
            assert got == Message("jobs-done", b"after"), f"nothing heard in {took:.1f} s"
            assert sub.reconnects == 1 and sub.address != address
            assert took < 10, f"the subscription was dark {took:.1f} s"
        sub.close()


def test_async_subscription_under_trio(node: NodeProcess) -> None:
    import trio

    from disque_trio.client import AsyncClient, Message

    async def main() -> list[Message]:
        async with AsyncClient(f"127.0.0.1:{node.port}") as client:
            sub = await client.subscribe("c1", patterns=["p.*"])
            async with sub:
                got: list[Message] = []
                # Subscribed once a message reaches it.
                with trio.fail_after(10):
                    while not got:
                        await client.publish("c1", b"hello")
                        message = await sub.get_message(timeout=0.2)
                        if message is not None:
                            got.append(message)
                await client.publish("p.x", b"pattern")
                async for message in sub:
                    if message.pattern is not None:
                        got.append(message)
                        break
                return got

    got = trio.run(main)
    assert got[0] == Message("c1", b"hello") and got[-1] == Message("p.x", b"pattern", "p.*")


def test_the_adapters_listener_with_a_password(node_factory: object) -> None:
    """The integrations' listener thread (disque_trio.integrations._listener):
    AUTH, a confirmed subscription, messages to its handler, a new
    connection after its node restarts."""
    from disque_trio.client import Client, Message
    from disque_trio.integrations._common import SharedClient
    from disque_trio.integrations._listener import Listener

    node = node_factory("--requirepass", "s3cret")  # type: ignore[operator]
    url = f"disque://:s3cret@127.0.0.1:{node.port}"
    got: list[Message] = []
    shared = SharedClient(lambda: Client(url))
    listener = Listener(shared, got.append, password="s3cret")
    try:
        listener.subscribe("ch")
        listener.subscribe("p.*", pattern=True)
        with Client(url) as c:
            assert c.publish("ch", b"one") == 1
            assert c.publish("p.x", b"two") == 1
        wait_for(lambda: len(got) == 2, what="both messages")
        assert got == [Message("ch", b"one"), Message("p.x", b"two", "p.*")]
        node.stop()
        node.start()
        with Client(url) as c:

            def heard() -> bool:
                c.publish("ch", b"again")
                time.sleep(0.1)
                return got[-1] == Message("ch", b"again")

            wait_for(heard, timeout=15, what="the listener back on the restarted node")
        assert listener.reconnects >= 1
    finally:
        listener.close()
        shared.close()
