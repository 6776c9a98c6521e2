"""What the server knows about one connected client (CLIENT LIST, AUTH, RESP3)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ..core.waiters import Waiter

# A subscriber's pump writes at most this much in one send: the outbox may
# hold megabytes, and one huge write would hold them twice.
WRITE_CHUNK = 256 * 1024


class Client:
    """Connection state, owned by the connection's handler task."""

    __slots__ = (
        "addr",
        "authenticated",
        "blocked",
        "busy",
        "cancel_scope",
        "close_after_reply",
        "created_ms",
        "gone",
        "id",
        "kind",
        "laddr",
        "last_cmd",
        "last_ms",
        "lib_name",
        "lib_ver",
        "monitor_scope",
        "monitoring",
        "name",
        "proto",
        "pubsub",
        "qbuf",
        "queued_bytes",
    )

    def __init__(self, client_id: int, addr: str, laddr: str, now_ms: int, kind: str) -> None:
        self.id = client_id
        self.addr = addr
        self.laddr = laddr
        self.kind = kind  # "normal" for RESP clients, "websocket" for /ws
        self.name = ""
        self.lib_name = ""
        self.lib_ver = ""
        self.proto = 2  # RESP version the client asked for with HELLO
        self.authenticated = False
        self.created_ms = now_ms
        self.last_ms = now_ms
        self.last_cmd = "NULL"
        self.qbuf = 0
        # The GETJOB/ADDJOB this client waits on, if any (CLIENT LIST flags).
        self.blocked: Waiter | None = None
        # Set by MONITOR: the connection turns into a feed of commands.
        self.monitoring = False
        self.close_after_reply = False  # QUIT, CLIENT KILL of ourselves
        # Cancelling this scope ends the connection (CLIENT KILL, shutdown).
        self.cancel_scope: trio.CancelScope | None = None
        # The connection's reader saw the end of the input (or gave up on
        # it): a blocked command is abandoned, MONITOR ends.
        self.gone = False
        # Bytes of commands read but not run yet (with the parser's buffer,
        # held under client-query-buffer-limit).
        self.queued_bytes = 0
        self.monitor_scope: trio.CancelScope | None = None
        # Running commands or sending replies (shutdown lets it finish).
        self.busy = False
        # Its subscriptions and unsent messages, once it subscribed: from
        # then on its connection writes through the subscriber's outbox.
        self.pubsub: Subscriber | None = None

    def flags(self) -> str:
        flags = ""
        if self.monitoring:
            flags += "O"
        if self.blocked is not None:
            flags += "b"
        if self.close_after_reply:
            flags += "c"
        if self.pubsub is not None and self.pubsub.count():
            flags += "P"
        return flags or "N"

    def info_line(self, now_ms: int) -> str:
        """One line of CLIENT LIST, with Redis' field names."""
        fields = [
            f"id={self.id}",
            f"addr={self.addr}",
            f"laddr={self.laddr}",
            f"name={self.name}",
            f"age={(now_ms - self.created_ms) // 1000}",
            f"idle={(now_ms - self.last_ms) // 1000}",
            f"flags={self.flags()}",
            "db=0",
            f"qbuf={self.qbuf}",
            f"cmd={self.last_cmd}",
            f"sub={len(self.pubsub.channels) if self.pubsub else 0}",
            f"psub={len(self.pubsub.patterns) if self.pubsub else 0}",
            f"resp={self.proto}",
            f"lib-name={self.lib_name}",
            f"lib-ver={self.lib_ver}",
        ]
        return " ".join(fields)


class Subscriber:
    """One connection's subscriptions and the bytes it has yet to write
    (server/pubsub.py)."""

    __slots__ = (
        "channels",
        "client",
        "dropped",
        "hold",
        "later",
        "outbox",
        "over_since",
        "patterns",
        "size",
        "wake",
    )

    def __init__(self, client: Client) -> None:
        self.client = client
        self.channels: dict[bytes, None] = {}  # in the order subscribed
        self.patterns: dict[bytes, None] = {}
        self.outbox: deque[bytes] = deque()
        self.size = 0  # bytes in the outbox
        self.over_since = -1.0  # trio time the outbox went above the soft limit
        self.dropped = False
        # While the replies of a (P)(UN)SUBSCRIBE wait in the connection's
        # own buffer (its batch is not committed yet), messages wait in
        # ``later``: none may come before the confirmation of its channel.
        self.hold = False
        self.later: list[bytes] = []
        # Set when the outbox gets something; the pump waits on it.
        self.wake = trio.Event()

    def count(self) -> int:
        return len(self.channels) + len(self.patterns)

    def take(self, most: int = WRITE_CHUNK) -> bytes:
        """Up to about ``most`` bytes off the outbox, in order. They still
        count in ``size`` until written (``PubSub.written``): a write
        waiting for a client that does not read holds them."""
        parts: list[bytes] = []
        taken = 0
        outbox = self.outbox
        while outbox and (not parts or taken + len(outbox[0]) <= most):
            data = outbox.popleft()
            parts.append(data)
            taken += len(data)
        return b"".join(parts)
