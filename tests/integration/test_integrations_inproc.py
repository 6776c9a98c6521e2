"""The parts of the integrations a process test does not reach, in this
process against a real node: kombu's queue length, purge and basic_get
through the Celery transport, Dramatiq's join() and flush()."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from disque_trio.client import Client

from .conftest import NodeProcess


@pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
def test_kombu_queue_length_purge_and_get(node: NodeProcess) -> None:
    from kombu import Connection, Exchange, Queue

    import disque_trio.integrations.celery  # noqa: F401  (the disque:// scheme)

    queue = Queue("kq", Exchange("kq", type="direct"), routing_key="kq")
    with Connection(f"disque://127.0.0.1:{node.port}") as conn:
        producer = conn.Producer()
        for i in range(5):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key="kq", declare=[queue])
        channel = conn.default_channel
        assert queue(channel).queue_declare().message_count == 5
        message = queue(channel).get(no_ack=False)
        assert message is not None and message.payload == {"n": 0}
        assert message.delivery_info["redelivered"] is False
        message.reject(requeue=True)  # NACK: queued again at once
        assert queue(channel).queue_declare().message_count == 5
        assert queue(channel).purge() == 5
        assert queue(channel).queue_declare().message_count == 0
        producer.publish({"n": 9}, exchange=queue.exchange, routing_key="kq", declare=[queue])
        message = queue(channel).get(no_ack=True)
        assert message is not None and message.payload == {"n": 9}
    with Client(f"127.0.0.1:{node.port}") as c:
        # Every job acknowledged (the no_ack one at delivery): none left.
        assert list(c.jscan(queue="kq")) == []


@pytest.mark.skipif(
    importlib.util.find_spec("dramatiq") is None, reason="dramatiq is not installed ('.[test]')"
)
def test_dramatiq_join_and_flush(node: NodeProcess) -> None:
    import dramatiq

    from disque_trio.integrations.dramatiq import DisqueBroker

    broker = DisqueBroker(f"disque://127.0.0.1:{node.port}", retry=5)
    done: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="jq")
    def work(n: int) -> None:
        done.append(n)

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        sent: list[Any] = [work.send(i) for i in range(50)]
        assert all(m.options["disque_job_id"].startswith("D-") for m in sent)
        broker.join("jq", timeout=20_000)
        worker.join()
        assert sorted(done) == list(range(50))
    finally:
        worker.stop()
    for i in range(20):
        work.send(i)
    broker.flush("jq")
    broker.join("jq", timeout=5_000)  # nothing left: flushed
    assert len(done) == 50
    broker.close()


@pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
def test_kombu_expiration_is_the_jobs_ttl_but_not_for_a_celery_task_that_expires(
    node: NodeProcess,
) -> None:
    """A message's expiration is its job's TTL, so the cluster drops it
    then; a Celery task sent with ``expires`` (which sets the expiration
    too) keeps the transport's TTL: its worker must see it to revoke it and
    store REVOKED, or whoever waits on its result waits for ever."""
    from kombu import Connection, Exchange, Queue

    import disque_trio.integrations.celery  # noqa: F401  (the disque:// scheme)

    queue = Queue("eq", Exchange("eq", type="direct"), routing_key="eq")
    with Connection(f"disque://127.0.0.1:{node.port}") as conn:
        producer = conn.Producer()
        producer.publish(
            {"plain": 1}, exchange=queue.exchange, routing_key="eq", declare=[queue], expiration=5
        )
        producer.publish(
            {"task": 1},
            exchange=queue.exchange,
            routing_key="eq",
            declare=[queue],
            expiration=5,
            headers={"task": "t.add", "id": "x", "expires": "2026-12-07T00:00:05+00:00"},
        )
    with Client(f"127.0.0.1:{node.port}") as c:
        ttls = sorted(c.show(job_id).ttl for job_id in c.jscan(queue="eq"))
    assert len(ttls) == 2
    assert ttls[0] <= 5  # the plain message: its expiration
    assert ttls[1] > 3600  # the task: the transport's TTL (a day by default)


@pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
def test_kombu_a_broadcast_that_came_while_getjob_waited_goes_before_its_jobs(
    node: NodeProcess,
) -> None:
    """A revoke published before the task it names, read by the listener
    while GETJOB waited, reaches the consumer before the task does."""
    import json

    from kombu import Connection, Exchange, Queue

    import disque_trio.integrations.celery  # noqa: F401  (the disque:// scheme)

    jobs = Queue("oq", Exchange("oq", type="direct"), routing_key="oq")
    broadcasts = Queue("obq", Exchange("obc", type="fanout"))
    got: list[Any] = []
    with Connection(f"disque://127.0.0.1:{node.port}") as conn:
        channel = conn.default_channel

        def take(body: Any, message: Any) -> None:
            got.append(body)
            message.ack()

        with conn.Consumer([jobs, broadcasts], callbacks=[take], channel=channel):
            client = channel._fetch_client()
            real = client.get_jobs

            def get_jobs(*args: Any, **kwargs: Any) -> Any:
                fetched = real(*args, **kwargs)
                if fetched:  # what the listener thread does meanwhile
                    revoke = channel.prepare_message(
                        json.dumps({"revoke": 1}), 0, "application/json", "utf-8", {}, {}
                    )
                    channel.take_broadcast(revoke, "obq")
                return fetched

            client.get_jobs = get_jobs  # type: ignore[method-assign]
            conn.Producer().publish(
                {"task": 1}, exchange=jobs.exchange, routing_key="oq", declare=[jobs]
            )
            for _ in range(20):
                if len(got) == 2:
                    break
                conn.drain_events(timeout=1)
    assert got == [{"revoke": 1}, {"task": 1}]


@pytest.mark.skipif(
    importlib.util.find_spec("dramatiq") is None, reason="dramatiq is not installed ('.[test]')"
)
def test_dramatiq_join_raises_a_failed_messages_error_and_messages_come_unchanged(
    node: NodeProcess,
) -> None:
    """As Dramatiq's StubBroker: ``join`` raises the error of a message of
    the queue that failed for good (not with ``fail_fast=False``, and not
    after ``flush``), and the message a worker gets is the one ``send()``
    returned (Dramatiq's own tests compare them)."""
    import dramatiq
    from dramatiq.middleware import CurrentMessage

    from disque_trio.integrations.dramatiq import DisqueBroker

    broker = DisqueBroker(f"disque://127.0.0.1:{node.port}", retry=5)
    broker.add_middleware(CurrentMessage())
    got: list[Any] = []

    class Boom(Exception):
        pass

    @dramatiq.actor(broker=broker, queue_name="fq", max_retries=0)
    def fail(n: int) -> None:
        got.append(CurrentMessage.get_current_message()._message)
        if n:
            raise Boom(n)

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        sent = fail.send(0)
        broker.join("fq", timeout=10_000)  # nothing failed: returns
        worker.join()
        assert got == [sent]
        fail.send(7)
        with pytest.raises(Boom):
            broker.join("fq", timeout=10_000)
        broker.join("fq", timeout=10_000, fail_fast=False)
        assert [str(m._exception) for m in broker.dead_letters] == ["7"]
        broker.flush("fq")
        broker.join("fq", timeout=10_000)  # forgotten with the queue's jobs
    finally:
        worker.stop()
        broker.close()


@pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
def test_kombu_get_nowait_finds_what_it_just_put_on_three_nodes(node_factory: object) -> None:
    """SimpleQueue.put() then get_nowait(): the job is queued on the node
    the process published to, which need not be the one its channel
    fetches from (kombu's suite missed it 7 times in 10)."""
    from kombu import Connection

    import disque_trio.integrations.celery  # noqa: F401  (the disque:// scheme)

    from .conftest import form_cluster, url_of

    nodes = form_cluster(node_factory, 3)
    missed = 0
    for attempt in range(10):
        with Connection(url_of(nodes)) as conn, conn.SimpleQueue(f"sq{attempt}") as queue:
            queue.put({"n": attempt})
            try:
                message = queue.get_nowait()
            except queue.Empty:
                missed += 1
                continue
            assert message.payload == {"n": attempt}
            message.ack()
    assert missed == 0
