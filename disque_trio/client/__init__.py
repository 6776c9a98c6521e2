"""A Disque client: one sans-I/O core, an AnyIO shell and a blocking one.

    from disque_trio.client import AsyncClient, Client

    async with AsyncClient("disque://127.0.0.1:7711,127.0.0.1:7712") as c:
        job_id = await c.add_job("emails", b"hello")
        job = await c.get_job("emails", timeout=1)
        await c.ack_job(job.id)

    with Client(["127.0.0.1:7711"]) as c:
        c.add_job("emails", "hello")

The layers (docs/client.md): ``commands`` (commands as data and typed
replies), ``protocol`` (``ClientProtocol``: bytes in and out, no I/O),
``cluster`` (``Router``: which node, when to move or retry, no I/O),
``held`` (``HeldJobs``: the jobs a consumer holds, kept alive elsewhere
when their node is gone), ``scan`` (QSCAN/JSCAN cursors), and the shells
``aio`` (``AsyncClient``, on AnyIO: Trio or asyncio) and ``sync``
(``Client``, on sockets). Only ``disque_trio.protocol`` is used from the
rest of the package.
"""

from __future__ import annotations

from . import commands
from .aio import AsyncClient, AsyncSubscription
from .cluster import Backoff, ProducerTracker, Router, Seeds, parse_nodes
from .errors import (
    AddJobsError,
    AuthenticationError,
    BadIdError,
    ConnectionLostError,
    DisqueConnectionError,
    DisqueError,
    DisqueTimeoutError,
    JobNodeUnavailableError,
    LeavingError,
    MaxLenError,
    NoJobError,
    NoNodeAvailableError,
    NoReplError,
    OutOfMemoryError,
    PausedError,
    ProtocolViolationError,
    ResponseError,
    TooLateError,
)
from .held import HeldJobs, Reassert, ReassertResult
from .protocol import NEED_DATA, ClientProtocol, Response
from .pubsub import Message
from .scan import Scan
from .sync import Client, Subscription
from .types import Address, HelloInfo, Job, JobInfo, NodeInfo, QueueStats, ScanPage

__all__ = [
    "NEED_DATA",
    "AddJobsError",
    "Address",
    "AsyncClient",
    "AsyncSubscription",
    "AuthenticationError",
    "Backoff",
    "BadIdError",
    "Client",
    "ClientProtocol",
    "ConnectionLostError",
    "DisqueConnectionError",
    "DisqueError",
    "DisqueTimeoutError",
    "HeldJobs",
    "HelloInfo",
    "Job",
    "JobInfo",
    "JobNodeUnavailableError",
    "LeavingError",
    "MaxLenError",
    "Message",
    "NoJobError",
    "NoNodeAvailableError",
    "NoReplError",
    "NodeInfo",
    "OutOfMemoryError",
    "PausedError",
    "ProducerTracker",
    "ProtocolViolationError",
    "QueueStats",
    "Reassert",
    "ReassertResult",
    "Response",
    "ResponseError",
    "Router",
    "Scan",
    "ScanPage",
    "Seeds",
    "Subscription",
    "TooLateError",
    "commands",
    "parse_nodes",
]
