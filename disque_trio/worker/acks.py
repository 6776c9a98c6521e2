"""``AckBatcher``: the acknowledgements of handled jobs, sent together.

One ACKJOB (or FASTACK) per job cost the worker a round trip, two system
calls and a pooled connection per job, and the node a command per job.
Here a job's ID joins the open batch of its kind and its handler's task
waits for the batch's answer; one background task sends the batches, one
command at a time (the client splits it per node). What finishes while a
batch is on its way forms the next one (a group commit): under load
batches grow by themselves, up to ``max_batch`` IDs, and leave at once.
A batch of fewer than ``small`` IDs (jobs finishing one by one, as when a
producer adds them one at a time) waits ``linger`` seconds for others to
join first: a command and two wake-ups shared by several jobs instead of
paid by each, for a few milliseconds more before the job's outcome.

An ID is added only after its handler succeeded; a batch that fails (the
node went away, a timeout) is reported to every job in it, each of which
then comes back after its RETRY and runs again (at-least-once).
"""

from __future__ import annotations

from collections import deque

import anyio

from ..client import AsyncClient, DisqueError


class AckBatch:
    """IDs acknowledged by one command; ``error`` once ``done`` is set:
    None if the node answered."""

    __slots__ = ("client", "done", "error", "fast", "ids")

    def __init__(self, client: AsyncClient, fast: bool) -> None:
        self.client = client
        self.fast = fast
        self.ids: list[str] = []
        self.done = anyio.Event()
        # Until the node answers: a batch whose sending broke off in an
        # unexpected way must not count as acknowledged.
        self.error: DisqueError | None = DisqueError("the acknowledgement was not sent")


class AckBatcher:
    """Collects acknowledgements and sends them in batches (``run()`` is
    the sending task; the worker runs it while it runs)."""

    def __init__(self, *, max_batch: int = 500, linger: float = 0.005, small: int = 8) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.max_batch = max_batch
        self.linger = linger
        self.small = small
        self._open: dict[bool, AckBatch] = {}  # by kind (FASTACK or not)
        self._waiting: deque[AckBatch] = deque()
        self._ready: anyio.Event | None = None

    def add(self, client: AsyncClient, job_id: str, *, fast: bool) -> AckBatch:
        """Join the open batch of this kind; wait for its ``done``."""
        batch = self._open.get(fast)
        if batch is None:
            batch = self._open[fast] = AckBatch(client, fast)
            self._waiting.append(batch)
            if self._ready is not None:
                self._ready.set()
        batch.ids.append(job_id)
        if len(batch.ids) >= self.max_batch:
            del self._open[fast]  # full: the next ID opens another
        return batch

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Send the batches, oldest first, one command at a time."""
        task_status.started()
        while True:
            while self._waiting:
                if self.linger > 0 and len(self._waiting[0].ids) < self.small:
                    await anyio.sleep(self.linger)
                await self._send(self._waiting.popleft())
            self._ready = anyio.Event()
            await self._ready.wait()

    async def _send(self, batch: AckBatch) -> None:
        if self._open.get(batch.fast) is batch:
            del self._open[batch.fast]  # closed: later IDs wait for the next one
        try:
            if batch.fast:
                await batch.client.fast_ack(*batch.ids)
            else:
                await batch.client.ack_job(*batch.ids)
            batch.error = None
        except DisqueError as e:
            batch.error = e
        finally:
            batch.done.set()
