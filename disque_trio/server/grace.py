"""One timer for the grace periods of every blocked command.

A command that blocks (a synchronous ADDJOB waiting for its copies, a
GETJOB on an empty queue) waits a short grace period before its
connection's reader takes over the input (``connections.py``). A cancel
scope with a deadline for each wait cost about 8 us (Trio files each
deadline and removes it again), and a replicated ADDJOB waits every time.
All waits of one kind have the same grace, so their ends come in the order
the waits began: a queue of entries, oldest first, and one task sleeping
until the oldest one still waiting is due, do the same for all of them.

A wait that ends before its grace leaves its entry in the queue, disarmed
(:meth:`Grace.disarm`): the task drops it when it reaches it, so ending a
wait costs nothing either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio


class GraceEntry:
    """One wait's grace: its end (Trio time), what to call then (None
    once disarmed or called), and whether it was called."""

    __slots__ = ("due", "expired", "wake")

    def __init__(self, due: float, wake: Callable[[], None]) -> None:
        self.due = due
        self.wake: Callable[[], None] | None = wake
        self.expired = False


class Grace:
    """The grace periods of ``period`` seconds; :meth:`run` is their timer."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._entries: deque[GraceEntry] = deque()
        # Set when an entry arrives while the timer waits for one.
        self._arrived: trio.Event | None = None

    def arm(self, wake: Callable[[], None]) -> GraceEntry:
        """Call ``wake`` ``period`` seconds from now, unless disarmed."""
        entry = GraceEntry(trio.current_time() + self.period, wake)
        self._entries.append(entry)
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None
        return entry

    @staticmethod
    def disarm(entry: GraceEntry) -> None:
        entry.wake = None

    async def run(self) -> None:
        entries = self._entries
        while True:
            while entries and entries[0].wake is None:
                entries.popleft()
            if not entries:
                self._arrived = arrived = trio.Event()
                await arrived.wait()
                continue
            head = entries[0]
            if head.due > trio.current_time():
                # Wakes at the oldest entry's end even if its wait ends
                # first: a few times a second under load, not once a wait.
                await trio.sleep_until(head.due)
                continue
            entries.popleft()
            wake, head.wake = head.wake, None
            head.expired = True
            assert wake is not None
            wake()
