"""The pure cluster table (disque_trio/core/cluster.py): membership by gossip,
PFAIL/FAIL failure detection, CLUSTER NODES and nodes.conf text.

Everything is synchronous: time is a plain int of milliseconds handed to each
call, randomness a seeded ``random.Random``. The last tests wire five tables
together through their effects (Send), a stand-in for the shell's bus, and check
that the cluster forms from a chain of MEETs, agrees that a frozen or crashed
node FAILed, forgets the failure when the node comes back (a crashed one with
only its nodes.conf), and that a one-way cut is noticed by the side whose
messages are lost."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio.core.cluster import (
    BLACKLIST_MS,
    FAIL,
    HANDSHAKE,
    HANDSHAKE_TIMEOUT_MS,
    LEAVING,
    MAX_HANDSHAKE_NODES,
    MAX_NODES,
    MYSELF,
    NOADDR,
    PFAIL,
    ClusterTable,
    PeerNode,
)
from disque_trio.core.ids import new_node_id
from disque_trio.protocol import bus

START_MS = 1_700_000_000_000  # a realistic wall clock: 0 would mean "no ping in flight"
T = 1000  # cluster-node-timeout of every table here (ms)
STEP_MS = 100  # the shell runs cron ten times a second

ME = "a" * 40
B = "b" * 40
C = "c" * 40
D = "d" * 40
E = "e" * 40

LINE_RE = re.compile(
    r"(?P<id>[0-9a-f]{40}) (?P<ip>\S*):(?P<port>\d+) (?P<flags>[a-z?,]+) "
    r"(?P<ping>\d+) (?P<pong>\d+) (?P<link>connected|disconnected)"
)
FLAG_ORDER = ("myself", "fail?", "fail", "handshake", "noaddr", "leaving")

# What every heartbeat's flags carry besides LEAVING: the sender's highest
# bus protocol version.
VERSION_BITS = bus.PROTOCOL_VERSION << bus.VERSION_SHIFT


def own_bits(table: ClusterTable) -> int:
    """What a table's own heartbeats carry besides node flags: the bus
    protocol version it speaks and its incarnation."""
    return VERSION_BITS | table.myself.incarnation << bus.INCARNATION_SHIFT


def make_table(node_id: str = ME, seed: int = 0, timeout: int = T) -> ClusterTable:
    return ClusterTable(node_id, "10.0.0.1", 7711, 17711, random.Random(seed), timeout)


def with_peers(*ids: str, seed: int = 0) -> ClusterTable:
    """A table that knows ``ids`` (ports 7712, 7713, ... in that order)."""
    table = make_table(seed=seed)
    for i, node_id in enumerate(ids, 1):
        assert table.add(node_id, f"10.0.0.{i + 1}", 7711 + i, 17711 + i) is not None
    return table


def entry(node_id: str, flags: int = 0, ip: str = "10.9.9.9", port: int = 7000) -> bus.GossipEntry:
    return bus.GossipEntry(node_id, ip, port, port + 10000, flags, 0, 0)


def ping(sender: str, *gossip: bus.GossipEntry, flags: int = 0) -> bus.Ping:
    return bus.Ping(sender, flags, tuple(gossip))


def sent(table: ClusterTable) -> list[tuple[str, object]]:
    """Take the table's messages, as the shell's commit does."""
    out = table.effects.sent()
    table.effects.clear()
    return out


def line_of(table: ClusterTable, node_id: str) -> str:
    lines = [ln for ln in table.nodes_description().splitlines() if ln.startswith(node_id)]
    assert len(lines) == 1
    return lines[0]


# ---------------------------------------------------------------- membership


def test_new_table_knows_only_itself() -> None:
    table = make_table()
    assert list(table.nodes) == [ME]
    assert table.node_id == ME
    assert table.myself.flags == MYSELF
    assert table.size == 1
    assert table.others() == []
    assert table.reachable() == []
    assert table.wanted_links() == []
    assert table.gossip() == ()


def test_add_is_idempotent_and_updates_the_address() -> None:
    table = make_table()
    node = table.add(B, "10.0.0.2", 7712, 17712)
    assert node is not None
    assert (node.node_id, node.ip, node.port, node.cport, node.flags) == (
        B,
        "10.0.0.2",
        7712,
        17712,
        0,
    )
    assert table.add(B, "10.0.0.2", 7712, 17712) is node
    assert table.add(B, "10.0.0.3", 8000, 18000) is node
    assert (node.ip, node.port, node.cport) == ("10.0.0.3", 8000, 18000)
    # An empty address (nothing known) does not overwrite a known one.
    assert table.add(B, "", 1, 2) is node
    assert (node.ip, node.port, node.cport) == ("10.0.0.3", 8000, 18000)
    assert table.size == 2
    assert table.others() == [node]


def test_forget_refuses_myself_and_unknown_nodes() -> None:
    table = with_peers(B)
    assert table.forget(ME, START_MS) is False
    assert table.forget(C, START_MS) is False
    assert set(table.nodes) == {ME, B}
    assert table.blacklist == {}


def test_forgotten_node_is_blacklisted_for_a_minute() -> None:
    table = with_peers(B, C)
    t0 = START_MS
    assert table.forget(C, t0) is True
    assert set(table.nodes) == {ME, B}
    assert table.blacklist == {C: t0 + BLACKLIST_MS}
    # Neither gossip nor a handshake brings it back within the minute.
    table.cron(t0 + BLACKLIST_MS - 1)
    table.on_heartbeat(ping(B, entry(C)), t0 + BLACKLIST_MS - 1)
    assert C not in table.nodes
    assert table.add(C, "10.0.0.3", 7713, 17713) is None
    assert C not in table.nodes
    # Once cron has seen the minute pass, gossip may re-add it.
    table.cron(t0 + BLACKLIST_MS)
    assert table.blacklist == {}
    table.on_heartbeat(ping(B, entry(C, ip="10.0.0.33", port=7733)), t0 + BLACKLIST_MS)
    assert C in table.nodes
    assert (table.nodes[C].ip, table.nodes[C].port, table.nodes[C].cport) == (
        "10.0.0.33",
        7733,
        17733,
    )


def test_forget_drops_the_failure_reports_of_the_forgotten_node() -> None:
    table = with_peers(B, C, D)
    table.on_heartbeat(ping(C, entry(B, PFAIL)), START_MS)
    assert C in table.nodes[B].fail_reports
    table.forget(C, START_MS)
    assert table.nodes[B].fail_reports == {}


@pytest.mark.parametrize("new_id", [None, "f" * 40])
def test_reset_keeps_only_myself(new_id: str | None) -> None:
    table = with_peers(B, C)
    table.set_leaving(True)
    table.forget(C, START_MS)
    table.reset(new_id, START_MS)
    expected = new_id or ME
    assert list(table.nodes) == [expected]
    assert table.node_id == expected
    assert table.nodes[expected] is table.myself
    assert table.myself.flags == MYSELF  # no longer leaving
    # The nodes forgotten before may be met again at once; the identity a
    # hard reset gave up is forgotten, as by CLUSTER FORGET.
    assert table.blacklist == ({} if new_id is None else {ME: START_MS + BLACKLIST_MS})
    assert table.size == 1
    assert table.add(C, "10.0.0.3", 7713, 17713) is not None
    if new_id is not None:
        assert table.add(ME, "10.0.0.1", 7711, 17711) is None  # gossip of the old self


def test_set_leaving() -> None:
    table = make_table()
    table.set_leaving(True)
    assert table.myself.flags == MYSELF | LEAVING
    assert table.heartbeat(bus.Ping).flags == LEAVING | own_bits(table)
    table.set_leaving(False)
    assert table.myself.flags == MYSELF
    assert table.heartbeat(bus.Ping).flags == own_bits(table)


# -------------------------------------------------------------------- gossip


def test_gossip_from_a_known_sender_teaches_unknown_nodes() -> None:
    table = with_peers(B)
    table.on_heartbeat(ping(B, entry(C, ip="10.0.0.3", port=7713), entry(D, ip="")), START_MS)
    assert set(table.nodes) == {ME, B, C}  # D had no address: ignored
    node = table.nodes[C]
    assert (node.ip, node.port, node.cport, node.flags) == ("10.0.0.3", 7713, 17713, HANDSHAKE)
    assert not node.link_up
    assert node.pong_received == 0  # never heard from it directly
    assert table.wanted_links() == [table.nodes[B], node]


def test_gossip_never_teaches_an_earlier_incarnation_of_myself() -> None:
    # Seeds 9153, 9181: n0 was wiped and came back with a new ID; gossip in
    # flight when the operator ran CLUSTER FORGET taught n0 its own old ID.
    table = with_peers(B)
    old_me = entry(C, ip="10.0.0.1", port=7711)  # my address, another ID
    other_port = entry(D, ip="10.0.0.1", port=7799)  # same host, other node
    table.on_heartbeat(ping(B, old_me, other_port), START_MS)
    assert set(table.nodes) == {ME, B, D}


def test_gossip_flags_of_an_unknown_node_are_not_copied() -> None:
    table = with_peers(B)
    table.on_heartbeat(ping(B, entry(C, PFAIL | FAIL | LEAVING)), START_MS)
    assert table.nodes[C].flags == HANDSHAKE


def test_a_gossiped_node_counts_only_once_our_link_to_it_is_up() -> None:
    """A peer's gossip cannot make this node count nodes that do not
    exist (300 fake entries in one PING made ADDJOB answer -NOREPL)."""
    table = with_peers(B)
    table.on_heartbeat(ping(B, entry(C)), START_MS)
    assert table.size == 2 and table.reachable() == [table.nodes[B]]
    assert C not in table.to_config()
    assert table.nodes[C] in table.wanted_links()  # the shell tries its link
    version = table.version
    table.link_changed(C, True, START_MS + 10)
    assert table.nodes[C].flags == 0
    assert table.size == 3 and table.nodes[C] in table.reachable()
    assert C in table.to_config() and table.version > version


def test_the_first_heartbeat_to_a_gossiped_node_is_a_meet() -> None:
    """Seed 106285: a node we learned from gossip may not know us yet, and
    drops a PING from a node it does not know (it has no link to answer
    on); the ping then stays unanswered for a whole node timeout. The first
    heartbeat on our link to it is a MEET, which it takes from anyone who
    passed the link's handshake. A node we knew already gets a PING, also
    when its link comes back later."""
    table = with_peers(B)
    table.on_heartbeat(ping(B, entry(C)), START_MS)
    sent(table)
    table.link_changed(C, True, START_MS + 10)
    out = sent(table)
    assert [(dest, type(msg)) for dest, msg in out] == [(C, bus.Meet)]
    assert out[0][1].sender == ME and table.nodes[C].ping_sent == START_MS + 10
    table.on_heartbeat(bus.Pong(C, 0, ()), START_MS + 20)
    table.link_changed(C, False, START_MS + 30)
    table.link_changed(C, True, START_MS + 40)
    table.link_changed(B, True, START_MS + 40)
    assert [(dest, type(msg)) for dest, msg in sent(table)] == [(C, bus.Ping), (B, bus.Ping)]


def test_a_gossiped_node_that_never_answers_is_dropped() -> None:
    table = with_peers(B)
    table.on_heartbeat(ping(B, entry(C)), START_MS)
    table.cron(START_MS + HANDSHAKE_TIMEOUT_MS)
    assert C in table.nodes
    table.cron(START_MS + max(HANDSHAKE_TIMEOUT_MS, table.timeout_ms) + 1)
    assert C not in table.nodes and C not in table.blacklist  # gossip may bring it back


def test_gossip_adds_at_most_so_many_nodes_waiting_for_a_handshake() -> None:
    table = with_peers(B)
    fakes = [f"{n:040x}" for n in range(1, 2 * MAX_HANDSHAKE_NODES)]
    for chunk in range(0, len(fakes), 50):
        table.on_heartbeat(ping(B, *(entry(f) for f in fakes[chunk : chunk + 50])), START_MS)
    waiting = [n for n in table.nodes.values() if n.flags & HANDSHAKE]
    assert len(waiting) == MAX_HANDSHAKE_NODES
    assert table.size == 2


def test_failure_reports_about_a_node_in_handshake_are_ignored() -> None:
    table = with_peers(B, D)
    table.on_heartbeat(ping(B, entry(C)), START_MS)
    table.on_heartbeat(ping(D, entry(C, PFAIL)), START_MS)
    assert table.nodes[C].fail_reports == {}


def test_messages_from_unknown_senders_are_ignored() -> None:
    table = with_peers(B)
    for msg in (ping(C, entry(D)), bus.Meet(C, 0, (entry(D),)), bus.Pong(C, 0, (entry(D),))):
        table.on_heartbeat(msg, START_MS)
    assert set(table.nodes) == {ME, B}
    assert table.effects.sent() == []


def test_gossip_about_myself_is_ignored() -> None:
    table = with_peers(B, C)
    table.on_heartbeat(ping(B, entry(ME, PFAIL | FAIL)), START_MS)
    table.on_heartbeat(ping(C, entry(ME, FAIL)), START_MS)
    assert table.myself.flags == MYSELF
    assert table.myself.fail_reports == {}


def test_gossip_without_failure_flags_withdraws_a_report() -> None:
    table = with_peers(B, C, D, E)
    table.on_heartbeat(ping(C, entry(B, PFAIL)), START_MS)
    table.on_heartbeat(ping(D, entry(B, FAIL)), START_MS)
    assert table.nodes[B].fail_reports == {C: START_MS, D: START_MS}
    table.on_heartbeat(ping(C, entry(B)), START_MS + 1)
    assert table.nodes[B].fail_reports == {D: START_MS}
    # B not timed out here: reports alone never fail a node.
    assert not table.nodes[B].failing


def test_gossip_respects_its_size_and_never_names_myself() -> None:
    table = with_peers(B, C)
    table.nodes[B].flags |= PFAIL | LEAVING
    g = table.gossip()
    assert sorted(e.node_id for e in g) == [B, C]
    by_id = {e.node_id: e for e in g}
    assert by_id[B].flags == PFAIL | LEAVING
    assert (by_id[C].ip, by_id[C].port, by_id[C].cluster_port) == ("10.0.0.3", 7713, 17713)


@settings(max_examples=40, deadline=None, database=None)
@given(others=st.integers(0, 64), seed=st.integers(0, 2**32), noaddr=st.sets(st.integers(0, 63)))
def test_gossip_size_property(others: int, seed: int, noaddr: set[int]) -> None:
    rng = random.Random(seed)
    table = make_table(seed=seed)
    hidden = set()
    for i in range(others):
        node = table.add(new_node_id(rng), f"10.1.{i // 250}.{i % 250}", 7000 + i, 17000 + i)
        assert node is not None
        if i in noaddr:
            node.flags |= NOADDR  # no address to give: never gossiped
            hidden.add(node.node_id)
    g = table.gossip()
    n = others + 1
    assert len(g) <= max(3, n // 10)
    assert len(g) == min(others - len(hidden), max(3, n // 10))
    ids = [e.node_id for e in g]
    assert len(set(ids)) == len(ids)
    assert ME not in ids
    assert not hidden & set(ids)
    assert set(ids) <= set(table.nodes)


def test_gossip_picks_every_subset_of_a_small_cluster() -> None:
    """Three of four peers: one left out at random, each of the four about
    as often, and the entries always distinct."""
    table = with_peers(B, C, D, E, seed=7)
    left_out: Counter[str] = Counter()
    for _ in range(800):
        named = [e.node_id for e in table.gossip()]
        assert len(named) == len(set(named)) == 3
        (missing,) = {B, C, D, E} - set(named)
        left_out[missing] += 1
    assert set(left_out) == {B, C, D, E}
    assert all(150 <= n <= 250 for n in left_out.values()), left_out


# ---------------------------------------------------------------- heartbeats


def test_a_link_below_what_the_peer_speaks_is_reopened() -> None:
    """Our link to B came up at bus protocol 3 (B was of the release
    before, or closed on our offer once); B's heartbeats now say it speaks
    our highest: the shell is asked for a new link. A node of the release
    before says nothing of it (flags 0), and a link at our highest is left
    alone."""
    table = with_peers(B, C)
    b = table.nodes[B]
    b.link_up, b.bus_version = True, 3
    table.on_heartbeat(bus.Ping(B, 0, ()), START_MS)
    assert table.stuck_links == set()
    table.on_heartbeat(bus.Ping(B, VERSION_BITS, ()), START_MS)
    assert table.stuck_links == {B}
    table.stuck_links.clear()
    b.bus_version = bus.PROTOCOL_VERSION
    table.on_heartbeat(bus.Ping(B, VERSION_BITS, ()), START_MS)
    assert table.stuck_links == set()


@pytest.mark.parametrize("kind", [bus.Ping, bus.Meet])
def test_ping_and_meet_from_a_known_node_are_answered(kind: type[bus.Heartbeat]) -> None:
    table = with_peers(B, C)
    table.on_heartbeat(kind(B, 0, ()), START_MS)
    out = sent(table)
    assert len(out) == 1
    dest, msg = out[0]
    assert dest == B
    assert isinstance(msg, bus.Pong)
    assert msg.sender == ME
    assert msg.flags == own_bits(table)  # not leaving; the version it speaks
    assert {e.node_id for e in msg.gossip} <= {B, C}
    assert table.nodes[B].pong_received == 0  # only a PONG counts as one
    assert table.stats_received == 1
    assert table.stats_sent == 1


def test_pong_is_not_answered_and_clears_ping_sent() -> None:
    table = with_peers(B)
    table.link_changed(B, True, START_MS)
    assert table.nodes[B].ping_sent == START_MS
    sent(table)
    table.on_heartbeat(bus.Pong(B, 0, ()), START_MS + 5)
    assert table.effects.sent() == []
    assert table.nodes[B].ping_sent == 0
    assert table.nodes[B].pong_received == START_MS + 5


def test_heartbeat_carries_the_leaving_flag_of_the_sender() -> None:
    table = with_peers(B)
    table.on_heartbeat(ping(B, flags=LEAVING | PFAIL), START_MS)
    assert table.nodes[B].flags == LEAVING  # only LEAVING is taken from the sender
    assert table.priority(table.nodes[B]) == 100
    table.on_heartbeat(ping(B), START_MS + 1)
    assert table.nodes[B].flags == 0


def test_any_message_clears_pfail_and_fail() -> None:
    table = with_peers(B, C)
    b, c = table.nodes[B], table.nodes[C]
    b.flags |= PFAIL
    c.flags |= FAIL
    c.fail_reports[B] = START_MS
    table.heard_from(b)
    table.heard_from(c)
    assert (b.flags, c.flags) == (0, 0)
    assert c.fail_reports == {}
    # Not a PONG: the pings keep their pace (seed 885581120).
    assert (b.pong_received, c.pong_received) == (0, 0)
    # The same through a heartbeat of any kind.
    for kind in (bus.Ping, bus.Pong, bus.Meet):
        b.flags |= FAIL
        table.on_heartbeat(kind(B, 0, ()), START_MS + 2)
        assert not b.failing


@pytest.mark.parametrize("seed", range(5))
def test_gossip_names_every_failing_node_first(seed: int) -> None:
    """Seed 885581120: with gossip picking 3 of 5 at random, the reports of
    four nodes about a fifth cut off rarely met within their validity."""
    f = "f" * 40
    table = with_peers(B, C, D, E, f, seed=seed)
    table.nodes[C].flags |= PFAIL
    table.nodes[E].flags |= FAIL
    for _ in range(20):
        named = {e.node_id for e in table.gossip()}
        assert len(named) == 3 and {C, E} <= named
    # More failing nodes than entries: a sample of them only.
    for node_id in (B, D, f):
        table.nodes[node_id].flags |= PFAIL
    assert all(len(table.gossip()) == 3 for _ in range(5))


def test_job_traffic_does_not_hold_back_the_pings() -> None:
    """A peer that sends jobs all the time is still pinged every half node
    timeout: the pings carry the gossip failure detection lives on."""
    table = with_peers(B)
    table.link_changed(B, True, START_MS)
    table.on_heartbeat(bus.Pong(B, 0, ()), START_MS)
    sent(table)
    pings = []
    for ms in range(START_MS, START_MS + 5 * T, 10):
        table.heard_from(table.nodes[B])  # a job message every 10 ms
        table.cron(ms)
        for _, msg in sent(table):
            if isinstance(msg, bus.Ping):
                pings.append(ms)
                table.on_heartbeat(bus.Pong(B, 0, ()), ms + 1)
    assert len(pings) >= 8
    assert all(b - a <= T // 2 + 20 for a, b in itertools.pairwise(pings))


# --------------------------------------------------------- failure detection


def three_nodes() -> ClusterTable:
    """ME with B and C, links to both up and answered once at START_MS."""
    table = with_peers(B, C)
    for node_id in (B, C):
        table.link_changed(node_id, True, START_MS)
        table.on_heartbeat(bus.Pong(node_id, 0, ()), START_MS)
    sent(table)
    return table


def test_link_up_sends_a_ping_at_once() -> None:
    table = with_peers(B)
    table.link_changed(B, True, START_MS)
    node = table.nodes[B]
    assert node.link_up and node.link_since == START_MS
    assert node.ping_sent == START_MS
    [(dest, msg)] = sent(table)
    assert dest == B and isinstance(msg, bus.Ping) and msg.sender == ME
    # A second link while a ping is pending keeps the original ping time.
    table.link_changed(B, False, START_MS + 10)
    table.link_changed(B, True, START_MS + 20)
    assert node.ping_sent == START_MS
    [(_, again)] = sent(table)
    assert isinstance(again, bus.Ping)
    # Once B has answered, a new link starts a new ping.
    table.on_heartbeat(bus.Pong(B, 0, ()), START_MS + 30)
    table.link_changed(B, False, START_MS + 40)
    table.link_changed(B, True, START_MS + 50)
    assert node.ping_sent == START_MS + 50


@pytest.mark.parametrize("kind", [bus.Ping, bus.Meet])
def test_only_a_pong_answers_a_ping(kind: type[bus.Heartbeat]) -> None:
    """Links are one-way: B's own PING comes over B's link and proves
    nothing about ours. Were it to clear ping_sent, a node whose messages
    to B are all lost would never suspect B (see the one-way mesh test)."""
    table = with_peers(B)
    table.link_changed(B, True, START_MS)
    b = table.nodes[B]
    table.on_heartbeat(kind(B, 0, ()), START_MS + 10)
    assert b.ping_sent == START_MS  # still waiting for our answer
    assert b.pong_received == 0
    table.cron(START_MS + T + 1)
    assert b.flags == PFAIL
    table.on_heartbeat(bus.Pong(B, 0, ()), START_MS + T + 2)
    assert b.ping_sent == 0
    assert b.flags == 0


def test_link_changed_of_unknown_node_is_ignored() -> None:
    table = make_table()
    table.link_changed(B, True, START_MS)
    assert table.effects.sent() == []


def test_unanswered_ping_makes_a_node_pfail_after_the_timeout() -> None:
    table = with_peers(B)
    table.link_changed(B, True, START_MS)
    node = table.nodes[B]
    table.cron(START_MS + T)
    assert not node.failing
    assert table.size == 2
    table.cron(START_MS + T + 1)
    # Size 2: the majority is 2, my own vote alone does not make it FAIL.
    assert node.flags == PFAIL
    table.cron(START_MS + 10 * T)
    assert node.flags == PFAIL
    assert line_of(table, B).split()[2] == "fail?"
    assert table.priority(node) == 10
    assert node not in table.reachable()


def test_a_node_is_lost_at_fail_or_in_a_cluster_of_two_at_pfail() -> None:
    """What the core takes over the jobs of (Node.fail_over): a node marked
    FAIL, and in a cluster of two, where no FAIL can be agreed, the one
    suspected."""
    two = with_peers(B)
    two.link_changed(B, True, START_MS)
    two.cron(START_MS + T + 1)
    assert two.nodes[B].flags == PFAIL and list(two.lost) == [B]
    three = three_nodes()
    t = START_MS + T // 2 + 1
    three.cron(t)
    three.on_heartbeat(bus.Pong(C, 0, ()), t)
    three.cron(t + T + 1)
    assert three.nodes[B].flags == PFAIL and not three.lost
    three.on_heartbeat(ping(C, entry(B, PFAIL)), t + T + 2)
    assert three.nodes[B].flags == FAIL and list(three.lost) == [B]
    told = three_nodes()
    told.on_fail(bus.Fail(C), START_MS)
    assert list(told.lost) == [C]


def test_a_heartbeat_from_a_new_incarnation_is_a_node_lost() -> None:
    table = with_peers(B)
    table.on_heartbeat(bus.Ping(B, 7 << bus.INCARNATION_SHIFT, ()), START_MS)
    table.on_heartbeat(bus.Ping(B, 7 << bus.INCARNATION_SHIFT, ()), START_MS + 1)
    table.on_heartbeat(bus.Ping(B, 0, ()), START_MS + 2)  # an older release: no number
    assert not table.lost
    table.on_heartbeat(bus.Pong(B, 8 << bus.INCARNATION_SHIFT, ()), START_MS + 3)
    assert list(table.lost) == [B]
    assert make_table(seed=1).myself.incarnation != make_table(seed=2).myself.incarnation


def test_backward_clock_step_does_not_blind_failure_detection() -> None:
    """Marks from before a step back of the wall clock are in the future:
    left alone they kept a silent node from being pinged, so from PFAIL,
    for the whole step."""
    table = three_nodes()
    table.on_heartbeat(ping(C, entry(B, PFAIL)), START_MS + 100)  # before the step
    table.cron(START_MS + 100)  # next random ping at START_MS + 1100
    sent(table)
    back = START_MS + 200 - 47_500
    table.cron(back)
    t = back + T // 2 + 1
    table.cron(t)  # pongs older than T/2 (by the new clock): both pinged
    b = table.nodes[B]
    assert back <= b.ping_sent <= t
    table.on_heartbeat(bus.Pong(C, 0, ()), t)  # C answers, B does not
    t += T + 1
    table.cron(t)
    # PFAIL, not FAIL: the report from before the step has an unknown age.
    assert b.flags == PFAIL
    table.on_heartbeat(ping(C, entry(B, PFAIL)), t + 1)
    assert b.flags == FAIL


def test_pfail_plus_one_report_is_fail_in_a_cluster_of_three() -> None:
    table = three_nodes()
    t = START_MS + T // 2 + 1
    table.cron(t)  # pongs older than T/2: both pinged again
    assert table.nodes[B].ping_sent == t
    assert table.nodes[C].ping_sent == t
    table.on_heartbeat(bus.Pong(C, 0, ()), t)  # C answers, B does not
    sent(table)
    t += T + 1
    table.cron(t)
    b = table.nodes[B]
    assert b.flags == PFAIL
    assert not table.nodes[C].failing
    assert [m for _, m in sent(table) if isinstance(m, bus.Fail)] == []
    # One report from C: 1 + myself = 2, the majority of 3.
    table.on_heartbeat(ping(C, entry(B, PFAIL)), t + 1)
    assert b.flags == FAIL
    assert b.fail_time == t + 1
    assert "fail" in line_of(table, B).split()[2].split(",")
    assert table.priority(b) == 100
    out = sent(table)
    fails = [(dest, m) for dest, m in out if isinstance(m, bus.Fail)]
    assert fails == [(C, bus.Fail(B))]  # to the others, not to the failed node
    # FAIL is broadcast once.
    table.on_heartbeat(ping(C, entry(B, FAIL)), t + 2)
    table.cron(t + 3)
    assert not [m for _, m in sent(table) if isinstance(m, bus.Fail)]


def test_report_before_local_timeout_counts_when_pfail_comes() -> None:
    table = three_nodes()
    t = START_MS + T // 2 + 1
    table.cron(t)
    table.on_heartbeat(bus.Pong(C, 0, ()), t)
    table.on_heartbeat(ping(C, entry(B, PFAIL)), t + 1)
    assert table.nodes[B].flags == 0  # reports alone do nothing
    table.cron(t + T + 1)
    assert table.nodes[B].flags == FAIL
    assert (C, bus.Fail(B)) in sent(table)


def test_reports_older_than_twice_the_timeout_do_not_count() -> None:
    table = three_nodes()
    b = table.nodes[B]
    # Hearing from B drops every report about it, and B is pinged at most
    # T/2 after it was last heard from: in a live exchange a report cannot
    # age 2T before B times out. Plant an old one to check the expiry.
    b.fail_reports[C] = START_MS + 1
    table.cron(START_MS + T // 2 + 1)
    assert b.ping_sent == START_MS + T // 2 + 1
    now = START_MS + 1 + 2 * T + 1
    table.cron(now)
    assert b.flags == PFAIL  # the report is 2T + 1 old: it does not count
    assert not [m for _, m in sent(table) if isinstance(m, bus.Fail)]
    table.on_heartbeat(ping(C, entry(B, FAIL)), now + 1)  # a fresh one does
    assert b.flags == FAIL


def test_reports_expire_while_waiting_for_a_majority() -> None:
    table = with_peers(B, C, D, E)
    table.link_changed(B, True, START_MS)
    t = START_MS + T + 1
    table.cron(t)
    b = table.nodes[B]
    assert b.flags == PFAIL
    table.on_heartbeat(ping(C, entry(B, PFAIL)), t)
    table.cron(t + 2 * T)
    assert b.flags == PFAIL  # 2 of 5
    table.on_heartbeat(ping(D, entry(B, PFAIL)), t + 2 * T + 1)
    assert b.flags == PFAIL  # C's report is 2T + 1 old: still 2 of 5
    table.on_heartbeat(ping(E, entry(B, FAIL)), t + 2 * T + 2)
    assert b.flags == FAIL  # D, E and myself


def test_report_exactly_twice_the_timeout_old_still_counts() -> None:
    table = with_peers(B, C)
    table.link_changed(B, True, START_MS)
    table.on_heartbeat(ping(C, entry(B, PFAIL)), START_MS + 1)
    table.nodes[B].flags |= PFAIL
    table.cron(START_MS + 1 + 2 * T)
    assert table.nodes[B].flags == FAIL


def test_majority_of_five_needs_two_reports() -> None:
    table = with_peers(B, C, D, E)
    table.link_changed(B, True, START_MS)
    table.cron(START_MS + T + 1)
    assert table.nodes[B].flags == PFAIL
    table.on_heartbeat(ping(C, entry(B, PFAIL)), START_MS + T + 2)
    assert table.nodes[B].flags == PFAIL  # 2 of 5
    table.on_heartbeat(ping(D, entry(B, FAIL)), START_MS + T + 3)
    assert table.nodes[B].flags == FAIL  # 3 of 5
    fails = sorted(dest for dest, m in sent(table) if isinstance(m, bus.Fail))
    assert fails == [C, D, E]


def test_on_fail_marks_fail_directly() -> None:
    table = with_peers(B, C)
    table.on_fail(bus.Fail(B), START_MS)
    assert table.nodes[B].flags == FAIL
    assert table.nodes[B].fail_time == START_MS
    assert table.effects.sent() == []  # FAIL is not re-broadcast
    table.nodes[C].flags |= PFAIL
    table.on_fail(bus.Fail(C), START_MS + 1)
    assert table.nodes[C].flags == FAIL  # PFAIL is replaced
    table.on_fail(bus.Fail(B), START_MS + 2)
    assert table.nodes[B].fail_time == START_MS  # already FAIL: unchanged
    table.on_fail(bus.Fail(ME), START_MS)
    table.on_fail(bus.Fail(D), START_MS)
    assert table.myself.flags == MYSELF
    assert D not in table.nodes


def test_disconnected_node_heard_before_times_out_too() -> None:
    table = three_nodes()
    table.link_changed(B, False, START_MS + 10)
    b = table.nodes[B]
    b.ping_sent = 0  # say its PONG came in just before the link dropped
    table.cron(START_MS + 20)
    assert b.ping_sent == START_MS + 20  # the clock runs as if a ping was sent
    table.cron(START_MS + 20 + T + 1)
    assert b.flags == PFAIL
    assert table.priority(b) == 10


def test_never_heard_unlinked_node_is_not_suspected() -> None:
    table = with_peers(B)
    table.cron(START_MS)
    table.cron(START_MS + 10 * T)
    assert table.nodes[B].flags == 0
    assert table.nodes[B].ping_sent == 0
    assert table.priority(table.nodes[B]) == 5


def test_stuck_link_is_reported_when_a_ping_waits_on_an_old_link() -> None:
    table = with_peers(B, C)
    table.link_changed(B, True, START_MS)
    table.link_changed(C, True, START_MS)
    table.on_heartbeat(bus.Pong(C, 0, ()), START_MS)
    # Ping pending more than T/2, but the link itself is young.
    table.cron(START_MS + T // 2 + 1)
    assert table.stuck_links == set()
    table.on_heartbeat(bus.Pong(C, 0, ()), START_MS + T // 2 + 1)
    table.cron(START_MS + T + 1)
    assert table.stuck_links == {B}  # C answers: its link is fine
    table.stuck_links.clear()
    # A fresh link (as the shell opens after a stuck report) is left alone.
    table.link_changed(B, False, START_MS + T + 2)
    table.link_changed(B, True, START_MS + T + 2)
    table.on_heartbeat(bus.Pong(C, 0, ()), START_MS + T + 2)
    table.cron(START_MS + T + 3)
    assert table.stuck_links == set()
    table.cron(START_MS + 2 * T + 3)
    assert table.stuck_links == {B}


def test_cron_pings_nodes_whose_pong_is_older_than_half_the_timeout() -> None:
    table = three_nodes()
    table.cron(START_MS + 1)  # the first cron also pings one node at random
    [(first, msg)] = sent(table)
    assert isinstance(msg, bus.Ping)
    [other] = {B, C} - {first}
    table.cron(START_MS + T // 2)
    assert sent(table) == []
    table.cron(START_MS + T // 2 + 1)
    assert [(d, type(m)) for d, m in sent(table)] == [(other, bus.Ping)]
    assert table.nodes[other].ping_sent == START_MS + T // 2 + 1
    assert table.nodes[first].ping_sent == START_MS + 1  # still waiting


def test_a_ping_without_pong_for_half_the_timeout_is_sent_again_each_second() -> None:
    """Seed 600678: bus chaos dropped the PONG to a PING sent on a fresh
    link. Nothing sent another while that one was in flight, so for a
    whole node timeout, until the link was restarted as stuck, the node
    was flagged PFAIL at every cron tick and cleared by its next message;
    a PAUSE BCAST made at such a tick skipped it. The PING goes again each
    second after half a node timeout without a PONG, keeping its time (the
    failure detector's clock runs on), and the first PONG ends it."""
    timeout = 10_000
    table = make_table(timeout=timeout)
    table.add(B, "10.0.0.2", 7712, 17712)
    table.link_changed(B, True, START_MS)
    assert [(d, type(m)) for d, m in sent(table)] == [(B, bus.Ping)]  # lost
    b = table.nodes[B]
    pings = []
    for ms in range(START_MS + STEP_MS, START_MS + timeout // 2 + 2_500, STEP_MS):
        table.cron(ms)
        pings += [ms for d, m in sent(table) if d == B and isinstance(m, bus.Ping)]
    half = START_MS + timeout // 2
    assert pings == [half + STEP_MS, half + STEP_MS + 1_000, half + STEP_MS + 2_000]
    assert b.ping_sent == START_MS  # the first one's time
    table.on_heartbeat(bus.Pong(B, 0, ()), half + 2_500)
    assert b.ping_sent == 0
    table.cron(half + 2_600)
    assert not [m for d, m in sent(table) if isinstance(m, bus.Ping)]
    # No PONG at all: PFAIL after the node timeout, as before.
    table = make_table(timeout=timeout)
    table.add(B, "10.0.0.2", 7712, 17712)
    table.link_changed(B, True, START_MS)
    table.cron(START_MS + timeout)
    assert not table.nodes[B].flags & PFAIL
    table.cron(START_MS + timeout + 1)
    assert table.nodes[B].flags & PFAIL


def test_cron_pings_one_random_linked_node_a_second() -> None:
    table = with_peers(B, C, D)
    for node_id in (B, C, D):
        table.link_changed(node_id, True, START_MS)
        table.on_heartbeat(bus.Pong(node_id, 0, ()), START_MS)
    sent(table)
    table.cron(START_MS + 1)
    first = [d for d, m in sent(table) if isinstance(m, bus.Ping)]
    assert len(first) == 1
    assert table.nodes[first[0]].ping_sent == START_MS + 1
    table.cron(START_MS + 2)  # less than a second later: nothing
    assert sent(table) == []


# ------------------------------------------------------------ priority, views


def test_priority_and_reachable() -> None:
    table = with_peers(B, C, D, E)
    b, c, d, e = (table.nodes[x] for x in (B, C, D, E))
    for node in (b, c, d):
        table.link_changed(node.node_id, True, START_MS)
    c.flags |= PFAIL
    d.flags |= FAIL
    assert table.priority(table.myself) == 1
    assert table.priority(b) == 1
    assert table.priority(e) == 5  # no link
    assert table.priority(c) == 10
    assert table.priority(d) == 100
    e.flags |= PFAIL
    assert table.priority(e) == 10  # PFAIL outranks a missing link
    e.flags = LEAVING
    assert table.priority(e) == 100
    b.flags |= LEAVING
    assert table.priority(b) == 100
    assert table.reachable() == []
    b.flags = 0
    e.flags = 0
    assert table.reachable() == [b, e]  # a link is not needed to be reachable
    table.set_leaving(True)
    assert table.priority(table.myself) == 100
    assert table.size == 5  # myself included, failing nodes too
    e.flags |= HANDSHAKE
    assert table.size == 4
    assert e not in table.reachable()


def test_info_fields() -> None:
    table = three_nodes()
    table.nodes[B].flags |= FAIL
    info = dict(table.info())
    assert info["cluster_state"] == "ok"
    assert info["cluster_known_nodes"] == 3
    assert info["cluster_reachable_nodes"] == 1  # C: the original counts others only
    assert info["cluster_size"] == 3


def test_nodes_description_exact_lines() -> None:
    table = with_peers(B, C, D, E)
    table.link_changed(B, True, START_MS)
    table.on_heartbeat(bus.Pong(B, 0, ()), START_MS + 7)
    table.link_changed(C, True, START_MS + 8)
    table.nodes[C].flags |= PFAIL
    table.nodes[D].flags |= FAIL | LEAVING
    table.nodes[E].pong_received = 42
    table.set_leaving(True)
    assert table.nodes_description() == (
        f"{ME} 10.0.0.1:7711 myself,leaving 0 0 connected\n"
        f"{B} 10.0.0.2:7712 noflags 0 {START_MS + 7} connected\n"
        f"{C} 10.0.0.3:7713 fail? {START_MS + 8} 0 connected\n"
        f"{D} 10.0.0.4:7714 fail,leaving 0 0 disconnected\n"
        f"{E} 10.0.0.5:7715 noflags 0 42 disconnected\n"
    )
    for line in table.nodes_description().splitlines():
        assert LINE_RE.fullmatch(line), line


def test_flag_names_follow_the_original_order() -> None:
    node = PeerNode(
        B, "10.0.0.2", 7712, 17712, MYSELF | PFAIL | FAIL | HANDSHAKE | NOADDR | LEAVING
    )
    assert node.flag_names() == "myself,fail?,fail,handshake,noaddr,leaving"
    node.flags = 0
    assert node.flag_names() == "noflags"
    node.flags = LEAVING | PFAIL
    assert node.flag_names() == "fail?,leaving"


@settings(max_examples=50, deadline=None, database=None)
@given(st.sets(st.sampled_from([MYSELF, PFAIL, FAIL, HANDSHAKE, NOADDR, LEAVING])))
def test_flag_names_property(bits: set[int]) -> None:
    flags = 0
    for bit in bits:
        flags |= bit
    names = PeerNode(B, "", 0, 0, flags).flag_names().split(",")
    if not bits:
        assert names == ["noflags"]
    else:
        assert len(names) == len(bits)
        assert names == sorted(names, key=FLAG_ORDER.index)


# ------------------------------------------------------------------ nodes.conf

node_ids = st.from_regex(r"[0-9a-f]{40}", fullmatch=True)
ips = st.one_of(
    st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str), st.just(""), st.just("host-1")
)
ports = st.integers(0, 65535)
volatile_flags = st.sampled_from([0, PFAIL, FAIL])


@st.composite
def tables(draw: st.DrawFn) -> tuple[ClusterTable, list[tuple[str, str, int, int, bool, bool]]]:
    ids = draw(st.lists(node_ids, min_size=1, max_size=8, unique=True))
    me_ip, me_port, me_cport = draw(ips), draw(ports), draw(ports)
    table = ClusterTable(ids[0], me_ip, me_port, me_cport, random.Random(0), T)
    me_leaving = draw(st.booleans())
    table.set_leaving(me_leaving)
    rows = [(ids[0], me_ip, me_port, me_cport, True, me_leaving)]
    for node_id in ids[1:]:
        ip, port, cport, leaving = draw(ips), draw(ports), draw(ports), draw(st.booleans())
        node = table.add(node_id, ip, port, cport)
        assert node is not None
        node.flags |= draw(volatile_flags) | (LEAVING if leaving else 0)
        node.ping_sent, node.pong_received = draw(ports), draw(ports)
        node.link_up = draw(st.booleans())
        rows.append((node_id, ip, port, cport, False, leaving))
    return table, rows


@settings(max_examples=60, deadline=None, database=None)
@given(tables())
def test_config_round_trip(
    case: tuple[ClusterTable, list[tuple[str, str, int, int, bool, bool]]],
) -> None:
    table, rows = case
    text = table.to_config()
    assert text.endswith("\n")
    assert ClusterTable.parse_config(text) == rows
    # Volatile state is not saved: every line says 0 0 disconnected.
    for line in text.splitlines():
        assert line.endswith(" 0 0 disconnected")
        assert not {"fail?", "fail"} & set(line.split()[2].split(","))
    # A table rebuilt from the rows writes the same text.
    me = rows[0]
    again = ClusterTable(me[0], me[1], me[2], me[3], random.Random(1), T)
    again.set_leaving(me[5])
    for node_id, ip, port, cport, _, leaving in rows[1:]:
        node = again.add(node_id, ip, port, cport)
        assert node is not None
        node.flags |= LEAVING if leaving else 0
    assert again.to_config() == text


def test_to_config_exact_text() -> None:
    table = with_peers(B)
    table.nodes[B].flags |= PFAIL | LEAVING
    assert table.to_config() == (
        f"{ME} 10.0.0.1:7711@17711 myself 0 0 disconnected\n"
        f"{B} 10.0.0.2:7712@17712 leaving 0 0 disconnected\n"
    )


def test_parse_config_accepts_the_original_format() -> None:
    """CLUSTER NODES lines (no @cport) parse, the bus port defaulting to
    port + 10000; blank lines and comments are skipped; IPv6 keeps its colons."""
    text = (
        "# saved by disque\n"
        "\n"
        f"{ME} 127.0.0.1:7711 myself 0 0 connected\n"
        f"{B} ::1:7712 fail?,leaving 1 2 disconnected\n"
        f"{C} [::1]:7713@20000 noflags 0 0 disconnected\n"
    )
    assert ClusterTable.parse_config(text) == [
        (ME, "127.0.0.1", 7711, 17711, True, False),
        (B, "::1", 7712, 17712, False, True),
        (C, "[::1]", 7713, 20000, False, False),
    ]
    assert ClusterTable.parse_config("") == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (f"{B}", "line 3"),
        (f"{B} 10.0.0.2:7712", "line 3"),
        (f"{B} 10.0.0.2:port noflags 0 0 disconnected", "line 3"),
        (f"{B} 10.0.0.2:7712@cport noflags 0 0 disconnected", "line 3"),
        (f"{B} 10.0.0.2: noflags 0 0 disconnected", "line 3"),
        (f"{B} host noflags 0 0 disconnected", "line 3"),
        (f"{B[:39]} 10.0.0.2:7712 noflags 0 0 disconnected", "line 3: bad node ID"),
        (f"{B}b 10.0.0.2:7712 noflags 0 0 disconnected", "line 3: bad node ID"),
        # What the bus would refuse to decode (see parse_config).
        (f"{B.upper()} 10.0.0.2:7712 noflags 0 0 disconnected", "line 3: bad node ID"),
        (f"{'g' * 40} 10.0.0.2:7712 noflags 0 0 disconnected", "line 3: bad node ID"),
        (f"{B} 10.0.0.2:-1 noflags 0 0 disconnected", "line 3: bad port"),
        (f"{B} 10.0.0.2:65536 noflags 0 0 disconnected", "line 3: bad port"),
        (f"{B} 10.0.0.2:7712@65536 noflags 0 0 disconnected", "line 3: bad port"),
        (f"{B} 10.0.0.2:65530 noflags 0 0 disconnected", "line 3: bad port"),
    ],
)
def test_parse_config_errors_name_the_line(bad: str, message: str) -> None:
    text = f"{ME} 127.0.0.1:7711@17711 myself 0 0 disconnected\n\n{bad}\n"
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterTable.parse_config(text)


# ------------------------------------------------------------------ simulation


class Mesh:
    """Five tables wired through their messages: a stand-in for the shell.

    Like server/peers.py: a message from a node the receiver does not know
    is dropped unless it is a MEET (which teaches the receiver the sender);
    links come up as soon as a node is known and its process is running;
    stuck links are closed and re-opened. A frozen node runs no cron and
    every message from or to it is lost, but the links to it stay up until
    the stuck-link check closes them (then they cannot reconnect)."""

    def __init__(self, seed: int, n: int = 5) -> None:
        rng = random.Random(seed)
        self.now = START_MS
        self.tables = [
            ClusterTable(
                new_node_id(rng), "127.0.0.1", 7711 + i, 17711 + i, random.Random(rng.random()), T
            )
            for i in range(n)
        ]
        self.by_id = {t.node_id: t for t in self.tables}
        self.frozen: set[str] = set()
        self.cut: set[tuple[str, str]] = set()  # (from, to): lost one way
        self.steps = 0

    def alive(self) -> list[ClusterTable]:
        return [t for t in self.tables if t.node_id not in self.frozen]

    def meet(self, a: ClusterTable, b: ClusterTable) -> None:
        """CLUSTER MEET on a: handshake with b, then a MEET over it."""
        a.add(b.node_id, b.myself.ip, b.myself.port, b.myself.cport)
        a.send(b.node_id, a.heartbeat(bus.Meet))

    def sync_links(self) -> None:
        for t in self.alive():
            for node in t.wanted_links():
                if not node.link_up and node.node_id not in self.frozen:
                    t.link_changed(node.node_id, True, self.now)

    def deliver(self) -> None:
        """Deliver what is queued now; replies wait for the next step."""
        self.sync_links()
        batch: list[tuple[ClusterTable, str, object]] = []
        for t in self.tables:
            batch.extend((t, dest, msg) for dest, msg in t.effects.sent())
            t.effects.clear()
        for src, dest, msg in batch:
            dst = self.by_id.get(dest)
            if dst is None or src.node_id in self.frozen or dest in self.frozen:
                continue
            if (src.node_id, dest) in self.cut:
                continue
            if src.node_id not in dst.nodes:
                if not isinstance(msg, bus.Meet):
                    continue
                me = src.myself
                if dst.add(me.node_id, me.ip, me.port, me.cport) is None:
                    continue
            if isinstance(msg, bus.Heartbeat):
                dst.on_heartbeat(msg, self.now)
            elif isinstance(msg, bus.Fail):
                dst.on_fail(msg, self.now)
            else:
                raise AssertionError(f"unexpected message {msg!r}")

    def step(self) -> None:
        """100 ms: cron everywhere, stuck links closed, one hop of messages."""
        self.now += STEP_MS
        self.steps += 1
        for t in self.alive():
            t.cron(self.now)
            for node_id in sorted(t.stuck_links):
                t.link_changed(node_id, False, self.now)
            t.stuck_links.clear()
        self.deliver()

    def kill(self, victim: str, crash: bool) -> None:
        """Freeze a node (SIGSTOP: links to it stay up, nothing answers) or
        crash it (connections reset: the others' links to it go down)."""
        self.frozen.add(victim)
        self.by_id[victim].effects.clear()
        if crash:
            for t in self.alive():
                t.link_changed(victim, False, self.now)

    def restart(self, victim: str) -> None:
        """A crashed node comes back with only what its nodes.conf says."""
        old = self.by_id[victim]
        rows = ClusterTable.parse_config(old.to_config())
        [me] = [r for r in rows if r[4]]
        table = ClusterTable(me[0], me[1], me[2], me[3], random.Random(self.now), T)
        table.set_leaving(me[5])
        for node_id, ip, port, cport, _, leaving in rows:
            if node_id != victim:
                node = table.add(node_id, ip, port, cport)
                assert node is not None
                node.flags |= LEAVING if leaving else 0
        self.tables[self.tables.index(old)] = table
        self.by_id[victim] = table
        self.frozen.discard(victim)

    def run_until(self, done: Callable[[], bool], max_steps: int) -> int:
        """Step until ``done()`` holds; the number of steps it took."""
        for i in range(max_steps + 1):
            if done():
                return i
            self.step()
        raise AssertionError(f"not done after {max_steps} steps:\n{self.describe()}")

    def describe(self) -> str:
        return "\n".join(f"--- {t.node_id[:8]}\n{t.nodes_description()}" for t in self.tables)

    def full_mesh(self) -> bool:
        ids = set(self.by_id)
        return all(set(t.nodes) == ids for t in self.alive())

    def healthy(self) -> bool:
        return all(not n.failing and n.link_up for t in self.alive() for n in t.others())

    def everyone_sees_fail(self, victim: str) -> bool:
        return all(t.nodes[victim].flags & FAIL for t in self.alive())


def chain(seed: int) -> Mesh:
    mesh = Mesh(seed)
    for a, b in zip(mesh.tables, mesh.tables[1:], strict=False):
        mesh.meet(a, b)  # table i knows table i+1 only
    return mesh


@pytest.mark.parametrize(("seed", "crash"), [(seed, seed % 2 == 1) for seed in range(6)])
def test_five_tables_form_a_mesh_detect_a_failure_and_recover(seed: int, crash: bool) -> None:
    mesh = chain(seed)
    # Membership: everyone knows everyone within a bounded number of steps.
    steps = mesh.run_until(mesh.full_mesh, max_steps=30)
    assert steps > 0  # one hop a step: a chain takes a few
    # A node learned by gossip drops our PINGs until it learns of us in
    # turn (only a MEET introduces a stranger), so it may look PFAIL here
    # for about a timeout; never FAIL. Then all is well, and stays so.
    settle = 3 * T // STEP_MS
    for i in range(settle + 3 * T // STEP_MS):
        assert not any(n.flags & FAIL for t in mesh.tables for n in t.others())
        assert i < settle or mesh.healthy(), mesh.describe()
        mesh.step()
    for t in mesh.tables:
        assert t.size == 5
        assert len(t.reachable()) == 4
        assert all(t.priority(n) == 1 for n in t.nodes.values())

    # Stop one node: the others agree it FAILed within a few timeouts.
    victim = mesh.tables[seed % 5].node_id
    mesh.kill(victim, crash)
    steps = mesh.run_until(lambda: mesh.everyone_sees_fail(victim), max_steps=4 * T // STEP_MS)
    assert steps * STEP_MS > T  # not before the timeout
    for t in mesh.alive():
        node = t.nodes[victim]
        assert t.priority(node) == 100
        assert node not in t.reachable()
        assert len(t.reachable()) == 3
        assert line_of(t, victim).split()[2] == "fail"
        # Nobody else is suspected meanwhile.
        assert all(not n.failing for n in t.others() if n.node_id != victim)
    for _ in range(2 * T // STEP_MS):  # and it stays FAIL while down
        mesh.step()
        assert mesh.everyone_sees_fail(victim)

    # Bring it back: every flag clears within two timeouts, and stays clear.
    # (Not at once: the others' pings from before the failure wait for a
    # PONG, and a FAIL broadcast racing the first PONG may linger until the
    # node's next message.)
    if crash:
        mesh.restart(victim)
    else:
        mesh.frozen.clear()
    settle_within = 2 * T // STEP_MS
    for i in range(settle_within + 3 * T // STEP_MS):
        assert i < settle_within or mesh.healthy(), mesh.describe()
        mesh.step()
    assert mesh.full_mesh()
    for t in mesh.tables:
        assert "fail" not in t.nodes_description()


@pytest.mark.parametrize("seed", range(3))
def test_mesh_node_whose_messages_to_another_are_lost_suspects_it(seed: int) -> None:
    """A one-way cut: everything from A to B is lost, B to A still works.
    A must stop counting on B, though B keeps talking to A."""
    mesh = chain(seed)
    mesh.run_until(mesh.full_mesh, max_steps=30)
    for _ in range(3 * T // STEP_MS):
        mesh.step()
    assert mesh.healthy()
    a, b = mesh.tables[0], mesh.tables[1]
    mesh.cut.add((a.node_id, b.node_id))
    a_doubts_b = 0
    for _ in range(20 * T // STEP_MS):
        mesh.step()
        a_doubts_b += b.node_id not in {n.node_id for n in a.reachable()}
        # The others see both fine: no majority, never FAIL.
        assert not any(n.flags & FAIL for t in mesh.tables for n in t.others())
        assert all(not n.failing for t in mesh.tables[2:] for n in t.others()), mesh.describe()
    # A suspects B most of the time: a message from B clears the doubt
    # until the next cron finds our ping still unanswered.
    assert a_doubts_b > 10 * T // STEP_MS
    # Heal from a moment of doubt (the run may end on a step just after
    # one of B's messages).
    mesh.run_until(lambda: bool(a.nodes[b.node_id].flags & PFAIL), max_steps=T // STEP_MS)
    assert a.nodes[b.node_id].flags & PFAIL
    mesh.cut.clear()
    settle_within = 2 * T // STEP_MS
    for i in range(settle_within + 2 * T // STEP_MS):
        assert i < settle_within or mesh.healthy(), mesh.describe()
        mesh.step()


def test_mesh_is_deterministic_for_a_seed() -> None:
    def trace(seed: int) -> str:
        mesh = chain(seed)
        for _ in range(20):
            mesh.step()
        return mesh.describe()

    assert trace(7) == trace(7)


def test_the_table_holds_at_most_max_nodes() -> None:
    table = with_peers()
    for n in range(1, MAX_NODES + 10):
        table.add(f"{n:040x}", "10.0.0.1", 7000 + n % 1000, 17000)
    assert len(table.nodes) == MAX_NODES
    table.on_heartbeat(ping(f"{1:040x}", entry(E)), START_MS)
    assert E not in table.nodes


def test_version_moves_with_everything_nodes_conf_records() -> None:
    """The shell saves nodes.conf only when ``version`` moved (it used to
    rebuild the text ten times a second to compare): a peer's new address
    and a peer's LEAVING flag (both in the text) move it; a heartbeat that
    changes neither does not."""
    table = with_peers(B)
    text, version = table.to_config(), table.version
    table.on_heartbeat(ping(B), START_MS)
    assert (table.to_config(), table.version) == (text, version)
    table.on_heartbeat(ping(B, flags=LEAVING), START_MS + 10)
    assert table.to_config() != text and table.version > version
    text, version = table.to_config(), table.version
    table.on_heartbeat(ping(B, flags=LEAVING), START_MS + 20)
    assert table.version == version
    assert table.add(B, "10.0.0.99", 7712, 17712) is table.nodes[B]
    assert table.to_config() != text and table.version > version
