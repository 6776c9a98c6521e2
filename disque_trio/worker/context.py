"""What the worker's pieces share: a handler's settings (``HandlerSpec``),
one job being handled (``JobContext``), and the ``Middleware`` protocol."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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
    worker: WorkerHost
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
