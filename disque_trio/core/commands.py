"""The table of commands the core implements, with the original's arities.

Arity follows Redis: a positive number is the exact argument count (command
name included), a negative one the minimum. Flags: ``write`` (changes jobs;
refused while the AOF cannot be written), ``denyoom`` (may grow memory;
refused at 100 % of maxmemory), ``fast`` (O(1)-ish, for SLOWLOG readers).
The shell adds its own commands (CONFIG, CLIENT, INFO, ...) to this table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..protocol.replies import Reply
from . import jobcmds, queuecmds
from .node import Node
from .waiters import Waiter

Handler = Callable[[Any, list[bytes]], "Reply | Waiter"]


@attrs.frozen
class Command:
    name: str
    arity: int
    flags: frozenset[str]
    # Core handlers take the Node; shell handlers take the client context.
    handler: Handler
    core: bool = True

    def arity_ok(self, argc: int) -> bool:
        return argc == self.arity if self.arity > 0 else argc >= -self.arity


def _cmd(
    name: str, arity: int, flags: str, handler: Callable[[Node, list[bytes]], Any]
) -> Command:
    return Command(name, arity, frozenset(flags.split()), handler)


CORE_COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        _cmd("addjob", -4, "write denyoom fast", jobcmds.addjob),
        _cmd("getjob", -2, "write fast", queuecmds.getjob),
        _cmd("ackjob", -1, "write fast", jobcmds.ackjob),
        _cmd("fastack", -1, "write fast", jobcmds.fastack),
        _cmd("deljob", -1, "write fast", jobcmds.deljob),
        _cmd("show", 2, "readonly fast", jobcmds.show),
        _cmd("qlen", 2, "readonly fast", queuecmds.qlen),
        _cmd("qpeek", 3, "readonly", queuecmds.qpeek),
        _cmd("qstat", 2, "readonly fast", queuecmds.qstat),
        _cmd("qscan", -1, "readonly", queuecmds.qscan),
        _cmd("jscan", -1, "readonly", jobcmds.jscan),
        _cmd("enqueue", -1, "write denyoom fast", jobcmds.enqueue),
        _cmd("nack", -1, "write denyoom fast", jobcmds.nack),
        _cmd("dequeue", -1, "write fast", jobcmds.dequeue),
        _cmd("working", 2, "write fast", jobcmds.working),
        _cmd("waitjob", -2, "readonly fast", jobcmds.waitjob),
        _cmd("pause", -3, "readonly fast", queuecmds.pause),
    )
}
