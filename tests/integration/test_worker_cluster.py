"""The worker and the client in a real 3-node cluster under trouble: while
producers add jobs and a worker handles them, one node is killed with
SIGKILL and another leaves (CLUSTER LEAVING yes). Every job whose ADDJOB
was acknowledged must be handled at least once; jobs that fail every time
must reach the dead-letter queue; stop() must let a running handler finish
within its deadline and give back (ENQUEUE) one that does not."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import anyio
import pytest

from disque_trio.client import AsyncClient, Client, DisqueError, Job, JobInfo
from disque_trio.worker import DeadLetter, Worker

from .conftest import NodeProcess, form_cluster, url_of

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _jobs(node: NodeProcess, queue: str) -> list[JobInfo]:
    """What SHOW says of every job of ``queue`` this node holds (JSCAN)."""
    with Client(f"127.0.0.1:{node.port}") as c:
        jobs = list(c.jscan_jobs(queue=queue))
        assert c.current_node is not None and c.current_node[1] == node.port
    return jobs


def _dead_letters(nodes: list[NodeProcess], queue: str) -> dict[str, DeadLetter]:
    """The dead letters the given nodes hold for ``queue``, by their own
    job ID (queued or not: a letter whose queued copy died with a node
    waits for its RETRY on the others)."""
    return {
        info.id: DeadLetter.from_body(info.body)
        for n in nodes
        for info in _jobs(n, queue + ":dead")
    }


async def test_no_acknowledged_job_is_lost_when_nodes_die_and_leave(
    node_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the faults, jobs whose body says "poison" fail every time:
    they must end in the dead-letter queue, with their error, and never
    count as done. At the end, stop() with two handlers running: one
    finishes within shutdown_timeout and is acknowledged, the other is
    cancelled at the deadline and given back."""
    # DEBUG: the job log's "done" lines (docs/worker.md, "Logs").
    caplog.set_level(logging.DEBUG, logger="disque_trio.worker")
    nodes = form_cluster(node_factory, 3)
    url = url_of(nodes)
    acknowledged: set[str] = set()
    poison: set[str] = set()  # acknowledged poison jobs
    handled: dict[str, int] = {}
    refused: list[str] = []
    producing = True
    stopping = anyio.Event()
    inside: set[str] = set()  # handlers running now

    shutdown_timeout = 1.0
    worker = Worker(url, shutdown_timeout=shutdown_timeout, timeout=5.0)

    @worker.handler("chaos", concurrency=10)
    async def handle(job: Job) -> None:
        handled[job.id] = handled.get(job.id, 0) + 1
        inside.add(job.id)
        try:
            if job.body.startswith(b"poison"):
                raise RuntimeError(f"cannot handle {job.text}")
            if job.body == b"finishes":
                await stopping.wait()
                await anyio.sleep(0.3)
            elif job.body == b"hangs":
                await anyio.sleep(60)
            await anyio.sleep(0.005)
        finally:
            inside.discard(job.id)

    def outcomes() -> dict[str, list[str]]:
        """Each job's outcomes, in order, from the worker's job log."""
        seen: dict[str, list[str]] = {}
        for r in caplog.records:
            if getattr(r, "event", "") == "job":
                seen.setdefault(r.job_id, []).append(r.outcome)  # type: ignore[attr-defined]
        return seen

    async def produce(index: int) -> None:
        async with AsyncClient(url, timeout=5.0) as client:
            n = 0
            while producing:
                n += 1
                body = f"{index}-{n}" if n % 8 else f"poison {index}-{n}"
                try:
                    job_id = await client.add_job(
                        "chaos", body, replicate=2, retry=2, timeout_ms=3000
                    )
                    acknowledged.add(job_id)
                    if body.startswith("poison"):
                        poison.add(job_id)
                except DisqueError as e:  # not acknowledged: no promise to keep
                    refused.append(f"{type(e).__name__}: {e}")
                    await anyio.sleep(0.05)
                await anyio.sleep(0.01)

    def settled() -> bool:
        dead = {i for i, seen in outcomes().items() if "dead" in seen}
        return acknowledged <= handled.keys() and poison <= dead

    returned = anyio.Event()

    async def run_worker(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await worker.run(task_status=task_status)
        returned.set()

    async with anyio.create_task_group() as tg:
        await tg.start(run_worker)
        for i in range(2):
            tg.start_soon(produce, i)
        await anyio.sleep(2.0)
        killed = nodes[2]
        killed.kill(signal.SIGKILL)
        await anyio.sleep(2.0)
        with Client(f"127.0.0.1:{nodes[1].port}") as admin:
            assert admin.call("CLUSTER", "LEAVING", "yes") == "OK"
        await anyio.sleep(3.0)
        producing = False
        await anyio.sleep(0.5)
        with anyio.move_on_after(60):
            while not settled():
                await anyio.sleep(0.1)
        assert worker.client is not None
        state = (worker.client.current_node, worker.running, worker.client.router.nodes)
        # Graceful shutdown with two handlers running.
        async with AsyncClient(url_of(nodes[:2]), timeout=5.0) as client:
            finishes = await client.add_job("chaos", "finishes", replicate=1, retry=30)
            hangs = await client.add_job("chaos", "hangs", replicate=1, retry=30)
            with anyio.fail_after(10):
                while not {finishes, hangs} <= inside:
                    await anyio.sleep(0.02)
            t0 = anyio.current_time()
            worker.stop()
            stopping.set()
            with anyio.fail_after(30):
                await returned.wait()
            stop_took = anyio.current_time() - t0
            finished_info = await client.show(finishes)
            hung_info = await client.show(hangs)
    missing = acknowledged - handled.keys()
    summary = (
        f"acknowledged {len(acknowledged)}, handled {len(handled)}, "
        f"twice or more {sum(c > 1 for c in handled.values())}, refused {len(refused)} "
        f"({sorted({r.split(':')[0] for r in refused})})"
    )
    assert len(acknowledged) > 100, (summary, refused[:5])
    if missing:  # what the nodes know about the first few, for the report
        print(summary, "\nworker state", state)
        for n in nodes[:2]:
            with Client(f"127.0.0.1:{n.port}") as c:
                print(n.port, "QLEN", c.qlen("chaos"), "HELLO", c.hello())
                for job_id in sorted(missing)[:5]:
                    print("  ", c.show(job_id))
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged jobs never handled"

    # The dead-letter path: every poison job was moved, with the error that
    # made it fail, and none was ever done; no other job was moved.
    seen = outcomes()
    assert len(poison) > 10, summary
    not_dead = {i: seen.get(i) for i in poison if "dead" not in seen.get(i, [])}
    assert not not_dead, f"{len(not_dead)} of {len(poison)} poison jobs not dead-lettered"
    assert not [i for i in poison if "done" in seen[i]]
    assert not [i for i, o in seen.items() if i not in poison and "dead" in o]
    letters = _dead_letters(nodes[:2], "chaos")
    assert poison <= {x.id for x in letters.values()}, "dead letters missing"
    assert all(x.queue == "chaos" and x.body.startswith(b"poison") for x in letters.values())
    # Every letter the worker logged as added is on the surviving nodes,
    # with the error it logged.
    for r in caplog.records:
        if getattr(r, "event", "") == "job" and r.outcome == "dead":  # type: ignore[attr-defined]
            letter = letters.get(r.dead_letter_id)  # type: ignore[attr-defined]
            assert letter is not None and letter.id == r.job_id, r.getMessage()  # type: ignore[attr-defined]
            assert letter.error == r.error, (letter, r.getMessage())  # type: ignore[attr-defined]
    # A letter names the handler's error, at the failure of a delivery that
    # came with max_retries (4) NACKs or more, whatever the additional
    # deliveries (a copy queued again at its RETRY while a node was out
    # counts one, and is no failure); or, past max_deliveries (20)
    # deliveries of any kind, the worker's own reason, and the handler did
    # not run again.
    named = 0
    for letter in letters.values():
        if letter.error == f"RuntimeError: cannot handle {letter.body.decode()}":
            assert letter.nacks >= 4 or letter.deliveries == 20, letter
            assert "raise RuntimeError" in letter.traceback, letter
            named += 1
        else:
            assert letter.error == (
                f"RuntimeError: delivered {letter.deliveries} times (limit 20) without a verdict"
            ), letter
            assert letter.deliveries > 20 and not letter.traceback, letter
    assert named, [x.error for x in letters.values()]
    # And moved means acknowledged: no survivor holds one still alive.
    left = [(i.id, i.state) for n in nodes[:2] for i in _jobs(n, "chaos") if i.id in poison]
    assert all(state == "acked" for _, state in left), left

    # Graceful shutdown: run() returned after the grace period, once the
    # hung handler was cancelled and its job given back (within nack_timeout);
    # the other finished within it and was acknowledged; no handler is
    # left running.
    assert shutdown_timeout <= stop_took < shutdown_timeout + worker.retries.nack_timeout
    assert seen[finishes] == ["done"] and seen[hangs] == ["interrupted"]
    assert handled[finishes] == handled[hangs] == 1
    assert finished_info is None or finished_info.state == "acked", finished_info
    assert hung_info is not None and hung_info.state == "queued"
    assert (hung_info.nacks, hung_info.additional_deliveries) == (0, 1)
    assert worker.running == 0 and not inside


@pytest.mark.parametrize("out", ["killed", "leaving"])
async def test_dead_letters_are_kept_with_fewer_copies_when_nodes_are_out(
    node_factory: Any, caplog: pytest.LogCaptureFixture, out: str
) -> None:
    """A regression: the dead-letter ADDJOB asked for the node's default
    replication, min(3, cluster size), which counts failed (and, before
    issue 57, leaving) nodes; with one of them out it was refused (NOREPL)
    every time, so the job was NACKed, came back at once past its limit,
    and cycled for as long as the node stayed out, never dead-lettered.
    With the other node killed, the letter is kept with fewer copies; with
    it leaving, the default counts it out and the letter is kept at once."""
    a, b = form_cluster(node_factory, 2)
    if out == "leaving":
        with Client(f"127.0.0.1:{b.port}") as admin:
            assert admin.call("CLUSTER", "LEAVING", "yes") == "OK"
    else:
        b.kill()
    with Client(f"127.0.0.1:{a.port}") as c:
        deadline = time.monotonic() + 10
        # a heard b leave (priority 100), or suspects it (fail?: 10)
        while not any(p.priority >= 10 for p in c.hello().nodes):
            assert time.monotonic() < deadline, f"{out}: not heard"
            time.sleep(0.05)
        job_id = c.add_job("poison", "bad", replicate=1)
    worker = Worker(f"disque://127.0.0.1:{a.port}", max_deliveries=2, follow_producers=False)
    attempts: list[int] = []

    @worker.handler("poison")
    async def fail(job: Job) -> None:
        attempts.append(job.deliveries)
        raise ValueError("always")

    with caplog.at_level(logging.WARNING, logger="disque_trio.worker"):
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.move_on_after(5):
                while not any(
                    getattr(r, "event", "") == "job" and r.outcome == "dead"  # type: ignore[attr-defined]
                    for r in caplog.records
                ):
                    await anyio.sleep(0.02)
            worker.stop()
    with Client(f"127.0.0.1:{a.port}") as c:
        letters = [DeadLetter.from_body(i.body) for i in c.jscan_jobs(queue="poison:dead")]
        info = c.show(job_id)
    outcomes = [r.outcome for r in caplog.records if getattr(r, "event", "") == "job"]  # type: ignore[attr-defined]
    assert outcomes == ["failed", "dead"], outcomes[:10]  # NACKed once, then moved
    assert attempts == [1, 2]
    assert [(x.id, x.error, x.deliveries) for x in letters] == [(job_id, "ValueError: always", 2)]
    assert info is None or info.state == "acked"
    fewer = [r for r in caplog.records if getattr(r, "event", "") == "dead-letter-fewer-copies"]
    if out == "killed":
        assert fewer and "NOREPL" in fewer[0].getMessage()
    else:
        assert fewer == []
