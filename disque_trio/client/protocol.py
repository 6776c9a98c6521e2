"""The sans-I/O client connection: commands in, bytes out; bytes in, results out.

In the style of h11: a ``ClientProtocol`` holds no socket and reads no
clock. ``send(command)`` returns the bytes to write and remembers that a
reply is due; ``receive_data(data)`` takes whatever the socket returned
(``b""`` for end of file); ``next_event()`` returns the next ``Response``
(the command and its parsed result or error), or ``NEED_DATA``. Commands
may be pipelined: replies come back in order.

    proto = ClientProtocol()
    sock.sendall(proto.send(commands.qlen("emails")))
    while (event := proto.next_event()) is NEED_DATA:
        proto.receive_data(sock.recv(65536))
    print(event.result())

RESP parsing is ``disque_trio.protocol.resp.ReplyReader``; this module
only adds the bookkeeping of what was asked and the typing of answers.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from ..protocol.replies import ReplyError
from ..protocol.resp import NOT_READY, ProtocolError, ReplyReader, encode
from .commands import Command
from .errors import (
    ConnectionLostError,
    DisqueError,
    ProtocolViolationError,
    response_error,
)

__all__ = ["NEED_DATA", "ClientProtocol", "Response"]

T = TypeVar("T")


class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = _NeedData.NEED_DATA
"""What ``next_event`` returns until a whole reply has arrived."""


@dataclass(frozen=True, slots=True)
class Response(Generic[T]):
    """A command's outcome: ``value`` when it succeeded, else ``error``."""

    command: Command[T]
    value: T | None = None
    error: DisqueError | None = None

    def result(self) -> T:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class ClientProtocol:
    """One connection's state: replies due, bytes not parsed yet.

    After a protocol violation or end of file the connection is dead
    (``broken``): every reply still due is answered with
    ``ConnectionLostError`` and ``send`` refuses new commands.
    """

    def __init__(self) -> None:
        self._reader = ReplyReader()
        self._due: deque[Command[object]] = deque()
        self._failed: deque[Response[object]] = deque()
        self._eof = False
        self.broken: DisqueError | None = None

    @property
    def pending(self) -> int:
        """Commands sent whose reply has not been returned yet."""
        return len(self._due) + len(self._failed)

    @property
    def reusable(self) -> bool:
        """Open, and no reply due: ready for the next caller."""
        return self.broken is None and not self._eof and self.pending == 0

    def send(self, *commands: Command[object]) -> bytes:
        """The bytes for these commands (pipelined, in order)."""
        if self.broken is not None or self._eof:
            raise ConnectionLostError(f"connection unusable: {self.broken or 'closed'}")
        out = bytearray()
        for command in commands:
            out += encode(list(command.args))
            self._due.append(command)
        return bytes(out)

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the socket; ``b""`` means the node closed it."""
        if data:
            self._reader.feed(data)
        else:
            # Replies already received are still returned; what stays due
            # after them fails in next_event.
            self._eof = True

    def next_event(self) -> Response[object] | _NeedData:
        if self._failed:
            return self._failed.popleft()
        if not self._due:
            return NEED_DATA
        try:
            reply = self._reader.next_reply()
        except ProtocolError as e:
            self._break(ProtocolViolationError(f"bad reply: {e}"))
            return self._failed.popleft()
        if reply is NOT_READY:
            if self._eof:
                self._break(ConnectionLostError("connection closed by the node"))
                return self._failed.popleft()
            return NEED_DATA
        command = self._due.popleft()
        if isinstance(reply, ReplyError):
            return Response(command, error=response_error(reply.code, reply.message))
        try:
            return Response(command, value=command.parse(reply))
        except DisqueError as e:
            return Response(command, error=e)
        except (KeyError, ValueError, TypeError) as e:
            return Response(
                command, error=ProtocolViolationError(f"unexpected reply to {command.name}: {e!r}")
            )

    def _break(self, error: DisqueError) -> None:
        self.broken = error
        while self._due:
            self._failed.append(Response(self._due.popleft(), error=error))
