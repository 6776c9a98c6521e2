"""Clients blocked inside the core, waiting for something the core decides.

The core cannot await, so a command that must wait (GETJOB on empty queues,
ADDJOB until replicated, WAITJOB until its jobs are done) returns a
:class:`Waiter`. The core fills in
``reply`` when the wait is over and records a ``Wake`` effect
(``Node.finish_wait``); the shell wakes the client at its commit point. If
the shell gives up first (timeout, client gone, shutdown) it calls
``Node.cancel_wait``; whichever happens first wins, and ``done`` tells
which. ``wake`` is the shell's: what it calls for a ``Wake`` (a
``trio.Event.set`` in production).
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.replies import Reply


def _nothing() -> None:
    return None


class Waiter:
    __slots__ = (
        "count",
        "done",
        "durable",
        "job_id",
        "outcomes",
        "queues",
        "reply",
        "timeout_ms",
        "wake",
        "watch",
        "withcounters",
    )

    def __init__(
        self,
        *,
        queues: tuple[str, ...] = (),
        count: int = 1,
        withcounters: bool = False,
        job_id: str | None = None,
        watch: tuple[str, ...] = (),
        timeout_ms: int = 0,
    ) -> None:
        self.queues = queues  # GETJOB: queue names, deduplicated, in order
        self.count = count
        self.withcounters = withcounters
        self.job_id = job_id  # ADDJOB: the job waiting for replication
        # WAITJOB: the IDs asked for, in order, and what is known of each
        # (None while it is not done; Node.settle_job fills them in).
        self.watch = watch
        self.outcomes: dict[str, str | None] = {}
        self.timeout_ms = timeout_ms  # 0 = wait forever; the shell enforces it
        self.reply: Reply = None
        self.done = False
        # The AOF sequence number its reply must wait for (set by the shell
        # when it applies the Wake; 0: none).
        self.durable = 0
        self.wake: Callable[[], None] = _nothing

    def finish(self, reply: Reply) -> None:
        self.reply = reply
        self.done = True
