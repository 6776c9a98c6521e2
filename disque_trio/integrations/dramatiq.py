"""A Dramatiq broker on a Disque cluster.

    import dramatiq
    from disque_trio.integrations.dramatiq import DisqueBroker

    dramatiq.set_broker(DisqueBroker(url="disque://10.0.0.1:7711,10.0.0.2:7711"))

The mapping (docs/integrations.md says more):

==========================  ===============================================
Dramatiq                    Disque
==========================  ===============================================
``send()``, ``enqueue``     ADDJOB (REPLICATE, RETRY, TTL from the broker)
``delay`` (ms)              ADDJOB DELAY, in whole seconds rounded up: the
                            cluster holds the job, there is no ``.DQ``
                            queue and no worker holds it in memory
consume (prefetch)          GETJOB COUNT n WITHCOUNTERS FROM queue
ack                         ACKJOB, in batches, from a thread, routed to
                            the node that made the job
nack (a message failed      ``<queue>:dead`` (the worker's dead letter
for good)                   JSON), then ACKJOB
Retries middleware          the message's ``retries`` option is the job's
                            ``nacks`` counter; a retry of a message being
                            handled is NACK DELAY of its job (the same
                            job, ID and body; the ack that follows does
                            nothing), or, when the job's TTL would not
                            outlive the delay, a new ADDJOB, as Dramatiq's
                            Redis broker does
requeue (shutdown)          ENQUEUE (queued again at once, no nack counted)
a worker alive              WORKING for the jobs it holds past half their
                            RETRY: a worker that dies gives them back
                            after RETRY (Redis: its heartbeat times out)
``join``, ``flush``         JSCAN on every node; ACKJOB of what is queued
                            (``join`` raises a failed message's error, as
                            Dramatiq's StubBroker does)
==========================  ===============================================
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import defaultdict, deque
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout
from dramatiq.message import Message, get_encoder
from dramatiq.middleware import Middleware

from ..client import Client, DisqueConnectionError, DisqueError, Job
from ..worker import DeadLetter
from ._common import (
    DEFAULT_DEAD_LETTER_TTL,
    DEFAULT_TTL,
    MAX_SECONDS,
    Acknowledger,
    SharedClient,
    add_dead_letter,
    count_jobs,
    purge_queue,
    track_delivered,
    whole_seconds,
)

__all__ = ["DisqueBroker", "DisqueMessageProxy"]

log = logging.getLogger("disque_trio.integrations.dramatiq")

JOB_ID = "disque_job_id"
"""The option a message delivered by (or enqueued through) this broker
carries its Disque job ID in. Never stored in a job's body."""
_OWN_OPTIONS = frozenset({JOB_ID})


class DisqueMessageProxy(MessageProxy):
    """A delivered message, and its job: ``job_id``, ``job`` (with its
    counters)."""

    def __init__(self, message: Message[Any], job: Job) -> None:
        super().__init__(message)
        self.job = job
        self.job_id = job.id
        self.settled = False  # acked, nacked, requeued or retried in place
        self.retried = False  # NACK DELAY sent: the following ack is a no-op
        self.buried = False  # failed for good: its error is kept (join's fail_fast)

    def clear_exception(self) -> None:
        """The worker drops a handled message's error (a reference cycle);
        one that failed for good keeps it, as the StubBroker's do, for
        ``join`` to raise (the broker keeps a few: DEAD_LETTERS_KEPT)."""
        if not self.buried:
            super().clear_exception()


class DisqueBroker(Broker):
    """A Dramatiq broker that keeps messages as Disque jobs.

    Parameters:
      url: the client's node list, ``disque://[:password@]host:port,...``.
      middleware: as ``Broker``'s (None: Dramatiq's default set).
      replicate: ADDJOB REPLICATE (None: the node's default,
        min(3, cluster size)).
      retry: ADDJOB RETRY in seconds (60): a job not acknowledged by a
        worker that stopped sending WORKING for it is delivered again this
        long after its last delivery or WORKING.
      ttl: seconds a job lives (a week); a delayed job gets its delay on
        top. A retry in place needs the job to outlive its delay.
      asynchronous: ADDJOB ASYNC (answered before the copies are made).
      dead_letter: nack moves the message to ``<queue><suffix>`` (True);
        False drops it.
      dead_letter_suffix, dead_letter_ttl: ``":dead"``, a week.
      keepalive: WORKING for the jobs a worker holds, every ``retry / 2``
        seconds (True).
      linger: after a GETJOB that emptied the queue, wait this long before
        the next one, so that jobs arriving one by one come a few per
        GETJOB (0.005 s; 0: never wait).
      client_options: keyword arguments of ``disque_trio.client.Client``.

    For tests, as Dramatiq's ``StubBroker``: ``join`` waits for a queue to
    empty, and raises the error of a message of that queue this process
    failed for good (``fail_fast``, by default ``fail_fast_default``,
    True); ``dead_letters_by_queue`` keeps the last
    ``DEAD_LETTERS_KEPT`` such messages per queue (their dead letters are
    in the cluster, ``<queue>:dead``); ``flush`` forgets them.
    """

    DEAD_LETTERS_KEPT = 10

    def __init__(
        self,
        url: str = "disque://127.0.0.1:7711",
        *,
        middleware: list[Middleware] | None = None,
        replicate: int | None = None,
        retry: int = 60,
        ttl: int = DEFAULT_TTL,
        asynchronous: bool = False,
        dead_letter: bool = True,
        dead_letter_suffix: str = ":dead",
        dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
        keepalive: bool = True,
        linger: float = 0.005,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(middleware=middleware)
        if retry < 1:
            raise ValueError("retry must be at least 1 second (RETRY 0 is at most once)")
        self.url = url
        self.queues: set[str] = set()
        self.replicate = replicate
        self.retry = retry
        self.ttl = ttl
        self.asynchronous = asynchronous
        self.dead_letter = dead_letter
        self.dead_letter_suffix = dead_letter_suffix
        self.dead_letter_ttl = dead_letter_ttl
        self.linger = linger
        self.client_options = dict(client_options or {})
        self.fail_fast_default = True
        self.dead_letters_by_queue: defaultdict[str, deque[MessageProxy]] = defaultdict(
            lambda: deque(maxlen=self.DEAD_LETTERS_KEPT)
        )
        self.shared = SharedClient(self.new_client)
        self.acks = Acknowledger(
            self.new_client,
            keepalive=retry / 2 if keepalive else None,
            name="disque-dramatiq-acks",
        )

    def new_client(self, *, hold_jobs: bool = True) -> Client:
        return Client(self.url, **{"hold_jobs": hold_jobs, **self.client_options})

    # ------------------------------------------------------------ queues

    def declare_queue(self, queue_name: str) -> None:
        """Declare a queue (no delay queue: delays are the cluster's)."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def get_declared_queues(self) -> set[str]:
        return self.queues.copy()

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        return _DisqueConsumer(self, queue_name, prefetch, timeout)

    # ------------------------------------------------------------ enqueue

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """ADDJOB (with DELAY, whole seconds rounded up, for ``delay``
        milliseconds). A message being handled that is enqueued again with
        a delay (the Retries middleware's retry) is put back with NACK
        DELAY instead, when it can be. Returns the message with its job's
        ID in ``options["disque_job_id"]``."""
        self.emit_before("enqueue", message, delay)
        if (
            delay is not None
            and isinstance(message, DisqueMessageProxy)
            and self._retry_in_place(message, delay)
        ):
            self.emit_after("enqueue", message, delay)
            return message._message
        delay_s = whole_seconds(delay / 1000) if delay else 0
        fields = message.asdict()
        fields["options"] = {k: v for k, v in message.options.items() if k not in _OWN_OPTIONS}
        body = get_encoder().encode(fields)
        try:
            with self.shared() as client:
                job_id = client.add_job(
                    message.queue_name,
                    body,
                    replicate=self.replicate,
                    retry=self.retry,
                    ttl=min(MAX_SECONDS, self.ttl + delay_s),
                    delay=delay_s or None,
                    asynchronous=self.asynchronous,
                )
        except DisqueConnectionError as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        self.emit_after("enqueue", message, delay)
        plain = message._message if isinstance(message, MessageProxy) else message
        return plain.copy(options={JOB_ID: job_id})

    def _retry_in_place(self, message: DisqueMessageProxy, delay_ms: int) -> bool:
        """NACK DELAY the message's job if it is still ours and will live
        past the delay and one RETRY; False to publish it anew instead."""
        if message.settled:
            return False
        delay_s = whole_seconds(delay_ms / 1000)
        try:
            with self.shared() as client:
                info = client.show(message.job_id)
                if info is None or info.ttl <= delay_s + self.retry + 1:
                    return False
                if client.nack(message.job_id, delay=delay_s) != 1:
                    return False
        except DisqueError as e:
            log.info("NACK DELAY of %s failed (%s): enqueued anew", message.job_id, e)
            return False
        message.retried = True
        self.acks.untrack(message.job_id)
        return True

    # ------------------------------------------------------------ tests' helpers

    def flush(self, queue_name: str) -> None:
        """Acknowledge every job queued in the queue, on every node."""
        purge_queue(self.shared, queue_name, options=self.client_options)
        self.dead_letters_by_queue.pop(queue_name, None)

    @property
    def dead_letters(self) -> list[MessageProxy]:
        """The messages this process failed for good (the last
        ``DEAD_LETTERS_KEPT`` of each queue)."""
        return [m for messages in self.dead_letters_by_queue.values() for m in messages]

    def flush_all(self) -> None:
        for queue_name in self.queues:
            self.flush(queue_name)

    def join(
        self,
        queue_name: str,
        *,
        interval: int = 100,
        timeout: int | None = None,
        fail_fast: bool | None = None,
    ) -> None:
        """Wait until no job of the queue is queued, being handled or
        waiting for a delay on any node (JSCAN; acknowledgements still in
        this process are sent first). Meant for tests, as Dramatiq's
        ``join``. Raises QueueJoinTimeout after ``timeout`` milliseconds;
        then, with ``fail_fast`` (None: ``fail_fast_default``), the error
        of the first message of the queue this process failed for good."""
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        states = ["wait-repl", "queued", "active"]
        while True:
            self.acks.flush(5.0)
            left = count_jobs(self.shared, queue_name, states, options=self.client_options)
            if left == 0:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)  # type: ignore[no-untyped-call]
            time.sleep(interval / 1000)
        if self.fail_fast_default if fail_fast is None else fail_fast:
            for message in self.dead_letters_by_queue.get(queue_name, ()):
                error = message._exception or Exception("the message failed (no error kept)")
                raise error from None

    def close(self) -> None:
        """Send the acknowledgements still waiting, close the clients."""
        self.acks.close()
        self.shared.close()

    # ------------------------------------------------------------ settle

    def bury(self, message: DisqueMessageProxy) -> None:
        """The message failed for good: its dead letter (when enabled),
        then ACKJOB. A dead letter that cannot be added: NACK instead."""
        message.buried = True
        self.dead_letters_by_queue[message.queue_name].append(message)
        if self.dead_letter:
            error = message._exception
            letter = DeadLetter(
                id=message.job_id,
                queue=message.job.queue,
                body=message.job.body,
                error=f"{type(error).__name__}: {error}" if error else "failed",
                deliveries=message.job.deliveries,
                nacks=message.job.nacks,
                additional_deliveries=message.job.additional_deliveries,
                traceback=_traceback(message, error),
            )
            try:
                with self.shared() as client:
                    add_dead_letter(
                        client,
                        message.job.queue + self.dead_letter_suffix,
                        letter,
                        ttl=self.dead_letter_ttl,
                    )
            except DisqueError as e:
                log.warning("no dead letter for %s (%s): NACK instead", message.job_id, e)
                try:
                    with self.shared() as client:
                        client.nack(message.job_id)
                except DisqueError:
                    pass  # it comes back after its RETRY
                self.acks.untrack(message.job_id)
                return
        self.acks.ack(message.job_id)


def _traceback(message: MessageProxy, error: BaseException | None) -> str:
    text = message.options.get("traceback")
    if isinstance(text, str):
        return text
    if error is not None:
        return "".join(traceback.format_exception(error))
    return ""


class _DisqueConsumer(Consumer):
    """Messages of one queue, fetched with GETJOB COUNT (up to ``prefetch``
    outstanding), through a client of this consumer's own."""

    def __init__(self, broker: DisqueBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout
        # What it fetches is held by the broker's acknowledging thread,
        # which settles it (and keeps it alive when its node goes).
        self.client = broker.new_client(hold_jobs=False)
        self._lock = threading.Lock()  # the outstanding set (acks come from worker threads)
        self._client_lock = threading.Lock()  # the client (GETJOB waits under it)
        self._cache: deque[DisqueMessageProxy] = deque()
        self._outstanding: set[str] = set()
        self._room = threading.Event()
        self._ran_dry = False  # the last GETJOB brought fewer jobs than asked

    def __next__(self) -> MessageProxy | None:
        if self._cache:
            return self._cache.popleft()
        with self._lock:
            want = self.prefetch - len(self._outstanding)
        if want <= 0:
            # Every slot taken: wait for an ack to free one.
            self._room.clear()
            with self._lock:
                full = len(self._outstanding) >= self.prefetch
            if full:
                self._room.wait(self.timeout / 1000)
            return None
        if self._ran_dry and self.broker.linger > 0:
            # The queue ran dry at the last GETJOB: let what arrives meanwhile
            # come in one reply rather than one GETJOB per job.
            time.sleep(self.broker.linger)
        try:
            with self._client_lock:
                jobs = self.client.get_jobs(
                    self.queue_name, count=want, timeout=self.timeout / 1000
                )
        except DisqueConnectionError as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        self._ran_dry = 0 < len(jobs) < want
        if not jobs:
            return None
        track_delivered(self.broker.acks, self.client, jobs)
        for job in jobs:
            proxy = self._decode(job)
            if proxy is not None:
                with self._lock:
                    self._outstanding.add(job.id)
                self._cache.append(proxy)
        return self._cache.popleft() if self._cache else None

    def _decode(self, job: Job) -> DisqueMessageProxy | None:
        try:
            message = Message.decode(job.body)
        except Exception as e:  # Dramatiq's DecodeError, or whatever the encoder raised
            log.error(
                "job %s in %s is not a Dramatiq message (%s): burying it", job.id, job.queue, e
            )
            bad = DisqueMessageProxy(Message(job.queue, "", (), {}, {}, message_id=job.id), job)
            bad.stuff_exception(e)
            self.broker.bury(bad)
            return None
        if job.nacks:
            # Retries NACKed in place: the message sent is the one received
            # otherwise (Dramatiq's own tests compare them whole).
            retries = message.options.get("retries", 0)
            message.options["retries"] = (retries if isinstance(retries, int) else 0) + job.nacks
        message.options[JOB_ID] = job.id
        return DisqueMessageProxy(message, job)

    def _settle(self, message: MessageProxy) -> DisqueMessageProxy | None:
        """Mark the message done here; None if it is not one of ours or was
        settled before."""
        if not isinstance(message, DisqueMessageProxy) or message.settled:
            return None
        message.settled = True
        with self._lock:
            self._outstanding.discard(message.job_id)
        self._room.set()
        return message

    def ack(self, message: MessageProxy) -> None:
        proxy = self._settle(message)
        if proxy is not None and not proxy.retried:
            self.broker.acks.ack(proxy.job_id)

    def nack(self, message: MessageProxy) -> None:
        proxy = self._settle(message)
        if proxy is not None and not proxy.retried:
            self.broker.bury(proxy)

    def requeue(self, messages: Any) -> None:
        """ENQUEUE the messages (a worker stopping gives back what it had
        not started): queued again at once, without a nack."""
        ids = []
        for message in messages:
            proxy = self._settle(message)
            if proxy is not None:
                ids.append(proxy.job_id)
                self.broker.acks.untrack(proxy.job_id)
        self._enqueue(ids)

    def _enqueue(self, ids: list[str]) -> None:
        if not ids:
            return
        try:
            with self._client_lock:
                queued = self.client.enqueue(*ids)
        except DisqueError as e:
            queued = 0
            log.warning("ENQUEUE of %d jobs failed: %s", len(ids), e)
        if queued < len(ids):
            log.info(
                "%d of %d jobs given back now; the others come back after their RETRY",
                queued,
                len(ids),
            )

    def close(self) -> None:
        """Give back what was fetched and never handed out, close the client."""
        left = list(self._cache)
        self._cache.clear()
        self.requeue(left)
        with self._client_lock:
            self.client.close()
