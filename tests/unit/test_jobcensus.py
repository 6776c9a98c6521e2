"""The dashboard's job census (server/jobcensus.py): jobs by state, the
jobs a node counts for the cluster (each job on one of its holders, so
that the nodes' counts add up to jobs, not copies), and the jobs waiting
to be queued again after their RETRY or a client's delay."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio.core.job import (
    FLAG_BCAST_QUEUED,
    FLAG_DELAYED,
    TIME_ERROR_MS,
    Job,
    JobState,
)
from disque_trio.core.node import Node
from disque_trio.server import jobcensus
from disque_trio.server.jobcensus import Requeue
from disque_trio.server.observe import NodeView

from .core_support import START_MS, add, get, make_node, run

# Node IDs in their order: A < B < C < D.
A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)
NOBODY: frozenset[str] = frozenset()


def job_copy(
    node: Node,
    n: int,
    holders: tuple[str, ...],
    state: JobState = JobState.QUEUED,
    *,
    queue: str = "q",
    qtime: int = 0,
    flags: int = FLAG_BCAST_QUEUED,
    queued_on: str | None = None,
) -> Job:
    """A copy of job number ``n`` on ``node``, as the core leaves one."""
    job = Job(f"D-{n:038d}", queue, b"body", state, len(holders), retry=60)
    job.nodes_delivered = holders
    job.qtime = qtime
    job.flags = flags
    job.queued_on = queued_on
    node.jobs[job.id] = job
    return job


def test_one_node_counts_its_jobs_and_the_ones_a_consumer_holds() -> None:
    node, clock = make_node()
    queued = add(node, "q", "a", "RETRY", 60)
    delivered = add(node, "q", "b", "RETRY", 30)
    add(node, "once", "c", "RETRY", 0)
    # GETJOB hands out the oldest first: "a", then "b", and the RETRY 0 job.
    run(node, "GETJOB", "COUNT", 2, "FROM", "q")
    get(node, "once")
    run(node, "ENQUEUE", queued)  # given back at once: queued again
    census = jobcensus.take(node, NOBODY)
    assert census.states == {"queued": 1, "active": 2, "acked": 0, "wait_repl": 0}
    assert census.total == 3 and census.jobs == 3
    # "b" comes back after its RETRY (give or take the core's time error); the
    # RETRY 0 job never does: it is not waiting for anything.
    assert list(census.mine) == ["q"]
    waiting = census.mine["q"]
    assert waiting.jobs == 1
    assert abs(waiting.next_ms - clock.ms - 30_000) <= TIME_ERROR_MS
    assert census.counted == census.mine
    assert node.jobs[delivered].qtime == waiting.next_ms


def test_a_delay_and_a_delayed_add_wait_to_be_queued() -> None:
    node, clock = make_node()
    nacked = add(node, "q", "a", "RETRY", 60)
    get(node, "q")
    run(node, "NACK", nacked, "DELAY", 5)
    add(node, "later", "b", "DELAY", 20, "RETRY", 60)
    census = jobcensus.take(node, NOBODY)
    assert census.mine == {
        "q": Requeue(1, clock.ms + 5_000),
        "later": Requeue(1, clock.ms + 20_000),
    }
    assert census.counted == census.mine
    run(node, "ACKJOB", nacked)  # acked: waits for nothing any more
    assert list(jobcensus.take(node, NOBODY).mine) == ["later"]


def test_each_job_is_counted_by_its_lowest_holder_that_can_answer() -> None:
    node, _ = make_node(node_id=B)
    job_copy(node, 1, (B,))
    job_copy(node, 2, (A, B), JobState.ACTIVE)  # A counts it
    job_copy(node, 3, (B, C), JobState.ACTIVE)  # we do
    job_copy(node, 4, (C, A, B), JobState.ACKED)  # A, in any order
    dummy = job_copy(node, 5, (), JobState.ACKED)  # an ack of a job never held
    assert dummy.is_dummy_ack
    census = jobcensus.take(node, frozenset({A, C}))
    assert census.total == 5 and census.jobs == 2
    # A cannot answer (link down, or failing): we count its jobs too.
    assert jobcensus.take(node, frozenset({C})).jobs == 4
    assert jobcensus.take(node, NOBODY).jobs == 4


def test_a_waiting_job_is_counted_once_for_the_cluster() -> None:
    """A consumer holds a job: every holder's copy waits for the RETRY,
    the job is counted by the holder that counts the job. A client's delay
    or a delayed ADDJOB: the node that queues it counts it, the others
    stand by for it (their copy names it as the one that queues it)."""
    node, _ = make_node(node_id=B)
    later = START_MS + 40_000
    active = JobState.ACTIVE
    # A consumer holds each: counted by A, or by us.
    job_copy(node, 1, (A, B), active, qtime=later)
    job_copy(node, 2, (B, C), active, qtime=later + 1)
    # Queued on C, as its QUEUED said: waiting for nothing.
    job_copy(node, 3, (B, C), active, qtime=later, queued_on=C)
    # Our client's NACK DELAY (FLAG_DELAYED), though A counts the job.
    job_copy(node, 4, (A, B), active, qtime=later + 2, flags=FLAG_BCAST_QUEUED | FLAG_DELAYED)
    # Added here with a DELAY, never queued yet (A stands by for us).
    job_copy(node, 5, (A, B), active, qtime=later + 3, flags=0)
    # A client of A's asked for a delay (A's POSTPONE): A counts it.
    job_copy(node, 6, (A, B), active, qtime=later + 9_000, queued_on=A)
    census = jobcensus.take(node, frozenset({A, C}))
    assert census.mine == {"q": Requeue(4, later)}  # 1, 2, 4, 5
    assert census.counted == {"q": Requeue(3, later + 1)}  # 2, 4, 5
    # A is gone: we stand in for it, and its POSTPONE counts no more.
    census = jobcensus.take(node, frozenset({C}))
    assert census.mine == {"q": Requeue(5, later)}  # and 6
    assert census.counted == census.mine


def test_a_queue_this_node_has_not_is_listed_for_its_waiting_jobs() -> None:
    """The ``stats`` event lists, after the node's queues, the queues it
    holds waiting jobs of without a queue of that name (a copy replicated
    here, whose consumer is on another node): no age, no idle time."""
    node, clock = make_node(node_id=B)
    add(node, "here", "a")
    job_copy(node, 1, (A, B), JobState.ACTIVE, queue="elsewhere", qtime=clock.ms + 7_000)
    server = SimpleNamespace(node=node, env=SimpleNamespace(clock=clock))
    view = NodeView(server)  # type: ignore[arg-type]
    rows = view.queue_rows(clock.ms)
    assert [r["name"] for r in rows] == ["elsewhere", "here"]
    assert rows[0] == {
        "name": "elsewhere",
        "len": 0,
        "age": None,
        "idle": None,
        "blocked": 0,
        "import_rate": 0,
        "jobs_in": 0,
        "jobs_out": 0,
        "pause": "none",
        "requeue": {"jobs": 1, "next_in_ms": 7_000},
    }
    assert rows[1]["len"] == 1 and rows[1]["requeue"] is None
    # No room left: the node's own queues come first.
    assert [r["name"] for r in view.queue_rows(clock.ms, limit=1)] == ["here"]


def test_queues_with_the_most_jobs_waiting() -> None:
    waiting = {"a": Requeue(1, 5), "b": Requeue(3, 9), "c": Requeue(3, 1)}
    assert jobcensus.longest(waiting, 2) == [("b", Requeue(3, 9)), ("c", Requeue(3, 1))]


NODES = (A, B, C, D)
holder_lists = st.lists(
    st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True).map(tuple),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(holder_lists, st.sets(st.sampled_from(NODES)))
def test_the_nodes_counts_add_up_to_the_jobs(jobs: list[tuple[str, ...]], dead: set[str]) -> None:
    """Whatever the jobs' holders, and whichever nodes are dead (every live
    node knows), the live nodes' counts add up to the jobs that have a live
    holder: each is counted once, whatever order its holders are listed in."""
    nodes = {node_id: make_node(node_id=node_id)[0] for node_id in NODES}
    for n, holders in enumerate(jobs):
        for holder in holders:
            job_copy(nodes[holder], n, holders)
    alive = frozenset(NODES) - dead
    counted = sum(
        jobcensus.take(nodes[node_id], alive - {node_id}).jobs for node_id in sorted(alive)
    )
    assert counted == sum(1 for holders in jobs if alive & set(holders))
