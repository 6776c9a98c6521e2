"""The job record.

A job lives in exactly one state at a time::

    WAIT_REPL --replication reached--> ACTIVE <--dequeue/deliver--> QUEUED
        |                                 |                            |
        +-------------- ACKJOB -----------+------------ ACKJOB --------+--> ACKED

``ACKED`` is absorbing: nothing moves a job out of it; the job is deleted
once every node that may hold a copy confirmed the acknowledgement.

Memory matters here (a node may hold millions of jobs), hence ``__slots__``,
node lists stored as shared tuples (copy on write: almost every job on a node
shares the same one-element tuple), and times as plain ints.
"""

from __future__ import annotations

import enum
from typing import Final


class JobState(enum.IntEnum):
    WAIT_REPL = 0  # created by ADDJOB, waiting for synchronous replication
    ACTIVE = 1  # held by this node, not in a local queue
    QUEUED = 2  # held and in this node's queue, deliverable by GETJOB
    ACKED = 3  # delivered and acknowledged; kept until collected

    @property
    def label(self) -> str:
        return _STATE_LABELS[self]


# The states as module constants, for the hot paths: reading an enum member
# off its class is a descriptor call in CPython 3.11 (86 ns, against 5 for a
# global), and a bus message's handler and a timer read several.
STATE_WAIT_REPL: Final = JobState.WAIT_REPL
STATE_ACTIVE: Final = JobState.ACTIVE
STATE_QUEUED: Final = JobState.QUEUED
STATE_ACKED: Final = JobState.ACKED

_STATE_LABELS = {
    JobState.WAIT_REPL: "wait-repl",
    JobState.ACTIVE: "active",
    JobState.QUEUED: "queued",
    JobState.ACKED: "acked",
}
STATE_BY_LABEL = {label: state for state, label in _STATE_LABELS.items()}

# Job flags (a bit field, to keep one int per job instead of three bools).
# Re-queue times are spread by +/- half of this, so that the holders of a
# job do not all re-queue it at the same moment.
TIME_ERROR_MS = 500

FLAG_DELIVERED = 1  # handed to a client at least once (RETRY 0: never again)
FLAG_BCAST_QUEUED = 2  # the next enqueue broadcasts QUEUED (re-queue, not first)
FLAG_BCAST_WILLQUEUE = 4  # wake 500 ms before qtime to send WILLQUEUE
# Queued here, and QUEUED went to every other holder since the last retry
# point in answer to a WILLQUEUE (the steady state); if not, the retry point
# announces it (a lost QUEUED must not leave two copies queued for ever).
FLAG_TOLD_QUEUED = 8
# Waiting for its copies, the job got one more holder (a node added after
# the first REPLJOB): once replicated, every holder is sent the final list.
FLAG_HOLDERS_GREW = 16
# A client asked for the job to be queued here after a delay (NACK or
# ENQUEUE with DELAY): qtime is that moment, the other holders were told
# (POSTPONE), and the queueing counts nothing more (the command counted).
FLAG_DELAYED = 32
# The next queueing here is a first one for the cluster: it counts nothing
# (the job was not delivered since it was last queued) and is announced to
# the other holders (QUEUED, counting nothing), so that they know who has it
# queued. A fail-over (the holder that had it queued was lost,
# Node.fail_over: the others stand by for it), or the ENQUEUE of a node that
# added the job and kept no copy.
FLAG_ANNOUNCE = 64
# Handed to a consumer by this process and not queued anywhere since (as
# far as this node heard): a WILLQUEUE from a holder that did not hear of
# the delivery is answered DELIVERED. Never written to the AOF: a copy
# loaded after a restart has lost its consumer's connection.
FLAG_HANDED = 128

NodeIds = tuple[str, ...]


class Job:
    """One job as this node knows it. Times are wall-clock milliseconds."""

    __slots__ = (
        "awake",
        "body",
        "ctime",
        "delay",
        "deliveries",
        "etime",
        "flags",
        "gc_retry",
        "id",
        "nacks",
        "nodes_confirmed",
        "nodes_delivered",
        "qtime",
        "queue",
        "queued_on",
        "repl",
        "retry",
        "state",
    )

    id: str
    queue: str
    # None for a dummy ack: an ID acknowledged here whose job we never held.
    body: bytes | None
    state: JobState
    repl: int
    ctime: int  # creation: ms * 1_000_000 + a counter; orders the queue
    etime: int  # expire time, unix seconds
    delay: int  # seconds
    retry: int  # seconds; 0 = at most once
    qtime: int  # next (re)queue time in ms; 0 = never queue again
    awake: int  # time the awake index will look at the job, ms; 0 = not indexed
    nacks: int
    deliveries: int  # additional deliveries (re-queues not caused by NACK)
    flags: int
    gc_retry: int  # collection attempts so far, for exponential back-off
    nodes_delivered: NodeIds  # nodes that may hold a copy
    nodes_confirmed: NodeIds | None  # replication or ack confirmations
    # The other holder that, as far as this node heard, has the job queued
    # and has not handed it to a consumer (its QUEUED, or the REPLJOB of
    # the node that added it and queues it), or will queue it at the end
    # of a client's delay (POSTPONE). None when that is unknown, when a
    # consumer holds the job (WORKING), or when it is queued here. If that
    # holder is lost, this copy is queued by a surviving holder at once
    # instead of after RETRY (Node.fail_over).
    queued_on: str | None

    def __init__(
        self,
        job_id: str,
        queue: str,
        body: bytes | None,
        state: JobState,
        repl: int = 1,
        ctime: int = 0,
        etime: int = 0,
        delay: int = 0,
        retry: int = 0,
    ) -> None:
        self.id = job_id
        self.queue = queue
        self.body = body
        self.state = state
        self.repl = repl
        self.ctime = ctime
        self.etime = etime
        self.delay = delay
        self.retry = retry
        self.qtime = 0
        self.awake = 0
        self.nacks = 0
        self.deliveries = 0
        self.flags = 0
        self.gc_retry = 0
        self.nodes_delivered = ()
        self.nodes_confirmed = None
        self.queued_on = None

    @property
    def is_dummy_ack(self) -> bool:
        """An ack held for an ID we never had a copy of."""
        return not self.nodes_delivered

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.state.label} q={self.queue!r}>"
