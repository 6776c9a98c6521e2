"""Core fixes found by the simulator (sim/regressions): holder lists kept
right across federation and forgotten nodes."""

from __future__ import annotations

from disque_trio.core import clusterjobs as cj
from disque_trio.core.job import JobState
from disque_trio.protocol import bus

from .core_support import OTHER_ID, add, job, make_node, run

THIRD_ID = "5a5a5a5a" + "c4" * 16


def test_yourjobs_sender_lists_the_receiver_as_a_holder() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    [(to, msg)] = [(t, m) for t, m in node.outbox if isinstance(m, bus.YourJobs)]
    assert to == OTHER_ID
    assert OTHER_ID in job(node, job_id).nodes_delivered
    assert OTHER_ID in msg.jobs[0].nodes_delivered  # the copy knows both holders


def test_yourjobs_receiver_merges_holders_and_announces_queued() -> None:
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 5)
    sender.jobs[job_id].nodes_delivered = (OTHER_ID, THIRD_ID)
    cj.receive(sender, "f" * 40, bus.NeedJobs("q", 1))
    [msg] = [m for _, m in sender.outbox if isinstance(m, bus.YourJobs)]
    node, _ = make_node()
    cj.receive(node, OTHER_ID, msg)
    copy = job(node, job_id)
    assert copy.state == JobState.QUEUED
    assert {OTHER_ID, THIRD_ID} <= set(copy.nodes_delivered)
    # The other holders hear QUEUED (one of them may have queued it too).
    told = {to for to, m in node.outbox if isinstance(m, bus.Queued)}
    assert {OTHER_ID, THIRD_ID} <= told


def test_queued_from_an_unlisted_node_adds_it_to_the_holders() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert THIRD_ID in job(node, job_id).nodes_delivered


def test_forgetting_a_node_collects_the_acks_it_held_up() -> None:
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    job_id = add(node, "q", "body", "RETRY", 5)
    node.jobs[job_id].nodes_delivered = (node.node_id, OTHER_ID)
    assert run(node, "ACKJOB", job_id) == 1
    node.try_gc(node.jobs[job_id])
    assert node.jobs[job_id].state == JobState.ACKED  # waits for OTHER_ID
    assert node.forget_node(OTHER_ID) == 1
    assert job_id not in node.jobs


def test_dummy_ack_goes_once_every_current_node_answered() -> None:
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-05a1"
    assert run(node, "ACKJOB", unknown) == 0
    dummy = node.jobs[unknown]
    assert dummy.state == JobState.ACKED and dummy.is_dummy_ack
    node.try_gc(dummy)
    cj.receive(node, OTHER_ID, bus.GotAck(unknown, False))
    assert unknown in node.jobs  # THIRD_ID has not answered
    node.cluster.forget(THIRD_ID, node.now_ms())
    node.forget_node(THIRD_ID)
    assert unknown not in node.jobs


def test_yourjobs_for_retry0_jobs_announces_nothing() -> None:
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 0)
    cj.receive(sender, "f" * 40, bus.NeedJobs("q", 1))
    [msg] = [m for _, m in sender.outbox if isinstance(m, bus.YourJobs)]
    assert job_id not in sender.jobs  # at most once: moved, not copied
    node, _ = make_node()
    cj.receive(node, OTHER_ID, msg)
    assert job(node, job_id).state == JobState.QUEUED
    assert not [m for _, m in node.outbox if isinstance(m, bus.Queued)]
