"""What users observe (issue #45): the rewrite comparison's model of a
load, the node's always rules, the BUGGIFY knobs' share of plans."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from disque_trio.core import always
from disque_trio.core.job import FLAG_DELAYED, Job, JobState
from disque_trio.protocol import aof
from sim.observing import compare_loads, load_model
from sim.plan import Plan

NOW_MS = 1_700_000_000_000
ID = "D-0badcafe-" + "A" * 24 + "-05a1"
DUMMY = "D-0badcafe-" + "B" * 24 + "-0003"
AT_MOST_ONCE = "D-0badcafe-" + "C" * 24 + "-05a0"


def record(job_id: str = ID, **changes: object) -> aof.JobRecord:
    rec = aof.JobRecord(
        job_id, "q", b"body", int(JobState.ACTIVE), 2, 1, NOW_MS // 1000 + 60, 0, 5, 0, 0, (), 0, 0
    )
    return attrs.evolve(rec, **changes)


def test_the_load_model_follows_the_file_format() -> None:
    data = b"".join(
        (
            aof.loadjob(record(nacks=1)),
            aof.loadjob(record(nacks=2, deliveries=1)),  # a later LOADJOB replaces
            aof.ackjob(DUMMY),  # an ID not held: a dummy ack
            aof.ackjob(AT_MOST_ONCE),  # but never for an at-most-once ID
            aof.loadjob(record("D-0badcafe-" + "D" * 24 + "-05a1", etime=NOW_MS // 1000)),
            aof.loadjob(record("D-0badcafe-" + "E" * 24 + "-05a1")),
            aof.deljob("D-0badcafe-" + "E" * 24 + "-05a1"),
        )
    )
    jobs = load_model(data, NOW_MS)
    assert sorted(jobs) == [ID, DUMMY]
    assert (jobs[ID].nacks, jobs[ID].deliveries, jobs[ID].acked) == (2, 1, False)
    assert jobs[DUMMY].acked and jobs[DUMMY].body is None


def test_a_rewrite_that_drops_state_is_named() -> None:
    delayed = record(flags=FLAG_DELAYED, qtime=NOW_MS + 3000, nacks=1)
    old = load_model(aof.loadjob(delayed) + aof.ackjob(DUMMY), NOW_MS)
    assert compare_loads(old, load_model(aof.loadjob(delayed) + aof.ackjob(DUMMY), NOW_MS)) == []
    worse = load_model(aof.loadjob(attrs.evolve(delayed, flags=0, nacks=0)), NOW_MS)
    assert compare_loads(old, worse) == [
        f"{ID} counters 1/0 -> 0/0",
        f"{ID} DELAY until {NOW_MS + 3000} -> 0",
        f"dummy ack {DUMMY} gone",
    ]
    # A delay the node gave up in memory (it stands by for another
    # holder's) writes no record: the rewrite is not bound to it.
    held = Job(ID, "q", b"body", JobState.ACTIVE)
    held.qtime = NOW_MS + 9000
    lost_delay = load_model(aof.loadjob(attrs.evolve(delayed, flags=0)), NOW_MS)
    assert compare_loads(old, lost_delay, {ID: held}) == [f"dummy ack {DUMMY} gone"]
    # Acked before, it stays acked.
    acked = load_model(aof.loadjob(delayed) + aof.ackjob(ID), NOW_MS)
    assert compare_loads(acked, old) == [f"{ID} acked before, not after"]


def test_a_job_expired_before_the_clock_went_back_is_not_owed() -> None:
    # Seed 554398: the node dropped an expired job at its load, then its
    # clock jumped back, inside the job's TTL, while it rewrote its AOF.
    etime = NOW_MS // 1000 + 5
    old = load_model(aof.loadjob(record(etime=etime)), NOW_MS)
    assert compare_loads(old, {}, {}) == [f"job {ID} gone"]
    assert compare_loads(old, {}, {}, high_ms=etime * 1000 + 1) == []
    # Still held in memory, or not expired by the latest reading: owed.
    held = Job(ID, "q", b"body", JobState.ACTIVE)
    assert compare_loads(old, {}, {ID: held}, high_ms=etime * 1000 + 1) == [f"job {ID} gone"]
    assert compare_loads(old, {}, {}, high_ms=etime * 1000 - 1) == [f"job {ID} gone"]


def test_the_sim_clock_remembers_its_latest_reading_across_a_jump_back() -> None:
    from sim.world import SimClock

    async def main() -> None:
        clock = SimClock(1_000_000)
        await trio.sleep(2)
        before = clock.wall_ms()
        clock.jump(-6000)
        assert clock.wall_ms() == before - 6000
        assert clock.high_ms() == before
        clock.jump(+6000)
        await trio.sleep(1)
        assert clock.high_ms() == clock.wall_ms() == before + 1000

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_always_rules_report_only_when_enabled() -> None:
    broken: list[str] = []
    always.enable(broken.append)
    try:
        from tests.unit.core_support import add, make_node

        node, _ = make_node()
        job_id = add(node, "q", "x", "RETRY", 0)
        job = node.jobs[job_id]
        always.check_node(node, "n0")
        assert broken == []
        node.acked_jobs[job_id] = None  # the index says acked, the job is not
        always.check_node(node, "n0")
        assert broken and broken[0].startswith("always-acked-indexed: n0")
        broken.clear()
        job.nodes_delivered = (node.node_id, "b" * 40)
        job.nodes_confirmed = (node.node_id,)
        always.on_event(node, "n0", "ack-collected", job)
        assert broken[0].startswith("always-collect-after-confirms")
    finally:
        always.disable()
    assert not always.ENABLED and always.REPORT is None
    always._broken("always-acked-indexed", "not reported when off")


def test_a_share_of_plans_turn_each_knob() -> None:
    plans = [Plan.from_seed(seed) for seed in range(1, 201)]
    for knob in ("crash_after_ack", "slow_yourjobs", "rewrite_often"):
        share = sum(1 for p in plans if getattr(p, knob)) / len(plans)
        assert 0.1 <= share <= 0.3, (knob, share)
