"""Accepting connections: the one accept loop of every port (client, bus, web).

``listener.accept()`` fails with EMFILE when the process has no descriptor
left (and ENFILE, ENOBUFS, ENOMEM for the system's equivalents). That is a
moment of overload, not a reason to stop the node: the loop waits a little
and accepts again, once connections have closed. Trio's ``serve_listeners``
does the same but logs a traceback on every retry, ten times a second; this
loop says it once every ``WARN_EVERY_S`` (a :class:`Throttle`), with how
many accepts failed meanwhile.
Any other accept error is a bug or a closed listener, and propagates.

Each accepted stream runs ``handler(stream)`` in the nursery given, which is
the nursery of that port's connections (so shutdown can tell them apart).
Handlers catch their own errors: one connection never ends the node.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("disque_trio")

CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
BACKOFF_S = 0.1  # short: a descriptor comes back as soon as any connection closes
WARN_EVERY_S = 10.0

Handler = Callable[[trio.abc.Stream], Awaitable[object]]


class Throttle:
    """Warnings a stranger can trigger at will (refused handshakes, bad
    frames, failed accepts), logged at most once every ``every`` seconds per
    kind, with how many were held back meanwhile: a flood of bad
    connections must not become a flood of log lines."""

    def __init__(self, every: float = WARN_EVERY_S) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.WARNING, kind, message, *args)

    def log(
        self,
        level: int,
        kind: str,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
        logger: logging.Logger = log,
    ) -> None:
        """``logger.log(level, ...)`` unless this kind was logged less than
        ``every`` seconds ago (``exc_info`` adds a traceback)."""
        now = trio.current_time()
        last = self._last.get(kind)
        if last is not None and now - last < self.every:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        held = self._held.pop(kind, 0)
        self._last[kind] = now
        suffix = f" ({held} more like it since the last report)" if held else ""
        logger.log(level, message + suffix, *args, exc_info=exc_info)


async def accept_loop(
    listener: trio.abc.Listener[trio.abc.Stream],
    handler: Handler,
    nursery: trio.Nursery,
    what: str,
) -> None:
    """Accept on ``listener`` until cancelled; ``what`` names the port in logs."""
    throttle = Throttle()
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in CAPACITY_ERRNOS:
                    raise
                throttle.warn(
                    "accept",
                    "cannot accept on the %s port: %s; retrying every %.1f s",
                    what,
                    e.strerror or errno.errorcode.get(e.errno or 0, str(e)),
                    BACKOFF_S,
                )
                await trio.sleep(BACKOFF_S)
                continue
            nursery.start_soon(handler, stream)
