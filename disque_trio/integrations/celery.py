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
a message's ``expiration``             TTL (whole seconds, rounded up),
                                       but for a Celery task's ``expires``:
                                       its worker revokes it
queue length, purge                    QLEN summed over the nodes; ACKJOB of
                                       the jobs JSCAN finds queued
=====================================  =====================================

Fanout exchanges, Celery's events exchange and its remote-control replies
go by pub/sub (PUBLISH, and SUBSCRIBE on one connection per kombu
connection read by a thread, ``_listener.py``): ``celery inspect``,
``celery control``, ``celery events`` and Flower work, at most once, as on
Redis. Bindings of the other exchanges live in each process, as with
kombu's SQS transport.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import deque
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
    Message,
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
from ._listener import Listener

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
    ``broadcast_prefix``     pub/sub channels of the broadcast exchanges start
                             with it (``"/kombu."``): the same in every
                             process of an app; two apps sharing a cluster
                             with the same exchange names should differ
    ``broadcast_exchanges``  exchanges sent by pub/sub besides the fanout
                             ones, whatever their type (``("celeryev",)``:
                             Celery's events)
    ``broadcast_reply_pattern``  so are those whose name matches this regular
                             expression (Celery's remote-control replies,
                             ``reply.<app>.pidbox``)
    ``broadcast_buffer``     messages of a broadcast queue kept for a
                             consumer that does not take them (1000; the
                             oldest go first)
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
    broadcast_prefix: str = "/kombu."
    broadcast_exchanges: tuple[str, ...] = ("celeryev",)
    broadcast_reply_pattern: str = r"reply\..+\.pidbox"
    broadcast_buffer: int = 1000

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Settings:
        names = cls.__dataclass_fields__.keys()
        mine = {k: v for k, v in options.items() if k in names}
        if "broadcast_exchanges" in mine:
            mine["broadcast_exchanges"] = tuple(mine["broadcast_exchanges"])
        settings = cls(**mine)
        if settings.fetch_count < 1:
            raise ValueError("fetch_count must be at least 1")
        if settings.broadcast_buffer < 1:
            raise ValueError("broadcast_buffer must be at least 1")
        re.compile(settings.broadcast_reply_pattern)
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


# The delivery tags of messages that came by pub/sub (a broadcast
# exchange): nothing to acknowledge on the cluster.
BROADCAST_TAG = "b:"


def _glob_escape(text: str) -> str:
    """``text`` as a PSUBSCRIBE pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def expiration_ttl(message: dict[str, Any]) -> int | None:
    """The whole seconds of the message's ``expiration`` property (kombu's
    ``publish(expiration=...)``, AMQP's per-message TTL, milliseconds as
    text), rounded up, at least 1; None without one (or one unreadable)."""
    properties = message.get("properties")
    value = properties.get("expiration") if isinstance(properties, dict) else None
    if value is None or isinstance(value, bool):
        return None
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return None
    if not ms >= 0 or ms == float("inf"):
        return None
    return max(1, min(MAX_SECONDS, -(-int(ms) // 1000)))


def celery_expires(message: dict[str, Any]) -> bool:
    """A Celery task with ``expires``: its worker revokes it when it comes
    too late, and stores REVOKED for whoever waits on its result. Dropped
    by the cluster, it would never come and they would wait for ever
    (Celery's ``test_expired``); on Redis it comes too."""
    headers = message.get("headers")
    return isinstance(headers, dict) and headers.get("expires") is not None


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
        tags = [tag for tag in self._delivered if not tag.startswith(BROADCAST_TAG)]
        self._delivered.clear()
        if tags:
            self.channel.requeue([_job_id(tag) for tag in tags])
        return []

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the nodes queue unacknowledged jobs again."""


class Channel(virtual.Channel):
    """A kombu channel: publishes with ADDJOB, consumes with GETJOB; the
    broadcast exchanges (fanout ones, Celery's events and remote-control
    replies) go by PUBLISH and SUBSCRIBE."""

    QoS = QoS
    connection: Transport
    supports_fanout = True
    do_restore = True

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport = connection
        self.settings = connection.settings
        self._tags = itertools.count(1)
        self._fetcher: Client | None = None
        self._noack_queues: set[str] = set()
        self._ran_dry = False  # the last GETJOB brought fewer jobs than asked
        # Queues bound to a broadcast exchange: their subscriptions (key,
        # pattern?), and the messages that came for them, not delivered yet.
        self._broadcast_queues: dict[str, list[tuple[str, bool]]] = {}
        self.inbox: dict[str, deque[dict[str, Any]]] = {}
        self._reply_pattern = re.compile(self.settings.broadcast_reply_pattern)

    # ---------------------------------------------------------- broadcast

    def is_broadcast(self, exchange: str) -> bool:
        """Whether messages to this exchange go by pub/sub: a fanout one,
        or one named in broadcast_exchanges or matching
        broadcast_reply_pattern (whose bindings live in another process)."""
        if not exchange:
            return False
        declared = self.state.exchanges.get(exchange)
        if declared is not None and declared.get("type") == "fanout":
            return True
        settings = self.settings
        return (
            exchange in settings.broadcast_exchanges
            or self._reply_pattern.fullmatch(exchange) is not None
        )

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> Any:
        if self.is_broadcast(exchange):
            self._inplace_augment_message(message, exchange, routing_key)
            return self._put_fanout(exchange, message, routing_key, **kwargs)
        return super().basic_publish(message, exchange, routing_key, **kwargs)

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any
    ) -> None:
        """PUBLISH on ``<prefix><exchange>/<routing key>``: every process
        listening there, on any node, gets it (at most once)."""
        topic = f"{self.settings.broadcast_prefix}{exchange}/{routing_key}"
        with self.transport.shared() as client:
            client.publish(topic, dumps(message))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: Any, queue: str) -> None:
        """Bound to a broadcast exchange, the queue listens (once the node
        confirmed, so that a reply published right after is not missed):
        a fanout exchange every routing key, a topic one the keys its
        binding matches, another the routing key itself."""
        if not self.is_broadcast(exchange):
            return  # bindings of the others live in this process (kombu's table)
        base = f"{self.settings.broadcast_prefix}{exchange}/"
        kind = self.typeof(exchange).type
        matcher: re.Pattern[str] | None = None
        if kind in ("fanout", "topic"):
            key, is_pattern = _glob_escape(base) + "*", True
            if kind == "topic":
                topic = cast(Any, self.exchange_types["topic"])
                matcher = re.compile(topic.key_to_pattern(routing_key))
        else:
            key, is_pattern = base + routing_key, False
        self.inbox.setdefault(queue, deque(maxlen=self.settings.broadcast_buffer))
        self._broadcast_queues.setdefault(queue, []).append((key, is_pattern))
        self.transport.listen(key, is_pattern, _Route(self, queue, len(base), matcher))

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> Any:
        if exchange and queue in self._broadcast_queues:
            self._stop_listening(queue)
        return super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        if queue in self._broadcast_queues or queue in self.inbox:
            self._stop_listening(queue)
            self.inbox.pop(queue, None)
            return
        super()._delete(queue, *args, **kwargs)

    def _stop_listening(self, queue: str) -> None:
        for key, is_pattern in self._broadcast_queues.pop(queue, ()):
            self.transport.unlisten(key, is_pattern, self, queue)

    def take_broadcast(self, message: dict[str, Any], queue: str) -> None:
        """The listener thread: a message for a queue of this channel."""
        properties = message.setdefault("properties", {})
        properties["delivery_tag"] = f"{BROADCAST_TAG}{next(self._tags)}"
        box = self.inbox.get(queue)
        if box is None:
            return  # unbound meanwhile
        if len(box) == box.maxlen:
            log.warning(
                "broadcast queue %s holds %d messages nobody takes: dropping the oldest",
                queue,
                len(box),
            )
        box.append(message)

    def deliver_broadcasts(self, most: int = 100) -> bool:
        """Hand the messages that came by pub/sub to their consumers, as
        the prefetch limit allows. True if any."""
        delivered = 0
        callbacks = self.connection._callbacks
        for queue, box in list(self.inbox.items()):
            if queue not in callbacks:
                continue  # no consumer (yet): basic_get may take them
            while box and delivered < most and self.qos.can_consume():
                self.connection._deliver(box.popleft(), queue)
                delivered += 1
        return delivered > 0

    def job_queues(self) -> list[str]:
        """The queues consumed here that hold jobs (not broadcast ones)."""
        return [q for q in dict.fromkeys(self._active_queues) if q not in self._broadcast_queues]

    # ------------------------------------------------------------ publish

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        settings = self.settings
        delay = eta_delay(message, datetime.now(UTC)) if settings.delayed_delivery else 0
        ttl = settings.ttl
        expires = expiration_ttl(message)
        if expires is not None and not celery_expires(message):
            ttl = min(ttl, expires)  # not delivered once it expired: the job's TTL
        body = dumps(message)
        with self.transport.shared() as client:
            client.add_job(
                queue,
                body,
                replicate=settings.replicate,
                retry=settings.visibility_timeout,
                ttl=min(MAX_SECONDS, ttl + delay),
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
        queues = self.job_queues()
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
        if jobs:
            # Broadcasts the listener took while GETJOB waited go first: a
            # revoke published before the task it names is handled before
            # the task comes (Celery's test_revoked_by_headers_simple_canvas).
            for channel in cast(list[Channel], self.connection.channels):
                if channel.inbox:
                    channel.deliver_broadcasts()
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
        box = self.inbox.get(queue)
        if box is not None:
            if not box:
                raise Empty()
            return box.popleft()
        while True:
            client = self._fetch_client()
            # The node this process publishes to first: a GETJOB NOHANG on
            # another node that finds nothing asks the others for jobs
            # (NEEDJOBS), and what was just put could be on its way there
            # when asked for (1 in 10 missed that way).
            jobs = self._get_where_published(queue, client)
            if not jobs:
                jobs = client.get_jobs(queue, nohang=True)
                if not jobs:
                    raise Empty()
                track_delivered(self.transport.acks, client, jobs)
            payload = self._payload(jobs[0])
            if payload is not None:
                return payload

    def _get_where_published(self, queue: str, fetcher: Client) -> list[Job]:
        """GETJOB NOHANG on the node this process publishes to, if not the
        fetcher's: what it just put is queued there (a job is queued on the
        node that added it; federation moves it only to a consumer that
        waits). ``SimpleQueue.put()`` then ``get_nowait()`` on three nodes
        missed the message 7 times in 10 when only the fetcher's node was
        asked."""
        with self.transport.shared() as client:
            here = client.current_node
            if here is None or here == fetcher.current_node:
                return []
            jobs = client.get_jobs(queue, nohang=True)
            if jobs:
                # The acknowledging thread holds them, not this client.
                client.release(*(job.id for job in jobs))
                track_delivered(self.transport.acks, client, jobs)
        return jobs

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack and not message.delivery_tag.startswith(BROADCAST_TAG):
            self.transport.acks.ack(_job_id(message.delivery_tag))
        return message

    # ------------------------------------------------------------ settle

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        if not delivery_tag.startswith(BROADCAST_TAG):
            self.transport.acks.ack(_job_id(delivery_tag))
        super().basic_ack(delivery_tag)
        self.transport.capacity.set()

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag.startswith(BROADCAST_TAG):
            self.qos.ack(delivery_tag)  # at most once: nothing to give back
            return
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
        holds; a job is queued on one node at a time). A broadcast queue's
        is what came and was not delivered yet."""
        box = self.inbox.get(queue)
        if box is not None:
            return len(box)
        lengths, _missed = each_node(
            self.transport.shared,
            lambda c: c.qlen(queue),
            options=self.transport.client_options,
        )
        return sum(lengths)

    def _purge(self, queue: str) -> int:
        box = self.inbox.get(queue)
        if box is not None:
            count = len(box)
            box.clear()
            return count
        return purge_queue(self.transport.shared, queue, options=self.transport.client_options)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Disque makes a queue when a job is first queued in it."""

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def close(self) -> None:
        for queue in list(self._broadcast_queues):
            self._stop_listening(queue)
        self.inbox.clear()
        super().close()
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


_DisqueChannel = Channel  # the name Channel is the Transport's attribute in its body


@dataclass(frozen=True)
class _Route:
    """Where a broadcast goes: a channel's queue, the length of the topic's
    ``<prefix><exchange>/`` (the routing key follows), and for a topic
    exchange the binding's pattern."""

    channel: Channel
    queue: str
    base_len: int
    matcher: re.Pattern[str] | None


BROADCAST_POLL_S = 0.2


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
        exchange_type=frozenset(["direct", "topic", "fanout"]),
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
        # The broadcast exchanges' subscriptions: (key, pattern?) -> routes.
        self._routes: dict[tuple[str, bool], list[_Route]] = {}
        self._routes_lock = threading.Lock()
        self._listener: Listener | None = None

    # ---------------------------------------------------------- broadcast

    def listen(self, key: str, is_pattern: bool, route: _Route) -> None:
        """Route what is published on ``key`` to a channel's queue; the
        subscription is confirmed when this returns."""
        with self._routes_lock:
            self._routes.setdefault((key, is_pattern), []).append(route)
            if self._listener is None:
                self._listener = Listener(
                    self.shared,
                    self._on_broadcast,
                    password=self.client_options.get("password"),
                    connect_timeout=float(self.client_options.get("connect_timeout", 5.0)),
                    name="disque-kombu-listener",
                )
            listener = self._listener
        listener.subscribe(key, pattern=is_pattern)

    def unlisten(self, key: str, is_pattern: bool, channel: _DisqueChannel, queue: str) -> None:
        with self._routes_lock:
            routes = self._routes.get((key, is_pattern), [])
            for i, route in enumerate(routes):
                if route.channel is channel and route.queue == queue:
                    del routes[i]
                    break
            else:
                return
            if not routes:
                del self._routes[key, is_pattern]
            listener = self._listener
        if listener is not None:
            listener.unsubscribe(key, pattern=is_pattern)

    def _on_broadcast(self, message: Message) -> None:
        """The listener thread: a published message, to every queue bound."""
        key = (message.pattern, True) if message.pattern is not None else (message.channel, False)
        with self._routes_lock:
            routes = list(self._routes.get(key, ()))
        if not routes:
            return
        try:
            payload = loads(message.data)
            if not isinstance(payload, dict):
                raise TypeError(f"a JSON {type(payload).__name__}, not an object")
        except (ValueError, TypeError) as e:
            log.warning(
                "a broadcast on %s is not a kombu message (%s): dropped", message.channel, e
            )
            return
        taken = False
        for route in routes:
            routing_key = message.channel[route.base_len :]
            if route.matcher is not None and route.matcher.match(routing_key) is None:
                continue
            copy = payload if len(routes) == 1 else loads(message.data)
            route.channel.take_broadcast(copy, route.queue)
            taken = True
        if taken:
            self.capacity.set()

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
            if any(c.deliver_broadcasts() for c in consuming if c.inbox):
                return
            ready = [c for c in consuming if c.qos.can_consume() and c.job_queues()]
            listening = any(c._broadcast_queues for c in consuming)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if ready:
                channel = ready[self._turn % len(ready)]
                self._turn += 1
                wait = 1.0 if left is None else left
                if len(ready) > 1:
                    wait = min(wait, 0.1)
                if listening:
                    # A GETJOB cannot be woken by a broadcast: it waits
                    # this long at most (a remote-control request answered
                    # within a fifth of a second, not after the wait).
                    wait = min(wait, BROADCAST_POLL_S)
                if channel.fetch(wait):
                    return
            elif left is None or left > 0:
                self.capacity.wait(1.0 if left is None else min(left, 1.0))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError()  # socket.timeout, which kombu expects

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.acks.close()
        self.shared.close()
