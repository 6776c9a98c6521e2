"""``AckBatcher``: the acknowledgements of handled jobs, sent together.

One ACKJOB (or FASTACK) per job cost the worker a round trip, two system
calls and a pooled connection per job, and the node a command per job.
Here a job's ID joins the open batch of its kind and its handler's task
waits for the batch's answer; one background task sends the batches, one
command at a time (the client splits it per node). What finishes while a
batch is on its way forms the next one (a group commit): when the worker
is idle a batch leaves in the scheduler pass after the first ID joined it,
holding whatever finished in the same pass, so no job waits for a timer;
under load batches grow by themselves, up to ``max_batch`` IDs.

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

    def __init__(self, *, max_batch: int = 500) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.max_batch = max_batch
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
