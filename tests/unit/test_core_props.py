"""Hypothesis property tests of the pure core: a state machine driving one
node through random commands and time, a model check of the awake index, and
the scan guarantee of QSCAN/JSCAN."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from disque_trio.core.awake import AwakeIndex
from disque_trio.core.job import Job, JobState
from disque_trio.core.node import Node
from disque_trio.core.queue import Pause
from disque_trio.core.waiters import Waiter
from disque_trio.protocol.replies import NULL_ARRAY, ReplyError

from .core_support import (
    NODE_ID,
    START_MS,
    FakeClock,
    add,
    check_invariants,
    elapse,
    fields,
    make_node,
    run,
    settle,
)

QUEUES = ("q1", "q2", "q3")


@attrs.define
class JobModel:
    """What the test knows about a job it created."""

    queue: str
    created_ms: int
    delay: int
    retry: int
    etime_ms: int
    deliveries: int = 0
    # ENQUEUE/NACK may queue a delayed job early: that is the caller's choice.
    forced: bool = False
    gone: bool = False  # acked, fast-acked or deleted by the client


class CoreMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.node = Node(NODE_ID, self.clock, random.Random(0))
        self.model: dict[str, JobModel] = {}
        self.waiters: list[Waiter] = []  # blocked GETJOB clients, not served yet
        self.served: list[tuple[Any, list[str], int, int]] = []  # replies to check

    @initialize(seed=st.integers(0, 2**32))
    def seed(self, seed: int) -> None:
        self.node = Node(NODE_ID, self.clock, random.Random(seed))

    # ------------------------------------------------------------ commands

    @rule(
        target=ids,
        queue=st.sampled_from(QUEUES),
        delay=st.sampled_from([0, 0, 0, 1, 3]),
        retry=st.sampled_from([None, 0, 1, 2, 5]),
        ttl=st.sampled_from([2, 4, 10, 30, 600]),
        body=st.binary(max_size=4),
    )
    def addjob(self, queue: str, delay: int, retry: int | None, ttl: int, body: bytes) -> Any:
        opts: list[Any] = ["TTL", ttl, "DELAY", delay]
        if retry is not None:
            opts += ["RETRY", retry]
        reply = run(self.node, "ADDJOB", queue, body, 0, *opts)
        if delay >= ttl:
            assert isinstance(reply, ReplyError) and "DELAY" in reply.message
            return multiple()
        if isinstance(reply, ReplyError):
            assert reply.code == "PAUSED"
            return multiple()
        job = self.node.jobs[reply]
        self.model[reply] = JobModel(
            queue, self.clock.ms, delay, job.retry, (self.clock.ms // 1000 + ttl) * 1000
        )
        return reply

    @rule(
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=4), count=st.integers(1, 3)
    )
    def getjob(self, queues: list[str], count: int) -> None:
        reply = run(self.node, "GETJOB", "NOHANG", "COUNT", count, "FROM", *queues)
        if reply is not NULL_ARRAY:
            self._delivered(reply, queues, count)

    @rule(
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3), count=st.integers(1, 2)
    )
    def blocking_getjob(self, queues: list[str], count: int) -> None:
        reply = run(self.node, "GETJOB", "COUNT", count, "FROM", *queues)
        if not isinstance(reply, Waiter):
            self._delivered(reply, queues, count)
            return
        assert reply.queues == tuple(dict.fromkeys(queues))

        def served(waiter: Waiter = reply) -> None:
            # Checked after the rule: ADDJOB serves a waiter before the test
            # has even seen the new job's ID.
            self.waiters.remove(waiter)
            self.served.append((waiter.reply, queues, count, self.clock.ms))

        reply.wake = served
        self.waiters.append(reply)

    @precondition(lambda self: self.waiters)
    @rule(data=st.data())
    def cancel_wait(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(self.waiters))
        self.waiters.remove(waiter)
        self.node.cancel_wait(waiter)
        assert waiter.done and waiter.reply is None

    def _delivered(self, reply: Any, queues: list[str], count: int, now: int = 0) -> None:
        assert isinstance(reply, list) and 1 <= len(reply) <= count
        now = now or self.clock.ms
        for queue, job_id, _body in reply:
            assert queue in queues
            m = self.model[job_id]
            assert not m.gone
            m.deliveries += 1
            if m.retry == 0:
                assert m.deliveries == 1, "RETRY 0 job delivered twice"
            if not m.forced:
                assert now >= m.created_ms + m.delay * 1000, "delivered before DELAY"
            # The original looks at expiry one second after etime at the latest.
            assert now < m.etime_ms + 1000, "delivered after TTL"

    @rule(job_id=ids)
    def ackjob(self, job_id: str) -> None:
        live = self.node.lookup(job_id) is not None
        assert run(self.node, "ACKJOB", job_id) == (1 if live else 0)
        self.model[job_id].gone = True

    @rule(job_id=consumes(ids))
    def fastack(self, job_id: str) -> None:
        live = self.node.lookup(job_id) is not None
        assert run(self.node, "FASTACK", job_id) == (1 if live else 0)
        self.model[job_id].gone = True

    @rule(job_id=ids)
    def deljob(self, job_id: str) -> None:
        live = self.node.lookup(job_id) is not None
        assert run(self.node, "DELJOB", job_id) == (1 if live else 0)
        self.model[job_id].gone = True

    @rule(job_id=ids, nack=st.booleans())
    def enqueue(self, job_id: str, nack: bool) -> None:
        job = self.node.lookup(job_id)
        before = job.nacks if job is not None else 0
        n = run(self.node, "NACK" if nack else "ENQUEUE", job_id)
        if n:
            assert job is not None
            # Queued, or handed at once to a blocked client.
            assert job.state == JobState.QUEUED or self.served
            self.model[job_id].forced = True
            assert job.nacks == before + (1 if nack else 0)

    @rule(job_id=ids)
    def dequeue(self, job_id: str) -> None:
        job = self.node.lookup(job_id)
        was_queued = job is not None and job.state == JobState.QUEUED
        assert run(self.node, "DEQUEUE", job_id) == (1 if was_queued else 0)

    @rule(job_id=ids)
    def working(self, job_id: str) -> None:
        reply = run(self.node, "WORKING", job_id)
        m = self.model[job_id]
        if isinstance(reply, ReplyError):
            assert reply.code in ("NOJOB", "TOOLATE")
            if reply.code == "NOJOB":
                assert self.node.lookup(job_id) is None
        else:
            assert reply == m.retry
            assert self.node.jobs[job_id].state == JobState.ACTIVE

    @rule(queue=st.sampled_from(QUEUES), state=st.sampled_from(["in", "out", "all", "none"]))
    def pause(self, queue: str, state: str) -> None:
        assert run(self.node, "PAUSE", queue, state) == state

    @rule(job_id=ids)
    def show(self, job_id: str) -> None:
        info = fields(run(self.node, "SHOW", job_id))
        job = self.node.lookup(job_id)
        if job is None:
            assert info is None
        else:
            assert info["state"] == job.state.label

    # ---------------------------------------------------------------- time

    @rule(ms=st.sampled_from([1, 100, 499, 500, 501, 1000, 2500, 5000, 12_000]))
    def elapse(self, ms: int) -> None:
        elapse(self.node, self.clock, ms)

    @rule(ms=st.sampled_from([700, 3000, 40_000]))
    def late_tick(self, ms: int) -> None:
        """The timer task ran late: one tick after a long sleep."""
        self.clock.ms += ms
        self.node.tick()
        settle(self.node)  # the shell commits after every tick

    # ---------------------------------------------------------- invariants

    @invariant()
    def core_rules(self) -> None:
        check_invariants(self.node)

    @invariant()
    def only_active_or_queued_on_a_single_node(self) -> None:
        # WAIT_REPL needs peers; ACKED is collected at once when alone.
        for job in self.node.jobs.values():
            assert job.state in (JobState.ACTIVE, JobState.QUEUED)

    @invariant()
    def gone_jobs_never_come_back(self) -> None:
        for job_id, m in self.model.items():
            job = self.node.lookup(job_id)
            if m.gone:
                assert job is None or job.state == JobState.ACKED
            if job is not None:
                # Nothing outlives its TTL by more than the one-second grace
                # (time only moves in rules that run the timers after).
                assert self.clock.ms < m.etime_ms + 1000

    @invariant()
    def served_waiters_got_valid_jobs(self) -> None:
        while self.served:
            reply, queues, count, at = self.served.pop(0)
            self._delivered(reply, queues, count, at)

    @invariant()
    def waiters_wait_only_on_empty_or_paused_queues(self) -> None:
        for waiter in self.waiters:
            assert not waiter.done
            for name in waiter.queues:
                q = self.node.queues[name]
                assert waiter in q.waiters
                assert not q.jobs or q.pause & Pause.OUT

    @invariant()
    def qlen_matches_queued_jobs(self) -> None:
        queued = Counter(j.queue for j in self.node.jobs.values() if j.state == JobState.QUEUED)
        for name in QUEUES:
            assert run(self.node, "QLEN", name) == queued[name]


CoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, database=None
)
TestCoreMachine = CoreMachine.TestCase


# ----------------------------------------------------------- awake index


class TightIndex(AwakeIndex):
    """Compacts after a handful of stale entries, so the tests reach it."""

    COMPACT_SLACK = 3


class AwakeModel(RuleBasedStateMachine):
    """The awake index against a naive dict of job ID -> due time."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, Job] = {}
        self.index = TightIndex(self.jobs.get)
        self.due: dict[str, int] = {}
        self.now = 0

    def _job(self, n: int) -> Job:
        job_id = f"job-{n}"
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = Job(job_id, "q", b"", JobState.ACTIVE)
        return job

    @rule(n=st.integers(0, 12), at=st.integers(1, 60))
    def schedule(self, n: int, at: int) -> None:
        job = self._job(n)
        self.index.schedule(job, self.now + at)
        self.due[job.id] = self.now + at

    @rule(n=st.integers(0, 12))
    def delete(self, n: int) -> None:
        job = self.jobs.get(f"job-{n}")
        if job is not None:
            self.index.unschedule(job)
            del self.jobs[job.id]
            self.due.pop(job.id, None)

    @rule(n=st.integers(0, 12), at=st.integers(1, 60))
    def reregister(self, n: int, at: int) -> None:
        """A new job object under an ID that may still have stale entries."""
        self.delete(n)
        self.schedule(n, at)

    @rule(step=st.integers(0, 30))
    def pop_due(self, step: int) -> None:
        self.now += step
        popped = [(j.awake, j.id) for j in self.index.pop_due(self.now, self.jobs.get)]
        assert all(awake == 0 for awake, _ in popped)  # unindexed as they come out
        popped_ids = [job_id for _, job_id in popped]
        expected = sorted((d, i) for i, d in self.due.items() if d <= self.now)
        assert popped_ids == [i for _, i in expected]
        for job_id in popped_ids:
            del self.due[job_id]
            assert self.jobs[job_id].awake == 0

    @rule(step=st.integers(0, 30), limit=st.integers(0, 5))
    def pop_due_limited(self, step: int, limit: int) -> None:
        """A tick takes at most ``limit`` timers: the earliest ones; the
        others stay due, for the next call."""
        self.now += step
        popped = [j.id for j in self.index.pop_due(self.now, self.jobs.get, limit)]
        expected = sorted((d, i) for i, d in self.due.items() if d <= self.now)
        assert popped == [i for _, i in expected[:limit]]
        for job_id in popped:
            del self.due[job_id]
            assert self.jobs[job_id].awake == 0

    @invariant()
    def agrees_with_model(self) -> None:
        assert len(self.index) == len(self.due)
        expected = min(self.due.values()) if self.due else None
        assert self.index.next_due(self.jobs.get) == expected
        for job_id, job in self.jobs.items():
            assert job.awake == self.due.get(job_id, 0)
        assert self.index.stored <= 2 * len(self.index) + TightIndex.COMPACT_SLACK


AwakeModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, database=None
)
TestAwakeModel = AwakeModel.TestCase


# ------------------------------------------------------------------ scans

_names = st.text(alphabet="abcxyz01", min_size=1, max_size=4)


@given(
    initial=st.sets(_names, max_size=40),
    steps=st.lists(
        st.tuples(st.sets(_names, max_size=5), st.sets(_names, max_size=5)), max_size=30
    ),
    count=st.integers(1, 6),
)
@settings(max_examples=150, deadline=None, database=None)
def test_qscan_returns_every_stable_queue(
    initial: set[str], steps: list[tuple[set[str], set[str]]], count: int
) -> None:
    node, _ = make_node()
    for name in initial:
        node.queue(name)
    stable = set(initial)
    seen: list[str] = []
    cursor = "0"
    for i in range(1000):
        cursor, batch = run(node, "QSCAN", "COUNT", count, cursor)
        seen.extend(batch)
        assert set(batch) <= set(node.queues)  # only what exists now
        if cursor == "0":
            break
        added, removed = steps[i] if i < len(steps) else (set(), set())
        for name in added:
            node.queue(name)
        for name in removed:
            node.queues.pop(name, None)
        stable -= removed
    else:
        raise AssertionError("scan never finished")
    assert stable <= set(seen)


@given(
    n=st.integers(0, 60),
    churn=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200)), max_size=20),
    count=st.integers(1, 8),
)
@settings(max_examples=100, deadline=None, database=None)
def test_jscan_returns_every_stable_job(n: int, churn: list[tuple[int, int]], count: int) -> None:
    node, _ = make_node()
    ids = [add(node, "q") for _ in range(n)]
    stable = set(ids)
    seen: list[str] = []
    cursor = "0"
    for i in range(1000):
        cursor, batch = run(node, "JSCAN", cursor, "COUNT", count)
        seen.extend(batch)
        if cursor == "0":
            break
        adds, victim = churn[i] if i < len(churn) else (0, 0)
        for _ in range(adds):
            ids.append(add(node, "q"))
        if ids and victim % 2:
            gone = ids.pop(victim % len(ids))
            run(node, "DELJOB", gone)
            stable.discard(gone)
    else:
        raise AssertionError("scan never finished")
    assert stable <= set(seen)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None, database=None)
def test_qpeek_and_getjob_follow_ctime(gaps: list[int]) -> None:
    node, clock = make_node()
    ids = []
    for gap in gaps:
        clock.ms += gap
        ids.append(add(node, "q", "b", "RETRY", 0))
    assert [e[1] for e in run(node, "QPEEK", "q", len(ids))] == ids
    assert [e[1] for e in run(node, "QPEEK", "q", -len(ids))] == ids[::-1]
    assert [e[1] for e in run(node, "GETJOB", "COUNT", len(ids), "FROM", "q")] == ids


def test_machine_smoke_with_a_fixed_run() -> None:
    """A deterministic walk through the same rules (fast, no Hypothesis)."""
    node, clock = make_node(seed=5)
    rng = random.Random(5)
    ids: list[str] = []
    for _ in range(400):
        r = rng.random()
        if r < 0.3:
            ids.append(add(node, rng.choice(QUEUES), "b", "TTL", rng.choice([5, 20, 60])))
        elif r < 0.5:
            run(node, "GETJOB", "NOHANG", "COUNT", 2, "FROM", *QUEUES)
        elif r < 0.6 and ids:
            run(node, "NACK", rng.choice(ids))
        elif r < 0.7 and ids:
            run(node, "ACKJOB", rng.choice(ids))
        elif r < 0.75 and ids:
            run(node, "WORKING", rng.choice(ids))
        else:
            elapse(node, clock, rng.choice([100, 900, 2000]))
        check_invariants(node)
    assert clock.ms > START_MS
