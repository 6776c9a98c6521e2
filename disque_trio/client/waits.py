"""Waiting for jobs to be done (WAITJOB), sans I/O: which command next,
what came back, and what to tell the caller.

    wait = JobWait(job_ids, timeout=30.0, poll=5.0, now=clock())
    while (command := wait.next_command(clock())) is not None:
        wait.feed(send_and_parse(command))
    outcomes = wait.result(router, clock())

A long wait is sent as WAITJOB slices of at most ``poll`` seconds, like
GETJOB: the connection is checked that often, and the IDs already done are
not asked again. Slicing loses nothing: a job done between two slices
leaves its tombstone on the node (docs/commands.md, WAITJOB), and a node
answers ``unknown`` only at the call, never after a wait.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .cluster import Router
from .commands import Command, waitjob
from .errors import JobNodeUnavailableError

__all__ = ["JobWait"]


class JobWait:
    def __init__(
        self, job_ids: Sequence[str], *, timeout: float | None, poll: float, now: float
    ) -> None:
        if not job_ids:
            raise ValueError("no job ID to wait for")
        self.job_ids = list(job_ids)
        self.deadline = None if timeout is None else now + max(0.0, timeout)
        self.poll = poll
        self.outcomes: dict[str, str] = {}
        self._asked = False

    @property
    def waiting(self) -> list[str]:
        return [j for j in dict.fromkeys(self.job_ids) if j not in self.outcomes]

    def next_command(self, now: float) -> Command[list[str]] | None:
        """The next WAITJOB slice, or None when every job is done or the
        time is up (after at least one call)."""
        waiting = self.waiting
        if not waiting:
            return None
        left = self.poll if self.deadline is None else min(self.poll, self.deadline - now)
        if left <= 0 and self._asked:
            return None
        self._asked = True
        return waitjob(*waiting, timeout_ms=max(1, math.ceil(left * 1000)))

    def feed(self, outcomes: list[str], command: Command[list[str]]) -> None:
        for job_id, outcome in zip(command.job_ids, outcomes, strict=True):
            if outcome != "pending":
                self.outcomes[job_id] = outcome

    def result(self, router: Router, now: float) -> dict[str, str]:
        """Each ID's outcome, in the order asked (``pending`` for those not
        done in time). Raises JobNodeUnavailableError when a job reads
        ``unknown`` while the node that created it cannot be reached: the
        node that answered holds no copy, so nobody can say."""
        lost = [
            j for j, o in self.outcomes.items() if o == "unknown" and router.creator_out(j, now)
        ]
        if lost:
            raise JobNodeUnavailableError(
                f"cannot tell what became of {', '.join(lost)}: the node that created "
                "it is out of reach, and the node asked holds no copy"
            )
        return {j: self.outcomes.get(j, "pending") for j in self.job_ids}
