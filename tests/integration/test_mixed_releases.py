"""A node playing an older release (``NodeServer(bus_version=...)``, as the
simulator's mixed clusters do) in a cluster of this release: the links speak
the lower version, the version-gated messages are not sent on them, and the
jobs still move between the nodes."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from disque_trio.protocol import bus
from disque_trio.protocol.replies import Status

from ..helpers import memory_cluster
from .test_cluster_inproc import eventually, holders


def link_versions(nodes: list, i: int) -> dict[int, int]:
    """node index -> the bus version node i's link to it speaks."""
    table = nodes[i].server.node.cluster
    by_id = {n.server.node.node_id: j for j, n in enumerate(nodes)}
    return {
        by_id[p.node_id]: p.bus_version for p in table.nodes.values() if p.node_id != table.node_id
    }


@pytest.mark.parametrize("old", [3, 5, 7])
async def test_links_to_an_older_release_speak_its_version(
    autojump_clock: trio.testing.MockClock, old: int
) -> None:
    async with memory_cluster(3, bus_versions={2: old}) as nodes:
        await eventually(
            lambda: (
                link_versions(nodes, 0)[2] == old and link_versions(nodes, 2) == {0: old, 1: old}
            )
        )
        assert link_versions(nodes, 0)[1] == bus.PROTOCOL_VERSION
        # Its heartbeats tell no incarnation before protocol 8 (and no
        # version before 4): the others read 0.
        peer = nodes[0].server.node.cluster.nodes[nodes[2].server.node.node_id]
        assert peer.incarnation == 0
        # A job added on the old node, and one on a new node, reach the other
        # release and are delivered there.
        c2 = await nodes[2].client()
        c0 = await nodes[0].client()
        a = await c2.call("ADDJOB", "q", "from old", 0, "REPLICATE", 3, "RETRY", 60)
        b = await c0.call("ADDJOB", "q2", "from new", 0, "REPLICATE", 3, "RETRY", 60)
        assert isinstance(a, Status) and isinstance(b, Status)
        assert len(holders(nodes, a)) == 3 and len(holders(nodes, b)) == 3
        c1 = await nodes[1].client()
        got = await c1.call("GETJOB", "TIMEOUT", 5000, "FROM", "q")
        assert got[0][2] == b"from old"
        assert await c1.call("ACKJOB", a) == 1
        await eventually(lambda: not holders(nodes, a))
        got = await c2.call("GETJOB", "TIMEOUT", 5000, "FROM", "q2")
        assert got[0][2] == b"from new"
        assert await c2.call("ACKJOB", b) == 1
        await eventually(lambda: not holders(nodes, b))


async def test_an_old_node_is_met_by_offering_less(autojump_clock: trio.testing.MockClock) -> None:
    """The release of protocol 3 closes on an offer it does not know: CLUSTER
    MEET and the links offer one version less until it answers."""
    async with memory_cluster(2, bus_versions={1: bus.MIN_PROTOCOL_VERSION}) as nodes:
        await eventually(lambda: link_versions(nodes, 0) == {1: bus.MIN_PROTOCOL_VERSION})
        assert link_versions(nodes, 1) == {0: bus.MIN_PROTOCOL_VERSION}


def test_a_version_this_release_does_not_speak_is_refused() -> None:
    from disque_trio.server.node import NodeServer

    from ..helpers import make_config, virtual_env

    with pytest.raises(ValueError, match="not spoken"):
        NodeServer(make_config(port=7711), virtual_env(1), persist_cluster=False, bus_version=2)
