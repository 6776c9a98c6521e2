"""Fail-over and the leaving node's hand-over, on cores wired together
(issue 57): what the nodes that survive a lost one do with its jobs."""

from __future__ import annotations

import attrs
import pytest

from disque_trio.core import clusterjobs as cj
from disque_trio.core.cluster import FAIL, LEAVING
from disque_trio.core.job import JobState
from disque_trio.core.node import Node
from disque_trio.core.waiters import Waiter
from disque_trio.protocol import bus

from .core_support import FakeClock, elapse, fields, get, make_node, run, sent, settle

A_ID = "a1" * 20
B_ID = "b2" * 20
C_ID = "c3" * 20


class Wired:
    """Cores that know each other, links up, and a pump that carries their
    bus messages (a stand-in for the shell; nothing is lost unless told)."""

    def __init__(self, *node_ids: str) -> None:
        self.clock = FakeClock()
        self.nodes: dict[str, Node] = {}
        for seed, node_id in enumerate(node_ids):
            node, _ = make_node(seed=seed, node_id=node_id)
            node.clock = self.clock  # one wall clock for all
            self.nodes[node_id] = node
        for node in self.nodes.values():
            for i, other in enumerate(node_ids):
                if other != node.node_id:
                    peer = node.cluster.add(other, "127.0.0.1", 7711 + i, 17711 + i)
                    assert peer is not None
                    peer.link_up = True
                    peer.bus_version = bus.PROTOCOL_VERSION
            node.refresh_cluster_view()
        self.down: set[str] = set()

    def pump(self) -> list[object]:
        seen: list[object] = []
        while any(sent(n) for n in self.nodes.values()):
            for sender, node in self.nodes.items():
                out = sent(node)
                node.effects.clear()
                if sender in self.down:
                    continue
                for to, msg in out:
                    if to in self.nodes and to not in self.down:
                        seen.append(msg)
                        cj.receive(self.nodes[to], sender, msg)
                        settle(self.nodes[to])  # the delivery tasks' rounds
        return seen

    def elapse(self, ms: int) -> None:
        """Let ``ms`` pass on every live node, in steps of 100 ms (a cron
        period), carrying the messages at each step."""
        for _ in range(ms // 100):
            for node_id, node in self.nodes.items():
                if node_id not in self.down:
                    start = self.clock.ms
                    elapse(node, self.clock, 100)
                    node.cron()
                    self.clock.ms = start
            self.clock.ms += 100
            self.pump()

    def lose(self, node_id: str) -> None:
        """The node is killed, and every other node marks it FAIL."""
        self.down.add(node_id)
        for other_id, node in self.nodes.items():
            if other_id not in self.down:
                node.cluster.nodes[node_id].flags |= FAIL
                node.cluster.lost[node_id] = None
                node.refresh_cluster_view()
        self.pump()

    def queued_on(self) -> dict[str, list[str]]:
        """Node ID -> the job IDs it has queued."""
        return {
            node_id: sorted(j.id for j in node.jobs.values() if j.state == JobState.QUEUED)
            for node_id, node in self.nodes.items()
            if node_id not in self.down
        }


def _leaving(node: Node) -> None:
    node.cluster.set_leaving(True)
    node.refresh_cluster_view()
    assert node.leaving


def test_a_retry_0_job_added_on_a_leaving_node_is_queued_by_its_holder() -> None:
    """Two nodes, the first leaving: its ADDJOB RETRY 0 REPLICATE 1 was
    answered, and the copy on the other node stayed active for ever."""
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 0, "REPLICATE", 1)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str) and job_id.startswith("D-"), waiter.reply
    assert job_id not in a.jobs  # a leaving node keeps no copy
    [delivered] = get(b, "q")
    assert delivered[1] == job_id
    w.elapse(5000)
    assert get(b, "q") == []  # at most once


def test_a_retry_0_job_with_a_delay_added_on_a_leaving_node_is_queued_after_it() -> None:
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 0, "REPLICATE", 1, "DELAY", 2)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str), job_id
    assert b.jobs[job_id].state == JobState.ACTIVE
    w.elapse(1500)
    assert get(b, "q") == []  # not before the delay
    w.elapse(1000)
    [delivered] = get(b, "q")
    assert delivered[1] == job_id
    w.elapse(5000)
    assert get(b, "q") == []


def test_a_delayed_job_added_on_a_leaving_node_is_queued_after_the_delay() -> None:
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 30, "REPLICATE", 1, "DELAY", 2)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str), job_id
    w.elapse(1500)
    assert get(b, "q") == []
    w.elapse(1000)
    [delivered] = get(b, "q")
    assert delivered[1] == job_id


def _three_with_jobs(count: int, *opts: object) -> tuple[Wired, list[str]]:
    """Three nodes; ``count`` jobs added on A with REPLICATE 3 RETRY 3600,
    queued there, copies on B and C."""
    w = Wired(A_ID, B_ID, C_ID)
    a = w.nodes[A_ID]
    ids = []
    for i in range(count):
        waiter = run(a, "ADDJOB", "q", f"job {i}", 0, "REPLICATE", 3, "RETRY", 3600, *opts)
        assert isinstance(waiter, Waiter)
        w.pump()
        ids.append(waiter.reply)
    assert all(isinstance(job_id, str) and job_id in a.jobs for job_id in ids), ids
    for node_id in (B_ID, C_ID):
        for job_id in ids:
            assert w.nodes[node_id].jobs[job_id].queued_on == A_ID
    return w, ids


def test_the_jobs_a_lost_node_had_queued_are_queued_once_by_a_survivor_at_once() -> None:
    w, ids = _three_with_jobs(20)
    w.lose(A_ID)
    queued = w.queued_on()
    # Each job is queued on exactly one survivor, and both take some.
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(ids)
    assert queued[B_ID] and queued[C_ID]
    # The other one stood down (the QUEUED came): its re-queue is a RETRY away.
    for node_id, other in ((B_ID, C_ID), (C_ID, B_ID)):
        for job_id in queued[node_id]:
            copy = w.nodes[other].jobs[job_id]
            assert copy.state == JobState.ACTIVE and copy.queued_on == node_id
            assert copy.qtime - w.clock.ms > 3_500_000
    w.elapse(5000)
    taken = get(w.nodes[B_ID], "q", count=100) + get(w.nodes[C_ID], "q", count=100)
    assert sorted(entry[1] for entry in taken) == sorted(ids)
    # Counted as what it is: a first delivery, not an additional one.
    info = fields(run(w.nodes[B_ID], "SHOW", ids[0]))
    assert info["additional-deliveries"] == 0


def test_jobs_the_lost_node_handed_to_consumers_wait_for_their_retry() -> None:
    w, ids = _three_with_jobs(10)
    a = w.nodes[A_ID]
    delivered = [entry[1] for entry in get(a, "q", count=4)]
    w.elapse(200)  # its cron tells the other holders (DELIVERED)
    for node_id in (B_ID, C_ID):
        for job_id in delivered:
            copy = w.nodes[node_id].jobs[job_id]
            assert copy.queued_on is None
            assert copy.qtime - w.clock.ms > 3_500_000  # RETRY from the delivery
    w.lose(A_ID)
    w.elapse(5000)
    queued = w.queued_on()
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(set(ids) - set(delivered))


def test_the_other_holders_hear_of_a_delivery_at_the_next_cron() -> None:
    w, _ = _three_with_jobs(3)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    [entry] = get(a, "q")
    assert sent(a) == []
    a.cron()
    told = {to for to, m in sent(a) if m == bus.Delivered(entry[1])}
    assert told == {B_ID, C_ID}
    w.pump()
    copy = b.jobs[entry[1]]
    assert copy.queued_on is None and copy.qtime - w.clock.ms > 3_500_000
    w.lose(A_ID)
    w.elapse(3000)
    queued = w.queued_on()
    assert entry[1] not in queued[B_ID] + queued[C_ID]


def test_a_job_acked_within_the_cron_period_costs_the_holders_nothing() -> None:
    w, _ = _three_with_jobs(3)
    a = w.nodes[A_ID]
    [entry] = get(a, "q")
    assert run(a, "ACKJOB", entry[1]) == 1
    a.cron()
    messages = w.pump()
    assert not any(isinstance(m, bus.Delivered | bus.Working) for m in messages)


def test_a_node_of_the_release_before_hears_working_for_a_delivery() -> None:
    w, _ = _three_with_jobs(1)
    a = w.nodes[A_ID]
    a.cluster.nodes[C_ID].bus_version = bus.HAVEJOBS_VERSION - 1
    assert len(get(a, "q")) == 1
    a.cron()
    assert sorted((to, type(m).__name__) for to, m in sent(a)) == [
        (B_ID, "Delivered"),
        (C_ID, "Working"),
    ]


def test_a_delivered_copy_wakes_at_its_old_time_and_moves_on() -> None:
    """DELIVERED files no timer again: the copy's timer, set for the old
    re-queue time, wakes then and waits for the new one."""
    w, _ = _three_with_jobs(1)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    w.elapse(2000)
    [entry] = get(a, "q")
    a.cron()
    w.pump()
    copy = b.jobs[entry[1]]
    assert copy.awake < copy.qtime - 500
    w.clock.ms = copy.awake
    b.tick()
    assert copy.state == JobState.ACTIVE and copy.awake >= copy.qtime - 600


def test_a_restarted_holder_is_taken_for_lost() -> None:
    """Killed and started again within the node timeout, it is never marked
    FAIL, and its queues are gone: its next heartbeat, from a new
    incarnation, has the survivors take its jobs over."""
    w, ids = _three_with_jobs(6)
    b = w.nodes[B_ID]
    w.down.add(A_ID)  # its new process holds nothing: what it hears goes nowhere
    first = bus.Ping(A_ID, 5 << bus.INCARNATION_SHIFT, ())
    b.cluster.on_heartbeat(first, w.clock.ms)
    b.refresh_cluster_view()
    assert not b.cluster.lost
    b.cluster.on_heartbeat(bus.Ping(A_ID, 5 << bus.INCARNATION_SHIFT, ()), w.clock.ms)
    b.refresh_cluster_view()
    assert w.queued_on()[B_ID] == []  # the same one: nothing happens
    b.cluster.on_heartbeat(bus.Ping(A_ID, 9 << bus.INCARNATION_SHIFT, ()), w.clock.ms)
    b.refresh_cluster_view()
    w.pump()
    assert all(b.jobs[job_id].queued_on != A_ID for job_id in ids)
    w.elapse(1500)  # C knows nothing of the restart: B's standby ends too
    queued = w.queued_on()
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(ids)


def test_a_survivor_standing_by_queues_the_job_when_the_chosen_one_cannot() -> None:
    w, ids = _three_with_jobs(10)
    b, c = w.nodes[B_ID], w.nodes[C_ID]
    # B alone hears of the loss; C, frozen, never queues anything.
    w.down.add(A_ID)
    w.down.add(C_ID)
    b.cluster.nodes[A_ID].flags |= FAIL
    b.cluster.lost[A_ID] = None
    b.refresh_cluster_view()
    w.pump()
    taken_at_once = len(w.queued_on()[B_ID])
    assert 0 < taken_at_once < len(ids)  # C was chosen for some
    w.elapse(cj.FAILOVER_STANDBY_MS + 200)
    assert sorted(w.queued_on()[B_ID]) == sorted(ids)
    assert all(c.jobs[job_id].state == JobState.ACTIVE for job_id in ids)


def test_survivors_standing_by_for_one_that_cannot_queue_the_job_one_at_a_time() -> None:
    """Four holders; the one chosen for a job has not flagged the loss. The
    two others stand by a second, the second a stagger more, so one of them
    queues it and the other hears its QUEUED first: never both at once (simulator seed
    232603168: both stood by a second and queued it together)."""
    d_id = "d4" * 20
    w = Wired(A_ID, B_ID, C_ID, d_id)
    a = w.nodes[A_ID]
    ids = []
    for i in range(30):
        waiter = run(a, "ADDJOB", "q", f"job {i}", 0, "REPLICATE", 4, "RETRY", 3600)
        assert isinstance(waiter, Waiter)
        w.pump()
        ids.append(waiter.reply)
    w.down.add(A_ID)
    for node_id in (C_ID, d_id):  # B, frozen, never hears of the loss
        node = w.nodes[node_id]
        node.cluster.nodes[A_ID].flags |= FAIL
        node.cluster.lost[A_ID] = None
        node.refresh_cluster_view()
    w.down.add(B_ID)
    w.pump()
    b = w.nodes[B_ID]
    chosen_b = [
        job_id
        for job_id in ids
        if max((B_ID, C_ID, d_id), key=lambda h: cj._id_mix(h, job_id)) == B_ID
    ]
    assert chosen_b  # some jobs wait for B
    c, d = w.nodes[C_ID], w.nodes[d_id]
    for job_id in chosen_b:
        # One stands by a second, the other a stagger more: never due
        # together, and both within 2 s of the loss.
        c_at, d_at = c.jobs[job_id].qtime, d.jobs[job_id].qtime
        assert abs(c_at - d_at) >= cj.FAILOVER_STAGGER_MS, (job_id, c_at, d_at)
        assert max(c_at, d_at) - w.clock.ms <= 2000
    for _ in range(40):
        w.elapse(100)
        queued = w.queued_on()
        for job_id in ids:
            assert not (job_id in queued[C_ID] and job_id in queued[d_id]), job_id
    queued = w.queued_on()
    assert sorted(queued[C_ID] + queued[d_id]) == sorted(ids)
    assert all(b.jobs[job_id].state == JobState.ACTIVE for job_id in ids)


def test_a_leaving_holder_stands_by_after_one_not_told_it_leaves() -> None:
    """Three holders; C leaves, and B has not heard so when A is lost. For a
    job B ranks C first, B stands by a second; C, leaving, ranks itself
    after B, one stagger later: B queues it and C hears its QUEUED first
    (simulator seed 753342: both ranked second and queued it together)."""
    w, ids = _three_with_jobs(30)
    b, c = w.nodes[B_ID], w.nodes[C_ID]
    _leaving(c)
    assert not b.cluster.nodes[C_ID].flags & LEAVING
    w.lose(A_ID)
    for_c = [job_id for job_id in ids if cj._id_mix(C_ID, job_id) > cj._id_mix(B_ID, job_id)]
    assert for_c  # B waits for C for some
    for job_id in for_c:
        b_at, c_at = b.jobs[job_id].qtime, c.jobs[job_id].qtime
        assert c_at - b_at >= cj.FAILOVER_STAGGER_MS, (job_id, b_at, c_at)
        assert c_at - w.clock.ms <= 2000
    for _ in range(25):
        w.elapse(100)
        queued = w.queued_on()
        for job_id in ids:
            assert not (job_id in queued[B_ID] and job_id in queued[C_ID]), job_id
    assert sorted(w.queued_on()[B_ID]) == sorted(ids)


def test_a_delayed_job_of_a_lost_node_is_queued_at_the_end_of_its_delay() -> None:
    w, ids = _three_with_jobs(4, "DELAY", 5)
    w.elapse(1000)
    w.lose(A_ID)
    w.elapse(3000)
    assert w.queued_on() == {B_ID: [], C_ID: []}
    w.elapse(1500)
    queued = w.queued_on()
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(ids)


def test_a_consumer_on_another_node_hears_of_a_job_at_once_however_long_it_waited() -> None:
    w = Wired(A_ID, B_ID, C_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    waiter = run(b, "GETJOB", "FROM", "q")
    assert isinstance(waiter, Waiter)
    for _ in range(100):  # 10 s: B's NEEDJOBS broadcast backs off
        w.elapse(100)
        cj.need_jobs(b, "q")
        w.pump()
    assert b.queues["q"].needjobs_bcast_attempt >= 2
    job_id = run(a, "ADDJOB", "q", "hello", 0, "REPLICATE", 1)
    messages = w.pump()
    # Then B tells A it queued the copy A gave (as after any YOURJOBS), and,
    # its queue drained by its consumer, asks A for more (as it always did).
    kinds = [type(m) for m in messages]
    assert kinds == [bus.HaveJobs, bus.NeedJobs, bus.YourJobs, bus.Queued, bus.NeedJobs]
    assert waiter.done and waiter.reply[0][1] == job_id


def test_a_node_whose_consumers_left_ignores_havejobs() -> None:
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    waiter = run(b, "GETJOB", "TIMEOUT", 100, "FROM", "q")
    assert isinstance(waiter, Waiter)
    cj.need_jobs(b, "q")
    w.pump()
    b.cancel_wait(waiter)  # it timed out
    messages = []
    for i in range(5):  # five jobs in one go: one HAVEJOBS
        run(a, "ADDJOB", "q", f"job {i}", 0, "REPLICATE", 1)
        messages += w.pump()
    assert [type(m) for m in messages] == [bus.HaveJobs]
    assert len(a.queues["q"].jobs) == 5
    # The interest goes after INTEREST_MS.
    w.elapse(cj.INTEREST_MS + 200)
    assert a.interest == {}


def test_a_peer_whose_link_comes_up_hears_needjobs_for_the_queues_waited_on() -> None:
    w = Wired(A_ID, B_ID)
    b = w.nodes[B_ID]
    waiter = run(b, "GETJOB", "FROM", "q", "r")
    assert isinstance(waiter, Waiter)
    b.effects.clear()
    b.cluster.link_changed(A_ID, True, w.clock.ms)
    b.refresh_cluster_view()
    asked = sorted(m.queue for to, m in sent(b) if isinstance(m, bus.NeedJobs) and to == A_ID)
    assert asked == ["q", "r"]


def test_a_consumer_that_moved_keeps_its_job_from_being_taken_over() -> None:
    """A's consumer holds a job; A is killed before its next cron told the
    others (DELIVERED): the client sends WORKING to B, which then neither
    queues it nor lets C take it over."""
    w, ids = _three_with_jobs(3)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    [entry] = get(a, "q")
    held = entry[1]
    w.down.add(A_ID)  # killed: its delivery untold
    assert run(b, "WORKING", held) == 3600
    w.pump()
    w.lose(A_ID)
    w.elapse(3000)
    queued = w.queued_on()
    assert held not in queued[B_ID] + queued[C_ID]
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(set(ids) - {held})


def test_havejobs_between_two_getjobs_makes_the_next_one_ask_at_once() -> None:
    """A consumer in a GETJOB loop is not blocked when HAVEJOBS comes: its
    node remembers the sender as a source, and asks it as soon as the
    consumer blocks again."""
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    waiter = run(b, "GETJOB", "TIMEOUT", 100, "FROM", "q")
    assert isinstance(waiter, Waiter)
    cj.need_jobs(b, "q")
    w.pump()
    b.cancel_wait(waiter)
    job_id = run(a, "ADDJOB", "q", "hello", 0, "REPLICATE", 1)
    w.pump()  # HAVEJOBS, ignored for now
    assert job_id in a.jobs and a.jobs[job_id].state == JobState.QUEUED
    waiter = run(b, "GETJOB", "TIMEOUT", 1000, "FROM", "q")
    assert isinstance(waiter, Waiter)
    w.clock.ms += 30
    cj.need_jobs(b, "q")  # its delivery task, at the first deadline
    w.pump()
    assert waiter.done and waiter.reply[0][1] == job_id


def test_addjob_without_replicate_counts_the_nodes_not_leaving() -> None:
    """Three nodes, one leaving for a rolling restart: the default REPLICATE
    is 2, not 3 (which no node could give: every ADDJOB was -NOREPL)."""
    w = Wired(A_ID, B_ID, C_ID)
    a, c = w.nodes[A_ID], w.nodes[C_ID]
    waiter = run(a, "ADDJOB", "q", "three", 0)
    w.pump()
    assert a.jobs[waiter.reply].repl == 3
    a.cluster.nodes[C_ID].flags |= LEAVING
    a.refresh_cluster_view()
    waiter = run(a, "ADDJOB", "q", "two", 0)
    w.pump()
    assert isinstance(waiter.reply, str) and a.jobs[waiter.reply].repl == 2
    _leaving(c)  # the leaving node itself: two others take its copies
    waiter = run(c, "ADDJOB", "q", "from the leaving one", 0)
    w.pump()
    assert isinstance(waiter.reply, str), waiter.reply
    assert sum(waiter.reply in n.jobs for n in (w.nodes[A_ID], w.nodes[B_ID])) == 2


def test_a_setack_for_a_job_not_held_refuses_its_late_copy() -> None:
    """Seed 2400: a RETRY 0 job added on a leaving node went to B (its
    REPLJOB held back by a one-way cut) and to C, which queued, delivered
    and acked it. B answered the SETACK before its copy came and the DELJOB
    was lost: the late REPLJOB left B a copy that never announces itself
    (at most once), held until its TTL."""
    w = Wired(A_ID, B_ID, C_ID)
    b = w.nodes[B_ID]
    job_id = "D-a1a1a1a1-" + "x" * 24 + "-05a0"
    cj.receive(b, C_ID, bus.SetAck(job_id, 2))
    assert sent(b) == [(C_ID, bus.GotAck(job_id, False))]
    b.effects.clear()
    data = bus.JobData(job_id, "q", b"late", 1, 0, 3600, 0, 0, 0, 0, (B_ID, C_ID))
    cj.receive(b, A_ID, bus.ReplJob(data, False))
    assert job_id not in b.jobs
    assert sent(b) == [(A_ID, bus.SetAck(job_id, 0))]


def test_cluster_forget_takes_over_what_the_node_had_queued() -> None:
    w, ids = _three_with_jobs(4)
    w.down.add(A_ID)  # never marked FAIL here: forgotten by the operator
    for node_id in (B_ID, C_ID):
        w.nodes[node_id].forget_node(A_ID)
    w.pump()
    queued = w.queued_on()
    assert sorted(queued[B_ID] + queued[C_ID]) == sorted(ids)


def test_a_retry_0_job_moved_onto_an_extra_copy_is_delivered() -> None:
    """Seed 6752: a leaving node added a RETRY 0 job; its first GOTJOB was
    slow, so it sent one more REPLJOB (to B) and then ENQUEUEd the job on
    C. A NEEDJOBS from B moved the job there: B dropped it as a duplicate
    of its copy, and the job, answered, was never delivered."""
    w = Wired(A_ID, B_ID, C_ID)
    a, b, c = w.nodes[A_ID], w.nodes[B_ID], w.nodes[C_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "once", 0, "RETRY", 0, "REPLICATE", 1)
    [(first, repljob)] = [(to, m) for to, m in sent(a) if isinstance(m, bus.ReplJob)]
    second = B_ID if first == C_ID else C_ID
    a.effects.clear()
    w.clock.ms += 60  # no GOTJOB yet: one more node
    a.tick()
    extra = [(to, m) for to, m in sent(a) if isinstance(m, bus.ReplJob) and to == second]
    assert extra
    a.effects.clear()
    cj.receive(w.nodes[second], A_ID, extra[0][1])  # the extra copy, passive
    w.nodes[second].effects.clear()
    cj.receive(w.nodes[first], A_ID, repljob)  # the first copy answers GOTJOB
    w.pump()  # GOTJOB, ENQUEUE: queued on the first holder
    job_id = waiter.reply
    assert w.nodes[first].jobs[job_id].state == JobState.QUEUED
    assert w.nodes[second].jobs[job_id].state == JobState.ACTIVE
    cj.receive(w.nodes[first], second, bus.NeedJobs("q", 1))
    w.pump()  # YOURJOBS: moved onto the extra copy
    [delivered] = get(w.nodes[second], "q")
    assert delivered[1] == job_id
    w.elapse(3000)
    assert get(b, "q") == [] and get(c, "q") == []  # at most once


def test_a_willqueue_for_a_job_a_consumer_here_has_is_answered_delivered() -> None:
    """A holder that never heard of the delivery (its list lacked the
    delivering node: a wipe, a partition) sends WILLQUEUE at its retry
    point; the node whose consumer has the job answers DELIVERED, and the
    sender pushes its re-queue by RETRY instead of queueing the job again
    (simulator seed 721927: delivered again 3 s into a RETRY of 22)."""
    w, _ = _three_with_jobs(1)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    [entry] = get(a, "q")
    job_id = entry[1]
    a.effects.clear()  # the DELIVERED of the next cron never reaches B
    before = b.jobs[job_id].qtime
    cj.receive(a, B_ID, bus.WillQueue(job_id))
    assert (B_ID, bus.Delivered(job_id)) in sent(a)
    w.pump()
    assert b.jobs[job_id].qtime > before  # pushed: no re-queue now
    # Queued again (its RETRY here ran out, or another holder queued it),
    # the copy no longer answers for a consumer.
    a.enqueue(a.jobs[job_id])
    a.effects.clear()
    a.dequeue(a.jobs[job_id])
    a.effects.clear()
    cj.receive(a, B_ID, bus.WillQueue(job_id))
    assert not any(isinstance(m, bus.Delivered) for _, m in sent(a))


@pytest.mark.parametrize("receiver_flushed", [False, True])
def test_a_copy_moved_by_a_late_yourjobs_is_dequeued_for_a_consumer_elsewhere(
    receiver_flushed: bool,
) -> None:
    """A and B both queue the job at its retry point. A gives its copy to C
    (NEEDJOBS) just before B's QUEUED, which would have dequeued it, comes;
    B hands the job to a consumer and tells DELIVERED; the YOURJOBS reaches
    C later, and C queues the job. B answers C's QUEUED with DELIVERED and
    C takes its copy out of the queue: delivered again there, 1.3 s into a
    RETRY of 37, in simulator seed 791906 (C, flushed by DEBUG FLUSHALL,
    knew nothing of the job when the DELIVERED came)."""
    w, [job_id] = _three_with_jobs(1)
    a, b, c = w.nodes[A_ID], w.nodes[B_ID], w.nodes[C_ID]
    if receiver_flushed:
        c.flush_all()
    cj.receive(a, C_ID, bus.NeedJobs("q", 1))
    [yourjobs] = [m for to, m in sent(a) if isinstance(m, bus.YourJobs) and to == C_ID]
    a.effects.clear()  # held back on its way to C
    assert a.jobs[job_id].state == JobState.ACTIVE
    assert b.enqueue(b.jobs[job_id])  # B's own retry point
    w.pump()
    [entry] = get(b, "q")
    assert entry[1] == job_id
    b.cron()  # DELIVERED to A and C
    w.pump()
    cj.receive(c, A_ID, yourjobs)
    settle(c)
    assert c.jobs[job_id].state == JobState.QUEUED
    w.pump()  # C's QUEUED; B answers DELIVERED
    assert w.queued_on() == {A_ID: [], B_ID: [], C_ID: []}
    assert get(c, "q") == []
    copy = c.jobs[job_id]
    assert copy.queued_on is None and copy.qtime - w.clock.ms > 3_500_000
    # B's copy is untouched: its consumer's RETRY stands.
    assert b.jobs[job_id].state == JobState.ACTIVE
    # A client's NACK on C (a QUEUED that counts) is not answered: the job
    # is queued there, given back.
    assert run(c, "NACK", job_id) == 1
    w.pump()
    assert w.queued_on()[C_ID] == [job_id]


def test_a_copy_loaded_after_a_restart_answers_for_no_consumer() -> None:
    """What a consumer had does not outlive the process: the flag is not
    written to the AOF."""
    from disque_trio.core.job import FLAG_DELIVERED, FLAG_HANDED
    from disque_trio.core.records import job_record

    w, _ = _three_with_jobs(1)
    a = w.nodes[A_ID]
    [entry] = get(a, "q")
    job = a.jobs[entry[1]]
    assert job.flags & FLAG_HANDED
    record = job_record(job)
    assert record.flags & FLAG_DELIVERED and not record.flags & FLAG_HANDED


def test_a_peer_that_linked_before_our_consumers_waited_is_asked_once_they_do() -> None:
    """B's consumers start waiting after A restarted (its link came up
    while nobody waited here), long after B's last NEEDJOBS broadcast, with
    C as a source (answered before): A is asked at once, so that it tells B
    of its next job (HAVEJOBS) instead of B learning at its broadcast
    back-off, up to 30 s later (simulator seed 722689)."""
    w = Wired(A_ID, B_ID, C_ID)
    b = w.nodes[B_ID]
    run(b, "GETJOB", "NOHANG", "FROM", "q")  # nothing, and a NEEDJOBS broadcast
    assert b.queue("q").needjobs_bcast_ms == w.clock.ms
    w.elapse(200)
    b.queue("q").needjobs_responders[C_ID] = w.clock.ms // 1000
    b.cluster.link_changed(A_ID, False, w.clock.ms)  # A restarted: linked again
    b.cluster.link_changed(A_ID, True, w.clock.ms)
    b.refresh_cluster_view()
    assert b.linked_at[A_ID] > b.queue("q").needjobs_bcast_seq
    w.clock.ms -= 5000  # and the clock steps back (see below)
    b.now_ms()
    b.follow_clock()
    b.effects.clear()
    waiter = run(b, "GETJOB", "FROM", "q")
    assert isinstance(waiter, Waiter)
    asked = [to for to, m in sent(b) if isinstance(m, bus.NeedJobs)]
    assert A_ID in asked
    # Once: the next round asks the sources only, until the next broadcast,
    # even after the clock stepped back (a count, not a time: a step back
    # once made the restarted peer look unasked for ever, a NEEDJOBS per
    # scheduler pass).
    due = cj.needjobs_due(b, "q")
    assert due is None or due > b.now_ms()
    b.effects.clear()
    cj.need_jobs(b, "q")
    assert A_ID not in [to for to, m in sent(b) if isinstance(m, bus.NeedJobs)]
    # A job queued on A now is announced to B at once.
    w.pump()
    added = run(w.nodes[A_ID], "ADDJOB", "q", "x", 0, "REPLICATE", 1)
    assert isinstance(added, str)
    told = [to for to, m in sent(w.nodes[A_ID]) if isinstance(m, bus.HaveJobs)]
    assert told == [B_ID]


def test_a_job_given_back_with_a_delay_is_not_answered_delivered() -> None:
    """NACK DELAY here, or a POSTPONE from the holder a client asked: the
    consumer no longer has it, and a WILLQUEUE must not push the sender's
    requeue a RETRY past the delay (simulator seed 730332)."""
    w, _ = _three_with_jobs(1)
    a = w.nodes[A_ID]
    [entry] = get(a, "q")
    job_id = entry[1]
    assert run(a, "NACK", job_id, "DELAY", 1) == 1
    a.effects.clear()
    cj.receive(a, B_ID, bus.WillQueue(job_id))
    answers = [m for to, m in sent(a) if to == B_ID]
    assert not any(isinstance(m, bus.Delivered) for m in answers)
    assert any(isinstance(m, bus.Postpone) for m in answers)
    # A POSTPONE from another holder (its client asked there) clears it too.
    w2, _ = _three_with_jobs(1)
    a2 = w2.nodes[A_ID]
    [entry2] = get(a2, "q")
    cj.receive(a2, C_ID, bus.Postpone(entry2[1], 1000, bus.FLAG_INCR_NACKS))
    a2.effects.clear()
    cj.receive(a2, B_ID, bus.WillQueue(entry2[1]))
    assert not any(isinstance(m, bus.Delivered) for _, m in sent(a2))


@pytest.mark.parametrize("crossed", [False, True])
def test_a_nack_delay_on_another_node_than_the_delivering_one_keeps_its_delay(
    crossed: bool,
) -> None:
    """A job delivered by A and given back with NACK DELAY 1 through B (a
    client's connection to another node): A's DELIVERED, sent at its next
    cron, or already on its way when B's POSTPONE reached A (``crossed``),
    must not push B's requeue a RETRY past the delay (Dramatiq's retries on
    three nodes came after the RETRY, not the 1 s back-off)."""
    w, [job_id] = _three_with_jobs(1)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    [entry] = get(a, "q")
    assert entry[1] == job_id
    if crossed:
        a.tell_deliveries()  # sent before it heard the POSTPONE
        told = sent(a)
        a.effects.clear()
    assert run(b, "NACK", job_id, "DELAY", 1) == 1
    w.pump()
    if crossed:
        for to, msg in told:
            cj.receive(w.nodes[to], A_ID, msg)
            settle(w.nodes[to])
        w.pump()
    w.elapse(1500)
    queued = w.queued_on()
    assert [n for n, ids in queued.items() if job_id in ids] == [B_ID]


@pytest.mark.parametrize("relayed_after", [False, True])
def test_the_delay_owners_yourjobs_at_its_end_is_queued_by_a_holder_standing_by(
    relayed_after: bool,
) -> None:
    """B stands by for a NACK DELAY 1 asked on A, told by A and relayed by C
    a few ms later. At the delay's end A queues the job and gives it to B
    by YOURJOBS: B queues it. Taken for a copy from the delay (the relayed
    POSTPONE ends 3 ms after A's), it stayed active on every holder and
    queued nowhere until its RETRY (Dramatiq's retries on three nodes)."""
    w, [job_id] = _three_with_jobs(1)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    cj.receive(b, A_ID, bus.Postpone(job_id, 1000, bus.FLAG_INCR_NACKS))
    if relayed_after:
        w.clock.ms += 3
        cj.receive(b, C_ID, bus.Postpone(job_id, 1000, bus.FLAG_RELAYED))
        w.clock.ms += 997
    else:
        w.clock.ms += 1000
    # A counted the NACK its client sent before its POSTPONE went.
    data = attrs.evolve(cj.job_data(a.jobs[job_id], w.clock.ms), nacks=1)
    cj.receive(b, A_ID, bus.YourJobs((data,)))
    settle(b)
    assert b.jobs[job_id].state == JobState.QUEUED
    # From a third holder, within the delay, it still stands by.
    w2, [job2] = _three_with_jobs(1)
    a2, b2 = w2.nodes[A_ID], w2.nodes[B_ID]
    cj.receive(b2, A_ID, bus.Postpone(job2, 1000, bus.FLAG_INCR_NACKS))
    w2.clock.ms += 500
    cj.receive(b2, C_ID, bus.YourJobs((cj.job_data(a2.jobs[job2], w2.clock.ms),)))
    settle(b2)
    assert b2.jobs[job2].state == JobState.ACTIVE


def test_a_pause_bcast_reaches_a_leaving_node_and_a_failing_one() -> None:
    """A leaving node still serves its queued jobs: PAUSE out BCAST must
    reach it (simulator seed 802408: the node made leaving a moment before
    kept serving the queue). The original sends it to every node it knows."""
    w = Wired(A_ID, B_ID, C_ID)
    a = w.nodes[A_ID]
    a.cluster.nodes[B_ID].flags |= LEAVING
    a.cluster.nodes[C_ID].flags |= FAIL
    assert run(a, "PAUSE", "q", "out", "BCAST") == "out"
    pauses = {to: m for to, m in sent(a) if isinstance(m, bus.Pause)}
    assert pauses == {B_ID: bus.Pause("q", 2), C_ID: bus.Pause("q", 2)}
