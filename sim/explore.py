"""The explorer: the rest of the command set and the admin paths, with
reads checked against a model (issue #16).

It runs beside the producers and consumers of sim/workload.py, on queues of
its own, so that the loss checker of sim/checkers.py never sees its jobs:

* ``xm<i>`` (the model queues): jobs added on node i with REPLICATE 1 and a
  RETRY longer than any run, so node i is their only holder and nothing but
  the explorer moves them. The explorer keeps a model of each (queued or
  active, NACKs, additional deliveries, PAUSE state) and, while the model
  is known (no crash, restart, flush, reset or clock jump of node i since it
  was last read back), checks what ADDJOB, GETJOB, NACK, ENQUEUE, DEQUEUE,
  DELJOB, WORKING, QLEN, QPEEK, QSTAT, SHOW and JSCAN answer against it.
* ``xw`` (the wild queue): jobs with every ADDJOB option, taken with every
  GETJOB option and acked on the delivering node, on another holder and on a
  node that never had the job; PAUSE with ``bcast``. Reads of it (and of the
  workload's queue) are only checked for absurd answers.
* ``xa`` (the ASYNC witnesses): ASYNC jobs nobody consumes, added in a
  healthy cluster: they must reach their REPLICATE count of holders.

The admin task runs, at plan-chosen times, CONFIG SET, BGREWRITEAOF, DEBUG
FLUSHALL, SHUTDOWN REWRITE-AOF with a controlled restart, CLUSTER LEAVING
(the node leaves while clients run, then returns) and a node replacement
(CLUSTER RESET HARD, FORGET of the old identity everywhere, MEET). Jobs a
flush or a reset removes are recorded as forgotten by that node (the loss
checker's ``amnesia``), exactly those and no others, when the node runs the
command: sent to a frozen node, it may run long after the explorer gave up
on its reply. A replace whose reset ran so is finished by the liveness
phase (MEET, FORGET of the old identity), as an operator would.

Its checks (violations name them):

* ``model-read``: an answer that differs from the model of a model queue
  (QLEN, QPEEK, QSTAT, SHOW's state and counters, JSCAN completeness, QSCAN
  listing it, GETJOB's count and counters, what the job commands return).
* ``pause-out``: a queue paused out (or all) delivers nothing.
* ``leaving``: a leaving node answers a GETJOB that would block with
  ``-LEAVING``, and still delivers the jobs it holds to GETJOB NOHANG.
* ``async-replicated``: an ASYNC job added in a healthy cluster has its
  REPLICATE count of holders 3 s later, the cluster still healthy.
* ``shutdown-no-amnesia``: a node restarted after SHUTDOWN REWRITE-AOF has
  every job it held (whatever the fsync policy).
* ``leaving-added-delivered``: a job added on a node while it is leaving
  (RETRY 0, RETRY 0 with a DELAY, ASYNC with a RETRY, on ``xn``: it keeps
  no copy, and its one holder queues it) is delivered by GETJOB on the
  other nodes within ``LEAVING_ADDED_S`` plus its DELAY, when calm; a
  RETRY 0 one exactly once.
* ``acked-survives-restart`` (white-box, over every job, the workload's
  too): a node that answered an ACKJOB or FASTACK for a job never queues it
  again in a later incarnation, unless a crash (not a controlled restart)
  lost the record under ``appendfsync`` everysec or no.
* ``absurd``: any other read (any queue, any node, faults or not) with an
  impossible answer: a negative or non-integer length, more than asked, an
  unknown job state, a job listed as queued where its ack was answered.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import trio

from disque_trio.core.cluster import LEAVING
from disque_trio.core.job import Job, JobState
from disque_trio.core.queue import PAUSED_IN, PAUSED_OUT, Pause
from disque_trio.protocol.replies import ReplyError, Status
from disque_trio.testing import RespClient

from .plan import Plan
from .probes import COMMAND_PROBES as COMMAND_PROBES
from .world import LINK_SETTLE_S, SimNode, World

# Admin actions, by bit of Plan.admin_mask.
ADMIN_ACTIONS = ("config", "bgrewriteaof", "flushall", "shutdown", "leaving", "replace")
MODEL_RETRY = 900  # longer than any run: a model job is never queued again by its node
DEFAULT_TTL_S = 24 * 3600  # ADDJOB's TTL when not given (SPEC: one day)
WILD = "xw"
ASYNC_Q = "xa"
LEAVING_Q = "xl"  # a job for every node, added as one of them starts leaving
EMPTY_Q = "xe"  # never gets a job: GETJOB on it blocks (or is refused while leaving)
# Jobs added on a leaving node itself (it keeps no copy: its one holder
# queues them, ENQUEUE), taken by GETJOB on the other nodes.
LEAVING_ADD_Q = "xn"
# leaving-added-delivered: delivered within this of the ADDJOB's answer
# (plus its DELAY), when calm: the ENQUEUE crosses the network once, and the
# explorer asks each other node in turn, a GETJOB TIMEOUT 200 ms at a time.
LEAVING_ADDED_S = 3.0
ASYNC_SETTLE_S = 3.0
# PAUSE BCAST: a message per reachable peer, applied on arrival; calm, it
# is everywhere well within this.
PAUSE_BCAST_S = 1.0
# CLUSTER LEAVING travels in heartbeats' flags: calm, every node knows
# within half the node timeout (each peer pinged at least that often) plus
# this (a ping period, delivery, margin).
LEAVING_KNOWN_S = 2.0
LEAVING_WAIT_S = 12.0  # how much longer a node stays leaving for the check to come
CALL_TIMEOUT_S = 5.0
SHUTDOWN_WAIT_S = 5.0  # a SHUTDOWN without reply: how long to wait for the stop in line
STATES = {"wait-repl", "active", "queued", "acked"}
FSYNC_VALUES = ("always", "everysec", "no")
# odd-answered: commands a careless client sends, each answered with an
# error (the connection kept).
MALFORMED: tuple[tuple[Any, ...], ...] = (
    ("ADDJOB", "xo", "b", 0, "FOO", 1),
    ("ADDJOB", "xo", "b", 0, "RETRY"),
    ("ADDJOB", "xo", "b", 0, "TTL", -5),
    ("ADDJOB", "xo", "b", 0, "REPLICATE", 2, "RETRY", 0),
    ("ADDJOB", "xo", "b", 0, "DELAY", 100, "TTL", 50),
    ("ADDJOB", "xo", "b", "abc"),
    ("ADDJOB", "xo", "b", 0, "DELAY", -1),
    ("GETJOB", "NOHANG"),
    ("GETJOB", "NOHANG", "FROM"),
    ("GETJOB", "NOHANG", "COUNT", 0, "FROM", "xo"),
    ("GETJOB", "NOHANG", "BOGUS", "FROM", "xo"),
    ("GETJOB", "NOHANG", "TIMEOUT", -1, "FROM", "xo"),
    ("ACKJOB", "notanid"),
    ("SHOW", "badid"),
    ("JSCAN", 0, "REPLY", "bogus"),
    ("JSCAN", 0, "STATE", "bogus"),
    ("JSCAN", 0, "COUNT", 0),
    ("QSCAN", 0, "COUNT", 0),
    ("QSCAN", "notanumber"),
    ("PAUSE", "xo", "bogus"),
    ("WAITJOB",),
    ("CLUSTER", "BOGUS"),
    ("CLUSTER", "MEET", "127.0.0.1", "notaport"),
    ("CLUSTER", "RESET", "BOGUS"),
    ("CLUSTER", "LEAVING", "maybe"),
    ("NOSUCHCOMMAND",),
    ("CONFIG", "SET", "maxmemory", "notanumber"),
    ("CONFIG", "SET", "nosuchparam", 1),
    ("CONFIG", "GET"),
    ("QLEN",),
    ("NACK", "D-1234", "DELAY", -1),
    ("WORKING",),
)
CONN_ERRORS = (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class Unknown(Exception):
    """A call whose outcome the explorer cannot know (a fault got in)."""


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def rows(reply: Any) -> list[Any]:
    """An array reply's items; none for a nil (null array) or an error."""
    return reply if isinstance(reply, list) else []


def fields(reply: Any) -> dict[str, Any]:
    """A flat [field, value, ...] reply (SHOW, QSTAT) as a dict."""
    if not isinstance(reply, list):
        return {}
    return {text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


@attrs.define
class MJob:
    seq: int
    # The job's ctime (ms * 1e6 + counter on node i's clock): a queue is
    # ordered by it (SPEC section 1, Disque's skiplist), not by add order: a
    # job made before a backward clock jump, or before a restart after one,
    # sorts after later ones (seed 3176); a job active when the model was read
    # back goes to its ctime's place when NACKed (seed 5057).
    ctime: int
    state: str = "queued"  # "queued" | "active"
    nacks: int = 0
    adds: int = 0  # additional deliveries
    # What ADDJOB was told, for SHOW (None for a job read back: unknown):
    # its body, and its expire time (unix seconds on node i's clock: the
    # TTL given, or the default day, from when ADDJOB ran, which lies between
    # the call and its reply, held back by a fault at times: seeds 697, 818).
    body: str | None = None
    etime: tuple[int, int] | None = None


@attrs.define
class Model:
    """What the explorer knows of xm<i> on node i."""

    known: bool = False
    epoch: tuple[int, ...] = ()
    jobs: dict[str, MJob] = attrs.field(factory=dict)
    pause: str = "none"
    seq: int = 0

    def queued(self) -> list[str]:
        return sorted(
            (j for j, m in self.jobs.items() if m.state == "queued"),
            key=lambda j: (self.jobs[j].ctime, self.jobs[j].seq),
        )


class Explorer:
    def __init__(
        self,
        world: World,
        plan: Plan,
        record: Callable[[str, str, dict[str, Any]], None],
        stop: trio.Event,
    ) -> None:
        """``record(client, op, data)`` adds to the workload's history;
        ``stop`` is set when the producers stop (the safety phase ends)."""
        self.world = world
        self.plan = plan
        self._record = record
        self.stop = stop
        self.rng = world.child_rng()
        self.admin_rng = world.child_rng()
        # The options added for issue 58 (TTL, several IDs or queues, JSCAN
        # STATE, QSCAN MINLEN/MAXLEN) from a generator of their own.
        self.opt_rng = random.Random(f"explore-options-{plan.seed}")
        self.models = [Model() for _ in range(world.count)]
        self.disturbed = Counter[int]()  # node index -> flushes, resets, leaving toggles
        self.pausing = Counter[int]()  # node index -> PAUSE xm<i> calls on their way
        self.pauses_sent = Counter[int]()  # ... and answered (or given up)
        self.leaving: set[int] = set()  # nodes told LEAVING yes (and not yet no)
        self.ever_left: set[int] = set()
        self.replaced: set[int] = set()
        # node index -> (old id, incarnation) of a CLUSTER RESET HARD sent
        # and not yet run: sent to a frozen node, it may run after the
        # explorer gave up on it (seed 84), even in the liveness phase.
        self.resetting: dict[int, tuple[str, int]] = {}
        self.controlled: set[tuple[str, int]] = set()  # (node, incarnation) of controlled restarts
        # (node, incarnation) -> aof-enqueue-jobs-once was set before its SHUTDOWN
        # (node, incarnation) -> (aof-enqueue-jobs-once was set, when its
        # SHUTDOWN REWRITE-AOF was sent)
        self.enqueue_once: dict[tuple[str, int], tuple[bool, float]] = {}
        # (node, incarnation) -> the jobs its AOF's load queued
        self.queued_at_load: dict[tuple[str, int], set[str]] = {}
        # node name -> job id -> incarnation that answered its ACKJOB/FASTACK.
        self.answered: dict[str, dict[str, int]] = {}
        self.bg_pending: set[int] = set()
        self.aof_seen: dict[int, tuple[int, int]] = {}
        self.n = 0
        self.pauses = 0  # PAUSE calls on the wild queue so far (pause-bcast)
        # (sender, time) of PAUSE BCASTs of the wild queue leaving it served
        # (in, none) whose messages may not have arrived everywhere yet.
        self.unpause_bcasts: list[tuple[int, float]] = []
        world.observers.append(self.observe)
        world.flush_observers.append(self.flushed)

    # ---------------------------------------------------------- plumbing

    def probe(self, name: str) -> None:
        self.world.probes[name] += 1

    def violate(self, text_: str) -> None:
        self.world._violate(text_)

    def record(self, op: str, data: dict[str, Any]) -> None:
        self._record("x", f"x-{op}", data)

    async def call(self, index: int, *args: Any) -> Any:
        """One command on a fresh connection to node ``index``; Unknown when
        a fault (a crash, a reset, a frozen node) got in the way."""
        (reply,) = await self._session(index, args)
        if isinstance(reply, ReplyError) and reply.code == "MISCONF":
            # Its disk fails: the command changed nothing, or (held before
            # the refusals began) its model is not to be trusted. The World
            # judges the refusal itself.
            self.world.check_disk_answer(index, None, text(reply))
            self.disturbed[index] += 1
        return reply

    @contextlib.asynccontextmanager
    async def _connected(self, i: int) -> AsyncIterator[RespClient]:
        """A fresh connection to node ``i``, closed after; Unknown when the
        node is down or a fault broke the connection. The caller bounds the
        time."""
        if not self.world.nodes[i].up:
            raise Unknown("down")
        try:
            client = await self.world.client(i)
            try:
                yield client
            finally:
                await client.aclose()
        except CONN_ERRORS as e:
            raise Unknown(type(e).__name__) from e

    def epoch(self, i: int) -> tuple[int, ...]:
        node = self.world.nodes[i]
        return (node.incarnation, self.world.jumps_ms, self.disturbed[i], int(node.up))

    def model(self, i: int) -> Model | None:
        """The model of xm<i> if it can be trusted now."""
        m = self.models[i]
        if m.known and m.epoch == self.epoch(i) and i not in self.leaving:
            return m
        m.known = False
        return None

    # ------------------------------------------------------- white-box

    def observe(self, node: SimNode, event: str, job: Job, loading: bool) -> None:
        """acked-survives-restart (see the module docstring); and a node
        that replicated a job externally (leaving, short of memory) is no
        holder of it: it kept its copy only until the others had theirs."""
        if event == "queued" and loading:
            self.queued_at_load.setdefault((node.name, node.incarnation), set()).add(job.id)
        if event == "deleted" and node.server.node.node_id not in job.nodes_delivered:
            self.world.holders.get(job.id, set()).discard(node.name)
        answered = self.answered.get(node.name)
        if not answered or job.id not in answered:
            return
        if event == "registered" and not loading:
            del answered[job.id]  # a new copy from another holder: news to this node
        elif event == "queued" and answered[job.id] < node.incarnation:
            since = answered[job.id]
            crashed = any(
                (node.name, inc) not in self.controlled
                for inc in range(since + 1, node.incarnation + 1)
            )
            if crashed and self.world.appendfsync != "always":
                return
            self.violate(
                f"acked-survives-restart: {node.name} answered an ack of {job.id} in "
                f"incarnation {since}, queued it again in incarnation {node.incarnation}"
            )

    def on_record(self, op: str, data: dict[str, Any]) -> None:
        """The workload's answered acks join the explorer's."""
        if op == "ack" and data.get("reply") not in (None, "0") and data["reply"].isdigit():
            self.answered_ack(data["node"], data["id"])

    def answered_ack(self, index: int, job_id: str) -> None:
        node = self.world.nodes[index]
        self.answered.setdefault(node.name, {})[job_id] = node.incarnation

    # ------------------------------------------------------------ tasks

    async def run(self, start: float) -> None:
        """Safety phase: commands until the producers stop, admin meanwhile."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._aof_watch)
            # An admin action under way when the producers stop completes
            # (a reset node still meets the others, a stopped one restarts).
            async with trio.open_nursery() as work:
                if self.plan.admin_mask:
                    work.start_soon(self._admin, start)
                if self.world.count > 1:
                    work.start_soon(self._pause_fresh)
                if self.plan.explore:
                    work.start_soon(self._commands)
                    work.start_soon(self._odd_commands)
            nursery.cancel_scope.cancel()

    async def liveness(self) -> None:
        """Every node that left comes back (a lost LEAVING no, a restart);
        then, the cluster healed, every model queue is read back and an
        ASYNC witness job is added and counted."""
        for i in sorted(self.ever_left):
            with trio.move_on_after(5):
                try:
                    await self.call(i, "CLUSTER", "LEAVING", "no")
                except Unknown:
                    pass
            self.leaving.discard(i)
            self.disturbed[i] += 1
        for i in sorted(self.replaced):
            await self.world.introduce(i)  # in case its MEET was lost to a fault
        if not self.plan.explore:
            return
        try:
            for i in self.world.up_indexes():
                for what in range(5):
                    await self._m_reads(i, what)
            with trio.move_on_after(10):
                while not (self.world.healthy(True) and self.world.meshed()):  # noqa: ASYNC110
                    await trio.sleep(0.25)
            await self._a_add(self.rng.choice(self.world.up_indexes()))
        except Unknown as e:
            self.record("error", {"error": str(e)})

    async def _aof_watch(self) -> None:
        """admin-auto-rewrite: a node's AOF base size changed without a
        BGREWRITEAOF from the explorer."""
        while True:
            await trio.sleep(0.05)
            for n in self.world.nodes:
                if not n.up:
                    continue
                aof = n.server.aof
                seen = (n.incarnation, aof.base_size)
                before = self.aof_seen.get(n.index)
                self.aof_seen[n.index] = seen
                if before is None or before[0] != seen[0] or before == seen:
                    continue
                if n.index in self.bg_pending:
                    self.bg_pending.discard(n.index)
                else:
                    self.probe("admin-auto-rewrite")

    async def _commands(self) -> None:
        world = self.world
        stop = self.stop
        ops = (
            (self._m_add, 6),
            (self._m_get, 5),
            (self._m_dispose, 6),
            (self._m_reads, 4),
            (self._m_pause, 1),
            (self._w_add, 3),
            (self._w_get, 3),
            (self._w_peek_ack, 2),
            (self._w_pause, 1),
            (self._a_add, 2),
            (self._reads_anywhere, 2),
        )
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        think = 0.4 / self.plan.explore
        while not stop.is_set():
            await trio.sleep(self.rng.uniform(0.01, think))
            up = world.up_indexes()
            if not up:
                continue
            i = self.rng.choice(up)
            fn = self.rng.choices(fns, weights)[0]
            try:
                await fn(i)
            except Unknown as e:
                self.models[i].known = False
                self.record("error", {"node": i, "error": str(e)})

    # ------------------------------------------------------- model queue

    async def _sync(self, i: int) -> Model | None:
        """Read xm<i> back from node i (JSCAN REPLY all, QSTAT) when the
        model is not known; None if it cannot be now."""
        m = self.model(i)
        if m is not None:
            return m
        if i in self.leaving or not self.world.nodes[i].up:
            return None
        m = self.models[i]
        epoch = self.epoch(i)
        reply = await self.call(i, "JSCAN", 0, "BUSYLOOP", "QUEUE", f"xm{i}", "REPLY", "all")
        stat = await self.call(i, "QSTAT", f"xm{i}")
        if self.epoch(i) != epoch:
            return None
        jobs: dict[str, MJob] = {}
        for show in reply[1]:
            f = fields(show)
            state = text(f.get("state"))
            if state not in ("queued", "active"):
                # An acked copy this node collects when it likes: a torn
                # crash under everysec kept an ACKJOB's ack record and lost
                # the deletion after it, and JSCAN lists the copy until its
                # collection (seed 124155). Not the model's to predict:
                # read the queue back once it is gone.
                return None
            jid = text(f["id"])
            m.seq += 1
            jobs[jid] = MJob(
                m.seq, int(f["ctime"]), state, int(f["nacks"]), int(f["additional-deliveries"])
            )
        m.jobs = dict(sorted(jobs.items(), key=lambda kv: text(kv[0])))
        # Queue order is ctime order; ids do not sort that way: take QPEEK's.
        peek = await self.call(i, "QPEEK", f"xm{i}", 10_000)
        for n, (_q, jid, _body) in enumerate(peek):
            if text(jid) in m.jobs:
                m.jobs[text(jid)].seq = -len(peek) + n
        m.pause = text(fields(stat).get("pause", b"none")) if stat else "none"
        m.epoch, m.known = epoch, self.epoch(i) == epoch
        return m if m.known else None

    def _expect(self, i: int, m: Model, what: str, got: Any, want: Any) -> None:
        self.probe("model-read-checked")
        if got != want and m.epoch == self.epoch(i):
            self.violate(f"model-read: n{i} {what} answered {got!r}, the model says {want!r}")

    async def _m_add(self, i: int) -> None:
        m = await self._sync(i)
        if m is None:
            return
        self.n += 1
        body = f"xm{i}-{self.n}"
        args: list[Any] = ["ADDJOB", f"xm{i}", body, 0, "REPLICATE", 1, "RETRY", MODEL_RETRY]
        queued = len(m.queued())
        refuse = queued > 0 and self.rng.random() < 0.15 and m.pause in ("none", "out")
        if refuse:
            args += ["MAXLEN", queued]
        elif self.rng.random() < 0.3:
            args += ["MAXLEN", queued + self.rng.randint(1, 5)]
        ttl = self.opt_rng.choice((0, 0, 1000, 5000, 100_000))
        if ttl:
            args += ["TTL", ttl]
        sent_s = self._clock_s(i)
        lag_sent = self.world.nodes[i].server.node.clock_lag_ms()
        reply = await self.call(i, *args)
        self.record("add", {"node": i, "body": body, "reply": text(reply)})
        if m.epoch != self.epoch(i):
            m.known = False
            return
        if m.pause in ("in", "all"):
            self._expect(i, m, "ADDJOB on a queue paused in", text(reply)[:6], "PAUSED")
            return
        if refuse:
            self._expect(i, m, f"ADDJOB MAXLEN {queued}", text(reply)[:6], "MAXLEN")
            if text(reply).startswith("MAXLEN"):
                self.probe("cmd-addjob-maxlen-refused")
            return
        if isinstance(reply, Status) and text(reply).startswith("D-"):
            # The ctime node i gave it (white-box: ADDJOB answers only the
            # ID, and a SHOW would change every run's timing). Read at the
            # reply, the epoch unchanged: only the explorer touches the job.
            job = self.world.nodes[i].server.node.jobs.get(text(reply))
            if job is None:
                self.violate(f"model-read: n{i} ADDJOB answered {text(reply)!r}, not held")
                return
            m.seq += 1
            # Node i's clock at the call and at the answer (not the ctime's:
            # a ctime never goes back, it may be ahead of the clock after a
            # jump back).
            ttl_s = ttl or DEFAULT_TTL_S
            etime: tuple[int, int] | None = (sent_s + ttl_s, self._clock_s(i) + ttl_s)
            if lag_sent or self.world.nodes[i].server.node.clock_lag_ms():
                # Its clock stepped back and the node has not followed yet:
                # the expire time was taken in the old frame, and moves back
                # (whole seconds, the rest carried) when it follows (seed
                # 720536: the TTL left read 2 s under the model).
                etime = None
            m.jobs[text(reply)] = MJob(m.seq, job.ctime, body=body, etime=etime)
        else:
            self.violate(f"model-read: n{i} ADDJOB REPLICATE 1 answered {text(reply)!r}")

    async def _m_get(self, i: int) -> None:
        m = await self._sync(i)
        if m is None:
            return
        count = self.rng.randint(1, 3)
        counters = self.rng.random() < 0.5
        args: list[Any] = ["GETJOB", "NOHANG", "COUNT", count]
        if counters:
            args.append("WITHCOUNTERS")
        # Sometimes with the queue that never has a job before or after it.
        queues = [f"xm{i}"]
        if self.opt_rng.random() < 0.3:
            queues.insert(self.opt_rng.randrange(2), EMPTY_Q)
            self.probe("cmd-getjob-queues")
        reply = await self.call(i, *args, "FROM", *queues)
        self.probe("cmd-getjob-nohang")
        if count > 1:
            self.probe("cmd-getjob-count")
        if counters:
            self.probe("cmd-getjob-withcounters")
        got = rows(reply)
        ids = [text(r[1]) for r in got]
        self.record("get", {"node": i, "ids": ids})
        if m.epoch != self.epoch(i):
            m.known = False
            return
        queued = m.queued()
        want = 0 if m.pause in ("out", "all") else min(count, len(queued))
        if m.pause in ("out", "all") and ids:
            self.violate(f"pause-out: n{i} delivered {ids} from xm{i} paused {m.pause}")
        self._expect(i, m, f"GETJOB NOHANG COUNT {count} (jobs)", len(ids), want)
        for r in got:
            jid = text(r[1])
            mj = m.jobs.get(jid)
            if mj is None or mj.state != "queued":
                self.violate(f"model-read: n{i} GETJOB gave {jid}, not queued in the model")
                continue
            if counters:
                self._expect(i, m, f"GETJOB counters of {jid}", [r[4], r[6]], [mj.nacks, mj.adds])
            mj.state = "active"

    async def _m_dispose(self, i: int) -> None:
        m = await self._sync(i)
        if m is None or not m.jobs:
            return
        jid = self.rng.choice(sorted(m.jobs))
        cmd = self.rng.choice(
            ("ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB", "WORKING")
        )
        ids = [jid]
        if cmd != "WORKING" and len(m.jobs) > 1 and self.opt_rng.random() < 0.3:
            # Several IDs: the reply counts those the command applied to.
            ids.append(self.opt_rng.choice(sorted(set(m.jobs) - {jid})))
            self.probe("cmd-several-ids")
        reply = await self.call(i, cmd, *ids)
        self.record(cmd.lower(), {"node": i, "id": jid, "ids": ids, "reply": text(reply)})
        self.probe(
            {
                "ACKJOB": "cmd-ackjob-delivering-node",
                "FASTACK": "cmd-fastack-delivering-node",
            }.get(cmd, f"cmd-{cmd.lower()}")
        )
        if cmd in ("ACKJOB", "FASTACK") and reply == len(ids):
            for one in ids:
                self.answered_ack(i, one)
        if m.epoch != self.epoch(i):
            m.known = False
            return
        mjs = [m.jobs[one] for one in ids]
        states = " ".join(mj.state for mj in mjs)
        what = f"{cmd} {' '.join(ids)} ({states})"
        active = [mj.state == "active" for mj in mjs]
        if cmd in ("ACKJOB", "FASTACK", "DELJOB"):
            self._expect(i, m, what, reply, len(ids))
            for one in ids:
                del m.jobs[one]
        elif cmd in ("NACK", "ENQUEUE"):
            self._expect(i, m, what, reply, sum(active))
            for mj, was_active in zip(mjs, active, strict=True):
                if was_active:
                    mj.state = "queued"
                    if cmd == "NACK":
                        mj.nacks += 1
                    else:
                        mj.adds += 1
        elif cmd == "DEQUEUE":
            self._expect(i, m, what, reply, len(ids) - sum(active))
            for mj in mjs:
                mj.state = "active"
        else:
            # WORKING takes a queued job out of its queue, as in Disque.
            self._expect(i, m, what, reply, MODEL_RETRY)
            mjs[0].state = "active"

    async def _m_reads(self, i: int, what: int | None = None) -> None:
        m = await self._sync(i)
        if m is None:
            return
        q = f"xm{i}"
        queued = m.queued()
        what = self.rng.randrange(5) if what is None else what
        if what == 0:
            reply = await self.call(i, "QLEN", q)
            self.probe("cmd-qlen")
            self._expect(i, m, f"QLEN {q}", reply, len(queued))
        elif what == 1:
            count = self.rng.choice((1, 2, 5, -1, -3, 100))
            reply = await self.call(i, "QPEEK", q, count)
            self.probe("cmd-qpeek")
            want = queued[: abs(count)] if count > 0 else list(reversed(queued))[: abs(count)]
            got = [text(r[1]) for r in reply] if isinstance(reply, list) else reply
            self._expect(i, m, f"QPEEK {q} {count}", got, want)
        elif what == 2:
            reply = await self.call(i, "QSTAT", q)
            self.probe("cmd-qstat")
            f = fields(reply)
            if f:  # nil: the queue does not exist here (now empty and idle)
                self._expect(i, m, f"QSTAT {q} len", f.get("len"), len(queued))
                self._expect(i, m, f"QSTAT {q} pause", text(f.get("pause")), m.pause)
            if self.opt_rng.random() < 0.5:
                await self._m_qscan_len(i, m, len(queued))
        elif what == 3 and m.jobs:
            jid = self.rng.choice(sorted(m.jobs))
            mj = m.jobs[jid]
            sent_s = self._clock_s(i)
            reply = await self.call(i, "SHOW", jid)
            self.probe("cmd-show")
            f = fields(reply)
            got = [
                text(f.get("state")),
                f.get("nacks"),
                f.get("additional-deliveries"),
                f.get("ctime"),
            ]
            self._expect(i, m, f"SHOW {jid}", got, [mj.state, mj.nacks, mj.adds, mj.ctime])
            self._m_show_added(i, m, jid, mj, f, sent_s)
        else:
            seen: set[str] = set()
            cursor: Any = 0
            filters: list[Any] = []
            want = sorted(m.jobs)
            if self.opt_rng.random() < 0.4:
                state = self.opt_rng.choice(("queued", "active"))
                filters = ["STATE", state, "REPLY", "id"]
                want = sorted(j for j, mj in m.jobs.items() if mj.state == state)
                self.probe("cmd-jscan-state")
            for _ in range(1000):
                reply = await self.call(i, "JSCAN", cursor, "COUNT", 2, "QUEUE", q, *filters)
                cursor = text(reply[0])
                seen.update(text(x) for x in reply[1])
                if cursor == "0":
                    break
            self.probe("cmd-jscan")
            self._expect(i, m, f"JSCAN QUEUE {q} {' '.join(filters)}", sorted(seen), want)

    def _clock_s(self, i: int) -> int:
        """Node i's clock in seconds, as its commands read it (white-box)."""
        return int(self.world.nodes[i].server.node.now_ms() // 1000)

    def _m_show_added(
        self, i: int, m: Model, jid: str, mj: MJob, f: dict[str, Any], sent_s: int
    ) -> None:
        """SHOW of a model job: what ADDJOB was told, and the TTL left (to
        two seconds: the node's clock may tick between its answers and our
        looks at it, at the ADDJOB and at the SHOW)."""
        node_id = self.world.nodes[i].server.node.node_id
        got = [text(f.get("queue")), f.get("repl"), f.get("retry"), f.get("delay")]
        got.append([text(x) for x in rows(f.get("nodes-delivered"))])
        want: list[Any] = [f"xm{i}", 1, MODEL_RETRY, 0, [node_id]]
        if mj.body is not None:
            got.append(text(f.get("body")))
            want.append(mj.body)
        self._expect(i, m, f"SHOW {jid} (as added)", got, want)
        if mj.etime is not None and m.epoch == self.epoch(i):
            # SHOW ran between its call (sent_s) and now; a second of slack
            # each way for the rounding of the clocks to seconds.
            lo = max(0, mj.etime[0] - self._clock_s(i) - 1)
            hi = max(0, mj.etime[1] - sent_s + 1)
            ttl = f.get("ttl")
            self.probe("cmd-show-ttl-checked")
            if not isinstance(ttl, int) or not lo <= ttl <= hi:
                self.violate(
                    f"model-read: n{i} SHOW {jid} ttl answered {ttl!r}, "
                    f"the model says {lo} to {hi}"
                )

    async def _m_qscan_len(self, i: int, m: Model, queued: int) -> None:
        """QSCAN MINLEN/MAXLEN lists xm<i> exactly when its length is within
        (an empty queue may be gone: judged only when it would be left out)."""
        lo = max(0, queued + self.opt_rng.choice((-1, 0, 1)))
        hi = max(0, queued + self.opt_rng.choice((-1, 0, 1)))
        within = lo <= queued <= hi
        if within and queued == 0:
            return
        seen: set[str] = set()
        cursor = "0"
        for _ in range(1000):
            reply = await self.call(i, "QSCAN", cursor, "COUNT", 5, "MINLEN", lo, "MAXLEN", hi)
            cursor = text(reply[0])
            seen.update(text(x) for x in reply[1])
            if cursor == "0":
                break
        self.probe("cmd-qscan-len")
        self._expect(i, m, f"QSCAN MINLEN {lo} MAXLEN {hi} lists xm{i}", f"xm{i}" in seen, within)

    async def _m_pause(self, i: int) -> None:
        m = await self._sync(i)
        if m is None:
            return
        how = self.rng.choice(("in", "out", "all", "none", "none"))
        self.pausing[i] += 1
        try:
            reply = await self.call(i, "PAUSE", f"xm{i}", how)
        finally:
            self.pausing[i] -= 1
            self.pauses_sent[i] += 1
        self.probe(f"cmd-pause-{how}")
        self.record("pause", {"node": i, "queue": f"xm{i}", "how": how, "reply": text(reply)})
        if m.epoch != self.epoch(i):
            m.known = False
            return
        self._expect(i, m, f"PAUSE xm{i} {how}", text(reply), how)
        m.pause = how

    # -------------------------------------------------------- wild queue

    async def _w_add(self, i: int) -> None:
        self.n += 1
        body = f"xw-{self.n}"
        copies = self.rng.randint(1, self.world.count)
        delay = self.rng.randint(0, 2)
        ttl = self.rng.randint(delay + 10, 40)
        retry = self.rng.randint(1, 5)
        args: list[Any] = ["ADDJOB", WILD, body, 500]
        every = self.rng.random() < 0.5
        if every or self.rng.random() < 0.5:
            args += ["REPLICATE", copies]
        if every or delay:
            args += ["DELAY", delay]
        if every or self.rng.random() < 0.5:
            args += ["RETRY", retry, "TTL", ttl]
        if every or self.rng.random() < 0.3:
            args += ["MAXLEN", 10_000]
        if every or self.rng.random() < 0.3:
            args += ["ASYNC"]
        reply = await self.call(i, *args)
        self.record("add", {"node": i, "body": body, "args": [text(a) for a in args[4:]]})
        if every and text(reply).startswith("D-"):
            self.probe("cmd-addjob-every-option")

    async def _w_get(self, i: int) -> None:
        world = self.world
        if self.rng.random() < 0.5:
            args: list[Any] = ["GETJOB", "NOHANG"]
            self.probe("cmd-getjob-nohang")
        else:
            args = ["GETJOB", "TIMEOUT", self.rng.randint(10, 200)]
            self.probe("cmd-getjob-timeout")
        args += ["COUNT", 2, "WITHCOUNTERS", "FROM", WILD]
        self.probe("cmd-getjob-count")
        self.probe("cmd-getjob-withcounters")
        reply = await self.call(i, *args)
        if isinstance(reply, ReplyError):
            if i not in self.leaving and not text(reply).startswith(("LEAVING", "MISCONF")):
                self.violate(f"absurd: n{i} GETJOB answered {text(reply)!r}")
            return
        for r in rows(reply):
            jid = text(r[1])
            if r[3] != b"nacks" or not isinstance(r[4], int) or r[4] < 0 or r[6] < 0:
                self.violate(f"absurd: n{i} GETJOB WITHCOUNTERS gave {r!r}")
            self.record("get", {"node": i, "id": jid})
            await self._w_dispose(i, jid)
            if not world.nodes[i].up:
                return

    async def _w_dispose(self, i: int, jid: str) -> None:
        """Ack on the delivering node, another holder, or a stranger; or
        NACK, WORKING, or nothing."""
        how = self.rng.randrange(5)
        cmd = self.rng.choice(("ACKJOB", "FASTACK"))
        kind = "ack" if cmd == "ACKJOB" else "fastack"
        if how == 0:
            reply = await self.call(i, cmd, jid)
            self.probe(
                f"cmd-{kind}job-delivering-node"
                if kind == "ack"
                else "cmd-fastack-delivering-node"
            )
            if reply == 1:
                self.answered_ack(i, jid)
            return
        if how in (1, 2):
            others = [j for j in self.world.up_indexes() if j != i]
            if not others:
                return
            j = self.rng.choice(others)
            show = await self.call(j, "SHOW", jid)
            self.probe("cmd-show")
            if show is not None:
                state = text(fields(show).get("state"))
                if state not in STATES:
                    self.violate(f"absurd: n{j} SHOW {jid} state {state!r}")
            # A stranger never registered the job (the World saw every node).
            never = self.world.nodes[j].name not in self.world.registered_at.get(jid, {})
            where = "stranger" if never else "other" if show is not None else ""
            reply = await self.call(j, cmd, jid)
            name = "ackjob" if kind == "ack" else "fastack"
            if where:
                self.probe(f"cmd-{name}-{where}-node")
            if reply == 1:
                self.answered_ack(j, jid)
            return
        if how == 3:
            await self.call(i, "NACK", jid)
            self.probe("cmd-nack")
        else:
            await self.call(i, "WORKING", jid)
            self.probe("cmd-working")

    async def _w_peek_ack(self, i: int) -> None:
        """Ack a job QPEEK shows queued, then look again: a job whose ack
        the node answered is never listed as queued there."""
        node = self.world.nodes[i]
        incarnation = node.incarnation
        reply = rows(await self.call(i, "QPEEK", WILD, 1))
        self.probe("cmd-qpeek")
        if not reply:
            return
        jid = text(reply[0][1])
        if await self.call(i, "ACKJOB", jid) != 1:
            return
        self.answered_ack(i, jid)
        self.probe("cmd-ackjob-delivering-node")
        again = rows(await self.call(i, "QPEEK", WILD, -100))
        # (Unless another holder sent it again since: news to this node.)
        still = self.answered.get(node.name, {}).get(jid) == incarnation == node.incarnation
        if still and jid in {text(r[1]) for r in again}:
            self.violate(f"absurd: n{i} QPEEK {WILD} lists {jid}, whose ack it answered")

    async def _w_pause(self, i: int) -> None:
        how = self.rng.choice(("in", "out", "all", "none", "none", "none"))
        args: list[Any] = ["PAUSE", WILD, how]
        bcast = self.rng.random() < 0.5
        if bcast:
            args.append("BCAST")
            self.probe("cmd-pause-bcast")
        self.pauses += 1
        mine, t0 = self.pauses, trio.current_time()
        world = self.world
        sender = world.nodes[i]
        # The peers the sender may reach now (BCAST goes to those).
        reachable = (
            {p.node_id for p in sender.server.node.cluster.reachable()} if sender.up else set()
        )
        before = self._steady_marks()
        if bcast and how in ("in", "none"):
            self.unpause_bcasts.append((i, t0))
        reply = await self.call(i, *args)
        self.probe(f"cmd-pause-{how}")
        if text(reply) != how:
            self.violate(f"absurd: n{i} {' '.join(map(str, args))} answered {text(reply)!r}")
        elif bcast and world.nursery is not None:
            world.nursery.start_soon(self._check_bcast, i, how, mine, t0, reachable, before)
        if how in ("out", "all"):
            got = await self.call(i, "GETJOB", "NOHANG", "FROM", WILD)
            if rows(got) and not self._unpause_in_flight(i):
                self.violate(f"pause-out: n{i} delivered {got!r} from {WILD} paused {how}")

    def _unpause_in_flight(self, i: int) -> bool:
        """Whether another node's PAUSE BCAST of the wild queue leaving it
        served may still reach node i. A bus link holds its messages across
        a cut and delivers them when it heals (seed 531591: n5's PAUSE none
        BCAST, sent while n3 was cut off, reached n3 3.5 s later, between
        n3's own PAUSE out and the GETJOB after it): applied on arrival, as
        in the original, it legitimately undoes a later local PAUSE. In a
        calm cluster a BCAST arrives within PAUSE_BCAST_S (pause-bcast)."""
        now = trio.current_time()
        self.unpause_bcasts = [
            (j, t)
            for j, t in self.unpause_bcasts
            if not (now - t > PAUSE_BCAST_S and self.world.calm(t, now))
        ]
        return any(j != i for j, _ in self.unpause_bcasts)

    async def _pause_fresh(self) -> None:
        """PAUSE BCAST of a queue no node has yet (``xp<n>``): out on node
        i, then a job added on node j and a client blocked there on it,
        then none on node i. pause-bcast: every reachable node has the
        queue paused out (created for it), and once resumed, node j's
        blocked client gets the job. From a generator of its own (the
        other tasks draw what they drew before)."""
        world = self.world
        rng = random.Random(self.plan.seed ^ 0x7061757365)
        n = 0
        while not self.stop.is_set():
            await trio.sleep(rng.uniform(1.0, 4.0))
            up = world.up_indexes()
            if len(up) < 2 or not world.healthy(True):
                continue
            i, j = rng.sample(up, 2)
            n += 1
            queue = f"xp{n}"
            try:
                await self._pause_fresh_once(i, j, queue)
            except Unknown as e:
                self.record("error", {"node": i, "error": str(e)})

    async def _pause_fresh_once(self, i: int, j: int, queue: str) -> None:
        world = self.world
        sender = world.nodes[i]
        reachable = {p.node_id for p in sender.server.node.cluster.reachable()}
        before = self._steady_marks()
        t0 = trio.current_time()
        reply = await self.call(i, "PAUSE", queue, "out", "BCAST")
        if text(reply) != "out":
            self.violate(f"absurd: n{i} PAUSE {queue} out BCAST answered {text(reply)!r}")
            return
        await self._check_bcast(i, "out", None, t0, reachable, before, queue)
        if world.nodes[j].server.node.node_id not in reachable:
            return
        added = await self.call(j, "ADDJOB", queue, f"{queue}-1", 0, "REPLICATE", 1, "RETRY", 60)
        if not text(added).startswith("D-"):
            return
        got: list[Any] = []
        failed: list[bool] = []

        async def blocked() -> None:
            try:
                got.append(await self.call(j, "GETJOB", "TIMEOUT", 4000, "FROM", queue))
            except Unknown:
                failed.append(True)  # a fault: no verdict

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked)
            await trio.sleep(0.3)
            blocked_then = world.nodes[j].server.node.queues.get(queue)
            waiting = blocked_then is not None and bool(blocked_then.waiters) and not got
            t1 = trio.current_time()
            try:
                reply = await self.call(i, "PAUSE", queue, "none", "BCAST")
            except Unknown:
                reply = None
            await trio.sleep(PAUSE_BCAST_S)
            t2 = trio.current_time()
            if (
                waiting
                and not failed
                and text(reply) == "none"
                and self._steady_marks() == before
                and world.calm(t0, t2)
                and world.healthy(True)
            ):
                self.probe("pause-bcast-checked")
                if not got:
                    self.violate(
                        f"pause-bcast: n{i} PAUSE {queue} none BCAST at t={t1:.2f}; the "
                        f"client blocked on n{j} since before has not got its job at t={t2:.2f}"
                    )
        if got and rows(got[0]):
            await self.call(j, "ACKJOB", text(added))

    def _steady_marks(self) -> tuple[Any, ...]:
        """What must not move for a check over the whole cluster to hold:
        every node's incarnation and ID, the explorer's disturbances."""
        nodes = tuple((n.up, n.incarnation, n.server.node.node_id) for n in self.world.nodes)
        return nodes, sum(self.disturbed.values()), frozenset(self.leaving)

    async def _check_bcast(
        self,
        i: int,
        how: str,
        mine: int | None,
        t0: float,
        reachable: set[str],
        before: tuple[Any, ...],
        queue: str = WILD,
    ) -> None:
        """pause-bcast: PAUSE ... BCAST answered in a calm cluster reaches
        every node the sender could reach, and acts there as it does
        locally: the queue (created if the node had none) has the same
        pause flags, and one no longer paused out serves its blocked
        clients."""
        world = self.world
        await trio.sleep(PAUSE_BCAST_S)
        now = trio.current_time()
        if (
            (mine is not None and self.pauses != mine)
            or self._steady_marks() != before
            or not world.calm(t0, now)
            or not world.healthy(True)
        ):
            return
        bits = {"none": 0, "in": PAUSED_IN, "out": PAUSED_OUT, "all": PAUSED_IN | PAUSED_OUT}[how]
        self.probe("pause-bcast-checked")
        for n in world.nodes:
            core = n.server.node
            if not n.up or (n.index != i and core.node_id not in reachable):
                continue
            q = core.queues.get(queue)
            got = q.pause if q is not None else 0
            if got != bits:
                self.violate(
                    f"pause-bcast: n{i} PAUSE {queue} {how} BCAST at t={t0:.2f}; "
                    f"{n.name} has it paused {Pause(got).label} at t={now:.2f}"
                )
            elif q is not None and not got & PAUSED_OUT and q.waiters and q.jobs:
                self.violate(
                    f"pause-bcast: {n.name} holds {len(q.jobs)} queued {queue} jobs and "
                    f"{len(q.waiters)} blocked GETJOB clients {PAUSE_BCAST_S:.1f}s after "
                    f"n{i}'s PAUSE {how} BCAST"
                )

    def _check_leaving_known(self, i: int, told: float, marks: tuple[Any, ...]) -> bool:
        """leaving-known: CLUSTER LEAVING yes answered OK is flagged by every
        other node within half the node timeout plus ``LEAVING_KNOWN_S`` of
        the later of the answer and the end of the last fault (links
        settled). True once checked."""
        world = self.world
        now = trio.current_time()
        ends = [w[1] for w in world.fault_windows]
        if any(end == float("inf") for end in ends) or not world.healthy(True):
            return False
        since = max([told, *(end + LINK_SETTLE_S for end in ends)])
        # Heartbeats carry the flag: a peer is pinged at least every half
        # node timeout (one of a sample every second on top), and gossip
        # about third nodes spreads it sooner.
        bound = max(LEAVING_KNOWN_S, world.plan.node_timeout_ms / 2000 + LEAVING_KNOWN_S)
        if now - since < bound or self._steady_marks() != marks:
            return False
        me = world.nodes[i].server.node
        if not me.leaving:
            return False
        self.probe("leaving-known-checked")
        for n in world.nodes:
            if n.index == i or not n.up:
                continue
            peer = n.server.node.cluster.nodes.get(me.node_id)
            if peer is not None and not peer.flags & LEAVING:
                self.violate(
                    f"leaving-known: n{i} told CLUSTER LEAVING yes at t={told:.2f}, calm "
                    f"since t={since:.2f}; {n.name} does not flag it leaving at t={now:.2f}"
                )
        return True

    async def _a_add(self, i: int) -> None:
        world = self.world
        # No node leaving, not only the origin: a leaving node takes no new
        # copy, and the origin may not have heard of its flag yet (seed
        # 20003189: the one REPLJOB of a REPLICATE 2 ASYNC job went to a
        # node told LEAVING half a second before).
        # Meshed, too: a node that does not know the origin yet (a
        # replacement the liveness phase has just introduced to one node)
        # drops its REPLJOB (seed 987280060).
        if not world.healthy(True) or self.leaving or not world.meshed():
            return
        copies = self.rng.randint(1, world.count)
        self.n += 1
        body = f"xa-{self.n}"
        disturbed = sum(self.disturbed.values())
        # Taken before the call: a fault while it runs (seed 20001697: a
        # connection reset at the very moment the REPLJOBs went out) voids
        # the check as well.
        since = trio.current_time()
        crashes, resets = world.probes["crash"], world.net.resets
        reply = await self.call(i, "ADDJOB", ASYNC_Q, body, 0, "REPLICATE", copies, "ASYNC")
        self.record("add", {"node": i, "body": body, "copies": copies, "reply": text(reply)})
        if not text(reply).startswith("D-"):
            return
        jid = text(reply)
        await trio.sleep(ASYNC_SETTLE_S)
        if (
            not world.healthy()
            or world.net.changed_at >= since
            or (world.probes["crash"], world.net.resets) != (crashes, resets)
            or sum(self.disturbed.values()) != disturbed
        ):
            return
        holders = sorted(world.registered_at.get(jid, {}))
        self.probe("async-replication-checked")
        if len(holders) < copies:
            self.violate(
                f"async-replicated: {jid} (REPLICATE {copies} ASYNC on n{i}) held by "
                f"{holders} {ASYNC_SETTLE_S:.0f}s later in a healthy cluster"
            )

    async def _reads_anywhere(self, i: int) -> None:
        """Reads of any queue on any node: never absurd."""
        q = self.rng.choice(("q", WILD, ASYNC_Q))
        what = self.rng.randrange(4)
        if what == 0:
            n = await self.call(i, "QLEN", q)
            self.probe("cmd-qlen")
            if not isinstance(n, int) or n < 0:
                self.violate(f"absurd: n{i} QLEN {q} answered {n!r}")
        elif what == 1:
            node = self.world.nodes[i]
            incarnation = node.incarnation
            # Only acks answered before the QPEEK was sent count: one
            # answered while it was in flight may have crossed it.
            before = dict(self.answered.get(node.name, {}))
            reply = await self.call(i, "QPEEK", q, 3)
            self.probe("cmd-qpeek")
            if not isinstance(reply, list) or len(reply) > 3:
                self.violate(f"absurd: n{i} QPEEK {q} 3 answered {reply!r}")
                return
            # A job whose ack this node answered (and that no other holder
            # sent it again since) is never listed as queued here.
            answered = self.answered.get(node.name, {})
            for row in reply:
                jid = text(row[1])
                if before.get(jid) == answered.get(jid) == incarnation == node.incarnation:
                    self.violate(f"absurd: n{i} QPEEK {q} lists {jid}, whose ack it answered")
        elif what == 2:
            reply = await self.call(i, "QSTAT", q)
            self.probe("cmd-qstat")
            f = fields(reply)
            if f and not (isinstance(f.get("len"), int) and f["len"] >= 0):
                self.violate(f"absurd: n{i} QSTAT {q} len {f.get('len')!r}")
        else:
            seen: set[str] = set()
            cursor = "0"
            for _ in range(1000):
                reply = await self.call(i, "QSCAN", cursor, "COUNT", 2)
                cursor = text(reply[0])
                seen.update(text(x) for x in reply[1])
                if cursor == "0":
                    break
            self.probe("cmd-qscan")
            m = self.model(i)
            if m is not None and m.queued() and f"xm{i}" not in seen:
                self.violate(f"model-read: n{i} QSCAN missed xm{i} ({len(m.queued())} queued)")

    # ------------------------------------------------ odd commands (58)

    async def _session(self, i: int, *commands: tuple[Any, ...]) -> list[Any]:
        """Several commands on one fresh connection, in turn; Unknown when a
        fault got in the way."""
        with trio.move_on_after(CALL_TIMEOUT_S):
            async with self._connected(i) as client:
                return [await client.call(*args) for args in commands]
        raise Unknown("timeout")

    async def _odd_commands(self) -> None:
        """The careless client and the curious operator, from a generator of
        their own: malformed commands (odd-answered), the reads an operator
        makes (odd-read), an inline command, RESP3, MONITOR, and a client
        that goes while blocked in GETJOB."""
        rng = random.Random(f"explore-odd-{self.plan.seed}")
        actions = (
            self._odd_malformed,
            self._odd_reads,
            self._odd_protocols,
            self._odd_blocked_cut,
        )
        while not self.stop.is_set():
            await trio.sleep(rng.uniform(0.2, 1.5))
            up = self.world.up_indexes()
            if not up:
                continue
            i = rng.choice(up)
            try:
                await rng.choice(actions)(i, rng)
            except Unknown as e:
                self.record("error", {"error": str(e)})

    async def _odd_malformed(self, i: int, rng: random.Random) -> None:
        """odd-answered: a malformed command gets an error reply, and the
        connection it came on still serves (a PING after it)."""
        sent = rng.sample(MALFORMED, 4)
        if rng.random() < 0.2:
            # Two that depend on the node or a limit.
            me = self.world.nodes[i].server.node.node_id
            sent[0] = rng.choice(
                (("CLUSTER", "FORGET", me), ("GETJOB", "NOHANG", "FROM", *["xo"] * 10_001))
            )
        replies = await self._session(i, *(step for args in sent for step in (args, ("PING",))))
        for n, args in enumerate(sent):
            reply, pong = replies[2 * n : 2 * n + 2]
            self.probe("odd-malformed")
            if not isinstance(reply, ReplyError) or text(pong) != "PONG":
                self.violate(
                    f"odd-answered: n{i} {' '.join(map(str, args))} answered {text(reply)!r}, "
                    f"then PING {text(pong)!r}"
                )

    async def _odd_reads(self, i: int, rng: random.Random) -> None:
        """odd-read: what an operator reads, against the node's own state."""
        node = self.world.nodes[i]
        before = (node.incarnation, node.server.node.node_id)
        what = rng.randrange(5)
        me = before[1]

        def same() -> bool:
            # Not restarted, wiped or replaced (a new ID) meanwhile (seed 700321).
            return node.up and (node.incarnation, node.server.node.node_id) == before

        if what == 0:
            (hello,) = await self._session(i, ("HELLO",))
            if not same():
                return
            entries = [e for e in rows(hello)[2:] if isinstance(e, list) and len(e) == 4]
            ids = [text(e[0]) for e in entries]
            # Itself first, with its client port.
            ok = (
                rows(hello)[:2] == [1, me.encode()]
                and ids[:1] == [me]
                and text(entries[0][2]) == str(node.port)
            )
            self._odd_judge(i, "HELLO", hello, ok)
        elif what == 1:
            (nodes,) = await self._session(i, ("CLUSTER", "NODES"))
            if not same():
                return
            mine = [ln.split()[0] for ln in text(nodes).splitlines() if " myself" in ln]
            self._odd_judge(i, "CLUSTER NODES", nodes, mine == [me])
        elif what == 2:
            (got,) = await self._session(i, ("CONFIG", "GET", "*fsync*"))
            f = {text(k): text(v) for k, v in fields(got).items()}
            self._odd_judge(i, "CONFIG GET *fsync*", got, f.get("appendfsync") in FSYNC_VALUES)
        elif what == 3:
            m = self.model(i)
            epoch = self.epoch(i)
            # Not while a PAUSE of that queue is on its way (seed 712639:
            # the model learns its answer only when it comes back).
            quiet = not self.pausing[i]
            sent = self.pauses_sent[i]
            (state,) = await self._session(i, ("PAUSE", f"xm{i}", "STATE"))
            quiet = quiet and not self.pausing[i] and self.pauses_sent[i] == sent
            if m is not None and m.known and self.epoch(i) == epoch and quiet:
                self._odd_judge(i, f"PAUSE xm{i} STATE", state, text(state) == m.pause)
        else:
            # Not INFO's server, memory and CPU sections: they tell the
            # process (its PID, argv, RSS, CPU time), and a run's bytes must
            # not depend on the process it runs in (a seed's digest under
            # coverage differed).
            replies = await self._session(
                i,
                ("INFO", rng.choice(("jobs", "queues", "stats", "clients"))),
                ("INFO", "persistence"),
                ("CLUSTER", "LEAVING"),
                ("QSCAN", 0, "BUSYLOOP", "IMPORTRATE", 0),
                ("CLIENT", "LIST"),
                ("SLOWLOG", "GET"),
                ("LATENCY", "LATEST"),
                ("COMMAND", "COUNT"),
                ("CONFIG", "GET", "cluster-node-*"),
            )
            info = text(replies[0])
            ok = (
                info.startswith("# ")
                and "aof_enabled:1" in text(replies[1])
                and text(replies[2]) in ("yes", "no")
                and not any(isinstance(r, ReplyError) for r in replies)
            )
            self._odd_judge(
                i, "INFO, CLUSTER LEAVING, QSCAN IMPORTRATE, CLIENT LIST...", replies, ok
            )

    def _odd_judge(self, i: int, what: str, reply: Any, ok: bool) -> None:
        self.probe("odd-read-checked")
        if not ok:
            self.violate(f"odd-read: n{i} {what} answered {text(reply)[:300]!r}")

    async def _odd_protocols(self, i: int, rng: random.Random) -> None:
        """An inline PING, a RESP3 connection (HELLO 3) reading a queue's
        stats and a job, and a MONITOR that goes after a moment."""
        with trio.move_on_after(CALL_TIMEOUT_S):
            async with self._connected(i) as client:
                await client.send_raw(b"PING\r\n")
                pong = await client.read()
                self._odd_judge(i, "inline PING", pong, text(pong) == "PONG")
                hello = await client.call("HELLO", 3)
                stat = await client.call("QSTAT", WILD)
                ok = not isinstance(hello, ReplyError) and not isinstance(stat, ReplyError)
                self._odd_judge(i, "HELLO 3 then QSTAT", [hello, stat], ok)
                self.probe("odd-resp3")
                monitor = await client.call("MONITOR")
                self._odd_judge(i, "MONITOR", monitor, text(monitor) == "OK")
                await trio.sleep(rng.uniform(0.01, 0.3))

    async def _odd_blocked_cut(self, i: int, rng: random.Random) -> None:
        """A client blocked in GETJOB on the empty queue goes away."""
        with trio.move_on_after(CALL_TIMEOUT_S):
            async with self._connected(i) as client:
                await client.send("GETJOB", "TIMEOUT", 3000, "FROM", EMPTY_Q, f"xm{i}x")
                await trio.sleep(rng.uniform(0.01, 0.3))
                self.probe("odd-blocked-cut")

    # ------------------------------------------------------------- admin

    async def _admin(self, start: float) -> None:
        plan, world, rng = self.plan, self.world, self.admin_rng
        actions = [a for bit, a in enumerate(ADMIN_ACTIONS) if plan.admin_mask >> bit & 1]
        times = sorted(rng.uniform(0.1, 0.75) * plan.duration for _ in actions)
        rng.shuffle(actions)
        for action, at in zip(actions, times, strict=True):
            await trio.sleep_until(start + at)
            if self.stop.is_set():
                return
            up = world.up_indexes()
            if not up:
                continue
            i = rng.choice(up)
            self.record("admin", {"action": action, "node": i})
            try:
                await getattr(self, f"_admin_{action}")(i, start)
            except Unknown as e:
                self.record("error", {"node": i, "admin": action, "error": str(e)})

    async def _admin_config(self, i: int, start: float) -> None:
        rng = self.admin_rng
        fsync = self.world.appendfsync
        stronger = {"no": "everysec", "everysec": "always", "always": "always"}[fsync]
        sets = [
            ("maxmemory", rng.choice(("1gb", "100mb")), None, "admin-config-maxmemory"),
            ("appendfsync", stronger, fsync, "admin-config-appendfsync"),
            (
                "cluster-node-timeout",
                str(rng.randint(2000, 8000)),
                None,
                "admin-config-node-timeout",
            ),
        ]
        restore = []
        for name, value, back, probe in sets:
            if back is None:
                old = await self.call(i, "CONFIG", "GET", name)
                back = text(old[1])
            reply = await self.call(i, "CONFIG", "SET", name, value)
            if text(reply) != "OK":
                self.violate(f"absurd: n{i} CONFIG SET {name} {value} answered {text(reply)!r}")
            self.probe(probe)
            restore.append((name, back))
        await trio.sleep(rng.uniform(1, 4))
        for name, back in restore:
            reply = await self.call(i, "CONFIG", "SET", name, back)
            if text(reply) != "OK":
                self.violate(f"absurd: n{i} CONFIG SET {name} {back} answered {text(reply)!r}")

    async def _admin_bgrewriteaof(self, i: int, start: float) -> None:
        self.bg_pending.add(i)
        reply = await self.call(i, "BGREWRITEAOF")
        self.probe("admin-bgrewriteaof")
        if not text(reply).startswith(("Background", "ERR Background")):
            self.violate(f"absurd: n{i} BGREWRITEAOF answered {text(reply)!r}")

    def flushed(self, node: SimNode) -> None:
        """``node`` runs a DEBUG FLUSHALL or CLUSTER RESET now (its jobs
        still there), whenever the explorer sent it: the jobs it holds are
        forgotten by it, the acks only it knew of lost, its model unknown.
        A CLUSTER RESET HARD took a new ID: the replacement happened (the
        old ID is forgotten everywhere and the node met again, by the
        explorer or, if it gave up on the reply, by its liveness phase)."""
        world = self.world
        world.flushes += 1
        self.world.lose_acks_only_on(node)
        gone = sorted(
            job.id
            for job in node.server.node.jobs.values()
            if job.body is not None and job.state != JobState.ACKED
        )
        for jid in gone:
            world.amnesia.setdefault(jid, set()).add(node.name)
        self.disturbed[node.index] += 1
        world.trace.record(node.name, "node", {"ev": "flushed", "ids": len(gone)})
        pending = self.resetting.get(node.index)
        if pending is None:
            return
        old, incarnation = pending
        if incarnation == node.incarnation and node.server.node.node_id != old:
            del self.resetting[node.index]
            node.old_ids.append(old)
            self.replaced.add(node.index)
            world.trace.record(node.name, "node", {"ev": "replaced", "old": old[:8]})

    async def _admin_flushall(self, i: int, start: float) -> None:
        self.disturbed[i] += 1
        try:
            reply = await self.call(i, "DEBUG", "FLUSHALL")  # see flushed()
        finally:
            self.disturbed[i] += 1
        if isinstance(reply, ReplyError) and reply.code == "MISCONF":
            return  # its disk fails: refused, as write commands are (judged by call)
        self.probe("admin-flushall")
        if text(reply) != "OK":
            self.violate(f"absurd: n{i} DEBUG FLUSHALL answered {text(reply)!r}")

    async def _admin_leaving(self, i: int, start: float) -> None:
        world = self.world
        if world.count < 2:
            return
        self.leaving.add(i)
        self.ever_left.add(i)
        self.disturbed[i] += 1
        reply = await self.call(i, "CLUSTER", "LEAVING", "yes")
        self.probe("admin-leaving")
        if text(reply) != "OK":
            self.violate(f"absurd: n{i} CLUSTER LEAVING yes answered {text(reply)!r}")
        told = trio.current_time()
        marks = self._steady_marks()
        # A job for every node, added at once on another node (which has
        # not heard yet): its REPLJOB reaches the leaving node, which must
        # refuse the copy (leaving-no-copies, sim/observing.py).
        others = [j for j in world.up_indexes() if j != i]
        if others:
            try:
                await self.call(
                    others[0], "ADDJOB", LEAVING_Q, f"xl-{i}", 0,
                    "REPLICATE", world.count, "ASYNC", "TTL", 20,
                )  # fmt: skip
                self.probe("leaving-repljob-sent")
            except Unknown:
                pass
        await self._leaving_adds(i)
        until = trio.current_time() + self.admin_rng.uniform(2, 5)
        known = False
        while trio.current_time() < until:
            await trio.sleep(self.admin_rng.uniform(0.2, 0.8))
            node = world.nodes[i]
            known = known or self._check_leaving_known(i, told, marks)
            if not node.up or not node.server.node.leaving:
                continue  # a crash may bring it back: the flag is in nodes.conf
            incarnation = node.incarnation
            try:
                got = await self.call(i, "GETJOB", "TIMEOUT", 300, "FROM", EMPTY_Q)
            except Unknown:
                continue
            if node.incarnation != incarnation or not node.server.node.leaving:
                continue
            if isinstance(got, ReplyError) and got.code == "MISCONF":
                continue  # its disk fails: judged by disk-answered (call)
            self.probe("leaving-refused-getjob")
            if not (isinstance(got, ReplyError) and text(got).startswith("LEAVING")):
                self.violate(f"leaving: n{i} (leaving) answered a blocking GETJOB with {got!r}")
            # It still serves what it holds: nobody else takes xm<i> jobs.
            try:
                stat = fields(await self.call(i, "QSTAT", f"xm{i}"))
                if stat.get("len", 0) and text(stat.get("pause")) in ("none", "in"):
                    got = await self.call(i, "GETJOB", "NOHANG", "FROM", f"xm{i}")
                    if isinstance(got, ReplyError) and got.code == "MISCONF":
                        # Its disk filled since the blocking call (seed
                        # 773997): judged by disk-answered, as above.
                        continue
                    if node.incarnation == incarnation and node.server.node.leaving:
                        self.probe("leaving-served-queued")
                        if not rows(got):
                            self.violate(
                                f"leaving: n{i} (leaving) holds {stat['len']} queued xm{i} "
                                f"jobs, GETJOB NOHANG answered {got!r}"
                            )
            except Unknown:
                continue
        if not known and world.nursery is not None:
            # Not checked yet (a fault in the way): the node stays leaving a
            # little longer, while the cluster calms down, and the admin
            # goes on with its other actions meanwhile.
            world.nursery.start_soon(self._leave_later, i, told, marks)
            return
        await self._stop_leaving(i)

    async def _leaving_adds(self, i: int) -> None:
        """ADDJOB on the leaving node i itself, which keeps no copy of a
        job: it replicates it to REPLICATE other nodes and has its one
        holder queue it (ENQUEUE, after the DELAY): RETRY 0, RETRY 0 with a
        DELAY of 1..2 s, and ASYNC with a RETRY. Each answered with an ID
        is taken on the other nodes (``_take_leaving_adds``)."""
        world = self.world
        delay = self.admin_rng.randint(1, 2)
        specs: list[tuple[int, int, tuple[Any, ...]]] = [
            (0, 0, ("REPLICATE", 1, "RETRY", 0)),
            (0, delay, ("REPLICATE", 1, "RETRY", 0, "DELAY", delay)),
            (2, 0, ("REPLICATE", 1, "RETRY", 2, "TTL", 60, "ASYNC")),
        ]
        others = {j: self.disturbed[j] for j in range(world.count) if j != i}
        added: list[tuple[str, int, int, float, float]] = []
        for retry, delay_s, args in specs:
            self.n += 1
            body = f"xn-{self.n}"
            t0 = trio.current_time()
            try:
                reply = await self.call(i, "ADDJOB", LEAVING_ADD_Q, body, 2000, *args)
            except Unknown:
                continue
            self.record("add", {"node": i, "body": body, "args": list(args), "reply": text(reply)})
            if text(reply).startswith("D-"):
                added.append((text(reply), retry, delay_s, t0, trio.current_time()))
        if added and world.nursery is not None:
            world.nursery.start_soon(self._take_leaving_adds, i, added, others)

    async def _take_leaving_adds(
        self,
        i: int,
        added: list[tuple[str, int, int, float, float]],
        disturbed: dict[int, int],
    ) -> None:
        """leaving-added-delivered: each job ``_leaving_adds`` had answered
        with an ID is delivered by a GETJOB on the other nodes within
        ``LEAVING_ADDED_S`` (plus its DELAY) of the answer, when calm for
        the nodes concerned (no fault on the leaving node, on the job's
        holder or on every node, no flush of the holder, meanwhile); a
        RETRY 0 one exactly once. The GETJOBs go to the nodes that hold a
        copy (the others' would fetch it by NEEDJOBS, or not); each job is
        acked once taken."""
        world = self.world
        got: dict[str, list[float]] = {}
        dues = {jid: t + delay + LEAVING_ADDED_S for jid, _, delay, _, t in added}
        stop = max(dues.values()) + LEAVING_ADDED_S
        others = sorted(disturbed)
        k = 0

        def holders(jids: list[str]) -> list[int]:
            names = {n for jid in jids for n in world.registered_at.get(jid, {})}
            return [j for j in others if world.nodes[j].name in names] or others

        async def take(jids: list[str]) -> None:
            nonlocal k
            targets = holders(jids)
            j = targets[k % len(targets)]
            k += 1
            try:
                reply = await self.call(
                    j, "GETJOB", "TIMEOUT", 200, "COUNT", 3, "FROM", LEAVING_ADD_Q
                )
            except Unknown:
                await trio.sleep(0.1)
                return
            for row in rows(reply):
                jid = text(row[1])
                got.setdefault(jid, []).append(trio.current_time())
                self.record("get", {"node": j, "id": jid, "queue": LEAVING_ADD_Q})
                try:
                    await self.call(j, "ACKJOB", jid)
                except Unknown:
                    pass

        while trio.current_time() < stop and len(got) < len(added):
            await take([jid for jid, *_ in added if jid not in got])
        # A second delivery of a RETRY 0 job would come after the first: a
        # while longer (its holder queueing it again).
        with trio.move_on_after(LEAVING_ADDED_S):
            while True:
                await take([jid for jid, *_ in added])
        for jid, retry, delay, t0, t in added:
            times = got.get(jid, [])
            if retry == 0 and len(times) > 1:
                self.violate(
                    f"leaving-added-delivered: RETRY 0 job {jid} added on n{i} (leaving) "
                    f"delivered {len(times)} times"
                )
            due = dues[jid]
            concerned = {-1, i, *(j for j in holders([jid]) if j in disturbed)}
            if any(self.disturbed[j] != disturbed[j] for j in concerned if j in disturbed):
                continue  # a holder flushed, replaced, or its leaving toggled
            start = t0 - LINK_SETTLE_S
            if any(
                int(w[2]) in concerned and w[0] <= due and w[1] >= start
                for w in world.fault_windows
            ):
                continue
            if any(w[0] <= due and w[1] >= start for w in world._crash_windows):
                # A holder may give it away (YOURJOBS) to any node: a crash
                # anywhere may take it, and a RETRY 0 one is then lost, as
                # at most once allows (seeds 712498, 293718070).
                continue
            self.probe("leaving-added-checked")
            if not any(x <= due for x in times):
                when = f"at t={times[0]:.2f}" if times else "never"
                self.violate(
                    f"leaving-added-delivered: {jid} (RETRY {retry}, DELAY {delay}) added on "
                    f"n{i} (leaving) at t={t:.2f}, not delivered by t={due:.2f} ({when})"
                )

    async def _leave_later(self, i: int, told: float, marks: tuple[Any, ...]) -> None:
        world = self.world
        extra = trio.current_time() + LEAVING_WAIT_S
        known = False
        while not known and trio.current_time() < extra and world.nodes[i].up:
            await trio.sleep(0.5)
            known = self._check_leaving_known(i, told, marks)
        try:
            await self._stop_leaving(i)
        except Unknown:
            self.leaving.discard(i)  # the liveness phase brings it back

    async def _stop_leaving(self, i: int) -> None:
        await self.call(i, "CLUSTER", "LEAVING", "no")
        self.leaving.discard(i)
        self.disturbed[i] += 1

    def _quiet(self, i: int, start: float, length: float) -> bool:
        """No crash-like fault of the plan touches node i in the window
        (a controlled restart must not race a fault's restart)."""
        now = trio.current_time() - start
        if now + length >= self.plan.duration:
            return False  # the liveness phase restarts every node down
        for f in self.plan.active_faults():
            if f.name not in ("crash", "wipe", "torn-crash", "upgrade"):
                continue
            if f.victim % self.world.count != i:
                continue
            lo, hi = f.start / 10 - 1, f.start / 10 + max(0.1, f.length / 10) + 1
            if lo < now + length and now < hi:
                return False
        return True

    async def _admin_shutdown(self, i: int, start: float) -> None:
        world = self.world
        down = self.admin_rng.uniform(0.5, 2.0)
        candidates = [j for j in world.up_indexes() if self._quiet(j, start, down + 3)]
        if not candidates:
            return
        i = self.admin_rng.choice(candidates)
        node = world.nodes[i]
        self.disturbed[i] += 1
        # This incarnation's: the call may outlive it (a crash restarts the
        # node with a new event, which this SHUTDOWN would never set).
        incarnation, done = node.incarnation, node.done
        # Down and restarted like a crash: a fault window, so that the
        # checks that want a calm cluster (fail-detected: a restarted node
        # learns a peer's FAIL afresh, seed 4097) leave it out.
        window = world.fault_begin(i, "shutdown")
        # Half the time the documented controlled restart that puts the
        # queues back as they were (enqueue-once).
        once = self.opt_rng.random() < 0.5
        try:
            if once:
                set_once = await self.call(i, "CONFIG", "SET", "aof-enqueue-jobs-once", "yes")
                once = text(set_once) == "OK"
            self.enqueue_once[node.name, incarnation] = (once, trio.current_time())
            reply = await self.call(i, "SHUTDOWN", "REWRITE-AOF")
        except Unknown:
            # The connection closed: no reply, as in Redis, when the node
            # stopped. But a fault may also have held the command back (it
            # runs later) or lost it with its connection (it never runs:
            # seeds 20007792 and 20007818: sent to a paused node, it died in
            # a crash, and the wait, on the next incarnation's event, held the
            # end of the safety phase for ever). Past a few seconds, the
            # restart waits in the run's nursery, as long as it takes, and
            # the explorer goes on.
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_WAIT_S):
                await done.wait()
            if not done.is_set():
                assert world.nursery is not None
                world.nursery.start_soon(
                    self._restart_after_shutdown, node, incarnation, done, down, window
                )
                return
        else:
            if text(reply) != "OK":
                # Its disk failing, the snapshot could not be written: the
                # node refuses to stop, as Redis does (seed 700375).
                refused = text(reply).startswith("ERR Errors trying to SHUTDOWN")
                if not (refused and world.disk_failed_lately(i)):
                    self.violate(f"absurd: n{i} SHUTDOWN REWRITE-AOF answered {text(reply)!r}")
                world.fault_end(window)
                return
        with trio.CancelScope(shield=True):
            await self._restart_after_shutdown(node, incarnation, done, down, window)

    async def _restart_after_shutdown(
        self,
        node: SimNode,
        incarnation: int,
        done: trio.Event,
        down: float,
        window: list[float],
    ) -> None:
        """Once the node stopped (``done``: the event of the incarnation the
        SHUTDOWN was sent to): down for ``down`` seconds, then restarted; no
        job it held is forgotten. Ends the shutdown's fault window."""
        world = self.world
        try:
            await done.wait()
            with trio.CancelScope(shield=True):
                if not node.up or node.incarnation != incarnation:
                    return  # a crash fault got there first and owns the restart
                await self._down_and_restart(node, down)
        finally:
            world.fault_end(window)
            self.disturbed[node.index] += 1

    async def _down_and_restart(self, node: SimNode, down: float) -> None:
        world = self.world
        held = {
            job.id: job.etime
            for job in node.server.node.jobs.values()
            if job.body is not None and job.state in (JobState.ACTIVE, JobState.QUEUED)
        }
        queued = {
            job.id
            for job in node.server.node.jobs.values()
            if job.body is not None and job.state == JobState.QUEUED
        }
        once, sent = self.enqueue_once.pop((node.name, node.incarnation), (False, 0.0))
        stopped = trio.current_time()
        failed = [s for s, e in world.disk_failures[node.index] if s <= stopped and e >= sent]
        if failed:
            # Its disk failed while it stopped: the rewrite at the exit could
            # not be written, and the snapshot the command wrote is older
            # (seed 711065: a job queued in the drain came back active).
            once = False
            # Nor could the jobs added since the failure (their ADDJOB was
            # not answered: nothing answered that is not written; seed
            # 721924, a job added in the drain with the disk full). A
            # second of slack for the records on their way to the file.
            since = min(failed) - 1.0
            held = {j: et for j, et in held.items() if node.seen_at.get(j, -1e9) < since}
        # Checked below (a clean stop excuses no amnesia, whatever the
        # fsync policy), not by the crash bookkeeping of World.restart.
        node.held_at_crash = {}
        node.up = False
        assert node.handle is not None
        node.handle.alive = False
        world.net.fence(node.port)
        world.trace.record(node.name, "node", {"ev": "shutdown", "held": len(held)})
        await trio.sleep(down)
        node.wiped = False
        if node.up:
            return
        await world.restart(node.index)
        self.controlled.add((node.name, node.incarnation))
        self.probe("admin-shutdown-restart")
        now = node.server.node.now_ms()
        forgot = sorted(j for j, et in held.items() if j not in node.loaded and et * 1000 > now)
        if forgot:
            self.violate(
                f"shutdown-no-amnesia: {node.name} restarted after SHUTDOWN REWRITE-AOF "
                f"without {forgot[:3]} ({len(forgot)} jobs)"
            )
        if once:
            # enqueue-once: what was queued is queued again at the load (and
            # only that: the jobs active stay active until their RETRY).
            self.probe("admin-enqueue-once")
            # (The load registers each job as its records say, then queues
            # those the file says were queued: watched by observe.)
            back = self.queued_at_load.get((node.name, node.incarnation), set())
            unqueued = sorted(j for j in queued if j in node.loaded and j not in back)
            if unqueued:
                self.violate(
                    f"enqueue-once: {node.name} restarted after aof-enqueue-jobs-once yes and "
                    f"SHUTDOWN REWRITE-AOF with {unqueued[:3]} not queued ({len(unqueued)} jobs)"
                )

    async def _admin_replace(self, i: int, start: float) -> None:
        """The operator replaces node i: CLUSTER RESET HARD (every job and
        node forgotten, a new ID), FORGET of the old ID on every other node,
        MEET."""
        world = self.world
        if world.count < 2:
            return
        node = world.nodes[i]
        old = node.server.node.node_id
        self.disturbed[i] += 1
        # flushed() sees it run (now, later or never) and marks i replaced.
        self.resetting[i] = (old, node.incarnation)
        split = world.split_begin(i)
        reply = await self.call(i, "CLUSTER", "RESET", "HARD")
        if text(reply).startswith(("MISCONF", "ERR could not write")) and (world.disk_failures[i]):
            # Its disk fails: nothing was reset (MISCONF judged by call).
            self.resetting.pop(i, None)
            world.split_watch(split)
            return
        if text(reply) != "OK":
            self.violate(f"absurd: n{i} CLUSTER RESET HARD answered {text(reply)!r}")
            return
        for j in world.up_indexes():
            if j == i:
                continue
            with trio.move_on_after(CALL_TIMEOUT_S):
                try:
                    await self.call(j, "CLUSTER", "FORGET", old)
                    self.probe("admin-forget")
                except Unknown:
                    pass
        others = [j for j in world.up_indexes() if j != i]
        if others:
            other = world.nodes[self.admin_rng.choice(others)]
            await self.call(i, "CLUSTER", "MEET", "127.0.0.1", other.port)
            self.probe("admin-meet")
        world.split_watch(split)
        self.disturbed[i] += 1
