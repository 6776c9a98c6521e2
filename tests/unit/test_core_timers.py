"""Timers driven by the awake index: DELAY, RETRY, RETRY 0, TTL expiry, ack
collection, idle queue eviction, and the index's own bookkeeping."""

from __future__ import annotations

import itertools

import pytest

from disque_trio.core.awake import AwakeIndex
from disque_trio.core.effects import Persist
from disque_trio.core.job import FLAG_BCAST_WILLQUEUE, Job, JobState
from disque_trio.core.node import (
    CHATTER_GRID_MS,
    TICK_MAX_TIMERS,
    WILLQUEUE_ADVANCE_MS,
    chatter_slot_end,
)
from disque_trio.core.queue import QUEUE_MAX_IDLE_SECONDS
from disque_trio.protocol import aof

from .core_support import (
    NODE_ID,
    OTHER_ID,
    START_MS,
    add,
    check_invariants,
    elapse,
    fields,
    get,
    hook,
    job,
    make_node,
    run,
    tick_at,
    timed_entries,
)


def test_empty_node_has_no_deadline() -> None:
    node, _ = make_node()
    assert node.next_deadline() is None
    node.tick()  # nothing to do, nothing breaks
    assert node.next_deadline() is None


def test_a_tick_runs_at_most_its_share_of_timers_and_leaves_the_rest_due() -> None:
    """Jobs added in a burst with one DELAY fall due together: one tick
    runs TICK_MAX_TIMERS of them (the earliest), the others stay due, and
    the next ticks take them (a node with half a million such timers sat in
    one tick for minutes: no client served, no PING answered, no SIGTERM)."""
    node, clock = make_node()
    count = 2 * TICK_MAX_TIMERS + 500
    for i in range(count):
        add(node, "q", f"body-{i}", "DELAY", 1)
    clock.ms += 1000
    node.tick()
    assert run(node, "QLEN", "q") == TICK_MAX_TIMERS
    deadline = node.next_deadline()
    assert deadline is not None and deadline <= node.now_ms()  # more, now
    node.tick()
    node.tick()
    assert run(node, "QLEN", "q") == count
    deadline = node.next_deadline()
    assert deadline is None or deadline > node.now_ms()
    check_invariants(node)


def test_next_deadline_never_after_a_job_timer() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 10)
    elapse(node, clock, 1)
    due = node.next_deadline()
    assert due is not None and due <= job(node, a).awake


def test_idle_queue_eviction_is_a_timer_in_the_awake_index() -> None:
    node, clock = make_node()
    node.queue("idle")
    # No periodic sweep: the only deadline is the queue's own eviction time.
    assert node.next_deadline() == START_MS + QUEUE_MAX_IDLE_SECONDS * 1000
    elapse(node, clock, QUEUE_MAX_IDLE_SECONDS * 1000)
    assert "idle" not in node.queues and node.next_deadline() is None


# ------------------------------------------------------------------- DELAY


def test_delay_queues_after_delay() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 5)
    assert job(node, a).awake == START_MS + 5000
    elapse(node, clock, 4999)
    assert run(node, "QLEN", "q") == 0 and job(node, a).state == JobState.ACTIVE
    elapse(node, clock, 1)
    assert run(node, "QLEN", "q") == 1 and job(node, a).state == JobState.QUEUED
    assert job(node, a).deliveries == 0  # the first queueing is not a re-delivery
    check_invariants(node)


def test_delay_with_retry_zero_is_queued_once() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 2, "RETRY", 0, "TTL", 100)
    elapse(node, clock, 2000)
    assert get(node, "q") == [["q", a, b"b"]]
    assert job(node, a).qtime == 0
    elapse(node, clock, 90_000)
    assert run(node, "QLEN", "q") == 0
    check_invariants(node)


def test_late_tick_still_queues_delayed_job() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 5)
    tick_at(node, clock, START_MS + 60_000)  # one late timer run
    assert job(node, a).state == JobState.QUEUED


# ------------------------------------------------------------------- RETRY


def test_retry_requeues_unacked_delivered_job(monkeypatch: pytest.MonkeyPatch) -> None:
    node, clock = make_node()
    willqueue: list[int] = []
    queued: list[tuple[str, bool]] = []
    hook(monkeypatch, node, "send_willqueue", lambda j: willqueue.append(clock.ms))
    hook(monkeypatch, node, "broadcast_queued", lambda j, nack: queued.append((j.id, nack)))
    a = add(node, "q", "b", "RETRY", 10)
    get(node, "q")
    qtime = job(node, a).qtime
    assert abs(qtime - (START_MS + 10_000)) <= 250  # spread by the time error
    elapse(node, clock, qtime - clock.ms - 1)
    assert job(node, a).state == JobState.ACTIVE and run(node, "QLEN", "q") == 0
    # Announced 500 ms before, at the end of that moment's chatter slot.
    assert willqueue == [chatter_slot_end(qtime - WILLQUEUE_ADVANCE_MS)]
    elapse(node, clock, 1)
    assert job(node, a).state == JobState.QUEUED
    assert fields(run(node, "SHOW", a))["additional-deliveries"] == 1
    assert queued == [(a, False)]
    assert run(node, "GETJOB", "WITHCOUNTERS", "FROM", "q") == [
        ["q", a, b"b", "nacks", 0, "additional-deliveries", 1]
    ]
    # And again, RETRY seconds after the re-queue.
    elapse(node, clock, 10_300)
    assert job(node, a).deliveries == 2
    check_invariants(node)


def test_chatter_timers_wait_for_the_end_of_their_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A WILLQUEUE due and a queued job's retry point run at the end of their
    chatter slot, never before they are due, so the jobs due in one slot
    share one wake-up (one commit, one write per peer); the re-queue of a
    delivered job keeps its own millisecond."""
    node, clock = make_node()
    willqueue: list[int] = []
    hook(monkeypatch, node, "send_willqueue", lambda j: willqueue.append(clock.ms))
    ids = [add(node, "q", f"b{i}", "RETRY", 10) for i in range(40)]
    jobs = [job(node, i) for i in ids]
    # Queued here: the advance does nothing but is on the grid too.
    for j in jobs:
        assert j.awake == chatter_slot_end(j.qtime - WILLQUEUE_ADVANCE_MS)
        assert j.awake % CHATTER_GRID_MS == 0 and 0 <= j.awake - (j.qtime - 500) < CHATTER_GRID_MS
    # 40 jobs spread by the time error (500 ms) share at most 6 wake-ups.
    assert len({j.awake for j in jobs}) <= 6
    first = min(j.awake for j in jobs)
    tick_at(node, clock, first - 1)
    assert all(j.flags & FLAG_BCAST_WILLQUEUE for j in jobs)  # nothing ran early
    elapse(node, clock, first + WILLQUEUE_ADVANCE_MS + CHATTER_GRID_MS - clock.ms)
    # The retry points of the first slot ran at its end: the next one pushed.
    pushed = [j for j in jobs if j.qtime > clock.ms + 9000]
    assert pushed and all(j.state == JobState.QUEUED for j in jobs)
    for j in jobs:
        assert j.awake % CHATTER_GRID_MS == 0 and j.awake >= min(j.qtime - 500, j.qtime)
    # A delivered copy: the WILLQUEUE on the grid, the re-queue on time.
    node2, clock2 = make_node()
    sent: list[int] = []
    hook(monkeypatch, node2, "send_willqueue", lambda j: sent.append(clock2.ms))
    a = add(node2, "q", "b", "RETRY", 10)
    get(node2, "q")
    j = job(node2, a)
    qtime = j.qtime
    elapse(node2, clock2, qtime - clock2.ms - 1)
    assert sent == [chatter_slot_end(qtime - WILLQUEUE_ADVANCE_MS)]
    assert j.state == JobState.ACTIVE and j.awake == qtime
    elapse(node2, clock2, 1)
    assert j.state == JobState.QUEUED and clock2.ms == qtime
    check_invariants(node)
    check_invariants(node2)


def test_retry_while_still_queued_keeps_it_and_pushes_timer() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 10)
    elapse(node, clock, 35_000)
    j = job(node, a)
    assert j.state == JobState.QUEUED and j.deliveries == 0
    assert j.qtime > clock.ms
    assert node.queues["q"].jobs_in == 1
    check_invariants(node)


def test_retry_zero_job_never_requeued_after_delivery() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 0, "TTL", 600)
    assert job(node, a).qtime == 0
    get(node, "q")
    for _ in range(20):
        elapse(node, clock, 29_000)
        assert run(node, "QLEN", "q") == 0
        check_invariants(node)
    assert job(node, a).state == JobState.ACTIVE and job(node, a).deliveries == 0
    elapse(node, clock, 30_000)
    assert a not in node.jobs  # until the TTL removes it


def test_working_pushes_requeue() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 10, "TTL", 600)
    get(node, "q")
    for _ in range(5):
        elapse(node, clock, 8000)
        assert run(node, "WORKING", a) == 10
    assert job(node, a).state == JobState.ACTIVE and job(node, a).deliveries == 0
    elapse(node, clock, 10_300)
    assert job(node, a).state == JobState.QUEUED and job(node, a).deliveries == 1


def test_paused_in_postpones_retry_requeue() -> None:
    node, clock = make_node()
    seen: list[tuple[str, str]] = []
    node.observers.append(lambda event, j: seen.append((event, j.id)))
    a = add(node, "q", "b", "RETRY", 5)
    get(node, "q")
    run(node, "PAUSE", "q", "in")
    elapse(node, clock, 20_000)
    j = job(node, a)
    assert j.state == JobState.ACTIVE and j.deliveries == 0
    # Told to observers (the simulator's failover-timely does not expect it queued).
    assert ("requeue-paused", a) in seen
    assert j.qtime > clock.ms  # pushed, not dropped
    run(node, "PAUSE", "q", "none")
    elapse(node, clock, 5300)
    assert job(node, a).state == JobState.QUEUED and j.deliveries == 1
    check_invariants(node)


def test_paused_in_still_queues_delayed_retry_zero_job() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 3, "RETRY", 0)
    run(node, "PAUSE", "q", "in")
    elapse(node, clock, 3000)
    # Otherwise it would be leaked: nobody else will ever queue it.
    assert job(node, a).state == JobState.QUEUED


def test_paused_out_does_not_stop_requeue() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 5)
    get(node, "q")
    run(node, "PAUSE", "q", "out")
    elapse(node, clock, 5300)
    assert job(node, a).state == JobState.QUEUED
    assert run(node, "GETJOB", "NOHANG", "FROM", "q") is not None


# --------------------------------------------------------------------- TTL


def test_ttl_expiry_deletes_jobs_in_any_state() -> None:
    node, clock = make_node()
    queued = add(node, "q", "b", "TTL", 10)
    delivered = add(node, "q", "b", "TTL", 10)
    run(node, "GETJOB", "FROM", "q")  # takes `queued`, the oldest
    delayed = add(node, "q", "b", "TTL", 10, "DELAY", 9)
    retry0 = add(node, "r", "b", "TTL", 10, "RETRY", 0)
    keeper = add(node, "q", "b", "TTL", 100)
    elapse(node, clock, 9_999)
    assert {queued, delivered, delayed, retry0} <= set(node.jobs)
    # Expiry is looked at one second after etime at the latest (sooner when
    # another timer of the job fires after etime), like the original.
    elapse(node, clock, 1_001)
    assert set(node.jobs) == {keeper}
    assert node.stats.expired_jobs == 4
    assert run(node, "QLEN", "q") == 1 and run(node, "QLEN", "r") == 0
    check_invariants(node)


def test_ttl_expiry_with_a_single_late_tick() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "TTL", 10, "RETRY", 3)
    get(node, "q")
    tick_at(node, clock, START_MS + 30_000)
    assert a not in node.jobs and run(node, "QLEN", "q") == 0
    check_invariants(node)


def test_ttl_expiry_of_blocked_queue_leaves_waiters_alone() -> None:
    node, clock = make_node()
    add(node, "q", "b", "TTL", 5)
    waiter = run(node, "GETJOB", "FROM", "other")
    elapse(node, clock, 7000)
    assert not node.jobs and not waiter.done
    node.cancel_wait(waiter)


# ------------------------------------------------- wall clock stepping back

STEP_BACK_MS = 47_500  # the simulator's seed 5043: n0's clock went back 47.5 s


def test_backward_clock_step_keeps_the_time_left_on_local_timers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 3 s DELAY job was still waiting 50 s later, after the drain phase
    (sim seed 5043): its queue time stayed in the old frame, 47.5 s ahead."""
    node, clock = make_node()
    setacks: list[int] = []
    hook(monkeypatch, node, "send_setack", lambda j: setacks.append(clock.ms))
    delayed = add(node, "q", "b", "DELAY", 3, "TTL", 100)
    retried = add(node, "r", "b", "RETRY", 10)
    assert get(node, "r") == [["r", retried, b"b"]]
    node.cluster_size = 2
    acked = add(node, "a", "b", "REPLICATE", 1, "TTL", 3600)
    job(node, acked).nodes_delivered = (NODE_ID, OTHER_ID)
    run(node, "ACKJOB", acked)  # first SETACK now, next one about 1 s later
    imported = node.queue("imp")
    imported.count_import(clock.ms)
    etime = job(node, delayed).etime
    qtime, awake = job(node, retried).qtime, job(node, acked).awake
    elapse(node, clock, 900)
    rate = imported.import_rate(node.now_ms())

    clock.ms -= STEP_BACK_MS
    # Absorbed until the next timer run: node time does not go back.
    assert node.now_ms() == START_MS + 900
    node.tick()
    assert node.now_ms() == clock.ms
    assert job(node, retried).qtime == qtime - STEP_BACK_MS
    assert job(node, acked).awake == awake - STEP_BACK_MS
    # The TTL is a lifetime: the expire time moves by the step's whole
    # seconds (the half second left over waits for the next step).
    assert job(node, delayed).etime == etime - STEP_BACK_MS // 1000
    assert node.etime_shift_s == STEP_BACK_MS // 1000
    assert imported.import_rate(node.now_ms()) == rate  # used to soar (negative window)
    check_invariants(node)

    elapse(node, clock, 2099)
    assert job(node, delayed).state == JobState.ACTIVE
    elapse(node, clock, 1)  # 3 s after ADDJOB by the node's reckoning
    assert job(node, delayed).state == JobState.QUEUED
    assert len(setacks) >= 2 and setacks[1] < START_MS  # collection retried meanwhile
    elapse(node, clock, qtime - START_MS - 3000)
    assert job(node, retried).state == JobState.QUEUED
    check_invariants(node)


def test_a_backward_step_keeps_the_time_left_to_live_and_records_it() -> None:
    """Simulator seed 172070: a copy taken (TTL left added to the node's
    clock), then the clock stepped 62.5 s back. With its expire time left
    put, the copy lived 62.5 s past its TTL, and was handed by YOURJOBS to
    a node whose 60 s tombstone of it had just aged."""
    node, clock = make_node()
    node.persisting = True
    a = add(node, "q", "b", "TTL", 4)
    b = add(node, "q", "b", "TTL", 100)
    etimes = job(node, a).etime, job(node, b).etime
    node.effects.clear()
    elapse(node, clock, 1000)
    clock.jump(-62_500)
    node.now_ms()  # read by the next command or timer: the step is absorbed
    node.tick()  # and followed
    assert (job(node, a).etime, job(node, b).etime) == (etimes[0] - 62, etimes[1] - 62)
    # The moved times go to the AOF in one record batch: a restart keeps them.
    persisted = [e.record for e in node.effects if isinstance(e, Persist)]
    assert len(persisted) == 1
    recs = [rec for _, _, (name, rec) in aof.records(persisted[0]) if name == aof.LOADJOB]
    reloaded = {rec.id: rec.etime for rec in recs if isinstance(rec, aof.JobRecord)}
    assert reloaded == {a: etimes[0] - 62, b: etimes[1] - 62}
    # Its timer runs a second after the expire time (as without a step):
    # 5.6 s after ADDJOB by elapsed time, not 62 s later, the job is gone.
    elapse(node, clock, 4_600)
    assert a not in node.jobs and b in node.jobs
    check_invariants(node)
    # The half second carries: two more steps of 0.3 s make the next whole
    # second; a step under one whole second records nothing.
    node.effects.clear()
    clock.jump(-300)
    node.now_ms()
    node.tick()
    assert job(node, b).etime == etimes[1] - 62
    assert not [e for e in node.effects if isinstance(e, Persist)]
    clock.jump(-300)
    node.now_ms()
    node.tick()
    assert job(node, b).etime == etimes[1] - 63
    assert node.etime_shift_s == 63


def test_timer_set_before_the_clock_is_followed_is_moved_too() -> None:
    """Between the step and the next tick/cron the node keeps the old frame:
    a DELAY set then is moved with the rest, not held or fired early."""
    node, clock = make_node()
    elapse(node, clock, 1000)
    clock.ms -= STEP_BACK_MS
    a = add(node, "q", "b", "DELAY", 2)  # node time: START_MS + 1000
    assert job(node, a).qtime == START_MS + 3000
    node.cron()
    assert job(node, a).qtime == clock.ms + 2000
    elapse(node, clock, 1999)
    assert job(node, a).state == JobState.ACTIVE
    elapse(node, clock, 1)
    assert job(node, a).state == JobState.QUEUED
    check_invariants(node)


# ------------------------------------------------------------- ack collection


def test_acked_job_collection_backs_off_until_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    node, clock = make_node()
    node.cluster_size = 2
    setacks: list[int] = []
    hook(monkeypatch, node, "send_setack", lambda j: setacks.append(clock.ms))
    a = add(node, "q", "b", "REPLICATE", 1, "TTL", 3600)
    job(node, a).nodes_delivered = (NODE_ID, OTHER_ID)
    run(node, "ACKJOB", a)
    assert len(setacks) == 1
    elapse(node, clock, 600_000)
    gaps = [b - a for a, b in itertools.pairwise(setacks)]
    assert gaps and all(g <= 180_250 for g in gaps)  # capped at 3 minutes (+ jitter)
    assert gaps[0] < gaps[-1]  # exponential back-off
    assert job(node, a).state == JobState.ACKED
    job(node, a).nodes_confirmed = (NODE_ID, OTHER_ID)  # GOTACK from the other node
    elapse(node, clock, 180_300)
    assert a not in node.jobs
    check_invariants(node)


def test_dummy_ack_expires_with_the_ttl_in_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    node, clock = make_node()
    node.cluster_size = 2
    hook(monkeypatch, node, "send_setack", lambda j: None)
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"  # 3 minutes
    run(node, "ACKJOB", unknown)
    elapse(node, clock, 170_000)
    assert unknown in node.jobs
    elapse(node, clock, 12_000)
    assert unknown not in node.jobs


def test_dummy_ack_dropped_when_cluster_shrinks_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    node, clock = make_node()
    node.cluster_size = 2
    hook(monkeypatch, node, "send_setack", lambda j: None)
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0101"
    run(node, "ACKJOB", unknown)
    node.cluster_size = 1
    elapse(node, clock, 2000)
    assert unknown not in node.jobs


# ---------------------------------------------------------- queue eviction


def test_idle_empty_queue_evicted_after_300s() -> None:
    node, clock = make_node()
    add(node, "q", "b", "RETRY", 0)
    get(node, "q")  # last access now, queue empty for good (job active)
    assert run(node, "QSTAT", "q") is not None
    elapse(node, clock, (QUEUE_MAX_IDLE_SECONDS - 1) * 1000)
    assert "q" in node.queues
    elapse(node, clock, 2000)
    assert "q" not in node.queues
    assert run(node, "QSTAT", "q") is not None  # NULL_ARRAY, i.e. unknown
    assert run(node, "QLEN", "q") == 0


def test_queue_not_evicted_with_jobs_pause_or_waiters() -> None:
    node, clock = make_node()
    add(node, "withjobs", "b", "RETRY", 0, "TTL", 3600)
    run(node, "PAUSE", "paused", "in")
    run(node, "PAUSE", "pausedout", "out")
    waiter = run(node, "GETJOB", "FROM", "waited")
    node.queue("idle")
    elapse(node, clock, 600_000)
    assert set(node.queues) == {"withjobs", "paused", "pausedout", "waited"}
    node.cancel_wait(waiter)
    run(node, "PAUSE", "paused", "none")
    elapse(node, clock, 1000)
    # Waiting and pausing are no access: both are idle long enough already.
    assert set(node.queues) == {"withjobs", "pausedout"}


def test_evicted_queue_recreated_on_demand() -> None:
    node, clock = make_node()
    node.queue("q")
    elapse(node, clock, 301_000)
    assert "q" not in node.queues
    a = add(node)
    assert get(node, "q")[0][1] == a
    stat = fields(run(node, "QSTAT", "q"))
    assert stat["jobs-in"] == 1 and stat["age"] == 0


# -------------------------------------------------------------- awake index


def test_awake_index_bounded_over_many_reschedules() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "RETRY", 30)
    others = [add(node, "other") for _ in range(10)]
    for _ in range(5000):  # no timer comes due: only updates compact
        get(node, "q")
        run(node, "NACK", a)
        run(node, "WORKING", a)
        run(node, "ENQUEUE", a)
    assert len(node.jobs) == 11 and len(node.awake) == timed_entries(node)
    assert node.awake.stored <= 2 * len(node.awake) + AwakeIndex.COMPACT_SLACK
    check_invariants(node)
    assert all(job(node, o).awake for o in others)


def test_awake_index_bounded_when_jobs_are_deleted_without_ticks() -> None:
    node, _ = make_node()
    ids = [add(node) for _ in range(5000)]
    run(node, "DELJOB", *ids[:4990])
    assert len(node.jobs) == 10 and len(node.awake) == timed_entries(node)
    assert node.awake.stored <= 2 * len(node.awake) + AwakeIndex.COMPACT_SLACK
    check_invariants(node)


def test_awake_index_ticks_survive_compaction() -> None:
    node, clock = make_node()
    ids = [add(node, "q", "b", "RETRY", 5) for _ in range(3000)]
    get(node, "q", count=3000)
    run(node, "DELJOB", *ids[:2500])  # compacts on the way
    elapse(node, clock, 5300)
    assert all(job(node, i).state == JobState.QUEUED for i in ids[2500:])
    check_invariants(node)


def test_reregistered_id_does_not_double_fire() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 5)
    old = job(node, a)
    run(node, "DELJOB", a)
    clone = Job(a, "q", b"b", JobState.ACTIVE, ctime=old.ctime, etime=old.etime, delay=5)
    clone.qtime = old.qtime
    clone.nodes_delivered = old.nodes_delivered
    node.register(clone)  # same ID, same due time as the stale heap entry
    assert clone.awake == old.qtime
    elapse(node, clock, 5000)
    assert clone.state == JobState.QUEUED and node.queues["q"].jobs_in == 1
    check_invariants(node)


def test_flush_all() -> None:
    node, _ = make_node()
    add(node)
    waiter = run(node, "GETJOB", "FROM", "other")
    node.flush_all()
    assert not node.jobs and not node.queues and len(node.awake) == 0
    assert waiter.done and waiter.reply is None
    assert node.next_deadline() is None
    check_invariants(node)


def test_jobs_due_on_the_same_millisecond_share_a_group_and_int_objects() -> None:
    """Memory per queued job: timers are grouped by due time (one list slot
    per job, not a tuple), and equal due, re-queue and expire times are one
    int object (issue: RSS per job at most the original's)."""
    node, clock = make_node()
    ids = []
    for i in range(3000):
        ids.append(add(node, "q", "b", "RETRY", 60))
        if i % 30 == 29:
            clock.ms += 1  # 30 jobs per millisecond, as under load
    jobs = [job(node, i) for i in ids]
    for attr in ("awake", "qtime", "etime"):
        values = {getattr(j, attr) for j in jobs}
        objects = {id(getattr(j, attr)) for j in jobs}
        assert len(objects) == len(values), attr  # one object per value
    dues = {j.awake for j in jobs}
    assert len(dues) < len(jobs) // 2  # jitter spreads them; many still share
    assert node.awake.stored == len(node.awake) == timed_entries(node)
    # Due in order, by ID within one due time, each job once.
    clock.ms += 61_000
    node.tick()
    check_invariants(node)
    assert all(j.awake for j in jobs)  # re-armed: still queued, next retry point
