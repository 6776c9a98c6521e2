"""The client's cluster behaviour (routing, following producers, -LEAVING,
lost connections, retries, timeouts, AUTH, the pool bound) through its real
shells over a fake transport: ``client_fakes.FakeCluster`` answers in RESP
from memory. The same test functions run on the AnyIO shell under asyncio
and under Trio, and on the blocking shell."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from disque_trio.client import (
    AsyncClient,
    Client,
    ConnectionLostError,
    DisqueTimeoutError,
    NoNodeAvailableError,
    NoReplError,
    ProducerTracker,
)

from .client_fakes import FakeCluster, FakeNode

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio", "blocking"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def anyio_backend(flavour: str) -> str:
    return "asyncio" if flavour == "blocking" else flavour


class Blocking:
    """The blocking Client behind awaitable methods, so that one test body
    drives both shells (the fake transport never blocks)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            return list(result) if name in ("qscan", "jscan") else result

        return call

    async def aclose(self) -> None:
        self.client.close()


Make = Callable[..., Any]


def plain(client: Any) -> Any:
    """The client itself, for its methods that are not coroutines."""
    return client.client if isinstance(client, Blocking) else client


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster(3)


@pytest.fixture
def make(flavour: str, cluster: FakeCluster) -> Make:
    def make(seeds: list[FakeNode] | None = None, **options: Any) -> Any:
        addresses = [n.address for n in (seeds or cluster.nodes[:1])]
        options.setdefault("rng", random.Random(5))
        options.setdefault("timeout", 2.0)
        if flavour == "blocking":
            return Blocking(Client(addresses, connector=cluster.socket_connector(), **options))
        return AsyncClient(addresses, connector=cluster.stream_connector(), **options)

    return make


async def test_connects_to_a_reachable_seed_and_learns_the_cluster(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, c = cluster.nodes
    a.refuse = True
    client = make([a, b])
    assert await client.qlen("q") == 0
    assert client.current_node in (b.address,)
    assert {n.id for n in client.router.nodes.values()} == {a.id, b.id, c.id}
    await client.aclose()


async def test_no_reachable_node(cluster: FakeCluster, make: Make) -> None:
    for n in cluster.nodes:
        n.refuse = True
    client = make(cluster.nodes, max_attempts=2)
    with pytest.raises(NoNodeAvailableError):
        await client.qlen("q")
    await client.aclose()


async def test_job_commands_go_to_the_node_that_created_the_job(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, _ = cluster.nodes
    job_id = cluster.add(b, "q")  # produced on B; the consumer works with A
    client = make([a], follow_producers=False)
    job = await client.get_job("q", timeout=1)
    assert job.id == job_id and client.current_node == a.address
    assert (await client.show(job_id)).retry == 30
    assert await client.working(job_id) == 30
    assert await client.nack(job_id) == 1
    assert await client.ack_job(job_id) == 1
    for name in ("SHOW", "WORKING", "NACK", "ACKJOB"):
        assert cluster.commands(b, name) and not cluster.commands(a, name), name
    await client.aclose()


async def test_routed_command_falls_back_to_the_current_node(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, _ = cluster.nodes
    job_id = cluster.add(b, "q")
    cluster.jobs[job_id].holders = {a.id}  # B does not hold its own job (external replication)
    client = make([a], follow_producers=False)
    assert await client.ack_job(job_id) == 1
    assert cluster.commands(b, "ACKJOB") and cluster.commands(a, "ACKJOB")
    # The creator unreachable: the current node answers.
    other = cluster.add(b, "q")
    cluster.jobs[other].holders = {a.id}
    b.refuse = True
    await client.aclose()
    client = make([a], follow_producers=False)
    await client.qlen("q")
    assert await client.working(other) == 30
    await client.aclose()


async def test_an_ack_the_creator_counts_short_goes_to_the_current_node(
    cluster: FakeCluster, make: Make
) -> None:
    """Two jobs made by B, one of them held by A only (B was leaving when it
    was added): B counts one, so the ACKJOB goes to A as well, whole."""
    a, b, _ = cluster.nodes
    kept = cluster.add(b, "q")
    external = cluster.add(b, "q")
    cluster.jobs[external].holders = {a.id}
    client = make([a], follow_producers=False)
    await client.qlen("q")
    await client.ack_job(kept, external)
    assert cluster.commands(b, "ACKJOB") == [["ACKJOB", kept, external]]
    assert cluster.commands(a, "ACKJOB") == [["ACKJOB", kept, external]]
    assert kept not in cluster.jobs and external not in cluster.jobs
    await client.aclose()


async def test_acks_for_several_nodes_are_split(cluster: FakeCluster, make: Make) -> None:
    a, b, c = cluster.nodes
    ids = [cluster.add(n, "q") for n in (a, b, c, b)]
    client = make([a], follow_producers=False)
    assert len(await client.get_jobs("q", count=10, timeout=1)) == 4
    assert await client.ack_job(*ids) == 4
    assert [len(cluster.commands(n, "ACKJOB")) for n in (a, b, c)] == [1, 1, 1]
    assert cluster.commands(b, "ACKJOB")[0][1:] == [ids[1], ids[3]]
    await client.aclose()


async def test_consumer_follows_the_producer_once(cluster: FakeCluster, make: Make) -> None:
    a, b, _ = cluster.nodes
    tracker = ProducerTracker(window=20, min_jobs=10, share=0.75, cooldown=3600)
    client = make([a], tracker=tracker)
    for _ in range(30):
        cluster.add(b, "q")
    got = []
    for _ in range(6):
        got += await client.get_jobs("q", count=5, timeout=1)
    assert len(got) == 30
    assert client.current_node == b.address and client.router.moves == 1
    assert len(cluster.commands(a, "GETJOB")) == 2  # 10 jobs, then the move
    assert len(cluster.commands(b, "GETJOB")) == 4
    # Jobs now come from A: within the cooldown, no move back (hysteresis).
    for _ in range(30):
        cluster.add(a, "q")
    for _ in range(6):
        await client.get_jobs("q", count=5, timeout=1)
    assert client.current_node == b.address and client.router.moves == 1
    await client.aclose()


async def test_leaving_node_sends_the_consumer_elsewhere_by_priority(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, c = cluster.nodes
    c.priority = 100  # failing, as HELLO says
    cluster.add(a, "q")
    client = make([a], follow_producers=False)
    assert await client.qlen("q") == 1
    a.leaving = True
    jobs = await client.get_jobs("q", timeout=1)
    assert len(jobs) == 1 and client.current_node == b.address
    assert cluster.commands(a, "GETJOB") and not cluster.commands(c, "GETJOB")
    await client.aclose()


async def test_lost_connection_retries_only_what_is_idempotent(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, _ = cluster.nodes
    cluster.add(b, "q")
    client = make([a], follow_producers=False)
    await client.qlen("q")
    a.drop_next, a.refuse = 1, True  # the next command reaches A, which then dies
    jobs = await client.get_jobs("q", timeout=1)  # GETJOB: sent again, elsewhere
    assert len(jobs) == 1 and client.current_node != a.address
    current = cluster.node_at(client.current_node)
    current.drop_next = 1
    with pytest.raises(ConnectionLostError):
        await client.add_job("q", b"once", resend=False)
    assert sum(len(cluster.commands(n, "ADDJOB")) for n in cluster.nodes) == 1
    for node in cluster.nodes:
        node.drop_next = 1  # wherever the NACK goes (its node may count as down now)
    with pytest.raises(ConnectionLostError):
        await client.nack(jobs[0].id)
    assert sum(len(cluster.commands(n, "NACK")) for n in cluster.nodes) == 1
    for node in cluster.nodes:
        node.drop_next = 0
    await client.aclose()
    a.refuse = False
    client = make([a], follow_producers=False)
    await client.qlen("q")
    cluster.node_at(client.current_node).drop_next = 1
    job_id = await client.add_job("q", b"again", resend=True)
    assert job_id in cluster.jobs
    # The client's default: resend (a rolling restart stays invisible).
    cluster.node_at(client.current_node).drop_next = 1
    job_id = await client.add_job("q", b"by default")
    assert cluster.jobs[job_id].body == b"by default"
    assert sum(len(cluster.commands(n, "ADDJOB")) for n in cluster.nodes) == 5  # 1 + 2 + 2
    await client.aclose()
    # Off for the whole client.
    client = make([a], follow_producers=False, resend=False)
    await client.qlen("q")
    cluster.node_at(client.current_node).drop_next = 1
    with pytest.raises(ConnectionLostError):
        await client.add_job("q", b"not again")
    await client.aclose()


async def test_an_addjob_sent_again_after_a_lost_connection_says_so(
    cluster: FakeCluster, make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection that broke with ADDJOB in flight: the job may exist, so
    sending it again may make a second one. The warning says so whether the
    second send goes to the same node on a new connection (found in the
    rolling restart test: that path used to stay silent) or elsewhere."""
    caplog.set_level(logging.WARNING, logger="disque_trio.client")
    client = make(follow_producers=False)
    await client.qlen("q")
    cluster.node_at(client.current_node).drop_next = 1
    job_id = await client.add_job("q", b"again")
    assert cluster.jobs[job_id].body == b"again"
    assert sum(len(cluster.commands(n, "ADDJOB")) for n in cluster.nodes) == 2
    warned = [r.getMessage() for r in caplog.records if "sent again" in r.getMessage()]
    assert len(warned) == 1 and "ADDJOB" in warned[0]
    # Acks are idempotent: sent again without a word.
    caplog.clear()
    cluster.node_at(client.current_node).drop_next = 1
    assert await client.ack_job(job_id) >= 0
    assert not [r for r in caplog.records if "sent again" in r.getMessage()]
    await client.aclose()


async def test_a_stale_pooled_connection_is_replaced(cluster: FakeCluster, make: Make) -> None:
    a = cluster.nodes[0]
    client = make([a])
    assert await client.qlen("q") == 0
    a.drop_next = 1  # the idle connection died; the node is still there
    assert await client.qlen("q") == 0
    assert client.current_node == a.address and cluster.connects.count(a.address) == 2
    await client.aclose()


async def test_addjob_goes_elsewhere_when_never_sent(cluster: FakeCluster, make: Make) -> None:
    a, b, _ = cluster.nodes
    a.refuse = True
    client = make([a, b])
    job_id = await client.add_job("q", "hello")
    assert job_id[2:10] == b.prefix and cluster.jobs[job_id].body == b"hello"
    await client.aclose()


async def test_call_timeout(cluster: FakeCluster, make: Make, flavour: str) -> None:
    a = cluster.nodes[0]
    client = make([a], timeout=0.3)
    await client.qlen("q")
    a.silent = True  # reads commands, never answers
    with anyio.fail_after(5):
        with pytest.raises(DisqueTimeoutError):
            await client.qlen("q")
    await client.aclose()


async def test_auth_from_the_url_and_resp3(cluster: FakeCluster, flavour: str) -> None:
    a = cluster.nodes[0]
    a.password = "pw"
    url = f"disque://:pw@{a.address[0]}:{a.address[1]}"
    for protocol in (2, 3):
        if flavour == "blocking":
            client: Any = Blocking(
                Client(url, protocol=protocol, connector=cluster.socket_connector())
            )
        else:
            client = AsyncClient(url, protocol=protocol, connector=cluster.stream_connector())
        assert await client.qlen("q") == 0
        await client.aclose()
    assert cluster.commands(a, "AUTH") == [["AUTH", "pw"]]
    hellos = cluster.commands(a, "HELLO")
    assert ["HELLO", "3", "AUTH", "default", "pw"] in hellos
    assert hellos.count(["HELLO"]) == 2  # once per client: the handshake is reused


async def test_pool_is_bounded(cluster: FakeCluster, flavour: str) -> None:
    a = cluster.nodes[0]
    if flavour == "blocking":  # one connection per node, used in turn
        blocking = Client([a.address], connector=cluster.socket_connector())
        for _ in range(20):
            blocking.qlen("q")
        assert len(cluster.connects) == 1
        blocking.close()
        return
    client = AsyncClient([a.address], pool_size=2, connector=cluster.stream_connector())
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(client.qlen, "q")
    assert len(cluster.connects) == 2
    await client.aclose()


async def test_held_jobs_of_a_dead_node_are_kept_alive_where_a_copy_is(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, c = cluster.nodes
    ids = [cluster.add(a, "q") for _ in range(3)]
    for job_id in ids:
        cluster.jobs[job_id].holders.add(b.id)  # REPLICATE 2: A and B hold copies
    cluster.jobs[ids[2]].too_late = True
    client = make([a], follow_producers=False)
    assert len(await client.get_jobs("q", count=3, timeout=1)) == 3
    assert len(client.router.held) == 3
    assert await client.check_held() is None  # A answers: nothing to do
    a.drop_next, a.refuse = 1, True  # A dies
    result = await client.check_held()
    assert result.moved == {b.address: ids[:2]} and result.too_late == [ids[2]]
    assert [cmd[1] for cmd in cluster.commands(b, "WORKING")] == ids
    assert all(cmd[1] in ids for cmd in cluster.commands(c, "WORKING"))  # NOJOB there, if asked
    assert await client.check_held() is None  # once
    # Acked later: where it was kept alive (A is out).
    assert await client.ack_job(ids[0]) == 1
    assert cluster.commands(b, "ACKJOB") == [["ACKJOB", ids[0]]]
    assert len(client.router.held) == 2
    await client.aclose()


async def test_any_call_that_finds_the_node_gone_keeps_its_jobs_alive(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, c = cluster.nodes
    job_id = cluster.add(a, "q")
    cluster.jobs[job_id].holders |= {b.id, c.id}
    client = make([a], follow_producers=False)
    assert (await client.get_job("q", timeout=1)).id == job_id
    a.drop_next, a.refuse = 1, True
    assert await client.qlen("q") == 0  # moved elsewhere, then the WORKING
    assert sum(len(cluster.commands(n, "WORKING")) for n in (b, c)) == 1
    assert client.router.held.node_of(job_id) in (b.address, c.address)
    await client.nack(job_id)
    assert len(client.router.held) == 0
    await client.aclose()


async def test_jobs_settled_elsewhere_are_released_and_holding_can_be_off(
    cluster: FakeCluster, make: Make
) -> None:
    a = cluster.nodes[0]
    for _ in range(4):
        cluster.add(a, "q")
    client = make([a], follow_producers=False)
    jobs = await client.get_jobs("q", count=4, timeout=1)
    plain(client).release(jobs[0].id)  # settled through another client
    await client.nack(jobs[1].id)
    await client.fast_ack(jobs[2].id)
    assert [j for j in (x.id for x in jobs) if j in client.router.held] == [jobs[3].id]
    await client.aclose()
    off = make([a], follow_producers=False, hold_jobs=False)
    jobs = await off.get_jobs("q", count=4, timeout=1)
    assert len(jobs) == 1 and len(off.router.held) == 0  # the one NACKed
    plain(off).hold([jobs[0].id], a.address)  # fetched elsewhere, settled here
    assert off.router.held.node_of(jobs[0].id) == a.address
    await off.aclose()


async def test_addjob_refused_norepl_goes_elsewhere_a_bounded_number_of_times(
    cluster: FakeCluster, make: Make
) -> None:
    a, b, c = cluster.nodes
    client = make([a], follow_producers=False)
    await client.qlen("q")
    a.norepl = 1
    job_id = await client.add_job("q", "x")
    assert job_id[2:10] in (b.prefix, c.prefix) and client.current_node != a.address
    assert len(cluster.commands(a, "ADDJOB")) == 1
    for node in cluster.nodes:
        node.norepl = 10
    before = sum(len(cluster.commands(n, "ADDJOB")) for n in cluster.nodes)
    with pytest.raises(NoReplError):
        await client.add_job("q", "y", retries=2)
    assert sum(len(cluster.commands(n, "ADDJOB")) for n in cluster.nodes) == before + 3
    await client.aclose()
    # A node refusing because it is leaving is left.
    for node in cluster.nodes:
        node.norepl = 0
    a.norepl, a.norepl_reason = 1, ", since I'm unable to hold a copy: I'm leaving the cluster"
    client = make([a], follow_producers=False)
    await client.qlen("q")
    a.priority = 100  # CLUSTER LEAVING yes: HELLO says so from now on
    job_id = await client.add_job("q", "z")
    assert job_id[2:10] != a.prefix and client.current_node != a.address
    assert client.router.sweep_targets(0.0) == [a.address]  # left, as after -LEAVING
    await client.aclose()
