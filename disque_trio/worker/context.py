"""What the worker's pieces share: a handler's settings (``HandlerSpec``),
one job being handled (``JobContext``), and the ``Middleware`` protocol."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc

from ..client import AsyncClient, Job

# One logger for the whole worker package: applications configure
# "disque_trio.worker", whichever module logs.
log = logging.getLogger("disque_trio.worker")

Handler = Callable[[Job], Awaitable[None]] | Callable[[Job], None]
Next = Callable[[], Awaitable[None]]


class Middleware(Protocol):
    """A piece wrapped around every handler call: do something before,
    ``await call_next()``, do something after. Handler errors propagate
    through ``call_next``; ``Retries`` turns them into NACKs."""

    async def __call__(self, ctx: JobContext, call_next: Next) -> None: ...


class WorkerHost(Protocol):
    """What the pieces ask of the worker running them (the Worker itself;
    a protocol so that the pieces need not import it)."""

    async def fetches_returned(self) -> None: ...


class HandlerTimeout(Exception):
    """The handler ran past its timeout (counts as a failure)."""


@dataclass
class HandlerSpec:
    """One ``@worker.handler(...)``: the queue and how to run jobs from it.
    ``max_retries``, ``max_deliveries``, ``min_backoff``, ``max_backoff``
    and ``fastack`` override the worker's."""

    queue: str
    fn: Handler
    concurrency: int = 1
    timeout: float | None = None
    max_deliveries: int | None = None
    fastack: bool | None = None
    max_retries: int | None = None
    min_backoff: float | None = None
    max_backoff: float | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


class JobContext:
    """What the middleware pieces share about one job being handled.

    ``task_group`` is a task group that ends with the job, for helpers of
    pieces of your own: the worker opens one per job only when its chain
    holds such pieces (none of its own uses it, and for a short job it is
    a noticeable cost). ``handler_done``: the handler has returned (or
    raised), so its slot is free for the next job."""

    def __init__(
        self,
        job: Job,
        spec: HandlerSpec,
        worker: WorkerHost,
        client: AsyncClient,
        task_group: anyio.abc.TaskGroup | None = None,
        started: float = 0.0,
    ) -> None:
        self.job = job
        self.spec = spec
        self.worker = worker
        self.client = client
        self._task_group = task_group
        self.started = started
        self.finished = 0.0
        self.handler_done = False  # the handler returned or raised
        self.outcome = "running"  # done | failed | dead | interrupted | lost
        self.error: BaseException | None = None
        self.notes: dict[str, object] = {}

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        if self._task_group is None:
            raise RuntimeError("no task group: the worker opens one only for pieces of your own")
        return self._task_group

    @task_group.setter
    def task_group(self, group: anyio.abc.TaskGroup) -> None:
        self._task_group = group

    @property
    def duration(self) -> float:
        return max(0.0, (self.finished or anyio.current_time()) - self.started)
