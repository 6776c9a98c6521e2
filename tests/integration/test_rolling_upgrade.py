"""Nodes of two releases in one cluster: the release before bus protocol 4
(installed from its commit into a venv of its own) and this one. They
speak the highest bus protocol both know; what needs the newer one waits
until every linked node speaks it."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import attrs
import pytest

from disque_trio.client import Client, DisqueError, NoReplError, ResponseError

from .conftest import NodeProcess

pytestmark = pytest.mark.slow


def _direct(node: NodeProcess) -> Client:
    return Client(f"127.0.0.1:{node.port}", follow_producers=False, route_by_job_id=False)


def _mesh(nodes: list[NodeProcess]) -> None:
    with _direct(nodes[0]) as c:
        for other in nodes[1:]:
            c.call("CLUSTER", "MEET", "127.0.0.1", other.port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        usable = []
        for n in nodes:
            with _direct(n) as c:
                usable.append(sum(p.priority == 1 for p in c.hello().nodes))
        if usable == [len(nodes)] * len(nodes):
            return
        time.sleep(0.1)
    raise AssertionError(f"no full mesh: {usable}")


def _delay_refused(node: NodeProcess) -> bool:
    """Whether NACK DELAY is refused for an old link (NOTSUPPORTED)."""
    with _direct(node) as c:
        job_id = c.add_job("probe", "x", replicate=1, retry=30)
        c.get_jobs("probe", nohang=True)
        try:
            c.nack(job_id, delay=1)
        except ResponseError as e:
            assert e.code == "NOTSUPPORTED", e
            return True
        finally:
            c.ack_job(job_id)
        return False


def test_a_node_of_the_release_before_joins_and_is_upgraded_in_place(
    node_factory: Any, previous_release: str
) -> None:
    old: NodeProcess = node_factory("--cluster-node-timeout", "1000", python=previous_release)
    new: NodeProcess = node_factory("--cluster-node-timeout", "1000")
    _mesh([old, new])
    # Jobs cross in both directions with synchronous copies.
    for producer, consumer in ((old, new), (new, old)):
        with _direct(producer) as p, _direct(consumer) as c:
            job_id = p.add_job("mixed", "body", replicate=2, retry=30)
            info = c.show(job_id)
            assert info is not None and info.state == "active"
            assert c.ack_job(job_id) == 1
            deadline = time.monotonic() + 10
            while p.show(job_id) is not None and time.monotonic() < deadline:
                time.sleep(0.05)  # collected on both
            assert p.show(job_id) is None
    assert _delay_refused(new)
    assert "speaks bus protocol 3" in new.output()
    # The old node restarts on this release (same directory: same ID, same
    # peers): the new node's link to it comes back at protocol 4.
    old.python = new.python
    old.start()
    deadline = time.monotonic() + 20
    while _delay_refused(new):
        assert time.monotonic() < deadline, "still refused after the upgrade"
        time.sleep(0.2)


class Traffic:
    """A producer and a consumer thread on the whole cluster (the client
    moves off a leaving or restarting node by itself), and their ledger."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.url = "disque://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)
        self.added: set[str] = set()
        self.delivered: set[str] = set()
        self.acked: set[str] = set()
        self.refused: list[str] = []
        self.stop_adding = threading.Event()
        self.stop_taking = threading.Event()
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _produce(self) -> None:
        with Client(self.url, timeout=5) as c:
            n = 0
            while not self.stop_adding.is_set():
                n += 1
                try:
                    self.added.add(c.add_job("up", f"job {n}", replicate=2, retry=5))
                except NoReplError as e:
                    self.refused.append(str(e))
                except DisqueError:
                    pass  # a connection lost with the ADDJOB: its outcome unknown
                time.sleep(0.01)

    def _consume(self) -> None:
        with Client(self.url, timeout=5, follow_producers=False) as c:
            while not self.stop_taking.is_set():
                try:
                    jobs = c.get_jobs("up", count=20, timeout=0.2)
                    self.delivered.update(j.id for j in jobs)
                    if jobs and c.ack_job(*(j.id for j in jobs)):
                        self.acked.update(j.id for j in jobs)
                except DisqueError:
                    time.sleep(0.05)

    def finish(self, seconds: float) -> None:
        self.stop_adding.set()
        deadline = time.monotonic() + seconds
        while not self.added <= self.delivered and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop_taking.set()
        for t in self.threads:
            t.join(timeout=30)


def _info(node: NodeProcess, field: str) -> int:
    with _direct(node) as c:
        for line in c.info().splitlines():
            if line.startswith(field + ":"):
                return int(line.split(":")[1])
    raise AssertionError(field)


def _upgrade(node: NodeProcess, python: str, others: list[NodeProcess]) -> None:
    """CLUSTER LEAVING yes, wait until it holds no job, stop it, start it on
    ``python`` in the same directory (its ID and peers kept), CLUSTER
    LEAVING no, and wait until every node sees it usable."""
    with _direct(node) as c:
        assert c.call("CLUSTER", "LEAVING", "yes") in (b"OK", "OK")
    deadline = time.monotonic() + 60
    while _info(node, "registered_jobs"):
        assert time.monotonic() < deadline, "the leaving node did not drain"
        time.sleep(0.1)
    node.kill(signal.SIGTERM)
    node.python = python
    node.start()
    with _direct(node) as c:
        c.call("CLUSTER", "LEAVING", "no")
    _mesh_usable([node, *others])


def _mesh_usable(nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + 30
    while True:
        usable = []
        for n in nodes:
            with _direct(n) as c:
                usable.append(sum(p.priority == 1 for p in c.hello().nodes))
        if usable == [len(nodes)] * len(nodes):
            return
        assert time.monotonic() < deadline, f"not all usable: {usable}"
        time.sleep(0.1)


def test_a_three_node_cluster_is_upgraded_one_node_at_a_time_under_traffic(
    node_factory: Any, previous_release: str
) -> None:
    """The procedure of docs/operations.md, "A rolling upgrade": three
    nodes of the release before, a producer and a consumer running all
    along; each node in turn leaves, drains, restarts on this release and
    comes back. No job whose ADDJOB was answered is lost, and no ADDJOB is
    refused for want of reachable nodes (REPLICATE 2 on three nodes, one
    at a time away)."""
    nodes: list[NodeProcess] = [
        node_factory("--cluster-node-timeout", "2000", python=previous_release) for _ in range(3)
    ]
    _mesh(nodes)
    new_python = sys.executable
    traffic = Traffic(nodes)
    time.sleep(2)
    for i, node in enumerate(nodes):
        _upgrade(node, new_python, [n for j, n in enumerate(nodes) if j != i])
        time.sleep(1)
    assert not _delay_refused(nodes[0])  # every link speaks protocol 4 now
    traffic.finish(60)
    lost = traffic.added - traffic.delivered
    print(
        f"rolling upgrade ledger: {len(traffic.added)} added, {len(traffic.acked)} acked, "
        f"{len(lost)} lost, {len(traffic.refused)} refused NOREPL"
    )
    assert len(traffic.added) > 300
    assert lost == set()
    assert traffic.refused == []


def _aof_records(path: Any) -> list[Any]:
    from disque_trio.protocol import aof

    return [record for _, _, (_, record) in aof.records(path.read_bytes())]


def test_each_release_reads_the_aof_of_the_other(node_factory: Any, previous_release: str) -> None:
    """docs/operations.md, "Which releases work together": the release
    before writes an AOF this release loads (an upgrade in place), and
    this release's AOF, with the field 0.2.0 added to a job's record
    (its pending holders), loads on the release before (a downgrade)."""
    from disque_trio.protocol import aof

    node: NodeProcess = node_factory(
        "--appendonly", "yes", "--appendfsync", "always", python=previous_release
    )
    with _direct(node) as c:
        kept = [c.add_job("aof", f"old {i}", replicate=1, retry=30) for i in range(3)]
        acked = c.add_job("aof", "acked", replicate=1, retry=30)
        assert c.ack_job(acked) == 1
    node.kill(signal.SIGKILL)

    node.python = sys.executable  # the upgrade: same dir, this release
    node.start()
    with _direct(node) as c:
        assert [c.show(j) is not None for j in kept] == [True] * 3
        assert c.show(acked) is None
        kept.append(c.add_job("aof", "new", replicate=1, retry=30))
    node.kill(signal.SIGKILL)

    # A record as this release writes it for a job with a pending holder
    # (a node still in its handshake when the job was copied here).
    path = node.workdir / "disque.aof"
    last = [r for r in _aof_records(path) if isinstance(r, aof.JobRecord) and r.id == kept[-1]][-1]
    # A body of its own shows this record, not the one before it, is read.
    with_pending = attrs.evolve(last, pending=("f" * 40,), body=b"new, one holder pending")
    with path.open("ab") as f:
        f.write(aof.loadjob(with_pending))
    assert with_pending in _aof_records(path)

    node.python = previous_release  # the downgrade
    node.start()
    with _direct(node) as c:
        shown = [c.show(j) for j in kept]
        assert [s is not None for s in shown] == [True] * 4, shown
        assert shown[-1] is not None and shown[-1].body == b"new, one holder pending"
        assert c.show(acked) is None
