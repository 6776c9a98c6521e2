"""The values a command answers with, independent of the wire encoding.

The core builds replies out of these plain values and the RESP encoder turns
them into bytes for a RESP2 or RESP3 client; the WebSocket gateway turns the
same values into JSON. Keeping the reply as data (not bytes) is what lets one
command implementation serve both protocols and both transports.

Mapping (RESP2 / RESP3):

==================  =========================  ============================
Python value        RESP2                      RESP3
==================  =========================  ============================
``Status("OK")``    ``+OK``                    ``+OK``
``ReplyError``      ``-CODE message``          ``-CODE message``
``int``             ``:n``                     ``:n``
``bytes``/``str``   ``$len`` bulk string       ``$len`` bulk string
``None``            ``$-1`` (null bulk)        ``_`` (null)
``NULL_ARRAY``      ``*-1`` (null multi-bulk)  ``_`` (null)
``list``/``tuple``  ``*n`` array               ``*n`` array
``dict``            flat ``*2n`` array         ``%n`` map
``float``           bulk string                ``,`` double
``bool``            ``:1`` / ``:0``            ``#t`` / ``#f``
``Verbatim``        bulk string                ``=`` verbatim string (txt)
``Push``            ``*n`` array               ``>n`` push (pub/sub)
==================  =========================  ============================
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs


class Status(str):
    """A simple-string reply (``+OK``, ``+PONG``, a job ID from ADDJOB)."""

    __slots__ = ()


@attrs.frozen
class ReplyError(Exception):
    """An error reply: ``-CODE message``.

    It is also an exception so that deep helpers can ``raise`` it and the
    command dispatcher turns it into the reply; the core never lets any other
    exception reach a client.
    """

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code} {self.message}"

    @property
    def line(self) -> str:
        """The error as it goes on the wire, without the leading '-'."""
        return f"{self.code} {self.message}"


class Verbatim(str):
    """Text that RESP3 sends as a verbatim string (INFO, CLIENT LIST)."""

    __slots__ = ()


class Push(tuple):  # type: ignore[type-arg]
    """Out-of-band data (a pub/sub message, a subscription's confirmation):
    an array in RESP2, a push frame in RESP3, so that a RESP3 client can
    tell it from a command's reply on the same connection."""

    __slots__ = ()


class _NullArray(enum.Enum):
    """The RESP2 null multi-bulk ``*-1`` (GETJOB timeout, QSTAT of no queue)."""

    NULL_ARRAY = "NULL_ARRAY"


NULL_ARRAY = _NullArray.NULL_ARRAY

Reply: TypeAlias = (
    "Status | ReplyError | int | bytes | str | _NullArray | float | bool"
    " | Verbatim | Push | list[Reply] | tuple[Reply, ...] | dict[str | bytes, Reply] | None"
)

OK = Status("OK")


def err(message: str) -> ReplyError:
    """A generic ``-ERR message`` reply."""
    return ReplyError("ERR", message)


SYNTAX_ERROR = err("syntax error")
