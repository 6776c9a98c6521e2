"""Pub/sub for the clients: the sans-I/O part.

A subscription has a connection of its own (a subscribed RESP2 connection
takes no other command). ``SubscriberProtocol`` holds no socket: its
methods return the bytes to write, ``receive_data`` takes what the socket
read, and ``next_message`` returns the next ``Message`` or ``None`` (need
more bytes); the confirmations of (un)subscriptions are consumed on the
way. What the connection is subscribed to is remembered, so that a new
connection to another node (the node died) subscribes to the same again
(``resubscribe``): messages published in between are lost, as pub/sub is
at most once (docs/commands.md).

The blocking ``Subscription`` (``Client.subscribe``) and the async
``AsyncSubscription`` (``AsyncClient.subscribe``) do the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.replies import ReplyError, Status
from ..protocol.resp import NOT_READY, ProtocolError, ReplyReader, encode
from .errors import ProtocolViolationError, response_error

__all__ = ["Message", "SubscriberProtocol"]


@dataclass(frozen=True, slots=True)
class Message:
    """A published message: its channel, its data, and the pattern it
    matched (None for a channel subscription)."""

    channel: str
    data: bytes
    pattern: str | None = None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    raise ProtocolViolationError(f"expected a bulk string in a pub/sub reply, got {value!r}")


def _name(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


class SubscriberProtocol:
    """One subscribed connection's state: what it is subscribed to, and
    the bytes read but not parsed yet."""

    def __init__(self) -> None:
        self._reader = ReplyReader()
        self.channels: dict[str, None] = {}  # asked for, in order
        self.patterns: dict[str, None] = {}
        self.confirmed = 0  # the node's count of subscriptions, last told
        # What this connection's node confirmed: ("c", channel), ("p", pattern).
        self.live: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ commands

    def subscribe(self, *channels: str) -> bytes:
        self.channels.update(dict.fromkeys(channels))
        return encode([b"SUBSCRIBE", *map(_name, channels)]) if channels else b""

    def psubscribe(self, *patterns: str) -> bytes:
        self.patterns.update(dict.fromkeys(patterns))
        return encode([b"PSUBSCRIBE", *map(_name, patterns)]) if patterns else b""

    def unsubscribe(self, *channels: str) -> bytes:
        """None named: every channel."""
        for channel in channels or list(self.channels):
            self.channels.pop(channel, None)
        return encode([b"UNSUBSCRIBE", *map(_name, channels)])

    def punsubscribe(self, *patterns: str) -> bytes:
        """None named: every pattern."""
        for pattern in patterns or list(self.patterns):
            self.patterns.pop(pattern, None)
        return encode([b"PUNSUBSCRIBE", *map(_name, patterns)])

    def auth(self, password: str) -> bytes:
        """AUTH, first on a new connection (its +OK is consumed on the way;
        a refusal is raised by ``next_message``)."""
        return encode([b"AUTH", password.encode("utf-8", "surrogateescape")])

    def resubscribe(self) -> bytes:
        """A new connection (a new node): everything subscribed so far."""
        self._reader = ReplyReader()
        self.confirmed = 0
        self.live.clear()
        out = b""
        if self.channels:
            out += encode([b"SUBSCRIBE", *map(_name, self.channels)])
        if self.patterns:
            out += encode([b"PSUBSCRIBE", *map(_name, self.patterns)])
        return out

    # -------------------------------------------------------------- input

    def receive_data(self, data: bytes) -> None:
        self._reader.feed(data)

    def next_message(self) -> Message | None:
        """The next message read, or None until more bytes arrive.
        Confirmations and PING's answer are consumed; an error reply (a
        NOAUTH, a refused command) is raised as the client's error."""
        while True:
            try:
                reply = self._reader.next_reply()
            except ProtocolError as e:
                raise ProtocolViolationError(f"unreadable reply: {e}") from e
            if reply is NOT_READY:
                return None
            if isinstance(reply, ReplyError):
                raise response_error(reply.code, reply.message)
            if isinstance(reply, Status):
                continue  # AUTH's +OK
            if not isinstance(reply, list) or not reply or not isinstance(reply[0], bytes):
                raise ProtocolViolationError(f"unexpected reply on a subscription: {reply!r}")
            kind = reply[0].lower()
            if kind == b"message" and len(reply) == 3:
                data = reply[2]
                if not isinstance(data, bytes):
                    raise ProtocolViolationError(f"a message without data: {reply!r}")
                return Message(_text(reply[1]), data)
            if kind == b"pmessage" and len(reply) == 4:
                data = reply[3]
                if not isinstance(data, bytes):
                    raise ProtocolViolationError(f"a message without data: {reply!r}")
                return Message(_text(reply[2]), data, _text(reply[1]))
            if kind in (b"subscribe", b"psubscribe", b"unsubscribe", b"punsubscribe"):
                count = reply[2] if len(reply) == 3 else None
                if not isinstance(count, int):
                    raise ProtocolViolationError(f"a confirmation without count: {reply!r}")
                self.confirmed = count
                if isinstance(reply[1], bytes):
                    key = ("p" if kind.startswith(b"p") else "c", _text(reply[1]))
                    if kind.endswith(b"unsubscribe"):
                        self.live.discard(key)
                    else:
                        self.live.add(key)
                continue
            if kind == b"pong":
                continue
            raise ProtocolViolationError(f"unexpected reply on a subscription: {reply!r}")
