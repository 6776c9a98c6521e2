"""The trace's fast paths (deliveries, bus messages, job events) write the
bytes ``record`` writes; the collector's thresholds during a run."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from sim import runner
from sim.trace import Trace, delivery_text


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


def _both_ways(
    fast: Callable[[Trace], None], slow: Callable[[Trace], None], at: float
) -> tuple[Trace, Trace]:
    """Each way once inside a run (at virtual time ``at``) and once outside."""
    a, b = Trace(), Trace()

    async def main() -> None:
        await trio.sleep(at)
        fast(a)
        slow(b)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    fast(a)
    slow(b)
    return a, b


texts = st.text(max_size=12)


@given(src=texts, dst=texts, size=st.integers(0, 1 << 20), at=st.floats(0, 1e6))
def test_a_pipes_delivery_text_writes_the_bytes_record_writes(
    src: str, dst: str, size: int, at: float
) -> None:
    between = delivery_text(src, dst)
    fast, slow = _both_ways(
        lambda t: t.record_delivery_between(between, size),
        lambda t: t.record("net", "deliver", {"src": src, "dst": dst, "len": size}),
        at,
    )
    assert fast.lines == slow.lines


@given(
    node=texts,
    ev=texts,
    msg=texts,
    peer_key=st.sampled_from(["from", "to"]),
    peer=texts,
    ids=st.lists(texts, max_size=4),
    at=st.floats(0, 1e6),
)
def test_record_bus_writes_the_bytes_record_writes(
    node: str, ev: str, msg: str, peer_key: str, peer: str, ids: list[str], at: float
) -> None:
    fast, slow = _both_ways(
        lambda t: t.record_bus(node, ev, msg, peer_key, peer, ids),
        lambda t: t.record(node, "bus", {"ev": ev, "msg": msg, peer_key: peer, "ids": ids}),
        at,
    )
    assert fast.lines == slow.lines


def test_record_bus_refuses_another_key() -> None:
    with pytest.raises(ValueError, match="peer_key"):
        Trace().record_bus("n1", "send", "ReplJob", "at", "abcdef12", [])


@given(node=texts, ev=texts, job_id=texts, via=st.none() | texts, at=st.floats(0, 1e6))
def test_record_job_writes_the_bytes_record_writes(
    node: str, ev: str, job_id: str, via: str | None, at: float
) -> None:
    data = {"ev": ev, "id": job_id} if via is None else {"ev": ev, "id": job_id, "via": via}
    fast, slow = _both_ways(
        lambda t: t.record_job(node, ev, job_id, via),
        lambda t: t.record(node, "job", data),
        at,
    )
    assert fast.lines == slow.lines


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
