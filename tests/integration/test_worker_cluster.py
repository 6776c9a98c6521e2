"""The worker and the client in a real 3-node cluster under trouble: while
producers add jobs and a worker handles them, one node is killed with
SIGKILL and another leaves (CLUSTER LEAVING yes). Every job whose ADDJOB
was acknowledged must be handled at least once."""

from __future__ import annotations

import itertools
import signal
import time
from typing import Any

import anyio
import pytest

from disque_trio.client import AsyncClient, Client, DisqueError, Job
from disque_trio.worker import Worker

from .conftest import NodeProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _url(nodes: list[NodeProcess]) -> str:
    return "disque://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


def _cluster(node_factory: Any, count: int) -> list[NodeProcess]:
    nodes: list[NodeProcess] = [
        node_factory("--cluster-node-timeout", "1000") for _ in range(count)
    ]
    for a, b in itertools.pairwise(nodes):
        with Client(f"127.0.0.1:{a.port}") as c:
            c.call("CLUSTER", "MEET", "127.0.0.1", b.port)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sizes = []
        for n in nodes:
            with Client(f"127.0.0.1:{n.port}") as c:
                hello = c.hello()
            sizes.append(sum(p.priority == 1 for p in hello.nodes))
        if sizes == [count] * count:
            return nodes
        time.sleep(0.1)
    raise AssertionError("the cluster did not form")


async def test_no_acknowledged_job_is_lost_when_nodes_die_and_leave(node_factory: Any) -> None:
    nodes = _cluster(node_factory, 3)
    url = _url(nodes)
    acknowledged: set[str] = set()
    handled: dict[str, int] = {}
    refused: list[str] = []
    producing = True

    worker = Worker(url, dead_letter=False, shutdown_timeout=5, timeout=5.0)

    @worker.handler("chaos", concurrency=10)
    async def handle(job: Job) -> None:
        handled[job.id] = handled.get(job.id, 0) + 1
        await anyio.sleep(0.005)

    async def produce(index: int) -> None:
        async with AsyncClient(url, timeout=5.0) as client:
            n = 0
            while producing:
                n += 1
                try:
                    job_id = await client.add_job(
                        "chaos", f"{index}-{n}", replicate=2, retry=2, timeout_ms=3000
                    )
                    acknowledged.add(job_id)
                except DisqueError as e:  # not acknowledged: no promise to keep
                    refused.append(f"{type(e).__name__}: {e}")
                    await anyio.sleep(0.05)
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
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
            while not acknowledged <= handled.keys():
                await anyio.sleep(0.1)
        assert worker.client is not None
        state = (worker.client.current_node, worker.running, worker.client.router.nodes)
        worker.stop()
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
