"""The worker's batched acknowledgements (disque_trio/worker/acks.py) with
a scripted client: what finishes together leaves in one command, what
finishes while a command is on its way waits for the next one, a small
batch lingers for more, a batch is never larger than ``max_batch``, and a
failed command is every job's failure."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from disque_trio.client import DisqueConnectionError, DisqueError
from disque_trio.worker.acks import AckBatch, AckBatcher


class ScriptedClient:
    """Records each ACKJOB / FASTACK; each waits for ``release`` and fails
    if an error is queued for it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[str, ...]]] = []
        self.sent_at: list[float] = []
        self.release = trio.Event()
        self.errors: list[DisqueError | None] = []

    async def _answer(self, name: str, ids: tuple[str, ...]) -> int:
        self.sent.append((name, ids))
        self.sent_at.append(trio.current_time())
        await self.release.wait()
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        return len(ids)

    async def ack_job(self, *ids: str) -> int:
        return await self._answer("ACKJOB", ids)

    async def fast_ack(self, *ids: str) -> int:
        return await self._answer("FASTACK", ids)


def _add(batcher: AckBatcher, client: Any, job_id: str, fast: bool = False) -> AckBatch:
    return batcher.add(client, job_id, fast=fast)


async def test_one_command_per_pass_and_a_group_commit_while_one_is_out() -> None:
    client = ScriptedClient()
    batcher = AckBatcher(linger=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        first = [_add(batcher, client, f"a{i}") for i in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        assert client.sent == [("ACKJOB", ("a0", "a1", "a2"))]
        # On their way: what finishes now forms the next batch.
        later = [_add(batcher, client, f"b{i}") for i in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        assert len(client.sent) == 1 and not first[0].done.is_set()
        client.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert client.sent[1] == ("ACKJOB", ("b0", "b1"))
        assert all(b.done.is_set() and b.error is None for b in first + later)
        assert first[0] is first[2] and later[0] is later[1] and first[0] is not later[0]
        nursery.cancel_scope.cancel()


async def test_batches_are_bounded_and_kinds_are_apart() -> None:
    client = ScriptedClient()
    client.release.set()
    batcher = AckBatcher(max_batch=2, linger=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batches = [_add(batcher, client, f"j{i}", fast=i == 2) for i in range(6)]
        await trio.testing.wait_all_tasks_blocked()
        assert client.sent == [
            ("ACKJOB", ("j0", "j1")),
            ("FASTACK", ("j2",)),
            ("ACKJOB", ("j3", "j4")),
            ("ACKJOB", ("j5",)),
        ]
        assert all(b.error is None for b in batches)
        nursery.cancel_scope.cancel()


async def test_a_failed_command_is_the_failure_of_every_job_in_it() -> None:
    client = ScriptedClient()
    client.release.set()
    lost = DisqueConnectionError("connection lost")
    client.errors = [lost, None]
    batcher = AckBatcher(linger=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        failed = [_add(batcher, client, f"x{i}") for i in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        fine = _add(batcher, client, "y")
        await trio.testing.wait_all_tasks_blocked()
        assert [b.error for b in failed] == [lost, lost] and fine.error is None
        assert all(b.done.is_set() for b in [*failed, fine])
        nursery.cancel_scope.cancel()


async def test_a_small_batch_lingers_for_more(autojump_clock: trio.abc.Clock) -> None:
    """Jobs finishing one by one: a batch of fewer than ``small`` IDs waits
    ``linger`` for more; a batch of ``small`` or more leaves at once."""
    client = ScriptedClient()
    client.release.set()
    batcher = AckBatcher(linger=0.005, small=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        start = trio.current_time()
        _add(batcher, client, "a")
        await trio.sleep(0.002)  # within the linger: the same batch
        _add(batcher, client, "b")
        await trio.sleep(0.01)
        assert client.sent == [("ACKJOB", ("a", "b"))]
        assert client.sent_at[0] - start == pytest.approx(0.005)
        start = trio.current_time()
        for i in range(4):
            _add(batcher, client, f"c{i}")
        await trio.sleep(0.01)
        assert client.sent[1] == ("ACKJOB", ("c0", "c1", "c2", "c3"))
        assert client.sent_at[1] == start
        nursery.cancel_scope.cancel()


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AckBatcher(max_batch=0)
