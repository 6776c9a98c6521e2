"""What the core wants done outside itself, as data.

The core never awaits and touches nothing but its own state. Whatever must
happen in the world as a consequence of a call (a command, a bus message, a
timer tick) is recorded, in order, in one sink, :class:`Effects`, that the
shell drains at its commit point (``server/node.py``, ``NodeServer.commit``)
and applies in a fixed order: records to the AOF first, then messages to
peers, then wake-ups (which release replies). Nothing else leaves the core
(the observer taps of ``Node.observers`` only read: the dashboard's live
events and the simulator's checkers).

Each effect is a small frozen value, so a test can compare what a call
produced with what it expected, and the simulator can record it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeAlias

import attrs

if TYPE_CHECKING:
    from .waiters import Waiter


@attrs.frozen(slots=True)
class Send:
    """Send ``message`` (a ``protocol.bus`` message) to the node ``peer``.
    Best effort: a link may drop it; the protocol re-sends what matters.

    ``valid_ms``: 0, or how long after the commit the message still says
    what it says. One not written to its link by then is dropped (a
    YOURJOBS carries the TTL its jobs have left in this second of the wall
    clock: written later, it would give them more)."""

    peer: str
    message: object
    valid_ms: int = 0


@attrs.frozen(slots=True)
class Persist:
    """Append ``record`` (``protocol.aof`` bytes) to the AOF. Replies that
    depend on it go out only once it is written (and, with ``appendfsync
    always``, fsynced)."""

    record: bytes


@attrs.frozen(slots=True)
class Wake:
    """A blocked command's reply is ready: ``waiter`` (its reply is in it)."""

    waiter: Waiter


@attrs.frozen(slots=True)
class WakeQueue:
    """Jobs arrived in ``queue`` while consumers wait on it: the queue's
    delivery task hands them over."""

    queue: str


@attrs.frozen(slots=True)
class Log:
    """A line for the node's log, at a ``logging`` level."""

    level: int
    message: str


Effect: TypeAlias = Send | Persist | Wake | WakeQueue | Log


class Effects(list[Effect]):
    """The sink: a list the core appends to and the shell empties."""

    __slots__ = ()

    def send(self, peer: str, message: object, valid_ms: int = 0) -> None:
        self.append(Send(peer, message, valid_ms))

    def log(self, message: str, level: int = logging.INFO) -> None:
        self.append(Log(level, message))

    def sent(self) -> list[tuple[str, object]]:
        """(peer, message) of the Send effects, in order (tests read it)."""
        return [(e.peer, e.message) for e in self if isinstance(e, Send)]


__all__ = ["Effect", "Effects", "Log", "Persist", "Send", "Wake", "WakeQueue"]
