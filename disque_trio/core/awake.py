"""The awake index: every job timer in one structure ordered by due time.

Timers are data, never a task per job. Each job records in ``job.awake`` the
one time the node must look at it next (the earliest of: delay elapsed,
WILLQUEUE advance, re-queue, expiry, next collection attempt). The index is a
binary heap of ``(due_ms, job_id)`` entries with lazy deletion: moving a job's
timer pushes a new entry and leaves the old one behind; an entry whose time no
longer matches ``job.awake`` (or whose job is gone) is skipped when popped.
That keeps every update O(log n) with no search, and an entry costs one small
tuple (the job ID string is shared with the job). When stale entries outnumber
live ones the heap is rebuilt, so memory stays proportional to the jobs held.
The check runs on every update, not only when timers fire: a client looping
NACK/GETJOB or WORKING on one job reschedules it without any timer coming due.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Protocol


class Timed(Protocol):
    """Anything with one timer: jobs, and queues (idle eviction)."""

    id: str
    awake: int


Lookup = Callable[[str], Timed | None]


class AwakeIndex:
    __slots__ = ("_heap", "_live", "_lookup")

    # Stale entries tolerated beyond the live ones before a rebuild: keeps
    # small indexes from rebuilding all the time (tests lower it).
    COMPACT_SLACK = 1024

    def __init__(self, lookup: Lookup | None = None) -> None:
        self._heap: list[tuple[int, str]] = []
        # Jobs currently indexed (job.awake != 0): lets us know when to compact.
        self._live = 0
        # How to find a job by ID, to tell stale entries from live ones when
        # compacting on update (the node passes its registry's ``get``).
        self._lookup = lookup

    def __len__(self) -> int:
        return self._live

    @property
    def stored(self) -> int:
        """Heap entries held, live and stale (for memory accounting, tests)."""
        return len(self._heap)

    def schedule(self, job: Timed, due_ms: int) -> None:
        """Set the job's single timer to ``due_ms`` (replacing any earlier one)."""
        if job.awake == due_ms:
            return
        if job.awake == 0:
            self._live += 1
        job.awake = due_ms
        heapq.heappush(self._heap, (due_ms, job.id))
        if self._lookup is not None:
            self._maybe_compact(self._lookup)

    def unschedule(self, job: Timed) -> None:
        """Forget the job's timer (the job is being deleted)."""
        if job.awake:
            job.awake = 0
            self._live -= 1
            if self._lookup is not None:
                self._maybe_compact(self._lookup)

    def next_due(self, lookup: Lookup) -> int | None:
        """The earliest live due time, dropping stale heads on the way."""
        heap = self._heap
        while heap:
            due, job_id = heap[0]
            job = lookup(job_id)
            if job is not None and job.awake == due:
                return due
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int, lookup: Lookup) -> Iterator[Timed]:
        """Yield (and unindex) jobs whose timer is due, earliest first.

        A job the caller re-schedules while iterating is pushed back into the
        heap and comes out again only if its new time is also due.
        """
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            due, job_id = heapq.heappop(heap)
            job = lookup(job_id)
            if job is None or job.awake != due:
                continue
            job.awake = 0
            self._live -= 1
            yield job
        self._maybe_compact(lookup)

    def _maybe_compact(self, lookup: Lookup) -> None:
        # Rebuild once stale entries exceed a quarter of the live ones: the
        # rebuild costs O(live) and frees at least live/4 entries, so its cost
        # per update stays constant while memory stays within 1.25x.
        if len(self._heap) <= self._live + (self._live >> 2) + self.COMPACT_SLACK:
            return
        live = []
        for due, job_id in self._heap:
            job = lookup(job_id)
            if job is not None and job.awake == due:
                live.append((due, job_id))
        heapq.heapify(live)
        # In place: a pop_due() generator in progress holds this same list.
        self._heap[:] = live

    def shift(self, delta_ms: int, lookup: Lookup) -> None:
        """Move every live timer by ``delta_ms`` (the wall clock stepped),
        dropping the stale entries on the way."""
        live = []
        for due, key in self._heap:
            timed = lookup(key)
            if timed is not None and timed.awake == due:
                live.append((due + delta_ms, key))
        for due, key in live:
            timed = lookup(key)
            assert timed is not None
            timed.awake = due
        heapq.heapify(live)  # already a heap (same order) unless stale entries went
        self._heap[:] = live

    def compact(self, lookup: Lookup) -> None:
        """Drop stale entries now if they dominate (called on deletes too)."""
        self._maybe_compact(lookup)

    def clear(self) -> None:
        self._heap.clear()
        self._live = 0
