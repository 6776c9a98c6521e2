"""Job commands: ADDJOB, ACKJOB, FASTACK, NACK, ENQUEUE, DEQUEUE, DELJOB,
WORKING, WAITJOB, SHOW, JSCAN.

Each handler takes the node and the argument vector (command name included)
and returns a reply, or a :class:`Waiter` when the client must wait. Argument
errors are raised as :class:`ReplyError` and become the reply.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping

from ..protocol import bus
from ..protocol.limits import MAX_INT64, MAX_JOB_SECONDS
from ..protocol.replies import SYNTAX_ERROR, Reply, ReplyError, Status, err
from . import clusterjobs as cj
from . import jobwaits
from .args import (
    ids_and_option,
    job_ids,
    option,
    parse_cursor,
    parse_int,
    parse_timeout_ms,
    syntax_error,
    text,
)
from .ids import is_at_most_once_id
from .job import (
    FLAG_ANNOUNCE,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELAYED,
    STATE_ACKED,
    STATE_ACTIVE,
    STATE_BY_LABEL,
    STATE_QUEUED,
    Job,
    JobState,
)
from .node import Node
from .queue import PAUSED_IN
from .records import dummy_ack
from .scan import ScanSnapshot
from .waiters import Waiter

DEFAULT_TTL = 24 * 3600
DEFAULT_RETRY_MAX = 300
SCAN_DEFAULT_COUNT = 100


class AddJobArgs:
    """ADDJOB options after validation (defaults filled in)."""

    __slots__ = (
        "async_",
        "body",
        "delay",
        "maxlen",
        "queue",
        "replicate",
        "retry",
        "timeout",
        "ttl",
    )

    def __init__(self, node: Node, argv: list[bytes]) -> None:
        self.queue = text(argv[1])
        self.body = argv[2]
        # min(3, cluster size) as in the original, leaving nodes not
        # counted: they take no copies, and with three nodes, one leaving
        # for a rolling restart made every ADDJOB without REPLICATE -NOREPL.
        self.replicate = max(1, min(3, node.staying_size))
        self.ttl = DEFAULT_TTL
        self.retry = -1
        self.delay = 0
        self.maxlen = 0
        self.async_ = False
        if len(argv) > 4:
            self._parse_options(argv)
        # "0" is by far the most common timeout: skip the integer parser.
        self.timeout = 0 if argv[3] == b"0" else parse_timeout_ms(argv[3])
        self._check_and_default()

    def _parse_options(self, argv: list[bytes]) -> None:
        i, n = 4, len(argv)
        while i < n:
            opt = option(argv[i])
            has_value = i + 1 < n
            if opt == b"async":
                self.async_ = True
                i += 1
                continue
            if not has_value or opt not in _ADDJOB_NUMERIC:
                raise SYNTAX_ERROR
            attr, lowest, highest, message, too_large = _ADDJOB_NUMERIC[opt]
            # A malformed number gets the option's own message, like the original.
            value = parse_int(argv[i + 1], message)
            if value < lowest:
                raise err(message)
            if value > highest:
                raise err(too_large)
            setattr(self, attr, value)
            i += 2

    def _check_and_default(self) -> None:
        if self.replicate > 1 and self.retry == 0:
            raise err(
                "With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
            )
        if self.delay >= self.ttl:
            raise err(
                "The specified DELAY is greater than TTL. Job refused since would never be delivered"
            )
        # RETRY is not held to TTL, as in the original: RETRY 100 TTL 10 is
        # accepted and the job simply expires before it could be re-queued
        # (delivered at most once, though its ID says at-least-once).
        if self.retry == -1:
            self.retry = max(1, min(self.ttl // 10, DEFAULT_RETRY_MAX))


# (attribute, lowest, highest, message, message when above highest). TTL,
# RETRY and DELAY are refused past 32 bits (protocol/limits.py), where the
# original wraps them silently; every other message is the original's.
_TOO_LONG = "{} is too large: at most " + str(MAX_JOB_SECONDS) + " seconds"
_ADDJOB_NUMERIC: dict[bytes, tuple[str, int, int, str, str]] = {
    b"replicate": (
        "replicate",
        1,
        65535,
        "REPLICATE must be between 1 and 65535",
        "REPLICATE must be between 1 and 65535",
    ),
    b"ttl": ("ttl", 1, MAX_JOB_SECONDS, "TTL must be a number > 0", _TOO_LONG.format("TTL")),
    b"retry": (
        "retry",
        0,
        MAX_JOB_SECONDS,
        "RETRY time must be a non negative number",
        _TOO_LONG.format("RETRY"),
    ),
    b"delay": (
        "delay",
        0,
        MAX_JOB_SECONDS,
        "DELAY time must be a non negative number",
        _TOO_LONG.format("DELAY"),
    ),
    b"maxlen": (
        "maxlen",
        1,
        MAX_INT64,
        "MAXLEN must be a positive number",
        "MAXLEN must be a positive number",
    ),
}


def addjob(node: Node, argv: list[bytes]) -> Reply | Waiter:
    """ADDJOB queue body ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s]
    [MAXLEN n] [ASYNC]"""
    args = AddJobArgs(node, argv)
    # Under memory pressure, or while leaving, this node keeps no copy: the
    # job goes to REPLICATE other nodes ("external replication").
    external = node.leaving or node.memory_level() > 0
    additional = args.replicate if external else args.replicate - 1
    if additional > node.reachable_peers:
        node.stats.replication_failures += 1
        raise _norepl(node, external, additional)
    q = node.queues.get(args.queue)
    if args.maxlen and q is not None and len(q.jobs) >= args.maxlen:
        raise ReplyError("MAXLEN", "Queue is already longer than the specified MAXLEN count")
    if q is not None and q.pause & PAUSED_IN:
        raise ReplyError("PAUSED", "Queue paused in input, try later")
    now = node.now_ms()
    # Jobs keep the queue's own name string: one copy per queue, not per job.
    job = create_job(node, args, node.queue(args.queue, now).name, now)
    node.stats.added_jobs += 1
    if external:
        job.nodes_delivered = ()
    # A node that keeps no copy answers only once another node has one,
    # ASYNC or not: sent in the background, a copy lost to the network (a
    # partition, a crash, no link up) would be the job lost after an OK.
    if external or (additional > 0 and not args.async_):
        return cj.start_sync_replication(node, job, args.timeout)
    if additional > 0:
        cj.replicate(node, job, additional, noreply=True)
    if job.delay == 0:
        node.register(job, schedule=False)
        node.enqueue(job, now=now)
    else:
        node.register(job)
    return Status(job.id)


def _norepl(node: Node, external: bool, additional: int) -> ReplyError:
    message = "Not enough reachable nodes for the requested replication level"
    if external and additional - 1 == node.reachable_peers:
        reason = "I'm leaving the cluster" if node.leaving else "I'm out of memory"
        message += (
            ", since I'm unable to hold a copy of the message for the following reason: " + reason
        )
    return ReplyError("NOREPL", message)


def create_job(node: Node, args: AddJobArgs, queue: str, now: int) -> Job:
    job = Job(
        node.idgen.next_id(args.ttl, args.retry),
        queue,
        args.body,
        STATE_ACTIVE,
        args.replicate,
        node.new_ctime(now),
        node.shared_int(now // 1000 + args.ttl),
        args.delay,
        args.retry,
    )
    job.nodes_delivered = node.myself_only
    # The first queue time: after DELAY, else (overwritten by enqueue) RETRY.
    job.qtime = now + (args.delay or args.retry) * 1000
    return job


def ackjob(node: Node, argv: list[bytes]) -> Reply:
    """ACKJOB id...: acknowledge; unknown at-least-once IDs get a dummy ack."""
    known = 0
    for job_id in job_ids(argv[1:]):
        job = node.lookup(job_id)
        if job is None:
            job = _dummy_ack(node, job_id)
        elif job.state != STATE_ACKED:
            node.acknowledge(job)
            node.stats.acked_jobs += 1
            known += 1
        if job is not None:
            node.try_gc(job)
    return known


def _dummy_ack(node: Node, job_id: str) -> Job | None:
    """Remember an ack for a job this node never held, so it can be spread.

    Only worth it when other nodes exist, we are not leaving, and the job
    could be re-queued somewhere (an odd TTL in the ID means RETRY > 0).
    """
    if node.cluster_size <= 1 or node.leaving or is_at_most_once_id(job_id):
        return None
    if node.deleted_acked.get(job_id) == node.acked_epoch():
        # Acked and deleted here lately: the ack already reached the
        # holders (a straggler is told when it announces the job), and a
        # dummy would wait for every node of the cluster, a dead one too.
        # Not if the membership moved since: a holder this node did not
        # know then never heard of the ack (simulator seed 20000361: a
        # replaced node, met again after a partition, re-queued its job
        # for ever while ACKJOBs elsewhere answered 0). Nor if a peer's
        # link came up again: it may have crashed and reloaded the job
        # from an AOF that never got its ack, and announces that copy only
        # to its own holder list (seed 123372: n0 reloaded a job acked by
        # n4's dummy ack, gave it to n1 by YOURJOBS, and a later ACKJOB on
        # n4 answered 0 with no SETACK: delivered again). Nor if what was
        # deleted was itself a dummy ack (its tombstone has no epoch: seed
        # 563819, clusterjobs._on_gotack).
        return None
    # Registered, it is recorded in the AOF (records.aof_record): durable
    # like any ack, since the client was answered and the holders may hear
    # of it only from this node, later (simulator seed 180270: an isolated
    # node's dummy ack, its SETACKs lost, died in a crash under appendfsync
    # always, and the job was delivered again for ever).
    job = dummy_ack(job_id, node.now_ms())
    node.register(job)
    return job


def fastack(node: Node, argv: list[bytes]) -> Reply:
    """FASTACK id...: delete at once, best-effort DELJOB to the holders."""
    known = 0
    for job_id in job_ids(argv[1:]):
        job = node.lookup(job_id)
        cj.broadcast_deljob(node, job_id, job)
        # Remembered as acked: a holder the DELJOB misses is told when it
        # announces the job.
        if job is not None:
            node.unregister(job, acked=True)
            known += 1
        else:
            node.remember_deleted(job_id, acked=True)
            node.remember_unknown_fastack(job_id)
    return known


ENQUEUE_USAGE = "ENQUEUE id [id ...] [DELAY seconds]"
DELAY_BUS_VERSION = bus.SINCE_VERSION[bus.Postpone]
NACK_USAGE = "NACK id [id ...] [DELAY seconds]"


def enqueue(node: Node, argv: list[bytes]) -> Reply:
    """ENQUEUE id [id ...] [DELAY seconds]: queue active jobs, now or
    after the delay (a delivered RETRY 0 job is refused: at most once)."""
    return _enqueue_generic(node, argv, nack=False)


def nack(node: Node, argv: list[bytes]) -> Reply:
    """NACK id [id ...] [DELAY seconds]: like ENQUEUE, and count a
    negative acknowledgement."""
    return _enqueue_generic(node, argv, nack=True)


def _enqueue_generic(node: Node, argv: list[bytes], nack: bool) -> Reply:
    ids, delay_arg = ids_and_option(argv, b"delay", NACK_USAGE if nack else ENQUEUE_USAGE)
    delay_ms = 0 if delay_arg is None else _delay_seconds(delay_arg) * 1000
    if delay_ms and (old := node.cluster.behind(DELAY_BUS_VERSION)) is not None:
        # Its holders would not hear POSTPONE, and queue the job at RETRY.
        raise ReplyError(
            "NOTSUPPORTED",
            f"DELAY needs every node on bus protocol {DELAY_BUS_VERSION} or newer: "
            f"{old.node_id[:8]} speaks {old.bus_version} (an upgrade in progress?)",
        )
    count = 0
    for job_id in job_ids(ids):
        job = node.lookup(job_id)
        if job is None or job.state != STATE_ACTIVE:
            continue
        if node.enqueue_later(job, delay_ms, nack) if delay_ms else node.enqueue(job, nack):
            count += 1
    return count


def _delay_seconds(arg: bytes) -> int:
    """NACK/ENQUEUE's DELAY: ADDJOB's rules and messages."""
    message = "DELAY time must be a non negative number"
    value = parse_int(arg, message)
    if value < 0:
        raise err(message)
    if value > MAX_JOB_SECONDS:
        raise err(_TOO_LONG.format("DELAY"))
    return value


WAITJOB_USAGE = "WAITJOB id [id ...] [TIMEOUT ms]"


def waitjob(node: Node, argv: list[bytes]) -> Reply | Waiter:
    """WAITJOB id [id ...] [TIMEOUT ms]: block until every job is done;
    one answer per ID, in order: acked, gone, unknown, or pending when
    the timeout came first (0, the default, waits for ever)."""
    ids, timeout_arg = ids_and_option(argv, b"timeout", WAITJOB_USAGE)
    timeout = 0 if timeout_arg is None else parse_timeout_ms(timeout_arg)
    if not ids:
        raise syntax_error(f"at least one job ID is needed ({WAITJOB_USAGE})")
    return jobwaits.watch(node, job_ids(ids), timeout)


def dequeue(node: Node, argv: list[bytes]) -> Reply:
    """DEQUEUE id...: take queued jobs out of their queue (back to active)."""
    count = 0
    for job_id in job_ids(argv[1:]):
        job = node.lookup(job_id)
        if job is not None and node.dequeue(job):
            node.update_awake(job)
            count += 1
    return count


def deljob(node: Node, argv: list[bytes]) -> Reply:
    """DELJOB id...: forget jobs locally, whatever their state."""
    count = 0
    for job_id in job_ids(argv[1:]):
        job = node.lookup(job_id)
        if job is not None:
            node.unregister(job)
            count += 1
    return count


def working(node: Node, argv: list[bytes]) -> Reply:
    """WORKING id: postpone the next re-queue by RETRY seconds."""
    (job_id,) = job_ids(argv[1:2])
    job = node.lookup(job_id)
    if job is None:
        raise ReplyError("NOJOB", "Job not known in the context of this node.")
    if job.state == STATE_ACKED:
        raise ReplyError("NOJOB", "Job already acknowledged.")
    now = node.now_ms()
    created_ms = job.ctime // 1_000_000
    ttl = job.etime * 1000 - created_ms
    if ttl > 0 and now - created_ms > ttl // 2:
        raise ReplyError(
            "TOOLATE",
            "Half of job TTL already elapsed, you are no longer allowed to "
            "postpone the next delivery.",
        )
    if job.state == STATE_QUEUED:
        node.dequeue(job)
    job.flags |= FLAG_BCAST_WILLQUEUE
    # A consumer holds it, whichever node it got it from (that node may be
    # gone, and its client moved here): nothing to take over if the holder
    # we thought had it queued is lost (Node.fail_over), and a queueing
    # later is a retry again, not a first one.
    job.queued_on = None
    job.flags &= ~FLAG_ANNOUNCE
    # Postpone, never advance: on a job still waiting for its DELAY, a RETRY
    # shorter than the delay left would otherwise queue it early.
    node.set_requeue_time(job, max(job.qtime, now + job.retry * 1000 + node.time_error()))
    node.update_awake(job)
    cj.broadcast_working(node, job)
    return job.retry


def show(node: Node, argv: list[bytes]) -> Reply:
    """SHOW id: everything about a job, or nil."""
    (job_id,) = job_ids(argv[1:2])
    job = node.lookup(job_id)
    return None if job is None else job_info(node, job)


def job_info(node: Node, job: Job) -> list[Reply]:
    """SHOW's flat key/value array (flat in RESP3 too: Disque clients such as
    pydisque pair the elements up themselves)."""
    now = node.now_ms()
    return flat(
        {
            "id": job.id,
            "queue": job.queue if job.body is not None else None,
            "state": job.state.label,
            "repl": job.repl,
            "ttl": max(0, job.etime - now // 1000),
            "ctime": job.ctime,
            "delay": job.delay,
            "retry": job.retry,
            "nacks": job.nacks,
            "additional-deliveries": job.deliveries,
            "nodes-delivered": list(job.nodes_delivered),
            "nodes-confirmed": list(job.nodes_confirmed or ()),
            "next-requeue-within": max(0, job.qtime - now) if job.qtime else None,
            "next-awake-within": max(0, job.awake - now) if job.awake else None,
            "body": job.body,
            # Ours: the next queueing is the end of a client's NACK or
            # ENQUEUE DELAY (at next-requeue-within), not a retry.
            "delayed-requeue": 1 if job.flags & FLAG_DELAYED and job.state == STATE_ACTIVE else 0,
        }
    )


def flat(fields: dict[str, Reply]) -> list[Reply]:
    """[k1, v1, k2, v2, ...] from a dict, in insertion order."""
    out: list[Reply] = []
    for key, value in fields.items():
        out += (key, value)
    return out


def jscan(node: Node, argv: list[bytes]) -> Reply:
    """JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s]... [REPLY all|id]"""
    scan = ScanArgs()
    queue: str | None = None
    states: set[JobState] = set()
    reply_all = False
    i = 1
    while i < len(argv):
        opt, has_value = option(argv[i]), i + 1 < len(argv)
        if scan.take(opt, argv, i):
            i += 2 if opt == b"count" else 1
            continue
        if opt == b"queue" and has_value:
            queue = text(argv[i + 1])
        elif opt == b"state" and has_value:
            state = STATE_BY_LABEL.get(text(argv[i + 1]).lower())
            if state is None:
                raise err("Invalid job state name")
            states.add(state)
        elif opt == b"reply" and has_value:
            kind = option(argv[i + 1])
            if kind not in (b"id", b"all"):
                raise err("Invalid REPLY type, try ID or ALL")
            reply_all = kind == b"all"
        else:
            scan.set_cursor(argv[i])
            i += 1
            continue
        i += 2

    def match(job_id: str) -> bool:
        job = node.jobs[job_id]
        if job.is_dummy_ack:
            return False
        if queue is not None and job.queue != queue:
            return False
        return not states or job.state in states

    cursor, found = scan.run(node.jobs, match, node.scan_snapshots, "jobs")
    items: list[Reply] = [job_info(node, node.jobs[k]) if reply_all else Status(k) for k in found]
    return [str(cursor), items]


class ScanArgs:
    """The cursor, COUNT and BUSYLOOP options shared by QSCAN and JSCAN.

    Iteration order is by CRC32 of the key, and the cursor is the next hash
    value to look at (plus one; 0 = start/finished). Elements present for the
    whole scan are returned at least once whatever is added or removed in
    between, because the order does not depend on what else is present.

    Sorting every key on every call would make a full scan quadratic, so a
    call with cursor 0 takes a snapshot of the keys sorted by hash, and later
    calls walk the newest snapshot. That is still correct for several scans
    at once: the newest snapshot was taken at or after the start of every
    scan in progress, so it holds every element present for their whole scan
    (deleted ones are skipped when met).
    """

    def __init__(self) -> None:
        self.cursor = 0
        self.cursor_set = False
        self.count = SCAN_DEFAULT_COUNT
        self.busyloop = False

    def take(self, opt: bytes, argv: list[bytes], i: int) -> bool:
        if opt == b"count" and i + 1 < len(argv):
            self.count = parse_int(argv[i + 1])
            if self.count < 1:
                raise SYNTAX_ERROR
            return True
        if opt == b"busyloop":
            self.busyloop = True
            return True
        return False

    def set_cursor(self, arg: bytes) -> None:
        if self.cursor_set:
            raise SYNTAX_ERROR
        self.cursor = parse_cursor(arg)
        self.cursor_set = True

    def run(
        self,
        keys: Mapping[str, object],
        match: Callable[[str], bool],
        snapshots: dict[str, ScanSnapshot] | None = None,
        kind: str = "",
    ) -> tuple[int, list[str]]:
        snapshot = _snapshot(keys, self.cursor, snapshots, kind)
        hashes, names = snapshot.hashes, snapshot.keys
        i = bisect.bisect_left(hashes, self.cursor - 1 if self.cursor else 0)
        found: list[str] = []
        limit = len(names) if self.busyloop else self.count
        # Bound the work of one call, like the original (COUNT * 10 looks).
        budget = len(names) if self.busyloop else self.count * 10
        while i < len(names) and len(found) < limit and budget > 0:
            h = hashes[i]
            # Never split a run of equal hashes across two calls.
            while i < len(names) and hashes[i] == h:
                key = names[i]
                if key in keys and match(key):
                    found.append(key)
                i += 1
                budget -= 1
        cursor = hashes[i] + 1 if i < len(names) else 0
        return cursor, found


def _snapshot(
    keys: Mapping[str, object],
    cursor: int,
    snapshots: dict[str, ScanSnapshot] | None,
    kind: str,
) -> ScanSnapshot:
    if snapshots is None:
        return ScanSnapshot(keys)
    snapshot = snapshots.get(kind)
    if cursor == 0 or snapshot is None:
        snapshot = snapshots[kind] = ScanSnapshot(keys)
    return snapshot
