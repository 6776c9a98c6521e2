"""Core fixes found by the simulator (sim/regressions): holder lists kept
right across federation and forgotten nodes, late copies of collected jobs."""

from __future__ import annotations

import attrs
import pytest

from disque_trio.core import clusterjobs as cj
from disque_trio.core import node as node_module
from disque_trio.core import records
from disque_trio.core.cluster import HANDSHAKE, LEAVING
from disque_trio.core.effects import Persist, Send
from disque_trio.core.job import JobState
from disque_trio.core.node import Node
from disque_trio.core.records import PENDING_HOLDERS_MS, job_data
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import aof, bus

from .core_support import (
    NODE_ID,
    OTHER_ID,
    FakeClock,
    add,
    check_invariants,
    elapse,
    get,
    job,
    make_node,
    run,
    sent,
    tick_at,
)

THIRD_ID = "5a5a5a5a" + "c4" * 16


def test_yourjobs_sender_lists_the_receiver_as_a_holder() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    [(to, msg)] = [(t, m) for t, m in sent(node) if isinstance(m, bus.YourJobs)]
    assert to == OTHER_ID
    assert OTHER_ID in job(node, job_id).nodes_delivered
    assert OTHER_ID in msg.jobs[0].nodes_delivered  # the copy knows both holders


def test_a_yourjobs_says_how_long_its_ttls_hold() -> None:
    # Seed 112967: a YOURJOBS made at t=12.37 with 1 s of TTL left waited in
    # the outbox for a reconnection and went out at 13.37, in the next
    # second of the wall clock: the receiver gave the job a second more
    # (TTL 9, delivered 10.63 s after ADDJOB). The TTLs it carries (whole
    # seconds left) hold until the end of the second they were read in.
    node, clock = make_node()
    add(node, "q", "body", "RETRY", 5, "TTL", 60)
    clock.ms += 1_000 - clock.ms % 1_000 + 370  # 370 ms into a second
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    [effect] = [e for e in node.effects if isinstance(e, Send)]
    assert isinstance(effect.message, bus.YourJobs) and effect.valid_ms == 630
    # A RETRY 0 job leaves this node with it: the message must go, late or not.
    node, clock = make_node()
    add(node, "q", "body", "RETRY", 0, "REPLICATE", 1, "TTL", 60)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    [effect] = [e for e in node.effects if isinstance(e, Send)]
    assert isinstance(effect.message, bus.YourJobs) and effect.message.jobs[0].retry == 0
    assert effect.valid_ms == 0


def test_retry0_jobs_moved_by_needjobs_go_in_a_yourjobs_of_their_own() -> None:
    """Simulator seed 172906: one YOURJOBS carried RETRY 0 jobs and others;
    the RETRY 0 ones leave this node with it, so it had no limit, and when
    it waited 4.3 s for a link the others rode along with stale TTLs (a TTL
    6 job delivered 8.34 s after its ADDJOB). Each kind now has its own."""
    node, clock = make_node()
    kept = add(node, "q", "kept", "RETRY", 5, "TTL", 60)
    clock.ms += 1
    moved = add(node, "q", "moved", "RETRY", 0, "REPLICATE", 1, "TTL", 60)
    for body in ("later-1", "later-2"):  # a node gives at most half its queue
        clock.ms += 1
        add(node, "q", body, "RETRY", 5, "TTL", 60)
    clock.ms += 1_000 - clock.ms % 1_000 + 250  # 250 ms into a second
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 2))
    answers = [e for e in node.effects if isinstance(e, Send)]
    assert [(e.valid_ms, [d.id for d in e.message.jobs]) for e in answers] == [
        (750, [kept]),
        (0, [moved]),
    ]
    assert kept in node.jobs and moved not in node.jobs
    check_invariants(node)


def test_needjobs_moves_no_job_whose_ttl_ran_out() -> None:
    # Seed 107705: a RETRY 0 job with TTL 7, still queued 7.5 s after its
    # ADDJOB (its TTL timer fires a second after the TTL), went out in a
    # YOURJOBS with a second of TTL left and was delivered there after
    # 8.6 s. A job past its TTL expires instead; the others still move.
    node, clock = _node_with_other()
    old = add(node, "q", "old", "RETRY", 0, "REPLICATE", 1, "TTL", 7)
    clock.ms += 7_500
    young = add(node, "q", "young", "RETRY", 0, "REPLICATE", 1, "TTL", 60)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 2))
    [msg] = [m for to, m in sent(node) if isinstance(m, bus.YourJobs) and to == OTHER_ID]
    assert [data.id for data in msg.jobs] == [young]
    assert old not in node.jobs and young not in node.jobs  # expired; moved
    assert node.stats.expired_jobs == 1
    node.effects.clear()
    only_old = add(node, "q", "older", "RETRY", 0, "REPLICATE", 1, "TTL", 1)
    clock.ms += 1_500
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    assert only_old not in node.jobs
    assert not [m for _, m in sent(node) if isinstance(m, bus.YourJobs)]  # none empty


def test_no_repljob_leaves_for_a_job_whose_ttl_ran_out() -> None:
    # The TTL timer fires a second after the TTL; a REPLJOB sent in that
    # second (the holders learning a holder added late, or one that
    # announced itself) carried a second of TTL and the copy lived on
    # there. Past its TTL, replicate() adds and sends nothing, and a holder
    # learned from its QUEUED is recorded without a REPLJOB.
    node, clock = _node_with_other()
    node.cluster.nodes[OTHER_ID].link_up = True
    job_id = add(node, "q", "body", "RETRY", 5, "REPLICATE", 1, "TTL", 3)
    jb = job(node, job_id)
    jb.nodes_delivered = (NODE_ID, THIRD_ID)
    node.effects.clear()
    assert cj.replicate(node, jb, 1, noreply=True) == 1  # OTHER_ID added
    assert {to for to, m in sent(node) if isinstance(m, bus.ReplJob)} == {OTHER_ID, THIRD_ID}
    clock.ms += 3_500
    node.effects.clear()
    jb.nodes_delivered = (NODE_ID, THIRD_ID)
    assert cj.replicate(node, jb, 1, noreply=True) == 0
    assert jb.nodes_delivered == (NODE_ID, THIRD_ID)
    cj.receive(node, OTHER_ID, bus.Queued(job_id, 0))
    assert OTHER_ID in jb.nodes_delivered
    assert not [m for _, m in sent(node) if isinstance(m, bus.ReplJob)]


def test_a_holder_learned_in_time_hears_the_holder_list() -> None:
    node, _ = _node_with_other()
    job_id = add(node, "q", "body", "RETRY", 5, "REPLICATE", 1, "TTL", 3)
    job(node, job_id).nodes_delivered = (NODE_ID, THIRD_ID)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.Queued(job_id, 0))
    [msg] = [m for to, m in sent(node) if isinstance(m, bus.ReplJob) and to == OTHER_ID]
    assert msg.job.nodes_delivered == (NODE_ID, THIRD_ID, OTHER_ID) and msg.job.ttl >= 1


def _yourjobs_from_other_listing_third() -> tuple[str, bus.YourJobs]:
    """A YOURJOBS from OTHER_ID moving one RETRY 5 job whose holders are
    OTHER_ID and THIRD_ID."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 5)
    sender.jobs[job_id].nodes_delivered = (OTHER_ID, THIRD_ID)
    cj.receive(sender, NODE_ID, bus.NeedJobs("q", 1))  # from the test's node
    [msg] = [m for _, m in sent(sender) if isinstance(m, bus.YourJobs)]
    return job_id, msg


def test_yourjobs_receiver_merges_holders_and_announces_queued() -> None:
    job_id, msg = _yourjobs_from_other_listing_third()
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, msg)
    copy = job(node, job_id)
    assert copy.state == JobState.QUEUED
    assert {OTHER_ID, THIRD_ID} <= set(copy.nodes_delivered)
    # The other holders hear QUEUED (one of them may have queued it too).
    told = {to for to, m in sent(node) if isinstance(m, bus.Queued)}
    assert {OTHER_ID, THIRD_ID} <= told


def _moved_here_with_third_in_its_handshake() -> tuple[Node, str]:
    """A node that took a job by YOURJOBS from OTHER_ID while THIRD_ID, also
    a holder, was known by gossip only (its handshake not through)."""
    job_id, msg = _yourjobs_from_other_listing_third()
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.nodes[THIRD_ID].flags |= HANDSHAKE  # known by gossip only
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, msg)
    return node, job_id


def test_a_holder_still_in_its_handshake_is_added_once_it_answers() -> None:
    # Seeds 20000327, 20001208, 20002084, 20002451: a node that joined
    # lately took a job by YOURJOBS while its handshake with one holder
    # (THIRD, which had queued its own copy) was not through; it dropped
    # THIRD from the list, so the two queued copies never heard of each
    # other. Now THIRD is added, and told QUEUED, once it answers.
    node, job_id = _moved_here_with_third_in_its_handshake()
    copy = job(node, job_id)
    assert copy.state == JobState.QUEUED and THIRD_ID not in copy.nodes_delivered
    assert node.pending_holders == {THIRD_ID: {job_id}}
    sent(node)
    node.cluster.link_changed(THIRD_ID, True, node.now_ms())  # it answered
    node.refresh_cluster_view()
    assert THIRD_ID in copy.nodes_delivered and not node.pending_holders
    assert any(to == THIRD_ID and isinstance(m, bus.Queued) for to, m in sent(node))


@pytest.mark.parametrize("known_at_restart", [False, True])
def test_a_pending_holder_outlives_a_crash_in_the_aof(known_at_restart: bool) -> None:
    """Seed 594353: n0, a replacement, took n1's queued copies by YOURJOBS
    while its handshake with n2, another holder, was not through; n0
    crashed and came back from its AOF listing n1 alone. n0 and n2 each
    kept a queued copy for good, each telling only n1. The record now
    carries the pending holder: reloaded, it is pending again (or listed,
    if nodes.conf knew it by then), and added and told once it answers."""
    job_id, msg = _yourjobs_from_other_listing_third()
    node, _ = make_node()
    node.persisting = True
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.nodes[THIRD_ID].flags |= HANDSHAKE  # known by gossip only
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, msg)
    assert node.pending_holders == {THIRD_ID: {job_id}}
    data = b"".join(e.record for e in node.effects if isinstance(e, Persist))
    [rec] = [r for _, _, (kind, r) in aof.records(data) if kind == aof.LOADJOB]
    assert isinstance(rec, aof.JobRecord)
    assert THIRD_ID not in rec.nodes_delivered and rec.pending == (THIRD_ID,)
    # The crash: a new process with the same ID reads the file.
    again, _ = make_node()
    again.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    again.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    if not known_at_restart:
        again.cluster.nodes[THIRD_ID].flags |= HANDSHAKE
    again.refresh_cluster_view()
    records.replay(again, [(aof.LOADJOB, rec)], False)
    copy = job(again, job_id)
    if known_at_restart:
        assert THIRD_ID in copy.nodes_delivered and not again.pending_holders
        return
    assert THIRD_ID not in copy.nodes_delivered
    assert again.pending_holders == {THIRD_ID: {job_id}}
    again.enqueue(copy)  # its RETRY came: queued again, as in the seed
    again.effects.clear()
    again.cluster.link_changed(THIRD_ID, True, again.now_ms())  # it answered
    again.refresh_cluster_view()
    assert THIRD_ID in copy.nodes_delivered and not again.pending_holders
    assert (THIRD_ID, bus.Queued(job_id, 0)) in sent(again)


@pytest.mark.parametrize("in_handshake", [False, True])
def test_a_copy_whose_holders_grew_by_a_list_is_recorded_again(in_handshake: bool) -> None:
    """A list merged into a copy held here names holders that may never
    speak to us: the copy is recorded again, with them (listed, or pending
    while their handshake is not through), or a crash forgets them."""
    node, job_id, data = _replica_of_a_job_added_on_other()
    node.persisting = True
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    if in_handshake:
        node.cluster.nodes[THIRD_ID].flags |= HANDSHAKE
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    node.effects.clear()
    more = attrs.evolve(data, nodes_delivered=(*data.nodes_delivered, THIRD_ID))
    cj.receive(node, OTHER_ID, bus.ReplJob(more, True))
    [record] = [e.record for e in node.effects if isinstance(e, Persist)]
    [(_, _, (_, rec))] = list(aof.records(record))
    assert isinstance(rec, aof.JobRecord) and rec.id == job_id
    if in_handshake:
        assert THIRD_ID not in rec.nodes_delivered and rec.pending == (THIRD_ID,)
    else:
        assert THIRD_ID in rec.nodes_delivered and rec.pending == ()
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.ReplJob(more, True))  # nothing new
    assert not [e for e in node.effects if isinstance(e, Persist)]


def test_a_holder_that_answers_after_the_ack_holds_up_the_collection() -> None:
    # Seed 492135135: a wiped node's new incarnation took a job by YOURJOBS
    # while its handshakes with three holders were not through, delivered
    # and acked it, then adopted them: an acked job was left out, so it was
    # collected on its one known holder's GOTACK and the three held it on.
    # Now they join the list, hear SETACK, and the collection waits.
    node, job_id = _moved_here_with_third_in_its_handshake()
    assert node.pending_holders == {THIRD_ID: {job_id}}
    [delivered] = get(node, "q")
    assert delivered[1] == job_id
    assert run(node, "ACKJOB", job_id) == 1
    copy = job(node, job_id)
    assert copy.state == JobState.ACKED and THIRD_ID not in copy.nodes_delivered
    sent(node)
    node.effects.clear()
    node.cluster.link_changed(THIRD_ID, True, node.now_ms())  # it answered
    node.refresh_cluster_view()
    assert THIRD_ID in copy.nodes_delivered and not node.pending_holders
    assert any(to == THIRD_ID and isinstance(m, bus.SetAck) for to, m in sent(node))
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, True))
    assert job_id in node.jobs  # THIRD has not confirmed yet
    cj.receive(node, THIRD_ID, bus.GotAck(job_id, True))
    assert job_id not in node.jobs
    assert {to for to, m in sent(node) if isinstance(m, bus.DelJob)} == {OTHER_ID, THIRD_ID}


def test_a_pending_holder_whose_handshake_timed_out_is_dropped() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.nodes[THIRD_ID].flags |= HANDSHAKE
    cj.receive(
        node,
        OTHER_ID,
        bus.ReplJob(attrs.evolve(data, nodes_delivered=(*data.nodes_delivered, THIRD_ID)), False),
    )
    assert node.pending_holders == {THIRD_ID: {job_id}}
    del node.cluster.nodes[THIRD_ID]  # the cron's handshake timeout
    node.refresh_cluster_view()
    # Gossip may bring it back (seed 20004545): it waits a while...
    assert node.pending_holders == {THIRD_ID: {job_id}}
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.link_changed(THIRD_ID, True, node.now_ms())
    node.refresh_cluster_view()
    assert THIRD_ID in job(node, job_id).nodes_delivered and not node.pending_holders


def test_a_pending_holder_that_never_comes_back_is_dropped() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    clock = node.clock
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.nodes[THIRD_ID].flags |= HANDSHAKE
    cj.receive(
        node,
        OTHER_ID,
        bus.ReplJob(attrs.evolve(data, nodes_delivered=(*data.nodes_delivered, THIRD_ID)), False),
    )
    del node.cluster.nodes[THIRD_ID]
    clock.ms += PENDING_HOLDERS_MS + 1  # type: ignore[attr-defined]
    node.refresh_cluster_view()
    assert not node.pending_holders and not node.pending_since
    assert THIRD_ID not in job(node, job_id).nodes_delivered


def test_a_holder_this_node_never_heard_of_waits_as_pending() -> None:
    """Seed 20006028: a REPLJOB listed n1's second identity, which n3 never
    knew (n1 was wiped, came back, and was replaced before its handshake
    with n3). n3 kept the ID as a holder, and its ack waited for ever on a
    node no FORGET could remove ("Unknown node"). Such a holder now waits
    in pending_holders like one in its handshake: added if it answers,
    dropped after PENDING_HOLDERS_MS."""
    node, job_id, data = _replica_of_a_job_added_on_other()
    clock = node.clock
    cj.receive(
        node,
        OTHER_ID,
        bus.ReplJob(attrs.evolve(data, nodes_delivered=(*data.nodes_delivered, THIRD_ID)), False),
    )
    copy = job(node, job_id)
    assert THIRD_ID not in copy.nodes_delivered
    assert node.pending_holders == {THIRD_ID: {job_id}}
    # Acked and confirmed by every known holder: collected, not held up.
    assert run(node, "ACKJOB", job_id) == 1
    for holder in copy.nodes_delivered:
        if holder != node.node_id:
            cj.receive(node, holder, bus.GotAck(job_id, True))
    assert job_id not in node.jobs
    clock.ms += PENDING_HOLDERS_MS + 1  # type: ignore[attr-defined]
    node.refresh_cluster_view()
    assert not node.pending_holders


def _moved_here_by_yourjobs(retry: int, listing_us: bool = False) -> tuple[Node, FakeClock, str]:
    """A job OTHER_ID added (RETRY ``retry``; holding it alone, or listing
    this node too) and moved to this node by YOURJOBS: this node, its clock,
    the job's ID."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", retry)
    if listing_us:
        sender.jobs[job_id].nodes_delivered = (OTHER_ID, NODE_ID)
    cj.receive(sender, NODE_ID, bus.NeedJobs("q", 1))
    [msg] = [m for _, m in sent(sender) if isinstance(m, bus.YourJobs)]
    node, clock = _node_with_other()
    cj.receive(node, OTHER_ID, msg)
    return node, clock, job_id


def test_a_job_moved_by_yourjobs_is_not_counted_as_delivered() -> None:
    """Federation moves a job between queues; as in the original, neither
    node counts an additional delivery, and the QUEUED it announces asks
    nobody to count one."""
    node, _, job_id = _moved_here_by_yourjobs(5)
    assert (job(node, job_id).nacks, job(node, job_id).deliveries) == (0, 0)
    assert [m.flags for _, m in sent(node) if isinstance(m, bus.Queued)] == [0]
    reply = run(node, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert reply == [["q", job_id, b"body", "nacks", 0, "additional-deliveries", 0]]


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
    cj.receive(sender, NODE_ID, bus.NeedJobs("q", 1))  # from the test's node
    [msg] = [m for _, m in sent(sender) if isinstance(m, bus.YourJobs)]
    assert job_id not in sender.jobs  # at most once: moved, not copied
    node, _ = make_node()
    cj.receive(node, OTHER_ID, msg)
    assert job(node, job_id).state == JobState.QUEUED
    assert not [m for _, m in sent(node) if isinstance(m, bus.Queued)]


def _replica_of_a_job_added_on_other() -> tuple[Node, str, bus.JobData]:
    """A node in a cluster with OTHER_ID, and the REPLJOB data of a job
    OTHER_ID added (RETRY 2, both nodes listed as holders)."""
    origin, _ = make_node(node_id=OTHER_ID)
    job_id = add(origin, "q", "body", "RETRY", 2)
    origin.jobs[job_id].nodes_delivered = (OTHER_ID, NODE_ID)
    data = cj.job_data(origin.jobs[job_id], origin.now_ms())
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.refresh_cluster_view()
    return node, job_id, data


def test_a_late_repljob_does_not_resurrect_a_collected_job() -> None:
    # Seed 5018: the first REPLJOB to n0 came late (bus chaos); a re-sent one
    # made the copy, the job was acked and collected (DELJOB), then the first
    # one arrived and made a copy nobody would ack or collect again.
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert job(node, job_id).state == JobState.ACTIVE
    cj.receive(node, THIRD_ID, bus.DelJob(job_id))
    assert job_id not in node.jobs
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert job_id not in node.jobs
    # No GOTJOB either: the sender hears that the job was acked (seed 158947).
    assert sent(node) == [(OTHER_ID, bus.SetAck(job_id, 0))]


def test_a_repljob_overtaken_by_its_deljob_is_refused() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, THIRD_ID, bus.DelJob(job_id))  # before any copy came
    cj.receive(node, OTHER_ID, bus.ReplJob(data, True))
    assert job_id not in node.jobs


def test_a_repljob_after_local_collection_is_refused() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert run(node, "ACKJOB", job_id) == 1
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, True))
    assert job_id not in node.jobs  # collected here, DELJOB sent
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert job_id not in node.jobs


def test_deleted_ids_are_bounded_in_time_and_number(monkeypatch: pytest.MonkeyPatch) -> None:
    node, clock = _node_with_other()
    monkeypatch.setattr(node_module, "DELETED_IDS_MAX", 3)
    for i in range(5):
        node.remember_deleted(f"id{i}")
    assert list(node.deleted_ids) == ["id2", "id3", "id4"]
    tick_at(node, clock, clock.ms + node_module.DELETED_IDS_MS + 1)
    node.remember_deleted("new")
    assert list(node.deleted_ids) == ["new"]
    alone, _ = make_node()
    alone.remember_deleted("x")  # a single node keeps them too: WAITJOB reads them
    assert list(alone.deleted_ids) == ["x"]


def test_deleted_ids_age_on_the_monotonic_clock() -> None:
    """Seed 20001394: a 59.5 s forward step of the wall clock aged a
    tombstone at once; a REPLJOB a one-way partition had held back then
    brought back a job that had expired here."""
    node, clock = _node_with_other()
    node.remember_deleted("expired")
    clock.jump(node_module.DELETED_IDS_MS + 1)  # the wall clock steps ahead
    node.remember_deleted("later")
    assert list(node.deleted_ids) == ["expired", "later"]
    clock.jump(-2 * node_module.DELETED_IDS_MS)  # and back: no effect either
    node.remember_deleted("even-later")
    assert list(node.deleted_ids) == ["expired", "later", "even-later"]
    # Real time still ages them.
    clock.ms += node_module.DELETED_IDS_MS + 1
    node.remember_deleted("last")
    assert list(node.deleted_ids) == ["last"]


def _pair() -> tuple[Node, Node]:
    """Two nodes (NODE_ID, OTHER_ID) that know each other."""
    a, _ = make_node(node_id=NODE_ID)
    b, _ = make_node(node_id=OTHER_ID)
    a.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    b.cluster.add(NODE_ID, "127.0.0.1", 7711, 17711)
    a.refresh_cluster_view()
    b.refresh_cluster_view()
    return a, b


def _pump(nodes: dict[str, Node], drop: type | None = None) -> list[object]:
    """Deliver every message sent until none is left, but those of type
    ``drop`` (lost); returns what was delivered."""
    seen: list[object] = []
    while any(sent(n) for n in nodes.values()):
        for sender in list(nodes):
            out = sent(nodes[sender])
            nodes[sender].effects.clear()
            for to, msg in out:
                if not isinstance(msg, drop or ()) and to in nodes:
                    seen.append(msg)
                    cj.receive(nodes[to], sender, msg)
    return seen


def test_a_holder_that_missed_the_fastack_deljob_is_told_on_willqueue() -> None:
    # Seed 6059: n4 gave its job to n0 (YOURJOBS, both listed), n0 delivered
    # and FASTACKed it, the DELJOB to n4 was lost (bus chaos). n4's copy came
    # back after RETRY: its WILLQUEUE reached n0, which had deleted the job
    # and said nothing, so the acked job was queued and delivered again.
    n0, n4 = _pair()
    nodes = {NODE_ID: n0, OTHER_ID: n4}
    job_id = add(n4, "q", "body", "RETRY", 2, "REPLICATE", 1)
    cj.receive(n4, NODE_ID, bus.NeedJobs("q", 1))
    _pump(nodes)
    assert job(n4, job_id).state == JobState.ACTIVE
    assert get(n0, "q")[0][1] == job_id
    assert run(n0, "FASTACK", job_id) == 1
    _pump(nodes, drop=bus.DelJob)  # the DELJOB is lost
    assert job(n4, job_id).state == JobState.ACTIVE
    n4.effects.send(NODE_ID, bus.WillQueue(job_id))  # its timer, later
    seen = _pump(nodes)
    assert bus.SetAck(job_id, 0) in seen
    assert job_id not in n4.jobs  # acked, confirmed by n0, collected
    assert job_id in n4.deleted_acked


def test_queued_from_a_holder_we_never_listed_gets_setack_after_collection() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert run(node, "ACKJOB", job_id) == 1
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, True))
    assert job_id not in node.jobs  # collected
    node.effects.clear()
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert sent(node) == [(THIRD_ID, bus.SetAck(job_id, 0))]


def test_a_job_deleted_here_without_an_ack_is_not_acked_by_its_tombstone() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert run(node, "DELJOB", job_id) == 1  # a local delete, not an ack
    assert job_id in node.deleted_ids and job_id not in node.deleted_acked
    node.effects.clear()
    cj.receive(node, THIRD_ID, bus.WillQueue(job_id))
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert sent(node) == []


@pytest.mark.parametrize("held", [True, False])
def test_a_bus_deljob_leaves_an_acked_tombstone(held: bool) -> None:
    # Seed 510: a FASTACKed job's DELJOB missed a holder cut off by a
    # partition, and the FASTACKing node crashed. The nodes that took the
    # DELJOB had to tell that holder, when it announced its copy, to ack it.
    # (A DELJOB after a failed ADDJOB is the same message: its copies are
    # meant to go as well.)
    node, job_id, data = _replica_of_a_job_added_on_other()
    if held:
        cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    cj.receive(node, OTHER_ID, bus.DelJob(job_id))
    assert job_id not in node.jobs
    assert job_id in node.deleted_acked
    node.effects.clear()
    cj.receive(node, THIRD_ID, bus.WillQueue(job_id))
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert sent(node) == [(THIRD_ID, bus.SetAck(job_id, 0))] * 2


def test_acked_tombstones_go_with_their_deleted_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    node, _, _ = _replica_of_a_job_added_on_other()
    monkeypatch.setattr(node_module, "DELETED_IDS_MAX", 2)
    node.remember_deleted("a", acked=True)
    node.remember_deleted("b")
    node.remember_deleted("c", acked=True)
    assert list(node.deleted_ids) == ["b", "c"]
    assert list(node.deleted_acked) == ["c"]


def test_wait_repl_job_told_queued_does_not_spin_its_timer() -> None:
    """Seed 8020: a QUEUED for a job still waiting for replication gave it a
    WILLQUEUE timer; once the clock passed qtime - advance, every tick found
    nothing to do and re-armed the same past deadline (a busy loop)."""
    node, clock = _node_with_other()
    run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 2, "RETRY", 1)
    [job_id] = list(node.jobs)
    assert node.jobs[job_id].state == JobState.WAIT_REPL
    cj.receive(node, OTHER_ID, bus.Queued(job_id, 0))
    copy = node.jobs[job_id]
    clock.ms = copy.qtime - 100  # past the WILLQUEUE advance, before qtime
    node.tick()
    due = node.next_deadline()
    assert due is not None and due > node.now_ms()


def test_paused_in_node_still_learns_new_holders_of_a_copy_it_holds() -> None:
    """Seed 8304: a node holding a copy paused its queue in input, then
    ignored the REPLJOB that listed a holder added later; an ack made there
    would never reach that holder."""
    sender, _ = make_node(node_id=OTHER_ID)
    sender.cluster.add(NODE_ID, "127.0.0.1", 7711, 17711)
    sender.refresh_cluster_view()
    job_id = add(sender, "q", "body", "RETRY", 5, "REPLICATE", 1)
    data = cj.job_data(sender.jobs[job_id], sender.now_ms())
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    cj.receive(
        node, OTHER_ID, bus.ReplJob(attrs.evolve(data, nodes_delivered=(OTHER_ID, NODE_ID)), False)
    )
    assert run(node, "PAUSE", "q", "in") is not None
    later = attrs.evolve(data, nodes_delivered=(OTHER_ID, NODE_ID, THIRD_ID))
    cj.receive(node, OTHER_ID, bus.ReplJob(later, True))
    assert THIRD_ID in job(node, job_id).nodes_delivered
    # A new copy is still refused while paused in.
    other_id = add(sender, "q", "other", "RETRY", 5, "REPLICATE", 1)
    fresh = cj.job_data(sender.jobs[other_id], sender.now_ms())
    cj.receive(node, OTHER_ID, bus.ReplJob(fresh, False))
    assert other_id not in node.jobs


def test_ackjob_of_a_job_acked_and_collected_here_makes_no_dummy_ack() -> None:
    # Seed 9010: a client acked on n2 a job n2 had just dropped (SETACK, then
    # DELJOB); the dummy ack waited for a wiped node's old ID, long after
    # the job was collected everywhere else.
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))
    cj.receive(node, OTHER_ID, bus.DelJob(job_id))
    assert job_id in node.deleted_acked
    node.effects.clear()
    assert run(node, "ACKJOB", job_id) == 0
    assert job_id not in node.jobs
    assert not any(isinstance(m, bus.SetAck) for _, m in sent(node))


def test_ackjob_after_collection_makes_a_dummy_ack_once_a_node_joined() -> None:
    # Seed 20000361: a dummy ack went to every node this node knew and was
    # collected; the job's only holder, a node replaced during a partition,
    # joined afterwards and never heard of the ack. The next ACKJOB here
    # must make a dummy ack again, which reaches the newcomer.
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))
    cj.receive(node, OTHER_ID, bus.DelJob(job_id))
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.link_changed(THIRD_ID, True, node.now_ms())
    node.refresh_cluster_view()
    node.effects.clear()
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack
    told = {peer for peer, m in sent(node) if isinstance(m, bus.SetAck)}
    assert THIRD_ID in told


def test_ackjob_after_collection_makes_a_dummy_ack_once_a_holder_relinked() -> None:
    # Seed 123372: n4 acked n0's job (REPLICATE 1) with a dummy ack, n0
    # confirmed (GOTACK) and n4 collected it. n0 then crashed before its
    # ack reached the disk (appendfsync no), reloaded the job from its AOF,
    # and gave it to n1 by YOURJOBS: the copies announce themselves only to
    # each other, never to n4. An ACKJOB on n4 answered 0 from the tombstone
    # and told nobody; the job was delivered again. A peer whose link came
    # up again since may be such a restarted holder: make the dummy ack.
    node, job_id, _ = _replica_of_a_job_added_on_other()
    node.cluster.link_changed(OTHER_ID, True, node.now_ms())
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack
    assert (OTHER_ID, bus.SetAck(job_id, 0)) in sent(node)
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, True))
    assert job_id not in node.jobs and job_id in node.deleted_acked
    # Nothing moved: no new dummy ack (seed 9010).
    node.effects.clear()
    assert run(node, "ACKJOB", job_id) == 0
    assert job_id not in node.jobs and sent(node) == []
    # The holder crashed and came back: its link went down, then up.
    node.cluster.link_changed(OTHER_ID, False, node.now_ms())
    node.cluster.link_changed(OTHER_ID, True, node.now_ms())
    node.refresh_cluster_view()
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack
    assert (OTHER_ID, bus.SetAck(job_id, 0)) in sent(node)


def test_ackjob_after_a_dummy_ack_every_node_denied_makes_a_dummy_ack_again() -> None:
    # Seed 563819: n0's dummy ack of n1's job reached n2, which held no copy
    # (GOTACK, not known); n1, cut off, gave its copy to n2 by YOURJOBS,
    # then answered n0 it held none either, and n0 collected the dummy ack.
    # Later ACKJOBs on n0 answered 0 from the tombstone and told nobody:
    # n2 delivered the job again and again.
    node, job_id, _ = _replica_of_a_job_added_on_other()
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack
    cj.receive(node, THIRD_ID, bus.GotAck(job_id, False))
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, False))
    assert job_id not in node.jobs and job_id in node.deleted_acked
    node.effects.clear()
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack
    told = {peer for peer, m in sent(node) if isinstance(m, bus.SetAck)}
    assert {OTHER_ID, THIRD_ID} <= told


def _node_with_other() -> tuple[Node, FakeClock]:
    """A node whose table holds OTHER_ID too."""
    node, clock = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.refresh_cluster_view()
    return node, clock


def test_a_node_that_joins_hears_the_pending_dummy_acks_at_once() -> None:
    # Seed 20003595: a dummy ack's SETACK retries backed off (32 s after
    # five) while a replacement node was not known yet; the retry that
    # would ask it came after the run. When the membership grows, each dummy
    # ack asks again within a moment, its back-off started afresh.
    node, clock = _node_with_other()
    job_id = "D-5a5a5a5a-" + "B" * 24 + "-05a1"
    assert run(node, "ACKJOB", job_id) == 0
    assert job_id in node.dummy_acks
    elapse(node, clock, 20_000)  # retries back off; OTHER never answers
    sent(node)
    assert node.jobs[job_id].gc_retry >= 4
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    elapse(node, clock, 500)
    told = {to for to, m in sent(node) if isinstance(m, bus.SetAck)}
    assert THIRD_ID in told
    node.unregister(node.jobs[job_id])
    assert not node.dummy_acks


def test_a_holder_whose_link_comes_up_again_hears_the_ack_at_once() -> None:
    # Seed 138841: n0 acked a job held by n1 and n4 while n4 was frozen;
    # n1 confirmed, and n0's SETACKs to n4 backed off. n4 came back (frozen
    # 7.5 s, then restarted) and queued and delivered its copy again 3 s
    # after its link was up, while n0's next SETACK was due 6 s later.
    # A link coming up now brings the SETACKs waiting on that peer forward,
    # their back-off started afresh; acks waiting on others stay as they are.
    node, clock = _node_with_other()
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    waiting = add(node, "q", "b1", "REPLICATE", 1, "TTL", 3600)
    other = add(node, "q", "b2", "REPLICATE", 1, "TTL", 3600)
    job(node, waiting).nodes_delivered = (NODE_ID, OTHER_ID)
    job(node, other).nodes_delivered = (NODE_ID, THIRD_ID)
    assert run(node, "ACKJOB", waiting, other) == 2
    assert list(node.acked_jobs) == [waiting, other]
    elapse(node, clock, 60_000)  # nobody answers: the retries back off
    node.effects.clear()
    assert job(node, waiting).gc_retry >= 5
    due_other = job(node, other).awake
    node.cluster.link_changed(OTHER_ID, True, node.now_ms())
    node.refresh_cluster_view()
    assert not node.cluster.came_up
    assert job(node, waiting).gc_retry == 0
    assert job(node, other).awake == due_other  # waits on THIRD, not OTHER
    elapse(node, clock, 300)
    told = [(to, m.job_id) for to, m in sent(node) if isinstance(m, bus.SetAck)]
    assert (OTHER_ID, waiting) in told and all(j != other for _, j in told)
    cj.receive(node, OTHER_ID, bus.GotAck(waiting, True))
    assert waiting not in node.jobs and list(node.acked_jobs) == [other]
    check_invariants(node)


def test_a_node_that_joins_hears_the_acks_of_the_jobs_it_made() -> None:
    """Simulator seed 167823: n2 was replaced (CLUSTER RESET HARD, a new ID)
    while cut off, and made a job; a consumer acked it on n1, which had not
    met the new ID. Its dummy ack went once the nodes it knew confirmed (the
    FORGET of n2's old ID came first), before the MEET that would have sent
    the new node its SETACK: n2 re-queued the job for ever. A job ID names
    its maker: a node that joins hears SETACK 0 for the jobs it made that
    were acked and deleted here lately, and no others."""
    node, _ = _node_with_other()
    made_there = "D-" + THIRD_ID[:8] + "-" + "D" * 24 + "-05a1"
    made_elsewhere = "D-" + OTHER_ID[:8] + "-" + "E" * 24 + "-05a1"
    assert run(node, "ACKJOB", made_there, made_elsewhere) == 0
    for job_id in (made_there, made_elsewhere):
        cj.receive(node, OTHER_ID, bus.GotAck(job_id, False))
    assert not node.dummy_acks  # every node known confirmed
    node.effects.clear()

    node.cluster.add(THIRD_ID, "127.0.0.1", 7714, 17714)
    node.refresh_cluster_view()

    assert sent(node) == [(THIRD_ID, bus.SetAck(made_there, 0))]
    node.effects.clear()
    node.refresh_cluster_view()  # told once, when it joins
    assert sent(node) == []
    check_invariants(node)


def test_the_maker_of_an_acked_job_hears_it_only_once_past_its_handshake() -> None:
    """A node still in its handshake may be an identity that no longer
    exists: the SETACK goes when it is a member."""
    node, _ = _node_with_other()
    job_id = "D-" + THIRD_ID[:8] + "-" + "F" * 24 + "-05a1"
    assert run(node, "ACKJOB", job_id) == 0
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, False))
    node.effects.clear()
    peer = node.cluster.add(THIRD_ID, "127.0.0.1", 7714, 17714)
    assert peer is not None
    peer.flags |= HANDSHAKE
    node.refresh_cluster_view()
    assert sent(node) == []
    peer.flags &= ~HANDSHAKE
    node.refresh_cluster_view()
    assert sent(node) == [(THIRD_ID, bus.SetAck(job_id, 0))]


def test_debug_flushall_forgets_the_dummy_acks_it_dropped() -> None:
    # DEBUG FLUSHALL drops every job, a dummy ack too: the set naming them
    # must not keep the IDs (nor a joining node's retry walk over them).
    node, _ = _node_with_other()
    job_id = "D-5a5a5a5a-" + "C" * 24 + "-05a1"
    assert run(node, "ACKJOB", job_id) == 0
    assert job_id in node.dummy_acks
    node.flush_all()
    assert not node.jobs and not node.dummy_acks
    # A job ACKed again after the flush makes a fresh dummy ack.
    assert run(node, "ACKJOB", job_id) == 0
    assert node.dummy_acks == {job_id} and job_id in node.jobs


def test_a_node_that_joins_hears_the_recent_fastacks_of_unknown_jobs() -> None:
    # Seed 106709: a node restarted with a stale table (a replaced node
    # still under its old ID) took a FASTACK for a job it never held; the
    # DELJOB went to the nodes it knew, not to the replacement, the only
    # holder of that REPLICATE 1 job, which kept delivering it. When the
    # membership grows, the DELJOB of each recent such FASTACK goes out
    # again; one older than a deleted ID's memory does not.
    node, clock = _node_with_other()
    old = "D-5a5a5a5a-" + "C" * 24 + "-05a1"
    assert run(node, "FASTACK", old) == 0
    elapse(node, clock, node_module.DELETED_IDS_MS - 1_000)
    job_id = "D-5a5a5a5a-" + "D" * 24 + "-05a1"
    assert run(node, "FASTACK", job_id) == 0
    assert {to for to, m in sent(node) if m == bus.DelJob(job_id)} == {OTHER_ID}
    elapse(node, clock, 2_000)
    node.effects.clear()
    node.refresh_cluster_view()  # nobody new: nothing sent
    assert not [m for _, m in sent(node) if isinstance(m, bus.DelJob)]
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    dels = [(to, m.job_id) for to, m in sent(node) if isinstance(m, bus.DelJob)]
    assert (THIRD_ID, job_id) in dels
    assert old not in {j for _, j in dels}  # past DELETED_IDS_MS: forgotten
    assert list(node.fastacked_unknown) == [job_id]


def test_ackjob_of_a_job_deleted_unacked_still_makes_a_dummy_ack() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    assert run(node, "DELJOB", job_id) == 1  # not acked here
    assert run(node, "ACKJOB", job_id) == 0
    assert node.jobs[job_id].is_dummy_ack


def _holders_of_one_job(retry: int = 1) -> tuple[dict[str, Node], dict[str, FakeClock], str]:
    """A job added on NODE_ID (queued there), held also by OTHER_ID."""
    a, clock_a = make_node(node_id=NODE_ID)
    b, clock_b = make_node(seed=1, node_id=OTHER_ID)
    job_id = add(a, "q", "body", "RETRY", retry, "REPLICATE", 1)
    a.jobs[job_id].nodes_delivered = (NODE_ID, OTHER_ID)
    data = cj.job_data(a.jobs[job_id], a.now_ms())
    cj.receive(b, NODE_ID, bus.ReplJob(data, True))
    return {NODE_ID: a, OTHER_ID: b}, {NODE_ID: clock_a, OTHER_ID: clock_b}, job_id


def test_two_queued_copies_left_by_lost_messages_resolve_at_the_retry_point() -> None:
    """Seeds 9006, 9162: the WILLQUEUE and QUEUED of one holder were lost
    (a link dropped, bus chaos), so it queued its copy while the other was
    queued too; queued copies never spoke again and the job stayed queued
    twice (delivered twice) until a client took one."""
    nodes, clocks, job_id = _holders_of_one_job()
    a, b = nodes[NODE_ID], nodes[OTHER_ID]
    elapse(b, clocks[OTHER_ID], 2000)  # its WILLQUEUE, then QUEUED: lost
    b.effects.clear()
    assert job(a, job_id).state == job(b, job_id).state == JobState.QUEUED
    for _ in range(3):
        for node_id, n in nodes.items():
            elapse(n, clocks[node_id], 1000)
        _pump(nodes)
    queued = [n for n in nodes.values() if job(n, job_id).state == JobState.QUEUED]
    assert len(queued) == 1


def test_a_queued_copy_answers_willqueue_to_every_holder() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    node.jobs[job_id].nodes_delivered = (NODE_ID, OTHER_ID, THIRD_ID)
    cj.receive(node, OTHER_ID, bus.WillQueue(job_id))
    told = {to for to, m in sent(node) if m == bus.Queued(job_id, 0)}
    assert told == {OTHER_ID, THIRD_ID}


def test_a_queued_copy_that_answered_willqueue_does_not_re_announce() -> None:
    node, clock = make_node()
    job_id = add(node, "q", "body", "RETRY", 2)
    node.jobs[job_id].nodes_delivered = (NODE_ID, OTHER_ID)
    clock.ms += 1000
    cj.receive(node, OTHER_ID, bus.WillQueue(job_id))
    node.effects.clear()
    elapse(node, clock, 1500)  # past the retry point: every holder was told
    assert sent(node) == []
    elapse(node, clock, 2500)  # a whole period without a word: announce
    assert sent(node) == [(OTHER_ID, bus.Queued(job_id, 0))]


@pytest.mark.parametrize("how", ["requeue", "yourjobs"])
def test_a_queueing_announcement_alone_does_not_spare_the_next_retry_point(how: str) -> None:
    """Seed 20005489: a holder's QUEUED after it queued the job was lost
    (bus chaos), and a holder that did not list it queued its own copy.
    Only an answer to WILLQUEUE (the steady state) spares the announcement
    at the next retry point; the queueing's own announcement, maybe lost,
    is repeated there, not a retry period later."""
    if how == "requeue":
        node, clock = make_node()
        job_id = add(node, "q", "body", "RETRY", 2)
        node.jobs[job_id].nodes_delivered = (NODE_ID, OTHER_ID)
        [_] = get(node, "q")  # delivered, not acked: re-queued at RETRY
        elapse(node, clock, 2100)
        assert job(node, job_id).state == JobState.QUEUED
    else:
        node, clock, job_id = _moved_here_by_yourjobs(2, listing_us=True)
    assert job(node, job_id).state == JobState.QUEUED
    # Its announcement (counting a delivery after a re-queue): maybe lost.
    assert [to for to, m in sent(node) if isinstance(m, bus.Queued)] == [OTHER_ID]
    node.effects.clear()
    elapse(node, clock, 2600)  # the next retry point (RETRY + time error), no WILLQUEUE came
    assert sent(node) == [(OTHER_ID, bus.Queued(job_id, 0))]


def test_collecting_after_forget_tells_the_holders_that_do_not_know_the_node() -> None:
    # Seed 11268: n2 was wiped and came back as a new ID; a job it took
    # (YOURJOBS) still listed its old ID, which it never knew (gossip does
    # not teach a node an earlier incarnation of itself), so FORGET was not
    # run there. The other holders forgot the old ID and collected the
    # acked job without a word: n2 waited for the old ID's GOTACK for ever.
    a, b = _pair()
    nodes = {NODE_ID: a, OTHER_ID: b}
    old = "0123abcd" + "e5" * 16  # b's earlier incarnation: only a knows it
    a.cluster.add(old, "127.0.0.1", 7712, 17712)
    a.refresh_cluster_view()
    job_id = add(a, "q", "body", "RETRY", 5, "REPLICATE", 1)
    job(a, job_id).nodes_delivered = (NODE_ID, OTHER_ID, old)
    cj.replicate(a, job(a, job_id), 0, noreply=True)
    _pump(nodes)
    assert run(a, "ACKJOB", job_id) == 1
    a.try_gc(job(a, job_id))
    _pump(nodes)
    b.try_gc(job(b, job_id))
    _pump(nodes)
    assert job(a, job_id).state == job(b, job_id).state == JobState.ACKED  # wait for old
    a.cluster.forget(old, a.now_ms())
    assert a.forget_node(old) == 1
    assert job_id not in a.jobs
    _pump(nodes)
    assert job_id not in b.jobs  # told by DELJOB, not left waiting for old


def _copy_from_other_listing_third() -> tuple[str, bus.JobData]:
    """A job of OTHER's, as OTHER sends it, listing OTHER and THIRD as holders."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 5)
    data = cj.job_data(sender.jobs[job_id], sender.now_ms())
    return job_id, attrs.evolve(data, nodes_delivered=(OTHER_ID, THIRD_ID))


def test_holder_lists_from_peers_drop_nodes_we_forgot() -> None:
    """Seed 12329: just after our CLUSTER FORGET of a wiped node, a peer that
    had not run it yet sent a copy listing that node; our ack then waited
    for it for ever."""
    job_id, listed = _copy_from_other_listing_third()
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    node.cluster.forget(THIRD_ID, node.now_ms())
    node.forget_node(THIRD_ID)
    cj.receive(node, OTHER_ID, bus.YourJobs((listed,)))
    assert THIRD_ID not in job(node, job_id).nodes_delivered
    cj.receive(node, OTHER_ID, bus.ReplJob(listed, True))
    assert THIRD_ID not in job(node, job_id).nodes_delivered


def test_holder_lists_from_peers_drop_nodes_in_handshake() -> None:
    """Seed 5263: a node reset HARD heard a wiped node's old ID only by
    gossip (a handshake never answered), took it from a YOURJOBS holder
    list, and its ack waited for ever for that ID (the handshake timeout
    dropped it from its table, so no CLUSTER FORGET reached this node). As
    in the original, where such a node has a temporary name, a holder list
    skips a node that has not answered our handshake."""
    job_id, listed = _copy_from_other_listing_third()
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    gossiped = node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    assert gossiped is not None
    gossiped.flags |= HANDSHAKE
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, bus.YourJobs((listed,)))
    assert job(node, job_id).nodes_delivered == (OTHER_ID,)
    gossiped.flags &= ~HANDSHAKE  # it answered: a later list teaches it
    cj.receive(node, OTHER_ID, bus.ReplJob(listed, True))
    assert job(node, job_id).nodes_delivered == (OTHER_ID, THIRD_ID)


def test_yourjobs_for_a_job_acked_here_lately_is_refused_and_answered() -> None:
    """Seed 982383079: a NEEDJOBS held by a one-way partition was answered
    with YOURJOBS after the receiver had FASTACKed the job; the copy came
    back and was delivered again."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 5)
    data = cj.job_data(sender.jobs[job_id], sender.now_ms())
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert run(node, "FASTACK", job_id) == 1
    assert job_id not in node.jobs
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert job_id not in node.jobs
    assert (OTHER_ID, bus.SetAck(job_id, 0)) in sent(node)


def test_needjobs_is_broadcast_to_leaving_nodes_too() -> None:
    """A leaving node keeps its queued jobs until someone asks: without
    NEEDJOBS they stayed there 150 s and more (found by the client's
    kill-and-leave test); the original broadcasts to every node."""
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.cluster.nodes[THIRD_ID].flags |= LEAVING
    node.refresh_cluster_view()
    assert isinstance(run(node, "GETJOB", "FROM", "q"), Waiter)
    cj.need_jobs(node, "q")
    asked = {to for to, m in sent(node) if isinstance(m, bus.NeedJobs)}
    assert asked == {OTHER_ID, THIRD_ID}


def test_a_stale_copy_in_yourjobs_still_marks_its_sender_a_source() -> None:
    """Simulator seed 71: the node holding a queue's jobs lost acks in a
    crash, so the head of its queue was copies acked here long ago. Each
    broadcast NEEDJOBS fetched one of them, was refused, and the sender did
    not count as a source: the broadcast backed off to 8, 16, 30 s while 27
    live jobs stayed queued there. The sender counts as a source now, and
    the next ad-hoc NEEDJOBS asks it for more in 25 ms."""
    sender, _ = make_node(node_id=OTHER_ID)
    stale_id = add(sender, "q", "stale", "RETRY", 5)
    data = cj.job_data(sender.jobs[stale_id], sender.now_ms())
    node, clock = _node_with_other()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert run(node, "FASTACK", stale_id) == 1
    assert isinstance(run(node, "GETJOB", "FROM", "q"), Waiter)
    node.serve_waiters(node.queues["q"])
    q = node.queues["q"]
    q.needjobs_responders.clear()  # a while later: no source known
    q.needjobs_bcast_attempt = 3
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert (OTHER_ID, bus.SetAck(stale_id, 0)) in sent(node)
    assert q.wake_pending  # its delivery task recomputes its deadline
    asks = _asked_again_soon(node, clock)
    assert asks[0].count >= cj.NEEDJOBS_MIN_REQUEST


def _asked_again_soon(node: Node, clock: FakeClock) -> list[bus.NeedJobs]:
    """OTHER_ID counts as a source of "q": the next NEEDJOBS is due within
    the ad-hoc minimum and goes to it. Returns what it was sent."""
    assert OTHER_ID in node.queues["q"].needjobs_responders
    due = cj.needjobs_due(node, "q")
    assert due is not None and due - node.now_ms() <= cj.NEEDJOBS_ADHOC_MIN_MS + 1
    node.effects.clear()
    clock.ms += cj.NEEDJOBS_ADHOC_MIN_MS + 1
    cj.need_jobs(node, "q")
    asks = [m for to, m in sent(node) if to == OTHER_ID and isinstance(m, bus.NeedJobs)]
    assert len(asks) == 1
    return asks


@pytest.mark.parametrize("announce", [bus.Queued, bus.WillQueue, bus.Working])
def test_a_holder_heard_of_for_the_first_time_gets_our_holder_list(announce: type) -> None:
    """Simulator seed 362: a partition ate the QUEUED announcements of two
    YOURJOBS moves, so two nodes queued copies of one job without either
    listing the other, and both stayed queued (the QUEUED rule needs them to
    talk). A holder that hears of a copy it did not list sends that node its
    list, which the receiver merges; a known holder is sent nothing."""
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    node.jobs[job_id].nodes_delivered = (node.node_id, OTHER_ID)
    node.effects.clear()
    cj.receive(node, THIRD_ID, announce(job_id))
    [(to, msg)] = [(t, m) for t, m in sent(node) if isinstance(m, bus.ReplJob)]
    assert to == THIRD_ID and msg.noreply
    assert set(msg.job.nodes_delivered) == {node.node_id, OTHER_ID, THIRD_ID}
    node.effects.clear()
    cj.receive(node, THIRD_ID, announce(job_id))
    cj.receive(node, OTHER_ID, announce(job_id))
    assert not [m for _, m in sent(node) if isinstance(m, bus.ReplJob)]
    # The receiver, holding its own copy, learns the holders it missed.
    third, _ = make_node(node_id=THIRD_ID)
    third.cluster.add(node.node_id, "127.0.0.1", 7711, 17711)
    third.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    third.refresh_cluster_view()
    cj.receive(
        third, node.node_id, bus.ReplJob(cj.job_data(node.jobs[job_id], node.now_ms()), False)
    )
    third.jobs[job_id].nodes_delivered = (THIRD_ID, node.node_id)
    cj.receive(third, node.node_id, msg)
    assert set(third.jobs[job_id].nodes_delivered) == {node.node_id, OTHER_ID, THIRD_ID}


def test_a_queued_holder_tells_a_holder_a_list_names_for_the_first_time() -> None:
    """Seed 20005489: n1 had queued its copy; a list from n0 named n2, a
    replacement that had queued its own copy, and n1 took the name without
    a word: both stayed queued until another holder's WILLQUEUE. A queued
    holder now tells a holder a list adds QUEUED (the rule leaves one)."""
    node, job_id, data = _replica_of_a_job_added_on_other()
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    node.enqueue(job(node, job_id))
    node.effects.clear()
    more = attrs.evolve(data, nodes_delivered=(*data.nodes_delivered, THIRD_ID))
    cj.receive(node, OTHER_ID, bus.ReplJob(more, True))
    assert sent(node) == [(THIRD_ID, bus.Queued(job_id, 0))]
    node.effects.clear()
    # A list with nobody new: nothing to say.
    cj.receive(node, OTHER_ID, bus.ReplJob(more, True))
    assert sent(node) == []


def test_a_lone_pair_of_holders_sends_no_list() -> None:
    """Nothing to teach when the sender and we are all the holders."""
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    node.effects.clear()
    cj.receive(node, THIRD_ID, bus.Queued(job_id, 0))
    assert THIRD_ID in job(node, job_id).nodes_delivered
    assert not [m for _, m in sent(node) if isinstance(m, bus.ReplJob)]


def test_a_late_yourjobs_does_not_bring_back_a_job_expired_here() -> None:
    """The TTL travels as what is left of it: a YOURJOBS the network held
    back past the job's expiry would give it a new life on a node that had
    already expired it (simulator seed 20)."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", 1, "TTL", 4)
    cj.receive(sender, NODE_ID, bus.NeedJobs("q", 1))
    [msg] = [m for _, m in sent(sender) if isinstance(m, bus.YourJobs)]
    node, clock = _node_with_other()
    cj.receive(node, OTHER_ID, msg)
    assert job_id in node.jobs
    elapse(node, clock, 6000)
    assert job_id not in node.jobs  # expired here
    cj.receive(node, OTHER_ID, msg)  # the same frame, late
    assert job_id not in node.jobs


def test_own_wait_repl_job_queued_by_yourjobs_is_persisted() -> None:
    """Seed 4377: a YOURJOBS queued our own ADDJOB's job, still waiting for
    replication; it left WAIT_REPL with no AOF record (delivered, then gone
    after SHUTDOWN REWRITE-AOF)."""
    node, _ = make_node()
    node.persisting = True
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.refresh_cluster_view()
    run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 2, "RETRY", 1)
    [job_id] = list(node.jobs)
    held = node.jobs[job_id]
    assert held.state == JobState.WAIT_REPL
    assert not [e for e in node.effects if isinstance(e, Persist)]
    data = job_data(held, node.now_ms())
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert held.state == JobState.QUEUED
    [record] = [e.record for e in node.effects if isinstance(e, Persist)]
    assert job_id.encode() in record


def test_a_replicated_job_is_recorded_with_its_delay_not_its_replication_time() -> None:
    """Seed 154395: a synchronously replicated ADDJOB with DELAY 3 was
    recorded while its qtime still held the next replication try; its node
    crashed and reloaded it 1.2 s later, and queued it at the RETRY after
    the restart: delivered 2.2 s after the ADDJOB. The record now carries
    the DELAY's queue time, and a reload before it waits for it."""
    node, clock = make_node()
    node.persisting = True
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.refresh_cluster_view()
    added_at = node.now_ms()
    run(node, "ADDJOB", "q", "body", 5000, "REPLICATE", 2, "DELAY", 3, "RETRY", 1)
    [job_id] = list(node.jobs)
    cj.receive(node, OTHER_ID, bus.GotJob(job_id))
    assert node.jobs[job_id].state == JobState.ACTIVE
    [record] = [e.record for e in node.effects if isinstance(e, Persist)]
    found = aof.record_at(record, 0)
    assert found is not None
    kind, rec = found[1]
    assert kind == b"LOADJOB" and isinstance(rec, aof.JobRecord)
    assert rec.qtime == added_at + 3000
    restarted, rclock = make_node(node_id=OTHER_ID)
    rclock.ms = clock.ms + 1200  # back from a crash before the DELAY ran out
    reloaded = records.job_from_record(restarted, rec, restarted.now_ms())
    assert reloaded is not None and reloaded.qtime >= added_at + 3000


def test_a_queued_copy_announced_by_a_node_not_yet_known_holds_ours() -> None:
    """Seed 20000403: n3, a replacement, took the job by YOURJOBS and
    announced QUEUED before gossip brought its new ID to n2, which dropped
    the announcement, queued its own copy at RETRY, and both copies stayed
    queued 4.5 s. A QUEUED from a node past the handshake but not in the
    table postpones our re-queue, and the sender is a pending holder."""
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    copy = job(node, job_id)
    assert copy.state == JobState.ACTIVE and THIRD_ID not in node.cluster.nodes
    due = copy.qtime
    node.effects.clear()
    cj.receive_from_stranger(node, THIRD_ID, bus.Queued(job_id, 0))
    assert copy.qtime > due and copy.state == JobState.ACTIVE
    assert THIRD_ID not in copy.nodes_delivered
    assert node.pending_holders == {THIRD_ID: {job_id}}
    assert sent(node) == []  # no link to a stranger
    # Other messages from a stranger are not heard.
    cj.receive_from_stranger(node, THIRD_ID, bus.SetAck(job_id, 3))
    cj.receive_from_stranger(node, THIRD_ID, bus.DelJob(job_id))
    assert copy.state == JobState.ACTIVE and node.jobs[job_id] is copy
    # Once it answers our handshake, it is a holder and hears of our copy.
    node.enqueue(copy)
    node.effects.clear()
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    assert THIRD_ID in copy.nodes_delivered
    assert sent(node) == [(THIRD_ID, bus.Queued(job_id, 0))]


@pytest.mark.parametrize("stranger_wins", [True, False])
def test_a_stranger_queued_copy_follows_the_queued_rule(stranger_wins: bool) -> None:
    """Both copies queued: the one the ID comparison says keeps it, as for
    a known sender (ours is told later, when the stranger is adopted)."""
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    copy = job(node, job_id)
    node.enqueue(copy)
    # Node IDs one character away from ours: whatever the job's random
    # part, some win and some lose against ours.
    candidates = [
        NODE_ID[:i] + c + NODE_ID[i + 1 :]
        for i in range(len(NODE_ID))
        for c in "0123456789abcdef"
        if c != NODE_ID[i]
    ]
    stranger = next(
        c for c in candidates if (cj.compare_ids_by_job(c, NODE_ID, job_id) > 0) == stranger_wins
    )
    cj.receive_from_stranger(node, stranger, bus.Queued(job_id, 0))
    assert copy.state == (JobState.ACTIVE if stranger_wins else JobState.QUEUED)


def test_a_forgotten_node_is_not_learned_from_its_queued() -> None:
    node, job_id, data = _replica_of_a_job_added_on_other()
    cj.receive(node, OTHER_ID, bus.ReplJob(data, False))
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    assert node.cluster.forget(THIRD_ID, node.now_ms())
    due = job(node, job_id).qtime
    cj.receive_from_stranger(node, THIRD_ID, bus.Queued(job_id, 0))
    assert job(node, job_id).qtime == due and THIRD_ID not in node.pending_holders


def test_an_expired_copy_in_yourjobs_still_marks_its_sender_a_source() -> None:
    """Simulator seed 133855: a node whose wall clock stepped 36.5 s back
    kept a job queued past its TTL, at the head of its queue (lowest
    ctime), and answered every NEEDJOBS with it alone. The receivers had
    expired it and dropped the copy without counting the sender as a
    source: the broadcast backed off to 30 s while 16 live jobs stayed
    queued there past the drain. Like a copy acked here, it counts the
    sender, and the next ad-hoc NEEDJOBS asks it for more in 25 ms."""
    sender, _ = make_node(node_id=OTHER_ID)
    old_id = add(sender, "q", "old", "RETRY", 1, "TTL", 3)
    data = cj.job_data(sender.jobs[old_id], sender.now_ms())
    node, clock = _node_with_other()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))
    assert old_id in node.jobs
    elapse(node, clock, 5_000)  # its TTL ran out here
    assert old_id not in node.jobs and old_id in node.deleted_expired
    assert isinstance(run(node, "GETJOB", "FROM", "q"), Waiter)
    q = node.queues["q"]
    q.needjobs_responders.clear()  # a while later: no source known
    q.needjobs_bcast_attempt = 3
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.YourJobs((data,)))  # the sender's clock lags
    assert old_id not in node.jobs  # not back to life
    _asked_again_soon(node, clock)


def test_a_late_yourjobs_leaves_a_job_waiting_for_its_clients_delay() -> None:
    """Simulator seed 320491137: a job moved here, delivered and NACKed with
    DELAY 2; a second YOURJOBS for it, sent before its sender heard our
    POSTPONE, queued it 0.3 s into the delay. It now leaves the job waiting
    and answers POSTPONE with what is left of the delay."""
    node, clock, job_id = _moved_here_by_yourjobs(5)
    again = job_data(job(node, job_id), clock.ms)
    assert [entry[1] for entry in get(node, "q")] == [job_id]
    assert run(node, "NACK", job_id, "DELAY", 2) == 1
    node.effects.clear()
    elapse(node, clock, 300)
    cj.receive(node, OTHER_ID, bus.YourJobs((again,)))
    assert job(node, job_id).state == JobState.ACTIVE
    [answer] = [m for to, m in sent(node) if to == OTHER_ID and isinstance(m, bus.Postpone)]
    assert answer.job_id == job_id and 1500 <= answer.delay_ms <= 1700


def _yourjobs_then_postpone(
    retry: int, delay_ms: int, flags: int
) -> tuple[Node, FakeClock, str, bus.YourJobs, bus.Postpone]:
    """OTHER_ID answers our NEEDJOBS with a job, then its client asks for a
    delay there: the YOURJOBS and the POSTPONE it sends after it, and this
    node (which holds nothing yet), its clock, the job's ID."""
    sender, _ = make_node(node_id=OTHER_ID)
    job_id = add(sender, "q", "body", "RETRY", retry)
    cj.receive(sender, NODE_ID, bus.NeedJobs("q", 1))
    [yours] = [m for _, m in sent(sender) if isinstance(m, bus.YourJobs)]
    node, clock = _node_with_other()
    return node, clock, job_id, yours, bus.Postpone(job_id, delay_ms, flags)


def test_a_postpone_that_overtook_its_yourjobs_holds_the_job() -> None:
    """Simulator seed 458330: a NEEDJOBS answered with a job, then its
    client's ENQUEUE DELAY 2 on the sender; the POSTPONE came before the
    YOURJOBS (slowed 0.4 s) and was dropped, and the YOURJOBS queued the
    job 0.5 s into the delay. The POSTPONE is now remembered and the job,
    when it comes, waits past the delay (plus a RETRY: the sender queues
    it), and counts what the POSTPONE counted."""
    node, clock, job_id, yours, postpone = _yourjobs_then_postpone(3, 2000, bus.FLAG_INCR_NACKS)
    cj.receive(node, OTHER_ID, postpone)
    assert job_id not in node.jobs
    elapse(node, clock, 400)
    cj.receive(node, OTHER_ID, yours)
    held = job(node, job_id)
    assert held.state == JobState.ACTIVE  # not queued
    assert held.nacks == 1
    assert get(node, "q") == []
    assert clock.ms + 1600 + 3000 <= held.qtime <= clock.ms + 1600 + 3000 + 1000
    until, _, _ = node.postpones_heard[job_id]  # kept for a YOURJOBS to come
    assert until == clock.ms + 1600
    cj.receive(node, OTHER_ID, yours)  # the same YOURJOBS twice: counted once
    assert job(node, job_id).nacks == 1 and get(node, "q") == []
    check_invariants(node)


def test_a_postpone_remembered_past_its_delay_is_not_applied() -> None:
    node, clock, job_id, yours, postpone = _yourjobs_then_postpone(3, 500, 0)
    cj.receive(node, OTHER_ID, postpone)
    elapse(node, clock, 600)
    cj.receive(node, OTHER_ID, yours)
    assert job(node, job_id).state == JobState.QUEUED  # the delay was over
    assert [entry[1] for entry in get(node, "q")] == [job_id]


def test_postpones_of_unknown_jobs_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cj, "POSTPONES_HEARD_MAX", 3)
    node, clock = _node_with_other()
    for n in range(5):
        cj.receive(node, OTHER_ID, bus.Postpone(f"D-{n:040d}", 10_000, 0))
    assert list(node.postpones_heard) == [f"D-{n:040d}" for n in (2, 3, 4)]
    elapse(node, clock, 10_001)
    cj.receive(node, OTHER_ID, bus.Postpone("D-" + "x" * 40, 10_000, 0))
    assert list(node.postpones_heard) == ["D-" + "x" * 40]  # the ended ones went


def test_a_postpone_of_a_job_acked_and_deleted_here_still_answers_setack() -> None:
    node, _, job_id = _moved_here_by_yourjobs(5)
    assert run(node, "ACKJOB", job_id) == 1
    node.jobs.pop(job_id, None)
    node.remember_deleted(job_id, acked=True)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.Postpone(job_id, 2000, 0))
    assert job_id not in node.postpones_heard
    assert any(isinstance(m, bus.SetAck) for to, m in sent(node) if to == OTHER_ID)


def test_a_yourjobs_written_before_a_postpone_elsewhere_leaves_the_job_standing_by() -> None:
    """Simulator seed 472635: this node held the job, not queued; another
    holder's client asked NACK DELAY 3 there, and this node stood by on its
    POSTPONE; then a YOURJOBS from a third holder, which gave its queued
    copy away before the POSTPONE reached it, queued the job here 0.5 s
    into the delay. The YOURJOBS now leaves it standing by; once the delay
    is over, one queues it as usual."""
    node, clock, job_id, yours, _ = _yourjobs_then_postpone(3, 0, 0)
    node.cluster.add(THIRD_ID, "127.0.0.1", 7713, 17713)
    node.refresh_cluster_view()
    cj.receive(node, OTHER_ID, yours)
    assert job(node, job_id).state == JobState.QUEUED
    cj.receive(node, THIRD_ID, bus.Postpone(job_id, 3000, bus.FLAG_INCR_NACKS))
    held = job(node, job_id)
    assert held.state == JobState.ACTIVE and held.nacks == 1
    standby = held.qtime
    elapse(node, clock, 500)
    cj.receive(node, OTHER_ID, yours)  # written before its sender heard the POSTPONE
    assert job(node, job_id).state == JobState.ACTIVE
    assert job(node, job_id).qtime == standby
    assert job(node, job_id).nacks == 1
    assert get(node, "q") == []
    check_invariants(node)
    elapse(node, clock, 2600)  # the delay is over: a YOURJOBS queues it again
    cj.receive(node, OTHER_ID, yours)
    assert [entry[1] for entry in get(node, "q")] == [job_id]


def test_a_copy_given_by_yourjobs_is_recorded_with_its_new_holder() -> None:
    """Seed 490313: n2 gave a RETRY 3 job to n0 by YOURJOBS, listing n0 as
    a holder in memory only; it crashed, reloaded its record without n0,
    and at its RETRY gave the job to n1. n0's SETACK (n0 and n2: two) was
    answered by counts (n2 and n1: two) and n0 collected the job while n1
    kept its copy. The holder list a NEEDJOBS answer grows is recorded."""
    node, clock = make_node()
    node.persisting = True
    job_id = add(node, "q", "body", "RETRY", 5)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    records_written = [e.record for e in node.effects if isinstance(e, Persist)]
    assert records_written, "the new holder is not in the AOF"
    found = aof.record_at(records_written[-1], 0)
    assert found is not None
    kind, rec = found[1]
    assert kind == b"LOADJOB" and isinstance(rec, aof.JobRecord) and rec.id == job_id
    assert OTHER_ID in rec.nodes_delivered
    restarted, rclock = make_node()
    rclock.ms = clock.ms + 5_000  # back from a crash
    reloaded = records.job_from_record(restarted, rec, restarted.now_ms())
    assert reloaded is not None and OTHER_ID in reloaded.nodes_delivered


def test_a_setack_from_a_holder_not_listed_is_not_answered_by_counts() -> None:
    """The same seed, at the receiver of the SETACK: it lists two holders,
    itself and THIRD_ID; the sender (OTHER_ID, not listed) lists two, itself
    and us, and so misses THIRD_ID. Compared by counts alone the lists look
    alike, and our GOTACK let the sender collect the job while THIRD_ID kept
    its copy. Counted in, the sender makes ours longer: we collect the job
    ourselves, asking every holder (the sender too) to confirm."""
    node, _ = make_node()
    for peer_id, port in ((OTHER_ID, 7712), (THIRD_ID, 7713)):
        peer = node.cluster.add(peer_id, "127.0.0.1", port, port + 10000)
        assert peer is not None
        peer.link_up = True
    node.refresh_cluster_view()
    job_id = add(node, "q", "body", "RETRY", 5, "REPLICATE", 1)
    node.jobs[job_id].nodes_delivered = (NODE_ID, THIRD_ID)
    node.effects.clear()

    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))

    held = node.jobs[job_id]
    assert held.state == JobState.ACKED
    assert set(held.nodes_delivered) == {NODE_ID, OTHER_ID, THIRD_ID}
    messages = sent(node)
    assert not [m for _, m in messages if isinstance(m, bus.GotAck)], messages
    setacks = {to for to, m in messages if isinstance(m, bus.SetAck)}
    assert setacks == {OTHER_ID, THIRD_ID}
    # Every holder confirms: collected, every holder told.
    for peer_id in (OTHER_ID, THIRD_ID):
        cj.receive(node, peer_id, bus.GotAck(job_id, True))
    assert job_id not in node.jobs
    check_invariants(node)


def test_a_setack_from_a_listed_holder_is_still_answered_by_counts() -> None:
    """The rule above leaves the usual case alone: the sender is listed and
    knows as many holders as we do, so it is answered GOTACK."""
    node, _ = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    node.jobs[job_id].nodes_delivered = (NODE_ID, OTHER_ID)
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))
    assert sent(node) == [(OTHER_ID, bus.GotAck(job_id, True))]


def test_a_holder_that_answers_after_the_collection_hears_the_ack() -> None:
    # Seed 761608: a copy an ADDJOB on a leaving node sent to a node cut off
    # one way (its handshake here not through) arrived after the job, moved
    # here by YOURJOBS, was acked and collected on its one known holder's
    # GOTACK: acked nowhere else, that copy stayed until its TTL. Now the
    # holder hears SETACK (no count: it collects its copy itself) once it
    # answers.
    node, job_id = _moved_here_with_third_in_its_handshake()
    [delivered] = get(node, "q")
    assert run(node, "ACKJOB", delivered[1]) == 1
    cj.receive(node, OTHER_ID, bus.GotAck(job_id, True))
    assert job_id not in node.jobs and job_id in node.deleted_acked
    assert node.pending_holders == {THIRD_ID: {job_id}}
    node.effects.clear()
    node.cluster.link_changed(THIRD_ID, True, node.now_ms())  # it answered
    node.refresh_cluster_view()
    assert not node.pending_holders
    assert (THIRD_ID, bus.SetAck(job_id, 0)) in sent(node)


@pytest.mark.parametrize("retry", [0, 60])
def test_a_job_given_away_by_yourjobs_lists_its_pending_holders(retry: int) -> None:
    """A RETRY 0 job is forgotten here as it moves, and with it the one
    record of a holder still in its handshake here: the YOURJOBS lists it,
    for the receiver to tell of the ack. A copied job's list carries it
    too."""
    node, _ = make_node()
    node.cluster.add(OTHER_ID, "127.0.0.1", 7712, 17712)
    node.cluster.nodes[OTHER_ID].link_up = True
    node.refresh_cluster_view()
    job_id = run(node, "ADDJOB", "q", "body", 0, "RETRY", retry, "REPLICATE", 1)
    assert isinstance(job_id, str) and job(node, job_id).state == JobState.QUEUED
    node.pending_holders[THIRD_ID] = {job_id}
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 1))
    [answer] = [m for to, m in sent(node) if to == OTHER_ID and isinstance(m, bus.YourJobs)]
    [data] = answer.jobs
    assert data.id == job_id and THIRD_ID in data.nodes_delivered
    if retry:
        assert THIRD_ID not in job(node, job_id).nodes_delivered  # still pending here
    else:
        assert job_id not in node.jobs  # moved: it lives there only
