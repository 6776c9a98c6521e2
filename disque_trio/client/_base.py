"""What the AnyIO and blocking shells share: options and the router."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from .cluster import Backoff, ProducerTracker, Router, parse_nodes
from .commands import Command, addjob, block_seconds
from .errors import AddJobsError, ConnectionLostError, DisqueError, ResponseError
from .held import ReassertResult
from .protocol import Response
from .types import Address

T = TypeVar("T")
log = logging.getLogger("disque_trio.client")

NodesSpec = str | Address | Sequence[str | Address]

# A GETJOB asked to wait for ever is sent as GETJOB TIMEOUT of this many
# seconds, again and again: the connection is checked that often, and a
# consumer can follow producers or leave a node between two waits.
DEFAULT_POLL = 5.0
# ADDJOB is sent again up to this many times (after -NOREPL, a connection
# that could not be opened, or one lost with it in flight when resending):
# with the back-off (50 ms doubling, at most 2 s) that is 3.6 to 7.2 s of
# pauses, enough for a node restarted in a rolling restart to be back.
DEFAULT_ADD_JOB_RETRIES = 8
# check_held: how long a node that delivered held jobs has to answer PING
# before HELLO elsewhere is asked whether it is failing.
PROBE_TIMEOUT = 2.0


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
        add_job_retries: int = DEFAULT_ADD_JOB_RETRIES,
        resend: bool = True,
        hold_jobs: bool = True,
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
        if add_job_retries < 0:
            raise ValueError("add_job_retries must not be negative")
        self.password = password if password is not None else seeds.password
        self.protocol = protocol
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.add_job_retries = add_job_retries
        self.resend = resend
        self.client_name = client_name
        self.poll = poll
        self.router = Router(
            seeds.addresses,
            rng=rng,
            follow_producers=follow_producers,
            tracker=tracker,
            backoff=backoff,
            route_by_job_id=route_by_job_id,
            hold_jobs=hold_jobs,
        )

    def call_timeout(self, command: Command[T]) -> float:
        """The whole budget of a call: the node's own wait plus ``timeout``."""
        return self.timeout + block_seconds(command)

    def addjob_command(
        self,
        queue: str,
        body: bytes | str,
        *,
        timeout_ms: int | None,
        delay: float | None,
        eta: datetime | None,
        resend: bool | None,
        retries: int | None,
        **job_options: Any,
    ) -> Command[str]:
        """``add_job``'s ADDJOB: the replication timeout, the schedule, and
        the retry policy (the client's ``resend`` and ``add_job_retries``
        unless given for this call)."""
        retries = self.add_job_retries if retries is None else retries
        if retries < 0:
            raise ValueError("retries must not be negative")
        return addjob(
            queue,
            encode_text(body),
            self.addjob_timeout_ms(timeout_ms),
            delay=schedule_delay(delay, eta, datetime.now(UTC)),
            resend=self.resend if resend is None else resend,
            attempts=retries + 1,
            **job_options,
        )

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


def log_retry(command: Command[T], error: DisqueError, address: Address | None) -> None:
    """Say why a command that may change something is sent again."""
    where = fmt_address(address) if address is not None else "a node"
    if isinstance(error, ResponseError):
        log.info("%s refused %s (%s): sending it elsewhere", where, command.name, error)
    elif isinstance(error, ConnectionLostError) and command.duplicates:
        # ADDJOB with resend: its fate is unknown.
        log.warning(
            "%s sent again: the connection to %s broke with it in flight, and if the "
            "first was added the job now exists twice",
            command.name,
            where,
        )


def log_reassert(result: ReassertResult) -> None:
    """What a round of WORKING for the held jobs of a gone node did."""
    for address, job_ids in result.moved.items():
        log.info(
            "%d held job(s) kept alive at %s: their node is gone",
            len(job_ids),
            fmt_address(address),
        )
    if result.too_late:
        log.warning(
            "held job(s) %s: WORKING refused (TOOLATE: half their TTL passed); they will be "
            "queued again at their RETRY",
            " ".join(result.too_late),
        )
    if result.no_holder:
        log.warning(
            "held job(s) %s: their node is gone and no node asked holds a copy",
            " ".join(result.no_holder),
        )
    for job_id, error in result.failed.items():
        log.warning("held job %s: WORKING refused: %s", job_id, error)
    if result.deferred:
        log.info(
            "%d held job(s) of a gone node: no node reached, trying again", len(result.deferred)
        )


def fmt_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
