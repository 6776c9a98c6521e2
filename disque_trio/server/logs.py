"""Log levels in the original's words, and its log line.

The original has four levels, each printed as one character in its lines
(``pid:M 30 Nov 23:00:00.123 * message``)::

    debug ``.``   verbose ``-``   notice ``*``   warning ``#``

Python's levels map onto those four: DEBUG is debug, VERBOSE (added here,
between DEBUG and INFO) is verbose, INFO is notice, WARNING and everything
above it (ERROR, CRITICAL) is warning. ``loglevel`` sets the lowest level
printed, so ``loglevel warning`` prints ``#`` lines only.
"""

from __future__ import annotations

import logging
import os

VERBOSE = 15
logging.addLevelName(VERBOSE, "VERBOSE")

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "verbose": VERBOSE,
    "notice": logging.INFO,
    "warning": logging.WARNING,
}
ROOT_LOGGER = "disque_trio"


def set_log_level(level: str) -> None:
    """Apply a ``loglevel`` value to every logger of the package."""
    logging.getLogger(ROOT_LOGGER).setLevel(LOG_LEVELS.get(level, logging.INFO))


def level_mark(levelno: int) -> str:
    """The original's character for a Python level."""
    if levelno >= logging.WARNING:
        return "#"
    if levelno >= logging.INFO:
        return "*"
    if levelno >= VERBOSE:
        return "-"
    return "."


class LineFormatter(logging.Formatter):
    """``pid:M dd Mon HH:MM:SS.mmm <mark> message``, as the original writes."""

    def __init__(self) -> None:
        super().__init__(
            f"{os.getpid()}:M %(asctime)s.%(msecs)03d %(mark)s %(message)s", "%d %b %H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        record.__dict__["mark"] = level_mark(record.levelno)
        return super().format(record)
