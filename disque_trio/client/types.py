"""The typed results of commands: jobs, SHOW, QSTAT, HELLO, scan pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "Address",
    "HelloInfo",
    "Job",
    "JobInfo",
    "NodeInfo",
    "QueueStats",
    "ScanPage",
    "node_prefix",
]

T = TypeVar("T")

Address = tuple[str, int]
"""A node's client address: (host, port)."""


def node_prefix(job_id: str) -> str:
    """The 8 hex digits after ``D-``: the start of the creating node's ID."""
    return job_id[2:10]


@dataclass(frozen=True, slots=True)
class Job:
    """A job as GETJOB (or QPEEK) returns it. ``body`` is bytes as stored;
    ``text`` decodes it as UTF-8. ``nacks`` and ``additional_deliveries``
    come from GETJOB's WITHCOUNTERS (0 where a command does not give them)."""

    id: str
    queue: str
    body: bytes
    nacks: int = 0
    additional_deliveries: int = 0

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def deliveries(self) -> int:
        """How many times the job was delivered, this time included (as far
        as the node that delivered it knows)."""
        return 1 + self.nacks + self.additional_deliveries

    @property
    def node_prefix(self) -> str:
        return node_prefix(self.id)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """SHOW: what one node knows about a job. Times are as the node gives
    them (``ttl``, ``delay``, ``retry`` in seconds, the ``*-within`` fields
    in milliseconds, ``ctime`` as documented in docs/commands.md). Fields
    a node added that this client does not know are kept in ``extra``."""

    id: str
    queue: str | None
    state: str
    repl: int
    ttl: int
    ctime: int
    delay: int
    retry: int
    nacks: int
    additional_deliveries: int
    nodes_delivered: list[str]
    nodes_confirmed: list[str]
    next_requeue_within: int | None
    next_awake_within: int | None
    body: bytes
    # disque-trio's: the next queueing ends a NACK/ENQUEUE DELAY (False
    # from a node that does not say, such as the original).
    delayed_requeue: bool = False
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """QSTAT. Unknown fields are kept in ``extra`` (the original says more
    may be added)."""

    name: str
    len: int
    age: int
    idle: int
    blocked: int
    import_from: list[str]
    import_rate: int
    jobs_in: int
    jobs_out: int
    pause: str
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as HELLO lists it: priority 1 is best, 100 failing or leaving."""

    id: str
    host: str
    port: int
    priority: int

    @property
    def address(self) -> Address:
        return (self.host, self.port)

    @property
    def prefix(self) -> str:
        return self.id[:8]


@dataclass(frozen=True, slots=True)
class HelloInfo:
    """Disque's HELLO: the format version, the answering node's ID, and
    every node it knows (itself included)."""

    version: int
    node_id: str
    nodes: list[NodeInfo]


@dataclass(frozen=True, slots=True)
class ScanPage(Generic[T]):
    """One QSCAN/JSCAN reply: the next cursor (0: done) and the items."""

    cursor: int
    items: list[T]
