"""CLUSTER RESET empties the AOF like DEBUG FLUSHALL (simulator seed 3051:
after a CLUSTER RESET HARD and a crash, the node loaded its old jobs back
under its new ID, an acked one listing the old ID as a holder: its GC
waited for ever on a node that no longer exists, the others collected it)."""

from __future__ import annotations

from disque_trio.protocol.replies import Status

from ..helpers import memory_node


async def test_cluster_reset_empties_the_aof() -> None:
    for mode in ("HARD", "SOFT"):
        async with memory_node() as node:
            flushed: list[int] = []
            node.server.aof.flushed = lambda f=flushed: f.append(1)  # type: ignore[method-assign]
            c = await node.client()
            await c.call("ADDJOB", "q", "x", 0)
            assert await c.call("CLUSTER", "RESET", mode) == Status("OK")
            assert len(flushed) == 1
            assert not node.server.node.jobs
