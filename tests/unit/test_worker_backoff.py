"""The worker's retry back-off (Retries.backoff): min_backoff doubled for
each failure before this one, capped at max_backoff, a random part of it
from half to all, in the node's whole seconds; a handler's settings over
the worker's; 0 is a NACK at once."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from disque_trio.client import Job, ResponseError
from disque_trio.worker import HandlerSpec, JobContext, Retries


def _ctx(nacks: int, client: Any = None, **spec: Any) -> JobContext:
    async def handler(job: Job) -> None:
        pass

    job = Job("D-0", "q", b"", nacks=nacks)
    return JobContext(job, HandlerSpec("q", handler, **spec), None, client)  # type: ignore[arg-type]


def test_doubles_per_failure_up_to_the_cap_with_jitter() -> None:
    retries = Retries(min_backoff=2, max_backoff=40, rng=random.Random(7))
    for nacks, ceiling in enumerate([2, 4, 8, 16, 32, 40, 40]):
        seen = {retries.backoff(_ctx(nacks)) for _ in range(300)}
        assert seen <= set(range(math.ceil(ceiling / 2), ceiling + 1)), (nacks, seen)
        # Rounded up: half of it exactly is never drawn.
        assert min(seen) == ceiling // 2 + 1 and max(seen) == ceiling, (nacks, seen)


def test_many_failures_stay_at_the_cap() -> None:
    retries = Retries(min_backoff=1, max_backoff=300, rng=random.Random(1))
    assert 150 <= retries.backoff(_ctx(10_000)) <= 300


def test_the_handlers_settings_come_first() -> None:
    retries = Retries(min_backoff=5, max_backoff=5, rng=random.Random(3))
    assert {retries.backoff(_ctx(0)) for _ in range(50)} <= {3, 4, 5}
    assert retries.backoff(_ctx(3, min_backoff=0)) == 0  # NACK at once
    assert {retries.backoff(_ctx(3, max_backoff=1)) for _ in range(50)} == {1}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Retries(min_backoff=-1)
    with pytest.raises(ValueError):
        Retries(min_backoff=10, max_backoff=5)


class OldCluster:
    """A node linked to one of the release before: NACK DELAY is refused."""

    def __init__(self) -> None:
        self.nacks: list[tuple[tuple[str, ...], float | None]] = []

    async def nack(self, *ids: str, delay: float | None = None) -> int:
        self.nacks.append((ids, delay))
        if delay:
            raise ResponseError("NOTSUPPORTED", "DELAY needs every node on bus protocol 4")
        return len(ids)


async def test_a_refused_delay_is_a_nack_at_once(caplog: pytest.LogCaptureFixture) -> None:
    client = OldCluster()
    ctx = _ctx(2, client)

    async def fails() -> None:
        raise ValueError("down")

    await Retries(min_backoff=1, rng=random.Random(5))(ctx, fails)
    assert [ids for ids, _ in client.nacks] == [("D-0",), ("D-0",)]
    assert client.nacks[0][1] and client.nacks[1][1] is None
    assert (ctx.outcome, ctx.notes["nacked"], ctx.notes["retry_in"]) == ("failed", 1, 0)
    assert "NACK DELAY refused" in caplog.text
