"""Accepting connections: the one accept loop of every port (client, bus, web).

``listener.accept()`` fails with EMFILE when the process has no descriptor
left (and ENFILE, ENOBUFS, ENOMEM for the system's equivalents). That is a
moment of overload, not a reason to stop the node: the loop waits a little
and accepts again, once connections have closed. Trio's ``serve_listeners``
does the same but logs a traceback on every retry, ten times a second; this
loop says it once every ``WARN_EVERY_S``, with how many accepts failed.
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


async def accept_loop(
    listener: trio.abc.Listener[trio.abc.Stream],
    handler: Handler,
    nursery: trio.Nursery,
    what: str,
) -> None:
    """Accept on ``listener`` until cancelled; ``what`` names the port in logs."""
    failed = 0
    warned_at = -WARN_EVERY_S
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in CAPACITY_ERRNOS:
                    raise
                failed += 1
                now = trio.current_time()
                if now - warned_at >= WARN_EVERY_S:
                    log.warning(
                        "cannot accept on the %s port: %s (%d times); retrying every %.1f s",
                        what,
                        e.strerror or errno.errorcode.get(e.errno or 0, e),
                        failed,
                        BACKOFF_S,
                    )
                    warned_at, failed = now, 0
                await trio.sleep(BACKOFF_S)
                continue
            nursery.start_soon(handler, stream)
