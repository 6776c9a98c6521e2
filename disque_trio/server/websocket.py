"""One WebSocket client of /ws: JSON requests in, replies and events out.

Theory of operation
-------------------
A session has three kinds of tasks, all in the session's nursery:

- the reader (the session's own task) takes frames off the socket, parses
  them (``protocol/wsjson.py``), answers subscriptions and bad frames itself,
  and starts a task per command;
- a task per command runs it through ``ServerHost.execute`` exactly as a RESP
  connection does (same AUTH rule, arity checks, MONITOR feed, slow log),
  awaits the core if the command blocks, commits (``ServerHost.commit``),
  waits for its AOF records to be written and only then queues the reply.
  A GETJOB that blocks
  holds up nothing but itself;
- the writer, the only task that sends on the socket, drains the outbox.

Rules:

1. At most ``MAX_IN_FLIGHT`` commands run at once per socket; a command
   beyond that is answered at once with an error, not queued.
2. Replies are never dropped: a command waits for room in the outbox (so a
   slow reader slows down only its own commands, then its own reader).
3. Events are never waited for: an event that finds the outbox full ends
   that subscription, and the client is told with an ``error`` event.
4. The session ends when the socket closes, when CLIENT KILL cancels it, or
   after the reply to QUIT; its waiters are cancelled and it leaves the hub.

The hub (:class:`Hub`) knows which sessions listen to which topic: ``stats``
(sent once a second), ``nodes`` (sent on subscribe and whenever a node's
address, flags or link change; looked at once a second), ``cluster`` (every
node's figures, gathered over the bus by ``clusterview.py``: sent once a
second, each tick asking the other nodes for the next one), and
``jobs:<queue>`` (fed by the core's job observers, attached only while some
session listens, so the job hot path pays nothing otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio
import trio_websocket

from ..core.waiters import Waiter
from ..protocol import wsjson
from ..protocol.replies import Reply, ReplyError, err
from .client import Client
from .clusterview import ClusterView, LookupRefused
from .listen import Throttle
from .observe import NodeView

if TYPE_CHECKING:
    from ..core.job import Job
    from .host import ServerHost

log = logging.getLogger("disque_trio.web")

# Commands one socket may have running at once. A dashboard needs a handful;
# 64 lets a tool pipeline without letting one socket hold unbounded state.
MAX_IN_FLIGHT = 64
# Frames waiting for the writer (replies and events). Replies fit always
# (at most MAX_IN_FLIGHT are produced at a time and wait for room); the
# rest is slack for bursts of job events before a subscription is dropped.
OUTBOX_SIZE = 256
MAX_TOPICS = 256  # subscriptions per socket (jobs:<queue> can be many)
STATS_PERIOD_S = 1.0
CLOSE_TIMEOUT_S = 2.0

# Core job events and what a jobs:<queue> subscriber is told.
JOB_EVENTS = {
    "registered": "added",
    "queued": "queued",
    "delivered": "delivered",
    "acked": "acked",
    "deleted": "deleted",
}

# Commands that make no sense over this protocol: the reason they get.
_REFUSED = {
    b"monitor": "MONITOR is not available over WebSocket: subscribe to jobs:<queue> "
    "events, or use a RESP connection",
}
_HELLO_PROTO = err(
    "HELLO <protover> is not available over WebSocket: replies are always JSON "
    "(use AUTH to authenticate)"
)
NOAUTH = ReplyError("NOAUTH", "Authentication required.")
_R = TypeVar("_R", wsjson.CommandRequest, wsjson.FindJobRequest)


class Session:
    """One /ws connection: the reader, the command tasks, the writer."""

    def __init__(
        self, server: ServerHost, hub: Hub, ws: trio_websocket.WebSocketConnection, client: Client
    ) -> None:
        self.server = server
        self.hub = hub
        self.ws = ws
        self.client = client
        # (frame, close after sending it); see OUTBOX_SIZE.
        self.out_send, self.out_receive = trio.open_memory_channel[tuple[str, bool]](OUTBOX_SIZE)
        self.in_flight = 0
        self.topics: dict[str, None] = {}  # ordered set of subscribed topics
        self.waiters: dict[Waiter, None] = {}  # blocked commands (an ordered set)
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self.hub.leave(self)
            for waiter in list(self.waiters):
                self.server.node.cancel_wait(waiter)

    # ----------------------------------------------------------- reading

    async def _reader(self) -> None:
        while True:
            try:
                frame = await self.ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            self.client.last_ms = self.server.env.clock.wall_ms()
            self.server.stat_net_in += len(frame)
            if isinstance(frame, bytes):
                await self._send(
                    wsjson.error_message(
                        None, "ERR binary frames are not supported: send JSON text frames"
                    )
                )
                continue
            try:
                request = wsjson.parse_request(frame)
            except wsjson.BadRequest as e:
                await self._send(wsjson.error_message(e.id, e.message))
                continue
            await self._dispatch(request)

    async def _dispatch(self, request: wsjson.Request) -> None:
        if isinstance(request, wsjson.CommandRequest):
            await self._start(self._command, request)
        elif not self.client.authenticated:
            await self._send(wsjson.error_message(request.id, NOAUTH.line))
        elif isinstance(request, wsjson.FindJobRequest):
            await self._start(self._find_job, request)
        elif isinstance(request, wsjson.SubscribeRequest):
            new = [t for t in request.topics if t not in self.topics]
            if len(self.topics) + len(new) > MAX_TOPICS:
                message = f"ERR too many subscriptions (limit {MAX_TOPICS} per socket)"
                await self._send(wsjson.error_message(request.id, message))
                return
            await self._send(wsjson.reply_message(request.id, "OK"))
            self.hub.subscribe(self, new)
        else:
            topics = request.topics or tuple(self.topics)
            self.hub.unsubscribe(self, topics)
            await self._send(wsjson.reply_message(request.id, "OK"))

    async def _start(self, run: Callable[[_R], Awaitable[None]], request: _R) -> None:
        """Run a request in a task of its own (rule 1: a bounded number)."""
        if self.in_flight >= MAX_IN_FLIGHT:
            message = f"ERR too many requests in flight (limit {MAX_IN_FLIGHT})"
            await self._send(wsjson.error_message(request.id, message))
            return
        self.in_flight += 1
        assert self._nursery is not None
        self._nursery.start_soon(run, request)

    # ---------------------------------------------------------- commands

    async def _command(self, request: wsjson.CommandRequest) -> None:
        try:
            if self.client.close_after_reply:
                return  # after QUIT: nothing more runs
            reply = self._execute(request.argv)
            if isinstance(reply, Waiter):
                reply = await self._wait(reply)
            last = self.client.close_after_reply
            seq = self.server.commit()
            if seq and not await self.server.durable(seq):
                # Like a RESP batch: replies that acknowledge jobs whose AOF
                # records were not written are never sent; the socket drops.
                self._close_now()
                return
            await self._send(wsjson.reply_message(request.id, reply), last)
        finally:
            self.in_flight -= 1

    async def _find_job(self, request: wsjson.FindJobRequest) -> None:
        """A job's copies across the cluster: the node asks the others over
        the bus (server/clusterview.py), for a bounded time."""
        try:
            try:
                result = await self.hub.cluster.find_job(request.job_id)
            except LookupRefused as e:
                await self._send(wsjson.error_message(request.id, str(e)))
                return
            await self._send(wsjson.result_message(request.id, result))
        finally:
            self.in_flight -= 1

    def _execute(self, argv: list[bytes]) -> Reply | Waiter:
        name = argv[0].lower()
        refused = _REFUSED.get(name)
        if refused is not None:
            return err(refused)
        if name == b"hello" and len(argv) > 1:
            return _HELLO_PROTO
        return self.server.execute(self.client, argv)

    async def _wait(self, waiter: Waiter) -> Reply:
        """Wait for the core to answer a blocked command (GETJOB, a
        synchronously replicated ADDJOB), or its timeout."""
        done = trio.Event()
        waiter.wake = done.set
        self.server.commit()  # send what the command queued for peers
        if waiter.done:
            done.set()
        self.waiters[waiter] = None
        self.client.blocked = waiter
        timeout = waiter.timeout_ms / 1000 if waiter.timeout_ms else float("inf")
        try:
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            del self.waiters[waiter]
            self.client.blocked = next(iter(self.waiters), None)
            timeout_reply = self.server.node.cancel_wait(waiter)
        return waiter.reply if done.is_set() else timeout_reply

    # ----------------------------------------------------------- writing

    async def _send(self, frame: str, last: bool = False) -> None:
        await self.out_send.send((frame, last))

    def push_event(self, topic: str, frame: str) -> None:
        """Queue an event frame unless the outbox is full; then the topic is
        dropped and the client told (rule 3)."""
        try:
            self.out_send.send_nowait((frame, False))
        except trio.WouldBlock:
            self.hub.unsubscribe(self, [topic])
            notice = wsjson.event_message(
                "error",
                {
                    "topic": topic,
                    "error": "ERR slow consumer: the event queue of this socket is full "
                    f"({OUTBOX_SIZE} frames), subscription dropped",
                },
            )
            try:
                if self._nursery is not None:
                    self._nursery.start_soon(self._send, notice)
            except RuntimeError:
                pass  # the session is ending: nobody to tell
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _writer(self) -> None:
        try:
            async for frame, last in self.out_receive:
                await self.ws.send_message(frame)
                self.server.stat_net_out += len(frame)
                if last:
                    with trio.move_on_after(CLOSE_TIMEOUT_S):
                        await self.ws.aclose()
                    break
        except trio_websocket.ConnectionClosed:
            pass
        self._close_now()

    def _close_now(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


class Hub:
    """Topic subscriptions of every session of one node, and the task that
    sends the periodic events."""

    def __init__(self, server: ServerHost, view: NodeView, cluster: ClusterView) -> None:
        self.server = server
        self.view = view
        self.cluster = cluster
        # Sessions by topic, in subscription order (a dict as an ordered set).
        self.stats: dict[Session, None] = {}
        self.nodes: dict[Session, None] = {}
        self.watching: dict[Session, None] = {}  # the cluster topic
        self.jobs: dict[str, dict[Session, None]] = {}  # by queue name
        self._nodes_key: list[tuple[Any, ...]] = []
        self._observer: Callable[[str, Job], None] | None = None

    def subscribe(self, session: Session, topics: list[str]) -> None:
        for topic in topics:
            session.topics[topic] = None
            if topic == wsjson.TOPIC_STATS:
                self.stats[session] = None
                session.push_event(topic, wsjson.event_message("stats", self.view.stats()))
            elif topic == wsjson.TOPIC_NODES:
                self.nodes[session] = None
                session.push_event(topic, wsjson.event_message("nodes", self.view.nodes()))
            elif topic == wsjson.TOPIC_CLUSTER:
                self.watching[session] = None
                session.push_event(topic, wsjson.event_message("cluster", self.cluster.event()))
                self.cluster.ask()  # figures for the next tick
            else:
                queue = topic[len(wsjson.TOPIC_JOBS_PREFIX) :]
                self.jobs.setdefault(queue, {})[session] = None
        self._update_observer()

    def unsubscribe(self, session: Session, topics: tuple[str, ...] | list[str]) -> None:
        for topic in topics:
            session.topics.pop(topic, None)
            if topic == wsjson.TOPIC_STATS:
                self.stats.pop(session, None)
            elif topic == wsjson.TOPIC_NODES:
                self.nodes.pop(session, None)
            elif topic == wsjson.TOPIC_CLUSTER:
                self._stop_watching(session)
            else:
                queue = topic[len(wsjson.TOPIC_JOBS_PREFIX) :]
                listeners = self.jobs.get(queue)
                if listeners is not None:
                    listeners.pop(session, None)
                    if not listeners:
                        del self.jobs[queue]
        self._update_observer()

    def _stop_watching(self, session: Session) -> None:
        if session in self.watching:
            del self.watching[session]
            if not self.watching:
                self.cluster.forget()

    def leave(self, session: Session) -> None:
        self.unsubscribe(session, tuple(session.topics))

    def _update_observer(self) -> None:
        # The node's list is replaced, never changed in place: this runs
        # while the node walks that list (a slow consumer's subscription is
        # dropped from inside ``_on_job``), and a removal there would make
        # the walk skip the next observer.
        node = self.server.node
        if self.jobs and self._observer is None:
            self._observer = self._on_job
            node.observers = [*node.observers, self._observer]
        elif not self.jobs and self._observer is not None:
            node.observers = [o for o in node.observers if o is not self._observer]
            self._observer = None

    def _on_job(self, event: str, job: Job) -> None:
        what = JOB_EVENTS.get(event)
        listeners = self.jobs.get(job.queue)
        if what is None or not listeners:
            return
        frame = wsjson.event_message(
            "job",
            {"queue": wsjson.text_json(job.queue), "id": job.id, "what": what},
        )
        topic = wsjson.TOPIC_JOBS_PREFIX + job.queue
        for session in list(listeners):
            session.push_event(topic, frame)

    async def run(self) -> None:
        """Once a second: stats to their subscribers, nodes if they changed.
        A bug in a snapshot is logged (at most every 10 s) and skips that
        second: it must not end the web port, nor the node with it."""
        throttle = Throttle()
        while True:
            await trio.sleep(STATS_PERIOD_S)
            try:
                self._tick()
            except Exception as e:
                throttle.log(
                    logging.ERROR, "bug", "web events: unexpected error", exc_info=e, logger=log
                )

    def _tick(self) -> None:
        if self.stats:
            frame = wsjson.event_message("stats", self.view.stats())
            for session in list(self.stats):
                session.push_event(wsjson.TOPIC_STATS, frame)
        self._check_nodes()
        if self.watching:
            # What arrived since the last tick, then the next questions.
            frame = wsjson.event_message("cluster", self.cluster.event())
            for session in list(self.watching):
                session.push_event(wsjson.TOPIC_CLUSTER, frame)
            self.cluster.ask()

    def _check_nodes(self) -> None:
        rows = self.view.nodes()
        key = [(r["id"], r["addr"], tuple(r["flags"]), r["link"]) for r in rows]
        if key == self._nodes_key:
            return
        self._nodes_key = key
        if self.nodes:
            frame = wsjson.event_message("nodes", rows)
            for session in list(self.nodes):
                session.push_event(wsjson.TOPIC_NODES, frame)
