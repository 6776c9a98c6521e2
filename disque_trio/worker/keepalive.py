"""``KeepAlive``: WORKING while a handler runs, so that the cluster does
not queue its job again meanwhile."""

from __future__ import annotations

import anyio

from ..client import DisqueError, NoJobError, TooLateError
from .context import JobContext, Next, log
from .logs import job_fields


class KeepAlive:
    """While the handler runs, send WORKING every ``fraction`` of the job's
    RETRY (read once per queue with SHOW and cached), so the cluster does
    not queue the job again meanwhile. Stops at -TOOLATE (half the TTL is
    gone: the job will be re-queued at RETRY, and that is logged) or
    -NOJOB. RETRY 0 jobs are never re-queued: nothing to send."""

    def __init__(self, fraction: float = 0.5, min_interval: float = 0.2) -> None:
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        self.fraction = fraction
        self.min_interval = min_interval
        self.retry_by_queue: dict[str, int] = {}

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        scope = anyio.CancelScope()
        ctx.task_group.start_soon(self._beat, ctx, scope)
        try:
            await call_next()
        finally:
            scope.cancel()

    async def _retry(self, ctx: JobContext) -> int | None:
        queue = ctx.job.queue
        if queue not in self.retry_by_queue:
            try:
                info = await ctx.client.show(ctx.job.id)
            except DisqueError as e:
                log.debug("SHOW %s failed: %s", ctx.job.id, e)
                return None
            if info is None:
                return None
            self.retry_by_queue[queue] = info.retry
        return self.retry_by_queue[queue]

    async def _beat(self, ctx: JobContext, scope: anyio.CancelScope) -> None:
        with scope:
            retry = await self._retry(ctx)
            if not retry:
                return
            interval = max(self.min_interval, retry * self.fraction)
            while True:
                await anyio.sleep(interval)
                try:
                    await ctx.client.working(ctx.job.id)
                    ctx.notes["working"] = int(str(ctx.notes.get("working", 0))) + 1
                except TooLateError:
                    log.warning(
                        "job %s: WORKING refused (TOOLATE: half its TTL passed); it will be "
                        "queued again after its RETRY while the handler still runs",
                        ctx.job.id,
                        extra=job_fields(ctx, event="toolate"),
                    )
                    return
                except NoJobError:
                    log.warning(
                        "job %s: WORKING refused (NOJOB)",
                        ctx.job.id,
                        extra=job_fields(ctx, event="nojob"),
                    )
                    return
                except DisqueError as e:
                    log.warning("job %s: WORKING failed: %s", ctx.job.id, e)
