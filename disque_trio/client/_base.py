"""What the AnyIO and blocking shells share: options and the router."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from .cluster import Backoff, ProducerTracker, Router, parse_nodes
from .commands import Command, addjob, block_seconds
from .errors import AddJobsError, DisqueError
from .protocol import Response
from .types import Address

T = TypeVar("T")

NodesSpec = str | Address | Sequence[str | Address]

# A GETJOB asked to wait for ever is sent as GETJOB TIMEOUT of this many
# seconds, again and again: the connection is checked that often, and a
# consumer can follow producers or leave a node between two waits.
DEFAULT_POLL = 5.0


class ClientOptions:
    """The settings both shells take (see docs/client.md)."""

    def __init__(
        self,
        nodes: NodesSpec = "disque://127.0.0.1:7711",
        *,
        password: str | None = None,
        protocol: int = 2,
        connect_timeout: float = 5.0,
        timeout: float = 10.0,
        max_attempts: int = 4,
        follow_producers: bool = True,
        route_by_job_id: bool = True,
        client_name: str | None = None,
        poll: float = DEFAULT_POLL,
        rng: random.Random | None = None,
        tracker: ProducerTracker | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        seeds = parse_nodes(nodes)
        if protocol not in (2, 3):
            raise ValueError("protocol must be 2 or 3")
        if connect_timeout <= 0 or timeout <= 0:
            raise ValueError("timeouts must be positive")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.password = password if password is not None else seeds.password
        self.protocol = protocol
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.client_name = client_name
        self.poll = poll
        self.router = Router(
            seeds.addresses,
            rng=rng,
            follow_producers=follow_producers,
            tracker=tracker,
            backoff=backoff,
            route_by_job_id=route_by_job_id,
        )

    def call_timeout(self, command: Command[T]) -> float:
        """The whole budget of a call: the node's own wait plus ``timeout``."""
        return self.timeout + block_seconds(command)

    def addjob_timeout_ms(self, timeout_ms: int | None) -> int:
        """ADDJOB's ms-timeout: by default the call timeout, so that the
        node gives up (and says so with -NOREPL) when the client would."""
        if timeout_ms is not None:
            return timeout_ms
        return max(1, math.floor(self.timeout * 1000))


def combine(command: Command[T], parts: Sequence[Command[T]], results: list[object]) -> object:
    """Results of a routed command split by node: counts add up; replies
    with one entry per job ID (WAITJOB) go back in the command's order."""
    if len(results) == 1:
        return results[0]
    if all(isinstance(r, list) for r in results):
        by_id: dict[str, object] = {}
        for part, result in zip(parts, results, strict=True):
            by_id.update(zip(part.job_ids, cast(list[object], result), strict=True))
        return [by_id[job_id] for job_id in command.job_ids]
    return sum(r for r in results if isinstance(r, int))


def schedule_delay(delay: float | None, eta: datetime | None, now: datetime) -> int | None:
    """ADDJOB's DELAY in whole seconds (rounded up) from ``delay`` seconds
    or an ``eta`` (a naive datetime is local time); None for neither. An
    ETA already past queues the job at once."""
    if eta is not None:
        if delay is not None:
            raise ValueError("give delay or eta, not both")
        delay = (eta.astimezone(UTC) - now.astimezone(UTC)).total_seconds()
    if delay is None:
        return None
    if delay < 0 and eta is None:
        raise ValueError("delay must not be negative")
    return max(0, math.ceil(delay))


def encode_text(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


# add_jobs sends its ADDJOBs in pipelined runs of at most this many: one
# write and one read for them all (the node replicates a run together),
# with a bounded buffer and wait per run.
ADD_JOBS_RUN = 1000


def job_ids_of(responses: list[Response[str]]) -> list[str]:
    """add_jobs: the IDs of a batch's ADDJOBs, or AddJobsError naming
    the failed ones."""
    ids: list[str | None] = []
    errors: dict[int, DisqueError] = {}
    for i, response in enumerate(responses):
        if response.error is not None:
            errors[i] = response.error
            ids.append(None)
        else:
            ids.append(response.value)
    if errors:
        raise AddJobsError(ids, errors)
    return [job_id for job_id in ids if job_id is not None]


def addjob_commands(
    options: ClientOptions,
    queue: str,
    bodies: Iterable[bytes | str],
    timeout_ms: int | None,
    job_options: dict[str, Any],
) -> list[Command[str]]:
    """add_jobs' ADDJOBs: ``add_job``'s options for each body, ``eta``
    read once for the batch."""
    delay = schedule_delay(
        job_options.pop("delay", None), job_options.pop("eta", None), datetime.now(UTC)
    )
    timeout = options.addjob_timeout_ms(timeout_ms)
    return [
        addjob(queue, encode_text(body), timeout, delay=delay, **job_options) for body in bodies
    ]
