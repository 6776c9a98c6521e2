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

import contextlib
import heapq
import math
from collections.abc import Callable, Iterator

import trio
import trio.testing
from trio._core import _run as trio_run
from trio._core._instrumentation import Instruments as _Instruments


class Timers:
    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        # (time, order, callback, its armed flag or None: always armed)
        self._heap: list[tuple[float, int, Callable[[], None], list[bool] | None]] = []
        self._order = 0
        clock._autojump = self._autojump  # type: ignore[method-assign]  # see the module doc
        if clock.rate == 0:
            # At rate 0 MockClock's time is its virtual base plus 0 times the
            # real time elapsed: the same float without reading the real
            # clock (asked tens of thousands of times a run).
            clock.current_time = lambda: clock._virtual_base  # type: ignore[method-assign]

    def call_at(
        self, when: float, fn: Callable[[], None], armed: list[bool] | None = None
    ) -> None:
        """Run ``fn()`` at virtual time ``when`` (at the next moment every
        task is blocked if ``when`` has passed). Timers due at the same time
        run in the order they were set. ``armed``: a flag the caller clears
        to call it off (``fn`` must then do nothing): a disarmed timer at the
        head is dropped, not jumped to (the clock would stop at its time for
        a pass of the run loop that runs no task)."""
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, fn, armed))

    def _autojump(self) -> None:
        """Every task is blocked: run the timers due by the next deadline
        (jumping to the first of them), or else jump to that deadline."""
        clock, heap = self.clock, self._heap
        while heap and (armed := heap[0][3]) is not None and not armed[0]:
            heapq.heappop(heap)
        now = clock.current_time()
        # What current_statistics().seconds_to_next_deadline computes,
        # without building the rest of the statistics (a tenth of a
        # simulated run went there).
        jump = trio_run.GLOBAL_RUN_CONTEXT.runner.deadlines.next_deadline() - now
        if heap and heap[0][0] <= now + jump:
            due = heap[0][0]
            if due > now:
                clock.jump(due - now)
            while heap and heap[0][0] <= due:
                heapq.heappop(heap)[2]()
        elif 0 < jump < math.inf:
            clock.jump(jump)


class TimerAlarm:
    """The node timer's alarm in a run (``Env.alarm``): the sleeping task
    is rescheduled by a virtual timer, with no cancel scope (the node's own
    alarm is a scope whose deadline moves: its end costs a Cancelled
    unwound through the task, and a loop pass of its own after the clock
    jumped). A move disarms the armed timer and arms one at the new time."""

    def __init__(self, timers: Timers) -> None:
        self._timers = timers
        self._task: trio.lowlevel.Task | None = None
        self._armed = [False]

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._timers.clock.current_time():
            await trio.lowlevel.checkpoint()
            return
        self._task = trio.lowlevel.current_task()
        self._arm(deadline)

        def abort(_: object) -> trio.lowlevel.Abort:
            self._armed[0] = False
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def move(self, deadline: float) -> None:
        if self._task is not None:
            self._armed[0] = False
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        armed = self._armed = [True]

        def fire() -> None:
            if armed[0]:
                armed[0] = False
                task, self._task = self._task, None
                assert task is not None
                trio.lowlevel.reschedule(task)

        self._timers.call_at(deadline, fire, armed)


# ------------------------------------------------- cheap sleeps and clock

# trio.sleep(s) is a cancel scope with a deadline around sleep_forever: when
# it ends, Trio raises Cancelled into the task and unwinds the scope. In a
# simulator run the nodes' cron tasks alone sleep fifty times a virtual
# second; ``virtual_time`` makes each sleep a timer that reschedules the
# task instead (a TimerAlarm's sleep: a cancel from an enclosing scope
# still ends it, and its abort callback disarms the timer). Only inside the
# ``with`` block, and only for a deadline still ahead (a sleep already due
# is Trio's own checkpoint).
#
# trio.current_time() goes through three calls (the run context, the
# runner, the clock) to the float the World's clock holds at rate 0; a run
# asks for it a hundred thousand times (the trace, the network, the nodes'
# clocks). Inside the block it reads that float at once: the same value.
_TRIO_SLEEP_UNTIL = trio.sleep_until
_TRIO_SLEEP = trio.sleep
_TRIO_CURRENT_TIME = trio.current_time
_active: Timers | None = None


async def _sleep_until(deadline: float) -> None:
    timers = _active
    if timers is None or deadline <= timers.clock.current_time():
        await _TRIO_SLEEP_UNTIL(deadline)
        return
    await TimerAlarm(timers).sleep_until(deadline)


async def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("duration must be non-negative")
    timers = _active
    if timers is None or seconds == 0:
        await _TRIO_SLEEP(seconds)
        return
    await _sleep_until(timers.clock.current_time() + seconds)


# With autojump_threshold=0 every pass of Trio's run loop polls for I/O
# with a zero timeout, and in a run nothing but Trio's wake-up socket is
# ever registered: the answer is nothing, one system call a pass, some
# twenty thousand a run. That socket only matters once something went
# into Trio's entry queue (run_sync_soon: an async generator's finalizer, a
# Ctrl-C, a thread's result), whose callbacks its task runs when the poll
# reports the socket. Inside the block, a zero-timeout poll with that queue
# empty answers nothing at once; any other poll is the kernel's. Linux's
# epoll manager only; others are left alone.
def _polls_when_due() -> contextlib.AbstractContextManager[None]:
    try:
        from trio._core._io_epoll import EpollIOManager
    except ImportError:  # not Linux
        return contextlib.nullcontext()
    real = EpollIOManager.get_events
    context = trio_run.GLOBAL_RUN_CONTEXT

    def get_events(self: EpollIOManager, timeout: float) -> object:
        if timeout <= 0:
            entry = context.runner.entry_queue
            if not entry.queue and not entry.idempotent_queue:
                return []
        return real(self, timeout)

    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        EpollIOManager.get_events = get_events  # type: ignore[assignment,method-assign]
        try:
            yield
        finally:
            EpollIOManager.get_events = real  # type: ignore[method-assign]

    return patched()


@contextlib.contextmanager
def virtual_time(timers: Timers) -> Iterator[None]:
    """Inside the block (which runs one ``trio.run`` with ``timers``'
    clock): trio.sleep and trio.sleep_until use ``timers``, and
    trio.current_time reads the clock's virtual time directly (module
    attributes: every ``trio.sleep(...)`` or ``trio.current_time()`` call
    sees them; Trio's own internals do not)."""
    global _active
    clock = timers.clock
    assert clock.rate == 0, "the direct read is the time at rate 0 only"

    def current_time() -> float:
        return clock._virtual_base  # MockClock's own state

    _active = timers
    trio.sleep = _sleep
    trio.sleep_until = _sleep_until
    trio.current_time = current_time
    try:
        with _polls_when_due():
            yield
    finally:
        _active = None
        trio.sleep = _TRIO_SLEEP
        trio.sleep_until = _TRIO_SLEEP_UNTIL
        trio.current_time = _TRIO_CURRENT_TIME


# ------------------------------------------------------ the hook table


# Trio's run loop asks its instruments table for a hook by name three times
# per task step (scheduled, before, after) and twice per pass
# (``"before_task_step" in runner.instruments``...): some 300,000 times in
# the ten safety phases of bench/bench_sim.py (100 simulated seconds of
# five nodes). The table is a ``collections.UserDict``: each ask is a call of
# Python code. ``fast_hook_table`` gives the running loop the same table as
# a ``dict`` subclass, whose ``in`` is the dict's own, with Trio's methods
# for adding, removing and calling instruments (they read the table
# through ``.data``, which is the dict itself here).
class _HookTable(dict[str, dict[trio.abc.Instrument, None]]):
    __slots__ = ()

    @property
    def data(self) -> _HookTable:
        return self

    add_instrument = _Instruments.add_instrument
    remove_instrument = _Instruments.remove_instrument
    call = _Instruments.call


def fast_hook_table() -> None:
    """Inside ``trio.run``: the running loop's instruments table as a
    ``_HookTable`` (the same instruments, the same hooks)."""
    runner = trio_run.GLOBAL_RUN_CONTEXT.runner
    if type(runner.instruments) is _Instruments:
        runner.instruments = _HookTable(runner.instruments.data)  # type: ignore[assignment]
