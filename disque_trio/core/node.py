"""The node: a synchronous state machine holding every job and queue.

Theory of operation
-------------------
The node never awaits, never reads a real clock and never touches a socket or
a file. The shell (``disque_trio.server``) feeds it client commands
(:meth:`Node.execute`), and calls :meth:`Node.tick` when
:meth:`Node.next_deadline` is reached. Time comes from the injected
:class:`Clock`, randomness from the injected ``random.Random``. What the node
wants done outside (send a bus message, append an AOF record, wake a
blocked client, hand jobs to a queue's waiting consumers, log) it records as
a typed effect in :attr:`Node.effects` (``core/effects.py``), which the shell
drains at its one commit point after the call. Because each call is
synchronous and Trio runs one task at a time, every command is atomic
without locks.

Rules kept here (docs/design.md, "Jobs and timers"):

* A job is in exactly one of the states of :class:`JobState`; it is in its
  queue's sorted list if and only if its state is ``QUEUED``.
* Every registered job has exactly one timer in the awake index, at the
  earliest of: expiry, next (re)queue (minus the WILLQUEUE advance), next
  collection attempt for acked jobs. A WILLQUEUE due and a queued job's retry
  point wait for the end of their chatter slot (CHATTER_GRID_MS), never
  firing before they are due.
* Node time never goes back: a backward step of the wall clock is absorbed
  until the next :meth:`tick` or :meth:`cron`, which moves every local timer
  back by the step (see :meth:`follow_clock`).
* RETRY 0 jobs are queued at most once: ``qtime`` becomes 0 on first enqueue.
* ``ACKED`` is absorbing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection

from ..protocol import aof, bus
from ..protocol.replies import NULL_ARRAY, Reply
from . import clusterjobs as cj
from . import jobwaits
from .awake import AwakeIndex
from .cluster import HANDSHAKE, LEAVING, NOT_REACHABLE, ClusterTable
from .effects import Effects, Persist, Wake, WakeQueue
from .host import Clock
from .ids import JobIdGenerator, creator_prefix
from .job import (
    FLAG_ANNOUNCE,
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELAYED,
    FLAG_DELIVERED,
    FLAG_HANDED,
    FLAG_TOLD_QUEUED,
    STATE_ACKED,
    STATE_ACTIVE,
    STATE_QUEUED,
    STATE_WAIT_REPL,
    TIME_ERROR_MS,
    Job,
)
from .queue import PAUSED_IN, PAUSED_OUT, QUEUE_MAX_IDLE_SECONDS, Pause, Queue
from .records import PENDING_HOLDERS_MS, aof_record, job_record, pending_by_job, pending_of
from .scan import ScanSnapshot
from .stats import NodeStats
from .waiters import Waiter

WILLQUEUE_ADVANCE_MS = 500  # WILLQUEUE goes this long before a re-queue
# The timers that only announce or push a retry point (a WILLQUEUE due, a
# queued job's retry point) fire at the end of their CHATTER_GRID_MS slot of
# the wall clock, up to that much late, so that the holders' announcements and
# the answers leave and arrive in batches: one wake-up, one commit and one
# write per peer for every job due in the slot, on every node, instead of one
# for each job's own millisecond. With RETRY 1 every holder of a job does
# this every second for as long as the job lives. The re-queue itself (an
# active job's qtime) keeps its own millisecond: there the random time error
# is what keeps two holders from queueing the same job at once.
CHATTER_GRID_MS = 100
# A job queued here that answered a WILLQUEUE (QUEUED to every holder) is
# not answered again for the next WILLQUEUE of a holder during this many
# cron periods, or twice as many (clusterjobs._on_willqueue): about one
# WILLQUEUE advance.
ANSWERED_QUEUED_CRONS = 3
# Timers one tick runs at most (the original runs 10,000 per call, in C).
# A node holding half a million jobs that fall due together (added in a burst
# with one RETRY) ran them all in one tick: minutes of one CPU-bound call in
# which it served no client, answered no PING (its peers flagged it failing)
# and did not see a SIGTERM. A thousand is tens of milliseconds of Python.
TICK_MAX_TIMERS = 1000
GC_RETRY_MIN_MS = 1000  # first collection retry of an acked job
GC_RETRY_MAX_MS = 180_000  # back-off cap (3 minutes)
GC_RETRY_COUNT_MAX = 10
# IDs of jobs deleted here that a REPLJOB still in flight must not bring back:
# kept this long, and at most this many (the oldest go first).
DELETED_IDS_MS = 60_000
DELETED_IDS_MAX = 100_000
# Memory accounting for maxmemory and INFO: a per-object estimate (measured
# with bench/ on CPython 3.11: a queued job costs about this much besides
# its body), deterministic so that simulated nodes agree with real ones.
JOB_OVERHEAD_BYTES = 600
# Int objects shared by value among the recent ones (Node.shared_int).
SHARED_INTS_MAX = 4096
QUEUE_OVERHEAD_BYTES = 1200
BASE_MEMORY_BYTES = 1 << 20


def _drop_aged(entries: dict[str, int], now: int) -> list[str]:
    """Drop from ``entries`` (ID -> monotonic ms, oldest first) those older
    than DELETED_IDS_MS and the oldest beyond DELETED_IDS_MAX; their IDs."""
    dropped = []
    while entries:
        oldest, at = next(iter(entries.items()))
        if len(entries) <= DELETED_IDS_MAX and now - at <= DELETED_IDS_MS:
            break
        del entries[oldest]
        dropped.append(oldest)
    return dropped


class Node:
    """One Disque node's jobs, queues and timers."""

    def __init__(
        self,
        node_id: str,
        clock: Clock,
        rng: random.Random,
        cluster: ClusterTable | None = None,
    ) -> None:
        self.node_id = node_id
        # Who else is in the cluster and whether they answer. A node started
        # without one is a cluster of one on the default ports.
        self.cluster = cluster or ClusterTable(node_id, "127.0.0.1", 7711, 17711, rng, 15000)
        self.clock = clock
        self.rng = rng
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, Queue] = {}
        self.awake = AwakeIndex(self._timed)
        self.idgen = JobIdGenerator(node_id, rng)
        self.stats = NodeStats()
        # The node list every local-only job shares (copy on write, see job.py).
        self.myself_only: tuple[str, ...] = (node_id,)
        # The cluster view commands read, refreshed from the table by
        # refresh_cluster_view() after every bus event (counting reachable
        # nodes on every ADDJOB would cost O(nodes)).
        self.cluster_size = 1
        # Of those, the members not leaving (this node too, unless it is):
        # ADDJOB's default REPLICATE counts them, so that a rolling restart
        # (each node leaving in turn) refuses no ADDJOB that names none.
        self.staying_size = 1
        self.reachable_peers = 0
        # The peers past their handshake at the last refresh, and what the
        # refresh compared to see whether they could have changed.
        self._members: set[str] = set()
        self._members_key = (1, -1)
        self.leaving = False
        # What the shell must do after each call, in order (core/effects.py).
        # The cluster table records its messages in the same sink.
        self.effects = Effects()
        self.cluster.effects = self.effects
        # The newest QSCAN/JSCAN key order, "jobs" and "queues" (see
        # jobcmds.ScanArgs for why one snapshot serves every scan).
        self.scan_snapshots: dict[str, ScanSnapshot] = {}
        # Whether the AOF is on: changes to jobs are then recorded as
        # Persist effects, written before the replies that depend on them.
        self.persisting = False
        # ADDJOB clients waiting for synchronous replication, by job ID.
        self.repl_waiters: dict[str, Waiter] = {}
        # Jobs deleted here lately, ID -> monotonic ms, oldest first (see
        # remember_deleted).
        self.deleted_ids: dict[str, int] = {}
        # Those of them that were acked (ACKJOB, FASTACK), with the cluster
        # table's version and link count then (acked_epoch): a holder that
        # missed the ack and still announces the job is told (SETACK); an
        # ACKJOB for it makes no new dummy ack unless the membership moved
        # or a peer relinked (maybe restarted) since (jobcmds._dummy_ack).
        self.deleted_acked: dict[str, tuple[int, int]] = {}
        # Of those, the ones this node expired (TTL): a late copy is refused.
        self.deleted_expired: set[str] = set()
        # Of those, the ones whose ADDJOB was answered -NOREPL (the copies
        # told DELJOB): a late copy is refused, its sender told DELJOB.
        self.deleted_refused: set[str] = set()
        # POSTPONEs heard lately (clusterjobs.remember_postpone): ID -> (end
        # of the delay in now_ms, the message's flags, sender), oldest
        # first, bounded (clusterjobs.POSTPONES_HEARD_MAX).
        self.postpones_heard: dict[str, tuple[int, int, str]] = {}
        # Of those, the ones that left alive (hand_over): ID -> expire time
        # (unix s) when the new holder lists this node, else 0.
        self.deleted_moved: dict[str, int] = {}
        # WAITJOB clients by the job IDs they wait for (core/jobwaits.py),
        # and of those IDs, the ones handed over, by expire time.
        self.job_waiters: dict[str, list[Waiter]] = {}
        self.moved_waits: dict[str, int] = {}
        # Node id -> jobs whose holder list it belongs in once its handshake
        # is through (records.merge_holders, adopt_pending_holders).
        self.pending_holders: dict[str, set[str]] = {}
        self.pending_since: dict[str, int] = {}  # node id -> when first named
        # Every acked job held here, dummies too (dummy_acks), in the order
        # acked: when a peer's link comes up, those waiting for it ask it
        # again at once (retry_acks_waiting_on).
        self.acked_jobs: dict[str, None] = {}
        # FASTACKs of jobs unknown here, ID -> monotonic ms, oldest first:
        # their DELJOB went to the nodes known then; a node that joins later
        # gets it too (see resend_unknown_fastacks).
        self.fastacked_unknown: dict[str, int] = {}
        # Jobs queued here whose QUEUED went to every holder in answer to a
        # WILLQUEUE lately (ANSWERED_QUEUED_CRONS): another holder's
        # WILLQUEUE that crossed that answer needs no second one
        # (clusterjobs._on_willqueue).
        self.answered_queued: set[str] = set()
        self.answered_queued_before: set[str] = set()
        self._answered_crons = 0
        # Jobs handed to a client since the last cron whose other holders
        # are not told yet: the cron tells those still in a consumer's hands
        # (DELIVERED), so that they neither re-queue them before RETRY nor
        # take them over if this node is lost (Node.fail_over). A job acked
        # within that tenth of a second costs its holders nothing: told at
        # once, GETJOB plus ACKJOB on three nodes cost 12 to 19 % more CPU
        # per job (DELIVERED; 37 % with WORKING), told at the cron about
        # the same as before (bench_consume_cost). The window it leaves (a
        # node lost within a tenth of a second of a delivery) is covered by
        # this project's clients, which tell another node what they hold.
        self.delivered_untold: dict[str, None] = {}
        # Nodes that asked for jobs of a queue (NEEDJOBS) lately: queue name
        # -> node id -> (monotonic ms of its last NEEDJOBS, of our last
        # HAVEJOBS to it). A job queued here with no consumer of ours
        # waiting tells them at once (clusterjobs.tell_interested).
        self.interest: dict[str, dict[str, tuple[int, int]]] = {}
        # Node id -> the number of its link's last coming up (link_seq, a
        # count, not a time: a clock that steps back must not make a peer
        # look unasked for ever): a peer that (re)linked since a queue's
        # last NEEDJOBS broadcast has not heard that our consumers wait on
        # it (clusterjobs.need_jobs asks it once).
        self.linked_at: dict[str, int] = {}
        self.link_seq = 0
        # Called with (event, job) on job lifecycle events; the simulator's
        # white-box checkers and the WebSocket job streams hook in here. An
        # observer that leaves during a notification replaces the list (a
        # removal in place would make ``_notify`` skip the next one).
        self.observers: list[Callable[[str, Job], None]] = []
        self.body_bytes = 0  # sum of the bodies held, for memory_estimate()
        self._last_ctime = 0
        self._ints: dict[int, int] = {}
        # Seconds an empty queue with no waiters and no pause stays in memory
        # (the cluster layer shortens it under memory pressure).
        self.queue_max_idle = QUEUE_MAX_IDLE_SECONDS
        self.maxmemory = 1 << 30  # bytes; the shell keeps it equal to the config
        self._next_eviction_ms = 0
        # now_ms() never goes back: the newest time it returned, and how far
        # the wall clock went back since the last follow_clock().
        self._last_now = 0
        self._clock_lag = 0
        # Milliseconds of backward steps not yet taken off the expire times
        # (whole seconds): follow_clock() carries the rest to the next step.
        self._etime_lag = 0
        # Seconds the expire times moved back in all (the simulator's AOF
        # check allows a reloaded job the steps whose records a crash lost).
        self.etime_shift_s = 0
        # The view holds from the start: a table given with peers (nodes.conf
        # on a restart) is counted now, not after the first bus event. Taken
        # for a cluster of one until then, a restarted node kept no note of
        # the AOF jobs it expired at start-up, and took a late copy of one
        # again (simulator seed 169392: its wall clock stepped 28 s ahead).
        self.refresh_cluster_view()

    def refresh_cluster_view(self) -> None:
        # One pass (this runs after every bus message): ClusterTable.size
        # and len(ClusterTable.reachable()).
        myself = self.cluster.myself
        size = reachable = leaving = 0
        for peer in self.cluster.nodes.values():
            flags = peer.flags
            if not flags & HANDSHAKE:
                size += 1
                if flags & LEAVING:
                    leaving += 1
            if not flags & NOT_REACHABLE and peer is not myself:
                reachable += 1
        grew = size > self.cluster_size
        key = (size, self.cluster.membership)
        if key != self._members_key:
            self._members_key = key
            self._members_changed()
        self.cluster_size = size
        self.staying_size = size - leaving
        self.reachable_peers = reachable
        self.leaving = bool(myself.flags & LEAVING)
        if self.pending_holders:
            self.adopt_pending_holders()
        if grew and self.dummy_acks:
            self.retry_dummy_acks()
        if grew and self.fastacked_unknown:
            self.resend_unknown_fastacks()
        came_up = self.cluster.came_up
        if came_up:
            if self.acked_jobs:
                self.retry_acks_waiting_on(came_up.keys())
            cj.ask_again_for_waiting_queues(self, came_up.keys())
            came_up.clear()
        lost = self.cluster.lost
        while lost:
            node_id = next(iter(lost))
            del lost[node_id]
            self.fail_over(node_id)

    def fail_over(self, lost: str) -> int:
        """A node was lost (FAIL, or it restarted): every job it had queued
        and not handed to a consumer, as far as this node heard (a copy's
        ``queued_on``), is queued again by one surviving holder now, not
        after its RETRY; the others stand by for it (clusterjobs.take_over).
        One pass over the jobs: a node is lost rarely. Returns how many
        jobs it looked after."""
        now = self.now_ms()
        taken = 0
        for job in list(self.jobs.values()):
            if job.queued_on != lost:
                continue
            job.queued_on = None
            if job.state == STATE_ACTIVE and job.retry:
                cj.take_over(self, job, lost, now)
                taken += 1
        return taken

    def _members_changed(self) -> None:
        """The peers past their handshake may have changed. Each one that
        joined hears SETACK 0 for the jobs acked and deleted here lately
        that it made (a job ID names its maker): a dummy ack goes once
        every node known then confirmed, and the maker may be met only
        later. A node replaced (a new ID) while cut off made a job, acked
        on a node that had not met it yet; the FORGET of its old ID left
        every known node confirmed, the dummy went, and the MEET came
        after: the job was re-queued for ever there (simulator seed
        167823). Told, it acks and collects its copy."""
        myself = self.cluster.myself
        members = {
            node_id
            for node_id, peer in self.cluster.nodes.items()
            if peer is not myself and not peer.flags & HANDSHAKE
        }
        joined = members - self._members
        self._members = members
        if joined and self.deleted_acked:
            makers = {node_id[:8]: node_id for node_id in sorted(joined)}
            for job_id in self.deleted_acked:
                maker = makers.get(creator_prefix(job_id))
                if maker is not None:
                    cj.tell_acked(self, maker, job_id)

    def remember_unknown_fastack(self, job_id: str) -> None:
        """A FASTACK named a job this node does not hold: its DELJOB went to
        every node known now; remember it for a while (as long as a deleted
        ID), so that a node met later hears it too."""
        fastacked = self.fastacked_unknown
        now = self.clock.mono_ms()
        fastacked.pop(job_id, None)
        fastacked[job_id] = now
        _drop_aged(fastacked, now)

    def resend_unknown_fastacks(self) -> None:
        """A node joined: the DELJOB of each recent FASTACK of a job unknown
        here goes out again, to every node. The holder may be one this node
        did not know at the FASTACK (simulator seed 106709: a node restarted
        with the table of its nodes.conf, where a replaced node still had
        its old ID, took a FASTACK at once; the new ID held the only copy of
        a REPLICATE 1 job, which no other holder would ever announce, and
        kept delivering it). A DELJOB for a job a node does not hold is
        only remembered there."""
        _drop_aged(self.fastacked_unknown, self.clock.mono_ms())
        for job_id in self.fastacked_unknown:
            cj.broadcast_deljob(self, job_id, None)

    @property
    def dummy_acks(self) -> set[str]:
        """The dummy acks held here (jobcmds._dummy_ack), of the acked jobs:
        when a node joins, their SETACK goes to it at once, not after a
        back-off grown while it was unknown (simulator seed 20003595)."""
        jobs = self.jobs
        return {job_id for job_id in self.acked_jobs if jobs[job_id].is_dummy_ack}

    def retry_dummy_acks(self) -> None:
        """A node joined: every dummy ack held here must hear from it too,
        so each one asks again soon, its back-off started afresh."""
        now = self.now_ms()
        for job_id in sorted(self.dummy_acks):
            self._ask_again_soon(self.jobs[job_id], now)

    def retry_acks_waiting_on(self, peers: Collection[str]) -> None:
        """Links to ``peers`` came up (again): every acked job still waiting
        for one of them to confirm asks again soon, its back-off started
        afresh. A SETACK written to a connection that then died with its
        peer is lost, and the next try waited out a back-off that grows to
        minutes, while the holder, back, queued its copy at its RETRY
        (simulator seed 138841: a holder frozen, then restarted, delivered
        a job acked elsewhere 3 s after its link was up again, 3 s before
        the acker's next SETACK)."""
        now = self.now_ms()
        for job_id in self.acked_jobs:
            job = self.jobs[job_id]
            confirmed = job.nodes_confirmed or ()
            if job.is_dummy_ack:
                waiting = any(p not in confirmed for p in peers)
            else:
                waiting = any(p in job.nodes_delivered and p not in confirmed for p in peers)
            if waiting:
                self._ask_again_soon(job, now)

    def _ask_again_soon(self, job: Job, now: int) -> None:
        """An acked job sends its SETACKs again within 0.2 s (unless due
        sooner), its collection back-off started afresh."""
        at = now + 100 + self.time_error(200)
        if job.awake > at:
            job.gc_retry = 0
            self.update_awake(job, at)

    def adopt_pending_holders(self) -> None:
        """Add to their jobs' holder lists the nodes that were still in
        their handshake when a peer's list named them, now that they
        answered, and tell each about a copy queued here: if it queued its
        own, the QUEUED rule leaves one; or about the ack of a job acked
        here since, whose collection must now wait for their GOTACK (seed
        492135135: a wiped node's new incarnation took a job by YOURJOBS,
        acked it, and collected it on its one known holder's GOTACK; three
        holders adopted meanwhile held it on). A node that left the table
        (its handshake timed out) may come back by gossip and answer
        (simulator seed 20004545): it is dropped once forgotten (CLUSTER
        FORGET) or PENDING_HOLDERS_MS after it was first named."""
        nodes = self.cluster.nodes
        now = self.now_ms()
        for peer_id in list(self.pending_holders):
            peer = nodes.get(peer_id)
            if peer is None:
                since = self.pending_since.get(peer_id, now)
                if peer_id in self.cluster.blacklist or now - since > PENDING_HOLDERS_MS:
                    del self.pending_holders[peer_id]
                    self.pending_since.pop(peer_id, None)
                continue
            if peer.flags & HANDSHAKE:
                continue
            job_ids = self.pending_holders.pop(peer_id)
            self.pending_since.pop(peer_id, None)
            for job_id in sorted(job_ids):
                job = self.jobs.get(job_id)
                if job is None:
                    # Acked and collected here before it answered (or
                    # refused): a copy it holds, or takes late, is acked
                    # nowhere else (simulator seed 761608: an ADDJOB on a
                    # leaving node copied to a node cut off one way; the job
                    # moved here by YOURJOBS, was acked and collected, and
                    # that copy stayed until its TTL). Told, it acks and
                    # collects it, or refuses the late copy.
                    cj.answer_deleted(self, peer_id, job_id)
                    continue
                if job.state not in (STATE_ACTIVE, STATE_QUEUED, STATE_ACKED):
                    continue
                if job.is_dummy_ack:
                    continue  # asks every node anyway
                if peer_id not in job.nodes_delivered:
                    job.nodes_delivered = (*job.nodes_delivered, peer_id)
                cj.tell_new_holders(self, job, (peer_id,))

    def set_node_id(self, node_id: str) -> None:
        """A new identity (CLUSTER RESET HARD, or loaded from nodes.conf)."""
        self.node_id = node_id
        self.myself_only = (node_id,)
        self.idgen.set_node_id(node_id)

    # ------------------------------------------------------------------ time

    def now_ms(self) -> int:
        """The wall clock, except that it never goes back: a backward step
        is absorbed (time goes on from where it was) until follow_clock()."""
        now = self.clock.wall_ms() + self._clock_lag
        if now < self._last_now:
            self._clock_lag += self._last_now - now
            now = self._last_now
        self._last_now = now
        return now

    def clock_lag_ms(self) -> int:
        """How far back the wall clock stepped that ``now_ms`` still
        absorbs, as of its last call (0: none; follow_clock ends it)."""
        return self._clock_lag

    def follow_clock(self) -> None:
        """Catch up with a wall clock that went back, keeping the time left
        on every timer of the node.

        Re-queue, delay and collection times, idle-queue timers and the
        federation marks are durations counted from a past moment: left in
        the old frame, a step back of a minute would hold a delayed job (or
        a retry, a GC attempt...) for that extra minute. They all move back
        by the step. So do expire times, in whole seconds: each holder's is
        its own (a copy's is the TTL left when sent, added to the
        receiver's clock), so a TTL is a lifetime, not a date. Left put, a
        step back of a minute kept a copy a minute past its TTL and handed
        it to a node whose tombstone of it had aged (simulator seed
        172070). Each moved job is recorded again in the AOF, so a restart
        keeps the moved time. Called at the start of tick() and cron(),
        never while a caller holds a ``now`` of the old frame.
        """
        lag = self._clock_lag
        if not lag:
            return
        self._clock_lag = 0
        self._last_now -= lag
        lag_s = lag // 1000
        for job in self.jobs.values():
            if job.qtime:
                job.qtime -= lag
        for q in self.queues.values():
            q.atime -= lag_s
            if q.needjobs_bcast_ms:
                q.needjobs_bcast_ms -= lag
            if q.needjobs_adhoc_ms:
                q.needjobs_adhoc_ms -= lag
            for node_id in q.needjobs_responders:
                q.needjobs_responders[node_id] -= lag_s
            q.import_current_ms -= lag
            q.import_prev_ms -= lag
        self.awake.shift(-lag, self._timed)
        if self._next_eviction_ms:
            self._next_eviction_ms -= lag
        self._shift_expire_times(lag)

    def _shift_expire_times(self, lag: int) -> None:
        """Move every expire time back by the whole seconds of ``lag`` ms
        (plus what earlier steps left over), recording the jobs again."""
        self._etime_lag += lag
        shift, self._etime_lag = divmod(self._etime_lag, 1000)
        if not shift:
            return
        self.etime_shift_s += shift
        records: list[bytes] = []
        persisting = self.persisting
        pending = pending_by_job(self) if persisting else {}
        for job in self.jobs.values():
            job.etime = self.shared_int(job.etime - shift)
            if (
                persisting
                and job.body is not None
                and (record := aof_record(job, pending.get(job.id, ())))
            ):
                records.append(record)
        if records:
            # One effect: as large as a rewrite of the file, at worst.
            self.effects.append(Persist(b"".join(records)))

    def time_error(self, span_ms: int = TIME_ERROR_MS) -> int:
        """A random offset in [-span/2, span/2) to desynchronise nodes."""
        # random() is several times cheaper than randrange() and this runs
        # on every enqueue.
        return int(self.rng.random() * span_ms) - span_ms // 2

    def shared_int(self, value: int) -> int:
        """One int object per value among the recent ones: jobs created in
        the same second share their expire time, and jobs whose timers fall
        on the same millisecond share their due and re-queue times (32 bytes
        each, at a million jobs). The table is dropped when it fills, so it
        stays small whatever the values."""
        ints = self._ints
        shared = ints.get(value)
        if shared is None:
            if len(ints) >= SHARED_INTS_MAX:
                ints.clear()
            ints[value] = value
            return value
        return shared

    def new_ctime(self, now_ms: int) -> int:
        """Creation time: ms * 1e6, strictly increasing on this node."""
        ctime = now_ms * 1_000_000
        if ctime <= self._last_ctime:
            ctime = self._last_ctime + 1
        self._last_ctime = ctime
        return ctime

    # ------------------------------------------------------------ registry

    def lookup(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def _timed(self, key: str) -> Job | Queue | None:
        """Resolve an awake-index key: a job ID, or NUL + a queue name."""
        job = self.jobs.get(key)  # jobs first: nearly every timer is a job's
        if job is not None or key[:1] != "\x00":
            return job
        return self.queues.get(key[1:])

    def register(self, job: Job, schedule: bool = True) -> bool:
        """Add a job to the registry. ``schedule=False`` when the caller sets
        its timer right after (enqueue does), to index it only once."""
        if job.id in self.jobs:
            return False
        record = None
        if self.persisting and (data := aof_record(job, pending_of(self, job.id))):
            # Encoded before the job is held: never a job in memory whose
            # record could not be written. A dummy ack is recorded too (the
            # client was answered; the holders may hear of it only later).
            record = Persist(data)
        self.jobs[job.id] = job
        if job.body is not None:
            self.body_bytes += len(job.body)
        if job.state == STATE_ACKED:
            self.acked_jobs[job.id] = None
        if schedule:
            self.update_awake(job)
        if record is not None:
            self.effects.append(record)
        if self.observers:
            self._notify("registered", job)
        return True

    def persist(self, job: Job) -> None:
        """Record the job's whole state in the AOF (when it is on)."""
        if self.persisting and job.body is not None:
            self.effects.append(Persist(aof.loadjob(job_record(job, pending_of(self, job.id)))))

    def hand_over(self, job: Job, follow: bool) -> None:
        """The job leaves this node alive, held elsewhere only: a RETRY 0
        job moved by YOURJOBS (``follow``: its new holder lists this node,
        so an ack comes back here), or an ADDJOB's job this node kept no
        copy of (its holders do not list this node). WAITJOB reads it from
        the tombstone (core/jobwaits.py)."""
        self.unregister(job, handed=job.etime if follow else 0)

    def unregister(self, job: Job, acked: bool = False, handed: int | None = None) -> None:
        """Forget a job whatever its state (expiry, collection, DELJOB).
        ``acked``: remember it as acked even if not acked here (FASTACK, a
        bus DELJOB: the job is done for good). ``handed``: see hand_over."""
        if self.jobs.get(job.id) is not job:
            return
        if job.state == STATE_QUEUED:
            self.dequeue(job)
        if job.state == STATE_WAIT_REPL:
            cj.replication_aborted(self, job)
        elif self.persisting:
            # A dummy ack (no body) has its ACKJOB record: it goes too.
            self.effects.append(Persist(aof.deljob(job.id)))
        self.awake.unschedule(job)
        del self.jobs[job.id]
        self.acked_jobs.pop(job.id, None)
        if job.body is not None:
            self.body_bytes -= len(job.body)
        self.remember_deleted(job.id, acked or job.state == STATE_ACKED, handed)
        self._notify("deleted", job)

    def acked_epoch(self) -> tuple[int, int]:
        """What an acked tombstone is stamped with: while it stays the same,
        every holder the ack reached still knows it (the membership did not
        move, no peer's link came up again after a restart that may have
        brought back from its AOF a copy acked before the crash)."""
        return self.cluster.version, self.cluster.relinks

    def remember_deleted(
        self, job_id: str, acked: bool = False, handed: int | None = None
    ) -> None:
        """Remember for a while that a job is gone from here (collected,
        DELJOB, expired, moved away). A REPLJOB sent before may still be on
        its way (another link, overtaken by the DELJOB): taking it would
        resurrect the job as a copy no node acks or collects any more, and
        it would be delivered again. ``acked``: it was acked here, so a
        holder still announcing it (WILLQUEUE, QUEUED) missed the ack and
        is told (clusterjobs). ``handed``: it left alive (hand_over). A
        node alone keeps them too: WAITJOB answers from them (a job is
        often acked before its producer asks)."""
        # Aged on the monotonic clock: a forward wall-clock step aged them
        # at once (seed 20001394: a 59.5 s step let a REPLJOB held back by a
        # one-way partition bring back a job expired here).
        now = self.clock.mono_ms()
        deleted = self.deleted_ids
        deleted.pop(job_id, None)
        deleted[job_id] = now
        if acked:
            self.deleted_acked[job_id] = self.acked_epoch()
        if handed is not None:
            self.deleted_moved[job_id] = handed
        elif self.deleted_moved:
            # Acked since, or deleted after it came back: no longer followed.
            self.deleted_moved.pop(job_id, None)
        for oldest in _drop_aged(deleted, now):
            self.deleted_acked.pop(oldest, None)
            self.deleted_expired.discard(oldest)
            self.deleted_refused.discard(oldest)
            self.deleted_moved.pop(oldest, None)
        if self.job_waiters and job_id in self.job_waiters:
            jobwaits.settle(self, job_id)

    def _notify(self, event: str, job: Job) -> None:
        for observer in self.observers:
            observer(event, job)

    def probe(self, event: str, job: Job) -> None:
        """A rare protocol event worth counting (the simulator's coverage
        probes: "WILLQUEUE prevented a requeue", ...)."""
        if self.observers:
            self._notify(event, job)

    # -------------------------------------------------------------- queues

    def queue(self, name: str, now: int = 0) -> Queue:
        """The queue of that name, created on demand."""
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = Queue(name, now or self.now_ms())
            self.schedule_queue_gc(q)
        return q

    def schedule_queue_gc(self, q: Queue) -> None:
        """If the queue may be evicted some day, look at it when it could be.

        Called where a queue can become empty, unwatched or unpaused; the
        timer re-checks everything when it fires.
        """
        if not q.jobs and not q.waiters and not q.pause:
            self.awake.schedule(q, (q.atime + self.queue_max_idle) * 1000)

    def _queue_timer(self, q: Queue, now: int) -> None:
        if self.queues.get(q.name) is not q:
            return
        if q.is_collectable(now // 1000, self.queue_max_idle):
            self.awake.unschedule(q)
            del self.queues[q.name]
        else:
            self.schedule_queue_gc(q)

    def queue_length(self, name: str) -> int:
        q = self.queues.get(name)
        return len(q.jobs) if q is not None else 0

    def enqueue(self, job: Job, nack: bool = False, now: int = 0) -> bool:
        """Put a held job in its queue; False if it must not be queued."""
        if job.state in (STATE_QUEUED, STATE_ACKED) or job.qtime == 0:
            return False  # ACKED is absorbing: a late YOURJOBS must not revive it
        if job.retry == 0 and job.flags & FLAG_DELIVERED:
            return False
        now = now or self.now_ms()
        # A YOURJOBS or ENQUEUE can queue our own ADDJOB's job before its
        # replication is reached: it leaves WAIT_REPL here, and nothing
        # else would write its record (simulator seed 4377: queued and
        # delivered with no record, gone after SHUTDOWN REWRITE-AOF).
        unrecorded = job.state == STATE_WAIT_REPL
        job.state = STATE_QUEUED
        job.flags &= ~FLAG_HANDED
        if job.retry:
            job.flags |= FLAG_BCAST_WILLQUEUE
            job.qtime = self.shared_int(now + job.retry * 1000 + self.time_error())
        else:
            job.qtime = 0  # at most once: never queued again
        # Nobody counts as told yet (FLAG_TOLD_QUEUED), not even by the
        # broadcast below: in steady state the other holders' WILLQUEUE comes
        # before our next retry point and our answer counts; if none came,
        # that QUEUED may have been lost, and the retry point announces
        # again (simulator seed 20005489: bus chaos ate it, a holder that
        # did not list us queued its own copy, and we used to wait a second
        # retry period).
        job.flags &= ~FLAG_TOLD_QUEUED
        job.queued_on = None
        if job.flags & (FLAG_DELAYED | FLAG_ANNOUNCE):
            # The end of a NACK or ENQUEUE DELAY: the command counted and
            # told the holders (POSTPONE); or a fail-over, which counts
            # nothing (the holder lost had not delivered it). They hear
            # QUEUED, counting nothing, so that they push their timers
            # again (and stand down, for a fail-over).
            job.flags = (job.flags & ~(FLAG_DELAYED | FLAG_ANNOUNCE)) | FLAG_BCAST_QUEUED
            cj.announce_queued(self, job)
        elif job.flags & FLAG_BCAST_QUEUED or nack:
            # A re-queue (not the first queueing): tell the other holders so
            # that they push their own timers, and count the delivery.
            cj.broadcast_queued(self, job, nack)
            if nack:
                job.nacks += 1
            else:
                job.deliveries += 1
        else:
            job.flags |= FLAG_BCAST_QUEUED
        self.update_awake(job, now=now)
        if unrecorded:
            self.persist(job)
        q = self.queue(job.queue, now)
        q.push(job)
        q.atime = now // 1000
        q.jobs_in += 1
        if self.observers:
            self._notify("queued", job)
        if q.waiters and not q.pause & PAUSED_OUT:
            self.wake_queue(q)
        elif self.interest and q.name in self.interest:
            cj.tell_interested(self, q, now)
        return True

    def enqueue_later(self, job: Job, delay_ms: int, nack: bool) -> bool:
        """NACK or ENQUEUE with DELAY: queue an active job here once
        ``delay_ms`` passed, counting now what the command counts (a nack;
        ENQUEUE: an additional delivery, if it was delivered). The other
        holders hear POSTPONE and hold their copies past the delay. False
        where ENQUEUE would refuse (queued, acked, a delivered RETRY 0 job)."""
        if job.state != STATE_ACTIVE or job.qtime == 0:
            return False
        if job.retry == 0 and job.flags & FLAG_DELIVERED:
            return False
        flags = 0
        if nack:
            job.nacks += 1
            flags = bus.FLAG_INCR_NACKS
        elif job.flags & FLAG_BCAST_QUEUED:
            job.deliveries += 1
            flags = bus.FLAG_INCR_DELIV
        now = self.now_ms()
        job.flags = (job.flags | FLAG_DELAYED) & ~FLAG_HANDED  # given back by its consumer
        if job.retry:
            job.flags |= FLAG_BCAST_WILLQUEUE  # holders may object first (acked)
        job.qtime = self.shared_int(now + delay_ms)
        self.update_awake(job, now=now)
        self.persist(job)
        cj.broadcast_postpone(self, job, delay_ms, flags)
        return True

    def dequeue(self, job: Job) -> bool:
        """Take a queued job out of its queue, back to ``ACTIVE``."""
        if job.state != STATE_QUEUED:
            return False
        q = self.queues.get(job.queue)
        if q is not None:
            q.remove(job)
            if not q.jobs:
                self.schedule_queue_gc(q)
        job.state = STATE_ACTIVE
        return True

    def take_oldest(self, q: Queue) -> Job | None:
        """Take the oldest job out of a queue, handed to a client or moved
        to another node (YOURJOBS): it becomes ``ACTIVE``, delivered."""
        job_id = q.pop_oldest()
        if job_id is None:
            return None
        job = self.jobs[job_id]
        job.state = STATE_ACTIVE
        job.flags |= FLAG_DELIVERED
        q.jobs_out += 1
        return job

    def fetch(self, q: Queue) -> Job | None:
        """Deliver the oldest job of a queue to a client."""
        job = self.take_oldest(q)
        if job is None:
            return None
        job.flags |= FLAG_HANDED  # to a client (not to a node: NEEDJOBS)
        q.atime = self.now_ms() // 1000
        if job.retry and len(job.nodes_delivered) > 1:
            self.delivered_untold[job.id] = None
        self._notify("delivered", job)
        if not q.jobs:
            self.schedule_queue_gc(q)
            cj.queue_drained(self, q)
        return job

    def set_pause(self, name: str, pause: Pause) -> Pause:
        q = self.queues.get(name)
        if q is None:
            if pause == Pause.NONE:
                return Pause.NONE
            q = self.queue(name)
        q.pause = int(pause)
        if not q.pause & PAUSED_OUT and q.waiters and q.jobs:
            self.wake_queue(q)
        self.schedule_queue_gc(q)
        return Pause(q.pause)

    # ------------------------------------------------------------- waiters

    def block(self, waiter: Waiter) -> None:
        """Register a GETJOB client on every queue it named (each queue's
        delivery task starts, if it was not running: it hands over the jobs
        that come and asks other nodes for some)."""
        for name in waiter.queues:
            q = self.queue(name)
            q.waiters[waiter] = None
            self.wake_queue(q)
        self.stats.blocked_clients += 1

    def wake_queue(self, q: Queue) -> None:
        """Ask for the queue's delivery to run (once until it has)."""
        if not q.wake_pending:
            q.wake_pending = True
            self.effects.append(WakeQueue(q.name))

    def cancel_wait(self, waiter: Waiter) -> Reply:
        """The shell gave up on a waiter (timeout, disconnect, shutdown):
        returns what the client gets for a timeout."""
        if waiter.done:
            return waiter.reply
        waiter.done = True
        if waiter.job_id is not None:
            return cj.replication_timed_out(self, waiter)
        if waiter.watch:
            return jobwaits.cancel(self, waiter)
        self._unblock(waiter)
        return NULL_ARRAY

    def _unblock(self, waiter: Waiter) -> None:
        if not waiter.queues:
            return
        self.stats.blocked_clients -= 1
        for name in waiter.queues:
            q = self.queues.get(name)
            if q is not None:
                q.waiters.pop(waiter, None)
                if not q.waiters:
                    self.schedule_queue_gc(q)

    def serve_waiters(self, q: Queue) -> None:
        """Hand jobs of a queue to its blocked clients, oldest client first
        (the queue's delivery task calls it after a WakeQueue)."""
        q.wake_pending = False
        if q.pause & PAUSED_OUT:
            return
        while q.waiters and q.jobs:
            waiter = next(iter(q.waiters))
            jobs: list[Reply] = []
            while len(jobs) < waiter.count:
                job = self.fetch(q)
                if job is None:
                    break
                jobs.append(job_reply(job, waiter.withcounters))
            self._unblock(waiter)
            self.finish_wait(waiter, jobs)

    def finish_wait(self, waiter: Waiter, reply: Reply) -> None:
        """A blocked command is answered: its reply goes out at the commit."""
        waiter.finish(reply)
        self.effects.append(Wake(waiter))

    def unblock_all(self, reply: Reply) -> None:
        """Answer every blocked GETJOB client (CLUSTER LEAVING, shutdown)."""
        waiters: dict[Waiter, None] = {}
        for q in self.queues.values():
            waiters.update(q.waiters)
        for waiter in waiters:
            self._unblock(waiter)
            self.finish_wait(waiter, reply)

    # ---------------------------------------------------------------- acks

    def acknowledge(self, job: Job) -> None:
        if job.state == STATE_ACKED:
            return
        self.dequeue(job)
        job.state = STATE_ACKED
        self.acked_jobs[job.id] = None
        job.nodes_confirmed = None
        self.update_awake(job)
        if self.persisting and job.body is not None:
            self.effects.append(Persist(aof.ackjob(job.id)))
        if self.job_waiters and job.id in self.job_waiters:
            jobwaits.settle(self, job.id)
        self._notify("acked", job)

    def try_gc(self, job: Job) -> None:
        """Try to collect an acked job: delete it once every holder confirmed."""
        if job.state != STATE_ACKED:
            return
        if job.gc_retry != GC_RETRY_COUNT_MAX:
            job.gc_retry += 1
        if job.nodes_confirmed is None:
            job.nodes_confirmed = self.myself_only
        dummy = job.is_dummy_ack
        everyone = set(job.nodes_delivered) <= set(job.nodes_confirmed)
        if dummy:
            # A dummy ack goes when every node of the cluster said it does
            # not know the job (the membership may have shrunk since).
            nodes = self.cluster.nodes.keys()
            everyone = len(nodes) > 1 and nodes <= set(job.nodes_confirmed)
        if everyone or (dummy and self.cluster_size == 1):
            if not dummy:
                # Every holder confirmed: tell them, as the GOTACK rule does.
                # Collected here without a last GOTACK (CLUSTER FORGET dropped
                # the missing holder), silence would leave a holder that does
                # not know the forgotten ID (a wiped node's new incarnation)
                # waiting for it for ever.
                cj.broadcast_deljob(self, job.id, job)
            self.unregister(job)
            return
        cj.send_setack(self, job)

    def forget_node(self, node_id: str) -> int:
        """CLUSTER FORGET: the node is gone for good, so no job waits for it.
        It leaves every holder list; acked jobs it held up are collected;
        the jobs it had queued are taken over (fail_over), if its loss was
        not seen before. Returns how many jobs listed it."""
        self.fail_over(node_id)
        touched = 0
        for job in list(self.jobs.values()):
            if job.state == STATE_ACKED and job.is_dummy_ack:
                self.try_gc(job)  # it may have waited for that node only
                continue
            if node_id not in job.nodes_delivered:
                continue
            touched += 1
            job.nodes_delivered = tuple(n for n in job.nodes_delivered if n != node_id)
            if job.nodes_confirmed is not None:
                job.nodes_confirmed = tuple(n for n in job.nodes_confirmed if n != node_id)
            if job.state == STATE_ACKED:
                self.try_gc(job)
        return touched

    def next_gc_time(self, job: Job, now: int) -> int:
        period = min(GC_RETRY_MIN_MS << job.gc_retry, GC_RETRY_MAX_MS)
        return now + period + self.time_error()

    # --------------------------------------- across nodes (core/clusterjobs.py)

    def cron(self) -> None:
        """Periodic work (10 times a second): follow the clock, and under
        memory pressure evict and shorten idle queues' lives. (Asking
        other nodes for jobs is each queue's delivery task's business:
        ``clusterjobs.needjobs_due``.)"""
        self.follow_clock()
        self._answered_crons += 1
        if self._answered_crons >= ANSWERED_QUEUED_CRONS:
            self._answered_crons = 0
            self.answered_queued_before = self.answered_queued
            self.answered_queued = set()
        if self.moved_waits:
            jobwaits.expire_moved(self)
        if self.delivered_untold:
            self.tell_deliveries()
        if self.interest and self._answered_crons == 0:
            cj.forget_stale_interest(self)  # every ANSWERED_QUEUED_CRONS crons
        level = self.memory_level()
        # Idle queues go sooner under pressure (300 s, 10 s, 2 s).
        self.queue_max_idle = (QUEUE_MAX_IDLE_SECONDS, 10, 2, 2)[level]
        now = self.now_ms()
        if level >= 2 and now >= self._next_eviction_ms:
            # A pass looks at every job: once a second is enough.
            self._next_eviction_ms = now + 1000
            self.evict_for_memory(now)

    def tell_deliveries(self) -> None:
        """The jobs handed to a client since the last cron and still in a
        consumer's hands (not acked, not queued again, no client delay):
        their other holders hear DELIVERED (clusterjobs.tell_delivered)."""
        jobs = self.jobs
        for job_id in self.delivered_untold:
            job = jobs.get(job_id)
            if job is not None and job.state == STATE_ACTIVE and not job.flags & FLAG_DELAYED:
                cj.tell_delivered(self, job)
        self.delivered_untold.clear()

    # -------------------------------------------------------------- timers

    def update_awake(self, job: Job, at: int = 0, now: int = 0) -> None:
        """(Re)compute the job's single timer; see the module rules."""
        if at == 0:
            at = job.etime * 1000 + 1000
            state = job.state
            if state == STATE_ACKED:
                at = min(at, self.next_gc_time(job, now or self.now_ms()))
            elif job.qtime:
                # WAIT_REPL jobs use qtime for their next replication try
                # (one more node, or the REPLJOB again: clusterjobs.repl_tick).
                qtime = job.qtime
                # The WILLQUEUE advance is for jobs that may be queued: a
                # WAIT_REPL job acts at qtime itself (an earlier timer would
                # find nothing to do and come back at once, for ever).
                if state != STATE_WAIT_REPL:
                    if job.flags & FLAG_BCAST_WILLQUEUE:
                        qtime = chatter_slot_end(qtime - WILLQUEUE_ADVANCE_MS)
                    elif state == STATE_QUEUED:
                        qtime = chatter_slot_end(qtime)
                if qtime < at:
                    at = qtime
        if at != job.awake:
            self.awake.schedule(job, self.shared_int(at))

    def set_requeue_time(self, job: Job, qtime: int) -> None:
        if job.retry == 0 or job.qtime == 0:
            return  # never break the at-most-once promise
        job.qtime = qtime
        self.update_awake(job)

    def next_deadline(self) -> int | None:
        """Wall-clock ms at which :meth:`tick` has work to do, or None."""
        return self.awake.next_due(self._timed)

    def tick(self) -> None:
        """Run the timers that are due now (jobs and idle queues), at most
        TICK_MAX_TIMERS: the others stay due, ``next_deadline`` says so, and
        the timer task ticks again once other tasks had their turn."""
        self.follow_clock()
        now = self.now_ms()
        for entry in self.awake.pop_due(now, self._timed, TICK_MAX_TIMERS):
            if isinstance(entry, Queue):
                self._queue_timer(entry, now)
            else:
                self.process_job(entry, now)  # type: ignore[arg-type]

    def expire(self, job: Job) -> None:
        """The job's TTL ran out: it goes, and a late copy is refused."""
        self.stats.expired_jobs += 1
        self.unregister(job)
        if job.id in self.deleted_ids:
            self.deleted_expired.add(job.id)

    def process_job(self, job: Job, now: int) -> None:
        """A job's timer fired: expire, announce, (re)queue or collect it."""
        if self.jobs.get(job.id) is not job:
            return
        if job.etime * 1000 <= now:
            self.expire(job)
            return
        if job.state == STATE_WAIT_REPL:
            if job.qtime <= now:
                cj.repl_tick(self, job, now)
            self.update_awake(job)
            return
        in_play = job.state in (STATE_ACTIVE, STATE_QUEUED)
        if (
            in_play
            and job.flags & FLAG_BCAST_WILLQUEUE
            and job.qtime - WILLQUEUE_ADVANCE_MS <= now
        ):
            if job.state != STATE_QUEUED:
                cj.send_willqueue(self, job)
                late = now - chatter_slot_end(job.qtime - WILLQUEUE_ADVANCE_MS)
                if late > CHATTER_GRID_MS and self._held_elsewhere(job):
                    # A late timer (the process was stopped or starved)
                    # would re-queue in the same breath: the holders that
                    # know of an ack (and the SETACKs already waiting in our
                    # sockets) still get the whole advance to stop it. Only
                    # a timer more than a slot past its slot's end is late:
                    # one on time keeps its re-queue time and so its random
                    # error. Moving every re-queue to the WILLQUEUE's time
                    # plus the advance gave the holders whose WILLQUEUE
                    # shared a slot one re-queue millisecond: of the jobs
                    # two nodes held and one delivered, one in ten was
                    # queued by both (C Disque: none).
                    job.qtime = max(job.qtime, now + WILLQUEUE_ADVANCE_MS)
            job.flags &= ~FLAG_BCAST_WILLQUEUE
        if job.state == STATE_ACTIVE and job.qtime and job.qtime <= now:
            if (
                job.retry
                and job.flags & FLAG_BCAST_QUEUED  # a re-queue, not a delayed first one
                and now - job.qtime > WILLQUEUE_ADVANCE_MS
                and self._held_elsewhere(job)
            ):
                # Due long ago: the process was stopped or starved since its
                # WILLQUEUE, and the answers (SETACK, QUEUED) may be waiting
                # unread in our sockets. Announce again, re-queue after the
                # advance.
                cj.send_willqueue(self, job)
                job.qtime = now + WILLQUEUE_ADVANCE_MS
            else:
                self._requeue(job, now)
        if job.state == STATE_QUEUED and job.qtime and job.qtime <= now and job.retry:
            # Still queued when the retry came: keep it, push the next retry,
            # and re-announce it unless every holder heard QUEUED since the
            # last retry point (answering WILLQUEUE does it in steady state).
            if not job.flags & FLAG_TOLD_QUEUED:
                cj.announce_queued(self, job)
            job.flags &= ~FLAG_TOLD_QUEUED
            job.flags |= FLAG_BCAST_WILLQUEUE
            job.qtime = now + job.retry * 1000 + self.time_error()
        if job.state == STATE_ACKED:
            self.try_gc(job)
        if self.jobs.get(job.id) is job:
            self.update_awake(job)

    def _held_elsewhere(self, job: Job) -> bool:
        return any(node_id != self.node_id for node_id in job.nodes_delivered)

    def _requeue(self, job: Job, now: int) -> None:
        q = self.queues.get(job.queue)
        if job.retry and q is not None and q.pause & PAUSED_IN:
            # Paused in input: postpone. RETRY 0 jobs (delayed ones) are
            # queued anyway, or they would be leaked.
            job.qtime = now + job.retry * 1000 + self.time_error()
            self.probe("requeue-paused", job)
            return
        self.enqueue(job)

    def evict_idle_queues(self, now: int, max_idle: int = QUEUE_MAX_IDLE_SECONDS) -> int:
        """Drop every collectable queue now (memory pressure sweeps)."""
        now_s = now // 1000
        idle = [q for q in self.queues.values() if q.is_collectable(now_s, max_idle)]
        for q in idle:
            self.awake.unschedule(q)
            del self.queues[q.name]
        return len(idle)

    def memory_level(self) -> int:
        """0 fine, 1 above 75 % of maxmemory (no new local copies), 2 above
        95 % (evict what is safe to lose), 3 at 100 % (refuse growth)."""
        used = self.memory_estimate()
        if used >= self.maxmemory:
            return 3
        if used * 100 > self.maxmemory * 95:
            return 2
        if used * 100 > self.maxmemory * 75:
            return 1
        return 0

    def evict_for_memory(self, now: int) -> int:
        """At level 2 or more: drop what is safe to lose (acked jobs, RETRY 0
        jobs already delivered, idle empty queues). Returns jobs dropped."""
        victims = [
            j
            for j in self.jobs.values()
            if j.state == STATE_ACKED
            or (j.retry == 0 and j.flags & FLAG_DELIVERED and j.state == STATE_ACTIVE)
        ]
        for job in victims:
            self.unregister(job)
        self.evict_idle_queues(now, max_idle=2)
        return len(victims)

    def memory_estimate(self) -> int:
        return (
            BASE_MEMORY_BYTES
            + len(self.jobs) * JOB_OVERHEAD_BYTES
            + self.body_bytes
            + len(self.queues) * QUEUE_OVERHEAD_BYTES
        )

    # ------------------------------------------------------------ flushall

    def flush_all(self) -> None:
        """DEBUG FLUSHALL: forget every job and queue (blocked clients get nil)."""
        for q in self.queues.values():
            for waiter in list(q.waiters):
                self._unblock(waiter)
                self.finish_wait(waiter, None)
        for job_id in [j for j in self.job_waiters if j in self.jobs]:
            jobwaits.answer(self, job_id, jobwaits.GONE)  # deleted, no ack
        self.jobs.clear()
        self.queues.clear()
        self.awake.clear()
        self.scan_snapshots.clear()
        # What named the dropped jobs goes with them (tombstones stay: a
        # late copy of a job deleted here is still refused).
        self.acked_jobs.clear()
        self.pending_holders.clear()
        self.pending_since.clear()
        self.answered_queued.clear()
        self.answered_queued_before.clear()
        self.body_bytes = 0
        self.forget_shared_ints()

    def forget_shared_ints(self) -> None:
        """Drop the table of shared ints: before memory goes back to the OS,
        as its few thousand survivors, allocated among the jobs' objects,
        would each keep a whole allocator arena alive."""
        self._ints.clear()


def job_reply(job: Job, withcounters: bool) -> list[Reply]:
    """A job as GETJOB and QPEEK return it: [queue, id, body, (counters)]."""
    body = job.body if job.body is not None else b""
    if withcounters:
        return [
            job.queue,
            job.id,
            body,
            "nacks",
            job.nacks,
            "additional-deliveries",
            job.deliveries,
        ]
    return [job.queue, job.id, body]


def chatter_slot_end(ms: int) -> int:
    """The end of the CHATTER_GRID_MS slot ``ms`` falls in (itself on a
    boundary): never earlier than ``ms``, so the timer finds its work due."""
    return -(-ms // CHATTER_GRID_MS) * CHATTER_GRID_MS
