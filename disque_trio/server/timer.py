"""The timer task and the cron task: the node's two clocks.

The core keeps every timer as data (the awake index, ``core/awake.py``) and
says when it next has work (``next_deadline``). The :class:`Timer` task
sleeps until then (at most a second, so that a wall-clock jump is noticed),
runs the due timers and commits; whoever changes the deadline (any commit)
pulls it earlier with :meth:`Timer.reschedule`. Deadlines are rounded up
to a grain of GRAIN_MS: the timers due within one grain run in one tick,
so their bus messages leave in one commit and one write per peer. The
:class:`Cron` task runs housekeeping ten times a second. Neither knows the
node: each takes the few callables it drives.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

MAX_SLEEP_S = 1.0  # the timer looks at the clock at least this often
# A tick runs every timer due by the end of its grain (never one not yet
# due). Job timers count in seconds (RETRY, DELAY, TTL; the WILLQUEUE
# advance is 500 ms, a replication try 50 ms), so 10 ms late changes no
# outcome; what it saves is the cost of a tick per distinct millisecond. Jobs
# with RETRY 1 on three holders announce and answer each other all the time
# (WILLQUEUE, QUEUED): with 500 of them on seven nodes, that chatter alone
# took 1.4 to 1.6 cores at a tick per millisecond, 0.9 to 1.0 with the grain
# (the same messages, fewer wake-ups, commits and writes). The core puts
# those timers on a coarser grid of its own (core/node.py, CHATTER_GRID_MS).
GRAIN_MS = 10
CRON_PERIOD_S = 0.1  # ten times a second, like the original's serverCron


class Timer:
    """Runs ``tick`` when ``next_deadline()`` (node-time ms) is reached."""

    def __init__(
        self,
        next_deadline: Callable[[], int | None],
        now_ms: Callable[[], int],
        tick: Callable[[], None],
    ) -> None:
        self._next_deadline = next_deadline
        self._now_ms = now_ms
        self._tick = tick
        self._scope: trio.CancelScope | None = None
        self._due_ms: int | None = None

    async def run(self) -> None:
        while True:
            now = self._now_ms()
            due = self._next_deadline()
            due = self._due_ms = None if due is None else _grain(due)
            delay = MAX_SLEEP_S if due is None else min(MAX_SLEEP_S, max(0.0, (due - now) / 1000))
            with trio.CancelScope(deadline=trio.current_time() + delay) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            self._tick()

    def reschedule(self, due: int | None) -> None:
        """A commit moved the next deadline: wake earlier if it is sooner."""
        if due is None or self._scope is None:
            return
        due = _grain(due)
        if self._due_ms is None or due < self._due_ms:
            self._due_ms = due
            delay = max(0.0, (due - self._now_ms()) / 1000)
            self._scope.deadline = trio.current_time() + delay


def _grain(due: int) -> int:
    """The end of the grain ``due`` falls in (itself when on a boundary)."""
    return -(-due // GRAIN_MS) * GRAIN_MS


class Cron:
    """Calls ``every_tick`` ten times a second and ``every_second`` once a
    second (after that tick's work)."""

    def __init__(self, every_tick: Callable[[], None], every_second: Callable[[], None]) -> None:
        self._every_tick = every_tick
        self._every_second = every_second

    async def run(self) -> None:
        ticks = 0
        while True:
            await trio.sleep(CRON_PERIOD_S)
            self._every_tick()
            ticks += 1
            if ticks % 10 == 0:
                self._every_second()
