"""Mutation testing of the simulator: does it catch realistic bugs?

Each mutant is a context manager that monkeypatches the node code inside
this process and restores it on exit (``applied``). ``python -m sim
mutants`` runs, for every mutant, seeds in worker processes (``python -m
sim run --seed N --mutant NAME``, killed by a wall-clock guard) until the
checkers (sim/checkers.py, sim/world.py, sim/runner.py) report a violation.
A mutant no seed catches means the checkers or the faults are too weak.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from disque_trio.core import clusterjobs as cj
from disque_trio.core import jobcmds, jobwaits, queuecmds
from disque_trio.core import node as core_node
from disque_trio.core import records as core_records
from disque_trio.core.cluster import FAIL, LEAVING, PFAIL, ClusterTable, PeerNode
from disque_trio.core.commands import CORE_COMMANDS, Command
from disque_trio.core.effects import Persist
from disque_trio.core.job import (
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELAYED,
    FLAG_DELIVERED,
    Job,
    JobState,
)
from disque_trio.core.node import Node
from disque_trio.core.queue import Pause, Queue
from disque_trio.protocol import aof as aof_records
from disque_trio.protocol import bus
from disque_trio.protocol.replies import NULL_ARRAY, ReplyError
from disque_trio.server import aof as server_aof
from disque_trio.server.aof import AppendOnlyFile
from disque_trio.server.connections import _Connection

from .sweep import SEED_WALL_LIMIT_S, SeedWorker, run_seed_process

DEFAULT_SEEDS = tuple(range(1, 61))
# run_mutant's first line for a seed that failed with no violation (the run
# raised: the mutant no longer fits the code it patches), which catches
# nothing (seed 2 ran the four rewrite mutants into a TypeError once the
# node's aof_record took a second argument, bae3478).
CRASHED = "CRASHED, no violation:"


# -------------------------------------------------------------- mutants


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = vars(owner).get(name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


@contextlib.contextmanager
def handler(msg_type: type, fn: Callable[..., None]) -> Iterator[None]:
    old = cj._HANDLERS[msg_type]
    cj._HANDLERS[msg_type] = fn
    try:
        yield
    finally:
        cj._HANDLERS[msg_type] = old


def gotjob_duplicate_counted() -> contextlib.AbstractContextManager[None]:
    """GOTJOB counted even when that node already confirmed."""

    def on_gotjob(node: Node, sender: str, msg: bus.GotJob) -> None:
        job = node.jobs.get(msg.job_id)
        if job is None or job.state != JobState.WAIT_REPL:
            return
        confirmed = job.nodes_confirmed = (*(job.nodes_confirmed or ()), sender)
        if sender not in job.nodes_delivered:
            job.nodes_delivered = (*job.nodes_delivered, sender)
        if len(confirmed) >= job.repl:
            cj.replication_achieved(node, job)

    return handler(bus.GotJob, on_gotjob)


def setack_forgets_one_holder() -> contextlib.AbstractContextManager[None]:
    """SETACK never sent to the last holder of the list."""

    def send_setack(node: Node, job: Job) -> None:
        confirmed = job.nodes_confirmed or ()
        if job.is_dummy_ack:
            targets = [n.node_id for n in node.cluster.others()]
        else:
            targets = [n for n in job.nodes_delivered if n != node.node_id][:-1]
        for node_id in targets:
            if node_id not in confirmed:
                node.effects.send(node_id, bus.SetAck(job.id, len(job.nodes_delivered)))

    return patched(cj, "send_setack", send_setack)


def aof_requeues_retry0() -> contextlib.AbstractContextManager[None]:
    """An AOF reload queues RETRY 0 jobs again (as if never delivered)."""
    original = core_records._restore

    def restore(node: Node, rec: Any, enqueue_once: bool, now: int) -> Job | None:
        later = original(node, rec, enqueue_once, now)
        job = node.jobs.get(rec.id)
        if job is not None and job.retry == 0 and job.state == JobState.ACTIVE:
            job.qtime = now
            job.flags &= ~FLAG_DELIVERED
            node.enqueue(job, now=now)
        return later

    return patched(core_records, "_restore", restore)


def queued_skips_dequeue() -> contextlib.AbstractContextManager[None]:
    """QUEUED/WORKING never dequeue the local copy."""
    original = cj._on_queued

    def on_queued(node: Node, sender: str, msg: Any) -> None:
        with patched(node, "dequeue", lambda job: False):
            original(node, sender, msg)

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with handler(bus.Queued, on_queued), handler(bus.Working, on_queued):
            yield

    return both()


def aof_write_dropped() -> contextlib.AbstractContextManager[None]:
    """The AOF writer drops what the core recorded (reply before durability)."""

    def append(self: AppendOnlyFile, data: list[bytes]) -> int:
        return 0

    return patched(AppendOnlyFile, "append", append)


def repljob_no_merge() -> contextlib.AbstractContextManager[None]:
    """REPLJOB for a known job does not merge the nodes-delivered list."""
    original = cj._on_repljob

    def on_repljob(node: Node, sender: str, msg: bus.ReplJob) -> None:
        job = node.jobs.get(msg.job.id)
        before = job.nodes_delivered if job is not None else None
        original(node, sender, msg)
        if job is not None and before is not None:
            job.nodes_delivered = before

    return handler(bus.ReplJob, on_repljob)


def gc_skips_deljob() -> contextlib.AbstractContextManager[None]:
    """A collected job: no DELJOB to the other holders."""
    original = cj._on_gotack

    def on_gotack(node: Node, sender: str, msg: bus.GotAck) -> None:
        with patched(cj, "_deljob_to_holders", lambda node, job: None):
            original(node, sender, msg)

    return handler(bus.GotAck, on_gotack)


def ack_not_marked() -> contextlib.AbstractContextManager[None]:
    """acknowledge() dequeues and logs, but leaves the job ACTIVE."""

    def acknowledge(self: Node, job: Job) -> None:
        if job.state == JobState.ACKED:
            return
        self.dequeue(job)
        job.nodes_confirmed = None
        self.update_awake(job)
        self._notify("acked", job)

    return patched(Node, "acknowledge", acknowledge)


def setack_not_answered() -> contextlib.AbstractContextManager[None]:
    """SETACK acknowledges but never answers GOTACK."""

    def on_setack(node: Node, sender: str, msg: bus.SetAck) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None:
            if job.state == JobState.WAIT_REPL:
                cj.replication_achieved(node, job)
            node.acknowledge(job)
            node.try_gc(job)

    return handler(bus.SetAck, on_setack)


def pause_in_ignored() -> contextlib.AbstractContextManager[None]:
    """REPLJOB stores copies for a queue paused in input."""
    original = cj._on_repljob

    def on_repljob(node: Node, sender: str, msg: bus.ReplJob) -> None:
        with patched(cj, "PAUSED_IN", 0):  # the handler's view only
            original(node, sender, msg)

    return handler(bus.ReplJob, on_repljob)


# ------------------------------------- issue #16: the explorer's checks


def command(name: str, fn: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """Replace a core command's handler (each NodeServer copies the table
    when it starts: the mutant is applied before the World is built)."""
    old = CORE_COMMANDS[name]
    return patched_item(CORE_COMMANDS, name, Command(old.name, old.arity, old.flags, fn, old.core))


@contextlib.contextmanager
def patched_item(table: dict[str, Any], key: str, value: Any) -> Iterator[None]:
    old = table[key]
    table[key] = value
    try:
        yield
    finally:
        table[key] = old


def nack_counts_delivery() -> contextlib.AbstractContextManager[None]:
    """NACK counts an additional delivery instead of a nack (model-read:
    SHOW, GETJOB WITHCOUNTERS)."""
    return command("nack", lambda node, argv: jobcmds._enqueue_generic(node, argv, False))


def jscan_drops_page_end() -> contextlib.AbstractContextManager[None]:
    """JSCAN leaves out the last job of every page but the final one
    (model-read: JSCAN completeness)."""

    def jscan(node: Node, argv: list[bytes]) -> Any:
        reply = jobcmds.jscan(node, argv)
        assert isinstance(reply, list)
        cursor, items = reply
        if cursor != "0" and isinstance(items, list) and len(items) > 1:
            return [cursor, items[:-1]]
        return reply

    return command("jscan", jscan)


def pause_out_ignored() -> contextlib.AbstractContextManager[None]:
    """GETJOB takes jobs from a queue paused out (pause-out)."""
    return patched(queuecmds, "PAUSED_OUT", 0)


def leaving_getjob_blocks() -> contextlib.AbstractContextManager[None]:
    """A leaving node lets GETJOB block instead of answering -LEAVING (leaving)."""

    def getjob(node: Node, argv: list[bytes]) -> Any:
        with patched(node, "leaving", False):
            return queuecmds.getjob(node, argv)

    return command("getjob", getjob)


def leaving_serves_nothing() -> contextlib.AbstractContextManager[None]:
    """A leaving node stops delivering the jobs it holds (leaving: it keeps
    serving them until they move on)."""

    def getjob(node: Node, argv: list[bytes]) -> Any:
        # A GETJOB that would block still gets -LEAVING; NOHANG gets nothing.
        if node.leaving and any(a.lower() == b"nohang" for a in argv):
            return NULL_ARRAY
        return queuecmds.getjob(node, argv)

    return command("getjob", getjob)


def ack_leaves_queued() -> contextlib.AbstractContextManager[None]:
    """ACKJOB acknowledges a queued job without taking it out of its queue
    (absurd reads: QPEEK lists a job whose ack the node answered)."""

    def acknowledge(self: Node, job: Job) -> None:
        if job.state == JobState.ACKED:
            return
        in_queue = job.state == JobState.QUEUED
        self.dequeue(job)
        if in_queue:
            q = self.queues.get(job.queue)
            if q is not None:
                q.jobs.add(job)  # back in the queue's list, the state says acked
        job.state = JobState.ACKED
        job.nodes_confirmed = None
        self.update_awake(job)
        if self.persisting and job.body is not None:
            self.effects.append(Persist(aof_records.ackjob(job.id)))
        self._notify("acked", job)

    return patched(Node, "acknowledge", acknowledge)


def ack_not_persisted() -> contextlib.AbstractContextManager[None]:
    """Acks and deletions write no AOF record: a restarted node loads acked
    and collected jobs back as live ones (acked-survives-restart)."""

    class NoAckLog:
        def __getattr__(self, name: str) -> Any:
            return getattr(aof_records, name)

        @staticmethod
        def ackjob(job_id: str) -> bytes:
            return b""

        @staticmethod
        def deljob(job_id: str) -> bytes:
            return b""

    return patched(core_node, "aof", NoAckLog())


def async_one_copy_short() -> contextlib.AbstractContextManager[None]:
    """ADDJOB ASYNC sends one copy fewer than REPLICATE asks (async-replicated)."""
    original = cj.replicate

    def replicate(node: Any, job: Job, count: int, noreply: bool) -> int:
        if noreply and count > 0 and job.id not in node.jobs:
            count -= 1
        return original(node, job, count, noreply)

    return patched(cj, "replicate", replicate)


def shutdown_rewrite_drops_active() -> contextlib.AbstractContextManager[None]:
    """SHUTDOWN REWRITE-AOF writes the queued jobs only (shutdown-no-amnesia)."""

    def shutdown_rewrite(self: AppendOnlyFile) -> None:
        node = self.server.node
        data = b"".join(
            aof_records.loadjob(core_records.job_record(j))
            for j in node.jobs.values()
            if j.body is not None and j.state == JobState.QUEUED
        )
        self.disk.replace(self.path, data)

    return patched(AppendOnlyFile, "shutdown_rewrite", shutdown_rewrite)


EXPLORER_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "nack-counts-delivery": nack_counts_delivery,
    "jscan-drops-page-end": jscan_drops_page_end,
    "pause-out-ignored": pause_out_ignored,
    "leaving-getjob-blocks": leaving_getjob_blocks,
    "leaving-serves-nothing": leaving_serves_nothing,
    "ack-leaves-queued": ack_leaves_queued,
    "ack-not-persisted": ack_not_persisted,
    "async-one-copy-short": async_one_copy_short,
    "shutdown-rewrite-drops-active": shutdown_rewrite_drops_active,
}
# ------------------------------------------ timers, NACK/WORKING, failure
# detector, ack collection, fsync policy (issue #15)


def requeue_skips_deliverer() -> contextlib.AbstractContextManager[None]:
    """The node that delivered a job never re-queues it at RETRY."""
    original = Node._requeue

    def _requeue(self: Node, job: Job, now: int) -> None:
        if job.flags & FLAG_DELIVERED and job.retry:
            job.qtime = now + job.retry * 1000
            return
        original(self, job, now)

    return patched(Node, "_requeue", _requeue)


def nack_waits_retry() -> contextlib.AbstractContextManager[None]:
    """NACK takes effect only at RETRY (it pushes the timer, no re-queue)."""
    original = Node.enqueue

    def enqueue(self: Node, job: Job, nack: bool = False, now: int = 0) -> bool:
        if not nack:
            return original(self, job, nack, now)
        if job.state != JobState.ACTIVE or not job.retry:
            return False
        job.flags |= FLAG_BCAST_WILLQUEUE
        self.set_requeue_time(job, self.now_ms() + job.retry * 1000)
        return True

    return patched(Node, "enqueue", enqueue)


def working_no_postpone() -> contextlib.AbstractContextManager[None]:
    """WORKING answers and tells the other holders, but does not postpone
    the re-queue on the node it was sent to."""
    original = jobcmds.working

    def working(node: Node, argv: list[bytes]) -> Any:
        job = node.lookup(argv[1].decode()) if len(argv) > 1 else None
        qtime = job.qtime if job is not None else 0
        reply = original(node, argv)
        if job is not None and job.qtime != qtime:
            node.set_requeue_time(job, qtime)
        return reply

    return command("working", working)


@contextlib.contextmanager
def _unanswered_for_consumers() -> Iterator[None]:
    """Since 47601fb the node whose consumer has a job answers another
    holder's WILLQUEUE with DELIVERED: a second line of defence that hides
    the mutants below from every check (that holder no longer re-queues at
    its RETRY). They take it away as well, so that what they break is
    judged again: the holders never told a consumer has the job."""
    with patched(cj, "_tell_one_delivered", lambda node, job, node_id: None):
        yield


@contextlib.contextmanager
def working_not_broadcast() -> Iterator[None]:
    """WORKING postpones the local re-queue only: the other holders are not
    told and re-queue at their RETRY (nor answered DELIVERED: above)."""
    with patched(cj, "broadcast_working", lambda node, job: None), _unanswered_for_consumers():
        yield


def pfail_never_set() -> contextlib.AbstractContextManager[None]:
    """The failure detector never flags a peer PFAIL (so never FAIL)."""
    original = ClusterTable._check_node

    def check_node(self: ClusterTable, node: PeerNode, now: int) -> None:
        before = node.flags & PFAIL
        original(self, node, now)
        if not before:
            node.flags &= ~PFAIL

    return patched(ClusterTable, "_check_node", check_node)


def fail_needs_every_report() -> contextlib.AbstractContextManager[None]:
    """FAIL needs a report from every other node, the failing one included:
    a node cut off is never flagged FAIL."""

    def maybe_mark_failed(self: ClusterTable, node: PeerNode, now: int) -> None:
        if not node.flags & PFAIL or node.flags & FAIL:
            return
        reports = [r for r in node.fail_reports if r != node.node_id]
        if len(reports) + 1 < self.size:
            return
        node.flags = (node.flags & ~PFAIL) | FAIL
        node.fail_time = now

    return patched(ClusterTable, "_maybe_mark_failed", maybe_mark_failed)


def fail_never_cleared() -> contextlib.AbstractContextManager[None]:
    """A node flagged FAIL stays FAIL when it is heard from again."""
    heard, link = ClusterTable.heard_from, ClusterTable.link_changed

    def heard_from(self: ClusterTable, sender: PeerNode) -> None:
        failed = sender.flags & FAIL
        heard(self, sender)
        sender.flags |= failed

    def link_changed(self: ClusterTable, node_id: str, up: bool, now: int) -> None:
        node = self.nodes.get(node_id)
        failed = node.flags & FAIL if node is not None else 0
        link(self, node_id, up, now)
        if node is not None:
            node.flags |= failed

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with (
            patched(ClusterTable, "heard_from", heard_from),
            patched(ClusterTable, "link_changed", link_changed),
        ):
            yield

    return both()


def ackjob_no_dummy() -> contextlib.AbstractContextManager[None]:
    """An ACKJOB to a node that lacks the job makes no dummy ack."""
    return patched(jobcmds, "_dummy_ack", lambda node, job_id: None)


def dummy_ack_never_collected() -> contextlib.AbstractContextManager[None]:
    """A dummy ack keeps telling the cluster, but is never collected (not
    by its timer, not when the answers come back)."""
    original, on_gotack = Node.try_gc, cj._on_gotack

    def try_gc(self: Node, job: Job) -> None:
        if job.state == JobState.ACKED and job.is_dummy_ack:
            cj.send_setack(self, job)
            return
        original(self, job)

    def gotack(node: Node, sender: str, msg: bus.GotAck) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None and job.state == JobState.ACKED and job.is_dummy_ack:
            return
        on_gotack(node, sender, msg)

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with patched(Node, "try_gc", try_gc), handler(bus.GotAck, gotack):
            yield

    return both()


def everysec_never_fsyncs() -> contextlib.AbstractContextManager[None]:
    """appendfsync everysec never fsyncs."""
    return patched(AppendOnlyFile, "every_second", lambda self: None)


def everysec_lazy() -> contextlib.AbstractContextManager[None]:
    """appendfsync everysec fsyncs every 8 seconds."""
    original = AppendOnlyFile.every_second
    calls: dict[int, int] = {}

    def every_second(self: AppendOnlyFile) -> None:
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] % 8 == 0:
            original(self)

    return patched(AppendOnlyFile, "every_second", every_second)


def ttl_skips_queued() -> contextlib.AbstractContextManager[None]:
    """The expiry timer skips queued jobs."""
    original = Node.process_job

    def process_job(self: Node, job: Job, now: int) -> None:
        if job.state == JobState.QUEUED and job.etime * 1000 <= now:
            self.update_awake(job, at=now + 1000)
            return
        original(self, job, now)

    return patched(Node, "process_job", process_job)


def ttl_misread_on_reload() -> contextlib.AbstractContextManager[None]:
    """An AOF reload reads the expire time as a TTL from now."""
    original = core_records.job_from_record

    def job_from_record(node: Any, rec: Any, now: int) -> Job | None:
        job = original(node, rec, now)
        if job is not None:
            job.etime = now // 1000 + max(60, job.etime - job.ctime // 1_000_000_000)
        return job

    return patched(core_records, "job_from_record", job_from_record)


def pipelined_run_stalls() -> contextlib.AbstractContextManager[None]:
    """The end of a batch settles a run of pipelined ADDJOBs, then reads the
    socket again without running the commands the connection's reader read
    while the run waited (the hang fixed in 67feb4c)."""

    async def settle_at_end(self: _Connection, run: list[Any]) -> bool:
        await self._settle(run)
        return False

    return patched(_Connection, "_settle_at_end", settle_at_end)


# ---------------------------------- NACK/ENQUEUE with DELAY, and WAITJOB


def postpone_not_broadcast() -> contextlib.AbstractContextManager[None]:
    """NACK/ENQUEUE DELAY holds the job on the node asked, but the other
    holders are never told (no POSTPONE): they re-queue at their RETRY
    (nack-delay-told; nack-delay-holds when a consumer takes it early)."""
    return patched(cj, "broadcast_postpone", lambda node, job, delay_ms, flags: None)


def postpone_keeps_timer() -> contextlib.AbstractContextManager[None]:
    """A holder told POSTPONE dequeues its copy and counts, but does not
    push its re-queue time past the delay (nack-delay-told)."""
    original = cj._on_postpone

    def on_postpone(node: Node, sender: str, msg: bus.Postpone) -> None:
        job = node.jobs.get(msg.job_id)
        qtime = job.qtime if job is not None else 0
        original(node, sender, msg)
        if job is not None and job.state == JobState.ACTIVE and job.qtime != qtime:
            node.set_requeue_time(job, qtime)

    return handler(bus.Postpone, on_postpone)


@contextlib.contextmanager
def postpone_skips_queued() -> Iterator[None]:
    """POSTPONE is handled for active copies only: a copy queued there
    (a QUEUED lost, a holder that re-queued at its RETRY: its WILLQUEUE
    unanswered, see _unanswered_for_consumers) stays queued and goes to the
    next consumer before the delay (nack-delay-told)."""
    original = cj._on_postpone

    def on_postpone(node: Node, sender: str, msg: bus.Postpone) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None and job.state == JobState.QUEUED:
            return
        original(node, sender, msg)

    with handler(bus.Postpone, on_postpone), _unanswered_for_consumers():
        yield


def delay_timer_not_rescheduled() -> contextlib.AbstractContextManager[None]:
    """NACK/ENQUEUE DELAY sets the queue time but leaves the job's timer
    where it was (its RETRY): a delay shorter than the RETRY left ends
    late (nack-delay-ends)."""
    original = Node.enqueue_later

    def enqueue_later(self: Node, job: Job, delay_ms: int, nack: bool) -> bool:
        with patched(self, "update_awake", lambda job, at=0, now=0: None):
            return original(self, job, delay_ms, nack)

    return patched(Node, "enqueue_later", enqueue_later)


def delay_lost_on_reload() -> contextlib.AbstractContextManager[None]:
    """The AOF reload ignores the delay flag: a job within a client's NACK
    or ENQUEUE DELAY comes back as any re-queue, its queue time capped at
    its RETRY after the load (aof-keeps-delay)."""
    original = core_records.job_from_record

    def job_from_record(node: Any, rec: Any, now: int) -> Job | None:
        return original(node, attrs.evolve(rec, flags=rec.flags & ~FLAG_DELAYED), now)

    return patched(core_records, "job_from_record", job_from_record)


def delay_answers_retry0() -> contextlib.AbstractContextManager[None]:
    """NACK/ENQUEUE DELAY of a delivered RETRY 0 job leaves it alone but
    counts it as taken (the refusal's return value inverted): the client
    is told it will come back, against the at-most-once rule it never will
    (retry0-refused)."""
    original = Node.enqueue_later

    def enqueue_later(self: Node, job: Job, delay_ms: int, nack: bool) -> bool:
        if job.retry == 0 and job.state == JobState.ACTIVE and job.flags & FLAG_DELIVERED:
            return True
        return original(self, job, delay_ms, nack)

    return patched(Node, "enqueue_later", enqueue_later)


def waitjob_tombstone_acked() -> contextlib.AbstractContextManager[None]:
    """WAITJOB reads every tombstone as an ack (expired jobs included)
    (waitjob-true)."""
    original = jobwaits.outcome

    def outcome(node: Any, job_id: str) -> str | None:
        value = original(node, job_id)
        return jobwaits.ACKED if value == jobwaits.GONE else value

    return patched(jobwaits, "outcome", outcome)


def waitjob_deaf_to_tombstones() -> contextlib.AbstractContextManager[None]:
    """WAITJOB wakes on an ack held here only: a job deleted while a client
    waits (FASTACK elsewhere and its DELJOB, a collection, an expiry) leaves
    it blocked until its timeout (waitjob-true's bound)."""
    original = Node.remember_deleted

    def remember_deleted(
        self: Node, job_id: str, acked: bool = False, handed: int | None = None
    ) -> None:
        with patched(self, "job_waiters", {}):
            original(self, job_id, acked, handed)

    return patched(Node, "remember_deleted", remember_deleted)


def deljob_forgets_ack() -> contextlib.AbstractContextManager[None]:
    """A holder deleting its copy on a DELJOB (FASTACK, collection) keeps
    a tombstone that does not say acked: WAITJOB there answers gone for an
    acked job (waitjob-true)."""
    original = cj._on_deljob

    def on_deljob(node: Node, sender: str, msg: bus.DelJob) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None and job.state not in (JobState.WAIT_REPL, JobState.ACKED):
            node.unregister(job)
            return
        original(node, sender, msg)

    return handler(bus.DelJob, on_deljob)


DELAY_WAIT_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "postpone-not-broadcast": postpone_not_broadcast,
    "postpone-keeps-timer": postpone_keeps_timer,
    "postpone-skips-queued": postpone_skips_queued,
    "delay-timer-not-rescheduled": delay_timer_not_rescheduled,
    "delay-lost-on-reload": delay_lost_on_reload,
    "delay-answers-retry0": delay_answers_retry0,
    "waitjob-tombstone-acked": waitjob_tombstone_acked,
    "waitjob-deaf-to-tombstones": waitjob_deaf_to_tombstones,
    "deljob-forgets-ack": deljob_forgets_ack,
}


# ------------------------------------------------ what users observe (#45)


def queue_newest_first() -> contextlib.AbstractContextManager[None]:
    """The queue's pop takes the wrong end: GETJOB serves the newest job
    (order)."""

    def pop_oldest(self: Queue) -> str | None:
        if not self.jobs:
            return None
        return self.jobs.pop(-1).id  # type: ignore[no-any-return]

    return patched(Queue, "pop_oldest", pop_oldest)


def copy_drops_counters() -> contextlib.AbstractContextManager[None]:
    """A copy made from a REPLJOB or YOURJOBS leaves its counters at zero
    (two fields not copied): a job NACKed, then moved by NEEDJOBS, shows
    nacks 0 on its new holder (counters-follow)."""
    original = core_records.job_from_data

    def job_from_data(node: Any, data: Any) -> Job:
        return original(node, attrs.evolve(data, nacks=0, deliveries=0))

    return patched(cj, "job_from_data", job_from_data)


def yourjobs_drops_nacks() -> contextlib.AbstractContextManager[None]:
    """YOURJOBS copies the additional deliveries but not the nacks (one
    field forgotten on the NEEDJOBS path only) (counters-follow)."""
    original = cj._on_yourjobs

    def on_yourjobs(node: Node, sender: str, msg: bus.YourJobs) -> None:
        original(node, sender, bus.YourJobs(tuple(attrs.evolve(d, nacks=0) for d in msg.jobs)))

    return handler(bus.YourJobs, on_yourjobs)


Pending = tuple[str, ...]


def _rewrite_record(
    change: Callable[[Job, Pending], bytes | None],
) -> contextlib.AbstractContextManager[None]:
    """The AOF rewrite's (and SHUTDOWN REWRITE-AOF's) record of a job (with
    its pending holders), written by ``change``; the records of each change
    stay right."""

    def record(job: Job, pending: Pending = ()) -> bytes | None:
        return change(job, pending)

    return patched(server_aof, "aof_record", record)


def rewrite_drops_dummy_acks() -> contextlib.AbstractContextManager[None]:
    """The rewrite leaves dummy acks out (no body, so nothing to save, it
    thinks): after a restart the node forgets the ack (rewrite-keeps-state)."""
    original = core_records.aof_record
    return _rewrite_record(
        lambda job, pending: None if job.body is None else original(job, pending)
    )


def rewrite_drops_counters() -> contextlib.AbstractContextManager[None]:
    """The rewrite writes each job with fresh counters (rewrite-keeps-state)."""
    original = core_records.aof_record

    def record(job: Job, pending: Pending) -> bytes | None:
        if job.body is None or job.state == JobState.WAIT_REPL:
            return original(job, pending)
        rec = attrs.evolve(core_records.job_record(job, pending), nacks=0, deliveries=0)
        return aof_records.loadjob(rec)

    return _rewrite_record(record)


def rewrite_drops_acked() -> contextlib.AbstractContextManager[None]:
    """The rewrite skips acked jobs (they will be collected soon, it
    thinks): reloaded, the job is active again (rewrite-keeps-state)."""
    original = core_records.aof_record
    return _rewrite_record(
        lambda job, pending: (
            None if job.state == JobState.ACKED and job.body else original(job, pending)
        )
    )


def rewrite_resets_delay() -> contextlib.AbstractContextManager[None]:
    """The rewrite writes a job within a client's DELAY without its delay
    flag (rewrite-keeps-state)."""
    original = core_records.aof_record

    def record(job: Job, pending: Pending) -> bytes | None:
        if job.body is None or not job.flags & FLAG_DELAYED or job.state == JobState.WAIT_REPL:
            return original(job, pending)
        rec = attrs.evolve(core_records.job_record(job, pending), flags=job.flags & ~FLAG_DELAYED)
        return aof_records.loadjob(rec)

    return _rewrite_record(record)


def pause_bcast_needs_queue() -> contextlib.AbstractContextManager[None]:
    """A PAUSE from the bus is applied only to a queue the node has (no
    queue created for it): a node that never saw the queue ignores the
    broadcast (pause-bcast)."""

    def on_pause(node: Node, sender: str, msg: bus.Pause) -> None:
        if msg.queue in node.queues:
            node.set_pause(msg.queue, Pause(msg.flags & 3))

    return handler(bus.Pause, on_pause)


def pause_bcast_skips_waiters() -> contextlib.AbstractContextManager[None]:
    """A PAUSE from the bus sets the flags but does not wake the clients
    blocked on a queue whose output it resumes (pause-bcast)."""

    def on_pause(node: Node, sender: str, msg: bus.Pause) -> None:
        q = node.queue(msg.queue)
        q.pause = msg.flags & 3
        node.schedule_queue_gc(q)

    return handler(bus.Pause, on_pause)


def nack_requeues_retry0() -> contextlib.AbstractContextManager[None]:
    """NACK forgets the at-most-once branch: a delivered RETRY 0 job goes
    back in its queue (retry0-refused, retry0-once-cluster)."""
    original = Node.enqueue

    def enqueue(self: Node, job: Job, nack: bool = False, now: int = 0) -> bool:
        if nack and job.retry == 0 and job.state == JobState.ACTIVE:
            job.flags &= ~FLAG_DELIVERED
            job.qtime = job.qtime or 1
        return original(self, job, nack, now)

    return patched(Node, "enqueue", enqueue)


def enqueue_requeues_retry0() -> contextlib.AbstractContextManager[None]:
    """ENQUEUE (the command, no DELAY) forgets the at-most-once branch
    (retry0-refused, retry0-once-cluster)."""
    original = jobcmds._enqueue_generic

    def enqueue_generic(node: Node, argv: list[bytes], nack: bool) -> Any:
        if not nack:
            for raw in argv[1:]:
                job = node.jobs.get(raw.decode(errors="replace"))
                if job is not None and job.retry == 0 and job.state == JobState.ACTIVE:
                    job.flags &= ~FLAG_DELIVERED
                    job.qtime = job.qtime or 1
        return original(node, argv, nack)

    return patched(jobcmds, "_enqueue_generic", enqueue_generic)


def leaving_takes_copies() -> contextlib.AbstractContextManager[None]:
    """A leaving node still stores new copies from REPLJOB (the leaving test
    forgotten in the handler) (leaving-no-copies)."""
    original = cj._on_repljob

    def on_repljob(node: Node, sender: str, msg: bus.ReplJob) -> None:
        with patched(node, "leaving", False):
            original(node, sender, msg)

    return handler(bus.ReplJob, on_repljob)


def collect_on_first_gotack() -> contextlib.AbstractContextManager[None]:
    """GOTACK collects the job once the sender confirmed, without looking
    at the other holders (a comparison of one against all)
    (always-collect-after-confirms)."""
    original = cj._on_gotack

    def on_gotack(node: Node, sender: str, msg: bus.GotAck) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None and job.state == JobState.ACKED and not job.is_dummy_ack and msg.known:
            job.nodes_confirmed = (*(job.nodes_confirmed or ()), sender)
            node.probe("ack-collected", job)
            cj.broadcast_deljob(node, job.id, job)
            node.unregister(job)
            return
        original(node, sender, msg)

    return handler(bus.GotAck, on_gotack)


def load_ack_not_indexed() -> contextlib.AbstractContextManager[None]:
    """An ACKJOB record replayed at load marks the job acked without
    putting it in the node's acked set (always-acked-indexed)."""
    original = Node.acknowledge

    def acknowledge(self: Node, job: Job) -> Any:
        result = original(self, job)
        if not self.persisting and self.jobs.get(job.id) is job:
            self.acked_jobs.pop(job.id, None)
        return result

    return patched(Node, "acknowledge", acknowledge)


OBSERVE_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "queue-newest-first": queue_newest_first,
    "copy-drops-counters": copy_drops_counters,
    "yourjobs-drops-nacks": yourjobs_drops_nacks,
    "rewrite-drops-dummy-acks": rewrite_drops_dummy_acks,
    "rewrite-drops-counters": rewrite_drops_counters,
    "rewrite-drops-acked": rewrite_drops_acked,
    "rewrite-resets-delay": rewrite_resets_delay,
    "pause-bcast-needs-queue": pause_bcast_needs_queue,
    "pause-bcast-skips-waiters": pause_bcast_skips_waiters,
    "nack-requeues-retry0": nack_requeues_retry0,
    "enqueue-requeues-retry0": enqueue_requeues_retry0,
    "leaving-takes-copies": leaving_takes_copies,
    "collect-on-first-gotack": collect_on_first_gotack,
    "load-ack-not-indexed": load_ack_not_indexed,
}


# ------------------------------------------- fail-over and cross-node
# delivery (issue 57)


def failover_off() -> contextlib.AbstractContextManager[None]:
    """A lost node's queued jobs are left to their RETRY: no survivor takes
    them over (failover-timely)."""
    return patched(cj, "take_over", lambda node, job, lost, now: None)


def failover_no_standby() -> contextlib.AbstractContextManager[None]:
    """Every surviving holder takes a lost node's job over at once, as if
    each were the one chosen: the job is queued on several nodes at once
    (failover-once)."""
    original = cj.take_over

    def take_over(node: Node, job: Job, lost: str, now: int) -> None:
        with patched(cj, "_id_mix", lambda h, job_id: b"\xff" if h == node.node_id else b""):
            original(node, job, lost, now)

    return patched(cj, "take_over", take_over)


def deliveries_untold() -> contextlib.AbstractContextManager[None]:
    """A job handed to a client is not told to its other holders: they
    re-queue it at RETRY from its last queueing, and take it over if its
    node is lost while its consumer works on it (delivery-told,
    failover-holds)."""

    def tell_deliveries(self: Node) -> None:
        self.delivered_untold.clear()

    return patched(Node, "tell_deliveries", tell_deliveries)


def havejobs_never_sent() -> contextlib.AbstractContextManager[None]:
    """A job queued on a node with no consumer of its own waiting is not
    announced to the nodes that asked for jobs of its queue (HAVEJOBS):
    they ask again only at their NEEDJOBS back-off (federation-prompt)."""
    return patched(cj, "tell_interested", lambda node, q, now: None)


def incarnation_ignored() -> contextlib.AbstractContextManager[None]:
    """A heartbeat from a new incarnation of a node (it restarted) is not
    taken for a loss: what it had queued waits for its RETRY, or its FAIL
    (failover-timely, a crash shorter than the time to FAIL)."""
    original = ClusterTable.on_heartbeat

    def on_heartbeat(self: ClusterTable, msg: bus.Heartbeat, now: int) -> None:
        lost = msg.sender in self.lost
        original(self, msg, now)
        if not lost:
            self.lost.pop(msg.sender, None)

    return patched(ClusterTable, "on_heartbeat", on_heartbeat)


def leaving_retry0_dropped() -> contextlib.AbstractContextManager[None]:
    """The fix of cb06e48 reverted: the ENQUEUE of a RETRY 0 job from the
    node that added it and kept no copy (leaving) finds the copy's queue
    time 0 (at most once) and does nothing; the job was answered and is
    never delivered (leaving-added-delivered)."""
    original = cj._on_enqueue

    def on_enqueue(node: Node, sender: str, msg: bus.Enqueue) -> None:
        job = node.jobs.get(msg.job_id)
        if job is not None and job.retry == 0:
            return
        original(node, sender, msg)

    return handler(bus.Enqueue, on_enqueue)


FAILOVER_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "failover-off": failover_off,
    "failover-no-standby": failover_no_standby,
    "deliveries-untold": deliveries_untold,
    "havejobs-never-sent": havejobs_never_sent,
    "incarnation-ignored": incarnation_ignored,
    "leaving-retry0-dropped": leaving_retry0_dropped,
}


def fsync_retry_trusted() -> contextlib.AbstractContextManager[None]:
    """After a failed fsync the writer fsyncs again and takes its success
    for the durability of what it wrote before (the fix of issue 58
    reverted: no rewrite from memory). On Linux, and in sim/disk.py, those
    bytes stay in the page cache only: answered, then lost at a crash
    (always-no-amnesia, disk-answered)."""
    original = AppendOnlyFile._fsync

    def fsync(self: AppendOnlyFile) -> bool:
        ok = original(self)
        self._fsync_lost = False
        return ok

    return patched(AppendOnlyFile, "_fsync", fsync)


def disk_failure_answered() -> contextlib.AbstractContextManager[None]:
    """A write that fails is taken as done: the replies waiting for it go
    out, as if the disk had taken it (disk-answered)."""
    original = AppendOnlyFile._write_failed

    def write_failed(self: AppendOnlyFile, e: OSError) -> None:
        original(self, e)
        self._unwritten.clear()
        self._done_upto(self._appended)

    return patched(AppendOnlyFile, "_write_failed", write_failed)


def misconf_never_cleared() -> contextlib.AbstractContextManager[None]:
    """The retry that works writes what waited but leaves the error set:
    write commands are refused with -MISCONF for ever after the disk works
    again (disk-answered: a refusal only from a node whose disk failed
    lately)."""
    original = AppendOnlyFile.write_now

    def write_now(self: AppendOnlyFile, force: bool = False) -> None:
        error = self.last_write_error
        original(self, force)
        if error is not None and self.last_write_error is None:
            self.last_write_error = error

    return patched(AppendOnlyFile, "write_now", write_now)


DISK_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "fsync-retry-trusted": fsync_retry_trusted,
    "disk-failure-answered": disk_failure_answered,
    "misconf-never-cleared": misconf_never_cleared,
}


def negotiated_version_ignored() -> contextlib.AbstractContextManager[None]:
    """A link that comes up takes the peer to speak this node's highest
    version, whatever the handshake settled: a node of an older release
    gets messages it has no decoder for (version-gated)."""
    from disque_trio.server.peers import Bus

    original = Bus._speaks

    def speaks(self: Bus, link: Any, version: int) -> None:
        original(self, link, self.table.protocol)

    return patched(Bus, "_speaks", speaks)


def old_heartbeat_says_new() -> contextlib.AbstractContextManager[None]:
    """A heartbeat tells this release's version and an incarnation whatever
    the version the node plays: an older release says what it cannot
    (version-gated)."""

    def heartbeat(self: ClusterTable, kind: type[bus.Heartbeat]) -> bus.Heartbeat:
        myself = self.myself
        flags = (
            myself.flags & LEAVING
            | bus.PROTOCOL_VERSION << bus.VERSION_SHIFT
            | myself.incarnation << bus.INCARNATION_SHIFT
        )
        return kind(self.node_id, flags, self.gossip())

    return patched(ClusterTable, "heartbeat", heartbeat)


# ------------------------------- issue 58: options the explorer now judges


def show_ttl_as_given() -> contextlib.AbstractContextManager[None]:
    """SHOW's ttl is the TTL the job was given, not what is left of it
    (model-read: SHOW's TTL)."""
    original = jobcmds.job_info

    def job_info(node: Node, job: Job) -> list[Any]:
        reply = original(node, job)
        at = reply.index("ttl") + 1
        reply[at] = job.etime - job.ctime // 1_000_000_000
        return reply

    return patched(jobcmds, "job_info", job_info)


def _without(argv: list[bytes], name: bytes) -> list[bytes]:
    """argv less every ``name value`` option pair."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].lower() == name and i + 1 < len(argv):
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def jscan_state_ignored() -> contextlib.AbstractContextManager[None]:
    """JSCAN ignores its STATE filters (model-read: JSCAN STATE)."""
    return command("jscan", lambda node, argv: jobcmds.jscan(node, _without(argv, b"state")))


def qscan_maxlen_ignored() -> contextlib.AbstractContextManager[None]:
    """QSCAN ignores MAXLEN (model-read: QSCAN MINLEN/MAXLEN)."""
    return command("qscan", lambda node, argv: queuecmds.qscan(node, _without(argv, b"maxlen")))


def getjob_first_queue_only() -> contextlib.AbstractContextManager[None]:
    """GETJOB looks at the first queue it is given only (model-read:
    GETJOB's count, FROM an empty queue and a model queue)."""

    def getjob(node: Node, argv: list[bytes]) -> Any:
        at = [a.lower() for a in argv].index(b"from")
        return queuecmds.getjob(node, argv[: at + 2])

    return command("getjob", getjob)


def dequeue_first_id_only() -> contextlib.AbstractContextManager[None]:
    """DEQUEUE acts on its first ID only (model-read: the count a job
    command given several IDs answers)."""
    return command("dequeue", lambda node, argv: jobcmds.dequeue(node, argv[:2]))


def getjob_count_zero_accepted() -> contextlib.AbstractContextManager[None]:
    """GETJOB COUNT 0 is taken for "as many as there are": the bound is off
    by one (odd-answered: a malformed command gets an error)."""
    from disque_trio.core import args as core_args

    def positive_count(arg: bytes) -> int:
        value = core_args.parse_int(arg, core_args.COUNT_ERROR)
        if value < 0:
            raise ReplyError("ERR", core_args.COUNT_ERROR)
        return value or 1_000_000

    return patched(core_args, "_positive_count", positive_count)


def cluster_nodes_myself_unflagged() -> contextlib.AbstractContextManager[None]:
    """CLUSTER NODES forgets the myself flag (odd-read); nodes.conf, written
    from the same table, keeps it."""
    from disque_trio.server import clustercmds

    def nodes(ctx: Any, argv: list[bytes]) -> Any:
        return (
            ctx.server.node.cluster.nodes_description()
            .replace(" myself,", " ")
            .replace(" myself ", " ")
        )

    return patched_item(clustercmds._SUBCOMMANDS, (b"nodes", 2), nodes)  # type: ignore[arg-type]


def exit_rewrite_skipped() -> contextlib.AbstractContextManager[None]:
    """The fix of seed 32 reverted: SHUTDOWN REWRITE-AOF writes its snapshot
    when the command runs only, not again at the exit, so a job queued
    during the shutdown's last second comes back active (enqueue-once)."""
    from disque_trio.server.node import NodeServer

    original = NodeServer.shutdown

    def shutdown(self: NodeServer, fsync_aof: bool = True, rewrite_aof: bool = False) -> None:
        original(self, fsync_aof, False)

    return patched(NodeServer, "shutdown", shutdown)


OPTION_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "show-ttl-as-given": show_ttl_as_given,
    "jscan-state-ignored": jscan_state_ignored,
    "qscan-maxlen-ignored": qscan_maxlen_ignored,
    "getjob-first-queue-only": getjob_first_queue_only,
    "dequeue-first-id-only": dequeue_first_id_only,
    "getjob-count-zero-accepted": getjob_count_zero_accepted,
    "cluster-nodes-myself-unflagged": cluster_nodes_myself_unflagged,
    "exit-rewrite-skipped": exit_rewrite_skipped,
}


MIXED_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "negotiated-version-ignored": negotiated_version_ignored,
    "old-heartbeat-says-new": old_heartbeat_says_new,
}


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "pause-in-ignored": pause_in_ignored,
    "gotjob-duplicate-counted": gotjob_duplicate_counted,
    "setack-forgets-one-holder": setack_forgets_one_holder,
    "aof-requeues-retry0": aof_requeues_retry0,
    "queued-skips-dequeue": queued_skips_dequeue,
    "aof-write-dropped": aof_write_dropped,
    "repljob-no-merge": repljob_no_merge,
    "gc-skips-deljob": gc_skips_deljob,
    "ack-not-marked": ack_not_marked,
    "setack-not-answered": setack_not_answered,
    "requeue-skips-deliverer": requeue_skips_deliverer,
    "nack-waits-retry": nack_waits_retry,
    "working-no-postpone": working_no_postpone,
    "working-not-broadcast": working_not_broadcast,
    "pfail-never-set": pfail_never_set,
    "fail-needs-every-report": fail_needs_every_report,
    "fail-never-cleared": fail_never_cleared,
    "ackjob-no-dummy": ackjob_no_dummy,
    "dummy-ack-never-collected": dummy_ack_never_collected,
    "everysec-never-fsyncs": everysec_never_fsyncs,
    "everysec-lazy": everysec_lazy,
    "ttl-skips-queued": ttl_skips_queued,
    "ttl-misread-on-reload": ttl_misread_on_reload,
    "pipelined-run-stalls": pipelined_run_stalls,
}
MUTANTS.update(EXPLORER_MUTANTS)
MUTANTS.update(DELAY_WAIT_MUTANTS)
MUTANTS.update(OBSERVE_MUTANTS)
MUTANTS.update(FAILOVER_MUTANTS)
MUTANTS.update(DISK_MUTANTS)
MUTANTS.update(MIXED_MUTANTS)
MUTANTS.update(OPTION_MUTANTS)


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Apply the named mutant for the duration (None: no mutant)."""
    if name is None:
        yield
        return
    if name not in MUTANTS:
        raise SystemExit(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    with MUTANTS[name]():
        yield


def run_mutant(
    name: str, seeds: tuple[int, ...] = DEFAULT_SEEDS, worker: SeedWorker | None = None
) -> tuple[int | None, list[str]]:
    """The first seed at which the mutant is caught (and why), or None.
    Each seed runs under the wall-clock guard: in a sweep worker (a child
    forked per seed, so the patch dies with it) when one is given, else in
    a process of its own."""
    for seed in seeds:
        if worker is not None:
            if not worker.alive:  # the guard killed it: a fresh one
                worker = SeedWorker()
            request = {"seed": seed, "nodes": None, "duration": None, "mutant": name}
            rc, lines = worker.run(request, SEED_WALL_LIMIT_S)
        else:
            cmd = [sys.executable, "-m", "sim", "run", "--seed", str(seed), "--quiet"]
            rc, lines = run_seed_process([*cmd, "--mutant", name])
        if rc != 0:
            violations = [x[len("VIOLATION ") :] for x in lines if x.startswith("VIOLATION ")]
            return seed, violations or [CRASHED, *lines[-5:]]
    return None, []


def main(
    names: list[str] | None = None, seeds: tuple[int, ...] = DEFAULT_SEEDS, jobs: int = 2
) -> int:
    started = time.perf_counter()
    names = names or list(MUTANTS)
    caught = 0

    local = threading.local()
    workers: list[SeedWorker] = []

    def one(name: str) -> tuple[str, int | None, list[str], float]:
        # One sweep worker per thread: the interpreter and the node code
        # are imported once, not once per seed.
        worker: SeedWorker | None = getattr(local, "worker", None)
        if worker is None or not worker.alive:
            worker = local.worker = SeedWorker()
            workers.append(worker)
        t0 = time.perf_counter()
        seed, violations = run_mutant(name, seeds, worker)
        return name, seed, violations, time.perf_counter() - t0

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for name, seed, violations, wall in pool.map(one, names):
                if seed is None:
                    print(f"{name}: NOT caught ({len(seeds)} seeds, {wall:.1f}s)", flush=True)
                elif violations[0] == CRASHED:
                    last = violations[-1] if len(violations) > 1 else "?"
                    print(f"{name}: NOT caught, CRASHED at seed {seed}: {last}", flush=True)
                else:
                    caught += 1
                    first = violations[0] if violations else "?"
                    print(f"{name}: caught at seed {seed} ({wall:.1f}s): {first}", flush=True)
    finally:
        for worker in workers:
            worker.close()
    print(f"wall time {time.perf_counter() - started:.1f}s", file=sys.stderr)
    print(f"mutants: caught {caught}/{len(names)}")
    return 0 if caught == len(names) else 1
