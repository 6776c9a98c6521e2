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


def ids_and_option(argv: list[bytes], name: bytes, usage: str) -> tuple[list[bytes], bytes | None]:
    """``CMD id [id ...] [NAME value]``: the ID arguments, and the option's
    value (None when absent). Job IDs are 40 characters, so the option's
    name cannot be mistaken for one."""
    if len(argv) >= 2 and option(argv[-1]) == name:
        raise syntax_error(f"{name.decode().upper()} needs a value ({usage})")
    if len(argv) >= 3 and option(argv[-2]) == name:
        return argv[1:-2], argv[-1]
    return argv[1:], None


def option(arg: bytes) -> bytes:
    """Option names compare case-insensitively."""
    return arg.lower()


def syntax_error(detail: str) -> ReplyError:
    """``ERR syntax error: <detail>``: the original's code and first words
    (clients that match on them still do), then what is actually wrong."""
    return err(f"syntax error: {detail}")


# ----------------------------------------------------------------- GETJOB

GETJOB_USAGE = "GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]"
GETJOB_NO_QUEUE = syntax_error(f"a queue name is needed after FROM ({GETJOB_USAGE})")
GETJOB_NO_FROM = syntax_error(f"FROM and at least one queue name are needed ({GETJOB_USAGE})")
COUNT_ERROR = "COUNT must be a number greater than zero"
# Blocking on a queue costs a queue object and a waiter entry each, made and
# unmade in one go: GETJOB FROM a million queues held the event loop for 17 s
# (the original: 5 s). Ten thousand is far beyond any real consumer.
MAX_GETJOB_QUEUES = 10_000
GETJOB_TOO_MANY = err(f"too many queues: GETJOB takes at most {MAX_GETJOB_QUEUES}")


class GetJobArgs:
    """GETJOB's arguments after validation (defaults filled in)."""

    __slots__ = ("count", "nohang", "queues", "timeout", "withcounters")

    def __init__(self) -> None:
        self.timeout = 0  # ms; 0 blocks until a job comes
        self.count = 1
        self.nohang = False
        self.withcounters = False
        self.queues: list[str] = []


def parse_getjob(argv: list[bytes]) -> GetJobArgs:
    """Parse ``GETJOB [options] FROM q1 ... qN`` (argv[0] is the command).

    The original's rules, which this keeps: options come before FROM, in
    any order and case; every word after FROM is a queue name, even one
    spelled like an option; a malformed TIMEOUT or COUNT is refused with its
    own message. Only its bare ``ERR syntax error`` is made to say which
    rule was broken (the text still starts the same).
    """
    args = GetJobArgs()
    i, n = 1, len(argv)
    while i < n:
        opt = option(argv[i])
        if opt == b"nohang":
            args.nohang = True
        elif opt == b"withcounters":
            args.withcounters = True
        elif opt == b"from":
            if n - i - 1 > MAX_GETJOB_QUEUES:
                raise GETJOB_TOO_MANY
            # A name given twice is visited twice per round, as in the original.
            args.queues = [text(a) for a in argv[i + 1 :]]
            if not args.queues:
                raise GETJOB_NO_QUEUE
            return args
        elif opt in (b"timeout", b"count"):
            if i + 1 == n:
                raise syntax_error(f"{opt.decode().upper()} needs a value ({GETJOB_USAGE})")
            if opt == b"timeout":
                args.timeout = parse_timeout_ms(argv[i + 1])
            else:
                args.count = _positive_count(argv[i + 1])
            i += 1
        else:
            raise syntax_error(f"unknown option '{text(argv[i])}' ({GETJOB_USAGE})")
        i += 1
    raise GETJOB_NO_FROM


def _positive_count(arg: bytes) -> int:
    value = parse_int(arg, COUNT_ERROR)  # not a number: the same message
    if value <= 0:
        raise err(COUNT_ERROR)
    return value


__all__ = [
    "MAX_GETJOB_QUEUES",
    "SYNTAX_ERROR",
    "GetJobArgs",
    "job_ids",
    "option",
    "parse_cursor",
    "parse_getjob",
    "parse_int",
    "parse_timeout_ms",
    "syntax_error",
    "text",
]
