"""Argument parsing helpers shared by the command handlers.

Every helper raises :class:`ReplyError` with the original's text, so a
handler reads top to bottom and the dispatcher turns the exception into the
reply.
"""

from __future__ import annotations

from ..protocol.replies import SYNTAX_ERROR, ReplyError, err
from .ids import is_valid_job_id

_INT_ERROR = "value is not an integer or out of range"
_LLONG_MIN = -(2**63)
_LLONG_MAX = 2**63 - 1


def parse_int(arg: bytes, message: str = _INT_ERROR) -> int:
    """A strict decimal 64-bit integer, like Redis' string2ll."""
    if not arg or len(arg) > 20 or arg[0] in b" +" or arg != arg.strip():
        raise err(message)
    if arg != b"0" and arg.startswith((b"0", b"-0")):
        raise err(message)
    try:
        value = int(arg)
    except ValueError:
        raise err(message) from None
    if not _LLONG_MIN <= value <= _LLONG_MAX:
        raise err(message)
    return value


def parse_timeout_ms(arg: bytes) -> int:
    """A blocking timeout in milliseconds (0 = forever)."""
    value = parse_int(arg, "timeout is not an integer or out of range")
    if value < 0:
        raise err("timeout is negative")
    return value


def parse_cursor(arg: bytes) -> int:
    if not arg.isdigit() or len(arg) > 20 or int(arg) >= 2**64:
        raise err("invalid cursor or option name")
    return int(arg)


def text(arg: bytes) -> str:
    """Queue names and other names: any bytes, kept losslessly as str.

    surrogateescape round-trips arbitrary bytes through str, and the RESP
    encoder writes them back with the same error handler.
    """
    return arg.decode("utf-8", "surrogateescape")


def job_ids(args: list[bytes]) -> list[str]:
    """Validate every ID first: one bad ID means nothing at all is done."""
    ids = [arg.decode("latin-1") for arg in args]
    for job_id in ids:
        if not is_valid_job_id(job_id):
            raise ReplyError("BADID", "Invalid Job ID format.")
    return ids


def option(arg: bytes) -> bytes:
    """Option names compare case-insensitively."""
    return arg.lower()


__all__ = [
    "SYNTAX_ERROR",
    "job_ids",
    "option",
    "parse_cursor",
    "parse_int",
    "parse_timeout_ms",
    "text",
]
