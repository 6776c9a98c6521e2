"""What the Celery and Dramatiq integrations share.

Both frameworks call their broker from several threads (Celery's threads
pool acknowledges from its worker threads, Dramatiq's worker threads do
too), and the blocking ``Client`` is for one thread at a time. So each
role has its own client:

``SharedClient``   one client behind a lock, for short calls from any
                   thread (ADDJOB, NACK, a dead letter, QLEN);
a consumer's own   for its blocking GETJOB, used by the thread that
client             consumes only;
``Acknowledger``   a thread with its own client that sends ACKJOB for the
                   IDs handed to it, in batches (every ID that came in
                   while the previous ACKJOB was on the wire), holds the
                   jobs the process works on (WORKING elsewhere when the
                   node they came from is gone), and, when asked, sends
                   WORKING for the jobs a process holds too long.

``each_node`` runs a call on every usable node, for what Disque keeps per
node (a queue's length, JSCAN). ``add_dead_letter`` writes the worker's
``DeadLetter`` format to ``<queue>:dead``.

Every piece notices a fork (Celery's prefork pool, Dramatiq's processes):
a child starts with fresh clients and threads of its own.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..client import (
    Address,
    Client,
    DisqueError,
    Job,
    NoJobError,
    NoReplError,
    TooLateError,
)
from ..worker import DeadLetter

__all__ = [
    "DEFAULT_DEAD_LETTER_TTL",
    "DEFAULT_TTL",
    "MAX_SECONDS",
    "Acknowledger",
    "ClientFactory",
    "SharedClient",
    "add_dead_letter",
    "count_jobs",
    "each_node",
    "purge_queue",
    "track_delivered",
    "whole_seconds",
]

T = TypeVar("T")
log = logging.getLogger("disque_trio.integrations")

DAY = 86400
DEFAULT_TTL = 7 * DAY
"""A job's TTL unless told otherwise: a week, so that a backlog survives a
long outage of its consumers (Redis keeps messages for ever; Disque needs
a TTL)."""
DEFAULT_DEAD_LETTER_TTL = 7 * DAY
"""How long a dead letter is kept (Dramatiq's own default for its DLQ)."""
MAX_SECONDS = 2**32 - 1
"""The largest TTL, RETRY or DELAY a node accepts."""

ClientFactory = Callable[[], Client]


def whole_seconds(seconds: float) -> int:
    """A delay in the whole seconds Disque counts in, rounded up (a job is
    never queued early), at most MAX_SECONDS."""
    return min(MAX_SECONDS, max(0, math.ceil(seconds - 1e-9)))


class SharedClient:
    """One blocking client for every thread of the process, one call at a
    time: ``with shared() as client: client.add_job(...)``."""

    def __init__(self, factory: ClientFactory) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._pid = os.getpid()

    @contextmanager
    def __call__(self) -> Iterator[Client]:
        if self._pid != os.getpid():
            # A forked child: the parent's socket stays the parent's.
            self._lock = threading.Lock()
            self._client = None
            self._pid = os.getpid()
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            yield self._client

    def close(self) -> None:
        if self._pid != os.getpid():
            return
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class Acknowledger:
    """A thread that acknowledges jobs for the whole process, and looks
    after the jobs it holds.

    ``ack(job_id)`` returns at once; the thread sends ACKJOB with every ID
    waiting (at most ``max_batch``), and again as soon as that reply came,
    so under load one ACKJOB carries many IDs and when idle an ack leaves
    at once. The client splits a batch by creating node (routing). An
    ACKJOB that fails is tried twice more; then the IDs are given up (the
    jobs come back after their RETRY: at least once, never lost) with a
    warning. ``flush()`` waits until everything handed in was sent;
    ``close()`` flushes and stops the thread (the next ``ack()`` starts
    another).

    Jobs given to ``track()`` (with the node that delivered them) are held
    by the thread's client until ``ack()`` or ``untrack()``: every
    ``watch`` seconds while it holds any, the thread checks the nodes
    they came from, and when one is gone sends WORKING for its jobs where
    a copy is (the client's ``check_held``, docs/client.md), so that a
    task still running is not run again elsewhere. With ``keepalive``
    seconds, tracked jobs also get a WORKING (their next re-queue
    postponed by RETRY) every ``keepalive`` seconds: a process that is
    alive keeps its jobs, one that died gives them back after RETRY. A job
    the node says is too old for that (-TOOLATE: half its TTL passed) or
    unknown (-NOJOB) gets no more of those.
    """

    def __init__(
        self,
        factory: ClientFactory,
        *,
        keepalive: float | None = None,
        watch: float = 0.5,
        max_batch: int = 1000,
        attempts: int = 3,
        name: str = "disque-acks",
    ) -> None:
        if keepalive is not None and keepalive <= 0:
            raise ValueError("keepalive must be positive")
        if watch <= 0:
            raise ValueError("watch must be positive")
        self._factory = factory
        self.keepalive = keepalive
        self.watch = watch
        self.max_batch = max_batch
        self.attempts = attempts
        self.name = name
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[str] = []
        self._tracked: dict[str, float] = {}  # job ID -> when its WORKING is due
        # Held, not acked or untracked yet (what the thread's client holds
        # once it has taken the changes below): whether to watch at all.
        self._holding: set[str] = set()
        # Changes to the client's held jobs, for the thread to make (the
        # client is the thread's alone), in order: holds before releases.
        self._to_hold: list[tuple[list[str], Address | None]] = []
        self._to_release: list[str] = []
        self._busy = False  # a batch or a WORKING is on the wire
        self._scan_at = 0.0  # when the tracked jobs are next looked at
        self._watch_at = 0.0  # when the held jobs' nodes are next checked
        self._closed = False
        self._thread: threading.Thread | None = None
        self.lost = 0  # acknowledgements given up

    def _check(self) -> None:
        """Called under no lock: a forked child gets state of its own."""
        if self._pid != os.getpid():
            self._reset()

    def _start(self) -> None:
        # Under the condition's lock.
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def ack(self, job_id: str) -> None:
        self._check()
        with self._cond:
            self._tracked.pop(job_id, None)
            self._holding.discard(job_id)  # the ACKJOB releases it
            self._pending.append(job_id)
            self._start()
            self._cond.notify_all()

    def track(self, job_ids: Sequence[str], node: Address | None = None) -> None:
        """Jobs delivered to this process (by ``node``, if known), being
        worked on until ``ack()`` or ``untrack()``."""
        if not job_ids:
            return
        self._check()
        due = time.monotonic() + (self.keepalive or 0.0)
        with self._cond:
            self._to_hold.append((list(job_ids), node))
            self._holding.update(job_ids)
            if self.keepalive is not None:
                for job_id in job_ids:
                    self._tracked[job_id] = due
            self._start()
            self._cond.notify_all()  # the thread may wait with no timeout

    def untrack(self, job_id: str) -> None:
        """Settled otherwise (NACK, ENQUEUE...): no longer held."""
        self._check()
        with self._cond:
            self._tracked.pop(job_id, None)
            if job_id in self._holding:
                self._holding.discard(job_id)
                self._to_release.append(job_id)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every ID handed in was sent (or given up); False if
        that took longer than ``timeout`` seconds."""
        self._check()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                thread = self._thread
                if left <= 0 or thread is None or not thread.is_alive():
                    return not self._pending
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        self._check()
        if not self.flush(timeout):
            with self._cond:
                waiting = len(self._pending)
            log.warning(
                "%d acknowledgements not sent within %.0f s: those jobs will be delivered "
                "again after their RETRY",
                waiting,
                timeout,
            )
        with self._cond:
            self._closed = True
            self._tracked.clear()
            self._holding.clear()
            self._to_hold.clear()
            self._to_release.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            if thread is None or not thread.is_alive():
                # Usable again (kombu re-opens a closed connection on the
                # same transport): the next ack starts a new thread.
                self._thread = None
                self._closed = False

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        client: Client | None = None
        try:
            while True:
                with self._cond:
                    work = self._next_work()
                    if work is None:
                        return
                    self._busy = True
                try:
                    if client is None:
                        client = self._factory()
                    self._do(client, work)
                except Exception:
                    # Never let the thread die: every later ack would wait
                    # for ever. What was in hand comes back at its RETRY.
                    self.lost += len(work.acks)
                    log.exception("acknowledging thread: unexpected error (carrying on)")
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            if client is not None:
                client.close()

    def _next_work(self) -> _Work | None:
        """Under the lock: wait for something to do; None once closed with
        nothing left."""
        while True:
            now = time.monotonic()
            work = _Work(holds=self._to_hold, releases=self._to_release)
            self._to_hold, self._to_release = [], []
            if self._tracked and now >= self._scan_at and self.keepalive is not None:
                # Looked at a few times per keep-alive period, not per ack.
                self._scan_at = now + min(1.0, self.keepalive / 4)
                work.working = [job_id for job_id, when in self._tracked.items() if when <= now]
                for job_id in work.working:
                    self._tracked[job_id] = now + self.keepalive
            if self._holding and now >= self._watch_at:
                self._watch_at = now + self.watch
                work.watch = True
            work.acks = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            if work.acks or work.working or work.watch or work.holds or work.releases:
                return work
            if self._closed:
                return None
            wakes = [self._scan_at] if self._tracked else []
            if self._holding:
                wakes.append(self._watch_at)
            self._cond.wait(max(0.0, min(wakes) - now) if wakes else None)

    def _do(self, client: Client, work: _Work) -> None:
        for job_ids, node in work.holds:
            client.hold(job_ids, node)
        if work.releases:
            client.release(*work.releases)
        if work.acks:
            self._send_acks(client, work.acks)
        for job_id in work.working:
            self._working(client, job_id)
        if work.watch:
            try:
                client.check_held()
            except Exception:  # the acks above were sent: not counted lost
                log.exception("checking the nodes of the jobs held failed (carrying on)")

    def _send_acks(self, client: Client, batch: list[str]) -> None:
        for attempt in range(self.attempts):
            try:
                client.ack_job(*batch)
                return
            except DisqueError as e:
                error = e
                if attempt + 1 < self.attempts:
                    time.sleep(0.2 * (attempt + 1))
        self.lost += len(batch)
        log.warning(
            "ACKJOB of %d jobs failed (%s: %s): they will be delivered again after their RETRY",
            len(batch),
            type(error).__name__,
            error,
        )

    def _working(self, client: Client, job_id: str) -> None:
        try:
            client.working(job_id)
        except (TooLateError, NoJobError) as e:
            with self._cond:
                self._tracked.pop(job_id, None)
            log.warning("WORKING %s: %s; the job may be delivered again", job_id, e)
        except DisqueError as e:
            log.info("WORKING %s failed (%s); trying again later", job_id, e)


@dataclass
class _Work:
    """What the acknowledging thread does in one turn, in this order."""

    holds: list[tuple[list[str], Address | None]]
    releases: list[str]
    acks: list[str] = field(default_factory=list)
    working: list[str] = field(default_factory=list)
    watch: bool = False


def track_delivered(acks: Acknowledger, fetcher: Client, jobs: Sequence[Job]) -> None:
    """Hand jobs ``fetcher`` got to ``acks`` to hold, each with the node
    that delivered it (a client that fetches for an Acknowledger holds
    nothing itself: ``hold_jobs=False``)."""
    by_node: dict[Address | None, list[str]] = {}
    for job in jobs:
        by_node.setdefault(fetcher.router.delivered_by(job.id), []).append(job.id)
    for node, job_ids in by_node.items():
        acks.track(job_ids, node)


def add_dead_letter(client: Client, queue: str, letter: DeadLetter, *, ttl: int | None) -> str:
    """ADDJOB ``queue`` (a ``<queue>:dead``) with the letter as JSON, with
    the node's default replication; refused for that (-NOREPL: a node of
    the cluster is out), with fewer copies, down to one (a warning says
    so), as the worker does, each try sent as often as any command
    (``max_attempts``). Returns the dead letter's job ID."""
    replicate: int | None = None
    retries = client.options.max_attempts - 1
    while True:
        try:
            return client.add_job(
                queue, letter.to_json(), ttl=ttl, replicate=replicate, retries=retries
            )
        except NoReplError:
            replicate = 2 if replicate is None else replicate - 1
            if replicate < 1:
                raise
            log.warning(
                "dead letter for %s refused with the default replication: trying %d cop%s",
                letter.id,
                replicate,
                "y" if replicate == 1 else "ies",
            )


def each_node(
    shared: SharedClient, call: Callable[[Client], T], *, options: dict[str, Any]
) -> tuple[list[T], list[Address]]:
    """Run ``call`` on every node the cluster lists as usable (HELLO
    priority below 100), each through a client of its own that does not
    move elsewhere. Returns the results, and the nodes that could not
    answer (left out of the results)."""
    with shared() as client:
        hello = client.hello()
        current = client.current_node
        password = client.options.password
    addresses: list[Address] = []
    for node in hello.nodes:
        if node.priority >= 100:
            continue
        address = node.address if node.host else current
        if address is not None and address not in addresses:
            addresses.append(address)
    if not addresses and current is not None:
        addresses.append(current)
    settings = {
        **options,
        "password": password,
        "max_attempts": 1,
        "follow_producers": False,
        "connect_timeout": min(2.0, float(options.get("connect_timeout", 2.0))),
    }
    results: list[T] = []
    missed: list[Address] = []
    for address in addresses:
        try:
            with Client(address, **settings) as one:
                value = call(one)
                here = one.current_node
        except DisqueError:
            missed.append(address)
            continue
        if here != address:  # it could not reach that node and moved
            missed.append(address)
            continue
        results.append(value)
    return results, missed


def count_jobs(
    shared: SharedClient,
    queue: str,
    states: Sequence[str],
    *,
    options: dict[str, Any],
) -> int:
    """How many distinct jobs of ``queue`` in these states the usable nodes
    hold (JSCAN on each; a job held by several nodes counts once)."""
    found, _missed = each_node(
        shared, lambda c: set(c.jscan(queue=queue, states=states)), options=options
    )
    return len(set().union(*found)) if found else 0


def purge_queue(shared: SharedClient, queue: str, *, options: dict[str, Any]) -> int:
    """Acknowledge every job queued in ``queue`` on the usable nodes: they
    will not be delivered (jobs being worked on are left alone). Returns
    how many were found."""
    found, _missed = each_node(
        shared, lambda c: list(c.jscan(queue=queue, states=["queued"])), options=options
    )
    ids = sorted(set().union(*found)) if found else []
    for start in range(0, len(ids), 1000):
        with shared() as client:
            client.ack_job(*ids[start : start + 1000])
    return len(ids)
