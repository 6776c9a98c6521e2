"""Checks of what users observe (issue #45), white-box, over every node's
job events and AOF rewrites; sim/checkers.py's index lists them.

* ``order``: on one node, each GETJOB takes the oldest job (by creation
  time, ``ctime``) queued there for that queue: no job left in the queue
  after a delivery is older than the job delivered.
* ``counters-follow``: ``nacks`` and ``additional-deliveries`` (SHOW,
  GETJOB WITHCOUNTERS) never go down on a node holding the job, and a copy
  made from a REPLJOB or YOURJOBS has at least the counters the message
  carried (a job moved between nodes keeps its history). Across holders
  they are best effort (counts travel as increments in QUEUED, and one
  that crosses a NEEDJOBS copy in flight never reaches the new holder), so
  two holders may disagree: what a client reads through one node never
  goes down, and a move never loses what it carried.
* ``retry0-once-cluster``: a RETRY 0 job is handed to a client at most
  once in the whole cluster, whatever the path that could queue it again
  (NACK, ENQUEUE, a restart, NEEDJOBS/YOURJOBS, a holder's RETRY timer):
  counted where the node sends the GETJOB reply, lost replies included.
* ``rewrite-keeps-state``: every AOF rewrite (BGREWRITEAOF, the automatic
  one, SHUTDOWN REWRITE-AOF) of a node whose AOF was on: loading the new
  file gives the jobs, acked states (dummy acks included), counters,
  expire times and client DELAY times that loading the old file gives at
  that moment (the old file's counters may lag: a NACK writes no record,
  so the new file's may only be higher).
* ``leaving-no-copies``: a node told CLUSTER LEAVING stores no new copy
  from a REPLJOB (clusterjobs' REPLJOB rule: refused while leaving).
  With the explorer's ``leaving-known`` (every node flags it within a
  bound, once calm) and ``leaving`` (GETJOB there answers -LEAVING).
* the ``always-*`` rules of disque_trio/core/always.py, at every job
  event and at each monitor sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from disque_trio.core import always
from disque_trio.core.cluster import LEAVING
from disque_trio.core.ids import is_at_most_once_id
from disque_trio.core.job import FLAG_DELAYED, Job, JobState
from disque_trio.protocol import aof as aof_records
from disque_trio.protocol import bus

if TYPE_CHECKING:
    from .world import SimNode, World


@attrs.frozen
class Loaded:
    """A job as loading an AOF would rebuild it (the parts compared)."""

    acked: bool
    body: bytes | None
    etime: int
    nacks: int
    deliveries: int
    delayed_until: int  # a client's DELAY still running at the load (ms), else 0


def load_model(data: bytes, now_ms: int) -> dict[str, Loaded]:
    """What loading ``data`` at ``now_ms`` rebuilds, written from the file
    format's rules (docs/persistence.md), not from the node's loader: a
    later LOADJOB replaces, ACKJOB acks (a dummy ack for an ID not held,
    but an at-most-once one), DELJOB deletes, an expired record is dropped."""
    good, _damage = aof_records.scan(data)
    jobs: dict[str, Loaded] = {}
    # Expired by now: an ACKJOB after its LOADJOB makes a dummy ack (the
    # loader does not know the job was there), which the rewrite, run
    # when the job was still held, has no reason to write; either way the
    # job is gone, and the ack too once the dummy's TTL runs out.
    expired: set[str] = set()
    for _, _, (kind, payload) in aof_records.records(data[:good]):
        if kind == aof_records.LOADJOB:
            assert isinstance(payload, aof_records.JobRecord)
            rec = payload
            jobs.pop(rec.id, None)
            if rec.etime * 1000 <= now_ms:
                expired.add(rec.id)
                continue
            expired.discard(rec.id)
            delayed = (
                rec.qtime if rec.retry and rec.flags & FLAG_DELAYED and rec.qtime > now_ms else 0
            )
            jobs[rec.id] = Loaded(
                JobState(rec.state) == JobState.ACKED,
                rec.body,
                rec.etime,
                rec.nacks,
                rec.deliveries,
                delayed,
            )
            continue
        job_id = str(payload)
        held = jobs.get(job_id)
        if kind == aof_records.DELJOB:
            jobs.pop(job_id, None)
        elif held is not None:
            jobs[job_id] = attrs.evolve(held, acked=True, delayed_until=0)
        elif not is_at_most_once_id(job_id) and job_id not in expired:
            jobs[job_id] = Loaded(True, None, 0, 0, 0, 0)
    return jobs


def compare_loads(
    old: dict[str, Loaded],
    new: dict[str, Loaded],
    memory: Mapping[str, Job] | None = None,
    high_ms: int = 0,
) -> list[str]:
    """What loading the new file loses or changes against the old one.
    ``memory``: the node's jobs when the rewrite took its snapshot. A
    client's DELAY that the node gave up in memory since its record (a
    holder that heard POSTPONE from another holder and stands by: no
    record is written for it) is not owed to the new file. ``high_ms``:
    the latest time the node's clock has read; a job it no longer holds
    that had expired by then is not owed either, whatever a clock set back
    since says (seed 554398: n2 dropped an expired job when it loaded its
    AOF; its clock then jumped 6 s back, and the rewrite run during the
    jump found the job's record in the old file within its TTL)."""
    out = []
    for job_id, was in sorted(old.items()):
        now = new.get(job_id)
        if now is None:
            if (
                memory is not None
                and job_id not in memory
                and was.body is not None
                and was.etime * 1000 <= high_ms
            ):
                continue  # expired by the latest clock reading, dropped
            kind = "dummy ack" if was.body is None else ("acked job" if was.acked else "job")
            out.append(f"{kind} {job_id} gone")
            continue
        if was.acked and not now.acked:
            out.append(f"{job_id} acked before, not after")
        if was.body is not None and now.body != was.body:
            out.append(f"{job_id} body changed")
        if was.body is not None and now.etime != was.etime:
            out.append(f"{job_id} expire time {was.etime} -> {now.etime}")
        if now.nacks < was.nacks or now.deliveries < was.deliveries:
            out.append(
                f"{job_id} counters {was.nacks}/{was.deliveries} -> {now.nacks}/{now.deliveries}"
            )
        held = None if memory is None else memory.get(job_id)
        moved_on = held is not None and (
            not held.flags & FLAG_DELAYED or held.qtime != was.delayed_until
        )
        if (
            was.delayed_until
            and not now.acked
            and now.delayed_until != was.delayed_until
            and not moved_on
        ):
            out.append(f"{job_id} DELAY until {was.delayed_until} -> {now.delayed_until}")
    for job_id, now in sorted(new.items()):
        if job_id not in old and not now.acked:
            out.append(f"job {job_id} appeared")
    return out


class Observing:
    """The checks above, attached to a World (by sim/runner.py)."""

    def __init__(self, world: World) -> None:
        self.world = world
        # (node, incarnation, job id) -> (nacks, deliveries) last seen there
        self.counters: dict[tuple[str, int, str], tuple[int, int]] = {}
        # RETRY 0 job id -> (node, virtual time) of its one delivery
        self.retry0_delivered: dict[str, tuple[str, float]] = {}
        self.rewrites_checked = 0
        world.observers.append(self.observe)
        world.start_hooks.append(self.watch_rewrites)
        world.samplers.append(self.sample)

    def _violate(self, text: str) -> None:
        self.world._violate(text)

    def observe(self, node: SimNode, event: str, job: Job, loading: bool) -> None:
        core = node.server.node
        always.on_event(core, node.name, event, job)
        if event == "registered":
            key = (node.name, node.incarnation, job.id)
            self.counters.pop(key, None)
            msg = node.handling_msg
            if isinstance(msg, bus.ReplJob) and core.cluster.myself.flags & LEAVING:
                self._violate(
                    f"leaving-no-copies: {node.name} (leaving) took a new copy of {job.id} "
                    "from a REPLJOB"
                )
            if isinstance(msg, (bus.ReplJob, bus.YourJobs)) and not loading:
                carried = (msg.job,) if isinstance(msg, bus.ReplJob) else msg.jobs
                for data in carried:
                    if data.id == job.id and (
                        job.nacks < data.nacks or job.deliveries < data.deliveries
                    ):
                        self._violate(
                            f"counters-follow: {node.name} took {job.id} from "
                            f"{type(msg).__name__} carrying nacks {data.nacks} "
                            f"additional-deliveries {data.deliveries}, holds "
                            f"{job.nacks}/{job.deliveries}"
                        )
        if job.body is not None and not loading and core.jobs.get(job.id) is job:
            key = (node.name, node.incarnation, job.id)
            was = self.counters.get(key)
            if was is not None and (job.nacks < was[0] or job.deliveries < was[1]):
                self._violate(
                    f"counters-follow: {node.name} {job.id} nacks/additional-deliveries "
                    f"{was[0]}/{was[1]} -> {job.nacks}/{job.deliveries} ({event})"
                )
            self.counters[key] = (job.nacks, job.deliveries)
        if event == "delivered":
            self._delivered(node, job)

    def _delivered(self, node: SimNode, job: Job) -> None:
        q = node.server.node.queues.get(job.queue)
        if q is not None and len(q.jobs):
            oldest = q.jobs[0]
            if oldest.ctime < job.ctime:
                self._violate(
                    f"order: {node.name} delivered {job.id} from {job.queue} while "
                    f"older {oldest.id} was queued there"
                )
        if job.retry == 0:
            first = self.retry0_delivered.get(job.id)
            if first is not None:
                self._violate(
                    f"retry0-once-cluster: RETRY 0 {job.id} delivered by {node.name} at "
                    f"t={trio.current_time():.2f}, by {first[0]} at t={first[1]:.2f} before"
                )
            else:
                self.retry0_delivered[job.id] = (node.name, trio.current_time())

    def sample(self) -> None:
        """Each monitor sample: the always rules over every node's state."""
        for n in self.world.nodes:
            if n.up:
                always.check_node(n.server.node, n.name)

    def watch_rewrites(self, node: SimNode) -> None:
        """rewrite-keeps-state for this incarnation of ``node``: its AOF's
        every switch to a rewritten file is compared with the file it
        replaces."""
        server = node.server
        aof = server.aof
        handle = node.handle
        assert handle is not None
        replace = handle.replace
        shutdown_rewrite = aof.shutdown_rewrite
        state = {"shutdown": False, "on": False, "flush": False}
        flushed = aof.flushed

        def checked_replace(path: str, data: bytes) -> None:
            # DEBUG FLUSHALL empties the file while a rewrite may run: that
            # replace is the flush's, not the rewrite's (seed 711027).
            rewriting = ((aof.rewriting and state["on"]) or state["shutdown"]) and not state[
                "flush"
            ]
            clean = not aof._buffer and not aof._unwritten and aof.last_write_error is None
            old = handle.read(path) if rewriting and clean and path == aof.path else None
            replace(path, data)
            if old is None:
                return
            now = server.node.now_ms()
            high = node.clock.high_ms() if node.clock is not None else now
            problems = compare_loads(
                load_model(old, now), load_model(data, now), server.node.jobs, high
            )
            self.rewrites_checked += 1
            self.world.probes["rewrite-checked"] += 1
            if problems:
                how = "SHUTDOWN REWRITE-AOF" if state["shutdown"] else "rewrite"
                self._violate(
                    f"rewrite-keeps-state: {node.name}'s {how}: {'; '.join(problems[:4])}"
                    + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
                )

        original_rewrite = aof.rewrite

        async def rewrite(claimed: bool = False) -> bool:
            # Only a file that was on is compared: turning the AOF on
            # writes a fresh one from memory over a stale file.
            state["on"] = aof.state == "on"
            return await original_rewrite(claimed)

        def shutdown() -> None:
            state["shutdown"] = aof.state == "on"
            try:
                shutdown_rewrite()
            finally:
                state["shutdown"] = False

        def flush() -> None:
            state["flush"] = True
            try:
                flushed()
            finally:
                state["flush"] = False

        handle.replace = checked_replace  # type: ignore[method-assign]
        aof.flushed = flush  # type: ignore[method-assign]
        aof.rewrite = rewrite  # type: ignore[method-assign]
        aof.shutdown_rewrite = shutdown  # type: ignore[method-assign]
