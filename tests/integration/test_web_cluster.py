"""The cluster view of the web port against real node processes: one node's
WebSocket shows every node's figures, the queues summed across nodes, and a
job's copies, gathered over the cluster bus; a node killed with SIGKILL is
shown failing within the node timeout, and nothing waits for it. The view
needs the serving node's password only, whatever the others' are."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
import trio
import trio_websocket

from disque_trio.client import Client
from disque_trio.server import clustersnap, clusterview

from .conftest import NodeProcess, form_cluster
from .test_web import WsClient, basic, http_request, web_cluster, ws_handshake

pytestmark = pytest.mark.slow

NODE_TIMEOUT_S = 1.0  # form_cluster's cluster-node-timeout
WAIT_S = 10
UNKNOWN_JOB = "D-00000000-" + "0" * 24 + "-0000"  # a valid ID no node holds


@asynccontextmanager
async def ws(node: NodeProcess, **kwargs: Any) -> AsyncIterator[WsClient]:
    url = f"ws://127.0.0.1:{node.port + 1000}/ws"
    async with trio_websocket.open_websocket_url(url, **kwargs) as conn:
        yield WsClient(conn)


async def cluster_event(c: WsClient, check: Callable[[Any], bool], within: float = WAIT_S) -> Any:
    """The first ``cluster`` event that passes ``check``."""
    with trio.fail_after(within):
        while True:
            data = await c.event("cluster")
            if check(data):
                return data


async def find_job(c: WsClient, job_id: str) -> Any:
    request = await c.send(findjob=job_id)
    while True:
        message = await c.recv()
        if message.get("id") == request:
            return message


def rows(data: Any) -> dict[str, Any]:
    return {n["addr"]: n for n in data["nodes"]}


def addr(node: NodeProcess) -> str:
    return f"127.0.0.1:{node.port}"


def all_counted(data: Any) -> bool:
    return all(n["figures"] is not None for n in data["nodes"])


async def test_cluster_view_with_a_node_killed(node_factory: Any) -> None:
    nodes = form_cluster(node_factory, 3)
    ids = []
    for i, node in enumerate(nodes):
        r = redis.Redis(port=node.port, decode_responses=True, socket_timeout=10)
        ids.append(r.execute_command("CLUSTER", "MYID"))
        for n in range(i + 1):  # 1, 2 and 3 jobs queued on the three nodes
            r.execute_command("ADDJOB", "mail", f"m{n}", 0, "REPLICATE", 1)
        if i == 1:
            shared = r.execute_command("ADDJOB", "shared", "x", 0, "REPLICATE", 3, "RETRY", 60)
        r.close()

    async with ws(nodes[0]) as c:
        sub = await c.send(subscribe=["cluster"])
        assert await c.recv() == {"id": sub, "result": "OK"}
        data = await cluster_event(c, all_counted)
        seen = rows(data)
        assert data["nodes"][0]["addr"] == addr(nodes[0])  # itself first
        assert seen[addr(nodes[0])]["myself"] and seen[addr(nodes[0])]["link"] == "self"
        for node, node_id in zip(nodes, ids, strict=True):
            row = seen[addr(node)]
            assert (row["id"], row["state"]) == (node_id, "ok")
            assert row["figures"]["aof"] == {"state": "off", "size": 0}
        mail = next(q for q in data["queues"]["rows"] if q["name"] == "mail")
        assert mail["total"] == 6
        assert mail["lengths"] == {ids[0]: 1, ids[1]: 2, ids[2]: 3}
        assert data["totals"]["with_figures"] == 3

        # A job's copies: queued where it was added, active on the others.
        found = (await find_job(c, shared))["result"]
        copies = {copy["addr"]: copy for copy in found["copies"]}
        assert found["held"] == 3 and copies[addr(nodes[0])]["myself"]
        assert copies[addr(nodes[1])]["state"] == "queued"
        assert copies[addr(nodes[1])]["queue"] == "shared"
        assert {copies[addr(n)]["state"] for n in (nodes[0], nodes[2])} == {"active"}
        assert all(copy["nacks"] == 0 and copy["deliveries"] == 0 for copy in copies.values())
        missing = (await find_job(c, shared[:-4] + "0000"))["result"]
        assert missing["held"] == 0 and len(missing["copies"]) == 3
        assert {copy["status"] for copy in missing["copies"]} == {"not held"}
        assert (await find_job(c, "D-nope"))["error"].startswith("BADID")

        # Kill one: its row turns failing, its figures go, the sums follow.
        nodes[2].kill(signal.SIGKILL)
        killed = time.monotonic()
        data = await cluster_event(
            c, lambda d: rows(d)[addr(nodes[2])]["state"] in ("pfail", "fail")
        )
        noticed = time.monotonic() - killed
        dead = rows(data)[addr(nodes[2])]
        assert dead["figures"] is None and dead["no_figures"] == "unreachable"
        assert dead["link"] == "disconnected"
        # PFAIL needs a ping left unanswered for the node timeout; the
        # events come once a second.
        assert noticed < NODE_TIMEOUT_S + 3, noticed
        mail = next(q for q in data["queues"]["rows"] if q["name"] == "mail")
        assert mail["total"] == 3 and ids[2] not in mail["lengths"]
        assert data["totals"]["failing"] == 1

        # A lookup does not wait for the dead node: its link is down.
        started = time.monotonic()
        found = (await find_job(c, shared))["result"]
        assert time.monotonic() - started < 1.0
        copies = {copy["addr"]: copy for copy in found["copies"]}
        assert copies[addr(nodes[2])]["status"] == "unreachable"
        assert copies[addr(nodes[2])]["node_state"] in ("pfail", "fail")
        assert found["held"] == 2


def _meet(a: NodeProcess, b: NodeProcess, password: str) -> None:
    with Client(f"127.0.0.1:{a.port}", password=password) as c:
        c.call("CLUSTER", "MEET", "127.0.0.1", b.port)


async def test_cluster_view_needs_the_serving_nodes_password_only(node_factory: Any) -> None:
    """Two nodes with different passwords: the page's password is the one
    of the node serving it; the other node's figures come over the bus."""
    a: NodeProcess = node_factory("--requirepass", "alpha")
    b: NodeProcess = node_factory("--requirepass", "bravo")
    _meet(a, b, "alpha")
    async with ws(a) as c:
        for request in ({"subscribe": ["cluster"]}, {"findjob": UNKNOWN_JOB}):
            sent = await c.send(**request)
            assert await c.recv() == {"id": sent, "error": "NOAUTH Authentication required."}
    async with ws(a, extra_headers=basic("alpha")) as c:
        await c.send(subscribe=["cluster"])
        await c.recv()
        data = await cluster_event(c, lambda d: len(d["nodes"]) == 2 and all_counted(d))
        assert {n["addr"] for n in data["nodes"]} == {addr(a), addr(b)}
        assert "bravo" not in json.dumps(data)
    # The other node's password is no key to this one.
    refused = await http_request(a.port + 1000, "GET", "/ws", ws_handshake(*basic("bravo")))
    assert refused[0] == 401


async def test_a_node_of_an_older_release_is_shown_without_figures(
    node_factory: Any, previous_release: str
) -> None:
    """A node of the release before bus protocol 4 (it speaks 3): linked
    and ok, never asked, its row says why it has no figures."""
    old: NodeProcess = node_factory("--cluster-node-timeout", "1000", python=previous_release)
    new: NodeProcess = node_factory("--cluster-node-timeout", "1000")
    # From the old node: a MEET's handshake offers the newest version only,
    # which the old release refuses (test_rolling_upgrade.py does the same).
    with Client(f"127.0.0.1:{old.port}") as c:
        c.call("CLUSTER", "MEET", "127.0.0.1", new.port)
    async with ws(new) as c:
        await c.send(subscribe=["cluster"])
        await c.recv()
        data = await cluster_event(
            c, lambda d: rows(d).get(addr(old), {}).get("link") == "connected"
        )
        row = rows(data)[addr(old)]
        assert (row["state"], row["bus_version"], row["figures"]) == ("ok", 3, None)
        assert row["no_figures"] == "older release"
        found = (await find_job(c, UNKNOWN_JOB))["result"]
        statuses = {copy["addr"]: copy["status"] for copy in found["copies"]}
        assert statuses == {addr(new): "not held", addr(old): "older release"}


async def test_a_node_that_never_answers_holds_up_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """In one process (the bus over memory streams): a node whose link is
    up but which answers nothing is shown so, and a lookup waits for it
    FIND_TIMEOUT_S at most; lookups beyond MAX_LOOKUPS are refused."""
    monkeypatch.setattr(clusterview, "FIND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(clustersnap, "FRESH_MS", 500)
    async with web_cluster(2) as (a, b), a.ws() as c:
        assert await c.result("CLUSTER", "MEET", "127.0.0.1", 7712) == "OK"
        # It hangs: it takes its bus messages and answers none of them.
        monkeypatch.setattr(b.server.web.cluster, "on_message", lambda sender, msg: None)
        await c.send(subscribe=["cluster"])
        await c.recv()
        b_id = b.server.node.node_id
        data = await cluster_event(
            c,
            lambda d: any(n["id"] == b_id and n["no_figures"] == "no answer" for n in d["nodes"]),
        )
        assert next(n for n in data["nodes"] if n["id"] == b_id)["link"] == "connected"
        started = time.monotonic()
        lookups = [await c.send(findjob=UNKNOWN_JOB) for _ in range(clusterview.MAX_LOOKUPS + 4)]
        replies = {}
        while len(replies) < len(lookups):
            message = await c.recv()
            if message.get("id") in lookups:
                replies[message["id"]] = message
        assert time.monotonic() - started < 0.5 + 2
        busy = [r for r in replies.values() if r.get("error", "").startswith("BUSY")]
        assert len(busy) == 4
        answered = [r["result"] for r in replies.values() if "result" in r]
        assert len(answered) == clusterview.MAX_LOOKUPS
        for result in answered:
            statuses = {copy["node"]: copy["status"] for copy in result["copies"]}
            assert statuses[b_id] == "no answer"
        assert not a.server.web.cluster.lookups  # nothing left waiting
