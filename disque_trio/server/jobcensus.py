"""A census of the jobs a node holds, for the dashboard: jobs by state,
the jobs this node counts for the cluster, and the jobs that wait to be
queued again. One pass over the jobs, no I/O (``observe.NodeView`` caches
it, so its cost is bounded as for the count by state it always was).

Jobs, not copies
----------------
With REPLICATE 3 a job has three copies, one on each of its holders, and
each holder counts its own: the nodes' figures added up count copies.
Counting jobs means counting each job on one of its holders only, and the
holders must agree which one without talking about it, or the asker would
need every job ID of every node (unbounded). The rule: **a job is counted
by its holder with the lowest node ID among the holders that can answer**,
the counting node itself and the nodes it has a link up to and does not
mark PFAIL or FAIL. Every holder knows the job's holders (its
``nodes_delivered``: REPLJOB carries the list, and a holder learned later
is told), so while the nodes agree on who can answer, exactly one holder
counts each job, and the asker adds one number per node (``NODEFIGURES``'s
``jobs``): a bounded answer, whatever the cluster holds.

Where that count is not exact, and why it is good enough for a dashboard:

- While the nodes do not agree on who can answer: in the seconds after a
  node died (until every link to it is down, which takes a connection
  reset for a killed process, and the census is taken again) or during a
  one-way partition, a job may be counted twice, or by nobody.
- A holder listed that keeps no copy (a REPLJOB lost for good, a copy
  collected after an ack before the others were): the job is counted by
  nobody if that holder has the lowest ID, until the lists agree again.
- A dummy ack (an ACKJOB for an ID this node never held, kept to spread
  the ack) is a copy and not a job: it counts in the states, not here.

Waiting to be queued again
--------------------------
A job handed to a consumer and not acknowledged is ``active`` on every
holder and in no queue: it is queued again when its RETRY runs out; so is
one NACKed or ENQUEUEd with a DELAY, at the end of the delay, and one
added with DELAY. A copy *waits here* when it is active with a requeue
time (``qtime``), and no other holder this node can reach has it queued or
queues it at the end of a delay (``queued_on``: that holder's QUEUED, the
REPLJOB of the node that added it with a DELAY, a POSTPONE). The ``stats``
event shows, per queue, the copies that wait here (``mine``).

For the cluster (``counted``) each waiting job must be counted once too.
A job delayed by a client of this node (``FLAG_DELAYED``), or added here
with a DELAY and not queued yet (no ``FLAG_BCAST_QUEUED``), is queued by
this node, and the other holders stand by for it (their ``queued_on``
names this node): it is counted here. Any other waiting job (a consumer
holds it) waits on all its holders alike, and is counted by the holder
that counts the job. The time it comes back is the earliest requeue time
of the copies counted: the holders' timers differ by less than a second
(``job.TIME_ERROR_MS``), and the first to run out queues the job.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from ..core.cluster import FAIL, PFAIL
from ..core.job import (
    FLAG_BCAST_QUEUED,
    FLAG_DELAYED,
    STATE_ACKED,
    STATE_ACTIVE,
    STATE_QUEUED,
    STATE_WAIT_REPL,
    Job,
)
from ..core.node import Node


@attrs.frozen
class Requeue:
    """The jobs of one queue that wait to be queued again, and the earliest
    time one of them is (the node's clock, ms)."""

    jobs: int
    next_ms: int


@attrs.frozen
class Census:
    states: dict[str, int]  # copies held, by state
    jobs: int  # the jobs this node counts for the cluster (lowest reachable holder)
    mine: dict[str, Requeue]  # queue -> copies that wait here to be queued again
    counted: dict[str, Requeue]  # queue -> of those, the jobs this node counts

    @property
    def total(self) -> int:
        return sum(self.states.values())


def take(node: Node, can_answer: Collection[str]) -> Census:
    """The census of ``node``'s jobs. ``can_answer``: the other nodes this
    node has a link up to and does not mark failing (a set, for speed).

    Cost: one pass over the jobs, then one over the active jobs with a
    requeue time. ``bench/bench_census.py``: a million jobs, a quarter of
    them waiting to be queued again, take about 4 times as long as the count
    by state alone did (which this replaces); the caller reuses a census
    for a time that grows with the jobs held (observe.py)."""
    me = node.node_id
    by_state = [0, 0, 0, 0]  # indexed by JobState (an IntEnum)
    # Jobs by holder list: they share few distinct lists, so whether this
    # node counts a job is decided once per list, not once per job.
    lists: dict[tuple[str, ...], int] = {}
    timed: list[Job] = []  # active, with a requeue time
    keep = timed.append
    for job in node.jobs.values():
        state = job.state
        by_state[state] += 1
        holders = job.nodes_delivered
        lists[holders] = lists.get(holders, 0) + 1
        if state == STATE_ACTIVE and job.qtime:
            keep(job)
    # A dummy ack (no holders) is no job.
    ours = {h: bool(h) and not any(n < me and n in can_answer for n in h) for h in lists}
    jobs = sum(count for holders, count in lists.items() if ours[holders])
    # [jobs, earliest requeue time] by queue: lists, not Requeue objects,
    # in this loop (a method call per job costs more than the rest).
    mine: dict[str, list[int]] = {}
    counted: dict[str, list[int]] = {}
    for job in timed:
        on = job.queued_on
        if on is not None and on in can_answer:
            continue  # queued there, or queued there after a client's delay
        name, qtime = job.queue, job.qtime
        entry = mine.get(name)
        if entry is None:
            mine[name] = [1, qtime]
        else:
            entry[0] += 1
            if qtime < entry[1]:
                entry[1] = qtime
        flags = job.flags
        if ours[job.nodes_delivered] or flags & FLAG_DELAYED or not flags & FLAG_BCAST_QUEUED:
            entry = counted.get(name)
            if entry is None:
                counted[name] = [1, qtime]
            else:
                entry[0] += 1
                if qtime < entry[1]:
                    entry[1] = qtime
    return Census(
        states_json(by_state),
        jobs,
        {name: Requeue(n, at) for name, (n, at) in mine.items()},
        {name: Requeue(n, at) for name, (n, at) in counted.items()},
    )


def states_json(by_state: list[int]) -> dict[str, int]:
    """Counts indexed by JobState, by the names the dashboard uses."""
    return {
        "queued": by_state[STATE_QUEUED],
        "active": by_state[STATE_ACTIVE],
        "acked": by_state[STATE_ACKED],
        "wait_repl": by_state[STATE_WAIT_REPL],
    }


def can_answer(node: Node) -> frozenset[str]:
    """The other nodes of ``node``'s table that it has a link up to and does
    not mark PFAIL or FAIL: the holders that count jobs, as it sees them."""
    return frozenset(
        p.node_id for p in node.cluster.others() if p.link_up and not p.flags & (PFAIL | FAIL)
    )


def longest(requeue: dict[str, Requeue], limit: int) -> list[tuple[str, Requeue]]:
    """The ``limit`` queues with the most jobs waiting, ties by name."""
    ranked = sorted(requeue.items(), key=lambda item: (-item[1].jobs, item[0]))
    return ranked[:limit]
