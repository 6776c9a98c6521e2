"""The cluster table: who the other nodes are, and whether they answer.

Theory of operation
-------------------
Every node keeps a table of the nodes it knows (itself included). Links are
one-way: each node sends to a peer over its own outbound connection and
reads what peers send on the connections they opened. The shell owns the
connections and tells the table when an outbound link comes up or goes down;
the table tells the shell what to send (``Send`` effects in
:attr:`ClusterTable.effects`, the node's sink once a Node owns the table) and
which nodes it should be connected to (:meth:`ClusterTable.wanted_links`).

Membership spreads by gossip: every PING/PONG/MEET carries a few random
entries of the sender's table; an unknown node in gossip is added (unless it
was forgotten less than a minute ago) in the ``handshake`` state: it counts
for nothing (cluster size, replication, failure votes, nodes.conf) until our
own link to it passes the bus handshake (which, with a cluster secret, proves
it holds the secret). One that does not within ``HANDSHAKE_TIMEOUT_MS`` (or
the node timeout, if longer) is dropped, and at most
``MAX_HANDSHAKE_NODES`` wait at once, so a peer cannot fill the table with
nodes that do not exist. ``CLUSTER MEET`` only opens a link: the peer's
identity comes from the handshake on that link.

Failure detection (docs/design.md): a node that does not answer a PING within
``cluster-node-timeout`` is ``PFAIL`` (fail?) here; when a majority of the
cluster reports it PFAIL or FAIL in gossip it becomes ``FAIL`` and a FAIL
message is broadcast. Any message from the node clears both at once, so a
restarted node is usable again as soon as it answers. Failure only steers
replication targets and HELLO priorities: nothing fails over.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from ..protocol import bus
from .effects import Effects

# Node flags, the original's bits (CLUSTER NODES prints them by name).
PFAIL = 1 << 0
FAIL = 1 << 1
MYSELF = 1 << 2
HANDSHAKE = 1 << 3
NOADDR = 1 << 4
LEAVING = 1 << 7
_FLAG_NAMES = (
    (MYSELF, "myself"),
    (PFAIL, "fail?"),
    (FAIL, "fail"),
    (HANDSHAKE, "handshake"),
    (NOADDR, "noaddr"),
    (LEAVING, "leaving"),
)
# A node with any of these is not worth sending jobs to (reachable()).
NOT_REACHABLE = PFAIL | FAIL | LEAVING | HANDSHAKE
# Flags that travel in gossip (the others are local points of view).
_GOSSIP_FLAGS = PFAIL | FAIL | LEAVING

BLACKLIST_MS = 60_000  # a FORGET keeps a node from being re-added by gossip
FAIL_REPORT_VALIDITY_MULT = 2  # reports older than 2x node timeout expire
PING_PERIOD_MS = 1000  # one random node pinged per second, like the original
HANDSHAKE_TIMEOUT_MS = 5000  # a gossiped node must answer our handshake by then
MAX_HANDSHAKE_NODES = 256  # gossiped nodes waiting for their handshake, at most
# Nodes a table holds at most (each costs a link task reconnecting to it):
# far beyond any real cluster, a bound for MEETs from strangers on a bus
# without cluster-secret.
MAX_NODES = 1000


class PeerNode:
    """One node as this node sees it."""

    __slots__ = (
        "added_ms",
        "bus_version",
        "cport",
        "fail_reports",
        "fail_time",
        "flags",
        "incarnation",
        "ip",
        "link_since",
        "link_up",
        "node_id",
        "ping_again",
        "ping_sent",
        "pong_received",
        "port",
    )

    def __init__(self, node_id: str, ip: str, port: int, cport: int, flags: int = 0) -> None:
        self.node_id = node_id
        self.ip = ip
        self.port = port
        self.cport = cport
        self.flags = flags
        self.ping_sent = 0  # ms of the PING awaiting a PONG; 0 = none in flight
        self.ping_again = 0  # ms of the last PING sent again for it (_check_node)
        self.pong_received = 0  # ms of the last PONG (only a PONG: pings keep their pace)
        self.link_up = False  # our outbound link is connected (shell-owned fact)
        self.link_since = 0
        self.fail_reports: dict[str, int] = {}  # reporter id -> ms of the report
        self.fail_time = 0
        self.added_ms = 0  # when gossip taught us this node (handshake timeout)
        # The bus protocol version our outbound link to it speaks (shell-
        # owned fact; 0 until a link came up): features wait for it.
        self.bus_version = 0
        # The random number its heartbeats carry, drawn anew at each start
        # (0 until heard, and from releases before bus protocol 8): another
        # one means the process restarted, and lost its queues.
        self.incarnation = 0

    @property
    def failing(self) -> bool:
        return bool(self.flags & (PFAIL | FAIL))

    def flag_names(self) -> str:
        names = [name for bit, name in _FLAG_NAMES if self.flags & bit]
        return ",".join(names) or "noflags"

    def __repr__(self) -> str:
        return f"<PeerNode {self.node_id[:8]} {self.ip}:{self.port} {self.flag_names()}>"


class ClusterTable:
    """Membership and failure detection, fed messages and the time."""

    def __init__(
        self, node_id: str, ip: str, port: int, cport: int, rng: random.Random, timeout_ms: int
    ) -> None:
        self.rng = rng
        self.timeout_ms = timeout_ms
        self.myself = PeerNode(node_id, ip, port, cport, MYSELF)
        self.myself.link_up = True
        # This process's incarnation, in every heartbeat it sends: a peer
        # that hears another one from us knows we restarted (never 0).
        self.myself.incarnation = rng.getrandbits(bus.INCARNATION_BITS) | 1
        self.nodes: dict[str, PeerNode] = {node_id: self.myself}
        # The highest bus protocol version this node speaks: the release's
        # own, lower only to play an older release (NodeServer's bus_version,
        # the simulator's mixed clusters).
        self.protocol: int = bus.PROTOCOL_VERSION
        self.blacklist: dict[str, int] = {}  # forgotten node id -> until ms
        # Messages for the shell to send (Send effects). A Node replaces it
        # with its own sink, so the shell drains one list in order.
        self.effects = Effects()
        # Nodes whose link should be re-opened (see _check_node).
        self.stuck_links: set[str] = set()
        # Bumped on every change nodes.conf records (membership, addresses,
        # leaving flags): the shell saves the file when it moves, and only
        # then.
        self.version = 0
        # Bumped whenever a node enters or leaves the table (gossiped nodes
        # waiting for their handshake included): the shell's links follow
        # the table, and need a look only when this moved.
        self.membership = 0
        # Bumped whenever a link to a peer comes up (again): the peer may
        # have restarted and reloaded from its AOF a copy of a job it had
        # acked before the crash (the ack not yet on disk), so a tombstone
        # of an acked job made before no longer proves every copy acked
        # (jobcmds._dummy_ack).
        self.relinks = 0
        # Peers whose link came up since the core last looked (it drains
        # this: Node.refresh_cluster_view), in order, for acks waiting on them.
        self.came_up: dict[str, None] = {}
        # Peers lost since the core last looked (it drains this too): marked
        # FAIL here or told so, or heard from as a new incarnation (the
        # process restarted, within the node timeout or not). What they had
        # queued is queued again by the survivors (Node.fail_over).
        self.lost: dict[str, None] = {}
        self.stats_sent = 0
        self.stats_received = 0
        self._next_ping_ms = 0

    # ------------------------------------------------------------ queries

    @property
    def node_id(self) -> str:
        return self.myself.node_id

    @property
    def size(self) -> int:
        """Nodes taking part in the cluster (myself included)."""
        return sum(1 for n in self.nodes.values() if not n.flags & HANDSHAKE)

    def others(self) -> list[PeerNode]:
        return [n for n in self.nodes.values() if n is not self.myself]

    def members(self) -> list[PeerNode]:
        """Other nodes that passed their handshake (failing or leaving ones
        included): what a cluster-wide broadcast reaches."""
        return [n for n in self.others() if not n.flags & HANDSHAKE]

    def behind(self, version: int) -> PeerNode | None:
        """A node our link to which is up and speaks a bus protocol older
        than ``version`` (a rolling upgrade not finished), or None."""
        for node in self.others():
            if node.link_up and 0 < node.bus_version < version:
                return node
        return None

    def reachable(self) -> list[PeerNode]:
        """Other nodes worth sending jobs to: not failing, not leaving."""
        return [n for n in self.others() if not n.flags & NOT_REACHABLE]

    def wanted_links(self) -> list[PeerNode]:
        """Nodes the shell should keep an outbound link to."""
        return [n for n in self.others() if not n.flags & NOADDR]

    def priority(self, node: PeerNode) -> int:
        """HELLO priority: 1 best ... 100 failing or leaving."""
        if node.flags & (FAIL | LEAVING):
            return 100
        if node.flags & PFAIL:
            return 10
        if node is not self.myself and not node.link_up:
            return 5
        return 1

    # ------------------------------------------------------------ changes

    def add(self, node_id: str, ip: str, port: int, cport: int) -> PeerNode | None:
        """Learn a node (MEET, CLUSTER MEET, nodes.conf); None if it was
        forgotten lately or the table is full."""
        node = self.nodes.get(node_id)
        if node is not None:
            if ip and (node.ip, node.port, node.cport) != (ip, port, cport):
                node.ip, node.port, node.cport = ip, port, cport
                self.version += 1
            return node
        if node_id in self.blacklist or len(self.nodes) >= MAX_NODES:
            return None
        node = PeerNode(node_id, ip, port, cport)
        self.nodes[node_id] = node
        self.version += 1
        self.membership += 1
        return node

    def forget(self, node_id: str, now: int) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node is self.myself:
            return False
        del self.nodes[node_id]
        self.version += 1
        self.membership += 1
        self.blacklist[node_id] = now + BLACKLIST_MS
        for other in self.nodes.values():
            other.fail_reports.pop(node_id, None)
        return True

    def link_changed(self, node_id: str, up: bool, now: int) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        node.link_up = up
        node.link_since = now
        if up:
            self.relinks += 1
            self.came_up[node_id] = None
        gossiped = up and bool(node.flags & HANDSHAKE)
        if gossiped:
            node.flags &= ~HANDSHAKE  # it answered as itself: a member now
            self.version += 1
        if up:
            # The node just answered our handshake: it is alive. A restarted
            # node must be usable again at once, not after the next PONG.
            node.flags &= ~(PFAIL | FAIL)
            node.fail_reports.clear()
            # A fresh link: ping at once, failure detection needs a ping in
            # flight to notice anything. To a node we know from gossip, a
            # MEET: it may not know us yet, and drops a PING from a node it
            # does not know (links are one-way: it has no link to answer
            # on), while the ping stays in flight, unanswered, for a whole
            # node timeout; a MEET makes it learn us and answer (simulator
            # seed 106285: a replaced node, met again by n0, learned n1 from
            # n0's gossip; n1 dropped its PING and the new node replicated
            # an ASYNC job to n0 alone, its link to n1 being restarted as
            # stuck 3 s later).
            self._send_heartbeat(node, bus.Meet if gossiped else bus.Ping, now)

    def set_leaving(self, leaving: bool) -> None:
        self.version += 1
        if leaving:
            self.myself.flags |= LEAVING
        else:
            self.myself.flags &= ~LEAVING

    def reset(self, new_id: str | None, now: int) -> None:
        """CLUSTER RESET: forget every other node (hard: take a new ID, and
        forget the old one as CLUSTER FORGET would: a peer still gossiping
        it must not bring it back as a peer)."""
        old_id = self.myself.node_id
        if new_id is not None:
            self.myself.node_id = new_id
        self.nodes = {self.myself.node_id: self.myself}
        self.version += 1
        self.membership += 1
        self.blacklist.clear()
        if new_id is not None and new_id != old_id:
            self.blacklist[old_id] = now + BLACKLIST_MS
        self.myself.flags &= ~LEAVING

    # ------------------------------------------------------------ messages

    def heard_from(self, sender: PeerNode) -> None:
        """Any message proves the sender alive: clear PFAIL and FAIL now.
        It leaves ``pong_received`` alone, as the original does: job traffic
        refreshing it held back the pings every half node timeout, and with
        them the gossip whose failure reports make a FAIL (seed 885581120:
        five nodes busy with jobs never gathered a majority of fresh reports
        about a sixth cut off for 6 s with a 1 s node timeout)."""
        sender.flags &= ~(PFAIL | FAIL)
        sender.fail_reports.clear()

    def on_heartbeat(self, msg: bus.Heartbeat, now: int) -> None:
        self.stats_received += 1
        sender = self.nodes.get(msg.sender)
        if sender is None:
            return
        # Only a PONG answers our PING, like the original. Links are one-way:
        # the sender's own PING or MEET comes over its link and says nothing
        # of ours, and clearing ping_sent on it (as this did) kept a node
        # whose messages to the sender are lost from ever suspecting it.
        if isinstance(msg, bus.Pong):
            sender.ping_sent = 0
            sender.pong_received = now
        incarnation = msg.flags >> bus.INCARNATION_SHIFT
        if incarnation and incarnation != sender.incarnation:
            # 0: a release before bus protocol 8, which draws none.
            if sender.incarnation:
                self.lost[sender.node_id] = None  # it restarted
            sender.incarnation = incarnation
        self.heard_from(sender)
        if (sender.flags ^ msg.flags) & LEAVING:
            sender.flags ^= LEAVING
            self.version += 1  # nodes.conf records it
        speaks = min(msg.flags >> bus.VERSION_SHIFT & 0xFF, self.protocol)
        if 0 < sender.bus_version < speaks and sender.link_up:
            # Our link to it came up at a lower version (it was an older
            # release, or closed on our offer once): a new link speaks more.
            self.stuck_links.add(sender.node_id)
        self._process_gossip(sender, msg.gossip, now)
        if isinstance(msg, bus.Ping | bus.Meet):
            self._send_heartbeat(sender, bus.Pong, now)

    def on_fail(self, msg: bus.Fail, now: int) -> None:
        node = self.nodes.get(msg.node_id)
        if node is None or node is self.myself or node.flags & FAIL:
            return
        node.flags = (node.flags & ~PFAIL) | FAIL
        node.fail_time = now
        self.lost[node.node_id] = None

    def _process_gossip(
        self, sender: PeerNode, entries: Iterable[bus.GossipEntry], now: int
    ) -> None:
        for entry in entries:
            node = self.nodes.get(entry.node_id)
            if node is None:
                if (
                    entry.node_id not in self.blacklist
                    and entry.ip
                    and not self._is_my_address(entry)
                    and self._handshakes() < MAX_HANDSHAKE_NODES
                    and len(self.nodes) < MAX_NODES
                ):
                    self._add_gossiped(entry, now)
                continue
            if node.flags & HANDSHAKE:
                continue  # not a member yet: its failure reports mean nothing
            if node is self.myself:
                continue
            if entry.flags & (PFAIL | FAIL):
                node.fail_reports[sender.node_id] = now
                self._maybe_mark_failed(node, now)
            else:
                node.fail_reports.pop(sender.node_id, None)

    def _add_gossiped(self, entry: bus.GossipEntry, now: int) -> None:
        node = PeerNode(entry.node_id, entry.ip, entry.port, entry.cluster_port, HANDSHAKE)
        node.added_ms = now
        self.nodes[entry.node_id] = node
        self.membership += 1

    def _handshakes(self) -> int:
        return sum(1 for n in self.nodes.values() if n.flags & HANDSHAKE)

    def _is_my_address(self, entry: bus.GossipEntry) -> bool:
        """An unknown ID at my own address is an earlier incarnation of this
        node (its disk was wiped, it took a new ID): a peer that has not
        forgotten it yet, or whose gossip was in flight when the operator
        ran CLUSTER FORGET, must not make us list our dead self (Disque
        would handshake that address and find itself)."""
        me = self.myself
        return bool(me.port) and (entry.ip, entry.port) == (me.ip, me.port)

    def _maybe_mark_failed(self, node: PeerNode, now: int) -> None:
        if not node.flags & PFAIL or node.flags & FAIL:
            return
        validity = self.timeout_ms * FAIL_REPORT_VALIDITY_MULT
        # A report from the future (the wall clock went back) is of unknown age.
        reports = [r for r, t in node.fail_reports.items() if 0 <= now - t <= validity]
        # Without a report a majority is out of reach (the cluster counts
        # this node and the failing one): skip counting the table, which
        # made the cron quadratic with many nodes unreachable.
        if not reports or len(reports) + 1 < self.size // 2 + 1:
            return
        node.flags = (node.flags & ~PFAIL) | FAIL
        node.fail_time = now
        self.lost[node.node_id] = None
        for other in self.others():
            if other is not node:
                self.send(other.node_id, bus.Fail(node.node_id))

    # --------------------------------------------------------------- cron

    def cron(self, now: int) -> None:
        """Periodic work (10 times a second): pings and failure detection."""
        for node_id, until in list(self.blacklist.items()):
            if until <= now:
                del self.blacklist[node_id]
            elif until > now + BLACKLIST_MS:  # the wall clock went back
                self.blacklist[node_id] = now + BLACKLIST_MS
        # Marks in the future mean the wall clock went back: left alone they
        # would stop pings and failure detection for as long as the step.
        self._next_ping_ms = min(self._next_ping_ms, now + PING_PERIOD_MS)
        if now >= self._next_ping_ms:
            self._next_ping_ms = now + PING_PERIOD_MS
            self._ping_oldest_of_a_sample(now)
        for node in self.others():
            if node.flags & HANDSHAKE:
                self._check_handshake(node, now)
            else:
                self._check_node(node, now)

    def _check_handshake(self, node: PeerNode, now: int) -> None:
        """Drop a gossiped node that never answered our handshake (it may
        not exist; gossip brings it back if it does)."""
        node.added_ms = min(node.added_ms, now)
        if now - node.added_ms > max(HANDSHAKE_TIMEOUT_MS, self.timeout_ms):
            del self.nodes[node.node_id]
            self.membership += 1

    def _ping_oldest_of_a_sample(self, now: int) -> None:
        candidates = [n for n in self.others() if n.link_up and not n.ping_sent]
        if not candidates:
            return
        sample = self.rng.sample(candidates, min(5, len(candidates)))
        oldest = min(sample, key=lambda n: n.pong_received)
        self._send_heartbeat(oldest, bus.Ping, now)

    def _check_node(self, node: PeerNode, now: int) -> None:
        half = self.timeout_ms // 2
        node.ping_sent = min(node.ping_sent, now)
        node.pong_received = min(node.pong_received, now)
        node.link_since = min(node.link_since, now)
        if (
            node.link_up
            and node.ping_sent
            and now - node.ping_sent > half
            and now - node.link_since > self.timeout_ms
        ):
            # Waiting for a PONG for long on an old link: maybe the link is
            # the problem, not the node. Ask the shell for a fresh one.
            self.stuck_links.add(node.node_id)
        if node.link_up and not node.ping_sent and now - node.pong_received > half:
            self._send_heartbeat(node, bus.Ping, now)
            return
        node.ping_again = min(node.ping_again, now)
        if (
            node.link_up
            and node.ping_sent
            and now - node.ping_sent > half
            and now - node.ping_again >= PING_PERIOD_MS
        ):
            # No PONG for half a node timeout on a link that is up: the PING
            # or its PONG may be lost (a frame dropped, heartbeats pushed
            # out of a full queue), and nothing else sends one while a ping
            # is in flight. Ask again, once a second; ping_sent keeps its
            # time, so the failure detector's clock runs on. Without it a
            # lost PONG left the node flagged PFAIL at every cron tick, and
            # cleared by its next message, for a whole node timeout, until
            # the link was restarted as stuck: a PAUSE BCAST sent at such a
            # tick skipped it (simulator seed 600678, after bus chaos).
            node.ping_again = now
            self.send(node.node_id, self.heartbeat(bus.Ping))
        if not node.ping_sent and not node.link_up and node.pong_received:
            # No link and no ping in flight: failure detection still needs
            # a clock running, as if a ping had been sent.
            node.ping_sent = now
        if node.ping_sent and now - node.ping_sent > self.timeout_ms:
            if not node.flags & (PFAIL | FAIL):
                node.flags |= PFAIL
                if self.size <= 2:
                    # Two nodes never agree on a FAIL (a majority of two is
                    # both): the one left decides alone, as the holder of
                    # every other copy. Its jobs queued there are taken over
                    # (Node.fail_over), as each holder's RETRY would do on
                    # either side of a partition anyway.
                    self.lost[node.node_id] = None
            self._maybe_mark_failed(node, now)

    def _send_heartbeat(self, node: PeerNode, kind: type[bus.Heartbeat], now: int) -> None:
        if kind is not bus.Pong and not node.ping_sent:
            node.ping_sent = now
        self.send(node.node_id, self.heartbeat(kind))

    def send(self, node_id: str, msg: object) -> None:
        self.stats_sent += 1
        self.effects.send(node_id, msg)

    def heartbeat(self, kind: type[bus.Heartbeat]) -> bus.Heartbeat:
        myself = self.myself
        flags = myself.flags & LEAVING
        if self.protocol >= bus.VERSION_FLAGS_VERSION:
            flags |= self.protocol << bus.VERSION_SHIFT
        if self.protocol >= bus.HAVEJOBS_VERSION:  # incarnations came with protocol 8
            flags |= myself.incarnation << bus.INCARNATION_SHIFT
        return kind(self.node_id, flags, self.gossip())

    def gossip(self) -> tuple[bus.GossipEntry, ...]:
        """A few random entries: about a tenth of the table, at least 3,
        failing nodes first (as the original biases them): every heartbeat
        then carries our report on a node we suspect, and the reports of a
        majority meet within their validity."""
        # One pass (this runs for every PING and PONG sent).
        failing: list[PeerNode] = []
        rest: list[PeerNode] = []
        myself = self.myself
        for n in self.nodes.values():
            flags = n.flags
            if n is myself or flags & (HANDSHAKE | NOADDR):
                continue
            (failing if flags & (PFAIL | FAIL) else rest).append(n)
        count = min(len(failing) + len(rest), max(3, len(self.nodes) // 10))
        if len(failing) >= count:
            chosen = self._pick(failing, count)
        else:
            chosen = failing + self._pick(rest, count - len(failing))
        return tuple(
            bus.GossipEntry(
                n.node_id,
                n.ip,
                n.port,
                n.cport,
                n.flags & _GOSSIP_FLAGS,
                n.ping_sent,
                n.pong_received,
            )
            for n in chosen
        )

    def _pick(self, nodes: list[PeerNode], count: int) -> list[PeerNode]:
        """``count`` of ``nodes`` at random (the list is consumed). When few
        are left out (a small cluster: 3 of 4 peers), drop that many at
        random instead of drawing a sample: one draw each."""
        left_out = len(nodes) - count
        if left_out <= 0:
            return nodes
        if left_out > count:
            return self.rng.sample(nodes, count)
        for _ in range(left_out):
            del nodes[self.rng.randrange(len(nodes))]
        return nodes

    # ------------------------------------------------------------ reports

    def nodes_description(self) -> str:
        """CLUSTER NODES: ``id ip:port flags ping_sent pong_recv link-state``."""
        lines = []
        for node in self.nodes.values():
            link = "connected" if node.link_up else "disconnected"
            lines.append(
                f"{node.node_id} {node.ip}:{node.port} {node.flag_names()} "
                f"{node.ping_sent} {node.pong_received} {link}"
            )
        return "".join(line + "\n" for line in lines)

    def info(self) -> list[tuple[str, object]]:
        reachable = len(self.reachable())
        return [
            ("cluster_state", "ok"),
            ("cluster_known_nodes", len(self.nodes)),
            ("cluster_reachable_nodes", reachable),  # other nodes, like the original
            ("cluster_size", self.size),
            ("cluster_stats_messages_sent", self.stats_sent),
            ("cluster_stats_messages_received", self.stats_received),
        ]

    def to_config(self) -> str:
        """The nodes.conf text: one CLUSTER NODES line per node, then vars."""
        lines = []
        for node in self.nodes.values():
            if node.flags & HANDSHAKE:
                continue  # not a member until it answers: not worth keeping
            flags = node.flags & (MYSELF | LEAVING)
            names = [name for bit, name in _FLAG_NAMES if flags & bit] or ["noflags"]
            lines.append(
                f"{node.node_id} {node.ip}:{node.port}@{node.cport} {','.join(names)} 0 0 "
                "disconnected"
            )
        return "\n".join(lines) + "\n"

    @staticmethod
    def parse_config(text: str) -> list[tuple[str, str, int, int, bool, bool]]:
        """Rows of (id, ip, port, cport, is_myself, leaving) from nodes.conf.

        Raises ValueError naming the line on anything malformed.
        """
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split()
            try:
                node_id, addr, flags = parts[0], parts[1], parts[2]
                host, _, ports = addr.rpartition(":")
                port_s, _, cport_s = ports.partition("@")
                port = int(port_s)
                cport = int(cport_s) if cport_s else port + 10000
            except (IndexError, ValueError):
                raise ValueError(f"line {number}: {line!r}") from None
            # Only what the bus accepts (protocol/bus.py: 40 lowercase hex
            # digits, 16-bit ports): a table entry it refuses would be
            # gossiped anyway, and every frame naming it would be rejected
            # by the receiver, which closes the link. Refuse it at load time.
            if len(node_id) != 40 or node_id.strip("0123456789abcdef"):
                raise ValueError(f"line {number}: bad node ID {node_id!r}")
            if not (0 <= port <= 0xFFFF and 0 <= cport <= 0xFFFF):
                raise ValueError(f"line {number}: bad port in {addr!r}")
            names = flags.split(",")
            rows.append((node_id, host, port, cport, "myself" in names, "leaving" in names))
        return rows
