"""A worker: handlers for queues, run with the policies a job queue needs.

    from disque_trio.worker import Worker

    worker = Worker(["disque://127.0.0.1:7711"])

    @worker.handler("emails", concurrency=20, timeout=30)
    async def send(job):
        await deliver(job.body)

and run it with ``disque-trio worker myapp.tasks:worker`` (or
``await worker.run()`` in your own AnyIO program).

The loop is short: for each handler, fetch up to as many jobs as it has
free slots (GETJOB COUNT n) and start each in a task. What happens around
a handler is a chain of small middleware pieces, outermost first, in the
style of Dramatiq's middleware (each gets the job's context and the next
piece to call):

``JobLog``     one structured log line per job (outcome, duration, error)
``Metrics``    Prometheus counters and a duration histogram (optional)
``Retries``    ACKJOB (or FASTACK) on success; NACK on failure; past
               ``max_deliveries`` deliveries, the job goes to
               ``<queue>:dead`` with the error, then is acknowledged
``KeepAlive``  WORKING every ``fraction`` of the job's RETRY while the
               handler runs, so the job is not queued again meanwhile
``TimeLimit``  a handler running past its ``timeout`` is cancelled: a failure

Shutdown (SIGTERM, SIGINT, or ``stop()``): no more fetching, running
handlers get ``shutdown_timeout`` seconds, what is still running is then
cancelled and NACKed; a second signal cancels at once. See docs/worker.md.
"""

from __future__ import annotations

import argparse
import base64
import functools
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.to_thread

from .client import AsyncClient, DisqueError, Job, NoJobError, NoReplError, TooLateError
from .client._base import NodesSpec

__all__ = [
    "DeadLetter",
    "HandlerSpec",
    "HandlerTimeout",
    "JobContext",
    "JobLog",
    "KeepAlive",
    "Metrics",
    "Middleware",
    "Retries",
    "TimeLimit",
    "Worker",
    "main",
]

log = logging.getLogger("disque_trio.worker")

Handler = Callable[[Job], Awaitable[None]] | Callable[[Job], None]
Next = Callable[[], Awaitable[None]]


class Middleware(Protocol):
    """A piece wrapped around every handler call: do something before,
    ``await call_next()``, do something after. Handler errors propagate
    through ``call_next``; ``Retries`` turns them into NACKs."""

    async def __call__(self, ctx: JobContext, call_next: Next) -> None: ...


class HandlerTimeout(Exception):
    """The handler ran past its timeout (counts as a failure)."""


@dataclass
class HandlerSpec:
    """One ``@worker.handler(...)``: the queue and how to run jobs from it."""

    queue: str
    fn: Handler
    concurrency: int = 1
    timeout: float | None = None
    max_deliveries: int | None = None
    fastack: bool | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclass
class JobContext:
    """What the middleware pieces share about one job being handled."""

    job: Job
    spec: HandlerSpec
    worker: Worker
    client: AsyncClient
    task_group: anyio.abc.TaskGroup
    started: float = 0.0
    finished: float = 0.0
    outcome: str = "running"  # done | failed | dead | interrupted | lost
    error: BaseException | None = None
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return max(0.0, (self.finished or anyio.current_time()) - self.started)


# ------------------------------------------------------------------ pieces


class TimeLimit:
    """Cancel a handler that runs past its ``timeout``; raise HandlerTimeout."""

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        limit = ctx.spec.timeout
        if limit is None:
            await call_next()
            return
        with anyio.move_on_after(limit) as scope:
            await call_next()
        if scope.cancelled_caught:
            raise HandlerTimeout(f"handler ran past its {limit:g} s timeout")


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
                        extra=_fields(ctx, event="toolate"),
                    )
                    return
                except NoJobError:
                    log.warning(
                        "job %s: WORKING refused (NOJOB)",
                        ctx.job.id,
                        extra=_fields(ctx, event="nojob"),
                    )
                    return
                except DisqueError as e:
                    log.warning("job %s: WORKING failed: %s", ctx.job.id, e)


@dataclass(frozen=True)
class DeadLetter:
    """A job moved to ``<queue>:dead``: its body there is this, as JSON
    (the original body as text when it is UTF-8, else base64)."""

    id: str
    queue: str
    body: bytes
    error: str
    deliveries: int
    nacks: int
    additional_deliveries: int
    traceback: str = ""

    def to_json(self) -> bytes:
        doc: dict[str, object] = {
            "id": self.id,
            "queue": self.queue,
            "error": self.error,
            "deliveries": self.deliveries,
            "nacks": self.nacks,
            "additional_deliveries": self.additional_deliveries,
            "traceback": self.traceback,
        }
        try:
            doc["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            doc["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return json.dumps(doc, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_body(cls, data: bytes) -> DeadLetter:
        doc = json.loads(data)
        body = (
            doc["body"].encode("utf-8")
            if "body" in doc
            else base64.b64decode(doc.get("body_base64", ""))
        )
        return cls(
            id=doc["id"],
            queue=doc["queue"],
            body=body,
            error=doc.get("error", ""),
            deliveries=int(doc.get("deliveries", 0)),
            nacks=int(doc.get("nacks", 0)),
            additional_deliveries=int(doc.get("additional_deliveries", 0)),
            traceback=doc.get("traceback", ""),
        )


class Retries:
    """Acknowledge, retry or give up.

    Success: ACKJOB (FASTACK when the handler or worker says so). Failure
    (an exception, a timeout): NACK, so the job is queued again at once
    with its ``nacks`` counter raised; unless this was delivery number
    ``max_deliveries`` (nacks + additional deliveries + 1), then the job is
    added to ``<queue><suffix>`` (JSON: ``DeadLetter``) and acknowledged.
    A job that arrives already past the limit (it kept coming back without
    a verdict, e.g. it crashes the worker) goes there without running.
    A dead letter the node refuses with -NOREPL (a node of the cluster is
    out) is added with fewer copies, down to one.
    Cancelled (shutdown): NACK, shielded, within ``nack_timeout``."""

    def __init__(
        self,
        *,
        max_deliveries: int = 5,
        dead_letter: bool = True,
        suffix: str = ":dead",
        dead_letter_ttl: int | None = None,
        fastack: bool = False,
        nack_timeout: float = 2.0,
    ) -> None:
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        self.max_deliveries = max_deliveries
        self.dead_letter = dead_letter
        self.suffix = suffix
        self.dead_letter_ttl = dead_letter_ttl
        self.fastack = fastack
        self.nack_timeout = nack_timeout

    def _limit(self, ctx: JobContext) -> int:
        return ctx.spec.max_deliveries or self.max_deliveries

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        job = ctx.job
        if self.dead_letter and job.deliveries > self._limit(ctx):
            ctx.error = RuntimeError(
                f"delivered {job.deliveries} times (limit {self._limit(ctx)}) without a verdict"
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
                    await self._nack(ctx)
            raise
        except Exception as e:
            ctx.error = e
            ctx.outcome = "failed"
            trace = _handler_traceback(e)
            if self.dead_letter and job.deliveries >= self._limit(ctx):
                await self._bury(ctx, trace)
            else:
                await self._nack(ctx)
            return
        fast = ctx.spec.fastack if ctx.spec.fastack is not None else self.fastack
        try:
            if fast:
                await ctx.client.fast_ack(job.id)
            else:
                await ctx.client.ack_job(job.id)
            ctx.outcome = "done"
        except DisqueError as e:
            # Handled, but the ack was lost: the job will come back after
            # its RETRY and run again (at-least-once).
            ctx.outcome = "lost"
            ctx.error = e

    async def _nack(self, ctx: JobContext) -> None:
        try:
            ctx.notes["nacked"] = await ctx.client.nack(ctx.job.id)
        except DisqueError as e:
            ctx.notes["nack_error"] = str(e)  # RETRY will queue it again anyway

    async def _add_letter(self, ctx: JobContext, dead_queue: str, body: bytes) -> str:
        """ADDJOB of a dead letter. The node's default replication is
        min(3, cluster size), and the size counts failed and leaving
        nodes: with one of them out, that is refused (-NOREPL) until the
        node comes back or is forgotten, and the job would meanwhile be
        NACKed and come back at once, for ever. So on NOREPL the letter
        is added with fewer copies, down to one, with a warning."""
        replicate: int | None = None
        while True:
            try:
                return await ctx.client.add_job(
                    dead_queue, body, ttl=self.dead_letter_ttl, replicate=replicate
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
                    extra=_fields(ctx, event="dead-letter-fewer-copies"),
                )

    async def _bury(self, ctx: JobContext, trace: str) -> None:
        job = ctx.job
        letter = DeadLetter(
            id=job.id,
            queue=job.queue,
            body=job.body,
            error=_describe(ctx.error),
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
                extra=_fields(ctx, event="dead-letter-failed"),
            )
            await self._nack(ctx)
            return
        ctx.outcome = "dead"
        ctx.notes["dead_letter_id"] = dead_id
        try:
            await ctx.client.ack_job(job.id)
        except DisqueError as e:
            ctx.notes["ack_error"] = str(e)


class JobLog:
    """One log line per job, with its fields as ``extra`` (docs/worker.md:
    ``--log-format json`` prints them as JSON)."""

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        try:
            await call_next()
        finally:
            ctx.finished = anyio.current_time()
            level = logging.INFO if ctx.outcome == "done" else logging.WARNING
            if ctx.outcome == "dead":
                level = logging.ERROR
            text = f"job {ctx.outcome} queue={ctx.job.queue} id={ctx.job.id} "
            text += f"deliveries={ctx.job.deliveries} duration_ms={ctx.duration * 1000:.1f}"
            if ctx.error is not None:
                text += f" error={_describe(ctx.error)!r}"
            if "dead_letter_id" in ctx.notes:
                text += f" dead_letter_id={ctx.notes['dead_letter_id']}"
            log.log(level, "%s", text, extra=_fields(ctx, event="job"))


class Metrics:
    """Prometheus metrics per queue: ``disque_worker_jobs_done_total``,
    ``..._jobs_failed_total``, ``..._jobs_dead_lettered_total``,
    ``..._jobs_interrupted_total``, ``..._handler_duration_seconds``."""

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "metrics need prometheus_client: pip install 'disque-trio[worker]'"
            ) from None
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.prom = prom
        labels = ["queue"]
        self.done = prom.Counter(
            "disque_worker_jobs_done",
            "Jobs handled and acknowledged",
            labels,
            registry=self.registry,
        )
        self.failed = prom.Counter(
            "disque_worker_jobs_failed",
            "Handler runs that raised or timed out",
            labels,
            registry=self.registry,
        )
        self.dead = prom.Counter(
            "disque_worker_jobs_dead_lettered",
            "Jobs moved to the dead-letter queue",
            labels,
            registry=self.registry,
        )
        self.interrupted = prom.Counter(
            "disque_worker_jobs_interrupted",
            "Handler runs cancelled by a shutdown",
            labels,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "disque_worker_handler_duration_seconds",
            "Time in the handler and the pieces inside Metrics",
            labels,
            registry=self.registry,
        )

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        start = anyio.current_time()
        try:
            await call_next()
        finally:
            queue = ctx.job.queue
            self.duration.labels(queue).observe(anyio.current_time() - start)
            if ctx.outcome == "done":
                self.done.labels(queue).inc()
            elif ctx.outcome in ("failed", "dead"):
                if ctx.error is not None:
                    self.failed.labels(queue).inc()
                if ctx.outcome == "dead":
                    self.dead.labels(queue).inc()
            elif ctx.outcome == "interrupted":
                self.interrupted.labels(queue).inc()

    def exposition(self) -> tuple[bytes, str]:
        return self.prom.generate_latest(self.registry), self.prom.CONTENT_TYPE_LATEST

    async def serve(
        self, host: str, port: int, *, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """GET /metrics over plain HTTP/1.0 on (host, port)."""
        listener = await anyio.create_tcp_listener(
            local_host=host, local_port=port, reuse_port=False
        )
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with listener:
            await listener.serve(self._http)

    async def _http(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            with anyio.move_on_after(5):
                while b"\r\n\r\n" not in request and len(request) < 8192:
                    try:
                        request += await stream.receive(4096)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
            parts = request.split(b" ", 2)
            path = parts[1].split(b"?")[0] if len(parts) > 2 else b""
            if parts[0] == b"GET" and path in (b"/metrics", b"/"):
                body, ctype = self.exposition()
                head = f"HTTP/1.0 200 OK\r\nContent-Type: {ctype}\r\n"
            else:
                body, head = (
                    b"not found\n",
                    "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n",
                )
            head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            try:
                await stream.send(head.encode("ascii") + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


def _handler_traceback(error: BaseException) -> str:
    """The traceback from the handler down, without the worker's frames."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _describe(error: BaseException | None) -> str:
    if error is None:
        return ""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _fields(ctx: JobContext, **more: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "job_id": ctx.job.id,
        "queue": ctx.job.queue,
        "outcome": ctx.outcome,
        "deliveries": ctx.job.deliveries,
        "nacks": ctx.job.nacks,
        "additional_deliveries": ctx.job.additional_deliveries,
        "duration_ms": round(ctx.duration * 1000, 3),
        "handler": ctx.spec.name,
    }
    if ctx.error is not None:
        fields["error"] = _describe(ctx.error)
    for key in ("dead_letter_id", "working", "nacked", "nack_error", "ack_error"):
        if key in ctx.notes:
            fields[key] = ctx.notes[key]
    fields.update(more)
    return fields


# ------------------------------------------------------------------ the worker


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


# ------------------------------------------------------------------ the command line


WORKER_USAGE = "disque-trio worker MODULE:ATTRIBUTE [options]"


class JsonLogFormatter(logging.Formatter):
    """Log records as one JSON object per line, with the job fields."""

    FIELDS = (
        "event",
        "job_id",
        "queue",
        "outcome",
        "deliveries",
        "nacks",
        "additional_deliveries",
        "duration_ms",
        "handler",
        "error",
        "dead_letter_id",
        "working",
        "nacked",
        "nack_error",
        "ack_error",
    )

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in self.FIELDS:
            if hasattr(record, name):
                doc[name] = getattr(record, name)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _load(target: str) -> Worker:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"worker: expected MODULE:ATTRIBUTE, got {target!r}")
    module = importlib.import_module(module_name)
    obj: object = module
    for part in attribute.split("."):
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Worker):
        obj = obj()  # a factory
    if not isinstance(obj, Worker):
        raise SystemExit(
            f"worker: {target} is a {type(obj).__name__}, not a disque_trio.worker.Worker"
        )
    return obj


def main(argv: Sequence[str]) -> int:
    """``disque-trio worker``: load a Worker and run it until a signal."""
    parser = argparse.ArgumentParser(
        prog="disque-trio worker",
        usage=WORKER_USAGE,
        description="Run the handlers of a disque_trio.worker.Worker until SIGTERM or SIGINT.",
    )
    parser.add_argument("target", help="where the Worker is: package.module:attribute")
    parser.add_argument(
        "--nodes", help="node URLs, replacing the Worker's: disque://host:port,..."
    )
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--threads", type=int, help="thread pool size for plain functions")
    parser.add_argument("--shutdown-timeout", type=float, help="seconds handlers get at a stop")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-host", help="address for the metrics port (127.0.0.1)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    parser.add_argument(
        "--path",
        default=".",
        help="directory to import the module from (default: the current one)",
    )
    args = parser.parse_args(list(argv))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLogFormatter()
        if args.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(args.log_level.upper())
    sys.path.insert(0, os.path.abspath(args.path))
    try:
        worker = _load(args.target)
    except (ImportError, AttributeError) as e:
        print(f"worker: cannot load {args.target}: {e}", file=sys.stderr)
        return 1
    if args.nodes:
        worker.nodes = args.nodes
    if args.threads is not None:
        worker.threads = args.threads
    if args.shutdown_timeout is not None:
        worker.shutdown_timeout = args.shutdown_timeout
    if args.metrics_port is not None:
        worker.metrics_port = args.metrics_port
    if args.metrics_host:
        worker.metrics_host = args.metrics_host
    try:
        worker.run_sync(args.backend)
    except (RuntimeError, ValueError, OSError) as e:
        log.error("worker: %s", e)
        return 1
    return 0
