"""The timer task and the cron task: the node's two clocks.

The core keeps every timer as data (the awake index, ``core/awake.py``) and
says when it next has work (``next_deadline``). The :class:`Timer` task
sleeps until then (at most a second, so that a wall-clock jump is noticed),
runs the due timers and commits; whoever changes the deadline (any commit)
pulls it earlier with :meth:`Timer.reschedule`. The timer wakes at the
millisecond a timer is due: the core batches the frequent ones itself (its
chatter slots, ``core/node.py``), and the rest need their own time. The
:class:`Cron` task runs housekeeping ten times a second. Neither knows the
node: each takes the few callables it drives.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..env import Alarm, ScopeAlarm

MAX_SLEEP_S = 1.0  # the timer looks at the clock at least this often
# No grain of its own. Deadlines were once rounded up to 10 ms, so that the
# timers due within one grain ran in one tick (one commit, one write per
# peer): that halved the cost of RETRY 1 announcements before the core put
# them on its 100 ms chatter slots. With the slots the grain saved nothing
# (bench/bench_chatter.py, seven nodes, 1,000 RETRY 1 jobs: 0.66 and 0.74
# cores with it, 0.57 and 0.63 without), and it cost duplicates: two holders
# whose re-queue times fell in one grain re-queued in the same millisecond
# at its end, past the random time error meant to keep them apart, and both
# queued the job.
CRON_PERIOD_S = 0.1  # ten times a second, like the original's serverCron


class Timer:
    """Runs ``tick`` when ``next_deadline()`` (node-time ms) is reached."""

    def __init__(
        self,
        next_deadline: Callable[[], int | None],
        now_ms: Callable[[], int],
        tick: Callable[[], None],
        alarm: Alarm | None = None,
    ) -> None:
        self._next_deadline = next_deadline
        self._now_ms = now_ms
        self._tick = tick
        self._alarm = ScopeAlarm() if alarm is None else alarm
        self._sleeping = False
        self._due_ms: int | None = None
        self._wake_at = 0.0  # the Trio time the current sleep ends

    async def run(self) -> None:
        while True:
            now = self._now_ms()
            due = self._next_deadline()
            self._due_ms = due
            delay = MAX_SLEEP_S if due is None else min(MAX_SLEEP_S, max(0.0, (due - now) / 1000))
            self._sleeping = True
            self._wake_at = trio.current_time() + delay
            try:
                await self._alarm.sleep_until(self._wake_at)
            finally:
                self._sleeping = False
            self._tick()

    def reschedule(self, due: int | None) -> None:
        """A commit moved the next deadline: wake earlier if it is sooner.

        Only ever earlier than the sleep already set: the sleep is capped at
        MAX_SLEEP_S so that a wall-clock jump is noticed, and a deadline far
        off in node time (say, after the clock stepped back) must not stretch
        it. A deadline later than the wake is picked up when the timer wakes.
        """
        if due is None or not self._sleeping:
            return
        if self._due_ms is None or due < self._due_ms:
            self._due_ms = due
            delay = min(MAX_SLEEP_S, max(0.0, (due - self._now_ms()) / 1000))
            wake_at = trio.current_time() + delay
            if wake_at < self._wake_at:
                self._wake_at = wake_at
                self._alarm.move(wake_at)


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
