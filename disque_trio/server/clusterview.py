"""The whole cluster for a dashboard open on any node: figures and job
copies gathered from the other nodes over the cluster bus.

Theory of operation
-------------------
The browser talks to the node that served the page only (one origin, one
password). That node asks the others over the bus, with messages of bus
protocol 5 and 10 (``protocol/bus.py``):

- ``GETSTATS`` -> ``NODEFIGURES`` (``NODESTATS`` from a node whose link
  speaks bus protocol 5 to 9): a node's figures (jobs by state, queues and
  their lengths, memory, clients, AOF state), and with NODEFIGURES its job
  census (``jobcensus.py``): the jobs it counts for the cluster, so that
  the sum counts jobs and not copies, and per queue the jobs waiting to be
  queued again after a RETRY or a delay. While a WebSocket session
  subscribes to the ``cluster`` topic, the events hub calls :meth:`ask`
  once a second: a GETSTATS to every node our link to is up, answered
  whenever it comes. The hub's next tick publishes what has arrived
  (``clustersnap.cluster_event``), so nothing waits for a node: a dead or
  slow one only leaves its own row without figures (after
  ``clustersnap.FRESH_MS``), while its state (PFAIL, FAIL) and link come
  from this node's own cluster table, within ``cluster-node-timeout``.
- ``FINDJOB`` -> ``JOBCOPY``: a job lookup (:meth:`find_job`) asks the nodes
  this node's copy lists as holders, or every node when it holds none,
  and waits for their answers for ``FIND_TIMEOUT_S`` at most.

Why the bus and not the other nodes' client ports: the links exist
already, they are authenticated by ``cluster-secret`` (and TLS) rather
than by ``requirepass``, which may differ from node to node, and the
failure detector already knows which nodes can be asked. A node of an
older release (its link speaks bus protocol 4 or less) is never sent these
messages: its row says "older release". One of bus protocol 5 to 9 sends
figures without the census: the cluster's count of jobs is then unknown.

Answering is the same on every node, web port or not: :meth:`on_message`
takes the five messages from ``NodeServer._dispatch``. It reads the node
and changes nothing. What one answer costs is bounded: the census of the
jobs is cached (``observe.NodeView``), at most ``STATS_QUEUES`` queue
names travel in each of its two lists, and our own answer is reused for
``OWN_STATS_REUSE_S`` however many nodes ask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import trio

from ..core.cluster import FAIL, HANDSHAKE, LEAVING, NOADDR, PFAIL
from ..core.ids import is_valid_job_id
from ..protocol import bus
from . import clustersnap, jobcensus
from .clustersnap import Heard, Member

if TYPE_CHECKING:
    from .host import ServerHost
    from .observe import NodeView

_T = TypeVar("_T")

# A job lookup waits this long for the nodes it asked. A node that is down
# is not asked (its link is down); this bounds a node that hangs.
FIND_TIMEOUT_S: Final = 2.0
# Job lookups waiting for answers at once, on this node (each holds a
# little state until its answers or its timeout).
MAX_LOOKUPS: Final = 32
# A NODESTATS lists this many queues at most, the longest, and their names
# add up to NAMES_MAX_BYTES at most: an answer stays a small frame whatever
# the queues are called. The jobs of the others travel as a count. So do a
# NODEFIGURES's queues with jobs waiting to be queued again, the most first.
STATS_QUEUES: Final = 200
NAMES_MAX_BYTES: Final = 64 * 1024
OWN_STATS_REUSE_S: Final = 0.5
ASK_MIN_INTERVAL_S: Final = 0.5

_FLAG_NAMES: Final = (
    (PFAIL, "pfail"),
    (FAIL, "fail"),
    (LEAVING, "leaving"),
    (HANDSHAKE, "handshake"),
    (NOADDR, "noaddr"),
)


class LookupRefused(Exception):
    """A job lookup that does not start: the message is the error line."""


class _Lookup:
    """One job lookup waiting for the nodes it asked."""

    def __init__(self, asked: list[str]) -> None:
        self.waiting = set(asked)
        self.copies: dict[str, bus.JobCopy] = {}
        self.done = trio.Event()
        if not self.waiting:
            self.done.set()

    def answer(self, sender: str, copy: bus.JobCopy) -> None:
        if sender in self.waiting:
            self.waiting.discard(sender)
            self.copies[sender] = copy
            if not self.waiting:
                self.done.set()


class ClusterView:
    """Asks the other nodes, answers them, and keeps what they said."""

    def __init__(self, server: ServerHost, view: NodeView) -> None:
        self.server = server
        self.view = view
        self.heard: dict[str, Heard] = {}  # node id -> its last answer
        # Node id -> when it was first asked (wall ms) since someone watches:
        # one that never answers is shown so, not as being asked for ever.
        self.asked: dict[str, int] = {}
        self.lookups: dict[int, _Lookup] = {}  # request -> lookup waiting
        self._request = 0  # numbers GETSTATS rounds and lookups
        self._own: tuple[float, bus.NodeFigures] | None = None
        self._asked = -math.inf  # trio time of the last GETSTATS round

    # ------------------------------------------------------------ answering

    def on_message(self, sender: str, msg: object) -> None:
        """One of GETSTATS, NODESTATS, NODEFIGURES, FINDJOB, JOBCOPY from a
        known node."""
        if isinstance(msg, bus.GetStats):
            own = self.own_figures()
            stats = attrs.evolve(own.stats, request=msg.request)
            peer = self.server.node.cluster.nodes.get(sender)
            if peer is not None and peer.bus_version >= bus.FIGURES_VERSION:
                self._send(sender, attrs.evolve(own, stats=stats))
            else:
                self._send(sender, stats)  # a release before NODEFIGURES
        elif isinstance(msg, bus.NodeStats | bus.NodeFigures):
            self.heard[sender] = Heard.of(msg, self.server.env.clock.wall_ms())
        elif isinstance(msg, bus.FindJob):
            self._send(sender, clustersnap.job_copy(self.server.node, msg.request, msg.job_id))
        elif isinstance(msg, bus.JobCopy):
            lookup = self.lookups.get(msg.request)
            if lookup is not None and msg.job_id:
                lookup.answer(sender, msg)

    def _send(self, node_id: str, msg: bus.Message) -> None:
        # Written now: a commit flushes the bus only after core effects,
        # and these messages are none of the core's.
        self.server.bus.send(node_id, msg)
        self.server.bus.flush()

    def own_figures(self) -> bus.NodeFigures:
        """This node's figures and job census as a NODEFIGURES (request 0),
        reused for a moment when several nodes ask at once."""
        now = trio.current_time()
        if self._own is not None and now - self._own[0] < OWN_STATS_REUSE_S:
            return self._own[1]
        server = self.server
        census = self.view.census()
        counts = census.states
        queues = self.view.queues(STATS_QUEUES)
        listed = [
            bus.QueueLength(q.name, len(q.jobs))
            for q in _named_within(sorted(queues, key=lambda q: -len(q.jobs)), lambda q: q.name)
        ]
        waiting = sum(len(q.jobs) for q in server.node.queues.values())
        stats = bus.NodeStats(
            0,
            server.uptime_s(),
            server.used_memory(),
            len(server.clients),
            server.ops_per_sec(),
            counts["queued"],
            counts["active"],
            counts["acked"],
            counts["wait_repl"],
            len(server.node.queues),
            tuple(listed),
            waiting - sum(q.length for q in listed),
            _aof_state(server),
            server.aof.current_size,
        )
        node_now = server.node.now_ms()
        longest = jobcensus.longest(census.counted, STATS_QUEUES)
        requeue = [
            bus.QueueRequeue(name, r.jobs, max(0, r.next_ms - node_now))
            for name, r in _named_within(longest, lambda item: item[0])
        ]
        all_requeue = sum(r.jobs for r in census.counted.values())
        figures = bus.NodeFigures(
            stats,
            census.jobs,
            tuple(requeue),
            all_requeue - sum(r.jobs for r in requeue),
        )
        self._own = (now, figures)
        return figures

    # ------------------------------------------------------------- gathering

    def members(self) -> list[Member]:
        """The serving node's table, as the dashboard names it."""
        table = self.server.node.cluster
        rows = []
        for peer in table.nodes.values():
            myself = peer is table.myself
            link = "self" if myself else "connected" if peer.link_up else "disconnected"
            flags = [name for bit, name in _FLAG_NAMES if peer.flags & bit]
            rows.append(
                Member(
                    peer.node_id,
                    f"{peer.ip}:{peer.port}",
                    tuple(["myself", *flags] if myself else flags),
                    link,
                    clustersnap.FIGURES_SINCE if myself else peer.bus_version,
                    peer.pong_received,
                )
            )
        return rows

    def ask(self) -> None:
        """A GETSTATS to every node that can answer one now; the answers
        are kept as they come (on_message). Once a second from the hub; a
        session that subscribes and unsubscribes in a loop asks no more
        often than every ASK_MIN_INTERVAL_S."""
        now = trio.current_time()
        if now - self._asked < ASK_MIN_INTERVAL_S:
            return
        self._asked = now
        self._request += 1
        table = self.server.node.cluster
        for node_id in [n for n in self.heard if n not in table.nodes]:
            del self.heard[node_id]  # forgotten nodes
        for node_id in [n for n in self.asked if n not in table.nodes]:
            del self.asked[node_id]
        wall = self.server.env.clock.wall_ms()
        for peer in table.others():
            if peer.link_up and peer.bus_version >= clustersnap.FIGURES_SINCE:
                self.asked.setdefault(peer.node_id, wall)
                self.server.bus.send(peer.node_id, bus.GetStats(self._request))
        self.server.bus.flush()

    def event(self) -> dict[str, Any]:
        """The ``cluster`` event's data: this node's own figures are taken
        now, the others' are the latest that arrived."""
        now = self.server.env.clock.wall_ms()
        heard = dict(self.heard)
        heard[self.server.node.node_id] = Heard.of(self.own_figures(), now)
        return clustersnap.cluster_event(now, self.members(), heard, self.asked)

    def forget(self) -> None:
        """Nobody watches any more: drop the figures (stale when someone
        watches again)."""
        self.heard.clear()
        self.asked.clear()

    # ------------------------------------------------------------ job lookup

    async def find_job(self, job_id: str) -> dict[str, Any]:
        """A job's copies across the cluster (docs/websocket.md, findjob).
        Raises LookupRefused for an ID that is not one, or when
        MAX_LOOKUPS are waiting already."""
        if not (job_id.isascii() and is_valid_job_id(job_id)):
            raise LookupRefused("BADID Invalid Job ID format.")
        if len(self.lookups) >= MAX_LOOKUPS:
            raise LookupRefused(f"BUSY too many job lookups in flight (limit {MAX_LOOKUPS})")
        node = self.server.node
        members = self.members()
        local = clustersnap.job_copy(node, 0, job_id)
        ask, outcomes = clustersnap.lookup_plan(node.node_id, local, members)
        outcomes_all: dict[str, bus.JobCopy | str] = {node.node_id: local, **outcomes}
        self._request += 1
        request = self._request
        lookup = self.lookups[request] = _Lookup(ask)
        try:
            for node_id in ask:
                self.server.bus.send(node_id, bus.FindJob(request, job_id))
            self.server.bus.flush()
            with trio.move_on_after(FIND_TIMEOUT_S):
                await lookup.done.wait()
        finally:
            del self.lookups[request]
        for node_id in ask:
            outcomes_all[node_id] = lookup.copies.get(node_id, clustersnap.NO_ANSWER)
        return clustersnap.lookup_result(job_id, members, outcomes_all)


def _named_within(items: Iterable[_T], name: Callable[[_T], str]) -> list[_T]:
    """The first items, in order, while their names add up to
    NAMES_MAX_BYTES at most (as the bus encodes them)."""
    kept = []
    room = NAMES_MAX_BYTES
    for item in items:
        room -= len(name(item).encode("utf-8", "surrogateescape"))
        if room < 0:
            break
        kept.append(item)
    return kept


def _aof_state(server: ServerHost) -> str:
    aof = server.aof
    if aof.state == "off":
        return "off"
    if aof.failing:
        return "failing"
    if aof.rewriting:
        return "rewriting"
    return aof.state  # on, wait-rewrite


# The bus messages handled here (NodeServer._dispatch routes them).
MESSAGES: Final[tuple[type, ...]] = (
    bus.GetStats,
    bus.NodeStats,
    bus.NodeFigures,
    bus.FindJob,
    bus.JobCopy,
)
