"""NACK/ENQUEUE with DELAY and WAITJOB through real nodes: one node with
redis-py and the client, a 3-node cluster for what crosses nodes, and a
restart under SIGKILL for what the AOF keeps."""

from __future__ import annotations

import signal
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis

from disque_trio.client import AsyncClient, Client, Job, JobNodeUnavailableError

from .conftest import NodeProcess, form_cluster, url_of

pytestmark = pytest.mark.slow


def _direct(node: NodeProcess) -> Client:
    """A client held to one node (no following producers, no routing)."""
    return Client(f"127.0.0.1:{node.port}", follow_producers=False, route_by_job_id=False)


def _take(client: Client, queue: str, seconds: float) -> list[Job]:
    """Whatever GETJOB brings from ``queue`` within ``seconds``."""
    got: list[Job] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += client.get_jobs(queue, count=10, timeout=min(0.2, deadline - time.monotonic()))
    return got


def _first(client: Client, queue: str, seconds: float) -> Job | None:
    """The first job GETJOB brings from ``queue`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        jobs = client.get_jobs(queue, timeout=min(0.2, deadline - time.monotonic()))
        if jobs:
            return jobs[0]
    return None


def test_nack_delay_on_one_node_through_redis_py(node: NodeProcess) -> None:
    r = redis.Redis(port=node.port, decode_responses=True, socket_timeout=10)
    job_id = r.execute_command("ADDJOB", "q", "body", 0, "RETRY", 1)
    [[_, got, _]] = r.execute_command("GETJOB", "FROM", "q")
    assert got == job_id
    nacked_at = time.monotonic()
    assert r.execute_command("NACK", job_id, "DELAY", 3) == 1
    show = r.execute_command("SHOW", job_id)
    fields = dict(zip(show[::2], show[1::2], strict=True))
    assert fields["delayed-requeue"] == 1 and fields["state"] == "active"
    assert 2_000 < fields["next-requeue-within"] <= 3_000
    # RETRY 1 would have queued it after a second: the delay holds it.
    reply = r.execute_command("GETJOB", "TIMEOUT", 2_500, "WITHCOUNTERS", "FROM", "q")
    assert reply is None
    reply = r.execute_command("GETJOB", "TIMEOUT", 3_000, "WITHCOUNTERS", "FROM", "q")
    assert time.monotonic() - nacked_at >= 2.9
    assert reply == [["q", job_id, "body", "nacks", 1, "additional-deliveries", 0]]
    assert r.execute_command("WAITJOB", job_id, "TIMEOUT", 50) == ["pending"]
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("WAITJOB", job_id) == ["acked"]


def test_the_client_schedules_nacks_and_new_jobs(node: NodeProcess) -> None:
    with Client(f"127.0.0.1:{node.port}") as c:
        later = c.add_job("s", "later", delay=2, retry=30)
        at = c.add_job("s", "at", eta=datetime.now() + timedelta(seconds=2), retry=30)
        assert c.show(later).state == c.show(at).state == "active"  # type: ignore[union-attr]
        assert _take(c, "s", 1.5) == []
        assert sorted(j.id for j in _take(c, "s", 1.5)) == sorted([later, at])
        assert c.nack(later, delay=1.5) == 1  # whole seconds, rounded up: 2
        assert c.enqueue(at, delay=1) == 1
        info = c.show(later)
        assert info is not None and info.delayed_requeue and info.nacks == 1
        assert [j.id for j in _take(c, "s", 1.5)] == [at]
        job = _first(c, "s", 1.5)
        assert job is not None and job.id == later and job.nacks == 1
        assert c.ack_job(later, at) == 2
        assert c.wait_jobs(later, at) == {later: "acked", at: "acked"}


def test_a_delay_survives_a_kill_9(node_factory: Any) -> None:
    node: NodeProcess = node_factory("--appendonly", "yes", "--appendfsync", "always")
    with _direct(node) as c:
        job_id = c.add_job("q", "body", retry=1)
        assert [j.id for j in c.get_jobs("q")] == [job_id]
        assert c.nack(job_id, delay=6) == 1
        nacked_at = time.monotonic()
    node.kill(signal.SIGKILL)
    node.start()
    with _direct(node) as c:
        info = c.show(job_id)
        assert info is not None and info.delayed_requeue
        assert _first(c, "q", 5.0 - (time.monotonic() - nacked_at)) is None
        job = _first(c, "q", 3.0)
        assert time.monotonic() - nacked_at >= 5.9
        assert job is not None and job.id == job_id and job.nacks == 1


def test_no_holder_queues_a_nacked_job_before_its_delay(node_factory: Any) -> None:
    """Added on node 0 with three copies and RETRY 1, fetched on node 1,
    NACKed there with DELAY 4: consumers blocked on all three nodes get
    nothing for 4 s (the other holders would have re-queued their copies
    after a second), then one of them gets it."""
    nodes = form_cluster(node_factory, 3)
    with _direct(nodes[0]) as producer:
        job_id = producer.add_job("d", "body", replicate=3, retry=1, ttl=60)
    with _direct(nodes[1]) as worker:
        job = _first(worker, "d", 10.0)
        assert job is not None and job.id == job_id
        assert worker.nack(job_id, delay=4) == 1
        nacked_at = time.monotonic()
    got: list[tuple[float, int]] = []

    def consume(n: NodeProcess) -> None:
        with _direct(n) as c:
            while (job := _first(c, "d", 7.0 - (time.monotonic() - nacked_at))) is not None:
                got.append((time.monotonic() - nacked_at, n.port))
                c.ack_job(job.id)

    threads = [threading.Thread(target=consume, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1, got
    assert 3.5 <= got[0][0] <= 6.0, got


def test_waitjob_on_the_maker_hears_an_ack_made_elsewhere(node_factory: Any) -> None:
    nodes = form_cluster(node_factory, 3)
    with _direct(nodes[0]) as producer:
        job_id = producer.add_job("w", "body", replicate=3, retry=30)
    acked_at: list[float] = []

    def consume() -> None:
        with _direct(nodes[1]) as c:
            job = _first(c, "w", 10.0)
            assert job is not None
            time.sleep(0.5)
            acked_at.append(time.monotonic())
            assert c.ack_job(job.id) == 1

    consumer = threading.Thread(target=consume)
    consumer.start()
    # Routed to node 0 (the job's maker), from a client connected to node 2.
    with Client(f"127.0.0.1:{nodes[2].port}", follow_producers=False) as waiter:
        waiter.hello()
        outcome = waiter.wait_job(job_id, timeout=15)
        answered_at = time.monotonic()
    consumer.join()
    assert outcome == "acked"
    assert answered_at - acked_at[0] < 1.0
    r = redis.Redis(port=nodes[0].port, decode_responses=True)
    assert r.execute_command("WAITJOB", job_id, "TIMEOUT", 100) == ["acked"]


async def test_wait_job_says_so_when_the_jobs_node_is_gone(node_factory: Any) -> None:
    nodes = form_cluster(node_factory, 3)
    async with AsyncClient(url_of(nodes[:1]), follow_producers=False) as c:
        job_id = await c.add_job("g", "body", replicate=1, retry=30)
        other = await c.add_job("g", "body", replicate=3, retry=30)
    nodes[0].kill(signal.SIGKILL)
    async with AsyncClient(url_of(nodes[1:]), follow_producers=False, timeout=3) as c:
        await c.hello()
        with pytest.raises(JobNodeUnavailableError, match="out of reach"):
            await c.wait_job(job_id, timeout=1)
        # A copy lives on another node, which answers for it.
        assert await c.wait_job(other, timeout=0.5) == "pending"
