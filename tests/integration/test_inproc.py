"""A whole node (shell included) in this trio.run, over memory streams.

The autojump clock makes job timers (DELAY, RETRY, TTL, GETJOB TIMEOUT) take
no real time, so these tests exercise the real timer task and the real
client handler quickly.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from disque_trio.core.commands import CORE_COMMANDS
from disque_trio.protocol.replies import NULL_ARRAY, ReplyError, Status
from disque_trio.server.connections import serve_client

from ..helpers import RespClient, memory_node


async def test_ping_and_pipelining(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.send_raw(b"PING\r\n*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n")
        assert await c.read() == Status("PONG")
        assert await c.read() == Status("PONG")
        assert await c.read() == b"hi"


async def test_blocking_getjob_woken_by_addjob_on_another_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_node() as node:
        consumer, producer = await node.client(), await node.client()
        await consumer.send("GETJOB", "FROM", "q1", "q2")
        await trio.sleep(5)
        assert node.server.node.stats.blocked_clients == 1
        job_id = await producer.call("ADDJOB", "q2", "payload", 0)
        assert await consumer.read() == [[b"q2", job_id.encode(), b"payload"]]
        assert node.server.node.stats.blocked_clients == 0


async def test_getjob_timeout_returns_null_array(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        start = trio.current_time()
        assert await c.call("GETJOB", "TIMEOUT", 1500, "FROM", "empty") is NULL_ARRAY
        assert 1.5 <= trio.current_time() - start < 1.6
        # The connection is usable afterwards.
        assert await c.call("QLEN", "empty") == 0


async def test_delay_then_delivery(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.call("ADDJOB", "q", "later", 0, "DELAY", 3)
        assert await c.call("QLEN", "q") == 0
        start = trio.current_time()
        reply = await c.call("GETJOB", "FROM", "q")
        assert reply[0][2] == b"later"
        assert 2.5 <= trio.current_time() - start <= 3.6


async def test_retry_requeues_unacked_job(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        job_id = (await c.call("ADDJOB", "q", "x", 0, "RETRY", 2)).encode()
        first = await c.call("GETJOB", "WITHCOUNTERS", "FROM", "q")
        assert first[0][1] == job_id and first[0][6] == 0
        again = await c.call("GETJOB", "WITHCOUNTERS", "FROM", "q")
        assert again[0][1] == job_id
        assert again[0][6] == 1  # additional-deliveries
        assert await c.call("ACKJOB", job_id) == 1
        assert await c.call("GETJOB", "TIMEOUT", 5000, "FROM", "q") is NULL_ARRAY


async def test_retry_zero_is_delivered_once(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.call("ADDJOB", "q", "once", 0, "RETRY", 0)
        assert (await c.call("GETJOB", "FROM", "q"))[0][2] == b"once"
        assert await c.call("GETJOB", "TIMEOUT", 60_000, "FROM", "q") is NULL_ARRAY


async def test_ttl_expiry_deletes_job(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        job_id = await c.call("ADDJOB", "q", "x", 0, "TTL", 5, "RETRY", 1)
        await trio.sleep(7)
        assert await c.call("SHOW", job_id) is None
        assert await c.call("QLEN", "q") == 0


async def test_nack_wakes_blocked_client(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        a, b = await node.client(), await node.client()
        job_id = await a.call("ADDJOB", "q", "x", 0)
        await a.call("GETJOB", "FROM", "q")
        await b.send("GETJOB", "WITHCOUNTERS", "FROM", "q")
        await trio.sleep(1)
        assert await a.call("NACK", job_id) == 1
        reply = await b.read()
        assert reply[0][1] == job_id.encode() and reply[0][4] == 1  # nacks


async def test_protocol_error_closes_only_that_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_node() as node:
        bad, good = await node.client(), await node.client()
        await bad.send_raw(b"*1\r\n+PING\r\n")
        reply = await bad.read()
        assert isinstance(reply, ReplyError)
        assert reply.message.startswith("Protocol error")
        assert await bad.closed()
        assert await good.call("PING") == Status("PONG")


async def test_disconnect_while_blocked_unregisters_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.send("GETJOB", "FROM", "q")
        await trio.sleep(1)
        assert node.server.node.stats.blocked_clients == 1
        await c.aclose()
        await trio.sleep(1)
        assert node.server.node.stats.blocked_clients == 0
        other = await node.client()
        await other.call("ADDJOB", "q", "x", 0)
        assert await other.call("QLEN", "q") == 1  # not handed to the dead client


async def test_requirepass(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node(requirepass="sesame") as node:
        c = await node.client()
        reply = await c.call("QLEN", "q")
        assert isinstance(reply, ReplyError) and reply.code == "NOAUTH"
        assert isinstance(await c.call("AUTH", "wrong"), ReplyError)
        assert await c.call("AUTH", "sesame") == Status("OK")
        assert await c.call("QLEN", "q") == 0


async def test_hello_3_switches_to_resp3(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        hello = await c.call("HELLO", 3, "SETNAME", "worker")
        assert hello[b"proto"] == 3 and hello[b"server"] == b"disque"
        job_id = await c.call("ADDJOB", "q", "x", 0)
        show = await c.call("SHOW", job_id)
        # Flat like the original even in RESP3: Disque clients pair it up.
        assert show[4:6] == [b"state", b"queued"]
        assert await c.call("GETJOB", "NOHANG", "FROM", "nothing") is None
        assert await c.call("CLIENT", "GETNAME") == b"worker"
        bare = await c.call("HELLO")
        assert bare[0] == 1 and bare[1] == node.server.node.node_id.encode()


class _HookedStream(trio.abc.Stream):
    """The node's end of a connection that runs a hook on its first send."""

    def __init__(self, inner: trio.abc.Stream, hook: Any) -> None:
        self.inner, self.hook = inner, hook

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_job_arriving_while_earlier_replies_are_sent_wakes_the_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_node() as node:
        ours, theirs = trio.testing.memory_stream_pair()
        addjob = CORE_COMMANDS["addjob"].handler

        def another_client_adds_a_job() -> None:
            addjob(node.server.node, [b"ADDJOB", b"q", b"racing", b"0"])

        node.nursery.start_soon(
            serve_client, node.server, _HookedStream(theirs, another_client_adds_a_job)
        )
        c = RespClient(ours)
        start = trio.current_time()
        await c.send_raw(b"PING\r\nGETJOB TIMEOUT 10000 FROM q\r\n")
        assert await c.read() == Status("PONG")
        assert (await c.read())[0][2] == b"racing"
        assert trio.current_time() - start < 1  # not after the 10 s timeout


async def test_error_replies_leave_no_garbage_cycles() -> None:
    """An error reply is an exception the core raised: its traceback (and
    that of the ValueError behind a malformed number) held the frames down
    from the client loop, which held the reply: every client it passed
    through, parser and buffers included, waited for a full collection. A
    fuzzer grew a node's RSS to 1.9 GB that way."""
    import gc

    async with memory_node() as node:
        gc.collect()  # what earlier tests left behind is not this test's
        for _ in range(20):
            c = await node.client()
            for argv in (
                ("ADDJOB", "q", "b", 0, "TTL", "zero"),  # a ValueError behind it
                ("ADDJOB", "q", "b", 0, "RETRY", -1),
                ("GETJOB", "COUNT", 0, "FROM", "q"),
                ("NOSUCHCOMMAND",),
            ):
                assert isinstance(await c.call(*argv), ReplyError)
            await c.aclose()
        await trio.sleep(0.1)
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            kept = {type(o).__name__ for o in gc.garbage}
            assert not kept & {"Client", "HiredisRequestParser", "ReplyError"}, sorted(kept)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
