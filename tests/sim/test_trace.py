"""The trace's fast path for deliveries, and the collector's thresholds
during a run."""

from __future__ import annotations

import gc

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from sim import runner
from sim.trace import Trace


@given(
    src=st.text(max_size=12),
    dst=st.text(max_size=12),
    size=st.integers(0, 1 << 20),
    at=st.floats(0, 1e6, allow_nan=False),
)
def test_record_delivery_writes_the_bytes_record_writes(
    src: str, dst: str, size: int, at: float
) -> None:
    fast, slow = Trace(), Trace()

    async def main() -> None:
        await trio.sleep(at)
        fast.record_delivery(src, dst, size)
        slow.record("net", "deliver", {"src": src, "dst": dst, "len": size})

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    fast.record_delivery(src, dst, size)  # outside a run: time 0, as record
    slow.record("net", "deliver", {"src": src, "dst": dst, "len": size})
    assert fast.lines == slow.lines
    assert fast.digest() == slow.digest()


def test_a_run_collects_less_often_and_restores_the_thresholds() -> None:
    saved = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    try:
        gc.set_threshold(700, 11, 12)
        with runner._collector_tuned():
            seen.append(gc.get_threshold())
        seen.append(gc.get_threshold())
        try:
            with runner._collector_tuned():
                raise KeyError("a run that breaks")
        except KeyError:
            pass
        seen.append(gc.get_threshold())
    finally:
        gc.set_threshold(*saved)
    assert seen == [(runner.RUN_GC_THRESHOLD, 11, 12), (700, 11, 12), (700, 11, 12)]
