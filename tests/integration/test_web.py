"""The web port: the WebSocket JSON protocol (through trio-websocket's own
client), HTTP routes, /metrics, origin checks, and the ``ws`` subcommand.

Nodes run in this trio.run on real loopback sockets bound to port 0; every
wait is bounded.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import pytest
import redis
import trio
import trio_websocket
from prometheus_client.parser import text_string_to_metric_families

import disque_trio.about
from disque_trio.server import websocket
from disque_trio.server.node import NodeServer
from disque_trio.testing import RespClient

from ..helpers import MemoryNet, free_port, make_config, virtual_env
from .conftest import NodeProcess

WAIT_S = 10  # the bound on every wait for a reply or an event


class WebNode:
    def __init__(self, server: NodeServer) -> None:
        self.server = server
        assert server.web_port is not None
        self.web_port = server.web_port
        self.url = f"ws://127.0.0.1:{self.web_port}/ws"

    @asynccontextmanager
    async def ws(self, **kwargs: Any) -> AsyncIterator[WsClient]:
        async with trio_websocket.open_websocket_url(self.url, **kwargs) as conn:
            yield WsClient(conn)

    async def resp(self) -> RespClient:
        return RespClient(await trio.open_tcp_stream("127.0.0.1", self.server.port))


class WsClient:
    """Requests with ids 1, 2, 3...; replies and events as parsed JSON."""

    def __init__(self, conn: trio_websocket.WebSocketConnection) -> None:
        self.conn = conn
        self.next_id = 0
        self.events: list[Any] = []  # events that arrived while call() waited

    async def send(self, **request: Any) -> int:
        self.next_id += 1
        await self.conn.send_message(json.dumps({"id": self.next_id, **request}))
        return self.next_id

    async def recv(self) -> Any:
        with trio.fail_after(WAIT_S):
            return json.loads(await self.conn.get_message())

    async def call(self, *cmd: Any) -> Any:
        """The reply to one command (events that arrive first are kept)."""
        request_id = await self.send(cmd=list(cmd))
        while True:
            message = await self.recv()
            if "event" in message:
                self.events.append(message)
            elif message.get("id") == request_id:
                return message

    async def result(self, *cmd: Any) -> Any:
        reply = await self.call(*cmd)
        assert "error" not in reply, reply
        return reply["result"]

    async def closed_by_node(self) -> trio_websocket.ConnectionClosed:
        """Wait for the node to close the socket; return how it closed."""
        with pytest.raises(trio_websocket.ConnectionClosed) as closed, trio.fail_after(WAIT_S):
            while True:
                await self.conn.get_message()
        # trio-websocket 0.12's client leaves its TCP stream open when the
        # server closed first (aclose() returns early): close it here.
        await self.conn._stream.aclose()
        return closed.value

    async def event(self, name: str) -> Any:
        """The data of the next event of that name (kept ones first)."""
        while self.events:
            message = self.events.pop(0)
            if message["event"] == name:
                return message["data"]
        while True:
            message = await self.recv()
            if message.get("event") == name:
                return message["data"]


@asynccontextmanager
async def web_node(**config: Any) -> AsyncIterator[WebNode]:
    server = NodeServer(make_config(**config), virtual_env(), persist_cluster=False)
    listeners = list(await trio.open_tcp_listeners(0, host="127.0.0.1"))
    web = list(await trio.open_tcp_listeners(0, host="127.0.0.1"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, listeners, [], web)
        yield WebNode(server)
        server.shutdown()
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def web_cluster(count: int) -> AsyncIterator[list[WebNode]]:
    """Nodes whose bus runs over memory streams, each with a real web port."""
    net = MemoryNet()
    nodes: list[WebNode] = []
    async with trio.open_nursery() as nursery:
        for i in range(count):
            env = virtual_env(100 + i)
            env.net = net
            server = NodeServer(make_config(port=7711 + i), env, persist_cluster=False)
            bus = await net.open_listeners("127.0.0.1", 17711 + i)
            web = list(await trio.open_tcp_listeners(0, host="127.0.0.1"))
            await nursery.start(server.run, [], bus, web)
            nodes.append(WebNode(server))
        yield nodes
        for node in nodes:
            node.server.shutdown()
        nursery.cancel_scope.cancel()


# -------------------------------------------------------------- replies


async def test_every_reply_type() -> None:
    async with web_node() as node, node.ws() as c:
        job_id = await c.result("ADDJOB", "q", "hello", 0)
        assert isinstance(job_id, str) and job_id.startswith("D-")
        assert await c.result("QLEN", "q") == 1  # integer
        assert await c.result("PING") == "PONG"  # simple string
        assert await c.result("SHOW", "D-00000000-000000000000000000000000-0000") is None
        assert await c.result("GETJOB", "NOHANG", "FROM", "empty") is None  # null array
        got = await c.result("GETJOB", "WITHCOUNTERS", "FROM", "q")  # nested arrays
        assert got == [["q", job_id, "hello", "nacks", 0, "additional-deliveries", 0]]
        show = await c.result("SHOW", job_id)
        assert isinstance(show, list) and show[show.index("queue") + 1] == "q"
        config = await c.result("CONFIG", "GET", "maxmemory")  # a map: an object
        assert isinstance(config, dict) and list(config) == ["maxmemory"]
        assert "# Server" in await c.result("INFO", "server")  # verbatim text
        reply = await c.call("NOSUCHCOMMAND", "x")
        assert reply == {"id": reply["id"], "error": "ERR unknown command 'NOSUCHCOMMAND'"}
        bad = await c.call("ACKJOB", "not-an-id")
        assert bad["error"].startswith("BADID")


async def test_numbers_and_base64_arguments_and_binary_bodies() -> None:
    async with web_node() as node, node.ws() as c:
        raw = b"\xff\x00binary\x80"
        b64 = base64.b64encode(raw).decode()
        job_id = await c.result("ADDJOB", "bin", {"base64": b64}, 0, "RETRY", 7)
        got = await c.result("GETJOB", "FROM", "bin")
        assert got == [["bin", job_id, {"base64": b64}]]
        # The number 7 reached the node as "7".
        show = await c.result("SHOW", job_id)
        assert show[show.index("retry") + 1] == 7
        # Text bodies come back as text, including non-ASCII UTF-8.
        await c.result("ADDJOB", "txt", "héllo ✓", 0)
        assert (await c.result("GETJOB", "FROM", "txt"))[0][2] == "héllo ✓"


async def test_bad_requests_keep_the_socket_usable() -> None:
    async with web_node() as node, node.ws() as c:
        await c.conn.send_message("{not json")
        reply = await c.recv()
        assert reply["id"] is None and reply["error"].startswith("ERR invalid JSON")
        await c.conn.send_message("[1, 2]")
        assert (await c.recv())["error"] == "ERR a request must be a JSON object"
        await c.conn.send_message(json.dumps({"id": "x", "cmd": ["PING"], "extra": 1}))
        assert await c.recv() == {"id": "x", "error": "ERR unknown field 'extra' in request"}
        await c.conn.send_message(json.dumps({"id": 5, "cmd": "PING"}))
        assert (await c.recv())["error"] == "ERR 'cmd' must be a non-empty array"
        await c.conn.send_message(json.dumps({"id": 6, "cmd": ["PING", True]}))
        reply = await c.recv()
        assert reply["id"] == 6 and "argument 1 must be a string" in reply["error"]
        await c.conn.send_message(json.dumps({"id": 7, "cmd": ["ECHO", {"base64": "!!"}]}))
        assert "not valid base64" in (await c.recv())["error"]
        await c.conn.send_message(json.dumps({"id": 8, "subscribe": ["weather"]}))
        assert "unknown topic 'weather'" in (await c.recv())["error"]
        await c.conn.send_message(b'{"id": 9, "cmd": ["PING"]}')
        assert "binary frames" in (await c.recv())["error"]
        assert await c.result("PING") == "PONG"


async def test_an_oversized_frame_closes_the_socket_with_1009() -> None:
    async with web_node() as node, node.ws() as c:
        await c.conn.send_message(json.dumps({"id": 1, "cmd": ["PING", "x" * (1 << 20)]}))
        closed = await c.closed_by_node()
        assert closed.reason.code == 1009
        # The node itself is fine.
        async with node.ws() as again:
            assert await again.result("PING") == "PONG"


# ---------------------------------------------------------- concurrency


async def test_a_blocked_getjob_does_not_hold_up_later_requests() -> None:
    async with web_node() as node, node.ws() as c:
        blocked = await c.send(cmd=["GETJOB", "TIMEOUT", 5000, "FROM", "q"])
        ping = await c.send(cmd=["PING"])
        assert await c.recv() == {"id": ping, "result": "PONG"}
        assert node.server.node.stats.blocked_clients == 1
        add = await c.send(cmd=["ADDJOB", "q", "wake up", 0])
        replies = {m["id"]: m for m in [await c.recv(), await c.recv()]}
        job_id = replies[add]["result"]
        assert replies[blocked]["result"] == [["q", job_id, "wake up"]]
        assert node.server.node.stats.blocked_clients == 0


async def test_getjob_timeout_answers_null() -> None:
    async with web_node() as node, node.ws() as c:
        assert await c.result("GETJOB", "TIMEOUT", 100, "FROM", "nothing") is None


async def test_in_flight_limit_per_socket() -> None:
    limit = websocket.MAX_IN_FLIGHT
    async with web_node() as node:
        async with node.ws() as c:
            for _ in range(limit):
                await c.send(cmd=["GETJOB", "TIMEOUT", 20000, "FROM", "slow"])
            over = await c.send(cmd=["PING"])
            assert await c.recv() == {
                "id": over,
                "error": f"ERR too many requests in flight (limit {limit})",
            }
            with trio.fail_after(WAIT_S):
                while node.server.node.stats.blocked_clients < limit:
                    await trio.sleep(0.01)
            # Jobs from another socket wake them all, and the socket is free again.
            async with node.ws() as producer:
                for i in range(limit):
                    await producer.result("ADDJOB", "slow", f"job {i}", 0)
            bodies = {(await c.recv())["result"][0][2] for _ in range(limit)}
            assert bodies == {f"job {i}" for i in range(limit)}
            assert await c.result("PING") == "PONG"
        # Closing a socket with blocked commands unblocks them in the core.
        async with node.ws() as c:
            await c.send(cmd=["GETJOB", "FROM", "never"])
            await c.result("PING")
            assert node.server.node.stats.blocked_clients == 1
        with trio.fail_after(WAIT_S):
            while node.server.node.stats.blocked_clients:
                await trio.sleep(0.01)


async def test_quit_closes_and_refused_commands() -> None:
    async with web_node() as node, node.ws() as c:
        monitor = await c.call("MONITOR")
        assert monitor["error"].startswith("ERR MONITOR is not available over WebSocket")
        hello = await c.call("HELLO", 3)
        assert "not available over WebSocket" in hello["error"]
        assert isinstance(await c.result("HELLO"), list)  # Disque's HELLO works
        clients = await c.result("CLIENT", "LIST")
        assert "cmd=client" in clients
        assert await c.result("QUIT") == "OK"
        assert (await c.closed_by_node()).reason.code == 1000


async def test_client_kill_closes_a_websocket_client() -> None:
    async with web_node() as node, node.ws() as victim, node.ws() as admin:
        await victim.send(cmd=["GETJOB", "FROM", "never"])
        victim_id = await victim.result("CLIENT", "ID")
        line = next(
            line
            for line in (await admin.result("CLIENT", "LIST")).splitlines()
            if line.startswith(f"id={victim_id} ")
        )
        assert "flags=b" in line
        assert await admin.result("CLIENT", "KILL", "ID", victim_id) == 1
        await victim.closed_by_node()
        with trio.fail_after(WAIT_S):
            while node.server.node.stats.blocked_clients or len(node.server.clients) > 1:
                await trio.sleep(0.01)


# -------------------------------------------------------- subscriptions


async def test_job_events_for_a_queue_and_unsubscribe() -> None:
    async with web_node() as node, node.ws() as c:
        sub = await c.send(subscribe=["jobs:q"])
        assert await c.recv() == {"id": sub, "result": "OK"}
        job_id = await c.result("ADDJOB", "q", "x", 0)
        await c.result("ADDJOB", "other", "not watched", 0)
        await c.result("GETJOB", "FROM", "q")
        await c.result("ACKJOB", job_id)
        events = c.events
        assert [e["data"]["what"] for e in events] == [
            "added",
            "queued",
            "delivered",
            "acked",
            "deleted",
        ]
        assert all(e["event"] == "job" for e in events)
        assert all(e["data"]["queue"] == "q" and e["data"]["id"] == job_id for e in events)
        unsub = await c.send(unsubscribe=["jobs:q"])
        assert await c.recv() == {"id": unsub, "result": "OK"}
        assert not node.server.node.observers  # nobody listens: the hook is gone
        add = await c.send(cmd=["ADDJOB", "q", "y", 0])
        assert (await c.recv())["id"] == add  # no event before the reply


async def test_stats_and_nodes_events() -> None:
    async with web_node() as node, node.ws() as c:
        await c.result("ADDJOB", "q1", "a", 0)
        await c.result("ADDJOB", "q1", "b", 0)
        await c.result("PAUSE", "q1", "in")
        sub = await c.send(subscribe=["stats", "nodes"])
        assert await c.recv() == {"id": sub, "result": "OK"}
        stats = await c.event("stats")
        assert set(stats) == {
            "time",
            "node_id",
            "release",
            "commit",
            "uptime",
            "clients",
            "blocked_clients",
            "used_memory",
            "jobs",
            "queues",
            "ops_per_sec",
            "aof",
        }
        assert stats["node_id"] == node.server.node.node_id
        assert stats["release"] == disque_trio.__version__
        assert stats["commit"] == disque_trio.about.commit()
        assert stats["jobs"] == {"total": 2, "queued": 2, "active": 0, "acked": 0, "wait_repl": 0}
        assert stats["clients"] == 1
        assert stats["aof"] == {"enabled": False, "size": 0}
        (q1,) = stats["queues"]
        assert q1["name"] == "q1" and q1["len"] == 2 and q1["jobs_in"] == 2
        assert q1["pause"] == "in" and q1["blocked"] == 0 and q1["jobs_out"] == 0
        assert set(q1) == {
            "name",
            "len",
            "blocked",
            "jobs_in",
            "jobs_out",
            "import_rate",
            "pause",
            "age",
            "idle",
            "requeue",
        }
        assert q1["requeue"] is None  # nothing waits to be queued again
        nodes = await c.event("nodes")
        assert nodes == [
            {
                "id": node.server.node.node_id,
                "addr": f"127.0.0.1:{node.server.config.port}",
                "flags": ["myself"],
                "link": "self",
                "last_ping": 0,
                "last_pong": 0,
            }
        ]
        # Stats keep coming once a second; a later one sees a new job.
        await c.result("PAUSE", "q1", "none")
        await c.result("ADDJOB", "q1", "c", 0)
        with trio.fail_after(WAIT_S):
            while (await c.event("stats"))["jobs"]["queued"] != 3:
                pass
        # Events sent before the node read the unsubscribe may still arrive
        # ahead of its answer; none may come after it.
        unsub = await c.send(unsubscribe=[])
        while (message := await c.recv()).get("id") != unsub:
            assert "event" in message, message
        assert message == {"id": unsub, "result": "OK"}
        with trio.move_on_after(1.5):
            while True:
                message = await c.recv()
                assert "event" not in message


async def test_stats_show_the_jobs_waiting_to_be_queued_again() -> None:
    """A job handed to a consumer and not acknowledged is in no queue: its
    queue's row says it waits for its RETRY, and when it comes back; so
    does one added with a DELAY."""
    async with web_node() as node, node.ws() as c:
        job_id = await c.result("ADDJOB", "q1", "a", 0, "RETRY", 30)
        await c.result("ADDJOB", "q1", "b", 0, "RETRY", 30)
        await c.result("GETJOB", "COUNT", 2, "FROM", "q1")
        await c.result("ADDJOB", "later", "c", 0, "DELAY", 50, "RETRY", 60)
        await c.send(subscribe=["stats"])
        await c.recv()
        stats = await c.event("stats")
        assert stats["jobs"]["active"] == 3 and stats["jobs"]["queued"] == 0
        rows = {q["name"]: q for q in stats["queues"]}
        assert [q["name"] for q in stats["queues"]] == ["later", "q1"]  # by name
        q1 = rows["q1"]
        assert q1["len"] == 0 and q1["requeue"]["jobs"] == 2
        # RETRY 30 from the delivery, give or take the core's time error.
        assert 25_000 <= q1["requeue"]["next_in_ms"] <= 30_500
        later = rows["later"]
        assert later["requeue"]["jobs"] == 1 and 45_000 <= later["requeue"]["next_in_ms"] <= 50_000
        assert later["len"] == 0
        # Given back (NACK): queued again, waiting for nothing. The length
        # is read live, the census is reused for a second: a later event.
        await c.result("NACK", job_id)
        with trio.fail_after(WAIT_S):
            while True:
                q1 = next(q for q in (await c.event("stats"))["queues"] if q["name"] == "q1")
                if q1["requeue"]["jobs"] == 1:
                    break
        assert q1["len"] == 1


def _add_job_for_a_full_outbox(node: WebNode) -> None:
    """Fill the outbox of the socket subscribed to ``jobs:flood`` as a
    consumer that stopped reading would, and add a job to that queue before
    the writer task gets a chance to drain it."""
    session = next(iter(node.server.web.hub.jobs["flood"]))
    while True:
        try:
            session.out_send.send_nowait(('{"event":"filler"}', False))
        except trio.WouldBlock:
            break
    server = node.server
    server.execute(session.client, [b"ADDJOB", b"flood", b"x", b"0"])
    server.commit()


async def test_slow_consumer_loses_the_subscription_not_the_node() -> None:
    async with web_node() as node, node.ws() as c:
        await c.send(subscribe=["jobs:flood"])
        await c.recv()
        _add_job_for_a_full_outbox(node)
        assert "flood" not in node.server.web.hub.jobs
        assert not node.server.node.observers
        notice = await c.event("error")
        assert notice["topic"] == "jobs:flood" and "slow consumer" in notice["error"]
        assert await c.result("PING") == "PONG"


async def test_a_dropped_subscription_hides_no_job_event_from_other_observers() -> None:
    """The hub's observer leaves the node's list while the node is telling
    its observers of a job (a slow consumer's subscription dropped): an
    observer after it in the list still hears that event."""
    async with web_node() as node, node.ws() as c:
        await c.send(subscribe=["jobs:flood"])
        await c.recv()
        before: list[tuple[str, str]] = []
        heard: list[tuple[str, str]] = []
        observers = node.server.node.observers
        observers.insert(0, lambda event, job: before.append((event, job.queue)))
        observers.append(lambda event, job: heard.append((event, job.queue)))
        _add_job_for_a_full_outbox(node)
        assert "flood" not in node.server.web.hub.jobs
        assert before and all(queue == "flood" for _, queue in before)
        assert heard == before
        assert len(node.server.node.observers) == 2  # ours; the hub's is gone
        assert await c.result("PING") == "PONG"


async def test_cluster_nodes_events_and_bus_metrics() -> None:
    async with web_cluster(2) as (a, b), a.ws() as ca, b.ws() as cb:
        await cb.send(subscribe=["jobs:rq"])
        await cb.recv()
        await ca.send(subscribe=["nodes"])
        await ca.recv()
        assert len(await ca.event("nodes")) == 1
        assert await ca.result("CLUSTER", "MEET", "127.0.0.1", 7712) == "OK"
        with trio.fail_after(WAIT_S):
            while True:
                nodes = await ca.event("nodes")
                if len(nodes) == 2 and all(n["link"] != "disconnected" for n in nodes):
                    break
        other = next(n for n in nodes if n["id"] == b.server.node.node_id)
        assert other["addr"] == "127.0.0.1:7712" and other["link"] == "connected"
        assert "myself" not in other["flags"]
        job_id = await ca.result("ADDJOB", "rq", "copied", 0, "REPLICATE", 2)
        assert await cb.event("job") == {"queue": "rq", "id": job_id, "what": "added"}
        sent = await _metric_samples(a, "disque_bus_messages_sent")
        received = await _metric_samples(b, "disque_bus_messages_received")
        assert sent["repljob"] >= 1 and received["repljob"] >= 1
        assert sent["meet"] >= 1 and received["meet"] >= 1


async def _metric_samples(node: WebNode, family: str) -> dict[str, float]:
    _, _, body = await http_request(node.web_port, "GET", "/metrics")
    for f in text_string_to_metric_families(body.decode()):
        if f.name == family:
            return {s.labels["type"]: s.value for s in f.samples if s.name.endswith("_total")}
    raise AssertionError(f"no {family}")


# ------------------------------------------------------------------ auth


async def test_requirepass_applies_to_commands_and_subscriptions() -> None:
    async with web_node(requirepass="s3cret") as node, node.ws() as c:
        assert (await c.call("PING"))["error"] == "NOAUTH Authentication required."
        sub = await c.send(subscribe=["stats"])
        assert await c.recv() == {"id": sub, "error": "NOAUTH Authentication required."}
        assert (await c.call("AUTH", "wrong"))["error"] == "ERR invalid password"
        assert await c.result("AUTH", "s3cret") == "OK"
        assert await c.result("PING") == "PONG"
        sub = await c.send(subscribe=["stats"])
        assert await c.recv() == {"id": sub, "result": "OK"}


# ---------------------------------------------- requirepass on the web port
# A real node process (``--requirepass``), reached on its default web port.

PASSWORD = "s3cret"
CHALLENGE = 'Basic realm="disque-trio"'


def basic(password: str, user: str = "anyone") -> list[tuple[str, str]]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [("authorization", f"Basic {pair}")]


def bearer(password: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {password}")]


def ws_handshake(*extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-key", base64.b64encode(b"0123456789abcdef").decode()),
        ("sec-websocket-version", "13"),
        *extra,
    ]


def protected_node(node_factory: Any, *extra: str) -> tuple[NodeProcess, int]:
    node: NodeProcess = node_factory(*extra)
    return node, node.port + 1000


async def test_requirepass_protects_every_web_endpoint_but_healthz(node_factory: Any) -> None:
    node, port = protected_node(node_factory, "--requirepass", PASSWORD)
    r = redis.Redis(port=node.port, password=PASSWORD, socket_timeout=10)
    r.execute_command("ADDJOB", "secret-queue", "x", 0)
    for method, target in [
        ("GET", "/"),
        ("GET", "/metrics"),
        ("GET", "/static/dashboard.js"),
        ("GET", "/static/dashboard.css"),
        ("GET", "/static/missing.js"),  # no probing for files either
        ("GET", "/nope"),
        ("POST", "/metrics"),
    ]:
        status, headers, body = await http_request(port, method, target)
        assert status == 401, target
        assert headers["www-authenticate"] == CHALLENGE
        assert body.startswith(b"authentication required") and b"secret-queue" not in body
    status, headers, body = await http_request(port, "HEAD", "/metrics")
    assert (status, headers["www-authenticate"], body) == (401, CHALLENGE, b"")
    status, headers, body = await http_request(port, "GET", "/healthz")
    assert (status, body) == (200, b"ok\n") and "www-authenticate" not in headers
    assert (await http_request(port, "HEAD", "/healthz"))[0] == 200

    for credentials in (basic(PASSWORD), basic(PASSWORD, user=""), bearer(PASSWORD)):
        status, headers, body = await http_request(port, "GET", "/metrics", credentials)
        assert status == 200 and 'disque_queue_length{queue="secret-queue"} 1' in body.decode()
        status, headers, body = await http_request(port, "GET", "/", credentials)
        assert status == 200 and headers["content-type"].startswith("text/html")
        for name in ("dashboard.js", "dashboard.css"):
            assert (await http_request(port, "GET", f"/static/{name}", credentials))[0] == 200
        assert (await http_request(port, "GET", "/nope", credentials))[0] == 404
        assert (await http_request(port, "POST", "/metrics", credentials))[0] == 405
    lower = [("authorization", f"bearer {PASSWORD}")]  # the scheme is case-insensitive
    assert (await http_request(port, "GET", "/metrics", lower))[0] == 200


WRONG_AUTHORIZATIONS = [
    "Basic " + base64.b64encode(b"anyone:wrong").decode(),
    "Basic " + base64.b64encode(b"anyone:s3cret ").decode(),
    "Basic " + base64.b64encode(PASSWORD.encode()).decode(),  # no user:password pair
    "Basic !!not-base64!!",
    "Basic",
    "Bearer wrong",
    "Bearer",
    f"Digest {PASSWORD}",
    PASSWORD,
]


async def test_wrong_credentials_get_401(node_factory: Any) -> None:
    _, port = protected_node(node_factory, "--requirepass", PASSWORD)
    for authorization in WRONG_AUTHORIZATIONS:
        for target in ("/", "/metrics", "/static/dashboard.js"):
            status, headers, body = await http_request(
                port, "GET", target, [("authorization", authorization)]
            )
            assert (status, headers["www-authenticate"]) == (401, CHALLENGE), authorization
            assert body.startswith(b"invalid credentials")
        # A /ws handshake with wrong credentials is refused too (without
        # any: accepted, then AUTH is needed, see below).
        handshake = ws_handshake(("authorization", authorization))
        status, headers, _ = await http_request(port, "GET", "/ws", handshake)
        assert (status, headers["www-authenticate"]) == (401, CHALLENGE), authorization


async def test_websocket_with_requirepass(node_factory: Any) -> None:
    _, port = protected_node(node_factory, "--requirepass", PASSWORD)
    url = f"ws://127.0.0.1:{port}/ws"
    # No HTTP credentials: let in, and the AUTH command is needed, as before.
    async with trio_websocket.open_websocket_url(url) as conn:
        c = WsClient(conn)
        assert (await c.call("PING"))["error"] == "NOAUTH Authentication required."
        assert (await c.call("AUTH", "wrong"))["error"] == "ERR invalid password"
        assert await c.result("AUTH", PASSWORD) == "OK"
        assert await c.result("PING") == "PONG"
    # Credentials in the handshake (what a browser re-sends after the
    # dashboard page asked for them): the session starts authenticated.
    for credentials in (basic(PASSWORD), bearer(PASSWORD)):
        async with trio_websocket.open_websocket_url(url, extra_headers=credentials) as conn:
            c = WsClient(conn)
            assert await c.result("PING") == "PONG"
            sub = await c.send(subscribe=["stats"])
            assert await c.recv() == {"id": sub, "result": "OK"}
    # The same-origin rule still applies to an authenticated browser.
    evil = ws_handshake(("origin", "http://evil.example"), *basic(PASSWORD))
    assert (await http_request(port, "GET", "/ws", evil))[0] == 403

    def ws(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "disque_trio", "ws", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    refused = ws(url, "PING")
    assert refused.returncode == 1 and refused.stderr.startswith("NOAUTH")
    ok = ws("--auth", PASSWORD, url, "PING")
    assert (ok.returncode, ok.stdout) == (0, "PONG\n"), ok.stderr  # a string prints as text


async def test_config_set_requirepass_applies_to_the_web_port_at_once(node_factory: Any) -> None:
    node, port = protected_node(node_factory)
    r = redis.Redis(port=node.port, socket_timeout=10)
    async with KeepAlive(port) as kept:
        assert (await kept.get("/metrics"))[0] == 200
        assert (await http_request(port, "GET", "/"))[0] == 200
        r.config_set("requirepass", "first")
        # The very next request, even on a connection opened before.
        status, headers, _ = await kept.get("/metrics")
        assert (status, headers["www-authenticate"]) == (401, CHALLENGE)
        assert (await kept.get("/metrics", bearer("first")))[0] == 200
        r = redis.Redis(port=node.port, password="first", socket_timeout=10)
        r.config_set("requirepass", "second")
        assert (await kept.get("/metrics", bearer("first")))[0] == 401
        assert (await kept.get("/metrics", basic("second")))[0] == 200
        assert (await kept.get("/healthz"))[0] == 200
        r.config_set("requirepass", "")
        assert (await kept.get("/metrics"))[0] == 200
        assert (await kept.get("/"))[0] == 200


class KeepAlive:
    """One HTTP/1.1 connection for several requests in a row."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = h11.Connection(h11.CLIENT)
        self.stream: trio.SocketStream | None = None

    async def __aenter__(self) -> KeepAlive:
        self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.stream is not None
        await self.stream.aclose()

    async def get(
        self, target: str, headers: list[tuple[str, str]] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        assert self.stream is not None
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        all_headers = [("host", f"127.0.0.1:{self.port}"), *(headers or [])]
        request = h11.Request(method="GET", target=target, headers=all_headers)
        await self.stream.send_all(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        status, response_headers, body = 0, {}, b""
        with trio.fail_after(WAIT_S):
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    response_headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return status, response_headers, body


# ---------------------------------------------------------------- origin


async def _rejected_status(node: WebNode, origin: str) -> int:
    """The status of a refused handshake. (Raw HTTP here: trio-websocket
    0.12's client leaks its socket when a handshake is rejected.)"""
    handshake = [
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-key", base64.b64encode(b"0123456789abcdef").decode()),
        ("sec-websocket-version", "13"),
        ("origin", origin),
    ]
    status, _, body = await http_request(node.web_port, "GET", "/ws", handshake)
    assert status != 101
    if status == 403:
        assert b"is not allowed" in body
    return status


async def test_origin_checks() -> None:
    async with web_node() as node:
        assert await _rejected_status(node, "http://evil.example") == 403
        assert await _rejected_status(node, "null") == 403
        # Same host:port as the Host header: a page served by this node.
        same = f"http://127.0.0.1:{node.web_port}"
        async with node.ws(extra_headers=[("Origin", same)]) as c:
            assert await c.result("PING") == "PONG"
            await c.result("CONFIG", "SET", "web-allowed-origins", "http://good.example")
        async with node.ws(extra_headers=[("Origin", "http://good.example")]) as c:
            assert await c.result("PING") == "PONG"
        assert await _rejected_status(node, same) == 403


# ------------------------------------------------------------------ HTTP


async def http_request(
    port: int, method: str, target: str, headers: list[tuple[str, str]] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = h11.Connection(h11.CLIENT)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        all_headers = [("host", f"127.0.0.1:{port}"), *(headers or [])]
        request = h11.Request(method=method, target=target, headers=all_headers)
        await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status, response_headers, body = 0, {}, b""
        with trio.fail_after(WAIT_S):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    response_headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return status, response_headers, body


async def test_http_routes() -> None:
    async with web_node() as node:
        port = node.web_port
        status, headers, body = await http_request(port, "GET", "/healthz")
        assert (status, body) == (200, b"ok\n")
        status, headers, body = await http_request(port, "GET", "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert b"<html" in body.lower()
        assert (await http_request(port, "GET", "/nope"))[0] == 404
        assert (await http_request(port, "GET", "/static/../web.py"))[0] == 404
        assert (await http_request(port, "GET", "/static/missing.js"))[0] == 404
        status, headers, _ = await http_request(port, "POST", "/healthz")
        assert status == 405 and headers["allow"] == "GET, HEAD"
        assert (await http_request(port, "DELETE", "/metrics"))[0] == 405
        status, _, body = await http_request(port, "HEAD", "/healthz")
        assert status == 200 and body == b""
        assert (await http_request(port, "GET", "/ws"))[0] == 426


async def test_bad_http_gets_400() -> None:
    async with web_node() as node:
        stream = await trio.open_tcp_stream("127.0.0.1", node.web_port)
        async with stream:
            await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
            data = b""
            with trio.fail_after(WAIT_S):
                while chunk := await stream.receive_some(4096):
                    data += chunk
        assert data.startswith(b"HTTP/1.1 400 ")


async def test_healthz_while_loading() -> None:
    async with web_node() as node:
        node.server.aof.loading = True
        status, _, body = await http_request(node.web_port, "GET", "/healthz")
        node.server.aof.loading = False
        assert (status, body) == (503, b"loading\n")


async def test_metrics_exposition() -> None:
    async with web_node() as node:
        async with node.ws() as c:
            for i in range(3):
                await c.result("ADDJOB", "mq", f"job {i}", 0)
            await c.result("GETJOB", "FROM", "mq")
            await c.result("ADDJOB", "other", "x", 0)
            norepl = await c.call("ADDJOB", "mq", "x", 0, "REPLICATE", 2)  # alone: NOREPL
            assert norepl["error"].startswith("NOREPL")
            status, headers, body = await http_request(node.web_port, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert all(name.startswith("disque_") for name in families)
        text = body.decode()
        for name in families:
            assert f"# HELP {name}" in text or f"# HELP {name}_total" in text

        def value(family: str, **labels: str) -> float:
            for sample in families[family].samples:
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
            raise AssertionError(f"no sample {family} {labels}")

        assert value("disque_jobs", state="queued") == 3
        assert value("disque_jobs", state="active") == 1
        assert value("disque_queue_length", queue="mq") == 2
        assert value("disque_queue_jobs_in", queue="mq") == 3
        assert value("disque_queue_jobs_out", queue="mq") == 1
        assert value("disque_queue_length", queue="other") == 1
        assert value("disque_queue_import_rate", queue="mq") == 0
        assert value("disque_queue_blocked_clients", queue="mq") == 0
        assert value("disque_replication_failures") == 1
        assert value("disque_jobs_added") == 4
        assert value("disque_clients_connected") == 1  # the WebSocket above
        assert value("disque_blocked_clients") == 0
        assert value("disque_aof_enabled") == 0
        assert value("disque_aof_size_bytes") == 0
        assert value("disque_aof_rewrite_in_progress") == 0
        assert value("disque_memory_used_bytes") > 0
        assert value("disque_memory_max_bytes") == 1 << 30
        assert value("disque_aof_write_ok") == 1
        assert value("disque_aof_write_errors") == 0
        assert value("disque_uptime_seconds") >= 0
        assert value("disque_cluster_nodes_known") == 1
        assert value("disque_cluster_nodes_failing") == 0
        assert families["disque_bus_messages_sent"].type == "counter"
        assert families["disque_bus_messages_received"].type == "counter"
        assert families["disque_queue_length"].type == "gauge"


# ------------------------------------------------------- a real process


def test_ws_subcommand_against_a_real_node(node_factory: Any) -> None:
    node: NodeProcess = node_factory()
    url = f"ws://127.0.0.1:{node.port + 1000}/ws"

    def ws(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "disque_trio", "ws", url, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    added = ws("ADDJOB", "q", "hello", "0")
    assert added.returncode == 0, added.stderr
    job_id = added.stdout.removesuffix("\n")  # a string prints as text
    assert job_id.startswith("D-") and len(job_id) == 40
    qlen = ws("QLEN", "q")
    assert (qlen.returncode, json.loads(qlen.stdout)) == (0, 1)
    got = ws("GETJOB", "FROM", "q")
    assert json.loads(got.stdout) == [["q", job_id, "hello"]]
    failed = ws("ACKJOB", "nonsense")
    assert failed.returncode == 1 and failed.stderr.startswith("BADID")
    unreachable = subprocess.run(
        [sys.executable, "-m", "disque_trio", "ws", "ws://127.0.0.1:1/ws", "PING"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert unreachable.returncode == 1
    assert unreachable.stderr == "Could not connect to 127.0.0.1:1: connection refused\n"
    assert node.kill(signal.SIGTERM) == 0
    assert f"web listener on 127.0.0.1:{node.port + 1000}" in node.output()


def run_ws(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "disque_trio", "ws", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_ws_subcommand_prints_strings_as_text(node_factory: Any) -> None:
    node: NodeProcess = node_factory()
    url = f"ws://127.0.0.1:{node.port + 1000}/ws"
    info = run_ws(url, "INFO", "server")
    assert info.returncode == 0, info.stderr
    assert info.stdout.startswith("# Server\n") and "\r" not in info.stdout
    assert f"\ntcp_port:{node.port}\n" in info.stdout
    assert info.stdout.endswith("\n") and not info.stdout.endswith("\n\n")
    # Structured results stay JSON.
    job_id = run_ws(url, "ADDJOB", "q", "two\nlines", "0").stdout.removesuffix("\n")
    got = run_ws(url, "GETJOB", "FROM", "q")
    assert json.loads(got.stdout) == [["q", job_id, "two\nlines"]]
    assert json.loads(run_ws(url, "QLEN", "q").stdout) == 0
    assert run_ws(url, "SHOW", job_id + "x").returncode == 1


def test_ws_subcommand_errors_are_one_line(node_factory: Any) -> None:
    node: NodeProcess = node_factory()
    web = node.port + 1000
    cases = [
        (
            [f"http://127.0.0.1:{web}/", "PING"],
            2,
            f"URL must start with ws:// or wss:// (did you mean ws://127.0.0.1:{web}/ws?)",
        ),
        (
            [f"ws://127.0.0.1:{web}/nope", "PING"],
            1,
            f"HTTP 404 from ws://127.0.0.1:{web}/nope: not a WebSocket endpoint (try /ws)",
        ),
        (
            [f"ws://127.0.0.1:{web}/", "PING"],
            1,
            f"HTTP 200 from ws://127.0.0.1:{web}/: not a WebSocket endpoint (try /ws)",
        ),
        (["ws://127.0.0.1:99999/ws", "PING"], 2, "Bad URL ws://127.0.0.1:99999/ws: "),
    ]
    for args, code, expected in cases:
        result = run_ws(*args)
        assert result.returncode == code, (args, result.stderr)
        assert result.stdout == "" and result.stderr.startswith(expected), (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_taken_web_port_stops_start_up(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1000))
        taken.listen()
        result = subprocess.run(
            [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", "127.0.0.1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert f"web port {port + 1000} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_metrics_list_the_longest_queues_up_to_metrics_max_queues(node_factory: Any) -> None:
    node: NodeProcess = node_factory()
    web = node.port + 1000
    # 1,500 queues; the 1,000 whose number is not a multiple of 3 hold two jobs.
    longer = {f"q{i:04d}" for i in range(1500) if i % 3}
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        commands = b"".join(
            f"ADDJOB q{i:04d} x 0\r\n".encode() * (2 if f"q{i:04d}" in longer else 1)
            for i in range(1500)
        )
        s.sendall(commands)
        replies = b""
        while replies.count(b"\r\n") < 2500:
            replies += s.recv(1 << 20)
        # (Lines, not occurrences: an ID's random part may end in "+D".)
        assert sum(line.startswith(b"+D-") for line in replies.split(b"\r\n")) == 2500

    def scrape() -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", web), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(1 << 20):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        return {f.name: f for f in text_string_to_metric_families(body.decode())}

    families = scrape()
    for family in (
        "disque_queue_length",
        "disque_queue_jobs_in",
        "disque_queue_jobs_out",
        "disque_queue_import_rate",
        "disque_queue_blocked_clients",
    ):
        samples = [s for s in families[family].samples if not s.name.endswith("_created")]
        assert len(samples) == 1000, family
        assert {s.labels["queue"] for s in samples} == longer, family
    assert families["disque_queues"].samples[0].value == 1500
    assert families["disque_metrics_queues_omitted"].samples[0].value == 500
    assert families["disque_metrics_queues_omitted_jobs"].samples[0].value == 500
    assert {s.value for s in families["disque_queue_length"].samples} == {2}

    r = redis.Redis(port=node.port, socket_timeout=10)
    r.config_set("metrics-max-queues", 0)
    families = scrape()
    assert families["disque_queue_length"].samples == []
    assert families["disque_metrics_queues_omitted"].samples[0].value == 1500
    assert families["disque_metrics_queues_omitted_jobs"].samples[0].value == 2500
    r.config_set("metrics-max-queues", 5000)
    families = scrape()
    assert len(families["disque_queue_length"].samples) == 1500
    assert families["disque_metrics_queues_omitted"].samples[0].value == 0
    assert families["disque_metrics_queues_omitted_jobs"].samples[0].value == 0
