"""What the node-to-node job protocol and the AOF replay need of the node.

``core/clusterjobs.py`` (the job protocol between nodes) and
``core/records.py`` (jobs to and from their serialised forms, AOF replay)
work on a node's jobs and queues, and ``core/node.py`` calls into them (a
re-queue sends QUEUED, a drained queue asks for jobs...). They take a
:class:`JobHost`, which :class:`~disque_trio.core.node.Node` is, rather than
importing ``node.py``: imports go one way (node -> clusterjobs -> host), and
this list says exactly which part of the node the protocol relies on.
"""

from __future__ import annotations

import random
from typing import Protocol

from ..protocol.replies import Reply
from .cluster import ClusterTable
from .effects import Effects
from .job import Job
from .queue import Pause, Queue
from .stats import NodeStats
from .waiters import Waiter


class Clock(Protocol):
    """What the core needs of time: wall-clock milliseconds since the epoch,
    and a monotonic clock for ages that a wall-clock step must not cut short."""

    def wall_ms(self) -> int: ...

    def mono_ms(self) -> int: ...


class JobHost(Protocol):
    node_id: str
    clock: Clock
    jobs: dict[str, Job]
    queues: dict[str, Queue]
    effects: Effects
    cluster: ClusterTable
    stats: NodeStats
    rng: random.Random
    leaving: bool
    persisting: bool
    cluster_size: int
    reachable_peers: int
    myself_only: tuple[str, ...]
    repl_waiters: dict[str, Waiter]
    deleted_ids: dict[str, int]
    deleted_acked: dict[str, tuple[int, int]]
    acked_jobs: dict[str, None]
    deleted_expired: set[str]
    deleted_refused: set[str]
    postpones_heard: dict[str, tuple[int, int, str]]
    pending_holders: dict[str, set[str]]
    pending_since: dict[str, int]
    delivered_untold: dict[str, None]
    answered_queued: set[str]
    answered_queued_before: set[str]
    interest: dict[str, dict[str, tuple[int, int]]]
    linked_at: dict[str, int]
    link_seq: int

    def now_ms(self) -> int: ...

    def time_error(self, span_ms: int = ...) -> int: ...

    def queue(self, name: str, now: int = 0) -> Queue: ...

    def register(self, job: Job, schedule: bool = True) -> bool: ...

    def unregister(self, job: Job, acked: bool = False, handed: int | None = None) -> None: ...

    def hand_over(self, job: Job, follow: bool) -> None: ...

    def persist(self, job: Job) -> None: ...

    def enqueue(self, job: Job, nack: bool = False, now: int = 0) -> bool: ...

    def dequeue(self, job: Job) -> bool: ...

    def take_oldest(self, q: Queue) -> Job | None: ...

    def expire(self, job: Job) -> None: ...

    def acknowledge(self, job: Job) -> None: ...

    def try_gc(self, job: Job) -> None: ...

    def update_awake(self, job: Job, at: int = 0, now: int = 0) -> None: ...

    def set_requeue_time(self, job: Job, qtime: int) -> None: ...

    def set_pause(self, name: str, pause: Pause) -> Pause: ...

    def schedule_queue_gc(self, q: Queue) -> None: ...

    def wake_queue(self, q: Queue) -> None: ...

    def remember_deleted(
        self, job_id: str, acked: bool = False, handed: int | None = None
    ) -> None: ...

    def finish_wait(self, waiter: Waiter, reply: Reply) -> None: ...

    def memory_level(self) -> int: ...

    def probe(self, event: str, job: Job) -> None: ...
