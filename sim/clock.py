"""Timers for the simulator's virtual clock: callbacks that Trio's run loop
runs at a virtual time, with no task.

The World runs under ``trio.testing.MockClock(autojump_threshold=0)``:
whenever every task is blocked, the run loop calls the clock's
``_autojump``, which jumps virtual time to the next deadline. ``Timers``
replaces that method on the World's clock (MockClock is final; the run loop
asserts the clock is one): at each autojump the timers due before the next
deadline run first, time jumping to theirs. The network delivers its chunks
that way: a task sleeping until each chunk is due would cost a cancel scope,
a Cancelled exception and a task step per chunk.

A callback must not block or raise (it runs inside the run loop); it may
wake tasks (put data in a stream, set an Event), which then run. A canary
test in tests/sim watches the private hook (``_autojump``). At rate 0 (the
World's) the clock's ``current_time`` is answered without reading the real
clock; the rate must then stay 0.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import trio
import trio.testing


class Timers:
    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0
        clock._autojump = self._autojump  # type: ignore[method-assign]  # see the module doc
        if clock.rate == 0:
            # At rate 0 MockClock's time is its virtual base plus 0 times the
            # real time elapsed: the same float without reading the real
            # clock (asked tens of thousands of times a run).
            clock.current_time = lambda: clock._virtual_base  # type: ignore[method-assign]

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at virtual time ``when`` (at the next moment every
        task is blocked if ``when`` has passed). Timers due at the same time
        run in the order they were set."""
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, fn))

    def _autojump(self) -> None:
        """Every task is blocked: run the timers due by the next deadline
        (jumping to the first of them), or else jump to that deadline."""
        clock, heap = self.clock, self._heap
        now = clock.current_time()
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if heap and heap[0][0] <= now + jump:
            due = heap[0][0]
            if due > now:
                clock.jump(due - now)
            while heap and heap[0][0] <= due:
                heapq.heappop(heap)[2]()
        elif 0 < jump < math.inf:
            clock.jump(jump)
