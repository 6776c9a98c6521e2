"""Several whole nodes in one trio.run over in-memory streams (autojump
clock): the node-to-node rules of core/clusterjobs.py, fast and deterministic."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio
import trio.testing

from disque_trio.protocol.replies import NULL_ARRAY, ReplyError, Status

from ..helpers import MemoryNode, memory_cluster


def holders(nodes: list[MemoryNode], job_id: str) -> dict[int, str]:
    """node index -> state label, for the nodes that hold the job."""
    out = {}
    for i, n in enumerate(nodes):
        job = n.server.node.jobs.get(job_id)
        if job is not None:
            out[i] = job.state.label
    return out


async def eventually(predicate: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_sync_replication_reaches_three_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_cluster(4) as nodes:
        c = await nodes[0].client()
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 3)
        assert isinstance(job_id, Status), job_id
        states = holders(nodes, job_id)
        assert len(states) == 3 and states[0] == "queued"
        assert sorted(states.values()) == ["active", "active", "queued"]
        show = await c.call("SHOW", job_id)
        delivered = show[show.index(b"nodes-delivered") + 1]
        assert len(delivered) == 3


async def test_async_replication_returns_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        job_id = await c.call("ADDJOB", "q", "body", 0, "REPLICATE", 3, "ASYNC")
        assert holders(nodes, job_id) == {0: "queued"}
        await eventually(lambda: len(holders(nodes, job_id)) == 3)


async def test_not_enough_reachable_nodes_is_norepl(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        reply = await c.call("ADDJOB", "q", "body", 0, "REPLICATE", 4)
        assert isinstance(reply, ReplyError) and reply.code == "NOREPL"


async def test_ack_is_collected_on_every_holder(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 3)
        got = await c.call("GETJOB", "FROM", "q")
        assert got[0][1] == job_id.encode()
        assert await c.call("ACKJOB", job_id) == 1
        await eventually(lambda: holders(nodes, job_id) == {})


async def test_ack_on_a_node_that_never_saw_the_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_cluster(4) as nodes:
        a, outsider = await nodes[0].client(), await nodes[3].client()
        job_id = await a.call("ADDJOB", "q", "body", 5000, "REPLICATE", 2)
        missing = [i for i in range(4) if i not in holders(nodes, job_id)]
        outsider = await nodes[missing[0]].client()
        # A dummy ack spreads the ack to the holders, then everything goes.
        assert await outsider.call("ACKJOB", job_id) == 0
        await eventually(lambda: holders(nodes, job_id) == {})


async def test_fastack_deletes_everywhere(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 3)
        assert await c.call("FASTACK", job_id) == 1
        await eventually(lambda: holders(nodes, job_id) == {})


async def test_unacked_job_is_requeued_by_one_node(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 3)
        await c.call("GETJOB", "FROM", "q")  # delivered, never acked
        await eventually(lambda: "queued" in holders(nodes, job_id).values())
        await trio.sleep(1)
        queued = [i for i, s in holders(nodes, job_id).items() if s == "queued"]
        assert len(queued) == 1  # WILLQUEUE / QUEUED kept the others out


async def test_federation_feeds_a_blocked_consumer(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        consumer, producer = await nodes[1].client(), await nodes[0].client()
        await consumer.send("GETJOB", "TIMEOUT", 20_000, "FROM", "fed")
        await trio.sleep(0.5)
        job_id = await producer.call("ADDJOB", "fed", "far away", 0, "REPLICATE", 1)
        reply = await consumer.read()
        assert reply is not NULL_ARRAY and reply[0][1] == job_id.encode()
        stat = await consumer.call("QSTAT", "fed")
        import_from = stat[stat.index(b"import-from") + 1]
        assert import_from == [nodes[0].server.node.node_id.encode()]


async def test_pause_bcast_reaches_every_node(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        assert await c.call("PAUSE", "pq", "in", "bcast") == Status("in")
        await trio.sleep(0.5)
        for n in nodes:
            assert (await (await n.client()).call("PAUSE", "pq", "state")) == Status("in")


async def test_leaving_node_replicates_externally(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        assert await c.call("CLUSTER", "LEAVING", "yes") == Status("OK")
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 2)
        assert isinstance(job_id, Status), job_id
        await eventually(lambda: "queued" in holders(nodes, job_id).values())
        assert 0 not in holders(nodes, job_id) and len(holders(nodes, job_id)) == 2
        blocked = await c.call("GETJOB", "FROM", "empty")
        assert isinstance(blocked, ReplyError) and blocked.code == "LEAVING"


def _held_by(nodes: list[MemoryNode], job_id: str, count: int) -> bool:
    return len(holders(nodes, job_id)) == count


def _queued_somewhere(nodes: list[MemoryNode], job_id: str) -> bool:
    return "queued" in holders(nodes, job_id).values()


async def test_leaving_node_async_job_reaches_other_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ADDJOB ASYNC on a leaving node keeps no copy: its REPLJOBs must still
    go out (they were dropped as stale, the job lost; simulator seed 3)."""
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        assert await c.call("CLUSTER", "LEAVING", "yes") == Status("OK")
        for copies in (1, 2):
            job_id = await c.call("ADDJOB", "q", "body", 0, "REPLICATE", copies, "ASYNC")
            assert isinstance(job_id, Status), job_id
            await eventually(partial(_held_by, nodes, job_id, copies), 5)
            assert 0 not in holders(nodes, job_id)
            # The OK comes with the ENQUEUE to one holder at once; that
            # holder queues it when the frame arrives.
            await eventually(partial(_queued_somewhere, nodes, job_id), 5)
            assert 0 not in holders(nodes, job_id)


async def test_leaving_node_async_job_without_links_is_norepl(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Reachable peers but no bus link up to any: an ASYNC job of a leaving
    node could go nowhere. It waits for a copy like a synchronous one and is
    refused at its timeout, instead of answered OK and lost (simulator seeds
    17 and 165)."""
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        assert await c.call("CLUSTER", "LEAVING", "yes") == Status("OK")
        for peer in nodes[0].server.node.cluster.others():
            peer.link_up = False
        with trio.fail_after(5):
            reply = await c.call("ADDJOB", "q", "body", 100, "REPLICATE", 1, "ASYNC")
        assert isinstance(reply, ReplyError) and reply.code == "NOREPL", reply
        assert not any(n.server.node.jobs for n in nodes)


async def test_memory_pressure_means_external_replication(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_cluster(3) as nodes:
        c = await nodes[0].client()
        used = nodes[0].server.node.memory_estimate()
        await c.call("CONFIG", "SET", "maxmemory", str(used * 100 // 80))  # level 1
        job_id = await c.call("ADDJOB", "q", "body", 5000, "REPLICATE", 1)
        assert isinstance(job_id, Status), job_id
        await eventually(lambda: "queued" in holders(nodes, job_id).values())
        assert 0 not in holders(nodes, job_id)
        await c.call("CONFIG", "SET", "maxmemory", str(used // 2))  # level 3
        refused = await c.call("ADDJOB", "q", "body", 0)
        assert isinstance(refused, ReplyError) and refused.code == "OOM"
        assert (await c.call("INFO", "memory")).startswith(b"# Memory")


async def test_sync_replication_times_out(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_cluster(3, cluster_node_timeout=60_000) as nodes:
        c = await nodes[0].client()
        net = nodes[0].server.env.net
        for n in nodes[1:]:
            await net.cut(n.server.config.cluster_bus_port())  # type: ignore[attr-defined]
        reply = await c.call("ADDJOB", "q", "body", 2000, "REPLICATE", 3)
        assert isinstance(reply, ReplyError) and reply.code == "NOREPL"
        assert nodes[0].server.node.jobs == {}


async def test_a_client_gone_during_a_blocked_command_is_noticed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The connection's reader sees the disconnect while the executor waits
    (no watcher task per wait): a blocked GETJOB is withdrawn at once and the
    next job goes to a live consumer; a synchronous ADDJOB still waiting for
    its copies is abandoned at once, its copies deleted, nothing left behind
    (its client was never told of the job)."""
    async with memory_cluster(2) as (a, b):
        gone = await a.client()
        await gone.send("GETJOB", "TIMEOUT", 60_000, "FROM", "q")
        await trio.sleep(1)
        assert a.server.node.stats.blocked_clients == 1
        await gone.aclose()
        await trio.sleep(0.001)
        assert a.server.node.stats.blocked_clients == 0
        producer, consumer = await a.client(), await a.client()
        job_id = await producer.call("ADDJOB", "q", "x", 0, "REPLICATE", 1)
        assert (await consumer.call("GETJOB", "NOHANG", "FROM", "q"))[0][1] == job_id.encode()

        # B refuses copies of jobs for a queue paused in input: ADDJOB waits.
        assert await (await b.client()).call("PAUSE", "held", "in") == Status("in")
        held_before = len(a.server.node.jobs)
        waiting = await a.client()
        await waiting.send("ADDJOB", "held", "x", 60_000, "REPLICATE", 2)
        await trio.sleep(1)
        assert len(a.server.node.repl_waiters) == 1
        await waiting.aclose()
        await trio.sleep(0.001)
        assert a.server.node.repl_waiters == {}
        assert len(a.server.node.jobs) == held_before
        assert a.server.node.stats.replication_failures == 1


def _pipeline(*commands: tuple[Any, ...]) -> bytes:
    out = b""
    for args in commands:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        out += b"*%d\r\n" % len(parts)
        out += b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    return out


async def test_pipelined_addjobs_replicate_together_and_reply_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A run of pipelined ADDJOBs does not wait for one job's copies before
    the next starts replicating: B is slow to answer (its queue is paused
    in input, then resumed), yet every ADDJOB of the run was sent to it
    before the first one was answered. Replies keep their order, and the
    GETJOB after the run sees every job of it queued."""
    async with memory_cluster(2) as (a, b):
        assert await (await b.client()).call("PAUSE", "q", "in") == Status("in")
        c = await a.client()
        adds = [("ADDJOB", "q", f"job{i}", 60_000, "REPLICATE", 2) for i in range(5)]
        await c.send_raw(_pipeline(*adds, ("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")))
        await trio.sleep(1)
        # All five wait for their copies at once (one at a time, only the
        # first would be registered).
        assert len(a.server.node.repl_waiters) == 5
        assert await (await b.client()).call("PAUSE", "q", "none") == Status("none")
        ids = [await c.read() for _ in adds]
        got = await c.read()
        assert [a.server.node.jobs[str(i)].body for i in ids] == [
            f"job{i}".encode() for i in range(5)
        ]
        assert sorted(row[1].decode() for row in got) == sorted(ids)


async def test_a_client_gone_during_a_run_of_addjobs_abandons_them_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_cluster(2) as (a, b):
        assert await (await b.client()).call("PAUSE", "q", "in") == Status("in")
        c = await a.client()
        adds = [("ADDJOB", "q", f"job{i}", 60_000, "REPLICATE", 2) for i in range(4)]
        await c.send_raw(_pipeline(*adds))
        await trio.sleep(1)
        assert len(a.server.node.repl_waiters) == 4
        await c.aclose()
        await trio.sleep(0.1)
        assert a.server.node.repl_waiters == {}
        assert a.server.node.jobs == {}
        assert a.server.node.stats.replication_failures == 4
