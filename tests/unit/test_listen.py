"""The accept loop shared by every port: out of descriptors, it waits and
goes on; any other accept error propagates."""

from __future__ import annotations

import errno
import logging

import pytest
import trio
import trio.testing

from disque_trio.server.listen import BACKOFF_S, accept_loop


class FlakyListener(trio.abc.Listener[trio.abc.Stream]):
    """Fails with the given errnos in turn, then hands out memory streams."""

    def __init__(self, failures: list[int], streams: int) -> None:
        self.failures = failures
        self.streams = streams
        self.closed = False

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        if self.failures:
            code = self.failures.pop(0)
            raise OSError(code, "simulated")
        if not self.streams:
            await trio.sleep_forever()
        self.streams -= 1
        return trio.testing.memory_stream_pair()[0]

    async def aclose(self) -> None:
        self.closed = True


async def test_emfile_backs_off_and_goes_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = FlakyListener([errno.EMFILE] * 25 + [errno.ENFILE], streams=3)
    handled: list[float] = []

    async def handler(stream: trio.abc.Stream) -> None:
        handled.append(trio.current_time())

    started = trio.current_time()
    with caplog.at_level(logging.WARNING, logger="disque_trio"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_loop, listener, handler, nursery, "client")
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
    assert len(handled) == 3
    assert handled[0] - started == pytest.approx(26 * BACKOFF_S)
    assert listener.closed
    warnings = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
    assert 1 <= len(warnings) <= 2  # rate limited, not one per failure
    assert "client port" in warnings[0]


async def test_other_accept_errors_propagate() -> None:
    listener = FlakyListener([errno.EBADF], streams=0)

    async def handler(stream: trio.abc.Stream) -> None:
        raise AssertionError("not reached")

    with pytest.raises(ExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await accept_loop(listener, handler, nursery, "web")
    [error] = info.value.exceptions
    assert isinstance(error, OSError) and error.errno == errno.EBADF
    assert listener.closed


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)
