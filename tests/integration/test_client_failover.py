"""Issue 57, the client's side, through real node processes: a consumer
holding a job when the node that delivered it is killed tells another
node holding a copy (WORKING), so that the job is not queued again while
it still runs; and a producer's ADDJOB goes to another node when refused
(-NOREPL) or when its connection is lost, so that a rolling restart
(docs/operations.md) goes unnoticed.

Every consumer here is seeded with the first node only (it learns the
others from HELLO), so that the node that delivers its job is known: that
one is killed."""

from __future__ import annotations

import importlib.util
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from disque_trio.client import (
    AsyncClient,
    Client,
    ConnectionLostError,
    DisqueError,
    Job,
    JobInfo,
    NoReplError,
)
from disque_trio.worker import Worker

from .conftest import NodeProcess, form_cluster, url_of

pytestmark = pytest.mark.slow

RETRY = 8  # seconds: the jobs' RETRY
HELD_FOR = 2.5  # seconds a job is held before its node is killed
# A survivor's next re-queue is this close to RETRY once a WORKING reached
# it; held HELD_FOR seconds without one, it is about RETRY - HELD_FOR.
PUSHED_MS = (RETRY - 1.5) * 1000


def _direct(node: NodeProcess) -> Client:
    return Client(f"127.0.0.1:{node.port}", follow_producers=False, route_by_job_id=False)


def _show(node: NodeProcess, job_id: str) -> JobInfo | None:
    with _direct(node) as c:
        return c.show(job_id)


def _wait(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Poll ``check`` every 50 ms; the seconds it took."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


async def _await(what: str, check: Callable[[], bool], timeout: float) -> float:
    t0 = anyio.current_time()
    while not check():
        assert anyio.current_time() - t0 < timeout, f"timed out after {timeout} s: {what}"
        await anyio.sleep(0.05)
    return anyio.current_time() - t0


def _cluster(node_factory: Any) -> tuple[list[NodeProcess], str]:
    nodes = form_cluster(node_factory, 3)
    return nodes, f"disque://127.0.0.1:{nodes[0].port}"


def _add(node: NodeProcess, queue: str, body: str = "work") -> str:
    """A job on ``node`` with a copy on every node (REPLICATE 3 of 3)."""
    with _direct(node) as c:
        return c.add_job(queue, body, replicate=3, retry=RETRY)


def _not_pushed_yet(survivors: list[NodeProcess], job_id: str) -> None:
    """Held HELD_FOR seconds: every survivor's re-queue is due sooner than
    PUSHED_MS (so that a later push is the consumer's doing)."""
    for node in survivors:
        info = _show(node, job_id)
        assert info is not None and info.state == "active", info
        assert info.next_requeue_within is not None
        assert info.next_requeue_within < PUSHED_MS, info


def _pushed(survivors: list[NodeProcess], job_id: str) -> bool:
    """A survivor's re-queue was pushed to about RETRY from now, and no
    survivor queued the job."""
    infos = [_show(n, job_id) for n in survivors]
    assert all(i is not None and i.state != "queued" for i in infos), infos
    return any((i.next_requeue_within or 0) > PUSHED_MS for i in infos if i is not None)


def _acked_everywhere(survivors: list[NodeProcess], job_id: str) -> bool:
    infos = [_show(n, job_id) for n in survivors]
    return all(i is None or i.state == "acked" for i in infos)


def _nothing_queued(survivors: list[NodeProcess], queue: str) -> None:
    for node in survivors:
        with _direct(node) as c:
            assert c.qlen(queue) == 0 and c.get_jobs(queue, nohang=True) == []


def _kill_the_deliverer(nodes: list[NodeProcess], job_id: str) -> None:
    """Kill the first node (the one that delivered the job, held HELD_FOR
    seconds), the survivors' re-queue not pushed yet."""
    _not_pushed_yet(nodes[1:], job_id)
    nodes[0].kill(signal.SIGKILL)


# ------------------------------------------------------------ consumers


def test_a_blocking_consumer_keeps_its_job_alive_when_its_node_is_killed(
    node_factory: Any,
) -> None:
    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    job_id = _add(nodes[0], "held")
    with Client(seed, follow_producers=False) as consumer:
        job = consumer.get_job("held", timeout=5)
        assert job is not None and job.id == job_id
        assert consumer.router.held.node_of(job_id) == ("127.0.0.1", nodes[0].port)
        assert consumer.check_held() is None  # its node answers: nothing to do
        time.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        t0 = time.monotonic()
        result = consumer.check_held()  # what a consumer calls now and then
        took = time.monotonic() - t0
        assert result is not None and [job_id] in result.moved.values(), result
        assert _pushed(survivors, job_id) and took < 1.0, took
        assert consumer.ack_job(job_id) == 1  # at the node that took the WORKING
        _wait("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 5)
    _nothing_queued(survivors, "held")


def test_any_call_of_a_blocking_consumer_that_finds_its_node_gone_keeps_its_job(
    node_factory: Any,
) -> None:
    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    job_id = _add(nodes[0], "held")
    with Client(seed, follow_producers=False) as consumer:
        job = consumer.get_job("held", timeout=5)
        assert job is not None and job.id == job_id
        time.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        # The next fetch finds the node gone, moves, and says WORKING.
        assert consumer.get_jobs("held", nohang=True) == []
        assert _pushed(survivors, job_id)
        assert consumer.ack_job(job_id) == 1
        _wait("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 5)
    _nothing_queued(survivors, "held")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio", "asyncio"])
async def test_an_async_consumer_watching_its_jobs_keeps_them_alive(
    node_factory: Any, anyio_backend: str
) -> None:
    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    job_id = _add(nodes[0], "held")
    async with (
        AsyncClient(seed, follow_producers=False) as consumer,
        anyio.create_task_group() as tg,
    ):
        await tg.start(consumer.watch_held)
        job = await consumer.get_job("held", timeout=5)
        assert job is not None and job.id == job_id
        await anyio.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        took = await _await("the WORKING", lambda: _pushed(survivors, job_id), 5)
        assert took < 2.0, took  # the watch looks every 0.5 s
        assert await consumer.ack_job(job_id) == 1
        tg.cancel_scope.cancel()
    _wait("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 5)
    _nothing_queued(survivors, "held")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_worker_keeps_a_running_job_alive_when_its_node_is_killed(
    node_factory: Any, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's own keep-alive would send WORKING only at 0.9 of RETRY
    (7.2 s): the push within a second or two of the kill is the client's
    watch. The job, acknowledged once the handler returns, runs once."""
    caplog.set_level(logging.DEBUG, logger="disque_trio.worker")
    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    job_id = _add(nodes[0], "work")
    worker = Worker(seed, working_fraction=0.9, follow_producers=False)
    started = anyio.Event()
    release = anyio.Event()
    runs: list[str] = []

    @worker.handler("work")
    async def handle(job: Job) -> None:
        runs.append(job.id)
        started.set()
        await release.wait()

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(10):
            await started.wait()
        await anyio.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        took = await _await("the WORKING", lambda: _pushed(survivors, job_id), 5)
        assert took < 2.0, took
        release.set()
        await _await("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 10)
        worker.stop()
    outcomes = [r.outcome for r in caplog.records if getattr(r, "event", "") == "job"]  # type: ignore[attr-defined]
    assert runs == [job_id] and outcomes == ["done"]
    _nothing_queued(survivors, "work")


@pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
def test_a_kombu_consumer_keeps_an_unacked_message_alive_when_its_node_is_killed(
    node_factory: Any,
) -> None:
    from kombu import Connection, Exchange, Queue

    import disque_trio.integrations.celery  # noqa: F401  (the disque:// scheme)

    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    queue = Queue("kq", Exchange("kq", type="direct"), routing_key="kq")
    options = {"visibility_timeout": RETRY, "replicate": 3}
    with Connection(seed, transport_options=options) as conn:
        conn.Producer().publish(
            {"n": 1}, exchange=queue.exchange, routing_key="kq", declare=[queue]
        )
        message = queue(conn.default_channel).get(no_ack=False)  # GETJOB at the first node
        assert message is not None and message.payload == {"n": 1}
        job_id = message.delivery_info["disque_job_id"]
        time.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        took = _wait("the WORKING", lambda: _pushed(survivors, job_id), 5)
        assert took < 2.0, took  # the acknowledging thread looks every 0.5 s
        message.ack()
        _wait("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 10)
    _nothing_queued(survivors, "kq")


@pytest.mark.skipif(
    importlib.util.find_spec("dramatiq") is None, reason="dramatiq is not installed ('.[test]')"
)
def test_a_dramatiq_worker_keeps_a_running_message_alive_when_its_node_is_killed(
    node_factory: Any,
) -> None:
    """``keepalive=False``: the broker's periodic WORKING is off, the push
    is the fail-over's."""
    import dramatiq

    from disque_trio.integrations.dramatiq import DisqueBroker

    nodes, seed = _cluster(node_factory)
    survivors = nodes[1:]
    broker = DisqueBroker(seed, retry=RETRY, replicate=3, keepalive=False)
    started = threading.Event()
    release = threading.Event()
    runs: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="dq")
    def work(n: int) -> None:
        runs.append(n)
        started.set()
        release.wait(30)

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        job_id = work.send(1).options["disque_job_id"]
        assert started.wait(10)
        time.sleep(HELD_FOR)
        _kill_the_deliverer(nodes, job_id)
        took = _wait("the WORKING", lambda: _pushed(survivors, job_id), 5)
        assert took < 2.0, took
        release.set()
        _wait("the ack everywhere", lambda: _acked_everywhere(survivors, job_id), 10)
    finally:
        release.set()
        worker.stop()
        broker.close()
    assert runs == [1]
    _nothing_queued(survivors, "dq")


# ------------------------------------------------------------ producers


def test_addjob_refused_norepl_is_sent_again_until_the_node_is_back(node_factory: Any) -> None:
    """REPLICATE 3 of 3 with a node killed: once the others mark it
    failing, every node refuses at once (-NOREPL, no copy made). Restarted
    a second later, it is back within the client's retries."""
    nodes, seed = _cluster(node_factory)
    with Client(seed, follow_producers=False) as producer:
        producer.ping()
        nodes[2].kill(signal.SIGKILL)
        _wait("the node marked failing", lambda: _priority(nodes[0], nodes[2]) >= 100, 10)
        with pytest.raises(NoReplError):
            producer.add_job("p", "refused", replicate=3, retries=0)
        threading.Timer(1.0, nodes[2].start).start()
        t0 = time.monotonic()
        job_id = producer.add_job("p", "added", replicate=3)
        took = time.monotonic() - t0
    assert took > 0.5, took  # it waited for the node
    for node in nodes:  # a copy on each node, and nothing of the refused tries
        with _direct(node) as c:
            assert list(c.jscan(queue="p")) == [job_id]


def _priority(of: NodeProcess, node: NodeProcess) -> int:
    """The priority ``of``'s HELLO gives ``node``."""
    with _direct(of) as c:
        return next(n.priority for n in c.hello().nodes if n.port == node.port)


def test_addjob_goes_elsewhere_when_the_node_is_killed_between_or_during_calls(
    node_factory: Any,
) -> None:
    nodes, seed = _cluster(node_factory)
    first = ("127.0.0.1", nodes[0].port)
    with Client(seed, follow_producers=False) as producer:
        producer.add_job("p", "before", replicate=2)
        assert producer.current_node == first
        # Killed between two calls: the idle connection is seen closed before
        # the ADDJOB is written, so even resend=False is safe.
        nodes[0].kill(signal.SIGKILL)
        job_id = producer.add_job("p", "between", replicate=2, resend=False)
        assert producer.current_node != first and _show(nodes[1], job_id) is not None
        # Killed with the ADDJOB in flight (the node stopped, then killed).
        second = next(n for n in nodes[1:] if ("127.0.0.1", n.port) == producer.current_node)
        _pause(second)
        threading.Timer(0.5, second.kill, args=(signal.SIGKILL,)).start()
        # resend: the client's default. One node left: one copy.
        job_id = producer.add_job("p", "during", replicate=1)
        third = next(n for n in nodes[1:] if n is not second)
        assert producer.current_node == ("127.0.0.1", third.port)
        info = _show(third, job_id)
        assert info is not None and info.body == b"during"
    with Client(f"127.0.0.1:{third.port}", follow_producers=False) as c:
        bodies = Counter(i.body for i in c.jscan_jobs(queue="p"))
    assert bodies[b"between"] == bodies[b"during"] == 1  # the stopped node never read it


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio", "asyncio"])
async def test_an_async_producer_never_writes_to_a_connection_the_node_closed(
    node_factory: Any, anyio_backend: str
) -> None:
    nodes, seed = _cluster(node_factory)
    first = ("127.0.0.1", nodes[0].port)
    async with AsyncClient(seed, follow_producers=False, resend=False) as producer:
        await producer.add_job("p", "before", replicate=2)
        assert producer.current_node == first
        nodes[0].kill(signal.SIGKILL)
        job_id = await producer.add_job("p", "between", replicate=2)
        assert producer.current_node != first
    assert _show(nodes[1], job_id) is not None


def test_a_lost_addjob_is_not_sent_again_without_resend(node_factory: Any) -> None:
    nodes, seed = _cluster(node_factory)
    with Client(seed, follow_producers=False, resend=False) as producer:
        producer.ping()
        _pause(nodes[0])
        threading.Timer(0.5, nodes[0].kill, args=(signal.SIGKILL,)).start()
        with pytest.raises(ConnectionLostError):
            producer.add_job("p", "once")


def _pause(node: NodeProcess) -> None:
    """SIGSTOP: it reads nothing more (killed later, it never has)."""
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSTOP)


# ------------------------------------------------------------ rolling restart


class Traffic:
    """A producer at about 50 jobs a second and a consumer, on the whole
    cluster, each a blocking Client with the default options."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.added: list[str] = []
        self.errors: list[str] = []
        self.delivered: Counter[str] = Counter()
        self.stop_adding = threading.Event()
        self.stop_taking = threading.Event()
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _produce(self) -> None:
        with Client(self.url) as c:
            n = 0
            while not self.stop_adding.is_set():
                n += 1
                try:
                    # The default REPLICATE: 3, or 2 while a node leaves.
                    self.added.append(c.add_job("roll", f"job {n}", retry=5))
                except DisqueError as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.02)

    def _consume(self) -> None:
        with Client(self.url) as c:
            while not self.stop_taking.is_set():
                try:
                    jobs = c.get_jobs("roll", count=20, timeout=0.2)
                    self.delivered.update(j.id for j in jobs)
                    if jobs:
                        c.ack_job(*(j.id for j in jobs))
                except DisqueError:
                    time.sleep(0.05)

    def finish(self, seconds: float) -> None:
        self.stop_adding.set()
        self.threads[0].join(timeout=30)
        deadline = time.monotonic() + seconds
        while not set(self.added) <= self.delivered.keys() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a second delivery would come now
        self.stop_taking.set()
        self.threads[1].join(timeout=30)


def _registered_jobs(node: NodeProcess) -> int:
    with _direct(node) as c:
        return int(c.info("jobs").split("registered_jobs:")[1].split()[0])


def _restart(node: NodeProcess, nodes: list[NodeProcess]) -> None:
    """docs/operations.md, "A rolling restart", with draining."""
    with _direct(node) as c:
        assert c.call("CLUSTER", "LEAVING", "yes") == "OK"
    _wait("the drain", lambda: _registered_jobs(node) == 0, 60)
    node.kill(signal.SIGTERM)
    node.start()
    with _direct(node) as c:
        assert c.call("CLUSTER", "LEAVING", "no") == "OK"

    def usable() -> bool:
        for n in nodes:
            with _direct(n) as c:
                if sum(p.priority == 1 for p in c.hello().nodes) != len(nodes):
                    return False
        return True

    _wait("every node usable", usable, 30)


def test_a_rolling_restart_goes_unnoticed_by_a_producer(
    node_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Three nodes restarted in turn under a producer and a consumer: no
    add_job raises, and every job added is delivered once. A job the
    client sent again after a connection lost with it in flight may exist
    twice (docs/client.md): such copies are counted, never more than the
    warnings saying so."""
    caplog.set_level(logging.WARNING, logger="disque_trio.client")
    nodes = form_cluster(node_factory, 3)
    traffic = Traffic(url_of(nodes))
    time.sleep(1.5)
    for node in nodes:
        _restart(node, nodes)
        time.sleep(1.0)
    # Enough traffic to count on, however fast the drains went.
    _wait("250 jobs added", lambda: len(traffic.added) > 250, 30)
    traffic.finish(60)
    added = set(traffic.added)
    missing = added - traffic.delivered.keys()
    twice = {j: n for j, n in traffic.delivered.items() if j in added and n > 1}
    extra = traffic.delivered.keys() - added
    resent = [r for r in caplog.records if "sent again" in r.getMessage()]
    print(
        f"rolling restart: {len(added)} added, {len(traffic.errors)} errors, "
        f"{len(missing)} missing, {len(twice)} delivered twice, {len(extra)} extra copies, "
        f"{len(resent)} resent"
    )
    assert traffic.errors == []
    assert len(added) > 200 and len(added) == len(traffic.added)
    assert missing == set() and twice == {}
    assert len(extra) <= len(resent)
