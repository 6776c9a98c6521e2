"""The awake index: every job timer in one structure ordered by due time.

Timers are data, never a task per job. Each job records in ``job.awake`` the
one time the node must look at it next (the earliest of: delay elapsed,
WILLQUEUE advance, re-queue, expiry, next collection attempt). The index
groups timers by due time: a dict from each due time to the keys (job IDs)
due then, and a binary heap holding each due time once. Under load many
jobs share a millisecond (re-queue times are spread over a second, so a
node adding thousands of jobs a second puts several in each), and a job then
costs one list slot in its group, the ID string being shared with the job;
a lone timer costs its dict entry, the key stored bare.

Deletion is lazy: moving a job's timer files its key under the new time and
leaves the old entry behind; an entry whose time no longer matches
``job.awake`` (or whose job is gone) is skipped when its group comes due.
That keeps every update O(log n) at worst with no search. When stale entries
outnumber live ones the groups are rebuilt, so memory stays proportional to
the jobs held. The check runs on every update, not only when timers fire: a
client looping NACK/GETJOB or WORKING on one job reschedules it without any
timer coming due.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol


class Timed(Protocol):
    """Anything with one timer: jobs, and queues (idle eviction)."""

    id: str
    awake: int


Lookup = Callable[[str], Timed | None]
# The keys due at one time: one bare key, or a list of two or more.
Group = str | list[str]


def _keys(group: Group) -> list[str] | tuple[str]:
    return group if isinstance(group, list) else (group,)


class AwakeIndex:
    __slots__ = ("_due", "_groups", "_live", "_lookup", "_stored")

    # Stale entries tolerated beyond the live ones before a rebuild: keeps
    # small indexes from rebuilding all the time (tests lower it).
    COMPACT_SLACK = 1024

    def __init__(self, lookup: Lookup | None = None) -> None:
        self._groups: dict[int, Group] = {}
        # Every key of _groups once, as a heap: the next group due on top.
        self._due: list[int] = []
        # Jobs currently indexed (job.awake != 0), and entries stored (live
        # and stale): their gap says when to compact.
        self._live = 0
        self._stored = 0
        # How to find a job by ID, to tell stale entries from live ones when
        # compacting on update (the node passes its registry's ``get``).
        self._lookup = lookup

    def __len__(self) -> int:
        return self._live

    @property
    def stored(self) -> int:
        """Entries held, live and stale (for memory accounting, tests)."""
        return self._stored

    def schedule(self, job: Timed, due_ms: int) -> None:
        """Set the job's single timer to ``due_ms`` (replacing any earlier one)."""
        if job.awake == due_ms:
            return
        if job.awake == 0:
            self._live += 1
        job.awake = due_ms
        groups = self._groups
        group = groups.get(due_ms)
        if group is None:
            groups[due_ms] = job.id
            heapq.heappush(self._due, due_ms)
        elif isinstance(group, list):
            group.append(job.id)
        else:
            groups[due_ms] = [group, job.id]
        self._stored += 1
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
        """The earliest live due time, dropping stale entries on the way."""
        heap, groups = self._due, self._groups
        while heap:
            due = heap[0]
            group = groups[due]
            keys = _keys(group)
            for i, key in enumerate(keys):
                timed = lookup(key)
                if timed is not None and timed.awake == due:
                    if i and isinstance(keys, list):  # its stale head goes
                        del keys[:i]
                        self._stored -= i
                    return due
            heapq.heappop(heap)
            del groups[due]
            self._stored -= len(keys)
        return None

    def pop_due(self, now_ms: int, lookup: Lookup, limit: int | None = None) -> list[Timed]:
        """Unindex and return the jobs whose timer is due, earliest first
        (by key for one due time, so the order never depends on history),
        at most ``limit`` of them: the others stay filed, still due.

        A job the caller re-schedules after this is filed again, and comes
        out of the next call only if its new time is also due.
        """
        heap, groups = self._due, self._groups
        out: list[Timed] = []
        while heap and heap[0] <= now_ms:
            if limit is not None and len(out) >= limit:
                break
            due = heapq.heappop(heap)
            group = groups.pop(due)
            keys = sorted(group) if isinstance(group, list) else [group]
            self._stored -= len(keys)
            for i, key in enumerate(keys):
                if limit is not None and len(out) >= limit:
                    # The rest of this time's group goes back, due first.
                    rest = keys[i:]
                    groups[due] = rest if len(rest) > 1 else rest[0]
                    heapq.heappush(heap, due)
                    self._stored += len(rest)
                    break
                timed = lookup(key)
                if timed is None or timed.awake != due:
                    continue
                timed.awake = 0
                self._live -= 1
                out.append(timed)
        self._maybe_compact(lookup)
        return out

    def _maybe_compact(self, lookup: Lookup) -> None:
        # Rebuild once stale entries exceed a quarter of the live ones: the
        # rebuild costs O(live) and frees at least live/4 entries, so its cost
        # per update stays constant while memory stays within 1.25x.
        if self._stored <= self._live + (self._live >> 2) + self.COMPACT_SLACK:
            return
        self._rebuild(lookup, 0)

    def _rebuild(self, lookup: Lookup, delta_ms: int) -> None:
        """Keep the live entries only (each once), moved by ``delta_ms``.
        In place: the caller may hold these objects."""
        kept_groups: list[tuple[int, list[str]]] = []
        for due, group in self._groups.items():
            kept = [
                key
                for key in dict.fromkeys(_keys(group))
                if (timed := lookup(key)) is not None and timed.awake == due
            ]
            if kept:
                kept_groups.append((due, kept))
        live: dict[int, Group] = {}
        stored = 0
        for due, kept in kept_groups:
            if delta_ms:
                due += delta_ms  # one int object for the whole group
                for key in kept:
                    timed = lookup(key)
                    assert timed is not None
                    timed.awake = due
            live[due] = kept[0] if len(kept) == 1 else kept
            stored += len(kept)
        self._groups.clear()
        self._groups.update(live)
        self._due[:] = live
        heapq.heapify(self._due)
        self._stored = stored

    def shift(self, delta_ms: int, lookup: Lookup) -> None:
        """Move every live timer by ``delta_ms`` (the wall clock stepped),
        dropping the stale entries on the way."""
        self._rebuild(lookup, delta_ms)

    def compact(self, lookup: Lookup) -> None:
        """Drop stale entries now if they dominate (called on deletes too)."""
        self._maybe_compact(lookup)

    def clear(self) -> None:
        self._groups.clear()
        self._due.clear()
        self._live = 0
        self._stored = 0
