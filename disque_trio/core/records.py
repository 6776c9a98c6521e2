"""A job and its two serialised forms: the AOF record and the bus copy.

One place maps a :class:`Job` to and from ``protocol.aof.JobRecord`` (what
the AOF stores: the whole state, absolute expire time) and
``protocol.bus.JobData`` (what another node needs for its copy: the TTL
left, since clocks differ; no local state). The rules for what a copy or a
reloaded job becomes live here too, with the replay of an AOF, so that the
shell only reads and writes bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..protocol import aof, bus
from . import always
from .cluster import HANDSHAKE
from .host import JobHost
from .ids import is_at_most_once_id, ttl_minutes_from_id
from .job import (
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELAYED,
    FLAG_DELIVERED,
    FLAG_HANDED,
    TIME_ERROR_MS,
    Job,
    JobState,
)

# Holders named by a peer's list while still in their handshake here, kept
# until they answer (merge_holders): at most this many nodes, and this many
# jobs per node; beyond, a holder is dropped as before.
MAX_PENDING_HOLDER_NODES = 64
MAX_PENDING_HOLDER_JOBS = 10_000
# A node that left the table before its handshake went through (timed out)
# may come back by gossip and answer: its jobs wait this long for it.
PENDING_HOLDERS_MS = 60_000


def pending_of(node: JobHost, job_id: str) -> tuple[str, ...]:
    """The pending holders of one job (merge_holders): nodes a peer's list
    named while still in their handshake here."""
    pending = node.pending_holders
    if not pending:
        return ()
    return tuple(n for n, job_ids in pending.items() if job_id in job_ids)


def pending_by_job(node: JobHost) -> dict[str, tuple[str, ...]]:
    """pending_of for every job at once (an AOF rewrite)."""
    by_job: dict[str, tuple[str, ...]] = {}
    for n, job_ids in node.pending_holders.items():
        for job_id in job_ids:
            by_job[job_id] = (*by_job.get(job_id, ()), n)
    return by_job


def job_record(job: Job, pending: tuple[str, ...] = ()) -> aof.JobRecord:
    """The job as the AOF stores it, with its pending holders: lost in a
    crash, they left two queued copies that never heard of each other
    (simulator seed 594353: n0, a replacement, took n1's queued copies by
    YOURJOBS while its handshake with n2 was not through; n0 crashed and
    came back listing n1 alone, so n0 and n2 each kept a queued copy for
    good, each telling only n1)."""
    return aof.JobRecord(
        job.id,
        job.queue,
        job.body or b"",
        int(job.state),
        job.repl,
        job.ctime,
        job.etime,
        job.delay,
        job.retry,
        job.nacks,
        job.deliveries,
        job.nodes_delivered,
        job.qtime,
        job.flags & ~FLAG_HANDED,  # a consumer's connection does not outlive a restart
        pending,
    )


def aof_record(job: Job, pending: tuple[str, ...] = ()) -> bytes | None:
    """What the AOF holds for a job: its whole state (LOADJOB, with its
    ``pending`` holders), a dummy ack's ACKJOB (no body: an ack of a job
    never held here), or nothing while it waits for its copies."""
    if job.state == JobState.WAIT_REPL:
        return None
    if job.body is None:
        return aof.ackjob(job.id)
    return aof.loadjob(job_record(job, pending))


def wire_ttl(job: Job, now: int) -> int:
    """The TTL a job travels with: whole seconds left, at least 1."""
    return max(1, job.etime - now // 1000)


def job_data(job: Job, now: int, pending: tuple[str, ...] = ()) -> bus.JobData:
    """A job as it travels: TTL left instead of an absolute expire time,
    because node clocks are not synchronised. ``pending``: its pending
    holders here (pending_of), listed too when the job is given away."""
    holders = tuple(dict.fromkeys((*job.nodes_delivered, *pending))) if pending else None
    return bus.JobData(
        job.id,
        job.queue,
        job.body or b"",
        job.repl,
        job.ctime,
        wire_ttl(job, now),
        job.delay,
        job.retry,
        job.nacks,
        job.deliveries,
        job.nodes_delivered if holders is None else holders,
    )


def merge_holders(
    node: JobHost, ours: tuple[str, ...], theirs: tuple[str, ...] | list[str], job_id: str = ""
) -> tuple[str, ...]:
    """Our holder list plus a peer's, without nodes we were told to forget
    (a peer that has not run CLUSTER FORGET yet still lists them; an ack
    would then wait for a node that is gone), nor nodes we only heard of by
    gossip and that have not answered our handshake (the original's table
    knows those under a temporary name only, so its job deserialization
    skips them). Seed 5263: a node reset HARD heard a wiped node's old ID by
    gossip, took it from a YOURJOBS holder list, and its ack waited for ever
    on it (the handshake timed out, so no CLUSTER FORGET reached that node).

    A node still in its handshake, or not in our table at all, is
    remembered for ``job_id`` in ``node.pending_holders`` and added once it
    answers (Node.adopt_pending_holders): a node that joined lately (a
    replacement) took a job by YOURJOBS before its handshake with one holder
    was through, and two queued copies that never heard of each other
    stayed queued both (simulator seeds 20000327, 20001208, 20002084,
    20002451). An unknown holder went into the list as it was, and an ack
    then waited for ever on a node this one never knew: a wiped node's
    second identity, replaced before its handshake here (seed 20006028; the
    operator's FORGET answers "Unknown node" on such a node)."""
    forgotten = node.cluster.blacklist
    known = node.cluster.nodes
    kept = []
    for n in theirs:
        if n in forgotten:
            continue
        peer = known.get(n)
        if peer is None or peer.flags & HANDSHAKE:
            if job_id:
                pending = node.pending_holders
                if n in pending or len(pending) < MAX_PENDING_HOLDER_NODES:
                    if n not in pending:
                        node.pending_since[n] = node.now_ms()
                    jobs = pending.setdefault(n, set())
                    if len(jobs) < MAX_PENDING_HOLDER_JOBS:
                        jobs.add(job_id)
            continue
        kept.append(n)
    return tuple(dict.fromkeys((*ours, *kept)))


def job_from_data(node: JobHost, data: bus.JobData) -> Job:
    """This node's copy of a job another node sent (REPLJOB, YOURJOBS):
    active, expiring after the TTL left, re-queued after DELAY + RETRY."""
    now = node.now_ms()
    queue = node.queue(data.queue, now).name
    job = Job(
        data.id,
        queue,
        data.body,
        JobState.ACTIVE,
        data.repl,
        data.ctime,
        now // 1000 + data.ttl,
        data.delay,
        data.retry,
    )
    job.nacks = data.nacks
    job.deliveries = data.deliveries
    job.nodes_delivered = merge_holders(node, (), data.nodes_delivered, data.id)
    if data.retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        job.qtime = now + (data.delay + data.retry) * 1000 + node.time_error()
    else:
        job.qtime = 0
    return job


def job_from_record(node: JobHost, rec: aof.JobRecord, now: int) -> Job | None:
    """A job reloaded from the AOF, or None if it expired meanwhile.

    It comes back ``active``, not queued (it may have been in a consumer's
    hands when the node went down): the retry timer re-queues it, after a
    WILLQUEUE to the other holders, no sooner
    than RETRY after the load and not before its recorded queue time (a job
    still waiting for its DELAY); a recorded time further away than its
    longest timer means the wall clock went back since, and is capped. A
    job still within a client's NACK or ENQUEUE DELAY keeps that time.
    RETRY 0 jobs are never queued by a reload. Acked jobs stay acked.
    """
    if rec.etime * 1000 <= now:
        return None
    queue = node.queue(rec.queue, now).name
    job = Job(
        rec.id,
        queue,
        rec.body,
        JobState.ACTIVE,
        rec.repl,
        rec.ctime,
        rec.etime,
        rec.delay,
        rec.retry,
    )
    job.nacks, job.deliveries, job.flags = rec.nacks, rec.deliveries, rec.flags & ~FLAG_HANDED
    job.nodes_delivered = rec.nodes_delivered or node.myself_only
    if rec.pending:
        # Still in their handshake when recorded: added now if they are
        # through it (nodes.conf was read first), else pending again.
        job.nodes_delivered = merge_holders(node, job.nodes_delivered, rec.pending, rec.id)
    if JobState(rec.state) == JobState.ACKED:
        job.state = JobState.ACKED
    elif rec.retry and rec.flags & FLAG_DELAYED and rec.qtime > now:
        # Still within a client's NACK or ENQUEUE DELAY: not queued since
        # the record, so in no consumer's hands; it keeps its time (an
        # expire time caps one the wall clock moved away).
        job.qtime = min(rec.qtime, rec.etime * 1000)
        job.flags |= FLAG_BCAST_WILLQUEUE
    elif rec.retry:
        # A delay that ran out may have queued and delivered the job
        # since: from here, a re-queue like any other.
        job.flags &= ~FLAG_DELAYED
        longest = now + (rec.delay + rec.retry) * 1000 + TIME_ERROR_MS
        job.qtime = max(now + rec.retry * 1000, min(rec.qtime, longest))
        # Announced (WILLQUEUE) before it is queued again, like any
        # re-queue: the record of a job added here was written before its
        # first queueing set the flag, and the job may have been acked
        # elsewhere while we were down (a holder that knows answers SETACK).
        job.flags |= FLAG_BCAST_WILLQUEUE
        if not rec.delay:
            # Queued when it was added (here or by the holder told to): the
            # record was written just before, without the flag. Queued
            # again, it counts as an additional delivery and is announced
            # (QUEUED), as the original, which writes it after, does.
            job.flags |= FLAG_BCAST_QUEUED
    else:
        job.qtime = 0
    return job


def dummy_ack(job_id: str, now: int) -> Job:
    """A dummy ack: an ack held for an ID this node has no copy of (no
    body, no holder), living the TTL the ID names from ``now``."""
    job = Job(job_id, "", None, JobState.ACKED)
    job.etime = now // 1000 + ttl_minutes_from_id(job_id) * 60
    return job


def replay(
    node: JobHost, entries: Iterable[tuple[bytes, aof.JobRecord | str]], enqueue_once: bool
) -> int:
    """Rebuild the jobs from AOF records in order; returns the jobs held.

    A later LOADJOB replaces an earlier one; ACKJOB acks, DELJOB deletes.
    An ACKJOB of an ID not held (no LOADJOB before it, or one deleted
    since) was a dummy ack: it is one again, its TTL counted from the load.
    With ``enqueue_once`` (a controlled restart) the jobs recorded as queued
    go back in their queues, in their order. Nothing is persisted again.
    """
    persisting, node.persisting = node.persisting, False
    now = node.now_ms()
    # Jobs a controlled restart puts back in their queues: only once the
    # whole file is read (a later record may ack, delete or replace one;
    # queueing it at its own record queued, and announced, a job the rest
    # of the file says is gone; simulator seeds 450155, 450719, 450760).
    to_queue: list[Job] = []
    # always-load-acked-as-aof (core/always.py, in the simulator only): the
    # IDs the file's last record of each says acked.
    acked: dict[str, bool] | None = {} if always.ENABLED else None
    try:
        for kind, payload in entries:
            if acked is not None:
                if kind == aof.LOADJOB:
                    assert isinstance(payload, aof.JobRecord)
                    acked[payload.id] = JobState(payload.state) == JobState.ACKED
                else:
                    acked[str(payload)] = kind == aof.ACKJOB
            if kind == aof.LOADJOB:
                assert isinstance(payload, aof.JobRecord)
                if (job := _restore(node, payload, enqueue_once, now)) is not None:
                    to_queue.append(job)
                continue
            job_id = str(payload)
            job = node.jobs.get(job_id)
            if job is None:
                if kind == aof.ACKJOB and not is_at_most_once_id(job_id):
                    node.register(dummy_ack(job_id, now))
                continue
            if kind == aof.ACKJOB:
                node.acknowledge(job)
            else:
                node.unregister(job)
        for job in to_queue:
            if node.jobs.get(job.id) is job and job.state == JobState.ACTIVE:
                job.qtime = job.qtime or now
                job.flags &= ~FLAG_DELIVERED  # not delivered yet: it was waiting in the queue
                # Put back where it was, not queued again: no delivery counted.
                job.flags &= ~FLAG_BCAST_QUEUED
                node.enqueue(job, now=now)
        if acked is not None:
            always.after_load(node, (job_id for job_id, yes in acked.items() if yes))
    finally:
        node.persisting = persisting
    return len(node.jobs)


def _restore(node: JobHost, rec: aof.JobRecord, enqueue_once: bool, now: int) -> Job | None:
    """Hold the job a LOADJOB record describes (replacing an earlier copy);
    the job if a controlled restart must put it back in its queue once the
    whole file is read."""
    old = node.jobs.get(rec.id)
    if old is not None:
        # Replaced, not deleted: no tombstone is left for it. One left here
        # outlived the copy (simulator seed 520222: a restart read two
        # LOADJOBs of a job, DEBUG FLUSHALL dropped it, and for a minute
        # WAITJOB answered gone for a job FASTACKed elsewhere since).
        tombstoned = rec.id in node.deleted_ids
        node.unregister(old)
        if not tombstoned:
            node.deleted_ids.pop(rec.id, None)
            node.deleted_acked.pop(rec.id, None)
    job = job_from_record(node, rec, now)
    if job is None:
        return None
    node.register(job)
    if enqueue_once and JobState(rec.state) == JobState.QUEUED:
        return job
    return None


__all__ = [
    "aof_record",
    "dummy_ack",
    "job_data",
    "job_from_data",
    "job_from_record",
    "job_record",
    "merge_holders",
    "pending_by_job",
    "pending_of",
    "replay",
]
