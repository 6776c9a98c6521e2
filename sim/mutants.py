"""Mutation testing of the simulator: does it catch realistic bugs?

Each mutant is a context manager that monkeypatches the node code inside
this process and restores it on exit. ``run_mutant`` runs seeds until the
checkers (``sim.checkers``) or the white-box checks below report a problem.

White-box checks (node observers, a sampling monitor and an end state):

* ``replicated-before-ok``: when ADDJOB answered OK (REPLICATE n), at least
  n distinct nodes had registered the job.
* ``acked-absorbing``: a node (one incarnation) that acked a job never
  queues it again.
* ``retry0-once``: a RETRY 0 job is queued at most once per registration
  (per node) and never re-queued after an AOF reload.
* ``always-no-amnesia``: with ``appendfsync always`` a restarted node
  reloads every job it held when it crashed.
* ``single-queued``: while the network is healed and every node up, no job
  stays queued on two nodes for more than ``DOUBLE_QUEUED_S``.
* ``acked-collected``: after a quiet settle phase, no job a client acked
  survives anywhere (unless a node reloaded it from its AOF).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio

from disque_trio.core import clusterjobs as cj
from disque_trio.core.job import FLAG_DELIVERED, Job, JobState
from disque_trio.core.node import Node
from disque_trio.protocol import bus
from disque_trio.server.aof import AppendOnlyFile

from .__main__ import check_world, sweep_nodes
from .workload import Workload
from .world import SimNode, World

SETTLE_S = 25.0
DOUBLE_QUEUED_S = 4.0
SAMPLE_S = 0.25
DEFAULT_SEEDS = tuple(range(1, 31))
DURATION = 6.0


# ------------------------------------------------------------ white box


class CheckedWorld(World):
    """A World whose node observers also run the white-box checks."""

    def __init__(self, seed: int, nodes: int = 3, **config: Any) -> None:
        super().__init__(seed, nodes, **config)
        self.violations: list[str] = []
        self.registered_at: dict[str, dict[str, float]] = {}  # job -> node -> first t
        self.acked_by: dict[tuple[str, int], set[str]] = {}
        self.queued_once: dict[tuple[str, int], set[str]] = {}
        self.ever_reloaded: set[str] = set()
        # Re-queues of acked jobs by YOURJOBS: a known gap of the node code
        # (_on_yourjobs enqueues a job it holds as ACKED), reported apart.
        self.pending_acked_requeue: dict[tuple[str, str], str] = {}
        self.yourjobs_requeued_acked: list[str] = []

    def _observer(self, node: SimNode, server: Any) -> Callable[[str, Job], None]:
        base = super()._observer(node, server)
        key = (node.name, node.incarnation)
        acked = self.acked_by.setdefault(key, set())
        queued = self.queued_once.setdefault(key, set())

        def observe(event: str, job: Job) -> None:
            reloaded_before = job.id in node.reloaded
            base(event, job)
            loading = server.aof.loading
            if event == "registered":
                at = self.registered_at.setdefault(job.id, {})
                at.setdefault(node.name, trio.current_time())
                queued.discard(job.id)
                acked.discard(job.id)  # a new copy (late REPLJOB, YOURJOBS)
                if loading:
                    self.ever_reloaded.add(job.id)
            elif event == "acked":
                acked.add(job.id)
            elif event == "yourjobs-moved-a-job":
                text = self.pending_acked_requeue.pop((node.name, job.id), None)
                if text is not None:
                    self.yourjobs_requeued_acked.append(text)
            elif event == "queued":
                if job.id in acked:
                    self.pending_acked_requeue[(node.name, job.id)] = (
                        f"acked-absorbing: {node.name} re-queued acked {job.id}"
                    )
                if job.retry == 0 and not loading:
                    if job.id in queued:
                        self._violate(f"retry0-once: {node.name} queued {job.id} twice")
                    if reloaded_before:
                        self._violate(f"retry0-once: {node.name} re-queued {job.id} after reload")
                    queued.add(job.id)

        return observe

    def _violate(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def healthy(self) -> bool:
        return not self.net.blocked and not self.net.fenced and all(n.up for n in self.nodes)

    async def monitor(self) -> None:
        since: dict[str, float] = {}
        while True:
            await trio.sleep(SAMPLE_S)
            now = trio.current_time()
            if not self.healthy():
                since.clear()
                continue
            where: dict[str, int] = {}
            for n in self.nodes:
                for job in n.server.node.jobs.values():
                    if job.state == JobState.QUEUED:
                        where[job.id] = where.get(job.id, 0) + 1
            double = {j for j, c in where.items() if c > 1}
            for j in list(since):
                if j not in double:
                    del since[j]
            for j in double:
                start = since.setdefault(j, now)
                if now - start > DOUBLE_QUEUED_S:
                    self._violate(f"single-queued: {j} queued on 2+ nodes for {now - start:.1f}s")

    def end_checks(self, workload: Workload) -> None:
        for text in self.pending_acked_requeue.values():
            self._violate(text)
        for e in workload.history:
            if e.op == "add" and e.data["ok"] and e.data["retry"] > 0:
                job_id = e.data["reply"]
                want = min(3, self.count)
                regs = self.registered_at.get(job_id, {})
                early = [n for n, t in regs.items() if t <= e.t]
                if len(early) < want:
                    self._violate(
                        f"replicated-before-ok: {job_id} OK with {len(early)} holders < {want}"
                    )
        if self.appendfsync == "always" and self.amnesia:
            self._violate(f"always-no-amnesia: {sorted(self.amnesia)[:3]}")
        acked_ok = {
            e.data["id"]
            for e in workload.history
            if e.op == "ack" and not e.data["reply"].startswith(("ERR", "conn"))
        }
        for n in self.nodes:
            for job in n.server.node.jobs.values():
                if job.id in acked_ok and job.id not in self.ever_reloaded:
                    self._violate(
                        f"acked-collected: {n.name} still holds acked {job.id} "
                        f"({job.state.name}) after settling"
                    )


def run_checked(seed: int, duration: float = DURATION) -> list[str]:
    """One world (3 to 5 nodes): checker violations plus white-box ones."""
    world = CheckedWorld(seed, nodes=sweep_nodes(seed))
    workload = Workload(duration=duration)

    async def body(w: World) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(world.monitor)
            await workload(w)
            await trio.sleep(SETTLE_S)
            nursery.cancel_scope.cancel()
        world.end_checks(workload)

    world.run(body)
    report = check_world(world, workload)
    return report.violations + world.violations


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
                node.outbox.append((node_id, bus.SetAck(job.id, len(job.nodes_delivered))))

    return patched(cj, "send_setack", send_setack)


def aof_requeues_retry0() -> contextlib.AbstractContextManager[None]:
    """An AOF reload queues RETRY 0 jobs again (as if never delivered)."""
    original = AppendOnlyFile._restore

    def restore(self: AppendOnlyFile, rec: Any, enqueue_once: bool, now: int) -> None:
        original(self, rec, enqueue_once, now)
        job = self.server.node.jobs.get(rec.id)
        if job is not None and job.retry == 0 and job.state == JobState.ACTIVE:
            job.qtime = now
            job.flags &= ~FLAG_DELIVERED
            self.server.node.enqueue(job, now=now)

    return patched(AppendOnlyFile, "_restore", restore)


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
    """write_pending drops what the core queued (reply before durability)."""

    def write_pending(self: AppendOnlyFile) -> None:
        self.server.node.aof.clear()

    return patched(AppendOnlyFile, "write_pending", write_pending)


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


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "gotjob-duplicate-counted": gotjob_duplicate_counted,
    "setack-forgets-one-holder": setack_forgets_one_holder,
    "aof-requeues-retry0": aof_requeues_retry0,
    "queued-skips-dequeue": queued_skips_dequeue,
    "aof-write-dropped": aof_write_dropped,
    "repljob-no-merge": repljob_no_merge,
    "gc-skips-deljob": gc_skips_deljob,
    "ack-not-marked": ack_not_marked,
    "setack-not-answered": setack_not_answered,
}


def run_mutant(
    name: str, seeds: tuple[int, ...] = DEFAULT_SEEDS, duration: float = DURATION
) -> tuple[int | None, list[str]]:
    """The first seed at which the mutant is caught (and why), or None."""
    for seed in seeds:
        with MUTANTS[name]():
            violations = run_checked(seed, duration)
        if violations:
            return seed, violations
    return None, []


def main(names: list[str] | None = None, seeds: tuple[int, ...] = DEFAULT_SEEDS) -> int:
    started = time.perf_counter()
    caught = 0
    names = names or list(MUTANTS)
    for name in names:
        t0 = time.perf_counter()
        seed, violations = run_mutant(name, seeds)
        wall = time.perf_counter() - t0
        if seed is None:
            print(f"{name}: NOT caught ({len(seeds)} seeds, {wall:.1f}s)", flush=True)
        else:
            caught += 1
            print(f"{name}: caught at seed {seed} ({wall:.1f}s): {violations[0]}", flush=True)
    print(f"wall time {time.perf_counter() - started:.1f}s", file=sys.stderr)
    print(f"mutants: caught {caught}/{len(names)}")
    return 0 if caught == len(names) else 1
