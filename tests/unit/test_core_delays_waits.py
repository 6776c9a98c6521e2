"""NACK and ENQUEUE with DELAY, and WAITJOB, in the pure core: what the
commands answer, what the other holders are told, and what a reload keeps."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from disque_trio.core import clusterjobs as cj
from disque_trio.core import records
from disque_trio.core.job import FLAG_DELAYED, FLAG_DELIVERED, JobState
from disque_trio.core.node import Node
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import bus

from .core_support import (
    NODE_ID,
    OTHER_ID,
    START_MS,
    FakeClock,
    add,
    check_invariants,
    elapse,
    error_line,
    fields,
    get,
    job,
    make_node,
    run,
    sent,
    tick_at,
)

THIRD_ID = "5a5a5a5a" + "c4" * 16


def _in_cluster(node_id: str = NODE_ID) -> tuple[Node, FakeClock]:
    node, clock = make_node(node_id=node_id)
    for peer, port in ((OTHER_ID, 7712), (THIRD_ID, 7713), (NODE_ID, 7711)):
        if peer != node_id:
            node.cluster.add(peer, "127.0.0.1", port, port + 10000)
    node.refresh_cluster_view()
    return node, clock


def _delivered(node: Node, *opts: Any, holders: tuple[str, ...] = ()) -> str:
    """A job added here, listed as held by ``holders`` too, delivered once."""
    job_id = add(node, "q", "body", "REPLICATE", 1, *opts)
    job(node, job_id).nodes_delivered = (node.node_id, *holders)
    assert get(node, "q")[0][1] == job_id
    node.effects.clear()
    return job_id


def _postpones(node: Node) -> list[tuple[str, bus.Postpone]]:
    return [(to, m) for to, m in sent(node) if isinstance(m, bus.Postpone)]


# ------------------------------------------------------------------ NACK DELAY


def test_nack_delay_queues_the_job_after_the_delay_and_counts_one_nack() -> None:
    node, clock = make_node()
    job_id = _delivered(node, "RETRY", 5)
    assert run(node, "NACK", job_id, "DELAY", 30) == 1
    info = fields(run(node, "SHOW", job_id))
    assert info["state"] == "active" and info["nacks"] == 1
    assert info["delayed-requeue"] == 1
    assert 29_000 < info["next-requeue-within"] <= 30_000
    elapse(node, clock, 29_000)  # its RETRY (5 s) passed long ago: still waiting
    assert get(node, "q") == []
    elapse(node, clock, 1_000)
    reply = run(node, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert reply == [["q", job_id, b"body", "nacks", 1, "additional-deliveries", 0]]
    assert fields(run(node, "SHOW", job_id))["delayed-requeue"] == 0
    check_invariants(node)


def test_an_ack_during_the_delay_ends_it() -> None:
    node, clock = make_node()
    job_id = _delivered(node, "RETRY", 5)
    run(node, "NACK", job_id, "DELAY", 30)
    run(node, "ACKJOB", job_id)
    assert job_id not in node.jobs
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 30)
    run(node, "ACKJOB", job_id)  # held elsewhere too: kept until collected
    assert fields(run(node, "SHOW", job_id))["delayed-requeue"] == 0
    elapse(node, clock, 31_000)
    assert job(node, job_id).state == JobState.ACKED


def test_enqueue_delay_counts_a_delivery_not_a_nack() -> None:
    node, clock = make_node()
    job_id = _delivered(node, "RETRY", 5)
    assert run(node, "ENQUEUE", job_id, "delay", 2) == 1
    elapse(node, clock, 2_000)
    reply = run(node, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert reply == [["q", job_id, b"body", "nacks", 0, "additional-deliveries", 1]]


def test_enqueue_delay_of_a_job_never_queued_counts_nothing() -> None:
    node, clock = make_node()
    job_id = add(node, "q", "body", "DELAY", 60)
    assert run(node, "ENQUEUE", job_id, "DELAY", 1) == 1
    elapse(node, clock, 1_000)
    assert run(node, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q") == [
        ["q", job_id, b"body", "nacks", 0, "additional-deliveries", 0]
    ]


def test_delay_zero_is_a_plain_nack() -> None:
    node, _ = make_node()
    job_id = _delivered(node, "RETRY", 5)
    assert run(node, "NACK", job_id, "DELAY", 0) == 1
    assert job(node, job_id).state == JobState.QUEUED and job(node, job_id).nacks == 1


def test_nack_delay_refuses_what_nack_refuses() -> None:
    node, _ = make_node()
    queued = add(node, "q", "body", "RETRY", 5)
    once = add(node, "q1", "body", "RETRY", 0)
    get(node, "q1")
    assert run(node, "NACK", queued, "DELAY", 5) == 0  # queued: nothing to do
    assert run(node, "NACK", once, "DELAY", 5) == 0  # RETRY 0, delivered: at most once
    assert run(node, "ENQUEUE", once, "DELAY", 5) == 0
    run(node, "ACKJOB", queued)
    assert run(node, "NACK", queued, "DELAY", 5) == 0  # acked


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["DELAY"], "ERR syntax error: DELAY needs a value (NACK id [id ...] [DELAY seconds])"),
        (["DELAY", "-1"], "ERR DELAY time must be a non negative number"),
        (["DELAY", "soon"], "ERR DELAY time must be a non negative number"),
        (["DELAY", str(2**32)], "ERR DELAY is too large: at most 4294967295 seconds"),
        (["DELAY", "5", "DELAY", "5"], "BADID Invalid Job ID format."),
    ],
)
def test_nack_delay_argument_errors(args: list[str], error: str) -> None:
    node, _ = make_node()
    job_id = _delivered(node, "RETRY", 5)
    assert error_line(run(node, "NACK", job_id, *args)) == error
    assert job(node, job_id).state == JobState.ACTIVE and job(node, job_id).nacks == 0


def test_the_other_holders_hear_postpone_with_the_count() -> None:
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID, THIRD_ID))
    run(node, "NACK", job_id, "DELAY", 30)
    told = _postpones(node)
    assert {to for to, _ in told} == {OTHER_ID, THIRD_ID}
    assert all(m == bus.Postpone(job_id, 30_000, bus.FLAG_INCR_NACKS) for _, m in told)


def _holder_of(job_id_maker: Node, job_id: str) -> tuple[Node, FakeClock]:
    """OTHER_ID's copy of a job NODE_ID made (a REPLJOB received)."""
    other, clock = _in_cluster(OTHER_ID)
    data = cj.job_data(job_id_maker.jobs[job_id], job_id_maker.now_ms())
    cj.receive(other, NODE_ID, bus.ReplJob(data, True))
    return other, clock


def test_a_holder_told_postpone_holds_its_copy_past_the_delay() -> None:
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    other, clock = _holder_of(node, job_id)
    copy = job(other, job_id)
    other.enqueue(copy)  # queued there too (a lost QUEUED)
    cj.receive(other, NODE_ID, bus.Postpone(job_id, 30_000, bus.FLAG_INCR_NACKS))
    assert copy.state == JobState.ACTIVE and copy.nacks == 1
    assert copy.qtime >= clock.ms + 30_000 + 5_000 - 250
    elapse(other, clock, 34_000)
    assert copy.state == JobState.ACTIVE  # never queued while the maker waits


def test_a_holder_that_missed_postpone_is_told_again_at_its_willqueue() -> None:
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 30)
    node.effects.clear()
    clock.ms += 4_500
    cj.receive(node, OTHER_ID, bus.WillQueue(job_id))
    [(to, msg)] = _postpones(node)
    assert to == OTHER_ID and msg.flags == 0
    assert msg.delay_ms == job(node, job_id).qtime - clock.ms


def test_a_holder_learned_during_the_delay_hears_postpone() -> None:
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 30)
    node.effects.clear()
    data = cj.job_data(job(node, job_id), clock.ms)
    merged = attrs.evolve(data, nodes_delivered=(OTHER_ID, THIRD_ID))
    cj.receive(node, OTHER_ID, bus.ReplJob(merged, True))
    assert [to for to, _ in _postpones(node)] == [THIRD_ID]


def _speaking(node: Node, version: int = bus.PROTOCOL_VERSION) -> None:
    for peer in (OTHER_ID, THIRD_ID, NODE_ID):
        if peer != node.node_id:
            node.cluster.nodes[peer].bus_version = version


def test_a_holder_passes_postpone_on_to_holders_its_sender_may_not_know() -> None:
    """Simulator seed 520552: n2 gave its queued copy by YOURJOBS to n0,
    then (queued again at its RETRY) to n1; n0's client asked NACK DELAY 5
    and n0, listing only n2 and itself, told n2 alone. n1, given the job by
    the second YOURJOBS, delivered it 0.3 s into the delay. A holder now
    passes a POSTPONE on to the holders it lists, but not to its sender,
    counting nothing; a relayed POSTPONE is not passed on again, and a node
    of a release before bus protocol 7 is not sent one."""
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    other, _ = _holder_of(node, job_id)
    _speaking(other)
    copy = job(other, job_id)
    copy.nodes_delivered = (NODE_ID, OTHER_ID, THIRD_ID)
    other.effects.clear()
    cj.receive(other, NODE_ID, bus.Postpone(job_id, 30_000, bus.FLAG_INCR_NACKS))
    assert _postpones(other) == [(THIRD_ID, bus.Postpone(job_id, 30_000, bus.FLAG_RELAYED))]
    assert copy.nacks == 1
    other.effects.clear()
    cj.receive(other, THIRD_ID, bus.Postpone(job_id, 29_000, bus.FLAG_RELAYED))
    assert _postpones(other) == []  # not relayed again
    assert copy.nacks == 1  # and counting nothing
    _speaking(other, bus.RELAY_VERSION - 1)
    cj.receive(other, NODE_ID, bus.Postpone(job_id, 28_000, 0))
    assert _postpones(other) == []


def test_a_relayed_postpone_holds_the_job_a_late_yourjobs_brings() -> None:
    """The other half of seed 520552: the relayed POSTPONE reaches n1 before
    the YOURJOBS that gives it the job; the job comes, stands by past the
    delay (plus a RETRY), and the POSTPONE's relay counted nothing."""
    giver, _ = _in_cluster(OTHER_ID)
    job_id = add(giver, "q", "body", "REPLICATE", 1, "RETRY", 5)
    cj.receive(giver, THIRD_ID, bus.NeedJobs("q", 1))
    [yours] = [m for _, m in sent(giver) if isinstance(m, bus.YourJobs)]
    node, clock = _in_cluster(THIRD_ID)
    cj.receive(node, OTHER_ID, bus.Postpone(job_id, 5_000, bus.FLAG_RELAYED))
    assert job_id not in node.jobs
    elapse(node, clock, 300)
    cj.receive(node, OTHER_ID, yours)
    held = job(node, job_id)
    assert held.state == JobState.ACTIVE and held.nacks == 0
    assert get(node, "q") == []
    elapse(node, clock, 4_700 + 5_000 - 500)
    assert get(node, "q") == []  # standing by: the node that took the delay queues it
    check_invariants(node)


def test_a_relayed_postpone_leaves_a_delay_of_our_own_client_in_place() -> None:
    """Two consumers each asked a holder for a delay: a relayed POSTPONE does
    not say which node took the other one, so this node keeps its own, to
    the later end, and queues the job then."""
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID, THIRD_ID))
    run(node, "NACK", job_id, "DELAY", 3)
    cj.receive(node, OTHER_ID, bus.Postpone(job_id, 8_000, bus.FLAG_RELAYED))
    held = job(node, job_id)
    assert held.flags & FLAG_DELAYED and held.nacks == 1
    elapse(node, clock, 7_900)
    assert held.state == JobState.ACTIVE
    elapse(node, clock, 100)
    assert [entry[1] for entry in get(node, "q")] == [job_id]
    check_invariants(node)


def test_the_end_of_the_delay_announces_queued_counting_nothing() -> None:
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 3)
    elapse(node, clock, 3_000)
    assert job(node, job_id).state == JobState.QUEUED
    queued = [m for to, m in sent(node) if isinstance(m, bus.Queued)]
    assert queued == [bus.Queued(job_id, 0)]
    assert job(node, job_id).nacks == 1


def test_a_holder_queueing_the_job_during_the_delay_is_told_the_delay_again() -> None:
    """Simulator seed 171 (a calm coda, 5 nodes): n1 and n3 held the job
    and both queued it at RETRY 1; n1 delivered it and its client asked
    ENQUEUE DELAY 4; n3's QUEUED (its answer to n1's, keeping its own copy
    queued) crossed n1's POSTPONE, which then took n3's copy out. The QUEUED
    ended the delay on n1, which queued the job again at its RETRY: a
    delivery 0.8 s after a 4 s delay, in a healthy cluster. The delay stays
    and the sender hears POSTPONE again (as for its WILLQUEUE)."""
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 1, holders=(OTHER_ID,))
    run(node, "ENQUEUE", job_id, "DELAY", 4)
    qtime = job(node, job_id).qtime
    node.effects.clear()
    clock.ms += 5
    for msg in (bus.Queued(job_id, 0), bus.Working(job_id)):
        cj.receive(node, OTHER_ID, msg)
        assert job(node, job_id).flags & FLAG_DELAYED and job(node, job_id).qtime == qtime
        [(to, again)] = _postpones(node)
        assert to == OTHER_ID and again == bus.Postpone(job_id, qtime - clock.ms, 0)
        node.effects.clear()
    elapse(node, clock, 3_900)
    assert job(node, job_id).state == JobState.ACTIVE  # not at its RETRY
    elapse(node, clock, 100)
    assert job(node, job_id).state == JobState.QUEUED
    check_invariants(node)


def test_two_holders_delayed_by_two_clients_queue_once_at_the_later_end() -> None:
    """Simulator seed 12 (6 nodes, the calm coda): coda-1 was delivered by
    n0 and, moved by YOURJOBS, by n2; each consumer sent NACK DELAY 2 to
    its node. Each node, told POSTPONE by the other, stood by the other's
    delay plus RETRY, still waiting for its own; each WILLQUEUE was answered
    with a POSTPONE of what was left of the other's pushed time, so each
    pushed the other further at every round, and the job was never queued
    again. Now the per-job comparison of node IDs picks one of the two: it
    queues the job at the later end, the other stands by (no longer
    delayed, so it answers no WILLQUEUE with a POSTPONE)."""
    job_id = ""
    nodes: dict[str, tuple[Node, FakeClock]] = {}
    for node_id in (NODE_ID, OTHER_ID):
        node, clock = _in_cluster(node_id)
        if not job_id:
            job_id = _delivered(node, "RETRY", 1, holders=(OTHER_ID,))
        else:
            data = cj.job_data(job(nodes[NODE_ID][0], job_id), clock.ms)
            cj.receive(node, NODE_ID, bus.ReplJob(data, True))
            node.jobs[job_id].flags |= FLAG_DELIVERED
        nodes[node_id] = node, clock
        run(node, "NACK", job_id, "DELAY", 2 if node_id == NODE_ID else 3)
        node.effects.clear()
    winner, loser = sorted(nodes, key=lambda n: cj.compare_ids_by_job(n, OTHER_ID, job_id))[::-1]
    # Each hears the other's POSTPONE (a second after the first NACK).
    for me, other in ((winner, loser), (loser, winner)):
        node, clock = nodes[me]
        clock.ms += 1_000
        left = job(nodes[other][0], job_id).qtime - nodes[other][1].ms
        cj.receive(node, other, bus.Postpone(job_id, left, bus.FLAG_INCR_NACKS))
    won, lost = job(nodes[winner][0], job_id), job(nodes[loser][0], job_id)
    assert won.flags & FLAG_DELAYED and not lost.flags & FLAG_DELAYED
    winner_node, winner_clock = nodes[winner]
    end = won.qtime
    # The loser's WILLQUEUE is answered with what is left; the winner's is not.
    winner_clock.ms = end - 500
    cj.receive(winner_node, loser, bus.WillQueue(job_id))
    assert [m.delay_ms for _, m in _postpones(winner_node)] == [500]
    cj.receive(nodes[loser][0], winner, bus.WillQueue(job_id))
    assert not _postpones(nodes[loser][0])
    elapse(winner_node, winner_clock, 500)
    assert won.state == JobState.QUEUED
    check_invariants(winner_node)


def test_a_queued_that_crossed_the_postpone_does_not_cut_a_stand_by() -> None:
    """Simulator seed 300633 (3 nodes, healthy): n1 delivered the job, n2
    had queued its copy at RETRY 1 and announced it (QUEUED) to n0 just
    before n1's client sent NACK DELAY 2; n1's POSTPONE reached n0 first
    (stand by 2 s + RETRY), then n2's QUEUED, which set n0's re-queue a
    RETRY from then: 1 s after the command. n0's WILLQUEUE, answered by
    n1, held it on; now the QUEUED pushes a stand-by, never shortens it."""
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 1, holders=(OTHER_ID, THIRD_ID))
    other, clock = _holder_of(node, job_id)
    copy = job(other, job_id)
    cj.receive(other, NODE_ID, bus.Postpone(job_id, 2_000, bus.FLAG_INCR_NACKS))
    stand_by = copy.qtime
    assert stand_by >= clock.ms + 3_000 - 250
    clock.ms += 40
    cj.receive(other, THIRD_ID, bus.Queued(job_id, 0))
    assert copy.qtime == stand_by
    # A QUEUED past it pushes it, as ever.
    clock.ms = stand_by
    cj.receive(other, THIRD_ID, bus.Queued(job_id, 0))
    assert copy.qtime >= clock.ms + 1_000 - 250


def test_a_holder_s_working_holds_a_delayed_job_past_the_delay() -> None:
    """Simulator seed 309453107 (3 nodes, the calm coda): c1 held coda-16
    from n1 sending WORKING (RETRY 3); c2, with a duplicate from n2, sent
    NACK DELAY 5 there. n2 kept its delay through c1's WORKINGs and queued
    the job at its end, 0.16 s before c1 acked it (working-holds). WORKING
    from a holder pushes a delayed job's time too (never brings it
    forward), the delay kept."""
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 3, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 5)
    end = job(node, job_id).qtime
    clock.ms += 4_000
    cj.receive(node, OTHER_ID, bus.Working(job_id))
    pushed = job(node, job_id).qtime
    assert pushed >= clock.ms + 3_000 - 250 > end
    assert job(node, job_id).flags & FLAG_DELAYED
    elapse(node, clock, 1_500)  # past the delay's end: WORKING holds it
    assert job(node, job_id).state == JobState.ACTIVE


def test_a_queued_from_a_holder_after_the_delay_is_a_retry_again() -> None:
    node, clock = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    run(node, "NACK", job_id, "DELAY", 3)
    elapse(node, clock, 3_000)
    assert get(node, "q")[0][1] == job_id
    node.effects.clear()
    cj.receive(node, OTHER_ID, bus.Queued(job_id, 0))
    assert not job(node, job_id).flags & FLAG_DELAYED
    assert not _postpones(node)


def test_a_reload_keeps_a_delay_not_over() -> None:
    node, clock = make_node()
    job_id = _delivered(node, "RETRY", 5)
    run(node, "NACK", job_id, "DELAY", 60)
    rec = records.job_record(job(node, job_id))
    reloaded = records.job_from_record(node, rec, clock.ms + 10_000)
    assert reloaded is not None and reloaded.flags & FLAG_DELAYED
    assert reloaded.qtime == rec.qtime  # 50 s from the reload, not RETRY
    # Over by the reload: it may have been queued and delivered since.
    late = records.job_from_record(node, rec, clock.ms + 61_000)
    assert late is not None and not late.flags & FLAG_DELAYED
    assert late.qtime >= clock.ms + 61_000 + 5_000


# ------------------------------------------------------------------ WAITJOB


def _wait(node: Node, *args: Any) -> Waiter:
    waiter = run(node, "WAITJOB", *args)
    assert isinstance(waiter, Waiter), waiter
    return waiter


def test_waitjob_answers_at_once_what_is_known() -> None:
    node, clock = make_node()
    acked, gone = add(node), add(node, "q", "b", "TTL", 5)
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    run(node, "ACKJOB", acked)
    assert acked not in node.jobs  # collected: only its tombstone is left
    elapse(node, clock, 6_000)
    assert gone not in node.jobs
    assert run(node, "WAITJOB", acked, gone, unknown, acked) == [
        "acked",
        "gone",
        "unknown",
        "acked",
    ]


def test_waitjob_blocks_until_each_job_is_done() -> None:
    node, _ = make_node()
    a, b = add(node), add(node)
    waiter = _wait(node, a, b, a)
    assert node.stats.blocked_clients == 1
    run(node, "ACKJOB", a)
    assert not waiter.done
    run(node, "DELJOB", b)
    assert waiter.done and waiter.reply == ["acked", "gone", "acked"]
    assert node.job_waiters == {} and node.stats.blocked_clients == 0


def test_waitjob_timeout_answers_pending_for_what_is_not_done() -> None:
    node, _ = make_node()
    a, b = add(node), add(node)
    waiter = _wait(node, a, b, "TIMEOUT", 500)
    assert waiter.timeout_ms == 500
    run(node, "ACKJOB", a)
    assert node.cancel_wait(waiter) == ["acked", "pending"]
    assert node.job_waiters == {} and node.stats.blocked_clients == 0


def test_waitjob_hears_an_ack_made_on_another_node() -> None:
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    waiter = _wait(node, job_id)
    cj.receive(node, OTHER_ID, bus.SetAck(job_id, 2))
    assert waiter.reply == ["acked"]


def test_waitjob_hears_a_fastack_made_on_another_node() -> None:
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    waiter = _wait(node, job_id)
    cj.receive(node, OTHER_ID, bus.DelJob(job_id))
    assert waiter.reply == ["acked"]


def test_waitjob_follows_a_retry0_job_moved_by_federation() -> None:
    node, clock = _in_cluster()
    acked, expired, _, _ = (
        add(node, "q", "b", "RETRY", 0, "REPLICATE", 1, "TTL", 60) for _ in range(4)
    )
    cj.receive(node, OTHER_ID, bus.NeedJobs("q", 4))  # half of them go
    assert acked not in node.jobs and expired not in node.jobs
    waiter = _wait(node, acked, expired)
    cj.receive(node, OTHER_ID, bus.DelJob(acked))  # its new holder collected it
    assert not waiter.done and waiter.outcomes[acked] == "acked"
    tick_at(node, clock, START_MS + 59_000)
    node.cron()
    assert not waiter.done
    clock.ms = START_MS + 61_000
    node.cron()
    assert waiter.reply == ["acked", "gone"]
    assert node.moved_waits == {}


def test_waitjob_on_a_job_this_node_kept_no_copy_of_is_unknown() -> None:
    node, _ = _in_cluster()
    node.maxmemory = node.memory_estimate() * 100 // 80  # above 75 %: no local copy
    waiter = run(node, "ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert isinstance(waiter, Waiter)
    job_id = waiter.job_id
    assert job_id is not None
    for peer in (OTHER_ID, THIRD_ID):
        cj.receive(node, peer, bus.GotJob(job_id))
    assert job_id not in node.jobs
    assert run(node, "WAITJOB", job_id) == ["unknown"]


def test_waitjob_argument_errors() -> None:
    node, _ = make_node()
    job_id = add(node)
    assert error_line(run(node, "WAITJOB", "nope")) == "BADID Invalid Job ID format."
    assert error_line(run(node, "WAITJOB", "TIMEOUT", 5)).startswith(
        "ERR syntax error: at least one job ID is needed"
    )
    assert error_line(run(node, "WAITJOB", job_id, "TIMEOUT", -1)) == "ERR timeout is negative"
    assert error_line(run(node, "WAITJOB", job_id, "TIMEOUT")).startswith(
        "ERR syntax error: TIMEOUT needs a value"
    )


def test_a_flushall_ends_waits_as_gone() -> None:
    node, _ = make_node()
    job_id = add(node)
    waiter = _wait(node, job_id)
    node.flush_all()
    assert waiter.reply == ["gone"]


def test_delay_waits_for_every_linked_node_to_speak_postpone() -> None:
    """A rolling upgrade: a node whose link speaks bus protocol 3 would
    never hear POSTPONE, so DELAY is refused until it is upgraded."""
    node, _ = _in_cluster()
    job_id = _delivered(node, "RETRY", 5, holders=(OTHER_ID,))
    other = node.cluster.nodes[OTHER_ID]
    other.link_up, other.bus_version = True, 3
    assert error_line(run(node, "NACK", job_id, "DELAY", 5)).startswith(
        "NOTSUPPORTED DELAY needs every node on bus protocol 4 or newer: 77e1a0b2 speaks 3"
    )
    assert job(node, job_id).nacks == 0
    other.link_up = False  # not reachable: it does not hold the feature back
    assert run(node, "NACK", job_id, "DELAY", 5) == 1
    other.link_up, other.bus_version = True, 4
    # Still active while it waits: a new delay replaces it, a plain
    # ENQUEUE queues it now.
    assert run(node, "ENQUEUE", job_id, "DELAY", 9) == 1
    assert run(node, "ENQUEUE", job_id) == 1
    assert job(node, job_id).state == JobState.QUEUED
