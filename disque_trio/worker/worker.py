"""The ``Worker``: handlers registered per queue, the fetch loop, the
handlers' tasks around the middleware chain, and a graceful stop."""

from __future__ import annotations

import functools
import inspect
import signal
from collections.abc import Callable, Sequence
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
    stop may wait for fetches in flight). ``max_deliveries``,
    ``dead_letter``, ``dead_letter_suffix``, ``dead_letter_ttl`` and
    ``fastack`` configure ``Retries``; ``working_fraction`` configures
    ``KeepAlive``. ``metrics_port`` serves Prometheus metrics on
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
        max_deliveries: int = 5,
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
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.specs: list[HandlerSpec] = []
        self.retries = Retries(
            max_deliveries=max_deliveries,
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
        self._waits: set[anyio.CancelScope] = set()
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
        max_deliveries: int | None = None,
        fastack: bool | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function for ``queue``: at most
        ``concurrency`` jobs at once, each at most ``timeout`` seconds."""

        def register(fn: Handler) -> Handler:
            self.add_handler(
                queue,
                fn,
                concurrency=concurrency,
                timeout=timeout,
                max_deliveries=max_deliveries,
                fastack=fastack,
            )
            return fn

        return register

    def add_handler(self, queue: str, fn: Handler, **options: Any) -> HandlerSpec:
        if any(spec.queue == queue for spec in self.specs):
            raise ValueError(f"queue {queue!r} already has a handler")
        spec = HandlerSpec(queue, fn, **options)
        if spec.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
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
        ``now``), then are cancelled and their jobs NACKed. Fetches in
        flight end by themselves (within ``fetch_timeout``) and what they
        bring is NACKed at once. Call it from the worker's event loop."""
        if not self._stopping:
            log.info(
                "stopping: no more fetching; running handlers have %g s to finish",
                0 if now else self.shutdown_timeout,
            )
        self._stopping = True
        for scope in list(self._waits):
            scope.cancel()
        if self._handlers_scope is not None:
            if now:
                self._handlers_scope.cancel()
            else:
                self._handlers_scope.deadline = min(
                    self._handlers_scope.deadline, anyio.current_time() + self.shutdown_timeout
                )

    async def fetches_returned(self) -> None:
        """Once stopping, wait (at most ``fetch_timeout`` and a second) for
        the fetches in flight to return. An interrupted job's NACK waits for
        them: one of them would get the job back at once and give it back
        with a second NACK, a delivery of the job's ``max_deliveries`` spent
        for nothing."""
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
        cancelled and NACKed."""
        if not self.specs:
            raise RuntimeError("no handlers: decorate functions with @worker.handler(queue)")
        self._stopping = False
        self._fetching_done = anyio.Event()
        self._limiter = anyio.CapacityLimiter(self.threads)
        if self.metrics_port is not None and self.metrics is None:
            self.metrics = Metrics()
        pool = max(16, len(self.specs) * 2 + 8)
        options = {"pool_size": pool, **self.client_options}
        async with AsyncClient(self.nodes, **options) as client, anyio.create_task_group() as side:
            self.client = client
            if handle_signals:
                side.start_soon(self._watch_signals)
            if self.metrics is not None and self.metrics_port is not None:
                self.metrics_bound_port = await side.start(
                    self.metrics.serve, self.metrics_host, self.metrics_port
                )
                log.info(
                    "metrics on http://%s:%d/metrics", self.metrics_host, self.metrics_bound_port
                )
            log.info(
                "worker started: %s",
                ", ".join(
                    f"{s.queue} ({s.name}, concurrency {s.concurrency})" for s in self.specs
                ),
            )
            task_status.started()
            async with anyio.create_task_group() as main:
                jobs = await main.start(self._run_handlers)
                async with anyio.create_task_group() as fetchers:
                    for spec in self.specs:
                        fetchers.start_soon(self._consume, spec, jobs)
                # Every fetch in flight has returned (what came after the
                # stop was given back): the handlers may now finish.
                self._fetching_done.set()
                if self.running:
                    log.info("waiting for %d running handler(s)", self.running)
            side.cancel_scope.cancel()
        self.client = None
        log.info("worker stopped")

    async def _run_handlers(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Hosts the handlers' tasks, in a scope of their own: a stop
        cancels them (after the grace period, or at once) without
        cancelling a fetch in flight, whose reply could hold jobs that
        would then be lost until their RETRY."""
        fetching_done = self._fetching_done
        assert fetching_done is not None  # run() made it
        self._handlers_scope = anyio.CancelScope()
        if self._stopping:  # stop() came before this scope existed
            self._handlers_scope.deadline = anyio.current_time() + self.shutdown_timeout
        with self._handlers_scope:
            async with anyio.create_task_group() as jobs:
                task_status.started(jobs)
                await fetching_done.wait()
        self._handlers_scope = None

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

    async def _consume(self, spec: HandlerSpec, jobs: anyio.abc.TaskGroup) -> None:
        client = self.client
        assert client is not None
        slots = anyio.Semaphore(spec.concurrency)
        failures = 0
        while not self._stopping:
            with anyio.CancelScope() as wait:
                self._waits.add(wait)
                try:
                    await slots.acquire()  # at least one free slot
                finally:
                    self._waits.discard(wait)
            if wait.cancelled_caught:
                break
            count = 1
            while slots.value:
                slots.acquire_nowait()
                count += 1
            try:
                fetched = await client.get_jobs(
                    spec.queue, count=count, timeout=self.fetch_timeout
                )
                failures = 0
            except DisqueError as e:
                fetched = []
                failures += 1
                log.warning("fetching from %s failed: %s", spec.queue, e)
                with anyio.CancelScope() as wait:
                    self._waits.add(wait)
                    try:
                        await anyio.sleep(min(5.0, 0.1 * 2 ** min(failures, 6)))
                    finally:
                        self._waits.discard(wait)
            for job in fetched:
                if self._stopping:
                    await self._give_back(client, job)
                    slots.release()
                else:
                    jobs.start_soon(self._handle, spec, job, slots)
            for _ in range(count - len(fetched)):
                slots.release()

    async def _give_back(self, client: AsyncClient, job: Job) -> None:
        """A job fetched while stopping: not started, so NACKed at once."""
        try:
            with anyio.move_on_after(2):
                await client.nack(job.id)
            log.info("job %s fetched while stopping: NACKed", job.id)
        except DisqueError as e:
            log.warning("job %s fetched while stopping, NACK failed: %s", job.id, e)

    async def _handle(self, spec: HandlerSpec, job: Job, slots: anyio.Semaphore) -> None:
        assert self.client is not None
        self.running += 1
        try:
            async with anyio.create_task_group() as helpers:
                ctx = JobContext(job, spec, self, self.client, helpers, anyio.current_time())
                try:
                    await self._call_chain(ctx, self.chain(), 0)
                except Exception:
                    # A middleware piece failed (not the handler: Retries
                    # takes those). The job comes back after its RETRY.
                    log.exception("job %s: the worker failed around the handler", job.id)
                helpers.cancel_scope.cancel()
        finally:
            self.running -= 1
            slots.release()

    async def _call_chain(self, ctx: JobContext, chain: list[Middleware], index: int) -> None:
        if index == len(chain):
            await self._invoke(ctx)
            return
        await chain[index](ctx, functools.partial(self._call_chain, ctx, chain, index + 1))

    async def _invoke(self, ctx: JobContext) -> None:
        fn = ctx.spec.fn
        if inspect.iscoroutinefunction(fn):
            await fn(ctx.job)
        else:
            # A thread cannot be interrupted: on a timeout or shutdown the
            # job is failed or NACKed and the thread is left to finish.
            await anyio.to_thread.run_sync(
                fn, ctx.job, limiter=self._limiter, abandon_on_cancel=True
            )
