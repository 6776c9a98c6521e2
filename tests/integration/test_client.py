"""disque_trio.client against real nodes: every typed reply, RESP2 and
RESP3, AUTH, binary bodies, scans, timeouts, routing and -LEAVING in a real
cluster; the original C Disque too when a build is at hand. The AnyIO
tests run under asyncio and Trio; the blocking client runs the same steps."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from disque_trio.client import (
    AsyncClient,
    AuthenticationError,
    BadIdError,
    Client,
    DisqueTimeoutError,
    NoNodeAvailableError,
    PausedError,
)

from ..helpers import free_port
from .conftest import NodeProcess

C_DISQUE = os.environ.get("DISQUE_SERVER", "/tmp/cdisque/src/disque-server")
BODY = bytes(range(256)) * 3 + b"\r\n$-1\r\n"  # every byte value, and RESP look-alikes


def url(*nodes: NodeProcess, password: str = "") -> str:
    auth = f":{password}@" if password else ""
    return f"disque://{auth}" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


class Steps:
    """One scenario written once, run by both shells (awaiting or not)."""

    def __init__(self, client: Any, blocking: bool) -> None:
        self.client, self.blocking = client, blocking

    async def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.client, name)(*args, **kwargs)
        if name in ("qscan", "jscan", "jscan_jobs"):
            if self.blocking:
                return list(result)
            return [item async for item in result]
        return result if self.blocking else await result


async def scenario(do: Steps) -> None:
    job_id = await do("add_job", "q1", BODY, retry=5, ttl=600)
    text_id = await do("add_job", "q1", "héllo")
    assert await do("qlen", "q1") == 2
    stats = await do("qstat", "q1")
    assert stats.name == "q1" and stats.len == 2 and stats.pause == "none"
    assert await do("qstat", "nothing") is None
    peek = await do("qpeek", "q1", 10)
    assert [j.id for j in peek] == [job_id, text_id]
    jobs = await do("get_jobs", "q1", count=10, timeout=1)
    assert [(j.id, j.body) for j in jobs] == [(job_id, BODY), (text_id, "héllo".encode())]
    assert jobs[1].text == "héllo" and jobs[0].queue == "q1" and jobs[0].nacks == 0
    info = await do("show", job_id)
    assert info.state == "active" and info.retry == 5 and info.body == BODY and info.queue == "q1"
    assert await do("working", job_id) == 5
    assert await do("nack", job_id) == 1
    again = await do("get_job", "q1", timeout=1)
    assert again.id == job_id and again.nacks == 1 and again.deliveries == 2
    assert sorted(await do("jscan", states=["active"])) == sorted([job_id, text_id])
    described = await do("jscan_jobs", queue="q1")
    assert {i.id for i in described} == {job_id, text_id}
    assert await do("ack_job", job_id, text_id) == 2
    assert await do("get_jobs", "q1", timeout=0.2) == []
    assert await do("get_jobs", "q1", nohang=True) == []
    assert "q1" in await do("qscan")
    assert await do("pause", "q1", "in") == "in"
    with pytest.raises(PausedError):
        await do("add_job", "q1", "x")
    assert await do("pause", "q1", "none") == "none"
    with pytest.raises(BadIdError):
        await do("ack_job", "not-an-id")
    fast = await do("add_job", "q2", b"", replicate=1, retry=0)
    assert await do("fast_ack", fast) == 1
    assert await do("ping") == "PONG"
    assert "registered_jobs" in await do("info", "jobs")
    hello = await do("hello")
    assert hello.version == 1 and len(hello.nodes) >= 1
    assert await do("call", "QLEN", "q1") == 0


@pytest.fixture(params=["asyncio", "trio", "blocking"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def anyio_backend(flavour: str) -> str:
    return "asyncio" if flavour == "blocking" else flavour


def make(flavour: str, nodes: str, **options: Any) -> tuple[Steps, Callable[[], Any]]:
    if flavour == "blocking":
        client: Any = Client(nodes, **options)
        return Steps(client, True), client.close
    client = AsyncClient(nodes, **options)
    return Steps(client, False), client.aclose


@pytest.mark.anyio
@pytest.mark.parametrize("protocol", [2, 3])
async def test_every_command_on_a_node(flavour: str, node: NodeProcess, protocol: int) -> None:
    do, close = make(flavour, url(node), protocol=protocol)
    try:
        await scenario(do)
    finally:
        result = close()
        if result is not None:
            await result


@pytest.mark.anyio
async def test_password(flavour: str, node_factory: Any) -> None:
    node = node_factory("--requirepass", "s3cret")
    for protocol in (2, 3):
        do, close = make(flavour, url(node, password="s3cret"), protocol=protocol)
        assert await do("qlen", "q") == 0
        result = close()
        if result is not None:
            await result
    do, close = make(flavour, url(node, password="wrong"), max_attempts=1)
    with pytest.raises(AuthenticationError):
        await do("qlen", "q")
    result = close()
    if result is not None:
        await result


@pytest.mark.anyio
async def test_timeouts_and_unreachable_nodes(flavour: str) -> None:
    # A listener that accepts and never answers, and a port nobody listens on.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        do, close = make(
            flavour, f"127.0.0.1:{port}", connect_timeout=0.3, timeout=0.5, max_attempts=1
        )
        t0 = time.monotonic()
        with pytest.raises(NoNodeAvailableError, match="HELLO in time"):
            await do("qlen", "q")
        assert time.monotonic() - t0 < 3
        result = close()
        if result is not None:
            await result
    dead = free_port()
    do, close = make(flavour, f"127.0.0.1:{dead}", max_attempts=2)
    with pytest.raises(NoNodeAvailableError):
        await do("qlen", "q")
    result = close()
    if result is not None:
        await result


@pytest.mark.anyio
async def test_call_timeout_on_a_stalled_node(flavour: str, node_factory: Any) -> None:
    node = node_factory("--enable-debug-command", "local")  # DEBUG SLEEP, from loopback
    do, close = make(flavour, url(node), timeout=0.5)
    assert await do("qlen", "q") == 0
    # DEBUG SLEEP freezes the node: the next call must give up in time.
    with socket.create_connection(("127.0.0.1", node.port)) as raw:
        raw.sendall(b"DEBUG SLEEP 2\r\n")
        time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(DisqueTimeoutError):
            await do("qlen", "q")
        assert time.monotonic() - t0 < 1.5
        assert raw.recv(16).startswith(b"+OK")
    assert await do("qlen", "q") == 0  # the broken connection was replaced
    result = close()
    if result is not None:
        await result


# ------------------------------------------------------------ a real cluster


def _hello_sizes(nodes: list[NodeProcess]) -> list[tuple[int, set[int]]]:
    sizes = []
    for n in nodes:
        with Client(url(n)) as c:
            hello = c.hello()
        sizes.append((len(hello.nodes), {p.priority for p in hello.nodes}))
    return sizes


def _meet(nodes: list[NodeProcess]) -> None:
    for a, b in itertools.pairwise(nodes):
        with Client(url(a)) as c:
            c.call("CLUSTER", "MEET", "127.0.0.1", b.port)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _hello_sizes(nodes) == [(len(nodes), {1})] * len(nodes):
            return
        time.sleep(0.1)
    raise AssertionError("no full mesh")


@pytest.mark.slow
def test_routing_and_leaving_in_a_real_cluster(node_factory: Any) -> None:
    nodes = [node_factory() for _ in range(3)]
    _meet(nodes)
    ids = {}
    for n in nodes:
        with Client(url(n)) as producer:
            ids[n.port] = producer.add_job("rq", f"from {n.port}", replicate=2, retry=30)
    # A consumer on node 0 gets jobs created anywhere (federation) and acks
    # each at the node that created it.
    consumer = Client(url(nodes[0]), follow_producers=False)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        got += consumer.get_jobs("rq", count=3, timeout=1)
    assert sorted(j.id for j in got) == sorted(ids.values())
    assert consumer.ack_job(*ids.values()) >= 3
    for n in nodes:
        with Client(url(n)) as c:
            info = c.show(ids[n.port])
            assert info is None or info.state == "acked"
    # Node 0 leaves: a blocked consumer gets -LEAVING and moves on.
    with Client(url(nodes[0])) as admin:
        admin.call("CLUSTER", "LEAVING", "yes")
    job = consumer.get_jobs("rq", timeout=0.5)
    assert job == [] and consumer.current_node != ("127.0.0.1", nodes[0].port)
    consumer.close()


# ------------------------------------------------------------ the original


@pytest.fixture
def c_disque(tmp_path: Path) -> Iterator[int]:
    if not (os.access(C_DISQUE, os.X_OK) and shutil.which(C_DISQUE)):
        pytest.skip("no build of the original Disque (DISQUE_SERVER)")
    port = free_port()
    proc = subprocess.Popen(
        [C_DISQUE, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.anyio
async def test_against_the_original_disque(flavour: str, c_disque: int) -> None:
    do, close = make(flavour, f"disque://127.0.0.1:{c_disque}")
    try:
        await scenario(do)
    finally:
        result = close()
        if result is not None:
            await result
