"""Bus.sync_links: a link task that ended is replaced (server/peers.py)."""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from disque_trio.core.cluster import HANDSHAKE, ClusterTable
from disque_trio.server.peers import Bus, PeerLink

ME = "a" * 40
PEER = "b" * 40


def test_a_link_whose_task_ended_is_started_again() -> None:
    """A gossiped node the cron dropped (its link task ends) and the next
    gossip named again before a sync must get a new link task, or it stays
    without a link for ever (simulator seed 645595158)."""

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(Any, table, lambda sender, msg: None)  # type: ignore[arg-type]
        started: list[PeerLink] = []

        async def run_link(link: PeerLink) -> None:
            started.append(link)  # the node is gone: the task ends at once

        bus._run_link = run_link  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            bus.sync_links()
            await trio.testing.wait_all_tasks_blocked()
            assert len(started) == 1 and started[0].ended
            bus.sync_links()  # the node is in the table again
            await trio.testing.wait_all_tasks_blocked()
            assert len(started) == 2 and bus.links[PEER] is started[1]

    trio.run(main)


def test_a_node_back_in_the_table_while_its_link_is_up_is_a_member_at_once() -> None:
    """A gossiped node the cron dropped (no handshake in time) while our link
    to it stayed connected, then named again by gossip: its new entry
    (HANDSHAKE) must take the link's word, not wait for a handshake that
    already happened and be dropped again every 5 s (simulator seed
    20000951: n2 never counted n0 as a member after heal)."""

    class Clock:
        def wall_ms(self) -> int:
            return 1_700_000_000_000

    class Host:
        env = type("Env", (), {"clock": Clock()})()

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        bus = Bus(Host(), table, lambda sender, msg: None)  # type: ignore[arg-type]
        connected = trio.Event()

        async def run_link(link: PeerLink) -> None:
            link.up = True  # connected and past the handshake, for good
            connected.set()
            await trio.sleep_forever()

        bus._run_link = run_link  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            table.add(PEER, "127.0.0.1", 7712, 17712)
            table.nodes[PEER].flags |= HANDSHAKE  # as gossip adds it
            bus.sync_links()
            await connected.wait()
            assert table.nodes[PEER].flags & HANDSHAKE  # nobody said so yet
            bus.sync_links()
            assert not table.nodes[PEER].flags & HANDSHAKE and table.size == 2
            nursery.cancel_scope.cancel()

    trio.run(main)
