"""WAITJOB: clients blocked until jobs are done.

Theory of operation
-------------------
What a node can say of a job, from what it holds and from its tombstones
(``Node.deleted_ids`` and the sets beside it, kept ``DELETED_IDS_MS`` and at
most ``DELETED_IDS_MAX`` IDs):

* ``acked``: it holds the job acked (a SETACK reached it, or a client acked
  it here), or remembers it deleted as acked (collected, FASTACKed, DELJOB
  from its collector);
* ``gone``: it remembers it deleted without an ack: expired, DELJOB'd
  here, or its ADDJOB failed (here, or told so by REFUSED);
* ``unknown``: nothing of it, when asked: never held here, or its
  tombstone was dropped since;
* not done yet (the client waits): it holds the job, not acked; or it gave
  the job to another node and follows it (a RETRY 0 job that federation
  moved: its new holder lists this node, so the ack comes back here; its
  TTL running out there reads ``gone`` here at the same time).

Rules:

* A waiter answers once every ID it asked for is done; ``pending`` is what
  an ID not done gets when the wait ends first (timeout, client gone).
  ``unknown`` is only ever an answer at the call: an ID this node starts
  following is never unknown later, even once its tombstone is dropped.
* Every change that can end a wait goes through :func:`settle`: an ack
  (``Node.acknowledge``) and every tombstone written
  (``Node.remember_deleted``). The hooks cost one dict test while no
  client waits.
* A job handed over whole (``Node.hand_over``) with nothing to follow it
  by (this node kept no copy of its own ADDJOB: leaving, or short of
  memory) reads ``unknown``: the holders do not list this node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ..protocol.replies import Reply
from .job import STATE_ACKED, Job
from .stats import NodeStats
from .waiters import Waiter

ACKED = "acked"
GONE = "gone"
UNKNOWN = "unknown"
PENDING = "pending"


class WaitHost(Protocol):
    """What WAITJOB needs of the node."""

    jobs: dict[str, Job]
    deleted_ids: dict[str, int]
    deleted_acked: dict[str, tuple[int, int]]
    deleted_moved: dict[str, int]
    job_waiters: dict[str, list[Waiter]]
    moved_waits: dict[str, int]
    stats: NodeStats

    def now_ms(self) -> int: ...

    def finish_wait(self, waiter: Waiter, reply: Reply) -> None: ...


def outcome(node: WaitHost, job_id: str) -> str | None:
    """What the node can say of the job now; None: not done yet."""
    job = node.jobs.get(job_id)
    if job is not None:
        return ACKED if job.state == STATE_ACKED else None
    if job_id in node.deleted_acked:
        return ACKED
    moved = node.deleted_moved.get(job_id)
    if moved is not None:
        if not moved:
            return UNKNOWN
        return GONE if moved * 1000 <= node.now_ms() else None
    return GONE if job_id in node.deleted_ids else UNKNOWN


def watch(node: WaitHost, ids: list[str], timeout_ms: int) -> Reply | Waiter:
    """WAITJOB's core: the answer now, or a waiter the shell blocks on."""
    outcomes = {job_id: outcome(node, job_id) for job_id in ids}
    if all(value is not None for value in outcomes.values()):
        return [outcomes[job_id] for job_id in ids]
    waiter = Waiter(watch=tuple(ids), timeout_ms=timeout_ms)
    waiter.outcomes = outcomes
    node.stats.blocked_clients += 1
    for job_id, value in outcomes.items():
        if value is None:
            node.job_waiters.setdefault(job_id, []).append(waiter)
            _follow_if_moved(node, job_id)
    return waiter


def settle(node: WaitHost, job_id: str) -> None:
    """Something happened to a job clients wait for: answer those it ends."""
    value = outcome(node, job_id)
    if value is None:
        _follow_if_moved(node, job_id)
    else:
        answer(node, job_id, value)


def answer(node: WaitHost, job_id: str, value: str) -> None:
    """Every waiter on ``job_id`` learns ``value``; those done reply."""
    node.moved_waits.pop(job_id, None)
    for waiter in node.job_waiters.pop(job_id, ()):
        if waiter.done:
            continue
        waiter.outcomes[job_id] = value
        if all(v is not None for v in waiter.outcomes.values()):
            node.stats.blocked_clients -= 1
            node.finish_wait(waiter, reply(waiter))


def expire_moved(node: WaitHost) -> None:
    """Jobs given away whose TTL ran out (the node's cron): ``gone``."""
    now_s = node.now_ms() // 1000
    for job_id in [j for j, etime in node.moved_waits.items() if etime <= now_s]:
        if job_id in node.jobs:
            node.moved_waits.pop(job_id)  # back here: its own timers decide
        else:
            # Its tombstone may be gone by now: the answer is not unknown.
            answer(node, job_id, ACKED if job_id in node.deleted_acked else GONE)


def cancel(node: WaitHost, waiter: Waiter) -> Reply:
    """The shell gave up (timeout, client gone): what is known, and
    ``pending`` for the rest."""
    _forget(node, waiter, (j for j, v in waiter.outcomes.items() if v is None))
    node.stats.blocked_clients -= 1
    return reply(waiter)


def reply(waiter: Waiter) -> list[Reply]:
    return [waiter.outcomes[job_id] or PENDING for job_id in waiter.watch]


def _follow_if_moved(node: WaitHost, job_id: str) -> None:
    etime = node.deleted_moved.get(job_id)
    if etime and job_id not in node.jobs:
        node.moved_waits[job_id] = etime


def _forget(node: WaitHost, waiter: Waiter, job_ids: Iterable[str]) -> None:
    for job_id in job_ids:
        waiters = node.job_waiters.get(job_id)
        if waiters is None:
            continue
        waiters[:] = [w for w in waiters if w is not waiter]
        if not waiters:
            del node.job_waiters[job_id]
            node.moved_waits.pop(job_id, None)
