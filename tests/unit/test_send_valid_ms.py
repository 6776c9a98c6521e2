"""A Send's ``valid_ms`` counts from the commit that applies it, also when
the message waits for AOF records first (the YOURJOBS of a NEEDJOBS waits
for the records of the jobs it moves)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from disque_trio.core.effects import Effects, Persist, Send
from disque_trio.protocol import bus
from disque_trio.server.node import NodeServer

from ..helpers import make_config, virtual_env

PEER = "77e1a0b2" + "b3" * 16


class _HeldAof:
    """The AOF's side of the commit: every record is written later."""

    def __init__(self) -> None:
        self.pending = 0
        self.held: list[Callable[[], None]] = []

    def append(self, records: list[bytes]) -> int:
        self.pending += 1
        return self.pending

    def after_written(self, seq: int, fn: Callable[[], None]) -> None:
        self.held.append(fn)


@pytest.mark.parametrize("records", [False, True])
def test_send_by_counts_from_the_commit(records: bool) -> None:
    async def main() -> None:
        server = NodeServer(make_config(), virtual_env(), persist_cluster=False)
        aof = _HeldAof()
        server.aof = aof  # type: ignore[assignment]
        calls: list[tuple[str, object, float]] = []

        def spy(peer: str, msg: object, send_by: float = math.inf) -> None:
            calls.append((peer, msg, send_by))

        server.bus.send = spy  # type: ignore[method-assign,assignment]
        answer = bus.YourJobs(())
        effects: list[Any] = [Persist(b"record")] if records else []
        effects += [Send(PEER, answer, 630), Send(PEER, bus.NeedJobs("q", 1))]
        committed_at = trio.current_time()
        server._apply(Effects(effects))
        await trio.sleep(2)  # the records take their time
        for fn in aof.held:
            fn()
        assert calls == [
            (PEER, answer, pytest.approx(committed_at + 0.63)),
            (PEER, bus.NeedJobs("q", 1), math.inf),
        ]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
