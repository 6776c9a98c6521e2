"""Publish/subscribe: Redis' SUBSCRIBE, PSUBSCRIBE, UNSUBSCRIBE, PUNSUBSCRIBE,
PUBLISH and PUBSUB, cluster-wide.

A message published on any node reaches the subscribers of every node: the
node a client sent PUBLISH to delivers it to its own subscribers and sends
it once (bus message PUBLISH, protocol 9) to every node it has a link to,
which deliver it to theirs and pass it on to nobody. What it promises is
what Redis' pub/sub promises, cluster-wide: at most once, in the order
published for one publisher's connection and one receiving node, never
stored. A subscriber that is not connected when a message is published
never sees it; a node that is not linked to the publisher's node (a
partition, a node of a release before protocol 9) misses it too.

Each subscriber has an outbox: what its connection has not written yet
(messages, and the replies of its own commands once it subscribed). Its
size is bounded by ``pubsub-output-buffer-limit`` (``<hard> <soft>
<soft-seconds>``, as Redis' ``client-output-buffer-limit pubsub``): a
subscriber whose outbox reaches the hard limit, or stays above the soft
one for that many seconds, is disconnected (counted in INFO as
``pubsub_clients_dropped``); the node and its other clients are not slowed
down. Messages are encoded once per protocol (RESP2 array, RESP3 push).

In RESP2 a connection with subscriptions accepts only the subscription
commands, PING (answered ``pong`` as a message) and QUIT, as Redis does. In
RESP3 (HELLO 3) it may send any command: the messages come as push frames
between the replies.

The hub is not part of the core: subscriptions belong to connections, and
nothing of it is persisted or replicated as state.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Protocol

import trio

from ..config import glob_regex
from ..core.commands import Command
from ..core.node import Node
from ..protocol import bus
from ..protocol.replies import Push, Reply, ReplyError, err
from ..protocol.resp import encode_into
from .client import Client, Subscriber
from .peers import Bus

log = logging.getLogger("disque_trio.pubsub")

# The commands a RESP2 connection with subscriptions may send (Redis' list,
# without the ones Disque does not have).
SUBSCRIBED_OK = frozenset(
    {"subscribe", "psubscribe", "unsubscribe", "punsubscribe", "ping", "quit"}
)


def subscribed_only(name: str) -> ReplyError:
    return err(
        f"Can't execute '{name}': only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT "
        "are allowed in this context"
    )


class PubSub:
    """The node's channels and patterns, and delivery to their subscribers."""

    def __init__(self) -> None:
        self.channels: dict[bytes, dict[int, Subscriber]] = {}  # by client id
        self.patterns: dict[bytes, tuple[re.Pattern[str], dict[int, Subscriber]]] = {}
        self.subscribers: dict[int, Subscriber] = {}  # with an outbox, by client id
        self.now = trio.current_time  # the soft limit's clock
        # Limits (pubsub-output-buffer-limit): 0 disables one.
        self.hard = 0
        self.soft = 0
        self.soft_seconds = 0
        # Figures (INFO, /metrics).
        self.published = 0  # PUBLISH commands run here
        self.received = 0  # PUBLISH messages from other nodes
        self.delivered = 0  # messages queued to a subscriber here
        self.dropped_clients = 0  # subscribers disconnected over the limit

    # ------------------------------------------------------------ figures

    def buffered(self) -> int:
        return sum(s.size for s in self.subscribers.values())

    def subscribed_clients(self) -> int:
        return sum(1 for s in self.subscribers.values() if s.count())

    # ------------------------------------------------------ subscriptions

    def subscriber(self, client: Client) -> Subscriber:
        sub = self.subscribers.get(client.id)
        if sub is None:
            sub = self.subscribers[client.id] = Subscriber(client)
            client.pubsub = sub
        return sub

    def subscribe(self, sub: Subscriber, channel: bytes) -> None:
        if channel not in sub.channels:
            sub.channels[channel] = None
            self.channels.setdefault(channel, {})[sub.client.id] = sub

    def unsubscribe(self, sub: Subscriber, channel: bytes) -> None:
        if sub.channels.pop(channel, 0) is None:
            subs = self.channels[channel]
            del subs[sub.client.id]
            if not subs:
                del self.channels[channel]

    def psubscribe(self, sub: Subscriber, pattern: bytes) -> None:
        if pattern not in sub.patterns:
            sub.patterns[pattern] = None
            entry = self.patterns.get(pattern)
            if entry is None:
                regex = glob_regex(pattern.decode("utf-8", "surrogateescape"), fold_case=False)
                entry = self.patterns[pattern] = (regex, {})
            entry[1][sub.client.id] = sub

    def punsubscribe(self, sub: Subscriber, pattern: bytes) -> None:
        if sub.patterns.pop(pattern, 0) is None:
            subs = self.patterns[pattern][1]
            del subs[sub.client.id]
            if not subs:
                del self.patterns[pattern]

    def drop(self, client: Client) -> None:
        """The connection ended: its subscriptions go."""
        sub = self.subscribers.pop(client.id, None)
        if sub is None:
            return
        for channel in list(sub.channels):
            self.unsubscribe(sub, channel)
        for pattern in list(sub.patterns):
            self.punsubscribe(sub, pattern)
        sub.outbox.clear()
        sub.later.clear()
        sub.size = 0

    # ----------------------------------------------------------- delivery

    def deliver(self, channel: bytes, message: bytes) -> int:
        """A message published here or on another node: to every subscriber
        of the channel and of a matching pattern here. Returns how many
        received it (a client subscribed both ways counts twice, as in
        Redis)."""
        count = 0
        subs = self.channels.get(channel)
        if subs:
            count += self._fan_out(subs, Push(("message", channel, message)))
        if self.patterns:
            name = channel.decode("utf-8", "surrogateescape")
            for pattern, (regex, psubs) in list(self.patterns.items()):
                if regex.fullmatch(name) is not None:
                    count += self._fan_out(psubs, Push(("pmessage", pattern, channel, message)))
        self.delivered += count
        return count

    def _fan_out(self, subs: dict[int, Subscriber], reply: Push) -> int:
        """``reply`` to each subscriber, encoded once per protocol."""
        frames: dict[int, bytes] = {}
        targets = list(subs.values())
        for sub in targets:
            proto = sub.client.proto
            frame = frames.get(proto)
            if frame is None:
                frame = frames[proto] = _encode(reply, proto)
            self.push(sub, frame)
        return len(targets)

    def push(self, sub: Subscriber, data: bytes) -> None:
        """Queue bytes for a subscriber's connection, within its limits."""
        if sub.dropped:
            return
        (sub.later if sub.hold else sub.outbox).append(data)
        sub.size += len(data)
        sub.wake.set()
        if self.hard and sub.size >= self.hard:
            self._drop_slow(sub, f"{sub.size} bytes waiting, hard limit {self.hard}")
        elif self.soft and sub.size > self.soft:
            now = self.now()
            if sub.over_since < 0:
                sub.over_since = now
            elif self.soft_seconds and now - sub.over_since >= self.soft_seconds:
                self._drop_slow(
                    sub,
                    f"above the soft limit {self.soft} for {self.soft_seconds} s "
                    f"({sub.size} bytes waiting)",
                )
        else:
            sub.over_since = -1.0

    def release(self, sub: Subscriber, replies: bytes) -> None:
        """The connection committed its batch: its replies go to the
        outbox, then the messages held back behind them."""
        later, sub.later, sub.hold = sub.later, [], False
        if replies:
            sub.size += len(replies)
            sub.outbox.append(replies)
        sub.outbox.extend(later)  # counted in size when pushed
        if sub.outbox:
            sub.wake.set()

    def written(self, sub: Subscriber, size: int) -> None:
        """The pump wrote ``size`` bytes: below the soft limit, its clock
        restarts."""
        sub.size = max(0, sub.size - size)
        if sub.size <= self.soft:
            sub.over_since = -1.0

    def _drop_slow(self, sub: Subscriber, why: str) -> None:
        client = sub.client
        sub.dropped = True
        sub.outbox.clear()
        sub.later.clear()
        sub.size = 0
        self.dropped_clients += 1
        log.warning(
            "closing client %d (%s): a subscriber that does not keep up: %s "
            "(pubsub-output-buffer-limit)",
            client.id,
            client.addr,
            why,
        )
        if client.cancel_scope is not None:
            client.cancel_scope.cancel()


def _encode(reply: Reply, proto: int) -> bytes:
    out = bytearray()
    encode_into(out, reply, proto)
    return bytes(out)


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


class _Server(Protocol):
    """What the commands need of the node (``host.ServerHost`` has it)."""

    node: Node
    bus: Bus
    pubsub: PubSub


class Context(Protocol):
    """``host.Context``, as far as these commands use it."""

    @property
    def server(self) -> _Server: ...

    @property
    def client(self) -> Client: ...


def _hub(ctx: Context) -> PubSub:
    return ctx.server.pubsub


def _refuse_websocket(ctx: Context, name: str) -> ReplyError | None:
    if ctx.client.kind != "normal":
        return err(f"{name} is served on the client port only (RESP), not over WebSocket")
    return None


class Several(tuple):  # type: ignore[type-arg]
    """Several replies to one command, sent one after the other (SUBSCRIBE
    confirms each channel with a message of its own)."""

    __slots__ = ()


def _subscription_command(
    kind: str,
    change: Callable[[PubSub], Callable[[Subscriber, bytes], None]],
    every: Callable[[Subscriber], Iterable[bytes]] | None = None,
) -> Callable[[Context, list[bytes]], Reply]:
    """(P)SUBSCRIBE and (P)UNSUBSCRIBE: ``change`` (hub.subscribe, ...)
    applied to each name, each confirmed with a message of its own; with no
    name, ``every`` names the subscriber's set to take (UNSUBSCRIBE: all),
    and none left is confirmed once. Messages for this connection wait
    until these are written (``Subscriber.hold``)."""
    name = kind.upper()

    def handler(ctx: Context, argv: list[bytes]) -> Reply:
        if (refused := _refuse_websocket(ctx, name)) is not None:
            return refused
        hub = _hub(ctx)
        sub = hub.subscriber(ctx.client)
        apply = change(hub)
        sub.hold = True
        out: list[Push] = []
        for item in argv[1:] or (list(every(sub)) if every else []):
            apply(sub, item)
            out.append(Push((kind, item, sub.count())))
        if not out:
            out.append(Push((kind, None, sub.count())))
        return Several(out)

    return handler


subscribe = _subscription_command("subscribe", lambda hub: hub.subscribe)
psubscribe = _subscription_command("psubscribe", lambda hub: hub.psubscribe)
unsubscribe = _subscription_command(
    "unsubscribe", lambda hub: hub.unsubscribe, lambda sub: sub.channels
)
punsubscribe = _subscription_command(
    "punsubscribe", lambda hub: hub.punsubscribe, lambda sub: sub.patterns
)


def publish(ctx: Context, argv: list[bytes]) -> Reply:
    """PUBLISH channel message: the number of clients of this node that
    received it (as Redis Cluster: the other nodes' are not waited for)."""
    hub = _hub(ctx)
    channel, message = argv[1], argv[2]
    hub.published += 1
    count = hub.deliver(channel, message)
    server = ctx.server
    msg = bus.Publish(channel, message)
    sent = False
    for peer in server.node.cluster.others():
        if peer.link_up:
            server.bus.send(peer.node_id, msg)
            sent = True
    if sent:
        server.bus.flush_soon()
    return count


def on_bus_publish(hub: PubSub, msg: bus.Publish) -> None:
    """A PUBLISH from another node."""
    hub.received += 1
    hub.deliver(msg.channel, msg.message)


def pubsub_cmd(ctx: Context, argv: list[bytes]) -> Reply:
    """PUBSUB CHANNELS [pattern] | NUMSUB [channel ...] | NUMPAT | HELP:
    this node's subscriptions (as Redis Cluster: not the other nodes')."""
    hub = _hub(ctx)
    sub = argv[1].lower()
    if sub == b"channels" and len(argv) <= 3:
        names = list(hub.channels)
        if len(argv) == 3:
            regex = glob_regex(argv[2].decode("utf-8", "surrogateescape"), fold_case=False)
            names = [n for n in names if regex.fullmatch(n.decode("utf-8", "surrogateescape"))]
        return list[Reply](names)
    if sub == b"numsub":
        out: list[Reply] = []
        for channel in argv[2:]:
            out += [channel, len(hub.channels.get(channel, ()))]
        return out
    if sub == b"numpat" and len(argv) == 2:
        return len(hub.patterns)
    if sub == b"help" and len(argv) == 2:
        return [
            "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "CHANNELS [<pattern>]",
            "    Return the currently active channels matching a <pattern> (default: '*').",
            "NUMPAT",
            "    Return number of subscriptions to patterns.",
            "NUMSUB [<channel> ...]",
            "    Return the number of subscribers for the specified channels, excluding",
            "    pattern subscriptions (default: no channels).",
            "HELP",
            "    Print this help.",
        ]
    return err(
        f"unknown subcommand or wrong number of arguments for "
        f"'{argv[1].decode('utf-8', 'replace')}'. Try PUBSUB HELP."
    )


def _shell(name: str, arity: int, flags: str, handler: object) -> Command:
    return Command(name, arity, frozenset(flags.split()), handler, core=False)  # type: ignore[arg-type]


PUBSUB_COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        _shell("subscribe", -2, "pubsub noscript loading", subscribe),
        _shell("psubscribe", -2, "pubsub noscript loading", psubscribe),
        _shell("unsubscribe", -1, "pubsub noscript loading", unsubscribe),
        _shell("punsubscribe", -1, "pubsub noscript loading", punsubscribe),
        _shell("publish", 3, "pubsub loading fast", publish),
        _shell("pubsub", -2, "pubsub random loading", pubsub_cmd),
    )
}
