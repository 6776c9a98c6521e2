"""The ``Worker``: handlers registered per queue, and how it runs them.

Each handler has a lane: one fetcher task, which asks for as many jobs as
the lane has room for (``GETJOB ... COUNT n``) and queues them, and a
fixed set of runner tasks, each taking one job at a time through the
middleware chain (no task is started per job). A handler's slot is free
again once the handler returned, while its job still waits for the
answer to its ACKJOB (batched, acks.py): the lane holds at most
``concurrency`` jobs in their handlers and as many waiting for their
verdict, with twice ``concurrency`` runners, so the next batch is
fetched, and runs, while the acknowledgements of the last are on their
way. A fetch that brought few jobs (they come one by one) is followed by
a ``linger`` pause, so that the next brings several."""

from __future__ import annotations

import functools
import inspect
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ..client import AsyncClient, DisqueError, Job
from ..client._base import NodesSpec
from .context import Handler, HandlerSpec, JobContext, Middleware, log
from .keepalive import KeepAlive
from .logs import JobLog
from .metrics import Metrics
from .retries import Retries
from .timelimit import TimeLimit


class Worker:
    """Handlers for queues of a Disque cluster.

    ``nodes`` and ``client_options`` go to the ``AsyncClient`` the worker
    creates (password, timeouts, follow_producers...). ``threads`` is the
    size of the pool where plain (non-async) handlers run.
    ``shutdown_timeout``: seconds running handlers get to finish after a
    stop. ``fetch_timeout``: how long one GETJOB waits (also how long a
    stop may wait for fetches in flight). ``linger``: how long a fetch or
    an acknowledgement that came out small (jobs coming one by one) waits
    for more before the next GETJOB or ACKJOB. ``max_retries`` (failures
    before the dead letter), ``max_deliveries`` (deliveries of any kind
    before it), ``min_backoff`` and ``max_backoff`` (seconds before a
    failed job is retried, doubling), ``dead_letter``,
    ``dead_letter_suffix``, ``dead_letter_ttl`` and ``fastack`` configure
    ``Retries``; ``working_fraction`` configures ``KeepAlive``. ``metrics_port`` serves Prometheus metrics on
    ``metrics_host`` (needs prometheus_client). ``middleware``: extra
    pieces, run innermost, right around the handler.
    """

    def __init__(
        self,
        nodes: NodesSpec = "disque://127.0.0.1:7711",
        *,
        threads: int = 8,
        shutdown_timeout: float = 30.0,
        fetch_timeout: float = 1.0,
        linger: float = 0.005,
        max_retries: int = 4,
        max_deliveries: int = 20,
        min_backoff: float = 1.0,
        max_backoff: float = 300.0,
        dead_letter: bool = True,
        dead_letter_suffix: str = ":dead",
        dead_letter_ttl: int | None = None,
        fastack: bool = False,
        working_fraction: float = 0.5,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        middleware: Sequence[Middleware] = (),
        **client_options: Any,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.nodes = nodes
        self.client_options = client_options
        self.threads = threads
        self.shutdown_timeout = shutdown_timeout
        self.fetch_timeout = fetch_timeout
        self.linger = linger
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.specs: list[HandlerSpec] = []
        self.retries = Retries(
            max_retries=max_retries,
            max_deliveries=max_deliveries,
            min_backoff=min_backoff,
            max_backoff=max_backoff,
            ack_linger=linger,
            dead_letter=dead_letter,
            suffix=dead_letter_suffix,
            dead_letter_ttl=dead_letter_ttl,
            fastack=fastack,
        )
        self.keep_alive = KeepAlive(working_fraction)
        self.time_limit = TimeLimit()
        self.job_log = JobLog()
        self.extra_middleware = list(middleware)
        self.metrics: Metrics | None = None
        self.client: AsyncClient | None = None
        self.metrics_bound_port: int | None = None
        self.running = 0
        self._stopping = False
        self._stop_requested: anyio.Event | None = None  # one per run()
        self._lanes: list[_Lane] = []
        self._handlers_scope: anyio.CancelScope | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._fetching_done: anyio.Event | None = None  # one per run()

    # ------------------------------------------------------------ handlers

    def handler(
        self,
        queue: str,
        *,
        concurrency: int = 1,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_deliveries: int | None = None,
        min_backoff: float | None = None,
        max_backoff: float | None = None,
        fastack: bool | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function for ``queue``: at most
        ``concurrency`` jobs at once, each at most ``timeout`` seconds;
        ``max_retries``, ``max_deliveries``, ``min_backoff``,
        ``max_backoff`` and ``fastack`` replace the worker's for it."""
        options = {
            "concurrency": concurrency,
            "timeout": timeout,
            "max_retries": max_retries,
            "max_deliveries": max_deliveries,
            "min_backoff": min_backoff,
            "max_backoff": max_backoff,
            "fastack": fastack,
        }

        def register(fn: Handler) -> Handler:
            self.add_handler(queue, fn, **options)
            return fn

        return register

    def add_handler(self, queue: str, fn: Handler, **options: Any) -> HandlerSpec:
        if any(spec.queue == queue for spec in self.specs):
            raise ValueError(f"queue {queue!r} already has a handler")
        spec = HandlerSpec(queue, fn, **options)
        if spec.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if spec.max_retries is not None and spec.max_retries < 0:
            raise ValueError("max_retries must be at least 0")
        self.specs.append(spec)
        return spec

    def chain(self) -> list[Middleware]:
        """The pieces around every handler, outermost first."""
        pieces: list[Middleware] = [self.job_log]
        if self.metrics is not None:
            pieces.append(self.metrics)
        pieces += [self.retries, self.keep_alive, self.time_limit, *self.extra_middleware]
        return pieces

    # ------------------------------------------------------------ running

    def stop(self, *, now: bool = False) -> None:
        """Stop fetching; handlers get ``shutdown_timeout`` (none with
        ``now``), then are cancelled and their jobs given back (ENQUEUE).
        Fetches in flight end by themselves (within ``fetch_timeout``) and
        what they bring is given back at once. Call it from the worker's
        event loop."""
        if not self._stopping:
            log.info(
                "stopping: no more fetching; running handlers have %g s to finish",
                0 if now else self.shutdown_timeout,
            )
        self._stopping = True
        if self._stop_requested is not None:
            self._stop_requested.set()
        for lane in self._lanes:
            lane.room.set()  # a fetcher waiting for room sees the stop
        if self._handlers_scope is not None:
            if now:
                self._handlers_scope.cancel()
            else:
                self._handlers_scope.deadline = min(
                    self._handlers_scope.deadline, anyio.current_time() + self.shutdown_timeout
                )

    async def fetches_returned(self) -> None:
        """Once stopping, wait (at most ``fetch_timeout`` and a second) for
        the fetches in flight to return. An interrupted job's ENQUEUE waits
        for them: one of them would get the job back at once and give it
        back again, a delivery of the job's ``max_deliveries`` spent for
        nothing."""
        if self._stopping and self._fetching_done is not None:
            with anyio.move_on_after(self.fetch_timeout + 1.0):
                await self._fetching_done.wait()

    def run_sync(self, backend: str = "trio", *, handle_signals: bool = True) -> None:
        """Run until stopped, in a new event loop (``anyio.run``)."""
        anyio.run(functools.partial(self.run, handle_signals=handle_signals), backend=backend)

    async def run(
        self, *, handle_signals: bool = True, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Fetch and handle jobs until ``stop()`` (or SIGTERM/SIGINT when
        ``handle_signals``); returns once every handler finished or was
        cancelled and its job given back."""
        if not self.specs:
            raise RuntimeError("no handlers: decorate functions with @worker.handler(queue)")
        self._stopping = False
        self._fetching_done = anyio.Event()
        self._stop_requested = anyio.Event()
        self._limiter = anyio.CapacityLimiter(self.threads)
        if self.metrics_port is not None and self.metrics is None:
            self.metrics = Metrics()
        # A connection per blocking GETJOB, and room for the acks, NACKs,
        # WORKINGs and dead letters beside them.
        options = {"pool_size": max(16, len(self.specs) * 2 + 8), **self.client_options}
        async with AsyncClient(self.nodes, **options) as client, anyio.create_task_group() as side:
            self.client = client
            await self._start_services(side, handle_signals)
            task_status.started()
            await self._run_lanes(client)
            side.cancel_scope.cancel()
        self.client = None
        log.info("worker stopped")

    async def _start_services(self, side: anyio.abc.TaskGroup, handle_signals: bool) -> None:
        """The worker's own tasks, which outlive the handlers: signals, the
        metrics page, the keep-alive, the acknowledgements, and the
        client's watch over the nodes its jobs came from (a job whose node
        is gone gets a WORKING where a copy is, at once: the client's
        ``watch_held``)."""
        if handle_signals:
            side.start_soon(self._watch_signals)
        assert self.client is not None  # run() made it
        await side.start(self.client.watch_held)
        await side.start(self.keep_alive.run)
        await side.start(self.retries.acks.run)
        if self.metrics is not None and self.metrics_port is not None:
            self.metrics_bound_port = await side.start(
                self.metrics.serve, self.metrics_host, self.metrics_port
            )
            log.info("metrics on http://%s:%d/metrics", self.metrics_host, self.metrics_bound_port)
        log.info(
            "worker started: %s",
            ", ".join(f"{s.queue} ({s.name}, concurrency {s.concurrency})" for s in self.specs),
        )

    async def _run_lanes(self, client: AsyncClient) -> None:
        fetching_done = self._fetching_done
        assert fetching_done is not None  # run() made it
        pieces = self.chain()
        # A task group per job only for pieces of the user's (the worker's
        # own do not use ctx.task_group): opening and closing one is a
        # noticeable part of what a short job costs.
        helpers = any(type(p) not in _OWN_PIECES for p in pieces)
        self._lanes = [_Lane(self, client, spec, pieces, helpers) for spec in self.specs]
        async with anyio.create_task_group() as main:
            main.start_soon(self._run_handlers)
            async with anyio.create_task_group() as fetchers:
                for lane in self._lanes:
                    fetchers.start_soon(lane.fetch)
            # Every fetch in flight has returned (what came after the stop
            # was given back): the handlers may now finish.
            fetching_done.set()
            if self.running:
                log.info("waiting for %d running handler(s)", self.running)
        self._lanes = []

    async def _run_handlers(self) -> None:
        """Hosts the runners, in a scope of their own: a stop cancels them
        (after the grace period, or at once) without cancelling a fetch in
        flight, whose reply could hold jobs that would then be lost until
        their RETRY. They end when their lane's fetcher does."""
        self._handlers_scope = anyio.CancelScope()
        if self._stopping:  # stop() came before this scope existed
            self._handlers_scope.deadline = anyio.current_time() + self.shutdown_timeout
        with self._handlers_scope:
            async with anyio.create_task_group() as runners:
                for lane in self._lanes:
                    for _ in range(2 * lane.spec.concurrency):
                        runners.start_soon(lane.serve)
        self._handlers_scope = None
        # Stopped at once: jobs fetched a moment before may not have
        # reached a runner.
        unstarted = [job for lane in self._lanes for job in lane.queued]
        if unstarted and self.client is not None:
            with anyio.CancelScope(shield=True):
                await self.fetches_returned()
                await self._give_back(self.client, unstarted)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if not self._stopping:
                    log.info("%s: shutting down (again to stop at once)", name)
                    self.stop()
                else:
                    log.warning("%s again: stopping at once", name)
                    self.stop(now=True)

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless the worker is stopping (a fetch backing off)."""
        assert self._stop_requested is not None
        with anyio.move_on_after(seconds):
            await self._stop_requested.wait()

    async def _give_back(self, client: AsyncClient, jobs: list[Job]) -> None:
        """Jobs fetched but not started (fetched while stopping, or queued
        at a stop at once): given back at once, with ENQUEUE (no failure
        of theirs, no NACK counted)."""
        ids = [job.id for job in jobs]
        try:
            with anyio.move_on_after(2):
                await client.enqueue(*ids)
            log.info("%d job(s) fetched, not started: given back (%s)", len(ids), " ".join(ids))
        except DisqueError as e:
            log.warning("%d job(s) fetched, not started: ENQUEUE failed: %s", len(ids), e)


_OWN_PIECES = (JobLog, Metrics, Retries, KeepAlive, TimeLimit)

Chain = Callable[[JobContext], Awaitable[None]]


def _compose(pieces: Sequence[Middleware], inner: Chain) -> Chain:
    """The pieces around ``inner`` as one call, built once per lane."""
    call = inner
    for piece in reversed(pieces):
        call = _link(piece, call)
    return call


def _link(piece: Middleware, call_next: Chain) -> Chain:
    async def linked(ctx: JobContext) -> None:
        await piece(ctx, lambda: call_next(ctx))

    return linked


class _Lane:
    """One handler's jobs: its fetcher and its runners (module docstring).
    ``running`` counts jobs fetched whose handler has not returned yet,
    ``settling`` those whose handler returned and whose verdict (the ack)
    is on its way."""

    def __init__(
        self,
        worker: Worker,
        client: AsyncClient,
        spec: HandlerSpec,
        pieces: Sequence[Middleware],
        helpers: bool,
    ) -> None:
        self.worker = worker
        self.client = client
        self.spec = spec
        self.helpers = helpers
        self.chain = _compose(pieces, self._invoke)
        self.in_thread = not inspect.iscoroutinefunction(spec.fn)
        self.running = 0
        self.settling = 0
        self.failures = 0  # fetches failed in a row
        self.room = anyio.Event()  # set when a job leaves a slot
        # Fetched, not yet taken by a runner. A deque and one event per
        # batch, not a memory stream: a runner waiting on a stream costs an
        # event, a receiver object and the task's info per job.
        self.queued: deque[Job] = deque()
        self.arrived = anyio.Event()  # set, and replaced, when jobs come
        self.fetching = True

    def free(self) -> int:
        limit = self.spec.concurrency
        return min(limit - self.running, 2 * limit - self.running - self.settling)

    async def fetch(self) -> None:
        """Fetch as many jobs as there is room for, until the stop."""
        try:
            while not self.worker._stopping:
                count = self.free()
                if count > 0:
                    await self._fetch(count)
                else:
                    self.room = anyio.Event()
                    await self.room.wait()
        finally:
            self.fetching = False  # the runners end once nothing is queued
            self._wake_runners()

    async def _fetch(self, count: int) -> None:
        worker = self.worker
        try:
            jobs = await self.client.get_jobs(
                self.spec.queue, count=count, timeout=worker.fetch_timeout
            )
            self.failures = 0
        except DisqueError as e:
            self.failures += 1
            log.warning("fetching from %s failed: %s", self.spec.queue, e)
            await worker._pause(min(5.0, 0.1 * 2 ** min(self.failures, 6)))
            return
        if worker._stopping:
            if jobs:
                await worker._give_back(self.client, jobs)
            return
        self.running += len(jobs)
        self.queued.extend(jobs)
        self._wake_runners()
        if worker.linger > 0 and 0 < len(jobs) < count / 2:
            # A trickle (a producer adding jobs one at a time): a moment
            # for more to come, one GETJOB for several.
            await worker._pause(worker.linger)

    def _wake_runners(self) -> None:
        self.arrived.set()
        self.arrived = anyio.Event()

    async def serve(self) -> None:
        """One runner: queued jobs one at a time, until the fetcher has
        ended and nothing is queued. There are never more jobs in hand
        than runners, so a job waits for none."""
        while True:
            if self.queued:
                await self._handle(self.queued.popleft())
            elif self.fetching:
                await self.arrived.wait()
            else:
                return

    async def _handle(self, job: Job) -> None:
        worker = self.worker
        worker.running += 1
        ctx = JobContext(job, self.spec, worker, self.client, None, anyio.current_time())
        try:
            if self.helpers:
                async with anyio.create_task_group() as ctx.task_group:
                    await self.chain(ctx)
                    ctx.task_group.cancel_scope.cancel()
            else:
                await self.chain(ctx)
        except Exception:
            # A middleware piece failed (not the handler: Retries takes
            # those). The job comes back after its RETRY.
            log.exception("job %s: the worker failed around the handler", job.id)
        finally:
            worker.running -= 1
            if not ctx.handler_done:
                self.running -= 1
            else:
                self.settling -= 1
            self.room.set()

    async def _invoke(self, ctx: JobContext) -> None:
        """The handler itself, in the thread pool if it is a plain function."""
        try:
            if self.in_thread:
                # A thread cannot be interrupted: on a timeout or shutdown
                # the job is failed or given back, the thread left to end.
                await anyio.to_thread.run_sync(
                    self.spec.fn, ctx.job, limiter=self.worker._limiter, abandon_on_cancel=True
                )
            else:
                await self.spec.fn(ctx.job)  # type: ignore[misc]
        finally:
            # Its slot is free for the next job while this one's verdict
            # is on its way (once: a piece of the user's may call again).
            if not ctx.handler_done:
                ctx.handler_done = True
                self.running -= 1
                self.settling += 1
                self.room.set()
