"""Results from a worker, the pattern docs/worker.md shows: the producer
names a reply queue in the job, the handler adds its result there before
it returns (so before the job's ack), and the producer waits for the jobs
(WAITJOB) and then reads the replies. Through a real node, under Trio."""

from __future__ import annotations

import json
import uuid

import anyio
import pytest

from disque_trio.client import AsyncClient, Job
from disque_trio.worker import Worker

from .conftest import NodeProcess

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_a_reply_queue_carries_each_result_back(node: NodeProcess) -> None:
    url = f"disque://127.0.0.1:{node.port}"
    worker = Worker(url, fetch_timeout=0.2, max_deliveries=1)

    @worker.handler("square", concurrency=4)
    async def square(job: Job) -> None:
        request = json.loads(job.body)
        if request["n"] < 0:
            raise ValueError("no negative numbers")
        assert worker.client is not None  # set while the worker runs
        result = {"job": job.id, "value": request["n"] ** 2}
        await worker.client.add_job(request["reply_to"], json.dumps(result), ttl=600)

    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: worker.run(handle_signals=False, task_status=task_status)
        )
        async with AsyncClient(url) as producer:
            reply_to = f"replies:{uuid.uuid4()}"
            ids = [
                await producer.add_job("square", json.dumps({"n": n, "reply_to": reply_to}))
                for n in range(5)
            ]
            outcomes = await producer.wait_jobs(*ids, timeout=20)
            assert list(outcomes.values()) == ["acked"] * 5
            replies = await producer.get_jobs(reply_to, count=10, nohang=True)
            values = {json.loads(r.body)["job"]: json.loads(r.body)["value"] for r in replies}
            assert values == {job_id: n * n for n, job_id in enumerate(ids)}
            await producer.ack_job(*(r.id for r in replies))
            # A job that fails for good is acknowledged too, once its dead
            # letter is added: no reply, and the letter names it.
            bad = await producer.add_job("square", json.dumps({"n": -1, "reply_to": reply_to}))
            assert await producer.wait_job(bad, timeout=20) == "acked"
            assert await producer.get_jobs(reply_to, nohang=True) == []
            [letter] = await producer.get_jobs("square:dead", nohang=True)
            assert json.loads(letter.body)["id"] == bad
        worker.stop(now=True)
