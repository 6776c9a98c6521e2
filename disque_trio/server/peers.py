"""The cluster bus: one listener, one outbound link task per known node.

Links are one-way. Each node sends to a peer over the connection it opened
itself, and only reads on the connections peers opened to it::

    connector                                  acceptor
      Handshake(id, ip, ports, nonce C)  ------->
                                         <-------   Handshake(id, ip, ports, nonce A)
                                         <-------   Auth(proof of the acceptor)
      Auth(proof of the connector)       ------->
      message, message, ...              ------->   (read, decoded, fed to the core)

The acceptor answers the handshake so that the connector learns who it
reached (CLUSTER MEET knows only an address). Each proof is an HMAC of both
nonces and IDs keyed by ``cluster-secret`` (``bus.handshake_proof``): each
side checks the other's before anything else is read or dispatched, so
without the secret a connection gets no further than two frames of 4 KB at
most (``bus.HANDSHAKE_MAX_FRAME``), and the secret never travels. Without a
secret on either side, the proofs are empty and anyone may connect, as with
the original; a side with a secret refuses a side without one.

An acceptor ignores messages from a node it does not know unless the first
one is MEET, like the original. Until its node is known, an inbound link may
send frames of ``PENDING_MAX_FRAME`` at most, and at most
``PENDING_MAX_LINKS`` such links exist at once: a stranger that never MEETs
holds little memory.

Each link has a bounded outbox: when a peer is slow or gone, messages are
dropped, which the protocol tolerates (every message is re-sent or re-derived
later: pings, GC retries, replication re-sends, NEEDJOBS back-off). A frame
that does not decode closes that link and is logged (throttled); it never
reaches the node's nursery.

With ``tls-cluster yes`` every link, both ways, is a TLS connection first
(server/tls.py): each end shows the node's certificate and checks the
other's against ``tls-ca-cert-file``, then the handshake above runs inside
it. A failed TLS handshake is logged (throttled) and ends that connection.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import attrs
import trio

from ..config import Config
from ..core.cluster import ClusterTable
from ..core.job import Job, JobState
from ..core.node import Node
from ..core.records import wire_ttl
from ..env import Env
from ..protocol import bus
from . import tls
from .listen import Throttle, accept_loop
from .sockio import receive_some, send_all, write_nowait


class BusHost(Protocol):
    """What the bus needs of the node: settings, seams, TLS, the jobs it
    holds (a queued REPLJOB for a job gone meanwhile is not sent), and a
    commit after each batch of messages it dispatched."""

    config: Config
    env: Env
    node: Node
    tls: tls.TlsContexts

    def announce_ip(self) -> str: ...

    def after_bus_event(self) -> None: ...


log = logging.getLogger("disque_trio.bus")

# 65,536 frames of slack per peer (about 15 MB of REPLJOBs at worst): a
# burst of ASYNC replication for tens of thousands of jobs fits; beyond that
# the peer is too slow and messages are dropped (and counted).
OUTBOX_SIZE = 65_536
URGENT_MAX = 64  # heartbeats waiting for a busy link task (ten a second at most)
# The writer sends what is queued in one system call, up to this many frames.
SEND_BATCH = 256
READ_SIZE = 64 * 1024
HANDSHAKE_TIMEOUT_S = 5.0
# Inbound links whose node is not known yet (handshaking, or waiting for
# MEET), and the largest frame one may send: a MEET with its gossip fits.
PENDING_MAX_LINKS = 64
# Inbound links one known node may hold at once (see Bus._known).
INBOUND_PER_NODE = 4
PENDING_MAX_FRAME = 256 * 1024
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 0.5  # a refused connect is cheap; a restarted node is found fast

Dispatch = Callable[[str, object], None]
_M = TypeVar("_M", bound=bus.Message)


class HandshakeRefused(Exception):
    """The peer spoke another protocol version or failed the secret check."""


class _Pending:
    """Whether an inbound link still counts in Bus.pending_links, and the
    scope that ends it."""

    active = True

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope


# An outbox item that carries nothing: it wakes the link task to write a
# link's ``rest``.
_WAKE: Final = (None, b"", math.inf)


class PeerLink:
    """Our outbound connection to one node, and the messages waiting for it."""

    def __init__(self, node_id: str, offer: int = bus.PROTOCOL_VERSION) -> None:
        self.node_id = node_id
        # (the REPLJOB of a job held here or None, frame, send-by time):
        # see Bus._outgoing.
        self.send_channel, self.receive_channel = trio.open_memory_channel[_OutboxItem](
            OUTBOX_SIZE
        )
        # Cancelled when the node is forgotten: ends the link for good.
        self.cancel_scope = trio.CancelScope()
        # Cancelled to drop just the current connection (a stuck link): the
        # outbox survives and the link task reconnects.
        self.connection_scope = trio.CancelScope()
        # Frames a full outbox refused or newer heartbeats pushed out, and
        # the messages in them (a BATCH frame is one frame, and each of its
        # messages).
        self.dropped = 0
        self.dropped_messages = 0
        # Set to cut a reconnection back-off short: the node just connected
        # to us, so it is up and listening again.
        self.retry_now = trio.Event()
        self.ended = False  # the link task returned (its node left the table)
        self.up = False  # connected, the peer answered our handshake as itself
        # The bus protocol version the next connection offers (one less
        # after a node closed on our offer: an older release), and the one
        # the last connection spoke (the lowest we speak until one did):
        # messages newer than it are not sent (bus.SINCE_VERSION).
        self.offer = offer
        self.version = bus.MIN_PROTOCOL_VERSION
        # The last connection attempt failed (refused: the node is down or
        # not listening yet). A starting node does not wait to hear it.
        self.unreachable = False
        # The connection while the link is up, for writes from the commit
        # (Bus.flush); None while down.
        self.stream: trio.abc.SendStream | None = None
        self.writing = False  # the link task is in a write: frames queue behind it
        self.queued = 0  # items in the outbox the link task has not taken yet
        # For Bus.flush: outbox items, and BATCHABLE messages not encoded
        # yet, each with its message class (counted once written or queued).
        self.pending: list[_PendingItem] = []
        # Announcements in the outbox (WILLQUEUE, QUEUED counting nothing):
        # frame -> copies not taken yet. Only the last copy is written (see
        # Bus.send, superseded).
        self.repeats: dict[bytes, int] = {}
        self.rest = b""  # of a frame the socket took only part of (Bus.flush)
        # Heartbeats and FAILs sent while the link task writes or has frames
        # queued: they go before the queued frames (never behind a full
        # outbox, never dropped by it), with the link task's next write.
        self.urgent: list[bytes] = []

    @property
    def idle(self) -> bool:
        """Connected, with nothing queued and no write in progress: the
        commit may write to it itself (Bus.flush)."""
        return self.stream is not None and not self.writing and not self.queued

    def to_outbox(self, item: _OutboxItem, messages: int = 1) -> bool:
        """Queue ``item`` (a frame of ``messages`` messages) for the link
        task; False (counted as dropped) when the outbox is full."""
        try:
            self.send_channel.send_nowait(item)
        except trio.WouldBlock:
            self._dropped(messages)
            return False
        self.queued += 1
        return True

    def to_urgent(self, frame: bytes) -> None:
        """Queue a heartbeat or FAIL ahead of the outbox; past URGENT_MAX
        waiting, the oldest gives way (a newer one says as much): counted
        dropped (and sent, when it was queued)."""
        self.urgent.append(frame)
        if len(self.urgent) > URGENT_MAX:
            del self.urgent[0]
            self._dropped(1)

    def _dropped(self, messages: int) -> None:
        self.dropped += 1
        self.dropped_messages += messages

    def queued_announcement(self, frame: bytes) -> None:
        """``frame``, an announcement, went into the outbox."""
        self.repeats[frame] = self.repeats.get(frame, 0) + 1

    def superseded(self, frame: bytes) -> bool:
        """``frame`` leaves the outbox: True for an announcement with a later
        copy of itself still there (only that one is written)."""
        copies = self.repeats.get(frame)
        if copies is None:
            return False
        if copies > 1:
            self.repeats[frame] = copies - 1
            return True
        del self.repeats[frame]
        return False


# An outbox item: (the REPLJOB of a job held here or None, frame, send-by
# time). A pending item: the same with a BATCHABLE message in place of the
# frame, and its message class; an encoded one: (outbox item, message
# class, messages).
_OutboxItem = tuple["bus.ReplJob | None", bytes, float]
_PendingItem = tuple["bus.ReplJob | None", "bytes | bus.Message", float, type]
_Encoded = tuple[_OutboxItem, type, int]


def _encode_run(run: list[bus.Message], items: list[_Encoded]) -> None:
    """Append outbox items carrying ``run``, messages of one BATCHABLE kind."""
    kind = type(run[0])
    for start in range(0, len(run), bus.BATCH_MAX):
        chunk = run[start : start + bus.BATCH_MAX]
        frame = bus.encode_frame(chunk[0]) if len(chunk) == 1 else bus.encode_batch(chunk)
        items.append(((None, frame, math.inf), kind, len(chunk)))


def _late(send_by: float) -> bool:
    """A message that had to be written by ``send_by`` (Trio time) was not."""
    return send_by < math.inf and trio.current_time() > send_by


class Bus:
    """Owns every bus connection of one node."""

    def __init__(self, server: BusHost, table: ClusterTable, dispatch: Dispatch) -> None:
        self.server = server
        self.table = table
        self.dispatch = dispatch
        self.links: dict[str, PeerLink] = {}
        self._nursery: trio.Nursery | None = None
        self._synced_membership = -1  # the table's membership at the last sync_links
        self.frames_in = 0
        self.frames_out = 0
        self.bad_frames = 0
        # Messages by class (bus.Ping, bus.ReplJob...): sent counts those
        # written or queued on a link (the dropped ones are in
        # PeerLink.dropped, stale ones in neither), received those decoded
        # from a known node. /metrics reads them.
        self.sent_by_type: dict[type, int] = {}
        self.received_by_type: dict[type, int] = {}
        # The last message encoded, and its frame (see send).
        self._last_msg: object = None
        self._last_frame = b""
        self._pending_links: list[PeerLink] = []
        # Set at each bus event (start-up waits on it: wait_peers_heard).
        self._progress = trio.Event()
        self.pending_links = 0  # inbound links whose node is not known yet
        self.refused_links = 0  # handshakes refused (version, secret, too many)
        # Cancel scopes of the inbound links, to drop them all when the
        # cluster secret changes (they proved the old one).
        self._inbound_scopes: set[trio.CancelScope] = set()
        # The inbound links of each node of the table, oldest first (_known).
        self._inbound_by_node: dict[str, list[trio.CancelScope]] = {}
        self.replaced_links = 0
        self.throttle = Throttle()
        # Set when a commit left messages for the flusher (flush_soon); None
        # until the flusher runs (Bus.run), and flush_soon then flushes at
        # once.
        self._flush_due: trio.Event | None = None
        # A REPLJOB was sent since the last flush: the flusher yields a
        # pass before writing (_flusher).
        self._replicating = False

    # --------------------------------------------------------------- setup

    async def run(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._flush_due = trio.Event()
            nursery.start_soon(self._flusher)
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener)
            self.sync_links()
            task_status.started()

    def sync_links_if_moved(self) -> None:
        """:meth:`sync_links` if a node entered or left the table since the
        last one (a heartbeat's gossip may have named a new node; most name
        none, and there is nothing to do)."""
        if self.table.membership != self._synced_membership:
            self.sync_links()

    def sync_links(self) -> None:
        """Start link tasks for new nodes, stop those of forgotten ones."""
        if self._nursery is None:
            return
        self._synced_membership = self.table.membership
        # In a stable order (never a set's): the simulator replays the
        # order in which tasks start.
        wanted = [n.node_id for n in self.table.wanted_links()]
        for node_id in wanted:
            old = self.links.get(node_id)
            # A link whose task ended: its node left the table (a gossiped
            # node that never answered our handshake is dropped by the cron)
            # and came back before this sync (the next gossip names it
            # again). Kept, it would leave that node without a link for
            # ever (simulator seed 645595158, a 1 s node timeout).
            if old is None or old.ended:
                link = self.links[node_id] = PeerLink(node_id, self.table.protocol)
                self._nursery.start_soon(self._link_task, link)
            elif old.up and not self.table.nodes[node_id].link_up:
                # The node left the table (a handshake timeout) and came back
                # while our link to it stayed connected: its new entry says
                # no link. Come back by gossip, it would wait for a
                # handshake that already happened, be dropped again 5 s
                # later, and so on for ever (simulator seed 20000951); by a
                # MEET, it would never be pinged (pings go over a link that
                # is up) and stay PFAIL for ever, its first PING's clock
                # running (seed 115774: a replaced node's link to a node
                # that was down finished its handshake after the cron had
                # dropped the gossiped entry, and CLUSTER MEET added it
                # again). The link is up: say so.
                self.table.link_changed(node_id, True, self.server.env.clock.wall_ms())
        keep = set(wanted)
        for node_id in [x for x in self.links if x not in keep]:
            self.links.pop(node_id).cancel_scope.cancel()

    async def wait_peers_heard(self) -> None:
        """Return once every known peer has an outbound link and answered
        the ping sent over it: its PONG proves it read our PING, which
        cleared any failure flag it held on us (links are one-way, so a
        link that is up says only that the peer accepted it). A peer that
        refused our connection is down: it holds no flag to clear, and
        waiting for it would only delay a node restarted among stopped
        ones (the original's suite restarts a whole cluster one node at a
        time, each within 5 s)."""
        while any(
            (n.ping_sent or not n.link_up) and not self._unreachable(n.node_id)
            for n in self.table.wanted_links()
        ):
            self._progress = trio.Event()
            await self._progress.wait()

    def _unreachable(self, node_id: str) -> bool:
        link = self.links.get(node_id)
        return link is not None and link.unreachable

    def progress(self) -> None:
        """A link came up or a message was handled: wake wait_peers_heard."""
        self._progress.set()

    def send(self, node_id: str, msg: object, send_by: float = math.inf) -> None:
        """Queue ``msg`` for the node's link, or drop it if there is none.
        ``send_by``: the Trio time after which it is no longer written
        (``Send.valid_ms``: what a YOURJOBS says is true for a while only).
        It applies to messages sent in frames of their own; BATCHABLE ones
        (a job ID and a flag at most) never go stale, and have none."""
        link = self.links.get(node_id)
        if link is None:
            return
        kind = type(msg)
        if bus.SINCE_VERSION.get(kind, 0) > link.version:  # type: ignore[arg-type]
            return  # the peer's release has no such message: as if lost
        up = link.stream is not None
        if kind in bus.BATCHABLE and up:
            # Encoded at the end of the commit (flush) with the run of its
            # kind around it, one BATCH frame for them all; written then if
            # the link is idle, else queued then. (A link that is down
            # queues frames of their own: see the announcements below.)
            self._to_pending(link, (None, msg, math.inf, kind))  # type: ignore[arg-type]
            return
        # The core sends one message object to every holder of a job
        # (messages are frozen): encode it once.
        if msg is self._last_msg:
            frame = self._last_frame
        else:
            frame = bus.encode_frame(msg)  # type: ignore[arg-type]
            self._last_msg, self._last_frame = msg, frame
        # Only a copy of a job held here can go stale, or be brought up to
        # date when written (Bus._outgoing). One sent after an external
        # replication ended (the job, added on a leaving node or one short
        # of memory, already forgotten here) goes out as made, if written
        # by its ``send_by``: the end of the second its TTL was read in.
        copy = None
        if type(msg) is bus.ReplJob:
            self._replicating = True
            if msg.job.id in self.server.node.jobs:
                copy = msg
        item = (copy, frame, send_by)
        urgent = up and isinstance(msg, bus.Heartbeat | bus.Fail)
        if link.idle or (link.pending and not urgent):
            # Nothing waits before it (written at the end of the commit), or
            # it follows this commit's earlier messages to the link.
            self._to_pending(link, (copy, frame, send_by, kind))
            return
        if urgent:
            # The failure detector's messages do not wait behind job
            # traffic, nor get dropped with it when the outbox is full:
            # under load (50,000 RETRY 5 jobs on three nodes) PONGs lost
            # that way flagged busy peers failing, and ADDJOBs got NOREPL.
            link.to_urgent(frame)
        elif not link.to_outbox(item):
            return
        elif type(msg) is bus.WillQueue or (type(msg) is bus.Queued and not msg.flags):
            # A link down for a while (a partition) collects the same
            # announcement at every retry point; each copy would be
            # answered (QUEUED to every holder) when it comes back. They
            # say the same thing: the last one goes, in its place.
            link.queued_announcement(frame)
        self._count_sent(kind, 1)

    def flush_soon(self) -> None:
        """Have what was sent so far written once the tasks running in this
        pass of the scheduler are done: the flusher task, woken now, runs in
        the next pass, and flushes for every commit made meanwhile. Fifty
        clients' ADDJOBs read in one pass send their REPLJOBs to a peer in
        one write, which the peer reads and answers as one batch, instead of
        a write, a wake-up, a read and a GOTJOB frame back per job.

        REPLJOBs wait one pass more (see _flusher): the ADDJOBs of clients
        whose commands arrived while the pass ran join the same write."""
        if not self._pending_links:
            return
        if self._flush_due is None:
            self.flush()
        else:
            self._flush_due.set()

    async def _flusher(self) -> None:
        while True:
            assert self._flush_due is not None
            await self._flush_due.wait()
            if self._replicating:
                # A node that takes ADDJOBs from many clients at -P 1 reads
                # them in waves, a pass apart: yielding once more lets the
                # next wave's REPLJOBs join this write. Its replicas then
                # wake, read and answer a third less often for as many jobs
                # (fifty clients: about 48 jobs a write instead of 31; a
                # few percent less CPU per job on them), for one pass more
                # before an ADDJOB is answered. Bus messages answering bus
                # messages (GOTJOBs) do not wait: a replica gathers nothing
                # in that pass, and the pass costs it what it saved.
                await trio.lowlevel.cancel_shielded_checkpoint()
            self._replicating = False
            self._flush_due = trio.Event()
            self.flush()

    def flush(self) -> None:
        """Write the frames sent since the last flush to links that had
        nothing queued and no write in progress, one write per link, now:
        no wake-up of the link task, which stays parked. What the socket
        does not take goes to the link task: whole frames as if queued,
        the rest of a frame cut short as the link's ``rest``. A busy link's
        pending messages (BATCHABLE ones and those after them) are queued
        for its task, in BATCH frames."""
        links, self._pending_links = self._pending_links, []
        for link in links:
            encoded = self._encode_pending(link.pending)
            link.pending = []
            if not encoded:
                continue
            if link.idle:
                assert link.stream is not None  # idle: connected
                data = b"".join([item[1] for item, _, _ in encoded])
                written = write_nowait(link.stream, data)
                if written:
                    for _, kind, n in encoded:
                        self._count_sent(kind, n)
                if written == len(data):
                    self.frames_out += len(encoded)
                    continue
                if written:
                    # The socket took part of a frame: the link task writes
                    # the rest first (on this connection only: see
                    # _serve_link), and counts it as one frame.
                    self.frames_out += len(encoded) - 1
                    link.rest = data[written:]
                    link.to_outbox(_WAKE, 0)
                    continue
            for item, kind, n in encoded:
                if link.to_outbox(item, n):
                    self._count_sent(kind, n)

    def _count_sent(self, kind: type, messages: int) -> None:
        self.sent_by_type[kind] = self.sent_by_type.get(kind, 0) + messages

    def _to_pending(self, link: PeerLink, item: _PendingItem) -> None:
        """``item`` waits for the end of the commit (flush)."""
        if not link.pending:
            self._pending_links.append(link)
        link.pending.append(item)

    def _encode_pending(self, pending: list[_PendingItem]) -> list[_Encoded]:
        """A link's pending items as outbox items: stale ones left out, each
        run of BATCHABLE messages of one kind in BATCH frames (a run of one
        in a frame of its own), the order kept."""
        items: list[_Encoded] = []
        run: list[bus.Message] = []
        for copy, payload, send_by, kind in pending:
            if isinstance(payload, bytes):
                if run:
                    _encode_run(run, items)
                    run = []
                if not self._stale(copy, send_by):
                    items.append(((copy, payload, send_by), kind, 1))
            else:
                if run and type(run[0]) is not type(payload):
                    _encode_run(run, items)
                    run = []
                run.append(payload)
        if run:
            _encode_run(run, items)
        return items

    def close_all(self) -> None:
        for link in self.links.values():
            link.cancel_scope.cancel()

    def secret_changed(self) -> None:
        """CONFIG SET cluster-secret: every link proved the old secret (or
        none); drop them all, so each one handshakes again with the new."""
        self.drop_connections()

    def drop_connections(self) -> None:
        """End every bus connection, inbound and outbound; the link tasks
        of known nodes reconnect and handshake again."""
        for scope in self._inbound_scopes:
            scope.cancel()
        for link in self.links.values():
            link.connection_scope.cancel()

    # ------------------------------------------------------------ outbound

    async def _link_task(self, link: PeerLink) -> None:
        try:
            await self._run_link(link)
        finally:
            link.ended = True

    async def _run_link(self, link: PeerLink) -> None:
        backoff = BACKOFF_MIN_S
        with link.cancel_scope:
            while True:
                node = self.table.nodes.get(link.node_id)
                if node is None:
                    return
                try:
                    stream = await self.server.env.net.connect(node.ip, node.cport)
                except OSError:
                    if not link.unreachable:
                        link.unreachable = True
                        self.progress()
                    link.retry_now = trio.Event()
                    with trio.move_on_after(backoff):
                        await link.retry_now.wait()
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                if self.server.tls.bus_client is not None:
                    try:
                        stream = await self._tls_connect(stream)
                    except tls.TlsHandshakeError as e:
                        self.throttle.warn(
                            "tls-out", "TLS link to %s failed: %s", link.node_id[:8], e
                        )
                        await trio.sleep(BACKOFF_MAX_S)
                        continue
                link.unreachable = False
                backoff = BACKOFF_MIN_S
                link.connection_scope = trio.CancelScope()
                with link.connection_scope:
                    async with stream:
                        try:
                            await self._serve_link(link, stream)
                        finally:
                            link.up = False
                self.table.link_changed(link.node_id, False, self.server.env.clock.wall_ms())
                await trio.sleep(BACKOFF_MIN_S)

    async def _serve_link(self, link: PeerLink, stream: trio.abc.Stream) -> None:
        try:
            peer, _ = await self._handshake(stream, initiator=True, offer=link.offer)
        except HandshakeRefused as e:
            self.refused_links += 1
            self.throttle.warn("refused-out", "link to %s refused: %s", link.node_id[:8], e)
            await trio.sleep(BACKOFF_MAX_S)
            return
        except (bus.BusError, OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            log.debug("handshake with %s failed: %s", link.node_id[:8], e)
            return
        if peer is None and link.offer > bus.MIN_PROTOCOL_VERSION:
            # Closed before answering: a node of an older release refuses
            # a version it does not know that way. Offer one less.
            link.offer -= 1
            return
        if peer is None or peer.node_id != link.node_id:
            log.warning(
                "node at the address of %s answered as %s: link dropped",
                link.node_id[:8],
                peer.node_id[:8] if peer else "nobody",
            )
            await trio.sleep(BACKOFF_MAX_S)
            return
        self._speaks(link, peer.version)
        self.table.link_changed(link.node_id, True, self.server.env.clock.wall_ms())
        link.up = True
        self.server.after_bus_event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_close_on_eof, stream, nursery.cancel_scope)
            try:
                link.stream = stream
                async for item in link.receive_channel:
                    link.queued -= 1
                    # Not sent: b"" (but heartbeats behind it are).
                    frame = b"" if link.superseded(item[1]) else self._outgoing(item)
                    if link.rest:
                        frame, link.rest = link.rest + frame, b""
                    data = self._batch(link, frame)
                    if not data:
                        continue
                    link.writing = True
                    await send_all(stream, data)
                    while link.urgent:  # sent during that write
                        urgent, link.urgent = link.urgent, []
                        self.frames_out += len(urgent)
                        await send_all(stream, b"".join(urgent))
                    link.writing = False
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                # The rest of a frame belongs to this connection: on the
                # next one it would be garbage. Heartbeats not written yet
                # go to the outbox, as they would have.
                link.stream = None
                link.writing = False
                link.rest = b""
                for frame in link.urgent:
                    link.to_outbox((None, frame, math.inf))
                link.urgent = []
            nursery.cancel_scope.cancel()

    def _speaks(self, link: PeerLink, version: int) -> None:
        """The link is up at ``version``: what we send it follows that, and
        the next connection offers our highest again (the node may have
        been upgraded meanwhile)."""
        if version < self.table.protocol:
            log.info(
                "link to %s speaks bus protocol %d (this node up to %d) until it is upgraded",
                link.node_id[:8],
                version,
                self.table.protocol,
            )
        link.version = version
        link.offer = self.table.protocol
        node = self.table.nodes.get(link.node_id)
        if node is not None:
            node.bus_version = version

    def _batch(self, link: PeerLink, first: bytes) -> bytes:
        """The first frame (which ends any frame cut short before), the
        heartbeats waiting, and whatever else is already queued (one send)."""
        frames = [first] if first else []
        if link.urgent:
            frames += link.urgent
            link.urgent = []
        while len(frames) < SEND_BATCH:
            try:
                item = link.receive_channel.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            link.queued -= 1
            if not link.superseded(item[1]):
                frame = self._outgoing(item)
                if frame:
                    frames.append(frame)
        self.frames_out += len(frames)
        return b"".join(frames)

    def _outgoing(self, item: _OutboxItem) -> bytes:
        """The frame of an outbox item as it is written now: b"" if stale.
        A held job's REPLJOB carries the TTL its job has left when written,
        not when made: one that waited in the outbox (its link down for a
        partition) would otherwise give the receiver's copy the time it
        waited on top of the job's TTL. Re-encoded only when the TTL in
        whole seconds changed, so rarely."""
        copy, frame, send_by = item
        if _late(send_by):
            return b""
        if copy is None:
            return frame
        job = self._held(copy)
        if job is None:
            return b""
        ttl = wire_ttl(job, self.server.node.now_ms())
        if ttl == copy.job.ttl:
            return frame
        return bus.encode_frame(attrs.evolve(copy, job=attrs.evolve(copy.job, ttl=ttl)))

    def _stale(self, copy: bus.ReplJob | None, send_by: float = math.inf) -> bool:
        """A queued REPLJOB whose job this node held when it was queued and
        no longer holds, or holds acked, is not sent: it would resurrect a job collected meanwhile
        (queues outlive reconnections, so a partition can delay a frame
        for as long as it lasts). Nor a message that waited past its
        ``send_by``: a YOURJOBS carries the TTL its jobs had left in the
        second of the wall clock it was made in, so a late one would let
        them outlive their TTL on the receiver (simulator seed 20003187: a
        TTL 3 job delivered 9.5 s after ADDJOB, its YOURJOBS sent 7.5 s
        late when the link came back; seed 112967: one sent 1 s late, in
        the next second, when the limit was a second from the commit). The
        jobs stay with this node, which re-queues them at their RETRY (a
        YOURJOBS with a RETRY 0 job, which left this node with it, has no
        ``send_by``)."""
        return _late(send_by) or (copy is not None and self._held(copy) is None)

    def _held(self, copy: bus.ReplJob) -> Job | None:
        """The job of a queued REPLJOB if this node still holds it unacked."""
        job = self.server.node.jobs.get(copy.job.id)
        return None if job is None or job.state == JobState.ACKED else job

    def restart_link(self, node_id: str) -> None:
        """Drop a connection that looks stuck; its link task reconnects and
        the messages still queued go out on the new connection."""
        link = self.links.get(node_id)
        if link is not None:
            link.connection_scope.cancel()

    def dropped(self) -> int:
        """Frames a full outbox refused (CLUSTER INFO)."""
        return sum(link.dropped for link in self.links.values())

    def dropped_messages(self) -> int:
        """The messages in them (/metrics)."""
        return sum(link.dropped_messages for link in self.links.values())

    async def _handshake(
        self, stream: trio.abc.Stream, initiator: bool, offer: int | None = None
    ) -> tuple[bus.Handshake | None, bus.FrameDecoder]:
        """Exchange handshakes and proofs (see the module's picture): the
        peer's handshake, or None if it closed the connection first, and
        the decoder holding whatever it sent after its proof. The
        connector's handshake offers ``offer``; the acceptor answers with
        the version the link then speaks (``bus.negotiate``), which is what
        the returned handshake of the peer says, whichever side we are.
        Raises HandshakeRefused, BusError, OSError or TooSlowError."""
        if offer is None:
            offer = self.table.protocol
        me = self.table.myself
        config = self.server.config
        secret = config.cluster_secret.encode("utf-8", "surrogateescape")
        # Behind NAT a node tells the address its peers must dial.
        cport = config.cluster_announce_port or me.cport
        mine = bus.Handshake(
            me.node_id,
            self.server.announce_ip(),
            me.port,
            cport,
            self.server.env.token_bytes(bus.NONCE_LEN),
            offer,
        )
        decoder = bus.FrameDecoder(bus.HANDSHAKE_MAX_FRAME)
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            if initiator:
                await stream.send_all(bus.encode_frame(mine))
            peer = await _receive(stream, decoder, bus.Handshake)
            if peer is None:
                return None, decoder
            if not initiator and peer.version > offer == bus.MIN_PROTOCOL_VERSION:
                # Playing the release of protocol 3, which negotiated
                # nothing: it closed on an offer it did not know.
                return None, decoder
            version = bus.negotiate(peer.version, offer)
            if version is None:
                raise HandshakeRefused(
                    f"it speaks bus protocol {peer.version}, this node "
                    f"{bus.MIN_PROTOCOL_VERSION} to {self.table.protocol}"
                )
            if initiator:
                peer = attrs.evolve(peer, version=version)
            else:
                mine = attrs.evolve(mine, version=version)
            connector, acceptor = (mine, peer) if initiator else (peer, mine)
            if not initiator:
                proof = bus.handshake_proof(secret, b"acceptor", connector, acceptor)
                await stream.send_all(bus.encode_frame(mine) + bus.encode_frame(bus.Auth(proof)))
            auth = await _receive(stream, decoder, bus.Auth)
            if auth is None:
                return None, decoder
            role = b"acceptor" if initiator else b"connector"
            _check_proof(
                secret, auth.proof, bus.handshake_proof(secret, role, connector, acceptor)
            )
            if initiator:
                proof = bus.handshake_proof(secret, b"connector", connector, acceptor)
                await stream.send_all(bus.encode_frame(bus.Auth(proof)))
        return peer, decoder

    async def _tls_connect(self, stream: trio.abc.Stream) -> tls.TlsStream:
        """Our side of the TLS handshake on a bus connection we opened
        (closes ``stream`` if it fails)."""
        context = self.server.tls.bus_client
        assert context is not None
        try:
            return await tls.connect(stream, context)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    # ------------------------------------------------------------- inbound

    async def _accept_loop(self, listener: trio.abc.Listener[trio.abc.Stream]) -> None:
        assert self._nursery is not None
        await accept_loop(listener, self._inbound, self._nursery, "cluster bus")

    async def _inbound(self, stream: trio.abc.Stream) -> None:
        async with stream:
            if self.pending_links >= PENDING_MAX_LINKS:
                self.refused_links += 1
                self.throttle.warn(
                    "pending",
                    "bus connection from %s refused: %d links already wait for a handshake or MEET",
                    _peer_ip(stream),
                    PENDING_MAX_LINKS,
                )
                return
            self.pending_links += 1
            scope = trio.CancelScope()
            pending = _Pending(scope)
            self._inbound_scopes.add(scope)
            peer: bus.Handshake | None = None
            try:
                with scope:
                    context = self.server.tls.bus_server
                    if context is not None:
                        stream = await tls.accept(stream, context)
                    peer, decoder = await self._handshake(stream, initiator=False)
                    if peer is None:
                        return
                    ip = peer.ip or _peer_ip(stream)
                    if peer.node_id in self.table.nodes:
                        self._known(peer.node_id, pending)
                        decoder.set_max_frame(bus.MAX_FRAME)
                    else:
                        decoder.set_max_frame(PENDING_MAX_FRAME)
                    await self._read_messages(stream, peer, ip, decoder, pending)
            except HandshakeRefused as e:
                self.refused_links += 1
                self.throttle.warn(
                    "refused-in", "bus link from %s refused: %s", _peer_ip(stream), e
                )
            except tls.TlsHandshakeError as e:
                self.refused_links += 1
                self.throttle.warn(
                    "tls-in", "TLS bus link from %s refused: %s", _peer_ip(stream), e
                )
            except bus.BusError as e:
                self.bad_frames += 1
                self.throttle.warn("bad-frame", "bad frame on the bus, link closed: %s", e)
            except (
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.TooSlowError,
                OSError,
            ):
                pass
            except Exception:
                # A message the core could not handle is a bug of ours, but
                # it ends this link only: the peer reconnects, the node lives.
                self.bad_frames += 1
                log.exception("error handling a bus message, link closed")
            finally:
                self._inbound_scopes.discard(scope)
                if pending.active:
                    self.pending_links -= 1
                elif peer is not None:
                    mine = self._inbound_by_node.get(peer.node_id, [])
                    if scope in mine:
                        mine.remove(scope)
                    if not mine:
                        self._inbound_by_node.pop(peer.node_id, None)

    def _known(self, node_id: str, pending: _Pending) -> None:
        """An inbound link now speaks for a node of the table: it leaves the
        pending ones, and counts among that node's inbound links, of which
        the newest INBOUND_PER_NODE stay: the oldest goes beyond that. A node
        has one link to us, plus for a moment a CLUSTER MEET connection
        (handshake, MEET, close) or a reconnection while we still hold a
        connection it dropped silently. Without a cluster-secret a stranger
        may use a known node's ID: it cannot hold a descriptor per
        connection it opens. (Closing the older link at once, one link per
        node, cut the real link whenever the node sent a MEET: the frames
        in flight on it were lost; simulator seed 27383196.)"""
        pending.active = False
        self.pending_links -= 1
        link = self.links.get(node_id)
        if link is not None:
            link.retry_now.set()  # it is back: reconnect now, not after the back-off
        mine = self._inbound_by_node.setdefault(node_id, [])
        mine.append(pending.scope)
        while len(mine) > INBOUND_PER_NODE:
            mine.pop(0).cancel()
            self.replaced_links += 1

    async def _read_messages(
        self,
        stream: trio.abc.Stream,
        peer: bus.Handshake,
        ip: str,
        decoder: bus.FrameDecoder,
        pending: _Pending,
    ) -> None:
        """Decode and dispatch until the peer closes. The decoder may hold
        frames already (sent right after the peer's proof)."""
        drained = False
        while True:
            handled = 0
            frames = decoder.frames
            while (msg := decoder.next_message()) is not None:
                handled += 1
                kind = type(msg)
                self.received_by_type[kind] = self.received_by_type.get(kind, 0) + 1
                if peer.node_id not in self.table.nodes:
                    if isinstance(msg, bus.Queued):
                        # A replacement's queued copy, announced before
                        # gossip named it here (clusterjobs.receive_from_stranger).
                        self.dispatch(peer.node_id, msg)
                        continue
                    if not isinstance(msg, bus.Meet):
                        continue
                    if self.table.add(peer.node_id, ip, peer.port, peer.cluster_port) is None:
                        continue
                    self.sync_links()
                if pending.active:
                    self._known(peer.node_id, pending)
                    decoder.set_max_frame(bus.MAX_FRAME)
                self.dispatch(peer.node_id, msg)
            self.frames_in += decoder.frames - frames
            if handled:
                self.server.after_bus_event()
            data = await receive_some(stream, READ_SIZE, drained)
            if not data:
                return
            # A read that did not fill the buffer emptied the socket: the
            # next one waits for it first (no read that fails).
            drained = len(data) < READ_SIZE
            decoder.feed(data)

    # ---------------------------------------------------------------- meet

    async def meet(self, ip: str, cport: int) -> str:
        """CLUSTER MEET: learn who listens at ip:cport, introduce ourselves.
        A node of an older release closes the connection on an offer it
        does not know: the MEET is tried again offering one version less,
        as a link is."""
        offer = self.table.protocol
        while (peer := await self._meet_once(ip, cport, offer)) is None:
            if offer == bus.MIN_PROTOCOL_VERSION:
                raise OSError("the node closed the connection during the handshake")
            offer -= 1
        if peer.node_id != self.table.node_id:
            self.table.add(peer.node_id, peer.ip or ip, peer.port, peer.cluster_port)
            self.sync_links()
        return peer.node_id

    async def _meet_once(self, ip: str, cport: int, offer: int) -> bus.Handshake | None:
        """One MEET connection: the peer's handshake (None if it closed
        the connection first), our MEET sent after it."""
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            stream = await self.server.env.net.connect(ip, cport)
        if self.server.tls.bus_client is not None:
            try:
                stream = await self._tls_connect(stream)
            except tls.TlsHandshakeError as e:
                raise OSError(f"TLS handshake failed: {e}") from None
        async with stream:
            try:
                peer, _ = await self._handshake(stream, initiator=True, offer=offer)
            except HandshakeRefused as e:
                raise OSError(f"the node refused the link: {e}") from None
            if peer is not None:
                await stream.send_all(bus.encode_frame(self.table.heartbeat(bus.Meet)))  # type: ignore[arg-type]
                self.sent_by_type[bus.Meet] = self.sent_by_type.get(bus.Meet, 0) + 1
        return peer


async def _close_on_eof(stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
    """The acceptor never writes after the handshake: anything read means the
    connection ended (the peer died or closed it), so stop using it."""
    try:
        await stream.receive_some(READ_SIZE)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    scope.cancel()


def _peer_ip(stream: trio.abc.Stream) -> str:
    sock = getattr(tls.unwrap(stream), "socket", None)
    if sock is None:
        return "127.0.0.1"
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "127.0.0.1"


async def _receive(
    stream: trio.abc.Stream, decoder: bus.FrameDecoder, kind: type[_M]
) -> _M | None:
    """The next message, which must be of ``kind``; None at EOF."""
    while (msg := decoder.next_message()) is None:
        data = await stream.receive_some(READ_SIZE)
        if not data:
            return None
        decoder.feed(bytes(data))
    if not isinstance(msg, kind):
        raise bus.BusError(f"expected {kind.__name__}, got {type(msg).__name__}")
    return msg


def _check_proof(secret: bytes, given: bytes, expected: bytes) -> None:
    if not secret:
        if given:
            raise HandshakeRefused("it has a cluster-secret and this node has none")
        return
    if not given:
        raise HandshakeRefused("it has no cluster-secret and this node has one")
    if not hmac.compare_digest(given, expected):
        raise HandshakeRefused("it does not know the cluster-secret")
