"""Core fixes found by the real-process chaos test
(tests/integration/test_chaos.py): deliveries answered after the ack."""

from __future__ import annotations

import pytest

from disque_trio.core import clusterjobs as cj
from disque_trio.core.cluster import LEAVING
from disque_trio.core.effects import Send
from disque_trio.core.job import Job, JobState
from disque_trio.core.node import (
    ANSWERED_QUEUED_CRONS,
    CHATTER_GRID_MS,
    WILLQUEUE_ADVANCE_MS,
    Node,
    chatter_slot_end,
)
from disque_trio.core.records import job_data
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import bus
from disque_trio.protocol.replies import Status

from .core_support import (
    OTHER_ID,
    FakeClock,
    add,
    check_invariants,
    elapse,
    make_node,
    run,
    sent,
    tick_at,
)

THIRD_ID = "5a5a5a5a" + "c4" * 16


def _with_two_linked_peers() -> Node:
    node, _ = make_node()
    for peer_id, port in ((OTHER_ID, 7712), (THIRD_ID, 7713)):
        peer = node.cluster.add(peer_id, "127.0.0.1", port, port + 10000)
        assert peer is not None
        peer.link_up = True
    node.refresh_cluster_view()
    return node


def _a_copy_from_other() -> tuple[Node, FakeClock, Job]:
    """A node with two linked peers, holding a copy OTHER_ID replicated to
    it (``_job_added_on``), and its clock."""
    node = _with_two_linked_peers()
    clock = node.clock
    assert isinstance(clock, FakeClock)
    data = job_data(_job_added_on(OTHER_ID, node), node.now_ms())
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    return node, clock, node.jobs[data.id]


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
    node.effects.clear()

    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 3))

    assert adder.done and adder.reply == Status(job_id)
    assert not consumer.done, consumer.reply
    job = node.jobs[job_id]
    assert job.state == JobState.ACKED and run(node, "QLEN", "q") == 0
    # The sender hears the confirmation of the ack; nobody hears that it was
    # queued, and the holders had the whole list in the first REPLJOB.
    kinds = [type(m) for _, m in sent(node)]
    assert bus.Queued not in kinds and bus.Enqueue not in kinds and bus.ReplJob not in kinds
    assert (OTHER_ID, bus.GotAck(job_id, True)) in sent(node)
    check_invariants(node)


@pytest.mark.parametrize("may_have", [2, 0])
def test_setack_ending_an_external_replication_sends_no_enqueue(may_have: int) -> None:
    """The same for a job this node keeps no copy of (leaving, or short of
    memory): once replicated it asks one holder to queue it (ENQUEUE); not
    when the wait ended with an ack. The job is then gone from here, and
    nothing of it stays (simulator seed 158947: the acknowledge that
    followed left it in the acked-job index and the timers, unregistered,
    asking for GOTACKs for ever). SETACK 0 is a holder's answer to our
    REPLJOB for a job it acked and collected."""
    node = _with_two_linked_peers()
    node.cluster.myself.flags |= LEAVING
    node.refresh_cluster_view()
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 2, "RETRY", 2)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))
    node.effects.clear()

    cj.receive(node, OTHER_ID, bus.SetAck(job_id, may_have))

    assert adder.done and adder.reply == Status(job_id)
    assert not any(isinstance(m, bus.Enqueue) for _, m in sent(node))
    assert job_id not in node.jobs and job_id in node.deleted_acked
    assert sent(node) == [(OTHER_ID, bus.GotAck(job_id, False))]  # we hold no copy
    check_invariants(node)


def _an_external_job_on_two_holders(seed: int) -> tuple[Node, FakeClock, Waiter, str]:
    """A leaving node (it keeps no copy) that added a REPLICATE 1 job and,
    its first holder silent for a while, sent it to the second as well."""
    node, clock = make_node(seed)
    for peer_id, port in ((OTHER_ID, 7712), (THIRD_ID, 7713)):
        peer = node.cluster.add(peer_id, "127.0.0.1", port, port + 10000)
        assert peer is not None
        peer.link_up = True
    node.cluster.myself.flags |= LEAVING
    node.refresh_cluster_view()
    clock.ms += 250  # not on a second's edge
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 1, "TTL", 4)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    elapse(node, clock, cj.REPL_ADD_NODE_MS)
    assert set(node.jobs[job_id].nodes_delivered) == {OTHER_ID, THIRD_ID}
    node.effects.clear()
    return node, clock, adder, job_id


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("confirmer", [OTHER_ID, THIRD_ID])
def test_an_external_replication_asks_a_holder_that_has_the_job_to_queue_it(
    seed: int, confirmer: str
) -> None:
    """Simulator seed 166117: the ENQUEUE that hands an externally
    replicated job to one holder went to a node that had been sent a copy
    and never confirmed it (frozen, cut off): it waited 7.7 s for its link,
    and the job was delivered long after its TTL. The holder asked is one
    whose GOTJOB ended the wait, whatever the draw."""
    node, _, adder, job_id = _an_external_job_on_two_holders(seed)

    cj.receive(node, confirmer, bus.GotJob(job_id))

    assert adder.done and adder.reply == Status(job_id)
    assert [(p, m) for p, m in sent(node) if isinstance(m, bus.Enqueue)] == [
        (confirmer, bus.Enqueue(job_id, 0))
    ]
    assert job_id not in node.jobs
    check_invariants(node)


def test_copies_of_a_job_forgotten_here_hold_until_the_end_of_their_second() -> None:
    """Seed 166117 again: the REPLJOB telling the holders of the node added
    late went out after the job was forgotten here, so the shell could not
    bring its TTL up to date when it was written 7.7 s later; the receiver
    kept the job that much past its TTL. Copies sent as an external
    replication ends are valid until the end of the second their TTL was
    read in (Send.valid_ms), like a YOURJOBS; those of a job held here,
    even one waiting for its copies on a node that will keep none, have no
    limit (the shell refreshes their TTL when it writes them)."""
    node, clock, _, job_id = _an_external_job_on_two_holders(0)
    elapse(node, clock, cj.REPL_RESEND_MIN_MS)
    resent = [
        e for e in node.effects if isinstance(e, Send) and isinstance(e.message, bus.ReplJob)
    ]
    assert len(resent) == 2 and all(e.valid_ms == 0 for e in resent), resent
    node.effects.clear()
    clock.ms += 37  # not on a second's edge

    cj.receive(node, OTHER_ID, bus.GotJob(job_id))

    copies = [
        e for e in node.effects if isinstance(e, Send) and isinstance(e.message, bus.ReplJob)
    ]
    assert {e.peer for e in copies} == {OTHER_ID, THIRD_ID}
    assert all(e.valid_ms == 1000 - clock.ms % 1000 for e in copies), copies
    assert 0 < copies[0].valid_ms < 1000

    kept = _with_two_linked_peers()
    run(kept, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "ASYNC")
    copies = [
        e for e in kept.effects if isinstance(e, Send) and isinstance(e.message, bus.ReplJob)
    ]
    assert len(copies) == 2 and all(e.valid_ms == 0 for e in copies)


def test_a_node_that_acked_a_job_says_so_to_whoever_offers_it_a_copy() -> None:
    """Simulator seed 158947: a leaving node replicated an ADDJOB (REPLICATE
    2) to this node and to one that refused it (its queue paused in input),
    keeping no copy itself. This node re-queued its copy at RETRY; it was
    delivered, acked and collected while the origin still waited for its
    second copy, re-sending REPLJOB until its timeout (the client then got
    NOREPL for a job done). A REPLJOB for a job acked and deleted here is
    answered with SETACK 0: the sender acks it (its client gets the ID)."""
    node = _with_two_linked_peers()
    origin_job = _job_added_on(OTHER_ID, node)
    origin_job.nodes_delivered = (node.node_id, THIRD_ID)  # the origin keeps no copy
    data = job_data(origin_job, node.now_ms())
    job_id = data.id
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert run(node, "ACKJOB", job_id) == 1
    cj.receive(node, THIRD_ID, bus.GotAck(job_id, False))  # it never took its copy
    assert job_id not in node.jobs and job_id in node.deleted_acked
    for noreply in (False, True):
        node.effects.clear()
        cj.receive(node, OTHER_ID, bus.ReplJob(data, noreply))
        assert sent(node) == [(OTHER_ID, bus.SetAck(job_id, 0))]
        assert job_id not in node.jobs
    # Deleted without an ack (expired, its ADDJOB failed): refused, silently.
    node.deleted_acked.pop(job_id)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert sent(node) == [] and job_id not in node.jobs
    check_invariants(node)


def test_a_late_willqueue_still_comes_the_whole_advance_before_the_requeue() -> None:
    """DISQUE_CHAOS_SEED=5 DISQUE_CHAOS_FAULTS=stop, 60 s: most deliveries
    answered after the ack came from a node SIGCONTed after a stop. Its
    copy's re-queue time had passed meanwhile, and the first tick sent
    WILLQUEUE and re-queued at once, serving the GETJOB that had been
    waiting since before the stop; the SETACK for it (the job was re-queued
    by another holder, delivered and acked there) was waiting, unread, in
    the bus socket."""
    node, clock, copy = _a_copy_from_other()
    job_id = copy.id
    assert copy.state == JobState.ACTIVE and copy.qtime
    consumer = run(node, "GETJOB", "TIMEOUT", 0, "FROM", "q")
    assert isinstance(consumer, Waiter)
    node.effects.clear()

    tick_at(node, clock, copy.qtime + 3000)  # stopped through the whole advance

    assert [(to, m) for to, m in sent(node) if isinstance(m, bus.WillQueue)] == [
        (OTHER_ID, bus.WillQueue(job_id))
    ]
    assert copy.state == JobState.ACTIVE and not consumer.done
    assert copy.qtime == clock.ms + WILLQUEUE_ADVANCE_MS
    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))
    elapse(node, clock, WILLQUEUE_ADVANCE_MS + 10)
    assert copy.state == JobState.ACKED and not consumer.done
    check_invariants(node)


def test_a_willqueue_sent_in_its_slot_keeps_the_requeue_time_error() -> None:
    """The WILLQUEUE waits for the end of its chatter slot, and a timer can
    run a little after that: neither is lateness. The re-queue keeps its
    own time (the random error that keeps holders apart); moving it to the
    WILLQUEUE's time plus the advance gave every holder whose WILLQUEUE
    shared a slot the same re-queue millisecond, and both queued the job
    (about one job in ten held by two nodes, delivered by one)."""
    for lag in (0, 40, CHATTER_GRID_MS):
        node, clock, copy = _a_copy_from_other()
        qtime = copy.qtime
        node.effects.clear()

        tick_at(node, clock, chatter_slot_end(qtime - WILLQUEUE_ADVANCE_MS) + lag)

        assert [m for _, m in sent(node) if isinstance(m, bus.WillQueue)] == [
            bus.WillQueue(copy.id)
        ]
        assert copy.qtime == qtime and copy.state == JobState.ACTIVE
        tick_at(node, clock, qtime - 1)
        assert copy.state == JobState.ACTIVE
        tick_at(node, clock, qtime)
        assert copy.state == JobState.QUEUED
        check_invariants(node)


def test_without_an_answer_the_late_requeue_happens_after_the_advance() -> None:
    node, clock, copy = _a_copy_from_other()
    consumer = run(node, "GETJOB", "TIMEOUT", 0, "FROM", "q")
    assert isinstance(consumer, Waiter)

    tick_at(node, clock, copy.qtime + 3000)
    assert not consumer.done
    tick_at(node, clock, clock.ms + WILLQUEUE_ADVANCE_MS - 1)
    assert not consumer.done
    tick_at(node, clock, clock.ms + 1)
    assert consumer.done and consumer.reply == [["q", copy.id, b"body"]]
    check_invariants(node)


def _job_added_on(node_id: str, peer: Node, seed: int = 0) -> Job:
    """A job as another node adds it, REPLICATE 2, listing ``peer`` too
    (``seed`` draws its ID)."""
    origin, _ = make_node(seed=seed, node_id=node_id)
    origin.cluster.add(peer.node_id, "127.0.0.1", 7711, 17711)
    origin.refresh_cluster_view()
    job_id = add(origin, "q", "body", "RETRY", 2, "REPLICATE", 1)
    job = origin.jobs[job_id]
    job.nodes_delivered = (node_id, peer.node_id)
    return job


def test_a_requeue_due_long_ago_is_announced_again() -> None:
    """The same run with the fix above: the WILLQUEUE had gone out in time,
    just before the SIGSTOP, and the re-queue came due during it; the first
    tick after SIGCONT re-queued before reading the SETACK and QUEUED the
    other holder had sent meanwhile."""
    node, clock, copy = _a_copy_from_other()
    consumer = run(node, "GETJOB", "TIMEOUT", 0, "FROM", "q")
    assert isinstance(consumer, Waiter)
    due = copy.qtime
    tick_at(node, clock, chatter_slot_end(due - WILLQUEUE_ADVANCE_MS))  # on time
    assert sum(isinstance(m, bus.WillQueue) for _, m in sent(node)) == 1
    node.effects.clear()

    tick_at(node, clock, due + 2000)  # stopped meanwhile

    assert sent(node) == [(OTHER_ID, bus.WillQueue(copy.id))]
    assert copy.state == JobState.ACTIVE and not consumer.done
    cj.receive(node, OTHER_ID, bus.SetAck(copy.id, 2))
    elapse(node, clock, WILLQUEUE_ADVANCE_MS + 10)
    assert copy.state == JobState.ACKED and not consumer.done
    # A timer only a little late (a busy loop, not a stall) re-queues at once.
    other = job_data(_job_added_on(OTHER_ID, node, seed=1), node.now_ms())
    cj.receive(node, OTHER_ID, bus.ReplJob(other, False))
    late = node.jobs[other.id]
    tick_at(node, clock, chatter_slot_end(late.qtime - WILLQUEUE_ADVANCE_MS))
    tick_at(node, clock, late.qtime + WILLQUEUE_ADVANCE_MS // 2)
    assert consumer.done and consumer.reply == [["q", other.id, b"body"]]
    check_invariants(node)


def test_a_repljob_for_another_node_id_is_not_kept() -> None:
    """Simulator seed 198 (issue #16 explorer): REPLJOBs held back by a
    clogged link reached a node after CLUSTER RESET HARD gave it a new ID.
    It kept copies listing only its old ID, which its sender then forgot:
    no DELJOB or GOTACK ever reached it, and an acked copy stayed for good."""
    node = _with_two_linked_peers()
    job = _job_added_on(OTHER_ID, node)
    job.nodes_delivered = (OTHER_ID, THIRD_ID)  # the old ID was THIRD_ID
    cj.receive(node, OTHER_ID, bus.ReplJob(job_data(job, node.now_ms()), False))
    assert job.id not in node.jobs
    assert not any(isinstance(m, bus.GotJob) for _, m in sent(node))
    check_invariants(node)


def test_a_willqueue_that_crossed_the_answer_to_another_is_not_answered_again() -> None:
    """Two holders whose WILLQUEUE timers fell in one chatter slot announce
    the job together; the QUEUED answering the first went to every holder,
    so the second, which crossed it, gets no second answer (it was a third
    of the QUEUED messages of jobs held with RETRY 5, no consumer). A
    holder this node did not know of yet is answered, and so is a
    WILLQUEUE once the window (ANSWERED_QUEUED_CRONS) has passed."""
    node = _with_two_linked_peers()
    fourth = "6b6b6b6b" + "d5" * 16
    peer = node.cluster.add(fourth, "127.0.0.1", 7714, 17714)
    assert peer is not None
    peer.link_up = True
    node.refresh_cluster_view()
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 5)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    job = node.jobs[job_id]
    holders = [h for h in job.nodes_delivered if h != node.node_id]
    for holder in holders:
        cj.receive(node, holder, bus.GotJob(job_id))
    assert adder.done and job.state == JobState.QUEUED
    first, second = holders

    def answers() -> list[str]:
        to = sorted(t for t, m in sent(node) if m == bus.Queued(job_id, 0))
        node.effects.clear()
        return to

    node.effects.clear()
    cj.receive(node, first, bus.WillQueue(job_id))
    assert answers() == sorted(holders)
    cj.receive(node, second, bus.WillQueue(job_id))
    assert answers() == []
    stranger = next(n for n in (OTHER_ID, THIRD_ID, fourth) if n not in holders)
    cj.receive(node, stranger, bus.WillQueue(job_id))  # a holder learned now
    assert answers() == sorted([*holders, stranger])
    for _ in range(2 * ANSWERED_QUEUED_CRONS):
        node.cron()
    cj.receive(node, second, bus.WillQueue(job_id))
    assert answers() == sorted([*holders, stranger])
    check_invariants(node)


def test_a_late_copy_of_a_job_refused_norepl_does_not_come_back() -> None:
    """Simulator seed 482158: an ADDJOB REPLICATE 3 timed out (-NOREPL) and
    its copies were told DELJOB; a holder had queued its copy at RETRY and
    given it to the creator by YOURJOBS just before, and that YOURJOBS,
    0.3 s late, brought the job back: delivered to a consumer, then acked
    by the holders' DELJOB tombstones (WAITJOB answered "acked", nobody
    had acked it). The creator now refuses it and tells the sender DELJOB,
    as it does to a holder's QUEUED for it."""
    node = _with_two_linked_peers()
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 1)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))
    copy = job_data(node.jobs[job_id], node.now_ms())
    reply = node.cancel_wait(adder)  # the ADDJOB's timeout
    assert str(reply).startswith("NOREPL")
    assert job_id not in node.jobs and job_id not in node.deleted_acked
    node.effects.clear()

    cj.receive(node, OTHER_ID, bus.YourJobs((copy,)))  # written before our DELJOB came
    assert job_id not in node.jobs
    assert sent(node) == [(OTHER_ID, bus.DelJob(job_id))]
    node.effects.clear()
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert sent(node) == [(THIRD_ID, bus.DelJob(job_id))]
    reply = run(node, "WAITJOB", job_id, "TIMEOUT", 1)
    assert reply == ["gone"]
    check_invariants(node)


def _linked_at(node: Node, version: int) -> None:
    for peer in node.cluster.others():
        peer.bus_version = version


def test_a_norepl_tells_the_copies_refused_and_they_do_not_read_acked() -> None:
    """Simulator seed 490768: an ADDJOB REPLICATE 4 timed out (-NOREPL) and
    its copies were told DELJOB; one holder missed it (a one-way partition),
    queued its copy at RETRY and announced it (WILLQUEUE). The holder that
    had read DELJOB remembered the job as acked: it answered SETACK, and a
    WAITJOB there answered "acked" for a job no client had acked. Nodes of
    bus protocol 6 are told REFUSED: the copy goes, the job reads "gone",
    and a holder that missed it is told REFUSED in turn."""
    node = _with_two_linked_peers()
    _linked_at(node, bus.PROTOCOL_VERSION)
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 1)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))
    node.effects.clear()
    assert str(node.cancel_wait(adder)).startswith("NOREPL")
    told = sent(node)
    assert sorted(to for to, _ in told) == sorted([OTHER_ID, THIRD_ID])
    assert {m for _, m in told} == {bus.Refused(job_id)}

    # A holder told so.
    holder, _ = make_node(node_id=OTHER_ID)
    for peer_id, port in ((node.node_id, 7711), (THIRD_ID, 7713)):
        peer = holder.cluster.add(peer_id, "127.0.0.1", port, port + 10000)
        assert peer is not None
        peer.link_up = True
        peer.bus_version = bus.PROTOCOL_VERSION
    holder.refresh_cluster_view()
    copy = job_data(_job_added_on(node.node_id, holder), holder.now_ms())
    cj.receive(holder, node.node_id, bus.ReplJob(copy, False))
    assert copy.id in holder.jobs
    cj.receive(holder, node.node_id, bus.Refused(copy.id))
    assert copy.id not in holder.jobs and copy.id not in holder.deleted_acked
    assert run(holder, "WAITJOB", copy.id, "TIMEOUT", 1) == ["gone"]
    holder.effects.clear()
    cj.receive(holder, THIRD_ID, bus.WillQueue(copy.id))  # it missed the message
    assert sent(holder) == [(THIRD_ID, bus.Refused(copy.id))]
    holder.effects.clear()
    cj.receive(holder, THIRD_ID, bus.YourJobs((copy,)))  # nor does a late copy live
    assert copy.id not in holder.jobs
    check_invariants(holder)


def test_a_node_of_an_older_release_is_still_told_deljob() -> None:
    """A holder whose link speaks bus protocol 5 (a rolling upgrade under
    way) has no REFUSED: it is told DELJOB, as before."""
    node = _with_two_linked_peers()
    _linked_at(node, bus.SINCE_VERSION[bus.Refused] - 1)
    adder = run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 1)
    assert isinstance(adder, Waiter)
    [job_id] = list(node.jobs)
    node.effects.clear()
    assert str(node.cancel_wait(adder)).startswith("NOREPL")
    assert {m for _, m in sent(node)} == {bus.DelJob(job_id)}
