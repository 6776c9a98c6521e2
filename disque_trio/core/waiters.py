"""Clients blocked inside the core, waiting for something the core decides.

The core cannot await, so a command that must wait (GETJOB on empty queues,
ADDJOB until replicated) returns a :class:`Waiter`. The core fills in
``reply`` when the wait is over and calls ``notify`` (set by the shell; in
production it sets a ``trio.Event``). If the shell gives up first (timeout,
client gone, shutdown) it calls ``Node.cancel_wait``; whichever happens first
wins, and ``done`` tells which.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.replies import Reply


def _no_notify() -> None:
    return None


class Waiter:
    __slots__ = (
        "count",
        "done",
        "job_id",
        "notify",
        "queues",
        "reply",
        "timeout_ms",
        "withcounters",
    )

    def __init__(
        self,
        *,
        queues: tuple[str, ...] = (),
        count: int = 1,
        withcounters: bool = False,
        job_id: str | None = None,
        timeout_ms: int = 0,
    ) -> None:
        self.queues = queues  # GETJOB: queue names, deduplicated, in order
        self.count = count
        self.withcounters = withcounters
        self.job_id = job_id  # ADDJOB: the job waiting for replication
        self.timeout_ms = timeout_ms  # 0 = wait forever; the shell enforces it
        self.reply: Reply = None
        self.done = False
        self.notify: Callable[[], None] = _no_notify

    def finish(self, reply: Reply) -> None:
        self.reply = reply
        self.done = True
        self.notify()
