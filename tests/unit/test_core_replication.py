"""Synchronous replication: what goes on the bus per job."""

from __future__ import annotations

from disque_trio.core import clusterjobs as cj
from disque_trio.core.clusterjobs import REPL_ADD_NODE_MS
from disque_trio.core.node import Node
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import bus
from disque_trio.protocol.replies import Status

from .core_support import NODE_ID, FakeClock, elapse, make_node, run, sent

PEERS = tuple(f"{i:02x}" * 20 for i in (0xB1, 0xC2, 0xD3))


def _cluster(peers: int) -> tuple[Node, FakeClock]:
    node, clock = make_node()
    for i, peer_id in enumerate(PEERS[:peers]):
        peer = node.cluster.add(peer_id, "127.0.0.1", 7712 + i, 17712 + i)
        assert peer is not None
        peer.link_up = True
    node.refresh_cluster_view()
    return node, clock


def _repljobs(node: Node) -> list[tuple[str, bus.ReplJob]]:
    return [(to, m) for to, m in sent(node) if isinstance(m, bus.ReplJob)]


def test_the_first_repljob_carries_every_holder_and_nothing_follows() -> None:
    node, _ = _cluster(2)
    waiter = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3)
    assert isinstance(waiter, Waiter)
    [job_id] = list(node.jobs)
    first = _repljobs(node)
    assert sorted(to for to, _ in first) == sorted(PEERS[:2])
    for _, msg in first:
        assert set(msg.job.nodes_delivered) == {NODE_ID, *PEERS[:2]}
        assert not msg.noreply
    node.effects.clear()
    for peer_id in PEERS[:2]:
        cj.receive(node, peer_id, bus.GotJob(job_id))
    assert waiter.done and waiter.reply == Status(job_id)
    # Every holder knows the whole list already: no second REPLJOB (the
    # original sends none either).
    assert _repljobs(node) == []


def test_a_holder_added_while_waiting_makes_the_final_list_go_to_all() -> None:
    node, clock = _cluster(3)
    waiter = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3)
    assert isinstance(waiter, Waiter)
    [job_id] = list(node.jobs)
    chosen = [to for to, _ in _repljobs(node)]
    assert len(chosen) == 2
    cj.receive(node, chosen[0], bus.GotJob(job_id))  # chosen[1] stays silent
    node.effects.clear()
    elapse(node, clock, REPL_ADD_NODE_MS)  # one more node is asked
    grown = _repljobs(node)
    assert {to for to, _ in grown} == set(PEERS)
    added = next(p for p in PEERS if p not in chosen)
    node.effects.clear()
    cj.receive(node, added, bus.GotJob(job_id))
    assert waiter.done and waiter.reply == Status(job_id)
    final = _repljobs(node)
    assert {to for to, _ in final} == set(PEERS)
    for _, msg in final:
        assert msg.noreply and set(msg.job.nodes_delivered) == {NODE_ID, *PEERS}


def test_silent_holders_get_the_repljob_again_at_growing_intervals() -> None:
    # Every reachable node holds the job already: the REPLJOB goes again to
    # the holders that did not answer after half a second of wait, then
    # after as long as the wait has lasted (up to a second), not every
    # REPL_ADD_NODE_MS: under load the copies come late, and re-sending
    # every 50 ms multiplied the bus traffic.
    node, clock = _cluster(2)
    start = clock.ms
    waiter = run(node, "ADDJOB", "q", "body", 10_000, "REPLICATE", 3)
    assert isinstance(waiter, Waiter)
    [job_id] = list(node.jobs)
    node.effects.clear()
    resent_at: list[int] = []
    for _ in range(4000):
        elapse(node, clock, 1)
        if _repljobs(node):
            assert sorted(to for to, _ in _repljobs(node)) == sorted(PEERS[:2])
            resent_at.append(clock.ms - start)
            node.effects.clear()
    assert resent_at == [500, 1000, 2000, 3000, 4000]
    # A holder that answers late still completes the replication.
    for peer_id in PEERS[:2]:
        cj.receive(node, peer_id, bus.GotJob(job_id))
    assert waiter.done and waiter.reply == Status(job_id)


def test_a_node_that_can_be_added_is_still_tried_every_50_ms() -> None:
    # Three peers, REPLICATE 2: one peer is asked first; while it stays
    # silent, each tick adds one more node, 50 ms apart.
    node, clock = _cluster(3)
    run(node, "ADDJOB", "q", "body", 10_000, "REPLICATE", 2)
    [first] = {to for to, _ in _repljobs(node)}
    node.effects.clear()
    elapse(node, clock, REPL_ADD_NODE_MS)
    assert len({to for to, _ in _repljobs(node)}) == 2
    node.effects.clear()
    elapse(node, clock, REPL_ADD_NODE_MS)
    assert {to for to, _ in _repljobs(node)} == set(PEERS)
    assert first in PEERS
