"""The shared grace timer (server/grace.py): each armed wait is woken at the
end of its grace, in the order armed; a disarmed one never is."""

from __future__ import annotations

import trio
import trio.testing

from disque_trio.server.grace import Grace


async def test_armed_waits_are_woken_at_their_grace_end_and_disarmed_ones_never(
    autojump_clock: trio.testing.MockClock,
) -> None:
    grace = Grace(0.05)
    woken: list[tuple[str, float]] = []

    def waker(name: str) -> object:
        return lambda: woken.append((name, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(grace.run)
        start = trio.current_time()
        first = grace.arm(waker("first"))  # type: ignore[arg-type]
        await trio.sleep(0.01)
        second = grace.arm(waker("second"))  # type: ignore[arg-type]
        third = grace.arm(waker("third"))  # type: ignore[arg-type]
        grace.disarm(second)  # its wait ended first
        await trio.sleep(0.1)
        assert [name for name, _ in woken] == ["first", "third"]
        assert abs(woken[0][1] - (start + 0.05)) < 1e-9
        assert abs(woken[1][1] - (start + 0.06)) < 1e-9
        assert first.expired and third.expired and not second.expired
        # Idle, then armed again: the timer wakes for it.
        late = grace.arm(waker("late"))  # type: ignore[arg-type]
        await trio.sleep(0.06)
        assert late.expired and woken[-1][0] == "late"
        nursery.cancel_scope.cancel()
