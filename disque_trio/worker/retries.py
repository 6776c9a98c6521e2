"""``Retries``: acknowledge a handled job, NACK a failed one to be retried
after a back-off, and move one that failed too often to the dead-letter
queue."""

from __future__ import annotations

import math
import os
import random
import traceback

import anyio

from ..client import DisqueError, NoReplError, ResponseError
from .acks import AckBatch, AckBatcher
from .context import JobContext, Next, log
from .deadletter import DeadLetter
from .logs import describe, job_fields

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Retries:
    """Acknowledge, retry or give up.

    Success: ACKJOB (FASTACK when the handler or worker says so), batched
    (``AckBatcher``, acks.py): the outcome is known once the batch's
    command is answered. Failure (an exception, a timeout): NACK with a
    DELAY (``backoff``), so the job is queued again once that has passed,
    its ``nacks`` counter raised at once; unless
    it has failed ``max_retries`` times before (its ``nacks``), or this was
    delivery number ``max_deliveries`` (1 + nacks + additional
    deliveries): then the job is added to ``<queue><suffix>`` (JSON:
    ``DeadLetter``) and acknowledged. A job that arrives already past
    ``max_deliveries`` (it kept coming back without a verdict, e.g. it
    crashes the worker) goes there without running. A dead letter the node
    refuses with -NOREPL (a node of the cluster is out) is added with fewer
    copies, down to one.

    Cancelled (shutdown): given back with ENQUEUE, shielded, within
    ``nack_timeout``. That is no failure: the node counts an additional
    delivery, not a NACK, so restarts never use up ``max_retries`` (only
    ``max_deliveries``, which is why it is much larger)."""

    def __init__(
        self,
        *,
        max_retries: int = 4,
        max_deliveries: int = 20,
        dead_letter: bool = True,
        suffix: str = ":dead",
        dead_letter_ttl: int | None = None,
        fastack: bool = False,
        nack_timeout: float = 2.0,
        max_ack_batch: int = 500,
        ack_linger: float = 0.005,
        min_backoff: float = 1.0,
        max_backoff: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be at least 0")
        if min_backoff < 0 or max_backoff < min_backoff:
            raise ValueError("the back-off needs 0 <= min_backoff <= max_backoff")
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        self.max_retries = max_retries
        self.max_deliveries = max_deliveries
        self.dead_letter = dead_letter
        self.suffix = suffix
        self.dead_letter_ttl = dead_letter_ttl
        self.fastack = fastack
        self.nack_timeout = nack_timeout
        self.acks = AckBatcher(max_batch=max_ack_batch, linger=ack_linger)
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.rng = rng or random.Random()

    def _limits(self, ctx: JobContext) -> tuple[int, int]:
        """(max_retries, max_deliveries): the handler's, else the worker's."""
        spec = ctx.spec
        retries = self.max_retries if spec.max_retries is None else spec.max_retries
        return retries, spec.max_deliveries or self.max_deliveries

    def backoff(self, ctx: JobContext) -> int:
        """Whole seconds (the node's DELAY unit) before a failed job is
        queued again: ``min_backoff`` doubled for each failure before this
        one (the job's ``nacks``), at most ``max_backoff``, and a random
        part of it (from half to all) taken, so that jobs failing together
        do not all come back together. 0: at once. The handler's settings,
        else the worker's."""
        spec = ctx.spec
        low = self.min_backoff if spec.min_backoff is None else spec.min_backoff
        high = self.max_backoff if spec.max_backoff is None else spec.max_backoff
        if low <= 0:
            return 0
        ceiling = min(high, low * 2.0 ** min(ctx.job.nacks, 64))
        return math.ceil(self.rng.uniform(ceiling / 2, ceiling))

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        job = ctx.job
        max_retries, max_deliveries = self._limits(ctx)
        if self.dead_letter and job.deliveries > max_deliveries:
            ctx.error = RuntimeError(
                f"delivered {job.deliveries} times (limit {max_deliveries}) without a verdict"
            )
            ctx.outcome = "failed"
            await self._bury(ctx, "")
            return
        try:
            await call_next()
        except anyio.get_cancelled_exc_class():
            ctx.outcome = "interrupted"
            with anyio.CancelScope(shield=True):
                await ctx.worker.fetches_returned()
                with anyio.move_on_after(self.nack_timeout):
                    await self._give_back(ctx)
            raise
        except Exception as e:
            ctx.error = e
            ctx.outcome = "failed"
            last = job.nacks >= max_retries or job.deliveries >= max_deliveries
            if self.dead_letter and last:
                await self._bury(ctx, _handler_traceback(e))
            else:
                await self._nack(ctx)
            return
        await self._ack(ctx)

    async def _ack(self, ctx: JobContext) -> None:
        fast = ctx.spec.fastack if ctx.spec.fastack is not None else self.fastack
        batch = self.acks.add(ctx.client, ctx.job.id, fast=fast)
        try:
            await batch.done.wait()
        except anyio.get_cancelled_exc_class():
            # Stopped at once while the ack was on its way: it is sent all
            # the same (the batcher outlives the handlers); learn how it went.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.nack_timeout):
                await batch.done.wait()
            self._acked(ctx, batch)
            raise
        self._acked(ctx, batch)

    @staticmethod
    def _acked(ctx: JobContext, batch: AckBatch) -> None:
        if batch.done.is_set() and batch.error is None:
            ctx.outcome = "done"
        else:
            # Handled, but the ack was lost: the job will come back after
            # its RETRY and run again (at-least-once).
            ctx.outcome = "lost"
            ctx.error = batch.error or DisqueError("no answer to the acknowledgement in time")

    async def _give_back(self, ctx: JobContext) -> None:
        try:
            ctx.notes["enqueued"] = await ctx.client.enqueue(ctx.job.id)
        except DisqueError as e:
            ctx.notes["enqueue_error"] = str(e)  # RETRY will queue it again anyway

    async def _nack(self, ctx: JobContext) -> None:
        delay = self.backoff(ctx)
        try:
            try:
                ctx.notes["nacked"] = await ctx.client.nack(ctx.job.id, delay=delay)
            except ResponseError as e:
                if e.code != "NOTSUPPORTED":
                    raise
                # A node of the release before is linked (an upgrade in
                # progress): it would never hear of the delay.
                log.warning("job %s: NACK DELAY refused (%s); NACKed without", ctx.job.id, e)
                delay = 0
                ctx.notes["nacked"] = await ctx.client.nack(ctx.job.id)
            ctx.notes["retry_in"] = delay
        except DisqueError as e:
            ctx.notes["nack_error"] = str(e)  # RETRY will queue it again anyway

    async def _add_letter(self, ctx: JobContext, dead_queue: str, body: bytes) -> str:
        """ADDJOB of a dead letter. The node's default replication is
        min(3, cluster size), and the size counts failed and leaving
        nodes: with one of them out, that is refused (-NOREPL) until the
        node comes back or is forgotten, and the job would meanwhile be
        NACKed and come back at once, for ever. So on NOREPL the letter
        is added with fewer copies, down to one, with a warning; each
        try is sent as often as any command (``max_attempts``), not as
        often as a plain add_job (``add_job_retries``), so that the
        fewer copies come soon."""
        replicate: int | None = None
        retries = ctx.client.options.max_attempts - 1
        while True:
            try:
                return await ctx.client.add_job(
                    dead_queue,
                    body,
                    ttl=self.dead_letter_ttl,
                    replicate=replicate,
                    retries=retries,
                )
            except NoReplError as e:
                replicate = 2 if replicate is None else replicate - 1
                if replicate < 1:
                    raise
                log.warning(
                    "job %s: the dead letter for %s was refused (%s); adding it with %d cop%s",
                    ctx.job.id,
                    dead_queue,
                    e,
                    replicate,
                    "y" if replicate == 1 else "ies",
                    extra=job_fields(ctx, event="dead-letter-fewer-copies"),
                )

    async def _bury(self, ctx: JobContext, trace: str) -> None:
        job = ctx.job
        letter = DeadLetter(
            id=job.id,
            queue=job.queue,
            body=job.body,
            error=describe(ctx.error),
            deliveries=job.deliveries,
            nacks=job.nacks,
            additional_deliveries=job.additional_deliveries,
            traceback=trace,
        )
        dead_queue = job.queue + self.suffix
        try:
            dead_id = await self._add_letter(ctx, dead_queue, letter.to_json())
        except DisqueError as e:
            log.error(
                "job %s: could not add it to %s (%s); NACKed instead",
                job.id,
                dead_queue,
                e,
                extra=job_fields(ctx, event="dead-letter-failed"),
            )
            await self._nack(ctx)
            return
        ctx.outcome = "dead"
        ctx.notes["dead_letter_id"] = dead_id
        try:
            await ctx.client.ack_job(job.id)
        except DisqueError as e:
            ctx.notes["ack_error"] = str(e)


def _handler_traceback(error: BaseException) -> str:
    """The traceback from the handler down, without the worker's frames
    (every module of this package: the middleware chain spans them)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))
