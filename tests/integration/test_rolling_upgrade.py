"""Nodes of two releases in one cluster: the release before bus protocol 4
(installed from its commit into a venv of its own) and this one. They
speak the highest bus protocol both know; what needs the newer one waits
until every linked node speaks it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from disque_trio.client import Client, ResponseError

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
