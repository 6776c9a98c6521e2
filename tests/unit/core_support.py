"""Helpers to drive the pure core synchronously: a fake clock, a node, a
dispatcher like the server's, timer stepping and a white-box invariant check."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from disque_trio.core import clusterjobs as cj
from disque_trio.core.commands import CORE_COMMANDS
from disque_trio.core.effects import Send, Wake, WakeQueue
from disque_trio.core.job import Job, JobState
from disque_trio.core.node import Node
from disque_trio.protocol.replies import ReplyError, err

# A realistic wall clock (Nov 2023), a whole second so TTL arithmetic is exact.
START_MS = 1_700_000_000_000
NODE_ID = "dcb833cf" + "a1" * 16
OTHER_ID = "77e1a0b2" + "b3" * 16


class FakeClock:
    """The core's Clock: wall-clock ms that only moves when a test says so."""

    def __init__(self, ms: int = START_MS) -> None:
        self.ms = ms
        self.stepped_ms = 0  # wall-clock steps (jump()): not monotonic time

    def wall_ms(self) -> int:
        return self.ms

    def mono_ms(self) -> int:
        return self.ms - self.stepped_ms

    def jump(self, ms: int) -> None:
        """Step the wall clock by ``ms`` (forward or back), as NTP or an
        operator might: monotonic time does not move."""
        self.ms += ms
        self.stepped_ms += ms


def make_node(seed: int = 0, node_id: str = NODE_ID) -> tuple[Node, FakeClock]:
    clock = FakeClock()
    return Node(node_id, clock, random.Random(seed)), clock


def _arg(a: Any) -> bytes:
    return a if isinstance(a, bytes) else str(a).encode()


def settle(node: Node) -> None:
    """What the shell does with wake-ups at its commit point: a queue's
    delivery task hands its jobs to its waiting consumers (WakeQueue), a
    blocked command's client is woken (Wake). The other effects (Send,
    Persist, Log) stay in ``node.effects`` for the test to read."""
    while True:
        wakes = [e for e in node.effects if isinstance(e, Wake | WakeQueue)]
        if not wakes:
            return
        node.effects[:] = [e for e in node.effects if not isinstance(e, Wake | WakeQueue)]
        for effect in wakes:
            if isinstance(effect, WakeQueue):
                q = node.queues.get(effect.queue)
                if q is not None:
                    node.serve_waiters(q)
            else:
                effect.waiter.wake()


def sent(node: Node) -> list[tuple[str, object]]:
    """The bus messages the node recorded so far, (peer, message)."""
    return [(e.peer, e.message) for e in node.effects if isinstance(e, Send)]


def run(node: Node, *args: Any) -> Any:
    """Run one core command the way the server dispatcher does: arity first,
    then the handler, a raised ReplyError becoming the reply; then settle."""
    argv = [_arg(a) for a in args]
    name = argv[0].decode().lower()
    cmd = CORE_COMMANDS[name]
    if not cmd.arity_ok(len(argv)):
        return err(f"wrong number of arguments for '{name}' command")
    try:
        return cmd.handler(node, argv)
    except ReplyError as e:
        return e
    finally:
        settle(node)


def add(node: Node, queue: str = "q", body: str | bytes = "body", *opts: Any) -> str:
    """ADDJOB that must succeed; returns the ID."""
    reply = run(node, "ADDJOB", queue, body, 0, *opts)
    assert not isinstance(reply, ReplyError), reply
    return str(reply)


def get(node: Node, *queues: str, count: int = 1) -> list[Any]:
    """GETJOB NOHANG; [] when nothing was available."""
    reply = run(node, "GETJOB", "NOHANG", "COUNT", count, "FROM", *queues)
    return [] if not isinstance(reply, list) else reply


def tick_at(node: Node, clock: FakeClock, ms: int) -> None:
    """Move the clock to ``ms`` and run the timers once (a late timer task)."""
    clock.ms = ms
    node.tick()
    settle(node)


def elapse(node: Node, clock: FakeClock, delta_ms: int) -> None:
    """Let ``delta_ms`` pass the way the shell's timer task would: tick at
    every deadline the node announces on the way, then at the end."""
    target = clock.ms + delta_ms
    while True:
        due = node.next_deadline()
        if due is None or due > target:
            break
        clock.ms = max(clock.ms, due)
        node.tick()
        settle(node)
    clock.ms = target
    node.tick()
    settle(node)


def fields(reply: Any) -> Any:
    """A key/value reply (SHOW, QSTAT, JSCAN REPLY ALL) as an ordered dict,
    whether the core answers a dict or a flat [k1, v1, ...] array; nil stays None."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        return dict(reply)
    assert isinstance(reply, list) and len(reply) % 2 == 0, reply
    keys = reply[0::2]
    assert all(isinstance(k, str) for k in keys) and len(set(keys)) == len(keys), keys
    return dict(zip(keys, reply[1::2], strict=True))


def hook(monkeypatch: pytest.MonkeyPatch, node: Node, name: str, fn: Callable[..., Any]) -> None:
    """Observe one of the job protocol's calls (``clusterjobs.<name>``) the
    node makes: ``fn`` gets its arguments but the node, instead of it
    running (for the test's duration)."""
    original = getattr(cj, name)
    assert callable(original)

    def spy(host: object, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if host is node else original(host, *args, **kwargs)

    monkeypatch.setattr(cj, name, spy)


def ids_of(reply: Any) -> list[str]:
    """The job IDs of a GETJOB/QPEEK reply (or of a served waiter's reply)."""
    assert isinstance(reply, list), reply
    return [entry[1] for entry in reply]


def error_line(reply: Any) -> str:
    assert isinstance(reply, ReplyError), f"expected an error, got {reply!r}"
    return reply.line


def timed_entries(node: Node) -> int:
    """Live timers the awake index should hold: every job, plus the queues
    whose idle-eviction timer is set."""
    return len(node.jobs) + sum(1 for q in node.queues.values() if q.awake)


def check_invariants(node: Node) -> None:
    """The module rules of core/node.py, checked from the outside."""
    queued_by_queue: Counter[str] = Counter()
    for job in node.jobs.values():
        # Exactly one live timer per job, never in the past of next_deadline.
        assert job.awake != 0, job
        if job.state == JobState.QUEUED:
            queued_by_queue[job.queue] += 1
            q = node.queues.get(job.queue)
            assert q is not None and job in q.jobs, job
        if job.retry == 0 and job.state in (JobState.QUEUED, JobState.ACTIVE):
            # At most once: once queued, never a re-queue time again.
            assert job.qtime == 0 or job.delay > 0, job
    for name, q in node.queues.items():
        assert len(q.jobs) == queued_by_queue[name] == node.queue_length(name)
        ctimes = [queued.ctime for queued in q.jobs]
        assert ctimes == sorted(ctimes), name
        for queued in q.jobs:
            assert node.jobs[queued.id] is queued  # the registered job itself
            assert queued.state == JobState.QUEUED and queued.queue == name
    assert len(node.awake) == timed_entries(node)
    if node.jobs:
        due = node.next_deadline()
        assert due is not None and due <= min(j.awake for j in node.jobs.values())
    # Stale heap entries stay proportional to the live ones.
    assert node.awake.stored <= 2 * len(node.awake) + node.awake.COMPACT_SLACK
    # The index of acked jobs (Node.acked_jobs) names exactly those.
    assert set(node.acked_jobs) == {j.id for j in node.jobs.values() if j.state == JobState.ACKED}
    assert node.body_bytes == sum(len(j.body) for j in node.jobs.values() if j.body is not None)
    waiters = {w for q in node.queues.values() for w in q.waiters}
    assert node.stats.blocked_clients == len(waiters)


def job(node: Node, job_id: str) -> Job:
    found = node.lookup(job_id)
    assert found is not None, job_id
    return found
