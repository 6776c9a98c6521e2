"""The workload a plan asks for, in three phases.

* safety: producers ADDJOB (a mix of REPLICATE, RETRY incl. 0, ASYNC,
  DELAY, short TTL; optionally one more producer pinned to each node; one
  producer pipelines synchronous ADDJOBs in two windows, the second sent
  while the first waits for its copies),
  consumers GETJOB then ACKJOB / FASTACK / NACK / WORKING or forget the
  job; some hold a job past its RETRY sending WORKING, ack on another node
  or over a fresh connection, hand a job to another consumer who acks it,
  or drop their connection with the job unacked; some NACK or ENQUEUE a job
  with a DELAY (RETRY 0 ones too: refused), maybe after holding it past its
  RETRY; waiters call WAITJOB on jobs added (mostly on the job's creator);
  the plan's faults run meanwhile;
* liveness: every fault undone, every node back, membership must converge;
* drain and settle: consumers take every job still owed until each one's
  last delivery is acked (with ``plan.coda``, then a few seconds of new
  jobs in the healed cluster, a patient consumer blocked on one node, and
  a second drain; with ``plan.failover_crash``, then a node crashed with a
  backlog of long RETRY jobs queued, restarted before or after FAIL, and a
  third drain), then the cluster is left alone so acks are collected
  everywhere.

With ``plan.long_retry_pct``, some producer jobs (and four per node as the
safety phase begins) have a RETRY longer than the time to FAIL, on a queue
a slow consumer takes, so that a node cut off has a backlog of them: what
the survivors do with it is the fail-over's doing (sim/world.py,
failover-timely). A consumer holding a job with WORKING moves to another
node when its own goes down, as the real client does.

Every operation lands in the history as (virtual time, client, op, data).
"""

from __future__ import annotations

import random
import time
from typing import Any

import attrs
import trio

from disque_trio.core.ids import creator_prefix
from disque_trio.protocol.replies import ReplyError, Status
from disque_trio.server.connections import READER_GRACE_REPL_S
from disque_trio.testing import RespClient

from . import buggify
from .explore import Explorer
from .faults import FAILOVER_WAIT_S, detection_bound, heal_all, run_faults
from .plan import Plan
from .world import FAILOVER_S, INCARNATION_KNOWN_S, World

QUEUE = "q"
ADD_TIMEOUT_MS = 1000
CONVERGE_S = 30.0
CODA_S = 4.0  # the calm coda's producing time (plan.coda)
# A drain that outlasts its timeout goes on while the consumers still take
# owed jobs: one owed job delivered or acked every DRAIN_PROGRESS_S at least,
# for at most DRAIN_EXTRA_S more (sim/world.py's VIRTUAL_SLACK_S counts it
# for both drains). One consumer facing 40 ms of latency takes a job every
# 0.2 s: 332 jobs owed needed more than the 40 s (seed 94617).
DRAIN_PROGRESS_S = 10.0
DRAIN_EXTRA_S = 60.0
# A job owed that no node has held for this long plus its RETRY no longer
# holds the drain back (Workload._forget_gone).
DRAIN_GONE_S = 10.0
CODA_HOLD_PCT = 30  # deliveries held with WORKING in the coda, at least
PATIENT_TIMEOUT_MS = 10_000  # the coda's patient consumer's GETJOB TIMEOUT
# The RETRY of the plan's long jobs (plan.long_retry_pct): longer than the
# time the cluster takes to flag a lost node FAIL, so that what the
# survivors do with its jobs is the fail-over's doing, not their RETRY's
# (failover-timely). Their consumers always ack them, after working on them
# for up to LONG_WORK_S (no WORKING needed): a forgotten one would hold the
# drain for its RETRY.
LONG_RETRY_S = (20, 40)
LONG_WORK_S = (0.2, 6.0)
# They go to a queue of their own, which one consumer takes slowly in the
# safety phase (a job every LONG_TAKE_S, with GETJOB NOHANG on a node at
# random): every node has a backlog of them when a fault cuts it off. Once
# the producers stop, it takes LONG_DRAIN_COUNT every LONG_DRAIN_S.
LONG_QUEUE = "ql"
LONG_BACKLOG = 4  # long RETRY jobs added on each node as the safety phase begins
# The calm fail-over phase (plan.failover_crash): the backlog waits this
# long before the crash (its holders heard of it), and a node restarted
# before FAIL is down this long.
FAILOVER_QUEUED_S = 1.5
FAILOVER_DOWN_S = 1.0
LONG_TAKE_S = (1.0, 3.0)
LONG_DRAIN_S = 0.05
LONG_DRAIN_COUNT = 4
# The pipelining producer sends its second window this long after the first
# (past the grace after which a connection's reader takes the input from a
# waiting ADDJOB), and expects every reply at most UNANSWERED_S after every
# fault is healed and every node is back (its ADDJOBs time out in 1 s).
PIPELINE_GAP_S = 2 * READER_GRACE_REPL_S
UNANSWERED_S = 5.0
WAITJOB_ANSWERS = {"acked", "gone", "unknown", "pending"}
# What a client sees when its node crashes or refuses it.
CONN_ERRORS = (
    EOFError,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


@attrs.define
class Event:
    t: float
    client: str
    op: str  # "invoke" | "add" | "get" | "ack" | "nack" | "error"
    data: dict[str, Any]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ReplyError):
        return str(value)
    return str(value)


def _sync_invoke(index: int, body: str, retry: int, copies: int) -> dict[str, Any]:
    """The record of a synchronous ADDJOB with no DELAY or TTL."""
    return {
        "node": index,
        "body": body,
        "retry": retry,
        "copies": copies,
        "async": False,
        "delay": 0,
        "ttl": 0,
    }


def _alone(world: World, index: int) -> bool:
    """The node in slot ``index`` is up and knows no other member."""
    node = world.nodes[index]
    return node.up and node.server.node.cluster_size <= 1


def _leaving(world: World, index: int) -> bool:
    """The node in slot ``index`` is up and told CLUSTER LEAVING yes."""
    node = world.nodes[index]
    return node.up and node.server.node.leaving


@attrs.define
class Workload:
    plan: Plan
    drain_timeout: float = 40.0
    settle: float = 20.0
    history: list[Event] = attrs.field(factory=list)
    drained: bool = False
    converged: list[str] = attrs.field(factory=list)  # membership problems after heal
    safety_speed: float = 0.0  # simulated / wall seconds of the safety phase
    _world: World | None = None
    _stop_producing: trio.Event = attrs.field(factory=trio.Event)
    _consumers_on: trio.Event = attrs.field(factory=trio.Event)
    # Bodies of RETRY > 0 jobs added OK and not yet delivered; the drain
    # ends when it is empty.
    _undelivered: set[str] = attrs.field(factory=set)
    _delivered: set[str] = attrs.field(factory=set)
    _all_delivered: trio.Event = attrs.field(factory=trio.Event)
    _retry_of: dict[str, int] = attrs.field(factory=dict)  # job id -> RETRY (added OK)
    _paused_node: int | None = None  # a node whose queue may still be paused in
    explorer: Explorer | None = None  # sim/explore.py, when the plan runs it
    # RETRY > 0 jobs without a TTL, added OK, whose last delivery (if any)
    # has no ack attempt yet: the drain also waits for it to empty.
    _owed: set[str] = attrs.field(factory=set)
    _paid: int = 0  # jobs gone from _undelivered or _owed: the drain's progress
    _tracked: set[str] = attrs.field(factory=set)
    _acked_ids: set[str] = attrs.field(factory=set)
    acked_all: bool = False
    _shared: list[tuple[str, str]] = attrs.field(factory=list)  # (consumer, job id)
    _nursery: trio.Nursery | None = None  # the consumers' (hold tasks run there)
    _coda: bool = False  # the calm coda is on: consumers act as in the safety phase
    _healed: trio.Event = attrs.field(factory=trio.Event)  # faults undone, nodes back
    _added_ids: list[str] = attrs.field(factory=list)  # job ids ADDJOB answered, in order
    _in_hand: dict[str, None] = attrs.field(factory=dict)  # delivered, no ack yet (in order)
    _acked_order: list[str] = attrs.field(factory=list)  # ack attempts, in order
    _long_go: trio.Event = attrs.field(factory=trio.Event)  # the long consumer may take jobs
    _body_id: dict[str, str] = attrs.field(factory=dict)  # body -> job id (added OK)
    _body_of: dict[str, str] = attrs.field(factory=dict)  # job id -> body (added OK)

    def record(self, client: str, op: str, data: dict[str, Any]) -> None:
        assert self._world is not None
        self.history.append(Event(trio.current_time(), client, op, data))
        self._world.trace.record(client, "client", {"op": op, **data})
        if self.explorer is not None:
            self.explorer.on_record(op, data)
        if op == "add" and data["ok"]:
            self._retry_of[data["reply"]] = data["retry"]
            self._body_id[data["body"]] = data["reply"]
            self._body_of[data["reply"]] = data["body"]
            self._added_ids.append(data["reply"])
            if data["retry"] and not data.get("ttl"):
                self._tracked.add(data["reply"])
                if data["reply"] not in self._acked_ids:
                    self._owed.add(data["reply"])
            if data["retry"] and not data["async"] and data["copies"] > 1:
                self._world.watch_holders(data["reply"])
        if op == "add" and data["ok"] and data["retry"] > 0 and not data.get("ttl"):
            if data["body"] not in self._delivered:
                self._undelivered.add(data["body"])
        elif op == "get":
            self._in_hand.pop(data["id"], None)
            self._in_hand[data["id"]] = None
            self._delivered.add(data["body"])
            if data["body"] in self._undelivered:
                self._undelivered.discard(data["body"])
                self._paid += 1
            if data["id"] in self._tracked and data["id"] not in self._acked_ids:
                self._owed.add(data["id"])
        elif op == "ack" and not data.get("noop"):
            self._in_hand.pop(data["id"], None)
            self._acked_order.append(data["id"])
            if data["id"] in self._owed:
                self._owed.discard(data["id"])
                self._paid += 1
            self._acked_ids.add(data["id"])
        if self._stop_producing.is_set() and not self._undelivered and not self._owed:
            self._all_delivered.set()

    def _sending(self, jid: str) -> float:
        """A NACK, ENQUEUE or WORKING for ``jid`` is sent now: the World
        counts it from now (``commands_at``), not from its answer, so that
        a check judging the job meanwhile stands aside (seed 3723: another
        consumer's ENQUEUE DELAY taken, its answer 0.4 ms from its client
        when nack-delay-told judged the first one's). Its send time."""
        assert self._world is not None
        t0 = trio.current_time()
        self._world.commands_at.setdefault(jid, []).append(t0)
        return t0

    async def __call__(self, world: World) -> None:
        plan = self.plan
        self._world = world
        self._stop_producing = trio.Event()
        self._all_delivered = trio.Event()
        self._consumers_on = trio.Event()
        self._consumers_on.set()
        self._healed = trio.Event()
        self._long_go = trio.Event()
        self._long_go.set()
        rngs = [world.child_rng() for _ in range(plan.producers + plan.consumers + 1)]
        if plan.explore or plan.admin_mask:
            self.explorer = Explorer(world, plan, self.record, self._stop_producing)
        start = trio.current_time()
        wall_start = time.perf_counter()  # for speed reports only, not traced
        world.trace.record("workload", "phase", {"ev": "safety"})
        world.phase = "safety"
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for i in range(plan.consumers):
                rng = rngs[plan.producers + i]
                nursery.start_soon(self._consumer, world, f"c{i}", i % world.count, rng)
            async with trio.open_nursery() as producers:
                for i in range(plan.producers):
                    producers.start_soon(self._producer, world, f"p{i}", rngs[i])
                if plan.pinned_producers:
                    for i in range(world.count):
                        rng = world.child_rng()
                        producers.start_soon(self._producer, world, f"pn{i}", rng, i)
                producers.start_soon(self._pipeliner, world, "pp", world.child_rng())
                for i in range(plan.waiters):
                    # Until the consumers stop: the drain's acks, in a
                    # healed cluster, are where WAITJOB's bound is checked.
                    nursery.start_soon(self._waiter, world, f"w{i}", world.child_rng())
                if plan.long_retry_pct:
                    nursery.start_soon(self._long_consumer, world, "lc", world.child_rng())
                    producers.start_soon(self._long_backlog, world, "pl", world.child_rng())
                if plan.consumer_pause:
                    producers.start_soon(self._pause_consumers, start)
                if plan.pause_in:
                    producers.start_soon(self._pause_queue, world, start, rngs[-1])
                if self.explorer is not None:
                    producers.start_soon(self.explorer.run, start)
                if plan.rewrite_often:
                    producers.start_soon(
                        buggify.rewrite_often, world, start + plan.duration, self.explorer
                    )
                with trio.move_on_at(start + plan.duration):
                    await run_faults(world, plan.active_faults(), start)
                    await trio.sleep_forever()
                self._stop_producing.set()
                self.safety_speed = (trio.current_time() - start) / max(
                    1e-9, time.perf_counter() - wall_start
                )
                # Liveness phase: faults off (a producer may be waiting on a
                # frozen node), every node back.
                world.trace.record("workload", "phase", {"ev": "liveness"})
                world.phase = "liveness: heal and restart"
                await heal_all(world)
                self._healed.set()
            # Every producer has its last ADDJOB answer.
            self._consumers_on.set()
            world.phase = "liveness: mesh"
            await world.mesh(CONVERGE_S)
            await self._resume_queue(world)
            if self.explorer is not None:
                await self.explorer.liveness()
            world.phase = "liveness: forget wiped ids"
            await world.forget_wiped()
            world.trace.record("workload", "phase", {"ev": "drain"})
            self.record("workload", "phase", {"ev": "drain"})
            world.phase = "drain"
            await self._drain()
            if plan.coda:
                await self._run_coda(world)
            if plan.failover_crash and plan.long_retry_pct and world.count > 1:
                await self._run_failover(world)
            # Every job delivered once (as before), and each one's last
            # delivery acked (a forgotten job delivered again).
            self.drained = not self._undelivered
            self.acked_all = not self._owed
            self.record("workload", "phase", {"ev": "settle", "owed": sorted(self._owed)})
            world.trace.record("workload", "phase", {"ev": "settle", "drained": self.drained})
            nursery.cancel_scope.cancel()
        world.phase = "settle"
        await trio.sleep(self.settle)
        self.converged = world.converged()
        world.trace.record("workload", "phase", {"ev": "end", "converged": not self.converged})

    async def _run_coda(self, world: World) -> None:
        """A calm coda: every fault healed, a producer adds jobs (RETRY > 0,
        no TTL) for a few seconds and the consumers do all they do in the
        safety phase (hold, NACK, ack elsewhere, forget...), so that the
        timing checks see each path without faults; then drain again."""
        self.record("workload", "phase", {"ev": "coda"})
        world.phase = "coda"
        rng = world.child_rng()
        if world.count < 2:
            await self._coda_jobs(world, rng, None)
            return
        # A patient consumer blocks on one node the whole coda, while the
        # jobs are added on the others: each must reach it promptly
        # (federation-prompt), however long it has waited.
        patient = rng.randrange(world.count)
        async with trio.open_nursery() as coda:
            coda.start_soon(self._patient, world, patient)
            world.watch_federation(QUEUE)
            try:
                await self._coda_jobs(world, rng, patient)
            finally:
                world.watch_federation(None)
                coda.cancel_scope.cancel()

    async def _coda_jobs(self, world: World, rng: random.Random, patient: int | None) -> None:
        """The coda's producing (on any node but ``patient``'s), then its drain."""
        self._coda = True
        n = 0
        end = trio.current_time() + CODA_S
        clients: dict[int, RespClient] = {}
        others = [i for i in range(world.count) if i != patient]
        try:
            while trio.current_time() < end:
                index = rng.choice(others)
                body = f"coda-{n}"
                n += 1
                retry = rng.randint(1, 3)
                copies = rng.randint(1, self.plan.max_replicate)
                invoke = _sync_invoke(index, body, retry, copies)
                self.record("coda", "invoke", invoke)
                try:
                    client = clients.get(index)
                    if client is None:
                        client = clients[index] = await world.client(index)
                    reply: Any = await client.call(
                        "ADDJOB", QUEUE, body, ADD_TIMEOUT_MS, "REPLICATE", copies, "RETRY", retry
                    )
                except CONN_ERRORS as e:
                    clients.pop(index, None)
                    reply = f"connection error: {type(e).__name__}"
                ok = isinstance(reply, Status | bytes) and _text(reply).startswith("D-")
                self.record("coda", "add", {**invoke, "ok": ok, "reply": _text(reply)})
                await trio.sleep(rng.uniform(0.1, 0.3))
        finally:
            self._coda = False
            for client in clients.values():
                await client.aclose()
        world.phase = "drain after coda"
        await self._drain()

    async def _run_failover(self, world: World) -> None:
        """A calm fail-over phase (``plan.failover_crash``): a backlog of
        long RETRY jobs on every node, the long consumer held back; a node
        crashes, and is restarted 1 s later (1: before FAIL, its new
        incarnation is the loss) or once the others flag it FAIL and their
        fail-over is due (2); failover-timely and failover-once judge what
        the survivors did with its backlog, then the consumer takes it all
        (a drain). The faults of the safety phase seldom leave a holder
        undisturbed around a crash: here every one is."""
        self.record("workload", "phase", {"ev": "failover"})
        world.phase = "failover"
        # Jobs still owed now were so through both drains (lost to a crash,
        # an excused loss): this phase does not wait for them again.
        owed, undelivered = set(self._owed), set(self._undelivered)
        self._long_go = trio.Event()
        await self._long_backlog(world, "pf", world.child_rng())
        # Queued there long enough for the other holders to know.
        await trio.sleep(FAILOVER_QUEUED_S)
        victim = self.plan.seed % world.count
        node = world.nodes[victim]
        bound = detection_bound(self.plan.node_timeout_ms)
        if node.up:
            window = world.fault_begin(victim, "crash")
            world.watch_failover(victim, window, "crash", bound + FAILOVER_WAIT_S)
            try:
                with trio.CancelScope(shield=True):
                    await world.crash(victim)
                if self.plan.failover_crash == 1:
                    await trio.sleep(FAILOVER_DOWN_S)
                else:
                    with trio.move_on_after(bound):
                        while not world.flagged_fail(victim):  # noqa: ASYNC110
                            await trio.sleep(0.1)
                    await trio.sleep(FAILOVER_S + 1)
                with trio.CancelScope(shield=True):
                    if not node.up:
                        await world.restart(victim)
            finally:
                world.fault_end(window)
            if self.plan.failover_crash == 1:
                # The deadline of a restart before FAIL.
                await trio.sleep(INCARNATION_KNOWN_S + FAILOVER_S + 1)
        self._long_go.set()
        world.phase = "drain after failover"
        with trio.move_on_after(self.drain_timeout):
            while self._owed - owed or self._undelivered - undelivered:  # noqa: ASYNC110
                await trio.sleep(0.2)

    async def _patient(self, world: World, index: int) -> None:
        """The coda's patient consumer: GETJOB with a long TIMEOUT on node
        ``index`` (where the coda adds nothing), in a loop, acking each job
        it gets there; on until cancelled (the coda's drain is over)."""
        name = "patient"
        client: RespClient | None = None
        try:
            while True:
                try:
                    if client is None:
                        client = await world.client(index)
                    called = trio.current_time()
                    reply = await client.call(
                        "GETJOB", "TIMEOUT", PATIENT_TIMEOUT_MS, "COUNT", 1, "FROM", QUEUE
                    )
                    if not isinstance(reply, list):
                        world.check_disk_answer(index, None, _text(reply))
                        await trio.sleep(0.2)  # -LEAVING, or an error
                        continue
                    for _queue, job_id, body in reply:
                        jid, text = _text(job_id), _text(body)
                        data = {"node": index, "id": jid, "body": text, "t0": called}
                        self.record(name, "get", data)
                        await self._ack(world, client, name, index, jid, False)
                except CONN_ERRORS as e:
                    self.record(name, "error", {"node": index, "error": type(e).__name__})
                    client = None
                    await trio.sleep(0.2)
        finally:
            if client is not None:
                await client.aclose()

    async def _drain(self) -> None:
        """Wait until every job owed is delivered and its last delivery
        acked: ``drain_timeout``, then on while the consumers make progress
        (DRAIN_PROGRESS_S, DRAIN_EXTRA_S). A job lost stays owed, and is
        reported once the others are done or the extra time is up."""
        # Afresh: an answer that came in while producers were stopping may
        # have set it before the last jobs were added.
        self._all_delivered = trio.Event()
        if not self._undelivered and not self._owed:
            self._all_delivered.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._forget_gone)
            with trio.move_on_after(self.drain_timeout):
                await self._all_delivered.wait()
            give_up = trio.current_time() + DRAIN_EXTRA_S
            while not self._all_delivered.is_set() and trio.current_time() < give_up:
                paid = self._paid
                with trio.move_on_after(DRAIN_PROGRESS_S):
                    await self._all_delivered.wait()
                if self._paid == paid:
                    break
            nursery.cancel_scope.cancel()

    async def _forget_gone(self) -> None:
        """The drain's jobs that no node holds any more (lost to a crash or
        a flush, or acked by an ack whose answer was lost) stop holding it
        back once gone for ``DRAIN_GONE_S`` and their RETRY (a copy still on
        its way, a re-queue due): nothing can deliver them, and waiting the
        drain's timeout out for them was most of the CPU of the runs that
        had one. The checks judge them as before, from the history."""
        assert self._world is not None
        world = self._world
        gone_since: dict[str, float] = {}
        while True:
            await trio.sleep(1.0)
            if not all(n.up for n in world.nodes):
                gone_since.clear()
                continue
            now = trio.current_time()
            waiting = self._owed | {self._body_id[b] for b in self._undelivered}
            for jid in list(gone_since.keys() - waiting):
                del gone_since[jid]
            for jid in sorted(waiting):  # sorted: a set's order moves with the hash seed
                if any(jid in n.server.node.jobs for n in world.nodes):
                    gone_since.pop(jid, None)
                    continue
                since = gone_since.setdefault(jid, now)
                if now - since < DRAIN_GONE_S + self._retry_of.get(jid, 0):
                    continue
                del gone_since[jid]
                self._owed.discard(jid)
                self._undelivered.discard(self._body_of.get(jid, ""))
                self.record("workload", "gone", {"id": jid})

    async def _pause_consumers(self, start: float) -> None:
        await trio.sleep_until(start + self.plan.duration * 0.3)
        self._consumers_on = trio.Event()
        assert self._world is not None
        self._world.trace.record("workload", "phase", {"ev": "consumers-off"})
        self.record("workload", "consumers-off", {})
        await trio.sleep(self.plan.consumer_pause)
        self._consumers_on.set()
        self.record("workload", "consumers-on", {})

    async def _pause_queue(self, world: World, start: float, rng: random.Random) -> None:
        """One node pauses the queue in input (no BCAST), then resumes it."""
        await trio.sleep_until(start + self.plan.duration * 0.25)
        index = rng.randrange(world.count)
        self._paused_node = index  # the PAUSE may apply even if its reply is lost
        if await self._admin_pause(world, index, "in"):
            await trio.sleep(self.plan.pause_in)
            await self._admin_pause(world, index, "none")

    async def _resume_queue(self, world: World) -> None:
        """Liveness: an operator whose resume was lost to a fault (a reset,
        a crash) resumes the queue once everything is healed."""
        if self._paused_node is not None:
            with trio.move_on_after(5):
                await self._admin_pause(world, self._paused_node, "none")

    async def _admin_pause(self, world: World, index: int, how: str) -> bool:
        """PAUSE q <how> on one node; False if a fault got in the way."""
        try:
            client = await world.client(index)
            try:
                reply = await client.call("PAUSE", QUEUE, how)
            finally:
                await client.aclose()
        except CONN_ERRORS as e:
            self.record("admin", "error", {"node": index, "error": type(e).__name__})
            return False
        self.record(
            "admin", "pause" if how == "in" else "resume", {"node": index, "reply": _text(reply)}
        )
        if how == "none":
            self._paused_node = None
        return True

    async def _producer(
        self, world: World, name: str, rng: random.Random, pinned: int | None = None
    ) -> None:
        plan = self.plan
        clients: dict[int, RespClient] = {}
        n = 0
        while not self._stop_producing.is_set():
            index = rng.randrange(world.count) if pinned is None else pinned
            body = f"{name}-{n}"
            n += 1
            retry = 0 if rng.randrange(100) < plan.retry0_pct else rng.randint(1, 3)
            # At-most-once (RETRY 0) takes REPLICATE 1, as in Disque.
            copies = rng.randint(1, plan.max_replicate) if retry else 1
            args: list[Any] = ["REPLICATE", copies, "RETRY", retry]
            is_async = rng.randrange(100) < plan.async_pct
            delay = rng.randint(1, 3) if rng.randrange(100) < plan.delay_pct else 0
            ttl = rng.randint(4 + delay, 15) if rng.randrange(100) < plan.ttl_pct else 0
            if retry and plan.short_pct and rng.randrange(100) < plan.short_pct:
                # Short RETRY and TTL: timers fire within the safety phase.
                retry, ttl = 1, rng.randint(3 + delay, 6 + delay)
                args[3] = retry
            queue = QUEUE
            if retry and plan.long_retry_pct and rng.randrange(100) < plan.long_retry_pct:
                # Longer than the time to FAIL, on a queue with a backlog:
                # a lost node's queued jobs run at the survivors' fail-over,
                # not at their RETRY.
                retry, ttl, queue = rng.randint(*LONG_RETRY_S), 0, LONG_QUEUE
                # Two copies at least (whatever the plan's cap): a survivor to
                # take it over.
                least = min(2, plan.nodes)
                copies = rng.randint(least, max(least, plan.max_replicate))
                args[1], args[3] = copies, retry
            if is_async:
                args.append("ASYNC")
            if delay:
                args += ["DELAY", delay]
            if ttl:
                args += ["TTL", ttl]
                if retry >= ttl:
                    args[3] = retry = 1
            invoke = {
                "node": index,
                "body": body,
                "retry": retry,
                "copies": copies,
                "async": is_async,
                "delay": delay,
                "ttl": ttl,
            }
            self.record(name, "invoke", invoke)
            try:
                client = clients.get(index)
                if client is None:
                    client = clients[index] = await world.client(index)
                reply: Any = await client.call("ADDJOB", queue, body, ADD_TIMEOUT_MS, *args)
            except CONN_ERRORS as e:
                # Unknown outcome: the job may exist (not OK, so not checked
                # for loss; a delivery of it is still legal).
                clients.pop(index, None)
                reply = f"connection error: {type(e).__name__}"
            ok = isinstance(reply, Status | bytes) and _text(reply).startswith("D-")
            self.record(name, "add", {**invoke, "ok": ok, "reply": _text(reply)})
            world.check_disk_answer(index, _text(reply) if ok else None, _text(reply))
            await trio.sleep(rng.uniform(0.05, 0.2) * (1 if pinned is None else 3))

    async def _pipeliner(self, world: World, name: str, rng: random.Random) -> None:
        """Synchronous ADDJOBs pipelined in two windows on one connection:
        the second goes out while the first waits for its copies. Every
        reply must come (an ADDJOB times out in 1 s): a reply still missing
        UNANSWERED_S after every fault is healed is recorded as
        ``unanswered`` (sim/checkers.py, check_answered)."""
        client: RespClient | None = None
        index = 0
        n = 0
        while not self._stop_producing.is_set():
            if client is None:
                index = rng.randrange(world.count)
            windows = [rng.randint(1, 2), rng.randint(1, 2)]
            sent: list[dict[str, Any]] = []
            try:
                if client is None:
                    client = await world.client(index)
                for w, size in enumerate(windows):
                    if w:
                        await trio.sleep(PIPELINE_GAP_S)
                    for _ in range(size):
                        retry = rng.randint(1, 3)
                        copies = rng.randint(2, max(2, self.plan.max_replicate))
                        invoke = _sync_invoke(index, f"{name}-{n}", retry, copies)
                        n += 1
                        self.record(name, "invoke", invoke)
                        sent.append(invoke)
                        await client.send(
                            "ADDJOB", QUEUE, invoke["body"], ADD_TIMEOUT_MS,
                            "REPLICATE", copies, "RETRY", retry,
                        )  # fmt: skip
                answered = await self._replies(world, client, name, index, sent)
            except CONN_ERRORS as e:
                # Node down or refusing: try another one after the pause
                # (never straight away: a refused connect takes no time).
                client = None
                error = f"connection error: {type(e).__name__}"
                for invoke in sent:
                    self.record(name, "add", {**invoke, "ok": False, "reply": error})
            else:
                if not answered:
                    await client.aclose()
                    client = None
            # A few rounds a second: it is there for the two windows, not
            # for load (the other producers make that).
            await trio.sleep(rng.uniform(0.3, 0.6))
        if client is not None:
            await client.aclose()

    async def _replies(
        self,
        world: World,
        client: RespClient,
        name: str,
        index: int,
        sent: list[dict[str, Any]],
    ) -> bool:
        """Read the reply of each pipelined ADDJOB of ``sent``, in order;
        False (and an ``unanswered`` record) if some never came."""
        waited = 0.0
        while sent:
            with trio.move_on_after(0.5) as scope:
                reply: Any = await client.read()
            if not scope.cancelled_caught:
                ok = isinstance(reply, Status | bytes) and _text(reply).startswith("D-")
                self.record(name, "add", {**sent.pop(0), "ok": ok, "reply": _text(reply)})
                world.check_disk_answer(index, _text(reply) if ok else None, _text(reply))
                continue
            if self._healed.is_set():
                waited += 0.5
                if waited >= UNANSWERED_S:
                    self.record(
                        name,
                        "unanswered",
                        {"node": index, "count": len(sent), "bodies": [i["body"] for i in sent]},
                    )
                    for invoke in sent:
                        self.record(name, "add", {**invoke, "ok": False, "reply": "no reply"})
                    return False
        return True

    async def _consumer(self, world: World, name: str, index: int, rng: random.Random) -> None:
        client: RespClient | None = None
        while True:
            await self._consumers_on.wait()
            try:
                if client is None:
                    client = await world.client(index)
                if any(who != name or self._stop_producing.is_set() for who, _ in self._shared):
                    await self._ack_shared(world, client, name, index)
                called = trio.current_time()
                reply = await client.call("GETJOB", "TIMEOUT", 200, "COUNT", 1, "FROM", QUEUE)
                if isinstance(reply, ReplyError):
                    world.check_disk_answer(index, None, _text(reply))
                    await trio.sleep(0.2)  # -LEAVING: this node is leaving the cluster
                if not isinstance(reply, list) or not reply:
                    continue
                conn = client
                for _queue, job_id, body in reply:
                    jid, text = _text(job_id), _text(body)
                    self.record(
                        name, "get", {"node": index, "id": jid, "body": text, "t0": called}
                    )
                    if await self._handle(world, conn, name, index, jid, rng):
                        # Vanished: the connection goes, the job unacked.
                        client = None
                        await conn.aclose()
                        await trio.sleep(rng.uniform(0.1, 0.5))
                        break
            except CONN_ERRORS as e:
                # Its node crashed: consume from another node meanwhile.
                self.record(name, "error", {"node": index, "error": type(e).__name__})
                client = None
                index = (index + 1) % world.count
                await trio.sleep(rng.uniform(0.1, 0.3))

    async def _long_backlog(self, world: World, name: str, rng: random.Random) -> None:
        """``LONG_BACKLOG`` long RETRY jobs added on each node at once, with
        three copies at least where there are nodes enough (two holders to
        take it over: failover-once): a backlog on every node from the
        start."""
        for n in range(LONG_BACKLOG * world.count):
            index = n % world.count
            retry = rng.randint(*LONG_RETRY_S)
            least = min(3, world.count)
            copies = rng.randint(least, max(least, self.plan.max_replicate))
            invoke = {**_sync_invoke(index, f"{name}-{n}", retry, copies), "queue": LONG_QUEUE}
            self.record(name, "invoke", invoke)
            try:
                client = await world.client(index)
                try:
                    reply: Any = await client.call(
                        "ADDJOB", LONG_QUEUE, invoke["body"], ADD_TIMEOUT_MS,
                        "REPLICATE", copies, "RETRY", retry,
                    )  # fmt: skip
                finally:
                    await client.aclose()
            except CONN_ERRORS as e:
                reply = f"connection error: {type(e).__name__}"
            ok = isinstance(reply, Status | bytes) and _text(reply).startswith("D-")
            self.record(name, "add", {**invoke, "ok": ok, "reply": _text(reply)})

    async def _long_consumer(self, world: World, name: str, rng: random.Random) -> None:
        """The long RETRY jobs' consumer: now and then one job, with GETJOB
        NOHANG on a node at random (no NEEDJOBS: jobs wait where they were
        queued), worked on and acked (``_work``)."""
        clients: dict[int, RespClient] = {}
        while True:
            await self._consumers_on.wait()
            await self._long_go.wait()
            draining = self._stop_producing.is_set()
            await trio.sleep(LONG_DRAIN_S if draining else rng.uniform(*LONG_TAKE_S))
            index = rng.randrange(world.count)
            count = LONG_DRAIN_COUNT if draining else 1
            try:
                client = clients.get(index)
                if client is None:
                    client = clients[index] = await world.client(index)
                called = trio.current_time()
                reply = await client.call("GETJOB", "NOHANG", "COUNT", count, "FROM", LONG_QUEUE)
            except CONN_ERRORS as e:
                self.record(name, "error", {"node": index, "error": type(e).__name__})
                clients.pop(index, None)
                continue
            for _queue, job_id, body in reply if isinstance(reply, list) else ():
                jid, text = _text(job_id), _text(body)
                self.record(name, "get", {"node": index, "id": jid, "body": text, "t0": called})
                try:
                    await self._handle(world, client, name, index, jid, rng)
                except CONN_ERRORS as e:
                    # Its ack met a reset (recorded by _ack): the job comes
                    # back at its RETRY (seed 729 ended the run here).
                    self.record(name, "error", {"node": index, "error": type(e).__name__})
                    clients.pop(index, None)
                    break

    async def _ack_shared(self, world: World, client: RespClient, name: str, index: int) -> None:
        """Ack a job another consumer handed over (it knows only the ID),
        on this consumer's own node."""
        # Its own only once producers stopped (maybe no other consumer).
        pick = next((k for k, (who, _) in enumerate(self._shared) if who != name), 0)
        _who, jid = self._shared.pop(pick)
        await self._ack(world, client, name, index, jid, False)
        if _who != name:
            world.probes["acked-by-other-consumer"] += 1

    async def _handle(
        self,
        world: World,
        client: RespClient,
        name: str,
        index: int,
        jid: str,
        rng: random.Random,
    ) -> bool:
        """What the consumer does with a job: forget it (redelivered after
        RETRY), vanish with it, NACK it, hand it to another consumer, hold
        it past RETRY, WORKING then ack, or ack (ACKJOB or FASTACK, maybe
        on another node). True: the consumer drops its connection."""
        plan = self.plan
        draining = self._stop_producing.is_set() and not self._coda
        # A RETRY 0 job is NACKed and ENQUEUEd too (below): the node must
        # refuse (at most once, whatever a client sends; the original's
        # enqueueJob does). Only RETRY > 0 jobs vanish with their consumer.
        again = self._retry_of.get(jid, 0) > 0
        # A long RETRY job is always acked (after some work): forgotten, it
        # would hold the drain for its RETRY.
        long = self._retry_of.get(jid, 0) >= LONG_RETRY_S[0]
        # A RETRY 0 job may be forgotten too: it stays delivered, never
        # queued again (a node reloading it from its AOF must not either).
        if (
            jid in self._retry_of
            and not long
            and not draining
            and rng.randrange(100) < plan.noack_pct
        ):
            self.record(name, "forget", {"node": index, "id": jid})
            return False
        if (
            again
            and not long
            and not draining
            and plan.vanish_pct
            and rng.randrange(100) < plan.vanish_pct
        ):
            self.record(name, "vanish", {"node": index, "id": jid})
            world.probes["consumer-vanished"] += 1
            return True
        for cmd, pct in (("NACK", plan.nack_delay_pct), ("ENQUEUE", plan.enqueue_delay_pct)):
            # RETRY 0 jobs more often: each must be refused (at most once).
            share = pct if again else min(100, 3 * pct)
            if pct and jid in self._retry_of and not draining and rng.randrange(100) < share:
                if await self._delayed(world, client, name, index, jid, rng, cmd):
                    return False
                break  # refused (a delivered RETRY 0 job, or queued again meanwhile)
        if again and not draining and rng.randrange(100) < plan.nack_pct:
            called = self._sending(jid)
            reply = await client.call("NACK", jid)
            data = {"node": index, "id": jid, "reply": _text(reply), "t0": called}
            self.record(name, "nack", data)
            if _text(reply) == "1":
                world.probes["nack-requeued"] += 1
            return False
        if not again and jid in self._retry_of and not draining:
            # Any plan that NACKs or ENQUEUEs does it to RETRY 0 jobs too.
            share = max(plan.nack_pct, plan.nack_delay_pct, plan.enqueue_delay_pct)
            if share and rng.randrange(100) < share:
                # At most once under every command: NACK or ENQUEUE of a
                # delivered RETRY 0 job answers 0 (retry0-refused), and the
                # job is never delivered again (check, retry0-once).
                cmd = rng.choice(("NACK", "ENQUEUE"))
                called = self._sending(jid)
                reply = await client.call(cmd, jid)
                data = {"node": index, "id": jid, "reply": _text(reply), "t0": called, "retry": 0}
                self.record(name, cmd.lower(), data)
                if _text(reply) == "0":
                    world.probes["retry0-requeue-refused"] += 1
                # Then acked (or forgotten) like any other.
        if again and not draining and plan.share_pct and rng.randrange(100) < plan.share_pct:
            self.record(name, "share", {"node": index, "id": jid})
            self._shared.append((name, jid))
            return False
        if long:
            # Worked on for a few seconds, well within its RETRY (no WORKING
            # needed), then acked: its node told the other holders of the
            # delivery, and a loss of that node meanwhile must not bring
            # the job back early (failover-holds).
            assert self._nursery is not None
            work = rng.uniform(*LONG_WORK_S)
            retry = self._retry_of[jid]
            self._nursery.start_soon(self._work, world, name, index, jid, retry, work)
            return False
        # The calm coda holds jobs in every plan: working-holds wants holds
        # without faults, and a hold past RETRY 2 or 3 (WORKING every
        # RETRY/3 s, beyond the 500 ms WILLQUEUE advance) is where a node
        # that ignored WORKING re-queues.
        hold_pct = max(plan.hold_pct, CODA_HOLD_PCT) if self._coda else plan.hold_pct
        if jid in self._tracked and hold_pct and rng.randrange(100) < hold_pct:
            assert self._nursery is not None
            retry = self._retry_of[jid]
            hold = rng.uniform(1.5, 3.0) * retry
            self._nursery.start_soon(self._hold, world, name, index, jid, retry, hold)
            return False
        await trio.sleep(rng.uniform(0.0, 0.05))
        if rng.randrange(100) < plan.working_pct:
            called = self._sending(jid)
            reply = await client.call("WORKING", jid)
            data = {"node": index, "id": jid, "reply": _text(reply), "t0": called}
            self.record(name, "working", data)
            await trio.sleep(rng.uniform(0.0, 0.5))
        fast = rng.randrange(100) < plan.fastack_pct
        if plan.cross_ack_pct and rng.randrange(100) < plan.cross_ack_pct:
            # Another node (maybe one without the job: a dummy ack), or the
            # same node over a fresh connection. Only a RETRY > 0 job goes
            # to another node: a node without the job makes no dummy ack for
            # an at-most-once ID (it is never re-queued; its holder keeps it
            # until its TTL), as in Disque.
            other = rng.randrange(world.count)
            if not again:
                other = index
            try:
                fresh = await world.client(other)
            except CONN_ERRORS as e:
                self.record(
                    name,
                    "ack",
                    {
                        "node": other,
                        "id": jid,
                        "fast": fast,
                        "reply": f"connection error: {type(e).__name__}",
                    },
                )
                return False
            try:
                world.probes["acked-elsewhere"] += 1
                await self._ack(world, fresh, name, other, jid, fast)
            except CONN_ERRORS:
                pass  # recorded by _ack; this consumer's own link is fine
            finally:
                await fresh.aclose()
            return False
        await self._ack(world, client, name, index, jid, fast)
        return False

    async def _delayed(
        self,
        world: World,
        client: RespClient,
        name: str,
        index: int,
        jid: str,
        rng: random.Random,
        cmd: str,
    ) -> bool:
        """NACK or ENQUEUE the job with a DELAY of 1..5 s (longer than its
        RETRY at times), maybe after holding it past its RETRY first (a copy
        may be queued elsewhere by then: the POSTPONE takes it out). True if
        the node took it (it comes back after the delay); a delivered RETRY
        0 job must be refused (at most once)."""
        retry = self._retry_of[jid]
        late = retry and retry < LONG_RETRY_S[0] and self.plan.late_delay_pct
        if late and rng.randrange(100) < self.plan.late_delay_pct:
            await trio.sleep(rng.uniform(0.8, 2.0) * retry)
        delay = rng.randint(1, 5)
        called = self._sending(jid)
        reply = await client.call(cmd, jid, "DELAY", delay)
        op = cmd.lower()
        data = {"node": index, "id": jid, "reply": _text(reply), "t0": called, "delay": delay}
        self.record(name, op, {**data, "retry": retry})
        if _text(reply) != "1":
            if retry == 0:
                world.probes["retry0-delay-refused"] += 1
            return False
        world.probes[f"{op}-delay-sent"] += 1
        world.watch_postpone(jid, index, called, delay)
        return True

    async def _waiter(self, world: World, name: str, rng: random.Random) -> None:
        """WAITJOB on 1..3 jobs (delivered and not acked yet, added lately,
        or acked lately), on the node that created the first one (its ID
        names it), or now and then on another node; a TIMEOUT of 0.3..4 s.
        Each reply is recorded with the call's start (``t0``) and whether
        each job's creator was asked (``creator``), for sim/checkers.py's
        check_waitjob. Runs until the consumers stop."""
        clients: dict[int, RespClient] = {}
        while True:
            await trio.sleep(rng.uniform(0.05, 0.3))
            r = rng.random()
            if r < 0.5 and self._in_hand:
                recent = list(self._in_hand)[-20:]
            elif r < 0.8 or not self._acked_order:
                recent = self._added_ids[-40:]
            else:
                recent = self._acked_order[-40:]
            if not recent:
                continue
            ids = rng.sample(recent, min(len(recent), rng.randint(1, 3)))
            creators = {node.server.node.node_id[:8]: node.index for node in world.nodes}
            index = creators.get(creator_prefix(ids[0]), -1)
            other = self.plan.wait_other_pct and rng.randrange(100) < self.plan.wait_other_pct
            if index < 0 or other:
                index = rng.randrange(world.count)
            timeout = rng.choice((300, 1000, 2000, 4000))
            data: dict[str, Any] = {
                "node": index,
                "id": ids[0],
                "ids": ids,
                "timeout": timeout,
                "creator": [creators.get(creator_prefix(j)) == index for j in ids],
            }
            data["t0"] = trio.current_time()
            try:
                client = clients.get(index)
                if client is None:
                    client = clients[index] = await world.client(index)
                reply: Any = await client.call("WAITJOB", *ids, "TIMEOUT", timeout)
            except CONN_ERRORS as e:
                clients.pop(index, None)
                reply = f"connection error: {type(e).__name__}"
            if isinstance(reply, list):
                data["reply"] = [_text(x) for x in reply]
                for value in sorted(set(data["reply"]) & WAITJOB_ANSWERS):
                    world.probes[f"waitjob-{value}"] += 1
            else:
                data["reply"] = _text(reply)
            self.record(name, "waitjob", data)

    async def _ack(
        self, world: World, client: RespClient, name: str, index: int, jid: str, fast: bool
    ) -> dict[str, Any]:
        """ACKJOB or FASTACK; a connection lost meanwhile leaves the outcome
        unknown (recorded as such, then raised). The record's data."""
        data: dict[str, Any] = {"node": index, "id": jid, "fast": fast, "t0": trio.current_time()}
        leaving, alone = _leaving(world, index), _alone(world, index)
        try:
            acked = await client.call("FASTACK" if fast else "ACKJOB", jid)
        except CONN_ERRORS as e:
            self.record(name, "ack", {**data, "reply": f"connection error: {type(e).__name__}"})
            raise
        if isinstance(acked, ReplyError):
            world.check_disk_answer(index, None, _text(acked))
        if leaving or _leaving(world, index):
            # CLUSTER LEAVING yes when sent or answered: the node makes no
            # dummy ack for an ID it does not hold (ack-final's business).
            data["leaving"] = True
        if not fast and acked == 0 and (alone or _alone(world, index) or data.get("leaving")):
            # A node in a cluster of one (a new identity whose MEET has not
            # gone through yet) or a leaving one makes no dummy ack, as in
            # the original: the ACKJOB acked nothing, and the job is still
            # owed (seeds 20001659, 20004591).
            data["noop"] = True
        if world.net.faulty or world.chaos:
            world.acked_in_fault.add(jid)
        data["reply"] = _text(acked)
        self.record(name, "ack", data)
        return data

    async def _hold(
        self, world: World, name: str, index: int, jid: str, retry: int, hold: float
    ) -> None:
        """Hold a job past its RETRY, sending WORKING every RETRY/3 s over a
        connection of its own, then ack it (a consumer doing long work).
        When its node goes down, it does what the real client does: sends
        WORKING to the other nodes in turn at once (one without a copy
        answers -NOJOB), and goes on holding, and acks, where one took it
        (failover-holds)."""
        start = trio.current_time()
        origin = index
        moved: float | None = None
        try:
            client = await world.client(index)
        except CONN_ERRORS:
            return  # forgotten: re-queued at RETRY
        try:
            while trio.current_time() < start + hold:
                called = self._sending(jid)
                try:
                    reply = await client.call("WORKING", jid)
                except CONN_ERRORS as e:
                    error = f"connection error: {type(e).__name__}"
                    self.record(
                        name, "working", {"node": index, "id": jid, "reply": error, "t0": called}
                    )
                    await client.aclose()
                    found = await self._working_elsewhere(world, name, index, jid)
                    if found is None:
                        return  # no node took it: forgotten, re-queued at RETRY
                    client, index = found
                    moved = moved or trio.current_time()
                else:
                    data = {"node": index, "id": jid, "reply": _text(reply), "t0": called}
                    self.record(name, "working", data)
                    if not isinstance(reply, int):
                        return  # NOJOB: acked elsewhere (a duplicate delivery)
                await trio.sleep(max(0.0, min(retry / 3, start + hold - trio.current_time())))
            try:
                acked: dict[str, Any] | None = await self._ack(
                    world, client, name, index, jid, False
                )
            except CONN_ERRORS:
                acked = await self._ack_somewhere(world, name, index + 1, jid)
                if acked is None:
                    return
                index, moved = acked["node"], moved or trio.current_time()
            assert acked is not None
            if trio.current_time() - start > retry:
                world.probes["held-past-retry"] += 1
            data = {
                "node": index,
                "id": jid,
                "start": start,
                "retry": retry,
                "from": origin,
                "acked": acked["t0"],
            }
            if moved is not None:
                data["moved"] = moved
                world.probes["hold-moved"] += 1
            self.record(name, "hold", data)
        finally:
            await client.aclose()

    async def _working_elsewhere(
        self, world: World, name: str, index: int, jid: str
    ) -> tuple[RespClient, int] | None:
        """WORKING sent to every node but ``index`` in turn, over a fresh
        connection: the first that answers with the job's RETRY, and its
        client; None if none did."""
        for k in range(1, world.count):
            j = (index + k) % world.count
            try:
                client = await world.client(j)
            except CONN_ERRORS:
                continue
            called = self._sending(jid)
            try:
                reply = await client.call("WORKING", jid)
            except CONN_ERRORS as e:
                reply = f"connection error: {type(e).__name__}"
            data = {"node": j, "id": jid, "reply": _text(reply), "t0": called}
            self.record(name, "working", data)
            if isinstance(reply, int):
                return client, j
            await client.aclose()
        return None

    async def _ack_somewhere(
        self, world: World, name: str, index: int, jid: str
    ) -> dict[str, Any] | None:
        """ACKJOB on node ``index``, else on the next ones in turn, each over
        a fresh connection, until a node acks it (not a lone or leaving
        node's 0): the real client sends an ACKJOB it could not deliver
        elsewhere. The record of the ack that did, or None."""
        for k in range(world.count):
            j = (index + k) % world.count
            try:
                client = await world.client(j)
            except CONN_ERRORS:
                continue
            try:
                data = await self._ack(world, client, name, j, jid, False)
            except CONN_ERRORS:
                continue
            finally:
                await client.aclose()
            if not data.get("noop"):
                return data
        return None

    async def _work(
        self, world: World, name: str, index: int, jid: str, retry: int, work: float
    ) -> None:
        """A long RETRY job worked on for ``work`` seconds (well within its
        RETRY: no WORKING), then acked on its node, or, if that one went
        down meanwhile, on another (failover-holds: nobody may deliver it
        again meanwhile)."""
        start = trio.current_time()
        await trio.sleep(work)
        acked = await self._ack_somewhere(world, name, index, jid)
        if acked is not None:
            data = {
                "node": acked["node"],
                "id": jid,
                "start": start,
                "retry": retry,
                "from": index,
                "acked": acked["t0"],
            }
            self.record(name, "work", data)
