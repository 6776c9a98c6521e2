"""Core fixes found by the real-process chaos test
(tests/integration/test_chaos.py): deliveries answered after the ack."""

from __future__ import annotations

from disque_trio.core import clusterjobs as cj
from disque_trio.core.cluster import LEAVING
from disque_trio.core.job import JobState
from disque_trio.core.node import Node
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import bus
from disque_trio.protocol.replies import Status

from .core_support import OTHER_ID, check_invariants, make_node, run

THIRD_ID = "5a5a5a5a" + "c4" * 16


def _with_two_linked_peers() -> Node:
    node, _ = make_node()
    for peer_id, port in ((OTHER_ID, 7712), (THIRD_ID, 7713)):
        peer = node.cluster.add(peer_id, "127.0.0.1", port, port + 10000)
        assert peer is not None
        peer.link_up = True
    node.refresh_cluster_view()
    return node


def test_setack_for_a_job_waiting_for_replication_is_not_delivered_here() -> None:
    """DISQUE_CHAOS_SEED=5 DISQUE_CHAOS_FAULTS=stop, 60 s: an ADDJOB with
    REPLICATE 3 waited for the copy of a stopped node; the replica that had
    confirmed re-queued its copy at its retry time, delivered it, and the
    consumer acked it there. Its SETACK reached the origin, which finished
    the replication (the ADDJOB client gets its ID, rightly), queued the job
    and handed it to a blocked GETJOB, and only then acknowledged it: a
    delivery by the very node that knew of the ack."""
    node = _with_two_linked_peers()
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 2)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))  # THIRD_ID never answers
    consumer = run(node, "GETJOB", "TIMEOUT", 5000, "FROM", "q")
    assert isinstance(consumer, Waiter)
    node.outbox.clear()

    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 3))

    assert adder.done and adder.reply == Status(job_id)
    assert not consumer.done, consumer.reply
    job = node.jobs[job_id]
    assert job.state == JobState.ACKED and run(node, "QLEN", "q") == 0
    # The holders hear the final list, the sender the confirmation of the
    # ack; nobody hears that it was queued.
    sent = [type(m) for _, m in node.outbox]
    assert bus.Queued not in sent and bus.Enqueue not in sent
    assert (THIRD_ID, bus.ReplJob(cj.job_data(job, node.now_ms()), True)) in node.outbox
    assert (OTHER_ID, bus.GotAck(job_id, True)) in node.outbox
    check_invariants(node)


def test_setack_ending_an_external_replication_sends_no_enqueue() -> None:
    """The same for a job this node keeps no copy of (leaving, or short of
    memory): once replicated it asks one holder to queue it (ENQUEUE); not
    when the wait ended with an ack."""
    node = _with_two_linked_peers()
    node.cluster.myself.flags |= LEAVING
    node.refresh_cluster_view()
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 2, "RETRY", 2)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))
    node.outbox.clear()

    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))

    assert adder.done and adder.reply == Status(job_id)
    assert not any(isinstance(m, bus.Enqueue) for _, m in node.outbox)
    assert job_id not in node.jobs
