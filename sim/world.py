"""A World: K real NodeServers on a SimNet, SimDisks and skewed virtual
clocks, inside one deterministic trio.run.

Every source of randomness derives from the plan (``sim.plan``) and its
seed: each node's rng, clock skew and drift, the network delays, bus chaos,
the workload and Trio's own scheduler (the ``_ALLOW_DETERMINISTIC_SCHEDULING``
hook that Hypothesis uses). Time is ``MockClock(autojump_threshold=0)``:
whenever every task is blocked, virtual time jumps to the next deadline
(or to the next network delivery: ``sim.clock.Timers``).

The World also runs the white-box checks, from node observers and a
sampling monitor (``World.violations``):

* ``replicated-before-ok``: when ADDJOB answered OK (synchronous, REPLICATE
  n), at least n distinct nodes had registered the job.
* ``acked-absorbing``: a node (one incarnation) that acked a job never
  queues it again.
* ``retry0-once``: a RETRY 0 job is queued at most once per registration
  (per node) and never re-queued after an AOF reload (a YOURJOBS that moves
  there a job delivered nowhere and never queued there before is its first
  queueing, not a re-queue: ``World._first_queueing_moved_here``).
* ``always-no-amnesia``: with ``appendfsync always`` a node restarted after
  a crash (not a wipe) reloads every job it held when it crashed, but for
  those whose TTL ran out while it was down (the load drops them).
* ``queued-iff-in-queue``: a job is QUEUED exactly when it sits in its
  node's queue.
* ``pause-in``: a node never stores a replicated copy (REPLJOB) of a job
  for a queue it has paused in input.
* ``collected-everywhere``: see ``World._check_collected``.
* ``holders-know-holders``: see ``World.watch_holders``.
* ``single-queued``: while the network is healthy and every node up, no job
  stays queued on two nodes for more than ``DOUBLE_QUEUED_S``.
* ``ttl-expires``: see ``World.check_ttl``.
* ``fail-detected``: see ``World.check_detection``.
* ``everysec-window``: see ``World._check_everysec``.
* ``expired-stays-expired``: a node (one incarnation) that expired a job
  never takes a copy of it again from a peer (a late REPLJOB, YOURJOBS).
* ``nack-delay-told``: shortly after a NACK or ENQUEUE with DELAY d was
  answered 1 in a healthy cluster, no other holder has the job queued, and
  each holds its copy at least d + RETRY from the command (the POSTPONE;
  d for one that waits for its own client's delay and queues it then).
* ``nack-delay-timed``: then too, the node that took the delay has the
  job's timer (SHOW's next-awake-within) no later than its queue time.
* ``aof-keeps-delay``: a job a restarted node loads back while still
  within a client's NACK or ENQUEUE DELAY (by its own clock) keeps that
  queue time and is not queued (``appendfsync always``; ``everysec`` for
  a command older than the crash's window).
* ``aof-keeps-ttl``: a job a restarted node loads back from its AOF has
  the expire time it had when the node crashed (or, when the records of
  its last moves with the clock's backward steps died with the crash, a
  time no later than before those moves).
* ``failover-timely``, ``failover-once``: see ``World.watch_failover``.
* ``delivery-told``: see ``World._check_told``.
* ``federation-prompt``: see ``World.watch_federation``.
* ``replication-counts-nodes``: a GOTJOB ends a synchronous ADDJOB's wait
  only once REPLICATE distinct nodes confirmed a copy (the origin's own
  copy counts as one); a holder that answers twice (a REPLJOB sent again,
  a frame duplicated) still counts once. ``replicated-before-ok`` sees the
  same bug only when the missing copy had not been stored by the OK.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, MutableSequence
from typing import Any

import attrs
import trio
import trio._core._run as trio_run
import trio.testing

from disque_trio.config import Config
from disque_trio.core import always
from disque_trio.core import cluster as cluster_flags
from disque_trio.core.clusterjobs import HAVEJOBS_MIN_INTERVAL_MS
from disque_trio.core.job import FLAG_DELAYED, TIME_ERROR_MS, Job, JobState
from disque_trio.core.queue import PAUSED_IN, PAUSED_OUT
from disque_trio.env import Env
from disque_trio.protocol import bus
from disque_trio.server.node import NodeServer
from disque_trio.testing import RespClient

from .clock import TimerAlarm, Timers, fast_hook_table, virtual_time
from .disk import DiskHandle, SimDisk
from .net import SimNet
from .plan import Plan
from .probes import (
    BUGGIFY_PROBES,
    COMMAND_PROBES,
    DELAY_WAIT_PROBES,
    DISK_PROBES,
    FAILOVER_PROBES,
    MIXED_PROBES,
    OBSERVE_PROBES,
)
from .trace import Trace

BASE_PORT = 7711
BASE_WALL_MS = 1_700_000_000_000
# Coverage probes counted in every run (see World.probes).
CORE_PROBES = (
    "queued-caused-dequeue",
    "willqueue-answered-queued",
    "yourjobs-moved-a-job",
    "ack-collected",
    "postpone-caused-dequeue",  # a POSTPONE took a queued copy out (NACK/ENQUEUE DELAY)
    "willqueue-answered-postpone",  # a holder that missed the POSTPONE was told again
    "failover-taken",  # a lost node's queued job queued by the survivor chosen
    "failover-standby",  # ... and stood by for by another survivor
)
PROBES: tuple[str, ...] = (
    *CORE_PROBES,
    "one-way-partition",
    "crash",
    "aof-reload-requeued-job",
    "ack-crossed-healed-partition",
    "clock-jump",
    "bus-frame-dropped",
    "socket-full",  # a write waited for room in a bounded socket buffer
    "wipe",
    *COMMAND_PROBES,
)
# Coverage of the timers, NACK/WORKING paths, failure detector, ack
# collection and fsync policy (issue #15), merged into PROBES.
TIMING_PROBES = (
    "pfail-set",  # a node flagged a peer PFAIL
    "fail-set",  # a node flagged a peer FAIL
    "fail-everywhere",  # every other node saw the same peer FAIL at once
    "fail-cleared",  # a FAIL flag went away (the peer came back)
    "fail-detection-checked",  # a cut outlasted the detection bound (checked)
    "dummy-ack-created",
    "dummy-ack-collected",
    "nack-requeued",
    "held-past-retry",  # a consumer held a job past RETRY with WORKING
    "acked-elsewhere",  # an ack sent to another node or a fresh connection
    "acked-by-other-consumer",
    "consumer-vanished",
    "everysec-crash-checked",  # an everysec crash with writes older than its window
)
PROBES = (
    *PROBES,
    *TIMING_PROBES,
    *DELAY_WAIT_PROBES,
    *OBSERVE_PROBES,
    *BUGGIFY_PROBES,
    *FAILOVER_PROBES,
    *DISK_PROBES,
    *MIXED_PROBES,
)
MESH_TIMEOUT_S = 30.0
# version-gated: each message's first protocol version, taken at import
# (a mutant may patch the bus module's).
SINCE_VERSION: dict[type, int] = dict(bus.SINCE_VERSION)
DISK_RETRY_GRACE_S = 2.0  # disk-answered: -MISCONF this long after a disk works again
# Faults that take a node down and restart it (World.calm_but_crash).
CRASH_KINDS = ("crash", "wipe", "torn-crash", "shutdown", "upgrade")
# failover-timely (issue 57): a job queued on a node cut off this long
# before the cut was heard of by its other holders (REPLJOB, QUEUED: a
# network delay; checkers.RACE_S).
FAILOVER_HEARD_S = 1.0
# From the first of a job's surviving holders to flag the node FAIL: the
# holder chosen queues it at once (it flags FAIL a network delay later, on
# the FAIL message), the others after FAILOVER_STANDBY_MS (1 s) unless its
# QUEUED came, their timer run in the next chatter slot (0.1 s); the rest
# is margin. The check looks every FAILOVER_POLL_S (its deadline is judged
# up to that late, and a FAIL seen that late).
FAILOVER_S = 2.0
FAILOVER_POLL_S = 0.1
# failover-once: a holder's own RETRY timer, as its copy stood at the cut,
# may queue the job up to this much sooner (a QUEUED among the survivors
# sets it again, with the random time error).
FAILOVER_RETRY_SLACK_S = 0.6
# A crashed node restarted before FAIL: its first heartbeats, with its new
# incarnation, reach the others within this (its links come up at once,
# theirs to it after a reconnection back-off: LINK_SETTLE_S).
INCARNATION_KNOWN_S = 2.0
# delivery-told: a delivery's other holders hear of it (WORKING) at its
# node's next cron (0.1 s) and a network delay (up to 2 x 40 ms): looked at
# from the monitor's first sample this long after it. TOLD_SLACK_MS: the
# clock arithmetic's rounding, with margin.
TOLD_S = 0.4
TOLD_SLACK_MS = 50
# federation-prompt: a node whose clients have waited this long (two of the
# monitor's samples) has asked the others for jobs (NEEDJOBS); the bound's
# margin (World.federation_bound).
FEDERATION_WAITING_S = 0.5
FEDERATION_MARGIN_S = 0.5
# A client's NACK or ENQUEUE DELAY (up to 5 s) this long before the cut may
# still hold the job back (the workload's delays are 1..5 s).
NACK_DELAY_MAX_S = 6.0
DOUBLE_QUEUED_S = 4.0
# everysec: a write is fsynced by the next cron second, and the writer does
# it in its next round; what a crash may lose is this much, with margin.
EVERYSEC_WINDOW_S = 2.5
# A job's timer fires at its etime + 1 s; the timer task looks at the clock
# at least once a second (a jump is noticed); the monitor samples.
TTL_SLACK_MS = 3000
# A copy registered this soon after held-back bytes reached its node came
# with them.
HELD_BACK_RECENT_S = 0.1
# A copy registered this soon after its node's stall (a slow fsync) ended
# came from bytes that waited in its socket meanwhile.
STALL_RECENT_S = 0.5
SAMPLE_S = 0.25
HOLDERS_SETTLE_S = 0.3
COLLECT_SETTLE_S = 1.0
LINK_SETTLE_S = 2.0  # reconnection back-off (0.5 s) plus handshake, with margin
ADMIN_TIMEOUT_S = 2.0  # the world's own admin calls (MEET, FORGET)
# Two drains (40 s each, and up to 60 s more each while consumers still
# take owed jobs: sim/workload.py), the coda, settle (20 s), convergence
# (30 s) and restarts fit in this beyond the safety phase: a run still going
# is stuck.
VIRTUAL_SLACK_S = 270.0
# Far above any legitimate rate (heartbeats, replication, acks, chaos
# duplicates): a planted SETACK ping-pong reaches hundreds of thousands.
STORM_MESSAGES_PER_S = 5000


class StormError(Exception):
    """The cluster is flooding its bus: the run stops with a violation."""


class SimClock:
    """A node's wall clock: virtual time with a skew, a drift and jumps."""

    def __init__(self, base_ms: int, skew_ms: int = 0, drift_ppm: int = 0) -> None:
        self.base_ms = base_ms + skew_ms
        self.rate = 1.0 + drift_ppm / 1_000_000
        self.offset_ms = 0
        self._high_ms = 0  # the wall clock's reading just before its last jump

    def wall_ms(self) -> int:
        return self.base_ms + self.offset_ms + int(trio.current_time() * 1000 * self.rate)

    def high_ms(self) -> int:
        """The latest time the wall clock has read so far (it jumps back)."""
        return max(self._high_ms, self.wall_ms())

    def mono_ms(self) -> int:
        """Drifts with the wall clock (one oscillator), never jumps."""
        return int(trio.current_time() * 1000 * self.rate)

    def jump(self, ms: int) -> None:
        self._high_ms = self.high_ms()
        self.offset_ms += ms


def job_ids(msg: object) -> list[str]:
    """The jobs a bus message is about (none for gossip)."""
    kind = type(msg)
    how = _JOB_IDS_BY_TYPE.get(kind)
    if how is None:
        how = _JOB_IDS_BY_TYPE[kind] = _job_ids_of(kind)
    return how(msg)


def _job_ids_of(kind: type) -> Callable[[Any], list[str]]:
    """How ``job_ids`` reads a message of ``kind`` (chosen once per type:
    it runs twice for every bus message of a run)."""
    if issubclass(kind, bus.ReplJob):
        return lambda msg: [msg.job.id]
    if issubclass(kind, bus.YourJobs):
        return lambda msg: [job.id for job in msg.jobs]
    fields = getattr(kind, "__attrs_attrs__", None)
    if fields is not None and not any(f.name == "job_id" for f in fields):
        return lambda msg: []

    def one(msg: Any) -> list[str]:
        job_id = getattr(msg, "job_id", None)
        return [job_id] if isinstance(job_id, str) else []

    return one


_JOB_IDS_BY_TYPE: dict[type, Callable[[Any], list[str]]] = {}


class SimNode:
    """One node slot: its SimDisk and ports survive crashes, the NodeServer
    is replaced by a fresh one at each restart (an incarnation)."""

    def __init__(self, index: int, server: NodeServer, disk: SimDisk) -> None:
        self.index = index
        self.server = server
        self.disk = disk
        self.handle: DiskHandle | None = None
        self.clock: SimClock | None = None
        self.port = server.config.port
        self.name = f"n{index}"
        self.incarnation = 0
        self.up = False
        self.wiped = False  # this incarnation started on a wiped disk
        self.scope: trio.CancelScope | None = None
        self.done = trio.Event()
        self.held_at_crash: dict[str, int] = {}  # job id -> etime (s)
        # Copies whose records were not on the disk at the crash (replies
        # waiting for them): no promise of this node's, lost all the same.
        self.unwritten_at_crash: set[str] = set()
        # job id -> (queue time ms, etime s, when its client asked) of the
        # jobs within a client's NACK or ENQUEUE DELAY asked of this node at
        # the crash (aof-keeps-delay)
        self.delayed_at_crash: dict[str, tuple[int, int, float]] = {}
        self.shifted_at_crash = 0  # s its expire times moved with clock steps
        self.loaded: set[str] = set()  # job ids loaded from the AOF by this incarnation
        # job id -> (state, flags, queue time) as the AOF load made it (the
        # last record's: a later LOADJOB replaces a job)
        self.loaded_as: dict[str, tuple[JobState, int, int]] = {}
        self.reloaded: set[str] = set()  # loaded and not queued since
        self.old_ids: list[str] = []  # node ids of wiped incarnations
        self.handling: type | None = None  # the bus message being dispatched
        self.handling_msg: object = None  # and the message itself
        self.seen_at: dict[str, float] = {}  # job id -> last registration (this incarnation)
        # job id -> when this incarnation last queued it (not by its AOF
        # load, which tells nobody): failover-timely's jobs.
        self.queued_since: dict[str, float] = {}
        self.expired: set[str] = set()  # jobs this incarnation expired (TTL)
        self.crashed_at = 0.0
        self.restart_lock = trio.Lock()  # one restart at a time (World.restart)


@attrs.define
class FailoverWatch:
    """A cut-off node's queued jobs, watched by failover-timely
    (``World.watch_failover``)."""

    victim: int
    victim_id: str
    window: list[float]
    kind: str
    jobs: dict[str, list[int]]  # job id -> the surviving holders (node indexes)
    give_up: float  # no FAIL by then: not judged
    incarnation: int  # the victim's at the cut
    told_incarnation: bool  # ... and it told it (protocol 8 and later)
    taken: dict[str, float] = attrs.field(factory=dict)  # job -> first queued elsewhere
    by_victim: set[str] = attrs.field(factory=set)  # jobs the victim delivered since
    fail_at: dict[int, float] = attrs.field(factory=dict)  # holder -> when it flagged FAIL
    restarted: float | None = None  # restarted before any FAIL: when
    # job -> the earliest virtual time a holder's own timer would queue it
    # (its RETRY), as its copies stood at the cut
    retry_at: dict[str, float] = attrs.field(factory=dict)
    # job -> how many other nodes held a copy at the cut (any state, loaded too)
    copies: dict[str, int] = attrs.field(factory=dict)
    # job -> (time, the two holders) it was first queued on two holders at once
    doubled: dict[str, tuple[float, int, int]] = attrs.field(factory=dict)
    # job -> holder -> the node its copy counted the job queued on at the
    # cut (Job.queued_on), and holder -> its node ID then
    queued_on: dict[str, dict[int, str | None]] = attrs.field(factory=dict)
    ids: dict[int, str] = attrs.field(factory=dict)


class _SchedulerRandom(random.Random):
    """Trio's scheduler generator in a run: the same draws as
    ``random.Random`` (the same seed gives the same schedule), with the
    shuffle of a batch of one task, most of a run's batches, skipped
    (``Random.shuffle`` draws nothing for it either)."""

    world: World | None = None

    def shuffle(self, x: MutableSequence[Any]) -> None:
        if len(x) > 1:
            super().shuffle(x)
        if self.world is not None and self.world.stalls:
            self.world.hold_stalled(x)


def _heartbeat_tells(version: int) -> tuple[int, bool]:
    """What a heartbeat of a release speaking ``version`` tells in its
    flags: its version (from protocol 4), an incarnation (from 8)."""
    told = version if version >= bus.VERSION_FLAGS_VERSION else 0
    return told, version >= bus.HAVEJOBS_VERSION


class World:
    def __init__(self, plan: Plan, **config: Any) -> None:
        self.plan = plan
        self.seed = plan.seed
        self.count = plan.nodes
        self.config = config
        self.root = random.Random(plan.seed)
        self.trace = Trace()
        max_delay = 0.005 + plan.latency_ms / 1000
        self.clock = trio.testing.MockClock(autojump_threshold=0)
        self.timers = Timers(self.clock)
        self.net = SimNet(
            random.Random(self.root.getrandbits(64)),
            self.trace,
            0.0005,
            max_delay,
            self.timers,
        )
        self.net.buffer = plan.buffer_bytes
        self.node_seeds = [self.root.getrandbits(64) for _ in range(self.count)]
        self.skews_ms = [self.root.randint(-plan.skew_ms, plan.skew_ms) for _ in range(self.count)]
        self.drifts_ppm = [
            self.root.randint(-plan.drift_ppm, plan.drift_ppm) for _ in range(self.count)
        ]
        self.scheduler_seed = self.root.getrandbits(64)
        self.chaos_rng = random.Random(self.root.getrandbits(64))
        self.appendfsync = plan.appendfsync
        self.nodes: list[SimNode] = []
        self.wall_seconds = 0.0
        self.virtual_seconds = 0.0
        self.jumps_ms = 0  # sum of |clock jumps|, for the checkers' allowance
        self.flushes = 0  # nodes that forgot their jobs (sim/explore.py, flushed)
        self._nursery: trio.Nursery | None = None
        # Crash bookkeeping for the checkers: job id -> node names.
        self.holders: dict[str, set[str]] = {}
        self.amnesia: dict[str, set[str]] = {}
        self.probes: Counter[str] = Counter(dict.fromkeys(PROBES, 0))
        # Bus chaos per node index: (drop, duplicate, delay) probabilities.
        self.chaos: dict[int, tuple[float, float, float]] = {}
        # White-box state.
        self.violations: list[str] = []
        self.registered_at: dict[str, dict[str, float]] = {}  # job -> node -> first t
        # (node, incarnation, job) -> the peers whose GOTJOB it read while
        # the job waited for its copies (replication-counts-nodes).
        self.confirmed_by: dict[tuple[str, int, str], set[str]] = {}
        self.acked_by: dict[tuple[str, int], set[str]] = {}
        self.queued_once: dict[tuple[str, int], set[str]] = {}
        self.ever_reloaded: set[str] = set()
        self.acks_lost: set[str] = set()  # acked only on a node that crashed unsynced
        self.pending_acked_requeue: dict[tuple[str, str], str] = {}
        self.acked_in_fault: set[str] = set()  # acked by a client while faults were on
        self.show_progress = False
        self.phase = "start"  # set by the workload
        self.peak_message_rate = 0.0
        self._window_messages = 0  # messages delivered since the monitor's last sample
        self._storming = False
        # More observers of every node's job events: (node, event, job, loading).
        self.observers: list[Callable[[SimNode, str, Job, bool], None]] = []
        # Called when a node is about to drop every job (DEBUG FLUSHALL,
        # CLUSTER RESET), at the moment it runs the command: a command sent
        # to a frozen node may run long after its client gave up.
        self.flush_observers: list[Callable[[SimNode], None]] = []
        # Fault windows [start, end] (end inf while in force), for calm().
        self.fault_windows: list[list[float]] = []
        # Per node, when its disk failed: [start, end] (end inf while it does).
        self.disk_failures: dict[int, list[list[float]]] = defaultdict(list)
        # Slow fsyncs (slow_fsync): each node incarnation's root task, the
        # stalled ones [until, net rule, node index], the tasks held back,
        # and a cache of task -> root.
        self._roots: dict[trio.lowlevel.Task, int] = {}
        self.stalls: dict[trio.lowlevel.Task, list[Any]] = {}
        self._stashed: list[tuple[trio.lowlevel.Task, trio.lowlevel.Task]] = []
        self._owners: dict[trio.lowlevel.Task, trio.lowlevel.Task | None] = {}
        self.stalled_until: dict[int, float] = {}  # node index -> its last stall's end
        self.stalled_from: dict[int, float] = {}  # node index -> its last stall's start
        # Node index -> the bus protocol version it plays (an older release),
        # until its upgrade (sim/faults.py).
        old = plan.old_version
        self.bus_versions: dict[int, int] = dict([old]) if old is not None else {}
        if old is not None:
            self.probes["old-release"] += 1
        self._splits: list[list[float]] = []  # open split_begin windows
        self.held_back: dict[str, float] = {}  # job id -> longest hold of a copy in flight
        # (job, node) -> the first restart without it
        self.amnesia_at: dict[tuple[str, str], float] = {}
        # job id -> virtual times a node handed it to a client (GETJOB), so
        # that a reply a fault held back is judged by when the node sent it
        self.delivered_at: dict[str, list[float]] = {}
        # job id -> (virtual time, the node's next retry point for it) of
        # each delivery (GETJOB) of a RETRY > 0 job (failover-holds)
        self.retry_points: dict[str, list[tuple[float, float]]] = {}
        # job id -> virtual times a node queued it (nack-prompt's evidence)
        self.queued_at: dict[str, list[float]] = {}
        # job id -> when a workload client sent NACK, ENQUEUE or WORKING for
        # it (a reason for a holder to move its timer: nack-delay-told)
        self.commands_at: dict[str, list[float]] = {}
        # job id -> (node index, time) of each re-queue a queue paused in
        # put off by its RETRY (failover-timely).
        self.requeue_paused: dict[str, list[tuple[int, float]]] = {}
        # job id -> (sent at, delay s, node index) of the last NACK or
        # ENQUEUE DELAY a node took for it (aof-keeps-delay)
        self.delays_at: dict[str, tuple[float, int, int]] = {}
        self._seen_before_crash: dict[str, dict[str, float]] = {}
        self.last_jump_at = -1e9
        self.flags_seen: dict[tuple[str, str], int] = {}  # (observer, peer id) -> flags
        # What users observe (sim/observing.py): order, counters, RETRY 0
        # once cluster-wide, rewrites, the node's always rules.
        # Called with each node at each start (the checks of what users
        # observe, sim/observing.py, watch its AOF rewrites), and at each
        # monitor sample; sim/runner.py attaches them.
        self.start_hooks: list[Callable[[SimNode], None]] = []
        self.samplers: list[Callable[[], None]] = []
        self._crash_windows: list[list[float]] = []  # the crash-like fault windows
        # (delivered at, node index, incarnation, job id) of deliveries in a
        # healthy cluster whose other holders are to be looked at
        # (delivery-told), oldest first.
        self._told_pending: deque[tuple[float, int, int, str]] = deque()
        # federation-prompt (watch_federation): the queue watched, or None;
        # node index -> since when it has had clients blocked on it with
        # nothing queued (by the monitor's samples); (node, queue) -> its
        # last queueing of a job there; the jobs to judge: (queued at, node
        # index, incarnation, job id, the waiting nodes' indexes).
        self._federation: str | None = None
        self._fed_waiting: dict[int, float] = {}
        self._fed_last: dict[int, float] = {}
        self._fed_pending: deque[tuple[float, int, int, str, list[int]]] = deque()

    @property
    def nursery(self) -> trio.Nursery | None:
        """The nursery of the run's background tasks (checks, late frames)."""
        return self._nursery

    def child_rng(self) -> random.Random:
        """A new generator derived from the root (workload, faults)."""
        return random.Random(self.root.getrandbits(64))

    def run(self, body: Callable[[World], Awaitable[None]]) -> None:
        """Run ``body(world)`` with the cluster up, deterministically."""
        saved_flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
        saved_r = trio_run._r
        logger = logging.getLogger("disque_trio")
        saved_level = logger.level
        # Trio's private hook declares the flag Final: assigning it is the
        # whole point (a canary test in tests/sim watches that it exists).
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
        trio_run._r = _SchedulerRandom(self.scheduler_seed)
        trio_run._r.world = self
        logger.setLevel(logging.CRITICAL)
        always.enable(self._violate)  # the node's always rules (core/always.py)
        try:
            with virtual_time(self.timers):
                trio.run(self._main, body, clock=self.clock)
        finally:
            always.disable()
            self.trace.clock = None
            trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag  # type: ignore[misc]  # Final, as above
            trio_run._r = saved_r
            logger.setLevel(saved_level)

    async def _main(self, body: Callable[[World], Awaitable[None]]) -> None:
        fast_hook_table()
        self.trace.clock = self.clock
        async with trio.open_nursery() as net_nursery:
            self.net.nursery = net_nursery
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for i in range(self.count):
                    await self._start_node(i)
                await self.mesh()
                self.trace.record("world", "meshed", {"nodes": self.count})
                nursery.start_soon(self.monitor)
                nursery.start_soon(self._progress)
                limit = self.plan.duration + VIRTUAL_SLACK_S
                with trio.move_on_after(limit) as scope:
                    await body(self)
                if scope.cancelled_caught:
                    self._violate(
                        f"run-finishes: still in phase {self.phase!r} after {limit:.0f} "
                        f"virtual seconds ({self.stuck_report()})"
                    )
                self.virtual_seconds = trio.current_time()
                self.probes["socket-full"] += self.net.full_waits
                for node in self.nodes:
                    if node.up:
                        node.server.shutdown()
                nursery.cancel_scope.cancel()
            net_nursery.cancel_scope.cancel()

    # --------------------------------------------------------------- nodes

    async def _start_node(self, i: int) -> None:
        """Start node i: a fresh NodeServer (first start or restart) on the
        node's own SimDisk, which holds its nodes.conf and AOF."""
        port = BASE_PORT + i
        pairs = [
            ("port", [str(port)]),
            ("appendonly", ["yes"]),
            ("appendfsync", [self.appendfsync]),
            # The explorer runs DEBUG FLUSHALL (sim/explore.py).
            ("enable-debug-command", ["yes"]),
        ]
        if self.plan.aof_rewrite_kb:
            pairs.append(("auto-aof-rewrite-min-size", [f"{self.plan.aof_rewrite_kb}kb"]))
        if self.plan.node_timeout:
            pairs.append(("cluster-node-timeout", [str(self.plan.node_timeout_ms)]))
        if self.plan.secret:
            pairs.append(("cluster-secret", [f"sim-secret-{self.plan.seed}"]))
        pairs += [(k.replace("_", "-"), [str(v)]) for k, v in sorted(self.config.items())]
        config = Config.load(None, pairs)
        if i < len(self.nodes):
            node: SimNode | None = self.nodes[i]
            disk = self.nodes[i].disk
        else:
            disk = SimDisk()
            node = None
        incarnation = node.incarnation + 1 if node is not None else 0
        handle = DiskHandle(disk)
        clock = node.clock if node is not None and node.clock is not None else None
        if clock is None:
            clock = SimClock(BASE_WALL_MS, self.skews_ms[i], self.drifts_ppm[i])
        seed = self.node_seeds[i] + incarnation * 1_000_003
        env = Env(
            clock=clock,
            rng=random.Random(seed),
            net=self.net.view(port),
            disk=handle,
            # Handshake nonces from a stream of their own: the node's other
            # random choices stay what they were before nonces existed.
            secure_bytes=random.Random(seed ^ 0x6E6F6E6365).randbytes,
            alarm=lambda: TimerAlarm(self.timers),
        )
        server = NodeServer(
            config, env, persist_cluster=True, bus_version=self.bus_versions.get(i)
        )
        if node is None:
            node = SimNode(i, server, disk)
            self.nodes.append(node)
        node.server, node.handle, node.incarnation = server, handle, incarnation
        sim_node = node
        node.disk.on_slow_fsync = lambda seconds: self.slow_fsync(sim_node, seconds)
        node.clock = clock
        node.done = trio.Event()
        node.loaded, node.reloaded = set(), set()
        node.loaded_as = {}
        node.seen_at, node.expired = {}, set()
        node.queued_since = {}
        server.node.observers.append(self._observer(node, server))
        for hook in self.start_hooks:
            hook(node)
        server.node.flush_all = self._observed_flush(node, server.node.flush_all)  # type: ignore[method-assign]
        server.bus.dispatch = self._chaotic(node, server, server.bus.dispatch)
        server.bus.send = self._traced_send(node, server.bus.send)  # type: ignore[method-assign,assignment]
        self.net.unfence(port)
        listeners = await env.net.open_listeners("127.0.0.1", port)
        bus_listeners = await env.net.open_listeners("127.0.0.1", config.cluster_bus_port())
        assert self._nursery is not None
        await self._nursery.start(self._run_node, node, server, listeners, bus_listeners)
        node.up = True
        self.trace.record(
            node.name,
            "node",
            {
                "ev": "started",
                "id": server.node.node_id,
                "incarnation": incarnation,
                "loaded": len(node.loaded),
            },
        )

    async def _run_node(
        self,
        node: SimNode,
        server: NodeServer,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        bus_listeners: list[trio.abc.Listener[trio.abc.Stream]],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        done = node.done
        root = trio.lowlevel.current_task()
        self._roots[root] = node.index
        try:
            with trio.CancelScope() as scope:
                node.scope = scope
                await server.run(listeners, bus_listeners, task_status=task_status)
        finally:
            self._roots.pop(root, None)
            done.set()

    # ------------------------------------------------------- slow fsyncs

    def slow_fsync(self, node: SimNode, seconds: float) -> None:
        """An fsync that takes ``seconds``: the node's process is stuck in
        it (its event loop is: the node fsyncs on it). Every task of the
        incarnation that called it waits that long (``hold_stalled``), and
        what it sends meanwhile is held on its side, as the bytes it would
        write after the fsync returns; what reaches it waits in its socket
        buffers. Called in the node's own task, from the disk."""
        root = self._root_of(trio.lowlevel.current_task())
        if root is None or not node.up or self._nursery is None:
            return
        until = trio.current_time() + seconds
        stall = self.stalls.get(root)
        self.probes["slow-fsync"] += 1
        self.trace.record(node.name, "fault", {"ev": "slow-fsync", "s": seconds})
        if stall is not None:
            stall[0] = max(stall[0], until)
            return
        self.stalled_until[node.index] = math.inf
        self.stalled_from[node.index] = trio.current_time()
        others = [n.port for n in self.nodes if n is not node]
        key = self.net.add_rule("stall", [node.port], [*others, None])
        self.stalls[root] = [until, key, node.index]
        self._nursery.start_soon(self._end_stall, root)

    async def _end_stall(self, root: trio.lowlevel.Task) -> None:
        try:
            while (stall := self.stalls.get(root)) is not None:
                if trio.current_time() >= stall[0]:
                    break
                await trio.sleep_until(stall[0])
        finally:
            self.release_stall(root)

    def release_stall(self, root: trio.lowlevel.Task) -> None:
        """The stall of the incarnation run by ``root`` ends: its tasks held
        back run again, in the order they became runnable."""
        stall = self.stalls.pop(root, None)
        if stall is None:
            return
        self.stalled_until[stall[2]] = trio.current_time()
        self.net.remove_rule(stall[1])
        mine = [task for owner, task in self._stashed if owner is root]
        self._stashed = [(owner, task) for owner, task in self._stashed if owner is not root]
        self._owners.clear()
        trio_run.GLOBAL_RUN_CONTEXT.runner.runq.extend(mine)

    def hold_stalled(self, batch: MutableSequence[Any]) -> None:
        """The scheduler's batch, less the tasks of stalled incarnations
        (kept, with their pending value, until their stall ends)."""
        keep = []
        for task in batch:
            root = self._root_of(task)
            if root is not None and root in self.stalls:
                self._stashed.append((root, task))
            else:
                keep.append(task)
        batch[:] = keep

    def _root_of(self, task: trio.lowlevel.Task) -> trio.lowlevel.Task | None:
        """The root task of the node incarnation ``task`` belongs to."""
        if task in self._owners:
            return self._owners[task]
        t: trio.lowlevel.Task | None = task
        while t is not None and t not in self._roots:
            nursery = t.parent_nursery
            t = nursery.parent_task if nursery is not None else None
        self._owners[task] = t
        return t

    def lose_acks_only_on(self, node: SimNode) -> None:
        """Acks only this node knew of are excused as lost (``acks_lost``):
        it is crashing, or flushing its jobs."""
        elsewhere = {
            job.id
            for n in self.nodes
            if n.up and n is not node
            for job in n.server.node.jobs.values()
            if job.state == JobState.ACKED
        }
        self.acks_lost.update(
            job.id
            for job in node.server.node.jobs.values()
            if job.state == JobState.ACKED and job.id not in elsewhere
        )

    async def crash(self, i: int, torn: float = 0.0, wipe: bool = False) -> None:
        """Kill node i like a power loss: its unsynced writes are gone (but
        for a ``torn`` fraction), its connections reset, its tasks cancelled
        (no shutdown code runs). ``wipe``: its disk is lost too."""
        node = self.nodes[i]
        assert node.up and node.scope is not None and node.handle is not None
        self._seen_before_crash[node.name] = dict(node.seen_at)
        # A job whose first record the AOF writer has not written yet (the
        # crash came between its commit and the writer's turn) was promised
        # to nobody: its GOTJOB or reply waits for that write. Only a job
        # the file already names must come back (seed 323102082: the
        # crash-after-ack knob crashed a node right after a REPLJOB's
        # commit).
        # A job whose records are in limbo only (written before an fsync
        # that failed, sim/disk.py) was promised to nobody either: its reply
        # waits for the rewrite that makes it durable.
        aof = node.server.aof
        unwritten = b"".join(aof._buffer) + bytes(aof._unwritten)
        always = self.appendfsync == "always"
        limbo = node.disk.limbo_bytes > 0 and always
        on_disk = b""
        if unwritten or limbo:
            # Under everysec and no, a record the page cache took was
            # written: its reply went, limbo or not.
            on_disk = node.disk.written(aof.path) if always else (node.disk.read(aof.path) or b"")
        node.held_at_crash = {}
        node.unwritten_at_crash = set()
        for job in node.server.node.jobs.values():
            if job.body is None or job.state not in (JobState.ACTIVE, JobState.QUEUED):
                continue
            if (job.id.encode() in unwritten or limbo) and job.id.encode() not in on_disk:
                # Not this node's promise, but its copy is gone all the same
                # (seed 780: a YOURJOBS move onto a node whose disk was full,
                # the other copy flushed by the operator).
                node.unwritten_at_crash.add(job.id)
            else:
                node.held_at_crash[job.id] = job.etime
        node.delayed_at_crash = {}
        for job in node.server.node.jobs.values():
            asked = self.delays_at.get(job.id)
            if job.flags & FLAG_DELAYED and job.state == JobState.ACTIVE and asked:
                t0, delay, index = asked
                if index == i and node.clock is not None:
                    # The queue time the command recorded: the node's clock
                    # at the command plus the delay (a POSTPONE or WORKING
                    # since may have moved it later in memory only).
                    at = (
                        node.clock.base_ms
                        + node.clock.offset_ms
                        + int(t0 * 1000 * node.clock.rate)
                    )
                    node.delayed_at_crash[job.id] = (at + delay * 1000, job.etime, t0)
        # Seconds its expire times moved back with clock steps: the AOF
        # records of the last moves may die with the crash.
        node.shifted_at_crash = node.server.node.etime_shift_s
        if wipe or self.appendfsync != "always":
            # An ack only this node knew of: its AOF record and its SETACKs
            # may die with the crash (legal unless every write is fsynced
            # and the disk survives: seed 138278, a dummy ack held only by
            # a node then wiped, its one holder cut off meanwhile).
            self.lose_acks_only_on(node)
        node.up = False
        node.crashed_at = trio.current_time()
        node.handle.alive = False
        # Its tasks held in a stall are let go to be cancelled, and run on
        # to their next checkpoint with what they were given: what they do
        # there is not the node's (seed 743245: a YOURJOBS read and
        # registered by a node killed in a slow fsync, so never read at
        # all, was counted as a copy it held).
        node.server.node.observers.clear()
        kept = node.disk.crash(torn)
        if wipe:
            node.disk.wipe()
            node.old_ids.append(node.server.node.node_id)
            self.probes["wipe"] += 1
        node.wiped = wipe
        for root, index in list(self._roots.items()):
            if index == i:
                self.release_stall(root)  # a killed process runs no more
        node.scope.cancel()  # before the fence: waiting tasks see Cancelled
        self.net.fence(node.port)
        self.probes["crash"] += 1
        self.trace.record(
            node.name,
            "node",
            {"ev": "crashed", "held": len(node.held_at_crash), "torn": kept, "wipe": wipe},
        )
        await node.done.wait()

    async def restart(self, i: int) -> None:
        """A fresh NodeServer on node i's SimDisk and ports (AOF reloaded).
        A wiped node has a new identity and is introduced again by MEET."""
        node = self.nodes[i]
        async with node.restart_lock:
            if node.up:
                # Another caller (a crash fault, the liveness phase, the
                # explorer's controlled restart) restarted it meanwhile: two
                # starts raced for its ports (seed 3245).
                return
            before = node.server.node.node_id
            await self._start_node(i)
        if node.server.node.node_id != before and before not in node.old_ids:
            # A new identity without a wipe: its nodes.conf was never
            # written (the disk failed since the wipe that made the old
            # one). The old ID is gone for good, as a wiped one: the
            # operator forgets it (seed 780155: acks waited for ever for
            # the GOTACK of an ID no node would answer for again).
            node.old_ids.append(before)
            self.trace.record(node.name, "node", {"ev": "replaced", "old": before[:8]})
        # A job whose TTL ran out while the node was down is rightly not
        # loaded back (the same rule as the AOF load and the expiry timer).
        now = node.server.node.now_ms()
        forgot = sorted(
            job_id
            for job_id, etime in node.held_at_crash.items()
            if job_id not in node.loaded and etime * 1000 > now
        )
        for job_id in forgot + sorted(node.unwritten_at_crash - node.loaded):
            self.amnesia.setdefault(job_id, set()).add(node.name)
            self.amnesia_at.setdefault((job_id, node.name), trio.current_time())
        if forgot:
            self.trace.record(node.name, "node", {"ev": "amnesia", "ids": forgot})
            if self.appendfsync == "always" and not node.wiped:
                self._violate(
                    f"always-no-amnesia: {node.name} restarted without {forgot[:3]} "
                    f"({len(forgot)} jobs)"
                )
        if self.appendfsync == "everysec" and not node.wiped:
            self._check_everysec(node, forgot)
        # aof-keeps-ttl: a job loaded back expires when it did before, or
        # (its records of the move lost) before the clock steps it followed.
        # The new incarnation may have followed steps of its own since it
        # loaded the file (its start waits for the node to serve): those
        # moves are taken back (seed 177675).
        core = node.server.node
        for job_id in sorted(node.loaded & node.held_at_crash.keys()):
            job = core.jobs.get(job_id)
            held = node.held_at_crash[job_id]
            if job is None:
                continue
            loaded = job.etime + core.etime_shift_s
            if not held <= loaded <= held + node.shifted_at_crash:
                self._violate(
                    f"aof-keeps-ttl: {node.name} reloaded {job_id} expiring at "
                    f"{loaded}, not {held}"
                )
        if self.appendfsync != "no" and not node.wiped:
            self._check_kept_delay(node)
        if node.wiped:
            # A new identity: split from the others until its MEET's
            # handshake is through (seed 4298: the MEET met a partition).
            split = self.split_begin(i)
            await self.introduce(i)
            self.split_watch(split)

    def _check_kept_delay(self, node: SimNode) -> None:
        """aof-keeps-delay: a job reloaded while still within a client's
        NACK or ENQUEUE DELAY (its queue time ahead of the node's clock)
        waits for it: as the load made it (what happens after is the bus's
        business), active, still delayed, its queue time the recorded one
        (capped by its expire time). Under ``everysec``, only for a delay
        asked for before the crash's window (its record on the disk)."""
        core = node.server.node
        now = core.now_ms()
        synced = math.inf if self.appendfsync == "always" else node.crashed_at - EVERYSEC_WINDOW_S
        if self.appendfsync != "always" and any(
            s <= node.crashed_at for s, _ in self.disk_failures[node.index]
        ):
            synced = -math.inf  # failed fsyncs: nothing is known to be on the disk
        for job_id in sorted(node.loaded & node.delayed_at_crash.keys()):
            qtime, etime, asked = node.delayed_at_crash[job_id]
            job = core.jobs.get(job_id)
            if job is None or job.state == JobState.ACKED or qtime <= now or asked >= synced:
                continue  # acked in the file, or since
            state, flags, loaded_qtime = node.loaded_as[job_id]
            if self.last_jump_at >= asked - 1:
                continue  # its clock jumped since: the frame of the record moved
            self.probes["aof-reload-kept-delay"] += 1
            want = min(qtime, etime * 1000)
            if state != JobState.ACTIVE or not flags & FLAG_DELAYED or loaded_qtime < want - 5:
                self._violate(
                    f"aof-keeps-delay: {node.name} reloaded {job_id} within its client's "
                    f"delay ({(qtime - now) / 1000:.2f}s left) as {state.name}, "
                    f"delayed {bool(flags & FLAG_DELAYED)}, queue time "
                    f"{(loaded_qtime - now) / 1000:.2f}s from now"
                )

    def _check_everysec(self, node: SimNode, forgot: list[str]) -> None:
        """everysec-window: with ``appendfsync everysec`` a crash loses at
        most the writes of the last ``EVERYSEC_WINDOW_S`` (the jobs a node
        held at the crash and registered before that are loaded back)."""
        old = node.crashed_at - EVERYSEC_WINDOW_S
        if any(s <= node.crashed_at for s, _ in self.disk_failures[node.index]):
            # Its fsyncs failed (sim/disk.py's limbo): what it wrote since
            # the last good one was never durable, however old. The
            # window's promise holds for a disk that works.
            return
        # Held at the crash, registered by that incarnation before the
        # window (its seen_at dict is gone with it: rebuilt here).
        seen = self._seen_before_crash.pop(node.name, {})
        checked = [j for j in node.held_at_crash if seen.get(j, old + 1) <= old]
        if checked:
            self.probes["everysec-crash-checked"] += 1
        lost = [j for j in forgot if seen.get(j, old + 1) <= old]
        if lost:
            self._violate(
                f"everysec-window: {node.name} lost {len(lost)} jobs written more than "
                f"{EVERYSEC_WINDOW_S}s before its crash, e.g. {lost[:3]}"
            )

    async def introduce(self, i: int) -> None:
        """CLUSTER MEET from node i to the first other node that is up,
        one never wiped first: two wiped nodes meeting only each other would
        make a cluster of their own (seed 440), which no operator does."""
        others = [n for n in self.nodes if n.up and n.index != i]
        others.sort(key=lambda n: bool(n.old_ids))
        if not others:
            return
        # Bounded: the node may be frozen or cut off (a pause fault); the
        # liveness phase introduces it again once everything is healed.
        with trio.move_on_after(ADMIN_TIMEOUT_S):
            try:
                client = await self.client(i)
            except OSError:
                return
            try:
                await client.call("CLUSTER", "MEET", "127.0.0.1", others[0].port)
            except (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await client.aclose()

    async def forget_wiped(self) -> None:
        """Tell every node to forget the identities of wiped incarnations
        (what an operator does after replacing a node's disk)."""
        old = [old for n in self.nodes for old in n.old_ids]
        if not old:
            return
        for n in self.nodes:
            if not n.up:
                continue
            client = await self.client(n.index)
            try:
                for node_id in old:
                    if node_id in n.server.node.cluster.nodes:
                        await client.call("CLUSTER", "FORGET", node_id)
            finally:
                await client.aclose()

    def _chaotic(
        self, node: SimNode, server: NodeServer, dispatch: Callable[[str, object], None]
    ) -> Callable[[str, object], None]:
        """Bus chaos on the receiving side of node i: frames dropped,
        duplicated or delivered late (after later ones: reordered)."""

        def deliver(sender: str, msg: object) -> None:
            ids = job_ids(msg)
            if ids:
                self.trace.record_bus(
                    node.name, "recv", type(msg).__name__, "from", sender[:8], ids
                )
            self._window_messages += 1
            if self._window_messages > STORM_MESSAGES_PER_S * self.count * SAMPLE_S:
                self._storm_now()
            self._check_versions(node, sender, msg)
            node.handling = type(msg)
            node.handling_msg = msg
            waiting = None
            if type(msg) is bus.GotJob:
                waiting = self._confirmation(node, server, sender, msg.job_id)
            try:
                dispatch(sender, msg)
            finally:
                node.handling = None
                node.handling_msg = None
            if waiting is not None and waiting[0].state != JobState.WAIT_REPL:
                job, confirmed = waiting
                del self.confirmed_by[(node.name, node.incarnation, job.id)]
                if len(confirmed) < job.repl:
                    self._violate(
                        f"replication-counts-nodes: {node.name} ended the wait of {job.id} "
                        f"(REPLICATE {job.repl}) with {len(confirmed)} nodes confirmed"
                    )

        handle = node.handle

        def chaotic(sender: str, msg: object) -> None:
            if handle is not None and not handle.alive:
                # Read by a task of a killed incarnation, released from a
                # stall to be cancelled: the process is gone, it reads no
                # more (seed 743245).
                return
            if self.plan.slow_yourjobs and type(msg) is bus.YourJobs and self._nursery is not None:
                # BUGGIFY (sim/buggify.py): a NEEDJOBS answer crossing the
                # acks, NACKs and DELAYs sent meanwhile.
                later = self.plan.slow_yourjobs / 10
                self._carried_late(node, msg, later)
                self.probes["slow-yourjobs"] += 1
                self._nursery.start_soon(self._late, node, deliver, later, sender, msg)
                return
            chaos = self.chaos.get(node.index)
            if chaos is None or isinstance(msg, bus.Meet):
                deliver(sender, msg)
                return
            drop, dup, delay = chaos
            r = self.chaos_rng.random()
            kind = type(msg).__name__
            if r < drop:
                self.probes["bus-frame-dropped"] += 1
                self.trace.record(node.name, "chaos", {"ev": "drop", "msg": kind})
                return
            if drop + dup <= r < drop + dup + delay and self._nursery is not None:
                # Delivered once, later: after frames sent after it.
                later = self.chaos_rng.uniform(0.05, 1.0)
                self.trace.record(node.name, "chaos", {"ev": "late", "msg": kind})
                self._carried_late(node, msg, later)
                self._nursery.start_soon(self._late, node, deliver, later, sender, msg)
                return
            deliver(sender, msg)
            if r < drop + dup:
                self.trace.record(node.name, "chaos", {"ev": "dup", "msg": kind})
                deliver(sender, msg)

        return chaotic

    def _waited_in_socket(self, node: SimNode) -> float:
        """How long the bus bytes ``node`` reads now may have waited before
        it read them: held back by a net fault just now, or in its socket
        while a slow fsync stalled it (its reads right after the stall)."""
        now = trio.current_time()
        waited = 0.0
        held = self.net.held_back.get(node.port)
        if held is not None and now - held[0] <= HELD_BACK_RECENT_S:
            waited = held[1]
        stall_end = self.stalled_until.get(node.index, -math.inf)
        if now - stall_end <= STALL_RECENT_S:
            waited = max(waited, stall_end - self.stalled_from.get(node.index, stall_end))
        return waited

    def _carried_late(self, node: SimNode, msg: object, later: float) -> None:
        """A REPLJOB or YOURJOBS read now reaches the node ``later`` seconds
        on. The TTL of each copy it carries was sent as what was left of
        it: the copy lives as much longer as the bytes waited, before the
        reading and after it (the registration's own test of the wait
        before comes too late: seed 742409, a REPLJOB read as a 4 s stall
        ended, then held back 0.9 s by bus chaos)."""
        if isinstance(msg, bus.ReplJob):
            carried: tuple[Any, ...] = (msg.job,)
        elif isinstance(msg, bus.YourJobs):
            carried = msg.jobs
        else:
            return
        total = later + self._waited_in_socket(node)
        for data in carried:
            self.held_back[data.id] = max(self.held_back.get(data.id, 0.0), total)

    def _confirmation(
        self, node: SimNode, server: NodeServer, sender: str, job_id: str
    ) -> tuple[Job, set[str]] | None:
        """A GOTJOB for a job waiting for its copies: the job, and the nodes
        that confirmed it so far, this sender included (the origin itself
        when it keeps a copy)."""
        job = server.node.jobs.get(job_id)
        if job is None or job.state != JobState.WAIT_REPL:
            return None
        key = (node.name, node.incarnation, job_id)
        confirmed = self.confirmed_by.get(key)
        if confirmed is None:
            me = server.node.node_id
            confirmed = self.confirmed_by[key] = {me} if me in job.nodes_delivered else set()
        confirmed.add(sender)
        return job, confirmed

    def _traced_send(
        self, node: SimNode, send: Callable[[str, object, float], None]
    ) -> Callable[[str, object, float], None]:
        """The bus messages about jobs, traced as the core sends them (the
        timeline's arrows: sim/timeline.py pairs them with their "recv")."""

        def traced(peer: str, msg: object, send_by: float = math.inf) -> None:
            ids = job_ids(msg)
            if ids:
                self.trace.record_bus(node.name, "send", type(msg).__name__, "to", peer[:8], ids)
            send(peer, msg, send_by)

        return traced

    async def _late(
        self,
        node: SimNode,
        deliver: Callable[[str, object], None],
        delay: float,
        sender: str,
        msg: object,
    ) -> None:
        """A frame bus chaos held back arrives now. The node's bus reads a
        frame from a node it does not know (any more) and drops it, unless
        it is a MEET (never held back); the chaos hook sits after that
        check, so it is made again here, at arrival (seed 1191: a NEEDJOBS
        from a replaced node's old ID, held back past the CLUSTER FORGET of
        that ID, was served and put the forgotten ID in a job's holder
        list, where no GOTACK could ever come from)."""
        incarnation = node.incarnation
        await trio.sleep(delay)
        if not node.up or node.incarnation != incarnation:
            return
        if sender not in node.server.node.cluster.nodes:
            self.trace.record(
                node.name, "chaos", {"ev": "late-stranger", "msg": type(msg).__name__}
            )
            return
        deliver(sender, msg)
        node.server.after_bus_event()

    # ------------------------------------------------------------ observers

    def _observer(self, node: SimNode, server: NodeServer) -> Callable[[str, Job], None]:
        name = node.name
        key = (node.name, node.incarnation)
        acked = self.acked_by.setdefault(key, set())
        queued = self.queued_once.setdefault(key, set())

        def observe(event: str, job: Job) -> None:
            handling = node.handling
            self.trace.record_job(
                name, event, job.id, None if handling is None else handling.__name__
            )
            loading = server.aof.loading
            reloaded_before = job.id in node.reloaded
            if event == "registered":
                if job.id in node.expired and node.handling is not None:
                    self._violate(
                        f"expired-stays-expired: {name} took a copy of {job.id} "
                        f"({node.handling.__name__}) after its TTL ran out there"
                    )
                node.seen_at[job.id] = -1e9 if loading else trio.current_time()
                if node.handling in (bus.ReplJob, bus.YourJobs):
                    # A copy from bytes a net fault held back, or read from
                    # its socket once a slow fsync let it run again: its
                    # TTL, sent as what was left of it, runs as much longer
                    # as the message waited (seed 724981: a TTL 3 job
                    # delivered 5.45 s after its ADDJOB, its REPLJOB read
                    # after a 3.8 s stall).
                    waited = self._waited_in_socket(node)
                    if waited > 0:
                        self.held_back[job.id] = max(self.held_back.get(job.id, 0.0), waited)
                if job.body is None and job.state == JobState.ACKED and not loading:
                    self.probes["dummy-ack-created"] += 1
                self.holders.setdefault(job.id, set()).add(name)
                at = self.registered_at.setdefault(job.id, {})
                at.setdefault(name, trio.current_time())
                queued.discard(job.id)
                acked.discard(job.id)  # a new copy (late REPLJOB, YOURJOBS)
                if loading:
                    node.loaded.add(job.id)
                    node.reloaded.add(job.id)
                    self.ever_reloaded.add(job.id)
                    node.loaded_as[job.id] = (job.state, job.flags, job.qtime)
                q = server.node.queues.get(job.queue)
                if node.handling is bus.ReplJob and q is not None and q.pause & PAUSED_IN:
                    self._violate(f"pause-in: {name} stored a copy of {job.id} while paused in")
            elif event == "deleted":
                if not loading and job.etime * 1000 <= server.node.now_ms():
                    node.expired.add(job.id)
                if job.body is None and job.is_dummy_ack and not loading:
                    self.probes["dummy-ack-collected"] += 1
                if loading:
                    node.loaded.discard(job.id)
                    node.reloaded.discard(job.id)
            elif event == "acked":
                acked.add(job.id)
                if job.id in self.acked_in_fault and not self.net.faulty:
                    self.probes["ack-crossed-healed-partition"] += 1
                    self.acked_in_fault.discard(job.id)
            elif event == "delivered":
                now = trio.current_time()
                self.delivered_at.setdefault(job.id, []).append(now)
                if job.retry and node.clock is not None:
                    # Its next retry point here, set when it was queued (a
                    # delivery does not move it, as in the original).
                    left = (job.qtime - server.node.now_ms()) / 1000 / node.clock.rate
                    self.retry_points.setdefault(job.id, []).append((now, now + left))
                if job.retry and len(job.nodes_delivered) > 1 and self.healthy(True):
                    self._told_pending.append(
                        (trio.current_time(), node.index, node.incarnation, job.id)
                    )
            elif event == "requeue-paused":
                self.requeue_paused.setdefault(job.id, []).append(
                    (node.index, trio.current_time())
                )
            elif event == "queued":
                if not loading:
                    self.queued_at.setdefault(job.id, []).append(trio.current_time())
                    node.queued_since[job.id] = trio.current_time()
                    if job.queue == self._federation:
                        self._federation_queued(node, job)
                if job.id in acked:
                    self._violate(f"acked-absorbing: {name} re-queued acked {job.id}")
                if job.retry == 0 and not loading:
                    if job.id in queued:
                        self._violate(f"retry0-once: {name} queued {job.id} twice")
                    if reloaded_before and not self._first_queueing_moved_here(name, job.id, node):
                        self._violate(f"retry0-once: {name} re-queued {job.id} after reload")
                    queued.add(job.id)
                if reloaded_before and not loading:
                    node.reloaded.discard(job.id)
                    self.probes["aof-reload-requeued-job"] += 1
            if event in CORE_PROBES:
                self.probes[event] += 1
            for more in self.observers:
                more(node, event, job, loading)
            if event == "ack-collected" and self.healthy(True) and self._nursery is not None:
                self._nursery.start_soon(self._check_collected, name, job.id)

        return observe

    def _first_queueing_moved_here(self, name: str, job_id: str, node: SimNode) -> bool:
        """retry0-once's one excuse for queueing a RETRY 0 job reloaded from
        the AOF: a YOURJOBS moved here the one queued copy of a job that no
        node ever handed to a client, and no incarnation of this node had
        queued before. That is the job's first queueing here, not a re-queue
        (core/clusterjobs.py's _on_yourjobs takes it into the copy it holds
        when that copy never left a queue of ours, simulator seed 6752).
        Seed 792242: a leaving node replicated a RETRY 0 DELAY 2 job on n1
        and n3 and ENQUEUEd it on n3; n1 crashed and reloaded its copy (not
        queued: RETRY 0); at the delay's end n3 queued it and answered n1's
        NEEDJOBS with it, its only delivery. A reload that queues the job
        itself, or a YOURJOBS of a job delivered anywhere or queued here
        before, is still a violation (retry0-once-cluster judges the
        deliveries cluster-wide)."""
        if node.handling is not bus.YourJobs or job_id in self.delivered_at:
            return False
        return not any(
            job_id in ids for (other, _), ids in self.queued_once.items() if other == name
        )

    def _observed_flush(self, node: SimNode, flush_all: Callable[[], None]) -> Callable[[], None]:
        def flush() -> None:
            for observe in self.flush_observers:
                observe(node)
            flush_all()

        return flush

    def _storm_now(self) -> None:
        """message-storm within one sampling window: a storm that grows
        fast enough keeps virtual time from reaching the monitor's next
        sample for (wall) minutes. The run stops at once, as the monitor
        would stop it."""
        if self._storming or self._nursery is None:
            return
        self._storming = True
        limit = STORM_MESSAGES_PER_S * self.count * SAMPLE_S
        self._violate(
            f"message-storm: more than {limit:.0f} bus messages across {self.count} nodes "
            f"within {SAMPLE_S}s at t={trio.current_time():.2f} "
            f"(limit {STORM_MESSAGES_PER_S}/s per node)"
        )
        self.virtual_seconds = trio.current_time()
        self._nursery.cancel_scope.cancel()

    def disk_failed_lately(self, index: int) -> bool:
        """Node ``index``'s disk fails now, or worked again less than
        DISK_RETRY_GRACE_S ago: the writer retries once a second, so what
        waited for a write (replies, GOTJOB, DELJOB, -MISCONF) may follow
        the recovery by that much, and a reply's way back."""
        now = trio.current_time()
        return any(s <= now <= e + DISK_RETRY_GRACE_S for s, e in self.disk_failures[index])

    def check_disk_answer(self, index: int, job_id: str | None, reply: str) -> None:
        """disk-answered (issue 58, docs/operations.md "A full disk"): a node
        whose disk refuses writes (full), or fails its fsyncs under
        ``appendfsync always``, answers no ADDJOB of a job it keeps a copy
        of until that job's record is written (and fsynced); and -MISCONF
        comes only from a node whose disk failed lately."""
        node = self.nodes[index]
        disk = node.disk
        if reply.startswith("MISCONF"):
            self.probes["disk-misconf"] += 1
            if not self.disk_failed_lately(index):
                self._violate(
                    f"disk-answered: {node.name} answered {reply[:40]!r} with its disk working"
                )
            return
        if job_id is None or not node.up or not self.disk_failed_lately(index):
            return
        now = trio.current_time()
        if node.crashed_at and now - node.crashed_at < 1.0:
            return  # answered by the incarnation before, maybe
        core = node.server.node
        if job_id not in core.jobs:
            return  # no copy here (replicated externally): nothing to write
        # The reply waited for the job's record: written (under always,
        # fsynced too), in the file now, whatever the disk did meanwhile
        # (a write the page cache took and a failed fsync left in limbo was
        # written, for everysec and no: they promise no more).
        path = node.server.aof.path
        always = self.appendfsync == "always"
        on_file = disk.durable_of(path) if always else (disk.read(path) or b"")
        self.probes["disk-answer-checked"] += 1
        if job_id.encode() not in on_file:
            self._violate(
                f"disk-answered: {node.name} answered ADDJOB {job_id}, its record not "
                f"{'fsynced' if always else 'written'} (its disk "
                f"{'full' if disk.refuse_writes else 'failing'} since "
                f"t={self.disk_failures[index][-1][0]:.2f})"
            )

    def _violate(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)
            self.trace.record("check", "violation", {"text": text})

    def watch_holders(self, job_id: str) -> None:
        """holders-know-holders: shortly after a synchronous ADDJOB was
        answered, in a healthy cluster, every node holding the job lists
        every other one (REPLJOB carries the growing list; a holder that
        missed a node would not tell it about an ack)."""
        if self._nursery is not None and self.healthy(True):
            self._nursery.start_soon(self._check_holders, job_id, trio.current_time())

    def watch_postpone(self, job_id: str, index: int, t0: float, delay: int) -> None:
        """nack-delay-told: a NACK or ENQUEUE DELAY sent to node ``index``
        at ``t0`` was answered 1; in a healthy cluster, once the POSTPONE
        had time to arrive, no other holder has the job queued and each
        holds it at least the delay plus RETRY from the command, as
        docs/commands.md says (a copy queued there would be delivered
        before the delay: nack-delay-holds sees that only if a consumer
        asks in time)."""
        self.delays_at[job_id] = (t0, delay, index)
        if self._nursery is not None and self.healthy(True):
            self._nursery.start_soon(self._check_postpone, job_id, index, t0, delay)

    async def _check_postpone(self, job_id: str, index: int, t0: float, delay: int) -> None:
        disturbed = self._disturbances()
        await trio.sleep(HOLDERS_SETTLE_S)
        if (
            not self.healthy()
            or self.net.changed_at >= t0
            or self._disturbances() != disturbed
            or self.last_jump_at >= t0 - 1
        ):
            return
        # Another client's NACK, ENQUEUE or WORKING since (a duplicate
        # delivery's) may queue or time the job its own way.
        if any(t > t0 for t in self.commands_at.get(job_id, ())):
            return
        now = trio.current_time()
        mine = self.nodes[index].server.node.jobs.get(job_id)
        # Its timer (SHOW's next-awake-within) comes by its queue time
        # (next-requeue-within): the node looks at the job by then.
        if (
            mine is not None
            and mine.state == JobState.ACTIVE
            and mine.flags & FLAG_DELAYED
            and not 0 < mine.awake <= mine.qtime
        ):
            self._violate(
                f"nack-delay-timed: n{index} delays {job_id} to "
                f"{(mine.qtime - self.nodes[index].server.node.now_ms()) / 1000:.2f}s "
                f"from now, its timer is {(mine.awake - mine.qtime) / 1000:.2f}s later"
            )
        for n in self.nodes:
            job = n.server.node.jobs.get(job_id)
            if n.index == index or job is None or not job.retry:
                continue
            if job.state == JobState.QUEUED:
                self._violate(
                    f"nack-delay-told: {n.name} has {job_id} queued {now - t0:.2f}s after "
                    f"a DELAY {delay} on n{index}"
                )
            elif job.state == JobState.ACTIVE:
                assert n.clock is not None
                # The node's wall clock at t0 (it runs at its drift's rate).
                sent = n.server.node.now_ms() - (now - t0) * 1000 * n.clock.rate
                # A holder delayed by its own client's command (a duplicate
                # delivery) queues the job itself at the later end.
                retry = 0 if job.flags & FLAG_DELAYED else job.retry
                due = sent + (delay + retry) * 1000 - TIME_ERROR_MS // 2
                if job.qtime < due:
                    self._violate(
                        f"nack-delay-told: {n.name} re-queues {job_id} "
                        f"{(job.qtime - sent) / 1000:.2f}s after a DELAY {delay} on "
                        f"n{index} (RETRY {job.retry})"
                    )

    def _disturbances(self) -> tuple[int, int, int]:
        """Connection resets, crashes and flushes (DEBUG FLUSHALL, CLUSTER
        RESET: the explorer's) so far: a check over messages in flight
        stands aside if one moved while it waited. A node replaced while it
        held a client's DELAY lost it, and the job was taken over at the
        delay's end (seed 529)."""
        return self.net.resets, self.probes["crash"], self.flushes

    async def _check_holders(self, job_id: str, ok_at: float) -> None:
        disturbed = self._disturbances()
        await trio.sleep(HOLDERS_SETTLE_S)
        # A connection reset after the answer loses the REPLJOBs still on
        # their way that carried the grown list (seed 564908: n4 missed n3
        # until n3's first WILLQUEUE, which taught it).
        if not self.healthy() or self.net.changed_at >= ok_at or self._disturbances() != disturbed:
            return
        # The copies replication made (a copy federation moved since is
        # announced by QUEUED, which may still be on its way).
        replicated = {n for n, t in self.registered_at.get(job_id, {}).items() if t <= ok_at}
        holders = {}
        for n in self.nodes:
            job = n.server.node.jobs.get(job_id)
            if n.name not in replicated:
                continue
            if job is not None and job.state in (JobState.ACTIVE, JobState.QUEUED):
                holders[n.server.node.node_id] = (n.name, job)
        for node_id, (name, job) in holders.items():
            missing = set(holders) - set(job.nodes_delivered) - {node_id}
            if missing:
                self._violate(
                    f"holders-know-holders: {name} holds {job_id} without listing "
                    f"{sorted(holders[m][0] for m in missing)}"
                )

    async def _check_collected(self, collector: str, job_id: str) -> None:
        """collected-everywhere: once a node collected an acked job (every
        holder confirmed), the holders drop it promptly (DELJOB). A node
        that crashed meanwhile and loaded the job back from its AOF is not
        counted unless every write is fsynced: the crash lost the DELJOB
        record (legal with ``everysec`` and ``no``; an acked copy collects
        itself, an unacked one is excused like in ``end_checks``). A dummy
        ack (ACKJOB on a node that never had a copy) is no holder: no DELJOB
        goes to it, it goes once every node answered its SETACK (the end
        check ``acked-collected`` sees that it went; seed 5089: a node just
        replaced, its links to two nodes not up yet, kept one 4 s)."""
        incarnations = {n.name: n.incarnation for n in self.nodes}
        disturbed = self._disturbances()
        since = trio.current_time()
        await trio.sleep(COLLECT_SETTLE_S)
        if not self.healthy() or self.net.changed_at >= since or self._disturbances() != disturbed:
            # A fault, a reset or a crash may have eaten the DELJOB, even
            # one that came and went within the wait (seed 390: a 0.7 s
            # isolation cut the DELJOB in flight).
            return
        synced = self.appendfsync == "always"
        left = [
            n.name
            for n in self.nodes
            if job_id in n.server.node.jobs
            and not n.server.node.jobs[job_id].is_dummy_ack
            and (synced or n.incarnation == incarnations[n.name] or job_id not in n.loaded)
        ]
        if left:
            self._violate(
                f"collected-everywhere: {collector} collected {job_id}, "
                f"{COLLECT_SETTLE_S:.0f}s later {left} still hold it"
            )

    def healthy(self, settled: bool = False) -> bool:
        """No fault in force and every node up; ``settled``: and for long
        enough that the bus links broken by the last fault are back."""
        if self.net.faulty or self.chaos or not all(n.up for n in self.nodes):
            return False
        if any(w[1] == float("inf") for w in self._splits):
            return False
        # A node whose disk fails holds back what its writes must precede
        # (replies, GOTJOB, DELJOB...) until a retry works: once a second
        # after the disk does (seed 232603059: a DELJOB held 4 s).
        if any(self.disk_failed_lately(i) for i in self.disk_failures):
            return False
        return not settled or trio.current_time() - self.net.changed_at >= LINK_SETTLE_S

    def messages_in(self) -> int:
        """Bus messages the nodes received (a BATCH frame's one by one)."""
        return sum(sum(n.server.bus.received_by_type.values()) for n in self.nodes if n.up)

    async def monitor(self) -> None:
        """Sample node state: queued-iff-in-queue, single-queued, and the
        bus message rate (a storm ends the run: it would never finish)."""
        since: dict[str, float] = {}
        messages = self.messages_in()
        while True:
            await trio.sleep(SAMPLE_S)
            now = trio.current_time()
            current = self.messages_in()
            self._window_messages = 0
            rate = max(0, current - messages) / SAMPLE_S
            messages = current
            self.peak_message_rate = max(self.peak_message_rate, rate)
            if rate > STORM_MESSAGES_PER_S * self.count:
                self._violate(
                    f"message-storm: {rate:.0f} bus messages/s across {self.count} nodes "
                    f"at t={now:.2f} (limit {STORM_MESSAGES_PER_S}/s per node)"
                )
                raise StormError(self.violations[-1])
            self.check_ttl(now)
            self._sample_flags()
            if self._told_pending:
                self._check_told(now)
            if self._federation is not None:
                self._sample_federation(now)
            for sample in self.samplers:
                sample()
            where: Counter[str] = Counter()
            for n in self.nodes:
                if not n.up:
                    continue
                core = n.server.node
                # Each queue's jobs by identity, as ``job in q.jobs`` tests
                # them (Job has no __eq__), without a search per job.
                members = {name: {id(j) for j in q.jobs} for name, q in core.queues.items()}
                for job in core.jobs.values():
                    inq = id(job) in members.get(job.queue, ())
                    if (job.state == JobState.QUEUED) != inq:
                        self._violate(
                            f"queued-iff-in-queue: {n.name} {job.id} {job.state.name} "
                            f"{'in' if inq else 'not in'} its queue"
                        )
                    if job.state == JobState.QUEUED:
                        where[job.id] += 1
            if not self.healthy():
                since.clear()
                continue
            double = {j for j, c in where.items() if c > 1}
            for j in list(since):
                if j not in double:
                    del since[j]
            for j in sorted(double):
                start = since.setdefault(j, now)
                if now - start > DOUBLE_QUEUED_S:
                    self._violate(
                        f"single-queued: {j} queued on 2+ nodes for more than "
                        f"{DOUBLE_QUEUED_S:.0f}s (since t={start:.2f})"
                    )

    def _check_told(self, now: float) -> None:
        """delivery-told: a job handed to a client in a healthy cluster and
        still in its hands (active there, no client's NACK, ENQUEUE or
        WORKING, not delivered or queued again) has been told to its other
        holders by its node's next cron (WORKING): ``TOLD_S`` after the
        delivery, each of them (that held it then, listed by that node)
        holds its copy active, re-queues it no sooner than RETRY from the
        delivery (less the random time error), and does not count it queued
        there (a fail-over if that node were lost would queue it again
        while its consumer works on it)."""
        pending = self._told_pending
        while pending and pending[0][0] <= now - TOLD_S:
            t, index, incarnation, job_id = pending.popleft()
            node = self.nodes[index]
            if not node.up or node.incarnation != incarnation:
                continue
            if not self.healthy(True) or not self.calm(t, now):
                continue
            core = node.server.node
            job = core.jobs.get(job_id)
            if job is None or job.state != JobState.ACTIVE or job.flags & FLAG_DELAYED:
                continue  # acked, queued again, or within a client's delay
            if sum(1 for x in self.delivered_at.get(job_id, ()) if x >= t - TOLD_S) > 1:
                continue  # delivered twice: each node tells its own
            if any(x > t for x in self.queued_at.get(job_id, ())):
                continue
            if any(x >= t for x in self.commands_at.get(job_id, ())):
                continue
            for n in self.nodes:
                if n is node or not n.up or n.server.node.node_id not in job.nodes_delivered:
                    continue
                copy = n.server.node.jobs.get(job_id)
                if copy is None or n.seen_at.get(job_id, math.inf) > t:
                    continue
                if copy.state not in (JobState.ACTIVE, JobState.QUEUED):
                    continue
                assert n.clock is not None
                self.probes["delivery-told-checked"] += 1
                sent = n.server.node.now_ms() - (now - t) * 1000 * n.clock.rate
                due = sent + job.retry * 1000 - TIME_ERROR_MS // 2 - TOLD_SLACK_MS
                if copy.state == JobState.QUEUED:
                    what = "has it queued"
                elif copy.queued_on == core.node_id:
                    what = f"counts it queued on {node.name}"
                elif 0 < copy.qtime < due:
                    what = f"re-queues it {(copy.qtime - sent) / 1000:.2f}s after the delivery"
                else:
                    continue
                self._violate(
                    f"delivery-told: {node.name} delivered {job_id} (RETRY {job.retry}) at "
                    f"t={t:.2f}; {now - t:.2f}s later {n.name} {what}"
                )

    def watch_federation(self, queue: str | None) -> None:
        """federation-prompt, for the jobs of ``queue`` (None: off; the
        workload's calm coda turns it on). A job queued on a node A (not
        leaving, its queue there not paused out, with no client of its own
        blocked on it and importing nothing: the node gives its jobs away
        when asked, ``clusterjobs._on_needjobs``), the only one there and
        the first of that queue there for ``HAVEJOBS_MIN_INTERVAL_MS``
        (A tells the nodes that asked for jobs of it, HAVEJOBS, at most
        that often), while another node B has had clients blocked on the
        queue with nothing queued since half a second at least (its
        NEEDJOBS reached A), is gone from A, or B served, within
        ``federation_bound()``: HAVEJOBS, NEEDJOBS and YOURJOBS each cross
        the network once. Judged in a calm cluster only."""
        self._federation = queue
        self._fed_waiting.clear()
        self._fed_last.clear()
        self._fed_pending.clear()

    def _check_versions(self, node: SimNode, sender_id: str, msg: object) -> None:
        """version-gated: a message crosses a link only if both its ends
        speak the version that brought it (an older release would drop the
        link on a message it cannot decode), and a heartbeat tells the
        sender's version and incarnation only from the versions that carry
        them (4 and 8)."""
        sender = next((n for n in self.nodes if n.up and n.server.node.node_id == sender_id), None)
        if sender is None:
            return
        mine, theirs = self.protocol_of(node), self.protocol_of(sender)
        since = SINCE_VERSION.get(type(msg), 0)
        if since > min(mine, theirs):
            self._violate(
                f"version-gated: {node.name} (protocol {mine}) got {type(msg).__name__} "
                f"(protocol {since} on) from {sender.name} (protocol {theirs})"
            )
        if isinstance(msg, bus.Heartbeat):
            told = msg.flags >> bus.VERSION_SHIFT & 0xFF
            incarnation = msg.flags >> bus.INCARNATION_SHIFT
            old = self.plan.old_version
            upgraded = old is not None and old[0] == sender.index not in self.bus_versions
            if (
                upgraded
                and old is not None
                and (told, bool(incarnation)) == _heartbeat_tells(old[1])
            ):
                # A frame its older incarnation sent may arrive late (bus
                # chaos holds frames back; seed 711426; from a release
                # before protocol 4, telling no version: seed 720936).
                theirs = old[1]
            if (told, bool(incarnation)) != _heartbeat_tells(theirs):
                self._violate(
                    f"version-gated: {sender.name} (protocol {theirs}) sent a "
                    f"{type(msg).__name__} telling version {told}, incarnation {incarnation}"
                )
            if self.bus_versions:
                self.probes["version-gated-checked"] += 1

    def protocol_of(self, n: SimNode) -> int:
        """The highest bus protocol version node ``n`` speaks now (lower
        while it plays an older release)."""
        return int(n.server.node.cluster.protocol)

    def federation_bound(self) -> float:
        """federation-prompt's bound: three one-way network delays (the
        plan's latency at most, 40 ms, and 0.5 ms) for HAVEJOBS, NEEDJOBS
        and YOURJOBS, doubled, and a margin (the node's flushes, a waiter
        woken, the monitor's sample)."""
        one_way = 0.0005 + self.plan.latency_ms / 1000
        return FEDERATION_MARGIN_S + 6 * one_way

    def _fed_blocked(self, n: SimNode, queue: str) -> bool:
        """Node ``n`` has clients blocked on ``queue`` and nothing queued."""
        if not n.up or n.server.node.leaving:
            return False
        q = n.server.node.queues.get(queue)
        return q is not None and bool(q.waiters) and not q.jobs

    def _fed_giver(self, n: SimNode, queue: str) -> bool:
        """Node ``n`` gives jobs of ``queue`` away when asked, and has none
        of its clients waiting for them."""
        core = n.server.node
        q = core.queues.get(queue)
        return (
            n.up
            and not core.leaving
            and q is not None
            and not q.waiters
            and not q.pause & PAUSED_OUT
            and q.import_rate(core.now_ms()) == 0
        )

    def _federation_queued(self, node: SimNode, job: Job) -> None:
        queue = job.queue
        now = trio.current_time()
        last = self._fed_last.get(node.index, -math.inf)
        self._fed_last[node.index] = now
        if now - last < HAVEJOBS_MIN_INTERVAL_MS / 1000 or not self.healthy(True):
            return
        q = node.server.node.queues.get(queue)
        if q is None or len(q.jobs) > 1 or not self._fed_giver(node, queue):
            return
        # HAVEJOBS is protocol 8: a node playing an older release neither
        # sends nor hears it (it waits for its next NEEDJOBS).
        waiting = [
            i
            for i, since in self._fed_waiting.items()
            if i != node.index
            and since <= now - FEDERATION_WAITING_S
            and min(self.protocol_of(node), self.protocol_of(self.nodes[i]))
            >= bus.HAVEJOBS_VERSION
        ]
        if waiting:
            self._fed_pending.append((now, node.index, node.incarnation, job.id, waiting))

    def _sample_federation(self, now: float) -> None:
        queue = self._federation
        assert queue is not None
        for n in self.nodes:
            if self._fed_blocked(n, queue):
                self._fed_waiting.setdefault(n.index, now)
            else:
                self._fed_waiting.pop(n.index, None)
        bound = self.federation_bound()
        pending = self._fed_pending
        while pending and pending[0][0] <= now - bound:
            t, index, incarnation, job_id, waiting = pending.popleft()
            node = self.nodes[index]
            if node.incarnation != incarnation or not self.healthy(True):
                continue
            if not self.calm(t, now) or not self._fed_giver(node, queue):
                continue
            still = [
                self.nodes[i].name for i in waiting if self._fed_blocked(self.nodes[i], queue)
            ]
            job = node.server.node.jobs.get(job_id)
            self.probes["federation-prompt-checked"] += 1
            if (
                still
                and job is not None
                and job.state == JobState.QUEUED
                # Queued again since (moved, delivered and back at its
                # RETRY: seed 724998) is not the same stay in the queue.
                and not any(x > t for x in self.queued_at.get(job_id, ()))
            ):
                self._violate(
                    f"federation-prompt: {job_id} queued on {node.name} at t={t:.2f}, "
                    f"still there at t={now:.2f} while {still} had clients blocked on "
                    f"{queue} with nothing queued (bound {bound:.2f}s)"
                )

    def check_ttl(self, now: float) -> None:
        """ttl-expires: no node holds a job whose TTL ran out, by its own
        clock, more than ``TTL_SLACK_MS`` ago (queued, active or acked)."""
        if now - self.last_jump_at < 5.0:
            return
        for n in self.nodes:
            if not n.up or now < self.stalled_until.get(n.index, -math.inf) + 1.0:
                continue  # stalled in a slow fsync lately: its timers ran late
            core = n.server.node
            wall = core.now_ms()
            for job in core.jobs.values():
                if job.etime and wall > job.etime * 1000 + TTL_SLACK_MS:
                    self._violate(
                        f"ttl-expires: {n.name} still holds {job.id} ({job.state.name}) "
                        f"{(wall - job.etime * 1000) / 1000:.1f}s after its TTL"
                    )

    def _sample_flags(self) -> None:
        """Failure detector coverage: PFAIL and FAIL set, FAIL everywhere,
        FAIL cleared (sampled)."""
        fail_seen: Counter[str] = Counter()
        up = [n for n in self.nodes if n.up]
        for n in up:
            for peer in n.server.node.cluster.others():
                key = (n.name, peer.node_id)
                flags = peer.flags & (cluster_flags.PFAIL | cluster_flags.FAIL)
                before = self.flags_seen.get(key, 0)
                if flags & cluster_flags.PFAIL and not before & cluster_flags.PFAIL:
                    self.probes["pfail-set"] += 1
                if flags & cluster_flags.FAIL:
                    fail_seen[peer.node_id] += 1
                    if not before & cluster_flags.FAIL:
                        self.probes["fail-set"] += 1
                elif before & cluster_flags.FAIL:
                    self.probes["fail-cleared"] += 1
                self.flags_seen[key] = flags
        for peer_id, count in fail_seen.items():
            others = sum(1 for n in up if n.server.node.node_id != peer_id)
            if count >= 2 and count == others:
                self.probes["fail-everywhere"] += 1

    # -------------------------------------------------------- fault windows

    def fault_begin(self, victim: int = -1, kind: str = "") -> list[float]:
        """A fault's window [start, end, victim] (victim -1: every node).
        ``kind``: the fault's name; a crash-like one (``CRASH_KINDS``: the
        node down, its connections broken, then restarted) is remembered
        (``calm_but_crash``)."""
        window = [trio.current_time(), float("inf"), float(victim)]
        self.fault_windows.append(window)
        if kind in CRASH_KINDS:
            self._crash_windows.append(window)
        return window

    def fault_end(self, window: list[float], extra: float = 0.0) -> None:
        window[1] = min(window[1], trio.current_time() + extra)

    def split_begin(self, victim: int) -> list[float]:
        """A membership change an admin action makes (a node replaced: a
        new ID, FORGET, MEET) is a fault window of its own until every node
        knows every other again (``split_watch``): while the MEET's
        handshake waits, each side is a cluster of one and, as in the
        original, makes no dummy ack (seed 436861043)."""
        window = self.fault_begin(victim)
        self._splits.append(window)
        return window

    def open_split(self, window: list[float]) -> bool:
        """``window`` is a membership change's, still waiting for the mesh."""
        return any(w is window for w in self._splits)

    def split_watch(self, window: list[float]) -> None:
        """Close ``window`` once the cluster is meshed again."""
        assert self._nursery is not None
        self._nursery.start_soon(self._split_until_meshed, window)

    async def _split_until_meshed(self, window: list[float]) -> None:
        # Polling: the cluster table has no change notification.
        while window[1] == float("inf") and not self.meshed():  # noqa: ASYNC110
            await trio.sleep(0.1)
        self.fault_end(window)
        # By identity: two watchers may end the same window.
        self._splits[:] = [w for w in self._splits if w is not window]

    def calm(self, start: float, end: float, margin: float = LINK_SETTLE_S) -> bool:
        """No fault in force in [start - margin, end] (nor ended less than
        ``margin`` before ``start``: links take that long to come back)."""
        return all(w[1] + margin < start or w[0] > end for w in self.fault_windows)

    def calm_but_crash(
        self, victim: int, start: float, end: float, after: float, margin: float = LINK_SETTLE_S
    ) -> bool:
        """``calm(start, end)``, but for crashes of node ``victim`` (crash,
        wipe, torn crash, a controlled restart: down, its clients' and
        peers' connections broken) that began after ``after``."""
        crashes = [w for w in self._crash_windows if int(w[2]) == victim and w[0] > after]
        return all(
            w[1] + margin < start or w[0] > end or any(w is c for c in crashes)
            for w in self.fault_windows
        )

    def flagged_fail(self, victim: int) -> bool:
        """A majority of the other nodes up flag node ``victim`` FAIL."""
        victim_id = self.nodes[victim].server.node.node_id
        others = [n for n in self.nodes if n.index != victim and n.up]
        failed = [
            n
            for n in others
            if (peer := n.server.node.cluster.nodes.get(victim_id)) is not None
            and peer.flags & cluster_flags.FAIL
        ]
        return len(failed) > len(others) // 2

    async def check_detection(self, victim: int, window: list[float], bound: float) -> None:
        """fail-detected: a node cut off from every other (isolated, frozen,
        down) for longer than ``bound`` (derived from cluster-node-timeout)
        is flagged FAIL by a majority of the others by then, when nothing
        else went wrong meanwhile and they are a majority of the cluster."""
        node = self.nodes[victim]
        victim_id = node.server.node.node_id
        # Only nodes that counted it as a member when the cut began can flag
        # it (seed 20000385: replaced just before, its MEET never went
        # through, so nobody knew its new ID).
        knew = {
            n.index
            for n in self.nodes
            if n.up
            and (peer := n.server.node.cluster.nodes.get(victim_id)) is not None
            and not peer.flags & cluster_flags.HANDSHAKE
        }
        await trio.sleep_until(window[0] + bound)
        if window[1] < trio.current_time() or self.phase != "safety":
            return  # the cut ended first
        if node.server.node.node_id != victim_id:
            return  # replaced or wiped meanwhile: the others forgot that ID (seed 885581149)
        # Nodes another fault touched meanwhile (crashed, cut, frozen,
        # clock jumped) are not asked; a fault on every node voids the check.
        disturbed = {
            int(w[2])
            for w in self.fault_windows
            if w is not window
            and w[0] <= window[0] + bound
            and w[1] + LINK_SETTLE_S >= window[0] - LINK_SETTLE_S
        }
        if -1 in disturbed:
            return
        asked = [
            n
            for n in self.nodes
            if n is not node and n.index not in disturbed and n.up and n.index in knew
        ]
        # FAIL takes reports from a majority of the cluster as the nodes'
        # tables count it: a wiped node's old identity, not forgotten yet,
        # counts too (seed 20007813: five nodes, n1 wiped, n4 frozen; the
        # three others' tables held six nodes, so four reports were needed).
        size = max((n.server.node.cluster.size for n in asked), default=0)
        if len(asked) < max(self.count, size) // 2 + 1:
            return
        self.probes["fail-detection-checked"] += 1
        failed = [
            n.name
            for n in asked
            if (peer := n.server.node.cluster.nodes.get(victim_id)) is not None
            and peer.flags & cluster_flags.FAIL
        ]
        if len(failed) < len(asked) // 2 + 1:
            self._violate(
                f"fail-detected: {node.name} cut off since t={window[0]:.2f}, "
                f"{bound:.1f}s later (node timeout {self.plan.node_timeout_ms} ms) "
                f"only {failed or 'no node'} of {[n.name for n in asked]} flag it FAIL"
            )

    def watch_failover(self, victim: int, window: list[float], kind: str, give_up: float) -> None:
        """failover-timely: node ``victim`` is being cut off now (``kind``:
        a crash, a wipe, a torn crash, isolated or frozen). The jobs it has
        queued (RETRY > 0), queued there since ``FAILOVER_HEARD_S`` at
        least (the other holders heard: REPLJOB, QUEUED), held by other
        nodes up now that know it and do not flag it FAIL yet, must be
        queued on a node other than the victim within ``FAILOVER_S`` of the
        first of their holders to flag it FAIL, or of
        ``INCARNATION_KNOWN_S`` after its restart when a crash ended before
        any did (its new incarnation is a loss too); or be acked or gone
        there by then. The jobs and their holders are taken now; the check
        (``_check_failover``) waits at most ``give_up`` seconds for a FAIL
        (past the detection bound, fail-detected's business).

        The deadline runs from the holders that no other fault touched
        from ``LINK_SETTLE_S`` plus ``FAILOVER_HEARD_S`` before the cut
        (``_undisturbed``): one of them suffices, whichever holder the
        others chose (a down or cut-off one: the stand-by covers it). A
        holder that loaded the job from its AOF since is not counted: a
        copy's ``queued_on`` is not recorded, so it cannot know. Void when
        a fault touched every node (or the victim before the cut), when the
        cut ended before any holder flagged FAIL (but a crash: a restart),
        when an isolation or freeze ended before the deadline (the victim
        is back with its queue), for a job a client sent NACK, ENQUEUE or
        WORKING for lately, or one the victim delivered after the cut when
        it was back by the deadline (its consumer's WORKING reached them).
        For an isolated or frozen node, the jobs are those it had queued at
        the cut: the survivors cannot know what it did with them since."""
        node = self.nodes[victim]
        if not node.up or self._nursery is None or self.phase not in ("safety", "failover"):
            return
        core = node.server.node
        victim_id = core.node_id
        now = trio.current_time()
        survivors = [
            n
            for n in self.nodes
            if n is not node
            and n.up
            and (peer := n.server.node.cluster.nodes.get(victim_id)) is not None
            and not peer.flags & (cluster_flags.HANDSHAKE | cluster_flags.FAIL)
        ]
        jobs: dict[str, list[int]] = {}  # job id -> the survivors holding it (active)
        retries: dict[str, float] = {}
        copies: dict[str, int] = {}
        queued_on: dict[str, dict[int, str | None]] = {}
        for job in core.jobs.values():
            if job.state != JobState.QUEUED or not job.retry:
                continue
            if node.queued_since.get(job.id, now) > now - FAILOVER_HEARD_S:
                continue
            if job.delay and self.jumps_ms:
                continue  # its DELAY's end, from its ctime, moved with a clock
            holders: list[int] = []
            retry_at = math.inf
            copies[job.id] = sum(
                1 for n in self.nodes if n is not node and n.up and job.id in n.server.node.jobs
            )
            for n in survivors:
                copy = n.server.node.jobs.get(job.id)
                if copy is None:
                    continue
                if copy.state == JobState.QUEUED:
                    holders = []  # queued on a survivor already
                    break
                if job.id in n.loaded:
                    # Loaded from its AOF by this incarnation: the copy knows
                    # nothing of where the job is queued (Job.queued_on is
                    # not recorded), unless told again since (seed 4046: a
                    # holder restarted just after the REPLJOB stood by for
                    # RETRY when the node that had it queued restarted too).
                    continue
                if copy.state == JobState.ACTIVE and not copy.flags & FLAG_DELAYED:
                    holders.append(n.index)
                    queued_on.setdefault(job.id, {})[n.index] = copy.queued_on
                    assert n.clock is not None
                    left = (copy.qtime - n.server.node.now_ms()) / 1000 / n.clock.rate
                    retry_at = min(retry_at, now + left)
            if holders:
                jobs[job.id] = holders
                retries[job.id] = retry_at
        if jobs:
            watch = FailoverWatch(
                victim,
                victim_id,
                window,
                kind,
                jobs,
                now + give_up,
                node.incarnation,
                self.protocol_of(node) >= bus.HAVEJOBS_VERSION,
            )
            watch.retry_at = retries
            watch.copies = copies
            watch.queued_on = queued_on
            watch.ids = {n.index: n.server.node.node_id for n in survivors}
            self._nursery.start_soon(self._check_failover, watch)

    def _victim_cut_after_restart(self, watch: FailoverWatch) -> bool:
        """Another fault touched the victim (or every node) between its
        restart and ``INCARNATION_KNOWN_S`` after it."""
        assert watch.restarted is not None
        lo, hi = watch.restarted, watch.restarted + INCARNATION_KNOWN_S
        return any(
            w is not watch.window
            and w[2] in (-1.0, float(watch.victim))
            and w[0] < hi
            and w[1] > lo
            for w in self.fault_windows
        )

    async def _check_failover(self, watch: FailoverWatch) -> None:
        jobs = watch.jobs

        def observe(n: SimNode, event: str, job: Job, loading: bool) -> None:
            if job.id not in jobs:
                return
            if (
                event == "queued"
                and n.index == watch.victim
                and n.incarnation != watch.incarnation
                and not loading
            ):
                # The victim, restarted, queued it again itself (its AOF
                # kept the copy): queued on a node that is up, which is what
                # the fail-over is for (seed 720035: n1 came back before any
                # FAIL and re-queued it a second later; the one other holder
                # rightly stood down at its QUEUED).
                watch.taken.setdefault(job.id, trio.current_time())
                return
            if event == "queued" and n.index != watch.victim:
                now = trio.current_time()
                # Queued by a holder that restarted and loaded it queued
                # counts too (seed 710228: the holder chosen had it queued
                # from its AOF, and the others rightly stood by).
                watch.taken.setdefault(job.id, now)
                if loading:
                    return
                if job.id not in watch.doubled:
                    for i in jobs[job.id]:
                        other = self.nodes[i]
                        copy = other.server.node.jobs.get(job.id) if other.up else None
                        if i != n.index and copy is not None and copy.state == JobState.QUEUED:
                            watch.doubled[job.id] = (now, i, n.index)
            elif event == "delivered" and n.index == watch.victim and not loading:
                watch.by_victim.add(job.id)

        self.observers.append(observe)
        try:
            await self._failover_deadlines(watch)
        finally:
            self.observers[:] = [o for o in self.observers if o is not observe]

    async def _failover_deadlines(self, watch: FailoverWatch) -> None:
        """``_check_failover``'s wait: each job is judged at its deadline,
        from its undisturbed holders' FAIL (``_undisturbed``)."""
        node = self.nodes[watch.victim]
        window = watch.window
        fail_at = watch.fail_at
        holders_of = {i for holders in watch.jobs.values() for i in holders}
        # A client's ADDJOB DELAY ends at the job's ctime plus the delay, on
        # the creator's clock: a survivor's may be that far off.
        skew_s = 2 * self.plan.skew_ms / 1000 + 0.1
        pending = dict(watch.jobs)
        while pending:
            await trio.sleep(FAILOVER_POLL_S)
            now = trio.current_time()
            for i in holders_of - fail_at.keys():
                n = self.nodes[i]
                peer = n.server.node.cluster.nodes.get(watch.victim_id) if n.up else None
                if peer is not None and peer.flags & cluster_flags.FAIL:
                    fail_at[i] = now
            if watch.restarted is None and window[1] <= now and not fail_at:
                # Back before any holder flagged it FAIL: a restart is a loss
                # too (a new incarnation), a cut that healed is not; a wiped
                # node's old identity goes on until it is flagged FAIL.
                # A node of a release before protocol 8 tells no incarnation,
                # before or after its restart: a restart is not seen.
                if (
                    watch.kind in ("crash", "torn-crash")
                    and node.incarnation > watch.incarnation
                    and watch.told_incarnation
                    and self.protocol_of(node) >= bus.HAVEJOBS_VERSION
                ):
                    watch.restarted = window[1]
                    self.probes["failover-restart-checked"] += 1
                elif watch.kind != "wipe" or now > watch.give_up:
                    return
            if watch.restarted is not None and self._victim_cut_after_restart(watch):
                # It restarted into another fault (isolated, frozen...): the
                # holders cannot hear its new incarnation (seed 705172).
                return
            for job_id, holders in list(pending.items()):
                undisturbed = self._undisturbed(watch, holders, now)
                if not undisturbed:
                    del pending[job_id]  # every holder disturbed: void
                    continue
                marks = [fail_at[i] for i in undisturbed if i in fail_at]
                ends = [min(marks) + FAILOVER_S] if marks else []
                if watch.restarted is not None:
                    ends.append(watch.restarted + INCARNATION_KNOWN_S + FAILOVER_S)
                if not ends:
                    if now > watch.give_up:
                        del pending[job_id]  # never flagged FAIL: fail-detected's business
                    continue
                due = min(ends)
                copy = self.nodes[holders[0]].server.node.jobs.get(job_id)
                if copy is not None and copy.delay:
                    due += skew_s
                if now < due + FAILOVER_POLL_S:
                    continue
                del pending[job_id]
                undisturbed = self._undisturbed(watch, holders, due)
                if undisturbed:
                    self._judge_failover(watch, job_id, holders, undisturbed, due)

    def _undisturbed(self, watch: FailoverWatch, holders: list[int], until: float) -> list[int]:
        """The holders that no other fault touched from shortly before the
        cut until ``until`` (up, no crash, cut, clock jump, chaos of their
        own), or none when a fault touched every node, or the victim before
        the cut (the news of its queueing may not have reached them)."""
        window, victim = watch.window, watch.victim
        cut = window[0]
        settled = cut - LINK_SETTLE_S - FAILOVER_HEARD_S
        touched: set[int] = set()
        for w in self.fault_windows:
            if w is window or w[0] > until or w[1] < settled:
                continue
            hit = int(w[2])
            if hit == -1 or (hit == victim and w[0] < cut):
                return []
            touched.add(hit)
        return [i for i in holders if i not in touched and self.nodes[i].up]

    def _judge_failover(
        self,
        watch: FailoverWatch,
        job_id: str,
        holders: list[int],
        undisturbed: list[int],
        due: float,
    ) -> None:
        """failover-timely (and failover-once) for one job at its deadline
        ``due``: from the first of its ``undisturbed`` holders to flag the
        victim FAIL (or from its restart), each of them queues it within
        FAILOVER_STANDBY_MS unless the one chosen did (it may be one of
        the others: down, cut off; the stand-by covers it). Faults on other
        nodes change nothing here: the holders choose among themselves."""
        window, victim = watch.window, watch.victim
        cut = window[0]
        if window[1] <= due and watch.kind in ("isolate", "pause"):
            # Back by then with its queue: a stand-by's WILLQUEUE finds the
            # job queued there again (QUEUED), and rightly stands down
            # (seed 4440).
            return
        if job_id in watch.by_victim and window[1] <= due:
            return  # its consumer there was heard of (WORKING) once it was back
        if any(t >= cut - NACK_DELAY_MAX_S for t in self.commands_at.get(job_id, ())):
            return  # a client's NACK, ENQUEUE or WORKING: its own timing
        paused = {i for i, t in self.requeue_paused.get(job_id, ()) if t >= cut}
        if undisturbed and paused.issuperset(undisturbed):
            # Each holder that could queue it found its queue paused in and
            # put the re-queue off by the job's RETRY, as a paused queue
            # does (seed 711294: the wild queue's PAUSE in on the only
            # undisturbed holder, sent by the explorer after the cut).
            return
        told = watch.queued_on.get(job_id, {})
        knew = {i for i in undisturbed if told.get(i) == watch.victim_id}
        knew_ids = {watch.ids[i] for i in knew}
        if (
            knew
            and paused.issuperset(knew)
            and all(told.get(i) in knew_ids for i in undisturbed if i not in knew)
        ):
            # The same when only the holders whose copy counted the job
            # queued on the victim at the cut (Job.queued_on: those take it
            # over) found their queue paused in, and each other undisturbed
            # holder counted it queued on one of those: a QUEUED that one
            # wrote before it gave the job to the victim, come late. A QUEUED
            # carries no order; the holder cannot know (seed 793466: n3 took
            # over the RETRY 300 job from n4, which still had it queued,
            # after n4's isolation, and both gave it to n1 by YOURJOBS; n3's
            # QUEUED reached n4 0.3 s after n1's, once n3's link to n4 came
            # back, and n4 counted the job on n3. When n1 crashed, n3 stood
            # by for n4, which did not act, and met the wild queue paused in).
            return
        able = len(undisturbed) == len(holders) == watch.copies[job_id]
        if watch.restarted is None and len(holders) > 1 and able:
            # failover-once: not queued by two of its holders at once (before
            # either's RETRY timer was due), while they agreed on who is
            # reachable (FAIL spreads in a network delay) and each of them
            # knew the victim had it queued (none loaded it from its AOF
            # since: seed 4122, the one chosen had, and the others all
            # queued it at the end of their stand-by): the one chosen queues
            # it, the others stand by for its QUEUED.
            self.probes["failover-once-checked"] += 1
            double = watch.doubled.get(job_id)
            early = watch.retry_at[job_id] - FAILOVER_RETRY_SLACK_S
            if double is not None and double[0] <= min(due, early):
                at, first, second = double
                self._violate(
                    f"failover-once: n{victim} cut off ({watch.kind}) at t={cut:.2f}; "
                    f"{job_id} it had queued was queued on n{first} and n{second} at once "
                    f"at t={at:.2f}"
                )
        self.probes["failover-timely-checked"] += 1
        if watch.taken.get(job_id, math.inf) <= due:
            return
        for i in undisturbed:
            copy = self.nodes[i].server.node.jobs.get(job_id)
            if copy is None or copy.state != JobState.ACTIVE:
                return  # acked, gone (collected, expired, flushed), or queued there
        names = [self.nodes[i].name for i in holders]
        marks = {self.nodes[i].name: round(t, 2) for i, t in sorted(watch.fail_at.items())}
        since = f"FAIL at {marks}" if marks else f"restarted at t={watch.restarted:.2f}"
        later = watch.taken.get(job_id)
        when = f"at t={later:.2f}" if later is not None else "not yet"
        self._violate(
            f"failover-timely: n{victim} cut off ({watch.kind}) at t={cut:.2f}, {since}; "
            f"{job_id} it had queued, held by {names} (undisturbed "
            f"{[self.nodes[i].name for i in undisturbed]}), not queued on another node by "
            f"t={due:.2f} ({when})"
        )

    async def _progress(self) -> None:
        """A progress line on stderr every 5 virtual seconds (if asked for;
        the task runs either way, so that scheduling does not depend on it)."""
        while True:
            await trio.sleep(5.0)
            if self.show_progress:
                up = sum(n.up for n in self.nodes)
                print(
                    f"progress: t={trio.current_time():.0f}s {len(self.trace.lines)} events, "
                    f"{up}/{self.count} nodes up, {len(self.violations)} violations",
                    file=sys.stderr,
                    flush=True,
                )

    def stuck_report(self) -> str:
        """What a stuck run is waiting on: nodes down, faults in force."""
        down = [n.name for n in self.nodes if not n.up]
        return f"down: {down or '-'}, net rules: {sorted(self.net.rules) or '-'}"

    # -------------------------------------------------------------- helpers

    async def client(self, index: int) -> RespClient:
        """A client (not subject to partitions) connected to node ``index``."""
        stream = await self.net.connect(None, "127.0.0.1", self.nodes[index].port)
        return RespClient(stream)

    async def mesh(self, timeout: float = MESH_TIMEOUT_S) -> bool:
        """MEET everyone from node 0 (first time), wait for a full mesh."""
        if not any(n.server.node.cluster.others() for n in self.nodes if n.up):
            first = await self.client(0)
            for other in self.nodes[1:]:
                await first.call("CLUSTER", "MEET", "127.0.0.1", other.port)
            await first.aclose()
        else:
            # A node that knows no current node: introduce it again, as an
            # operator would. A wiped node whose MEET at restart went to a
            # frozen or cut-off peer, once that handshake timed out (seed
            # 621213159); or the peer of a wiped node in a cluster of two,
            # down when that MEET came and knowing only the old identity
            # (seed 20008535: it dropped the newcomer's pings for ever).
            current = {n.server.node.node_id for n in self.nodes if n.up}
            for n in self.nodes:
                if n.up and not set(n.server.node.cluster.nodes) & (
                    current - {n.server.node.node_id}
                ):
                    await self.introduce(n.index)
        with trio.move_on_after(timeout):
            # Polling: the cluster table has no change notification.
            while not self.meshed():  # noqa: ASYNC110
                await trio.sleep(0.05)
            return True
        return False

    def meshed(self) -> bool:
        """Every node up and seeing every other current node reachable."""
        if not all(n.up for n in self.nodes):
            return False
        want = {n.server.node.node_id for n in self.nodes}
        for n in self.nodes:
            reachable = {p.node_id for p in n.server.node.cluster.reachable()}
            if not want - {n.server.node.node_id} <= reachable:
                return False
        return True

    def converged(self) -> list[str]:
        """Membership problems left (empty when converged): unknown or
        flagged current nodes, wiped identities not forgotten."""
        problems = []
        current = {n.server.node.node_id for n in self.nodes}
        old = {old for n in self.nodes for old in n.old_ids}
        for n in self.nodes:
            table = n.server.node.cluster
            for other in self.nodes:
                if other is n:
                    continue
                peer = table.nodes.get(other.server.node.node_id)
                if peer is None:
                    problems.append(f"{n.name} does not know {other.name}")
                elif peer.flag_names() not in ("noflags", ""):
                    problems.append(f"{n.name} sees {other.name} as {peer.flag_names()}")
            stale = (set(table.nodes) - current) & old
            if stale:
                problems.append(f"{n.name} still lists wiped ids {sorted(stale)}")
        return problems

    def up_indexes(self) -> list[int]:
        return [n.index for n in self.nodes if n.up]

    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]
