"""A node restarted with a nodes.conf knows its cluster before any bus
event: what the core remembers and refuses depends on that view."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from disque_trio.server.node import NodeServer

from ..helpers import make_config, virtual_env
from .core_support import run

PEER = "77e1a0b2" + "b3" * 16


def test_a_restarted_node_counts_its_peers_before_hearing_from_them(tmp_path: Path) -> None:
    """Simulator seed 169392: a node restarted with a job in its AOF whose
    TTL ran out at start-up (its wall clock stepped 28 s ahead) expired it
    before any bus event, while it still counted itself a cluster of one:
    it kept no note of the expiry, and took a late copy of the job from a
    peer's YOURJOBS. The view comes from nodes.conf at once."""
    conf = str(tmp_path / "nodes.conf")

    async def main() -> None:
        first = NodeServer(
            make_config(cluster_config_file=conf), virtual_env(), persist_cluster=True
        )
        assert first.node.cluster.add(PEER, "127.0.0.1", 7712, 17712) is not None
        first.save_cluster_config(force=True)

        again = NodeServer(
            make_config(cluster_config_file=conf), virtual_env(), persist_cluster=True
        )
        node = again.node
        assert node.node_id == first.node.node_id
        assert (node.cluster_size, node.reachable_peers) == (2, 1)
        job_id = str(run(node, "ADDJOB", "q", "body", 0, "TTL", 5, "ASYNC"))
        node.expire(node.jobs[job_id])
        assert job_id in node.deleted_expired  # a late copy of it is refused

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_new_node_has_its_identity_on_disk_before_it_serves(tmp_path: Path) -> None:
    """Simulator seed 564200: a new node killed before its first cron tick
    (which wrote nodes.conf) came back with a fresh ID, and the jobs its
    AOF held listed the old one as a holder: acked, they could never be
    collected. nodes.conf is written before the first client is served."""
    conf = tmp_path / "nodes.conf"

    async def main() -> None:
        server = NodeServer(
            make_config(cluster_config_file=str(conf)), virtual_env(), persist_cluster=True
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, [])
            # No time has passed (the mock clock does not move by itself):
            # no cron tick has run.
            assert trio.current_time() == 0
            assert conf.exists()
            assert server.node.node_id in conf.read_text()
            server.shutdown()
            nursery.cancel_scope.cancel()
        again = NodeServer(
            make_config(cluster_config_file=str(conf)), virtual_env(), persist_cluster=True
        )
        assert again.node.node_id == server.node.node_id

    trio.run(main, clock=trio.testing.MockClock())
