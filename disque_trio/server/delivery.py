"""Delivery: one task per queue while that queue has blocked consumers.

A queue's task starts when the core asks for it (a ``WakeQueue`` effect: a
consumer blocked on the queue, or jobs arrived while consumers wait) and
ends when nobody waits on the queue any more, so queues without waiting
consumers cost no task. Each round it asks the core to hand the queue's jobs
to its consumers, oldest consumer first (``Node.serve_waiters``), then
sleeps until the next wake-up or until the core's federation deadline for
the queue, when it asks the core to send NEEDJOBS; the core keeps every
decision (how many jobs, whom to ask, the back-off) and its tests.

The service knows nothing of the node but the :class:`DeliveryHost` calls.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio


class DeliveryHost(Protocol):
    """What delivery needs of the node (``NodeServer`` provides it)."""

    def serve_queue(self, name: str) -> bool:
        """Hand the queue's jobs to its waiting consumers and commit; False
        when nobody waits on it any more."""
        ...

    def federation_due(self, name: str) -> int | None:
        """When to ask other nodes for jobs of the queue (node-time ms)."""
        ...

    def ask_for_jobs(self, name: str) -> None:
        """Send NEEDJOBS as the core decides, and commit."""
        ...

    def now_ms(self) -> int: ...


class Delivery:
    def __init__(self, host: DeliveryHost) -> None:
        self.host = host
        # Queue name -> the event its task sleeps on, while the task runs.
        self._running: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def tasks(self) -> int:
        return len(self._running)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def wake(self, name: str) -> None:
        """A WakeQueue effect: the queue's task runs a round soon (started
        if it was not running)."""
        event = self._running.get(name)
        if event is not None:
            event.set()
        elif self._nursery is not None:
            self._running[name] = trio.Event()
            self._nursery.start_soon(self._queue_task, name, name=f"delivery {name!r}")

    async def _queue_task(self, name: str) -> None:
        host = self.host
        try:
            while host.serve_queue(name):
                due = host.federation_due(name)
                delay = math.inf if due is None else max(0.0, (due - host.now_ms()) / 1000)
                with trio.move_on_after(delay) as timeout:
                    await self._running[name].wait()
                self._running[name] = trio.Event()
                if timeout.cancelled_caught:
                    host.ask_for_jobs(name)
        finally:
            del self._running[name]
