"""Cluster behaviour, sans I/O: which node to talk to, and when to move.

This follows the client guidelines of the original Disque's README:

1. the client is given several node addresses and connects to a random
   one that answers;
2. it sends ``HELLO`` there to learn every node and its priority (1 best,
   100 failing or leaving);
3. a consumer whose jobs mostly come from one other node (the 8 hex digits
   after ``D-`` in a job ID are the start of the creating node's ID) may
   move there, so jobs need not travel between nodes;
4. ``-LEAVING`` means: go to another node, by priority.

``Router`` keeps that state. It never opens a connection or reads a clock:
the shells tell it what happened (``connected``, ``failed``, ``leaving``,
``jobs_received``, with the current time as an argument) and ask it where
to go (``connect_order``, ``route``) and whether to try again
(``retryable``). Randomness comes from the ``random.Random`` it is given.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from .commands import Command
from .errors import (
    ConnectionLostError,
    DisqueConnectionError,
    DisqueError,
    LeavingError,
    NoJobError,
    ResponseError,
)
from .held import HeldJobs, Reassert, ReassertResult
from .types import Address, HelloInfo, NodeInfo, node_prefix

__all__ = [
    "DEFAULT_PORT",
    "Backoff",
    "ProducerTracker",
    "Router",
    "Seeds",
    "parse_nodes",
]

DEFAULT_PORT = 7711
# HELLO priorities: 1 reachable, 5 no link yet, 10 fail?, 100 failing or leaving.
PRIORITY_UNUSABLE = 100
# How long after a node said -LEAVING another node's HELLO listing it as
# usable is believed (gossip spreads the flag within about a second).
LEAVING_GOSSIP_S = 5.0
# What a seed that HELLO has not described yet counts as.
PRIORITY_SEED = 2
# Jobs whose delivering node is remembered, for routing their ACK/NACK.
DELIVERED_BY_MAX = 100_000


@dataclass(frozen=True, slots=True)
class Seeds:
    """Node addresses and the password, from URLs and host:port strings."""

    addresses: tuple[Address, ...]
    password: str | None = None


def parse_nodes(nodes: str | Address | Sequence[str | Address]) -> Seeds:
    """Seed addresses from ``disque://[:password@]host:port[,host:port...]``
    URLs, ``host:port`` strings, ``(host, port)`` tuples, or a list of any
    of them. A missing port is 7711; IPv6 hosts go in brackets."""
    items: list[str | Address]
    if isinstance(nodes, str):
        items = [nodes]
    elif isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[1], int):
        items = [(str(nodes[0]), nodes[1])]
    else:
        items = list(nodes)
    addresses: list[Address] = []
    password: str | None = None
    for item in items:
        if isinstance(item, tuple):
            addresses.append((item[0], int(item[1])))
            continue
        text = item.strip()
        if "://" in text:
            scheme, _, text = text.partition("://")
            if scheme.lower() != "disque":
                raise ValueError(f"unsupported URL scheme {scheme!r} (use disque://)")
            text = text.split("/", 1)[0].split("?", 1)[0]
            if "@" in text:
                userinfo, _, text = text.rpartition("@")
                secret = userinfo.partition(":")[2] if ":" in userinfo else userinfo
                if secret:
                    password = unquote(secret)
        for part in text.split(","):
            if part.strip():
                addresses.append(_host_port(part.strip()))
    if not addresses:
        raise ValueError("no node address given")
    return Seeds(tuple(dict.fromkeys(addresses)), password)


def _host_port(text: str) -> Address:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"no host in {text!r}")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bad port in {text!r}") from None
    if not 0 < number < 65536:
        raise ValueError(f"bad port in {text!r}")
    return (host, number)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential back-off with jitter: attempt 0 waits about
    ``base``, each further one twice as long, never more than ``cap``."""

    base: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.cap, self.base * (1 << min(attempt, 30)))
        return ceiling * (0.5 + rng.random() / 2)


class ProducerTracker:
    """Decides when a consumer should move to the node its jobs come from.

    Looks at the creating node of the last ``window`` jobs received. When
    at least ``min_jobs`` were seen and one other node created ``share`` of
    them or more, it answers that node's ID prefix, then forgets the window
    and stays quiet for ``cooldown`` seconds: a move needs a clear majority
    and a fresh one, so a consumer does not flap between nodes whose
    producers are about equally busy (hysteresis).
    """

    def __init__(
        self,
        *,
        window: int = 200,
        min_jobs: int = 50,
        share: float = 0.75,
        cooldown: float = 30.0,
    ) -> None:
        if not 0.5 < share <= 1.0:
            raise ValueError("share must be above 0.5 and at most 1")
        self.min_jobs = min(min_jobs, window)
        self.share = share
        self.cooldown = cooldown
        self._recent: deque[str] = deque(maxlen=window)
        self._quiet_until = -float("inf")

    def observe(
        self, job_ids: Iterable[str], current_prefix: str | None, now: float
    ) -> str | None:
        """Record received jobs; a node ID prefix to move to, or None."""
        self._recent.extend(node_prefix(job_id) for job_id in job_ids)
        if len(self._recent) < self.min_jobs or now < self._quiet_until:
            return None
        prefix, count = Counter(self._recent).most_common(1)[0]
        if prefix == current_prefix or count < self.share * len(self._recent):
            return None
        return prefix

    def moved(self, now: float) -> None:
        """The consumer moved (or decided not to): start afresh."""
        self._recent.clear()
        self._quiet_until = now + self.cooldown


@dataclass(slots=True)
class _Trouble:
    failures: int
    until: float


class Router:
    """Where commands go. ``current`` is the node the client works with;
    routed commands (ACKJOB, FASTACK, NACK, WORKING, SHOW) go to the node
    that created their job when HELLO told us its address. ``held``: the
    jobs this client was delivered and has not settled (held.py), kept
    alive elsewhere when their node is gone (``reassert``)."""

    def __init__(
        self,
        seeds: Sequence[Address],
        *,
        rng: random.Random | None = None,
        follow_producers: bool = True,
        tracker: ProducerTracker | None = None,
        backoff: Backoff | None = None,
        route_by_job_id: bool = True,
        hello_interval: float = 5.0,
        hold_jobs: bool = True,
    ) -> None:
        if not seeds:
            raise ValueError("no node address given")
        self.seeds = list(seeds)
        self.rng = rng or random.Random()
        self.follow_producers = follow_producers
        self.tracker = tracker or ProducerTracker()
        self.backoff = backoff or Backoff()
        self.route_by_job_id = route_by_job_id
        self.nodes: dict[str, NodeInfo] = {}  # by node ID, from the last HELLO
        self.current: Address | None = None
        self.current_id: str | None = None
        self._trouble: dict[Address, _Trouble] = {}
        # Said -LEAVING (when): cleared by its own HELLO saying otherwise,
        # or by another node's once LEAVING_GOSSIP_S passed (that node may
        # not have heard yet: gossip takes a moment).
        self._leaving: dict[Address, float] = {}
        # The last connection attempt to these failed (cleared when one
        # answers HELLO): routed commands do not go there first, however
        # long ago that was; connect_order's rest is a short back-off.
        self._down: set[Address] = set()
        # Jobs fetched through this client are held until it settles them
        # (False: the caller holds them elsewhere, or does not care).
        self.hold_jobs = hold_jobs
        self.held = HeldJobs()
        self.moves = 0  # follow-the-producer moves made
        # Which node delivered each recent job (bounded): where its ACK goes
        # when the node that created it cannot be used.
        self._delivered_by: OrderedDict[str, Address] = OrderedDict()
        self.hello_interval = hello_interval
        self._hello_at = -float("inf")
        self._sweep_rest: dict[Address, float] = {}

    # ------------------------------------------------------------ topology

    def connect_order(self, now: float, exclude: Iterable[Address] = ()) -> list[Address]:
        """Where to try to connect, best first: known nodes by priority
        (random among equals), then seeds HELLO did not describe; nodes
        that failed lately or are leaving go last."""
        skip = set(exclude)
        ranked: dict[Address, int] = {}
        for node in self.nodes.values():
            ranked[node.address] = node.priority
        for seed in self.seeds:
            ranked.setdefault(seed, PRIORITY_SEED)
        order = []
        for address, priority in ranked.items():
            if address in skip:
                continue
            trouble = self._trouble.get(address)
            resting = trouble is not None and trouble.until > now
            if address in self._leaving:
                priority = max(priority, PRIORITY_UNUSABLE)
            order.append(((resting, priority, self.rng.random()), address))
        order.sort()
        return [address for _, address in order]

    def connected(self, address: Address, hello: HelloInfo, now: float) -> None:
        """A connection to ``address`` answered HELLO: learn the cluster
        from it and make it the current node."""
        self.learn(address, hello, now)
        self.current = address
        self.current_id = hello.node_id

    def learn(self, address: Address, hello: HelloInfo, now: float) -> None:
        """Take the node table from a HELLO answered at ``address``. A node
        that said -LEAVING itself is usable again when it says so, or when
        another node does LEAVING_GOSSIP_S later: right after CLUSTER
        LEAVING the other nodes still list it usable for a moment, and a
        client that believed them went back to it (a consumer following the
        producer there, acks routed to it that it cannot spread: found in
        the rolling restart test, jobs delivered twice)."""
        self._trouble.pop(address, None)
        self._down.discard(address)
        self.held.back(address)
        nodes = {}
        for node in hello.nodes:
            if node.id == hello.node_id:
                node = NodeInfo(node.id, address[0], address[1], node.priority)
            elif not node.host:
                node = NodeInfo(node.id, address[0], node.port, node.priority)
            nodes[node.id] = node
            if node.priority < PRIORITY_UNUSABLE:
                since = self._leaving.get(node.address)
                if since is not None and (
                    node.id == hello.node_id or now - since >= LEAVING_GOSSIP_S
                ):
                    del self._leaving[node.address]
            else:
                self.held.gone(node.address)  # failing or leaving
        self.nodes = nodes

    def hello_due(self, now: float) -> bool:
        """Time to ask HELLO again (priorities change: nodes fail, leave)."""
        return now - self._hello_at >= self.hello_interval

    def heard(self, now: float) -> None:
        """A HELLO was just learned from."""
        self._hello_at = now

    def delivered(self, address: Address, job_ids: Iterable[str]) -> None:
        """These jobs were delivered by the node at ``address`` (and are
        held, when ``hold_jobs``)."""
        job_ids = list(job_ids)
        self._remember(address, job_ids)
        if self.hold_jobs:
            self.held.hold(address, job_ids)

    def hold(self, address: Address | None, job_ids: Iterable[str]) -> None:
        """Jobs delivered to another client (by ``address``, if known)
        and settled through this one: held here, routed as if delivered
        here."""
        job_ids = list(job_ids)
        if address is not None:
            self._remember(address, job_ids)
        self.held.hold(address, job_ids)

    def _remember(self, address: Address, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._delivered_by[job_id] = address
            self._delivered_by.move_to_end(job_id)
        while len(self._delivered_by) > DELIVERED_BY_MAX:
            self._delivered_by.popitem(last=False)

    def delivered_by(self, job_id: str) -> Address | None:
        """The node that delivered the job to this client, if remembered."""
        return self._delivered_by.get(job_id)

    def forget_jobs(self, job_ids: Iterable[str]) -> None:
        """Acknowledged: nothing will be routed for them any more."""
        job_ids = list(job_ids)
        for job_id in job_ids:
            self._delivered_by.pop(job_id, None)
        self.held.release(job_ids)

    def sweep_targets(self, now: float) -> list[Address]:
        """Nodes a consumer should also take jobs from with GETJOB NOHANG:
        leaving ones (or failing by HELLO: maybe leaving), which no other
        node may ask for their queued jobs. Not one that could not be
        reached lately."""
        targets = set(self._leaving)
        targets.update(n.address for n in self.nodes.values() if n.priority >= PRIORITY_UNUSABLE)
        if self.current is not None:
            targets.discard(self.current)
        return sorted(a for a in targets if self._sweep_rest.get(a, -1.0) <= now)

    def sweep_failed(self, address: Address, now: float, rest: float = 30.0) -> None:
        self._sweep_rest[address] = now + rest

    def node_id_at(self, address: Address) -> str | None:
        for node in self.nodes.values():
            if node.address == address:
                return node.id
        return None

    def node_for_job(self, job_id: str) -> NodeInfo | None:
        """The usable node whose ID starts with the job ID's prefix."""
        prefix = node_prefix(job_id)
        for node in self.nodes.values():
            if node.id.startswith(prefix):
                if node.priority >= PRIORITY_UNUSABLE or node.address in self._leaving:
                    return None
                return node
        return None

    def creator_out(self, job_id: str, now: float) -> bool:
        """The node that created the job is known to be out of reach:
        failing or leaving by HELLO, a connection to it failed lately, or
        gone from the cluster. False when this client knows no node yet."""
        if not self.nodes:
            return False
        prefix = node_prefix(job_id)
        for node in self.nodes.values():
            if node.id.startswith(prefix):
                trouble = self._trouble.get(node.address)
                return (
                    node.priority >= PRIORITY_UNUSABLE
                    or node.address in self._leaving
                    or (trouble is not None and trouble.until > now)
                )
        return True

    # ------------------------------------------------------------ events

    def failed(self, address: Address, now: float) -> None:
        """A connection to ``address`` could not be opened or broke: it
        rests, and the jobs held from it are orphans (held.py)."""
        self._rest(address, now)
        self._down.add(address)
        self.held.gone(address)

    def refused(self, address: Address, error: ResponseError, now: float) -> None:
        """``address`` answered one of the command's ``retry_codes`` (an
        ADDJOB's -NOREPL: too few nodes reachable from it, now): the call
        goes elsewhere, and that node rests as after a failure, without
        counting as out of reach. A node that says it refused because it
        is leaving (it keeps no copy then, so with REPLICATE n it needs n
        others) is left as after -LEAVING."""
        if "leaving" in error.message.lower():
            self.leaving(address, now)
        else:
            self._rest(address, now)

    def _rest(self, address: Address, now: float) -> None:
        trouble = self._trouble.get(address)
        failures = trouble.failures + 1 if trouble else 1
        self._trouble[address] = _Trouble(
            failures, now + self.backoff.delay(failures - 1, self.rng)
        )
        if address == self.current:
            self.current = self.current_id = None

    def leaving(self, address: Address, now: float) -> None:
        """``address`` answered -LEAVING: stop using it (and keep the jobs
        held from it alive elsewhere)."""
        self._leaving[address] = now
        self.held.gone(address)
        if address == self.current:
            self.current = self.current_id = None

    # ------------------------------------------------------------ held jobs

    def reassert(self, now: float) -> Reassert:
        """A round of WORKING for the held jobs whose node is gone: the
        nodes that created them first, then the connect order, without
        the nodes whose last connection failed."""
        orphans = self.held.orphans()
        creators = [n.address for j in orphans if (n := self.node_for_job(j)) is not None]
        order = dict.fromkeys([*creators, *self.connect_order(now)])
        return Reassert(self.held, [a for a in order if a not in self._down])

    def reasserted(self, plan: Reassert) -> ReassertResult:
        """Record a round: a job kept alive at a node is routed there
        while its creator is out."""
        result = plan.finish()
        for address, job_ids in result.moved.items():
            self._remember(address, job_ids)
        return result

    def jobs_received(self, job_ids: Iterable[str], now: float) -> Address | None:
        """A consumer got these jobs. When following producers is on and
        one other usable node created most of the recent ones, returns its
        address: the shell should make it current (``move_to``)."""
        if not self.follow_producers:
            return None
        current_prefix = self.current_id[:8] if self.current_id else None
        prefix = self.tracker.observe(job_ids, current_prefix, now)
        if prefix is None:
            return None
        self.tracker.moved(now)
        for node in self.nodes.values():
            if node.id.startswith(prefix) and node.priority < PRIORITY_UNUSABLE:
                trouble = self._trouble.get(node.address)
                if node.address not in self._leaving and not (trouble and trouble.until > now):
                    return node.address
        return None

    def move_to(self, address: Address, node_id: str | None) -> None:
        self.current = address
        self.current_id = node_id
        self.moves += 1

    # ------------------------------------------------------------ commands

    def route(self, command: Command[object]) -> list[tuple[Address | None, Command[object]]]:
        """The parts to send: ``(address, command)``, ``None`` meaning the
        current node. A routed command whose job IDs name several nodes is
        split, one part per node. A job goes to the node that created it
        when that node is known and usable, else to the node that
        delivered it (when this client fetched it), else to the current node."""
        if not (command.routed and self.route_by_job_id and command.job_ids):
            return [(None, command)]
        groups: dict[Address | None, list[str]] = {}
        for job_id in command.job_ids:
            node = self.node_for_job(job_id)
            target = node.address if node is not None else None
            if target is None or target in self._down:
                target = self._delivered_by.get(job_id)
            if target == self.current or target in self._down:
                target = None
            groups.setdefault(target, []).append(job_id)
        if len(groups) == 1:
            return [(next(iter(groups)), command)]
        return [(target, command.for_ids(ids)) for target, ids in groups.items()]

    @staticmethod
    def retryable(command: Command[object], error: DisqueError) -> bool:
        """May the command be sent again (elsewhere) after this error?"""
        if isinstance(error, LeavingError):
            return True  # refused before doing anything
        if isinstance(error, ResponseError):
            return error.code in command.retry_codes  # the node says it did nothing
        if isinstance(error, ConnectionLostError):
            return command.idempotent  # it may have run
        # Not sent at all (the connection could not be opened).
        return isinstance(error, DisqueConnectionError)

    @staticmethod
    def fall_back(command: Command[object], outcome: object) -> bool:
        """Should a routed part that went to the job's node be sent to the
        current node as well? When that node did nothing with it (it may
        not hold the job: a copy made elsewhere, a leaving creator): 0
        jobs, no SHOW, -NOJOB, WAITJOB's unknown for every job; or when
        it could not be reached at all. An ACKJOB or FASTACK that counted
        fewer jobs than it named goes again whole (sending an ack twice does
        no harm): that node did not hold some of them, and a leaving node
        does not spread an ack for a job it does not hold (found in the
        rolling restart test: an ACKJOB for five jobs made by a leaving
        node, which held one, answered 1, and the other four were delivered
        again at their RETRY). A NACK is only sent again when none of its
        jobs was queued."""
        if isinstance(outcome, NoJobError):
            return True
        if isinstance(outcome, list):
            return all(entry == "unknown" for entry in outcome)
        if isinstance(outcome, DisqueError):
            return Router.retryable(command, outcome) and not isinstance(outcome, LeavingError)
        if isinstance(outcome, int) and command.idempotent:
            return outcome < len(command.job_ids)
        return outcome is None or outcome == 0
