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

from ..helpers import memory_cluster
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


async def test_jobs_not_copies_and_jobs_waiting_to_come_back() -> None:
    """In one process (the bus over memory streams), three nodes: the
    totals count jobs beside copies; jobs handed to a consumer, or given
    back with a DELAY, are shown waiting to be queued again, once each,
    with the time the first comes back."""
    async with web_cluster(3) as nodes, nodes[0].ws() as a, nodes[1].ws() as b:
        for port in (7712, 7713):
            assert await a.result("CLUSTER", "MEET", "127.0.0.1", port) == "OK"
        ids = [n.server.node.node_id for n in nodes]
        await a.send(subscribe=["cluster"])
        await a.recv()
        await cluster_event(a, lambda d: len(d["nodes"]) == 3 and all_counted(d))
        for n in range(2):
            await a.result("ADDJOB", "mail", f"a{n}", 0, "REPLICATE", 2, "RETRY", 60)
        shared = await b.result("ADDJOB", "mail", "b", 0, "REPLICATE", 3, "RETRY", 60)
        for n in range(3):
            await b.result("ADDJOB", "thumbs", f"t{n}", 0, "REPLICATE", 1)
        data = await cluster_event(
            a, lambda d: all_counted(d) and d["totals"]["distinct_jobs"] == 6
        )
        # 2 x 2 copies + 3 + 3 x 1, or more: an ADDJOB whose copy is slow
        # to confirm adds one more node.
        assert data["totals"]["jobs"]["total"] >= 10
        assert sum(n["figures"]["jobs_counted"] for n in data["nodes"]) == 6
        assert data["totals"]["requeue"] is None

        # Node a's consumer takes its two jobs and acks neither: each of
        # their copies waits for the RETRY, each job is counted once.
        got = await a.result("GETJOB", "NOHANG", "COUNT", 5, "FROM", "mail")
        assert len(got) == 2

        def mail(d: Any) -> Any:
            return next((q for q in d["queues"]["rows"] if q["name"] == "mail"), None)

        def waiting(d: Any) -> int:
            return ((mail(d) or {}).get("requeue") or {}).get("jobs", 0)

        # (Figures, lengths and census are each a second old at most.)
        data = await cluster_event(a, lambda d: waiting(d) == 2 and mail(d)["total"] == 1)
        row = mail(data)
        assert sum(row["lengths"].values()) == 1  # b's job, queued (moved, maybe)
        assert 50_000 < row["requeue"]["next_in_ms"] <= 60_500
        assert data["totals"]["distinct_jobs"] == 6

        # b's job (queued on b, or moved to a, whose queue drained and
        # asked for more), delivered and given back with a DELAY of 30 s:
        # queued there when the delay ends, the others stand by. Counted once.
        holder = a if row["lengths"].get(ids[0]) else b
        got = await holder.result("GETJOB", "NOHANG", "FROM", "mail")
        assert got[0][1] == shared
        assert await holder.result("NACK", shared, "DELAY", 30) == 1
        data = await cluster_event(a, lambda d: waiting(d) == 3 and mail(d)["total"] == 0)
        row = mail(data)
        assert 20_000 < row["requeue"]["next_in_ms"] <= 30_500
        assert data["totals"]["requeue"]["jobs"] == 3
        assert data["totals"]["distinct_jobs"] == 6

        # The third node holds copies of "mail" jobs only: its own stats
        # show the ones that wait there to be queued again.
        async with nodes[2].ws() as c:
            await c.send(subscribe=["stats"])
            await c.recv()
            with trio.fail_after(WAIT_S):
                while True:
                    rows = {q["name"]: q for q in (await c.event("stats"))["queues"]}
                    if "mail" in rows and rows["mail"]["requeue"] is not None:
                        break
            assert rows["mail"]["len"] == 0


async def test_a_node_of_protocol_9_sends_no_census() -> None:
    """A node of the release before NODEFIGURES answers NODESTATS: its
    figures show, the cluster's count of jobs is unknown; and it is
    answered NODESTATS, which it understands."""
    async with memory_cluster(2, bus_versions={1: 9}) as nodes:
        c0 = await nodes[0].client()
        await c0.call("ADDJOB", "q", "x", 0, "REPLICATE", 2)
        new, old = (n.server.web.cluster for n in nodes)
        old_id, new_id = (n.server.node.node_id for n in reversed(nodes))
        with trio.fail_after(WAIT_S):
            while old_id not in new.heard or new_id not in old.heard:
                new.ask()
                old.ask()
                await trio.sleep(0.1)
        data = new.event()
        figures = {n["id"]: n["figures"] for n in data["nodes"]}
        assert figures[old_id]["jobs"]["total"] == 1 and figures[old_id]["jobs_counted"] is None
        assert figures[new_id]["jobs_counted"] is not None
        assert data["totals"]["distinct_jobs"] is None
        assert old.heard[new_id].jobs is None  # it was sent NODESTATS
