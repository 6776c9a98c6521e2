"""What the client raises.

Everything derives from ``DisqueError``. An error reply from a node becomes
a ``ResponseError`` (or the subclass named by its code); trouble with the
connection is a ``DisqueConnectionError``; a call that ran out of time is a
``DisqueTimeoutError`` (also a ``TimeoutError``).
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadIdError",
    "ConnectionLostError",
    "DisqueConnectionError",
    "DisqueError",
    "DisqueTimeoutError",
    "LeavingError",
    "MaxLenError",
    "NoJobError",
    "NoNodeAvailableError",
    "NoReplError",
    "OutOfMemoryError",
    "PausedError",
    "ProtocolViolationError",
    "ResponseError",
    "TooLateError",
    "response_error",
]


class DisqueError(Exception):
    """Base class of every error the client raises."""


class ResponseError(DisqueError):
    """An error reply (``-CODE message``) from a node."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code} {message}".rstrip())
        self.code = code
        self.message = message


class LeavingError(ResponseError):
    """``-LEAVING``: the node is leaving the cluster; use another one."""


class NoJobError(ResponseError):
    """``-NOJOB``: the node does not know the job (or it was acknowledged)."""


class TooLateError(ResponseError):
    """``-TOOLATE``: WORKING after half of the job's TTL passed."""


class BadIdError(ResponseError):
    """``-BADID``: an argument is not a job ID."""


class NoReplError(ResponseError):
    """``-NOREPL``: the job could not be replicated as asked; it was not added."""


class PausedError(ResponseError):
    """``-PAUSED``: the queue is paused for input on that node."""


class MaxLenError(ResponseError):
    """``-MAXLEN``: the queue already holds MAXLEN jobs."""


class OutOfMemoryError(ResponseError):
    """``-OOM``: the node reached its ``maxmemory``."""


class AuthenticationError(ResponseError):
    """``-NOAUTH`` or a refused password."""


_BY_CODE: dict[str, type[ResponseError]] = {
    "LEAVING": LeavingError,
    "NOJOB": NoJobError,
    "TOOLATE": TooLateError,
    "BADID": BadIdError,
    "NOREPL": NoReplError,
    "PAUSED": PausedError,
    "MAXLEN": MaxLenError,
    "OOM": OutOfMemoryError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
}


def response_error(code: str, message: str) -> ResponseError:
    """The exception for an error reply, chosen by its code."""
    cls = _BY_CODE.get(code.upper(), ResponseError)
    if cls is ResponseError and code == "ERR" and "password" in message:
        cls = AuthenticationError  # "ERR invalid password", "ERR Client sent AUTH, but..."
    return cls(code, message)


class DisqueConnectionError(DisqueError, ConnectionError):
    """A node could not be reached, or a connection broke."""


class ConnectionLostError(DisqueConnectionError):
    """The connection broke after the command was sent: it may have run."""


class NoNodeAvailableError(DisqueConnectionError):
    """No node of the cluster could be reached."""


class AddJobsError(DisqueError):
    """Some ADDJOBs of an ``add_jobs`` batch failed: ``ids`` has the job ID
    of each body, in order, or None where it failed; ``errors`` the error
    of each failed one, by position. A ConnectionLostError means that
    ADDJOB's outcome is unknown (the job may exist)."""

    def __init__(self, ids: list[str | None], errors: dict[int, DisqueError]) -> None:
        first = errors[min(errors)]
        super().__init__(f"{len(errors)} of {len(ids)} ADDJOBs failed; the first: {first}")
        self.ids = ids
        self.errors = errors


class JobNodeUnavailableError(DisqueError):
    """A job's outcome cannot be told: the node that created it is out of
    reach, and the node asked instead knows nothing of the job."""


class DisqueTimeoutError(DisqueError, TimeoutError):
    """A connection attempt or a call did not finish in its time."""


class ProtocolViolationError(DisqueError):
    """The node sent something that is not the expected reply."""
