"""``KeepAlive``: WORKING while a handler runs, so that the cluster does
not queue its job again meanwhile.

Most jobs end long before they could need a WORKING (RETRY is at least a
second, and the first WORKING is due at ``fraction`` of it), so a job
costs no task and no command here: it is put in the bucket of the
``granularity`` tick when its first WORKING could be due (a timer wheel:
a dict of lists, and a heap of the ticks that have a bucket), and marked
done when it ends. One task for the whole worker (``run()``) wakes at the
first tick with a bucket and starts a beat for each job of it still
running: the first beat learns the job's RETRY (SHOW, cached per queue)
and sends WORKING once ``fraction`` of it has passed; each WORKING then
schedules the next. A beat is at most ``granularity`` late.
"""

from __future__ import annotations

import heapq
import math

import anyio
import anyio.abc

from ..client import DisqueError, NoJobError, TooLateError
from .context import JobContext, Next, log
from .logs import job_fields


class _Beat:
    """One running job's place in the heap."""

    __slots__ = ("ctx", "done", "retry")

    def __init__(self, ctx: JobContext, retry: int | None) -> None:
        self.ctx = ctx
        self.retry = retry  # seconds; None until learned
        self.done = False


class KeepAlive:
    """While the handler runs, send WORKING every ``fraction`` of the job's
    RETRY (read with SHOW once per queue, when a job of it first runs that
    long, and cached), so the cluster does not queue the job again
    meanwhile. Stops at -TOOLATE (half the TTL is gone: the job will be
    re-queued at RETRY, and that is logged) or -NOJOB. RETRY 0 jobs are
    never re-queued: nothing to send. ``run()`` is the task sending them;
    the worker runs it while it runs."""

    def __init__(
        self, fraction: float = 0.5, min_interval: float = 0.2, granularity: float = 0.05
    ) -> None:
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        self.fraction = fraction
        self.min_interval = min_interval
        self.granularity = granularity
        self.retry_by_queue: dict[str, int] = {}
        self._buckets: dict[int, list[_Beat]] = {}  # by tick
        self._ticks: list[int] = []  # a heap of the buckets' ticks
        self._wake_at = math.inf  # when run() wakes next
        self._wake: anyio.Event | None = None

    def _interval(self, retry: int) -> float:
        return max(self.min_interval, retry * self.fraction)

    def _schedule(self, when: float, beat: _Beat) -> None:
        tick = math.ceil(when / self.granularity)
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = []
            heapq.heappush(self._ticks, tick)
            if tick * self.granularity < self._wake_at and self._wake is not None:
                self._wake.set()
        bucket.append(beat)

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        # Unknown RETRY: the shortest there is (1 s), learned when due.
        retry = self.retry_by_queue.get(ctx.job.queue)
        if retry == 0:
            await call_next()
            return
        beat = _Beat(ctx, retry)
        self._schedule(ctx.started + self._interval(retry or 1), beat)
        try:
            await call_next()
        finally:
            beat.done = True

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start a beat for each running job whose time came, forever."""
        async with anyio.create_task_group() as beats:
            # Ticks of an earlier run are on another clock; its jobs have
            # all ended.
            self._buckets.clear()
            self._ticks.clear()
            self._wake = anyio.Event()
            task_status.started()
            while True:
                now = anyio.current_time()
                while self._ticks and self._ticks[0] * self.granularity <= now:
                    for beat in self._buckets.pop(heapq.heappop(self._ticks)):
                        if not beat.done:
                            beats.start_soon(self._beat, beat)
                self._wake_at = self._ticks[0] * self.granularity if self._ticks else math.inf
                with anyio.move_on_at(self._wake_at):
                    await self._wake.wait()
                self._wake = anyio.Event()

    async def _beat(self, beat: _Beat) -> None:
        ctx = beat.ctx
        if beat.retry is None:
            beat.retry = await self._retry(ctx)
            if not beat.retry or beat.done:
                return
            due = ctx.started + self._interval(beat.retry)
            if due > anyio.current_time():  # RETRY is longer than supposed
                self._schedule(due, beat)
                return
        if await self._working(beat) and not beat.done:
            self._schedule(anyio.current_time() + self._interval(beat.retry), beat)

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

    async def _working(self, beat: _Beat) -> bool:
        """One WORKING; whether to go on."""
        ctx = beat.ctx
        try:
            beat.retry = await ctx.client.working(ctx.job.id)
            ctx.notes["working"] = int(str(ctx.notes.get("working", 0))) + 1
        except TooLateError:
            if not beat.done:
                log.warning(
                    "job %s: WORKING refused (TOOLATE: half its TTL passed); it will be "
                    "queued again after its RETRY while the handler still runs",
                    ctx.job.id,
                    extra=job_fields(ctx, event="toolate"),
                )
            return False
        except NoJobError:
            if not beat.done:
                log.warning(
                    "job %s: WORKING refused (NOJOB)",
                    ctx.job.id,
                    extra=job_fields(ctx, event="nojob"),
                )
            return False
        except DisqueError as e:
            log.warning("job %s: WORKING failed: %s", ctx.job.id, e)
        return True
