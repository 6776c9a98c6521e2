"""A kombu transport on a Disque cluster, for Celery (and plain kombu).

    app = Celery("tasks")
    app.conf.broker_url = "disque://10.0.0.1:7711,10.0.0.2:7711"
    app.conf.broker_transport = "disque_trio.integrations.celery:Transport"

``broker_transport`` names this class, so nothing has to be imported;
alternatively ``import disque_trio.integrations.celery`` registers the
``disque`` scheme with kombu (``kombu.transport.TRANSPORT_ALIASES``), and
``broker_url`` alone is enough. kombu has no entry points for transports.

The mapping (docs/integrations.md says more):

=====================================  =====================================
kombu / Celery                         Disque
=====================================  =====================================
publish (``delay()``, ``apply_async``)  ADDJOB, REPLICATE/RETRY/TTL from the
                                       transport options; a message with an
                                       ETA (``countdown``, ``eta``, a
                                       ``retry(countdown=...)``) is added
                                       with DELAY, the whole seconds left
consume                                GETJOB COUNT n WITHCOUNTERS FROM every
                                       queue the worker consumes, one call
ack (before or after the task runs,    ACKJOB, in batches, from a thread,
``acks_late`` as Celery decides)       routed to the node that made the job
reject, requeue                        NACK (queued again at once)
reject, no requeue                     ``<queue>:dead`` (the worker's dead
                                       letter JSON), then ACKJOB
unacknowledged at channel close        ENQUEUE (queued again at once)
visibility timeout                     RETRY (``visibility_timeout``)
queue length, purge                    QLEN summed over the nodes; ACKJOB of
                                       the jobs JSCAN finds queued
=====================================  =====================================

Fanout and topic exchanges across processes are not supported (exchanges
and bindings live in each process, as with kombu's SQS transport): Celery
turns remote control, gossip and mingle off by itself (this transport
implements only ``direct`` exchanges and is not of driver type ``redis``
or ``amqp``), so ``celery inspect``/``control`` get no replies and events
do not reach monitors.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from queue import Empty
from typing import Any, cast

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps, loads

from .. import __version__
from ..client import (
    Client,
    DisqueConnectionError,
    DisqueError,
    DisqueTimeoutError,
    Job,
    NoReplError,
)
from ..worker import DeadLetter
from ._common import (
    DEFAULT_DEAD_LETTER_TTL,
    DEFAULT_TTL,
    MAX_SECONDS,
    Acknowledger,
    SharedClient,
    add_dead_letter,
    each_node,
    purge_queue,
    track_delivered,
)

__all__ = ["Channel", "QoS", "Settings", "Transport"]

log = logging.getLogger("disque_trio.integrations.celery")

TRANSPORT_ALIASES.setdefault("disque", "disque_trio.integrations.celery:Transport")

DEFAULT_VISIBILITY_TIMEOUT = 3600  # kombu's Redis transport's default


@dataclass(frozen=True)
class Settings:
    """What ``broker_transport_options`` may set (other keys are kombu's or
    Celery's own and are left to them).

    ``replicate``            ADDJOB REPLICATE (None: the node's default,
                             min(3, cluster size))
    ``visibility_timeout``   ADDJOB RETRY: a delivered message not
                             acknowledged within this many seconds is
                             delivered again (3600)
    ``ttl``                  ADDJOB TTL: a message not acknowledged this
                             long after it was published is dropped (a
                             week); a delayed one gets its delay on top
    ``asynchronous``         ADDJOB ASYNC: answered before the copies are
                             made (False)
    ``delayed_delivery``     a message with an ETA is added with DELAY, so
                             the cluster keeps it until then (True)
    ``dead_letter``          reject without requeue moves the message to
                             ``<queue>:dead`` before acknowledging it
                             (True); False just acknowledges it
    ``dead_letter_suffix``   ``":dead"``
    ``dead_letter_ttl``      a week
    ``fetch_count``          at most this many jobs per GETJOB (100; fewer
                             when the prefetch limit says so)
    ``linger``               after a GETJOB that emptied the queues, wait
                             this long before the next one, so that jobs
                             arriving one by one come a few per GETJOB
                             (0.005 s; 0: never wait)
    ``client_options``       keyword arguments of ``disque_trio.client.Client``
                             (``timeout``, ``connect_timeout``, ...)
    """

    replicate: int | None = None
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    ttl: int = DEFAULT_TTL
    asynchronous: bool = False
    delayed_delivery: bool = True
    dead_letter: bool = True
    dead_letter_suffix: str = ":dead"
    dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL
    fetch_count: int = 100
    linger: float = 0.005
    client_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Settings:
        names = cls.__dataclass_fields__.keys()
        mine = {k: v for k, v in options.items() if k in names}
        settings = cls(**mine)
        if settings.fetch_count < 1:
            raise ValueError("fetch_count must be at least 1")
        return settings


def eta_delay(message: dict[str, Any], now: datetime) -> int:
    """The whole seconds until the ETA Celery put in the message's headers
    (``countdown`` and ``eta`` become one; so does ``retry(countdown=)``),
    rounded down: the job is queued at or just before its ETA, and the
    worker holds it for the rest, as it does any ETA task. 0 without an
    ETA, with one less than a second away, or a naive one (no zone: whose
    clock?)."""
    headers = message.get("headers") or {}
    eta = headers.get("eta") if isinstance(headers, dict) else None
    if not isinstance(eta, str):
        return 0
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return 0
    if when.tzinfo is None:
        return 0
    seconds = (when - now).total_seconds()
    return min(MAX_SECONDS, int(seconds)) if seconds >= 1 else 0


def _job_id(delivery_tag: str) -> str:
    """A delivery tag is ``<job ID>/<n>``: unique per delivery, even when
    the same job is delivered twice to one channel."""
    return delivery_tag.rpartition("/")[0]


def mask_password(uri: str, mask: str = "**") -> str:
    """``disque://:secret@h:7711`` -> ``disque://:**@h:7711``."""
    scheme, sep, rest = uri.partition("://")
    if not sep or "@" not in rest:
        return uri
    userinfo, _, hosts = rest.rpartition("@")
    user = userinfo.partition(":")[0] if ":" in userinfo else ""
    return f"{scheme}://{user}:{mask}@{hosts}"


class QoS(virtual.QoS):
    """kombu's prefetch accounting; what is still unacknowledged when the
    channel closes is given back with ENQUEUE (the same job, queued again
    at once), not published again as a copy: the job would come back at
    its RETRY anyway."""

    channel: Channel

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        if tags:
            self.channel.requeue([_job_id(tag) for tag in tags])
        return []

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the nodes queue unacknowledged jobs again."""


class Channel(virtual.Channel):
    """A kombu channel: publishes with ADDJOB, consumes with GETJOB."""

    QoS = QoS
    connection: Transport
    supports_fanout = False
    do_restore = True

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport = connection
        self.settings = connection.settings
        self._tags = itertools.count(1)
        self._fetcher: Client | None = None
        self._noack_queues: set[str] = set()
        self._ran_dry = False  # the last GETJOB brought fewer jobs than asked

    # ------------------------------------------------------------ publish

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        settings = self.settings
        delay = eta_delay(message, datetime.now(UTC)) if settings.delayed_delivery else 0
        body = dumps(message)
        with self.transport.shared() as client:
            client.add_job(
                queue,
                body,
                replicate=settings.replicate,
                retry=settings.visibility_timeout,
                ttl=min(MAX_SECONDS, settings.ttl + delay),
                delay=delay or None,
                asynchronous=settings.asynchronous,
            )

    # ------------------------------------------------------------ consume

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        if no_ack:
            self._noack_queues.add(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._noack_queues.discard(queue)
        return result

    def _fetch_client(self) -> Client:
        if self._fetcher is None:
            # What it fetches is held by the acknowledging thread, which
            # settles it (and keeps it alive when its node goes).
            self._fetcher = self.transport.new_client(hold_jobs=False)
        return self._fetcher

    def fetch(self, wait: float) -> bool:
        """One GETJOB over every queue consumed here, waiting at most
        ``wait`` seconds (0: NOHANG); delivers what came. True if any."""
        queues = list(dict.fromkeys(self._active_queues))
        if not queues:
            return False
        estimate = self.qos.can_consume_max_estimate()
        count = self.settings.fetch_count if estimate is None else estimate
        count = min(count, self.settings.fetch_count)
        if count < 1:
            return False
        client = self._fetch_client()
        if self._ran_dry and self.settings.linger > 0 and wait > 0:
            time.sleep(min(self.settings.linger, wait))
        if wait > 0:
            jobs = client.get_jobs(*queues, count=count, timeout=wait)
        else:
            jobs = client.get_jobs(*queues, count=count, nohang=True)
        self._ran_dry = 0 < len(jobs) < count
        held = [job for job in jobs if job.queue not in self._noack_queues]
        track_delivered(self.transport.acks, client, held)
        for job in jobs:
            payload = self._payload(job)
            if payload is None:
                continue
            if job.queue in self._noack_queues:
                self.transport.acks.ack(job.id)
            self.connection._deliver(payload, job.queue)
        return bool(jobs)

    def _payload(self, job: Job) -> dict[str, Any] | None:
        """The kombu message a job holds, with this delivery's tag and
        ``redelivered``; None (and the job buried) when it is not one."""
        try:
            payload = loads(job.body)
            if not isinstance(payload, dict):
                raise TypeError(f"a JSON {type(payload).__name__}, not an object")
            properties = payload.setdefault("properties", {})
            info = properties.setdefault("delivery_info", {})
            info.update(
                redelivered=job.deliveries > 1,
                disque_job_id=job.id,
                disque_queue=job.queue,
                disque_deliveries=job.deliveries,
            )
            info.setdefault("routing_key", job.queue)
            info.setdefault("exchange", "")
            properties["delivery_tag"] = f"{job.id}/{next(self._tags)}"
        except (ValueError, TypeError, AttributeError) as e:
            log.error("job %s in %s is not a kombu message (%s): burying it", job.id, job.queue, e)
            self._bury(job.id, job.queue, job.body, f"{type(e).__name__}: {e}", job)
            return None
        return payload

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        while True:
            client = self._fetch_client()
            jobs = client.get_jobs(queue, nohang=True)
            if not jobs:
                raise Empty()
            track_delivered(self.transport.acks, client, jobs)
            payload = self._payload(jobs[0])
            if payload is not None:
                return payload

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:
            self.transport.acks.ack(_job_id(message.delivery_tag))
        return message

    # ------------------------------------------------------------ settle

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        self.transport.acks.ack(_job_id(delivery_tag))
        super().basic_ack(delivery_tag)
        self.transport.capacity.set()

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        job_id = _job_id(delivery_tag)
        try:
            if requeue:
                self.transport.acks.untrack(job_id)
                with self.transport.shared() as client:
                    client.nack(job_id)
            else:
                message = self.qos._delivered.get(delivery_tag)
                if message is None or not self.settings.dead_letter:
                    self.transport.acks.ack(job_id)
                else:
                    info = message.delivery_info
                    body = dumps(message.serializable()).encode("utf-8")
                    queue = info.get("disque_queue") or info.get("routing_key") or ""
                    self._bury(job_id, queue, body, "rejected without requeue", None, info)
        except DisqueError as e:
            log.warning(
                "reject of %s (requeue=%s) failed (%s: %s): it will be delivered again "
                "after its RETRY",
                job_id,
                requeue,
                type(e).__name__,
                e,
            )
        finally:
            # Accounted as done here; not kombu's reject, which would
            # publish a copy for a requeue.
            self.qos.ack(delivery_tag)
            self.transport.capacity.set()

    def _bury(
        self,
        job_id: str,
        queue: str,
        body: bytes,
        error: str,
        job: Job | None,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Dead letter (when enabled), then ACKJOB; if the dead letter
        cannot be added, NACK instead (nothing lost)."""
        if self.settings.dead_letter:
            deliveries = job.deliveries if job else int((info or {}).get("disque_deliveries", 1))
            letter = DeadLetter(
                id=job_id,
                queue=queue,
                body=body,
                error=error,
                deliveries=deliveries,
                nacks=job.nacks if job else 0,
                additional_deliveries=job.additional_deliveries if job else 0,
            )
            try:
                with self.transport.shared() as client:
                    add_dead_letter(
                        client,
                        queue + self.settings.dead_letter_suffix,
                        letter,
                        ttl=self.settings.dead_letter_ttl,
                    )
            except DisqueError as e:
                log.warning("no dead letter for %s (%s): NACK instead", job_id, e)
                self.transport.acks.untrack(job_id)
                with self.transport.shared() as client:
                    client.nack(job_id)
                return
        self.transport.acks.ack(job_id)

    def requeue(self, job_ids: list[str]) -> None:
        """ENQUEUE jobs delivered here and never settled, through the
        client that fetched them (the node that delivered them, most
        often). Those it cannot queue come back after their RETRY."""
        for job_id in job_ids:
            self.transport.acks.untrack(job_id)
        try:
            queued = self._fetch_client().enqueue(*job_ids)
        except DisqueError as e:
            queued = 0
            log.warning("ENQUEUE of %d unacknowledged jobs failed: %s", len(job_ids), e)
        if queued < len(job_ids):
            log.info(
                "%d of %d unacknowledged jobs given back now; the others come back "
                "after their RETRY",
                queued,
                len(job_ids),
            )

    # ------------------------------------------------------------ queues

    def _size(self, queue: str) -> int:
        """QLEN on every usable node, added up (each node queues the jobs it
        holds; a job is queued on one node at a time)."""
        lengths, _missed = each_node(
            self.transport.shared,
            lambda c: c.qlen(queue),
            options=self.transport.client_options,
        )
        return sum(lengths)

    def _purge(self, queue: str) -> int:
        return purge_queue(self.transport.shared, queue, options=self.transport.client_options)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Disque makes a queue when a job is first queued in it."""

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def close(self) -> None:
        super().close()
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


class Transport(virtual.Transport):
    """The kombu transport (``disque://`` URLs, several nodes comma
    separated, ``disque://:password@host:port,...``)."""

    Channel = Channel
    can_parse_url = True
    default_port = 7711  # type: ignore[assignment]  # kombu types it as None
    driver_type = "disque"
    driver_name = "disque-trio"
    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct"]),
        heartbeats=False,
    )
    connection_errors = (  # type: ignore[assignment]  # kombu types it as a 1-tuple
        *virtual.Transport.connection_errors,
        DisqueConnectionError,
        DisqueTimeoutError,
    )
    # -NOREPL (not enough nodes reachable for REPLICATE right now): kombu's
    # publish retry policy sends it again.
    channel_errors = (*virtual.Transport.channel_errors, NoReplError)  # type: ignore[assignment]

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.settings = Settings.from_options(dict(client.transport_options or {}))
        options = dict(self.settings.client_options)
        if client.password and "password" not in options:
            options["password"] = client.password
        options.setdefault("connect_timeout", float(client.connect_timeout or 5))
        self.client_options = options
        hostname = client.hostname or "127.0.0.1"
        if "://" not in hostname and ":" not in hostname.strip("[]") and client.port:
            hostname = f"{hostname}:{client.port}"
        self.url = hostname
        self.shared = SharedClient(self.new_client)
        self.acks = Acknowledger(self.new_client, name="disque-kombu-acks")
        self.capacity = threading.Event()  # set when a channel may consume again
        self._turn = 0

    def new_client(self, *, hold_jobs: bool = True) -> Client:
        return Client(self.url, **{"hold_jobs": hold_jobs, **self.client_options})

    def driver_version(self) -> str:
        return __version__

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri if include_password else mask_password(uri, mask)

    def establish_connection(self) -> Any:
        with self.shared() as client:
            client.ping()  # a connection error here is kombu's to retry
        return super().establish_connection()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver the next batch of jobs of some consuming channel, waiting
        at most ``timeout`` seconds (socket.timeout then). The wait is
        GETJOB's own (the node answers as soon as a job comes); while every
        channel is at its prefetch limit, until an ack frees a slot."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.capacity.clear()
            consuming = [c for c in cast(list[Channel], self.channels) if c._consumers]
            ready = [c for c in consuming if c.qos.can_consume()]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if ready:
                channel = ready[self._turn % len(ready)]
                self._turn += 1
                wait = 1.0 if left is None else left
                if len(ready) > 1:
                    wait = min(wait, 0.1)
                if channel.fetch(wait):
                    return
            elif left is None or left > 0:
                self.capacity.wait(1.0 if left is None else min(left, 1.0))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError()  # socket.timeout, which kombu expects

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        self.acks.close()
        self.shared.close()
