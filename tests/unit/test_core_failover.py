"""Fail-over and the leaving node's hand-over, on cores wired together
(issue 57): what the nodes that survive a lost one do with its jobs."""

from __future__ import annotations

from disque_trio.core import clusterjobs as cj
from disque_trio.core.job import JobState
from disque_trio.core.node import Node

from .core_support import FakeClock, elapse, get, make_node, run, sent

A_ID = "a1" * 20
B_ID = "b2" * 20
C_ID = "c3" * 20


class Wired:
    """Cores that know each other, links up, and a pump that carries their
    bus messages (a stand-in for the shell; nothing is lost unless told)."""

    def __init__(self, *node_ids: str) -> None:
        self.clock = FakeClock()
        self.nodes: dict[str, Node] = {}
        for seed, node_id in enumerate(node_ids):
            node, _ = make_node(seed=seed, node_id=node_id)
            node.clock = self.clock  # one wall clock for all
            self.nodes[node_id] = node
        for node in self.nodes.values():
            for i, other in enumerate(node_ids):
                if other != node.node_id:
                    peer = node.cluster.add(other, "127.0.0.1", 7711 + i, 17711 + i)
                    assert peer is not None
                    peer.link_up = True
            node.refresh_cluster_view()
        self.down: set[str] = set()

    def pump(self) -> list[object]:
        seen: list[object] = []
        while any(sent(n) for n in self.nodes.values()):
            for sender, node in self.nodes.items():
                out = sent(node)
                node.effects.clear()
                if sender in self.down:
                    continue
                for to, msg in out:
                    if to in self.nodes and to not in self.down:
                        seen.append(msg)
                        cj.receive(self.nodes[to], sender, msg)
        return seen

    def elapse(self, ms: int) -> None:
        """Let ``ms`` pass on every live node, in steps of 100 ms, carrying
        the messages at each step."""
        for _ in range(ms // 100):
            for node_id, node in self.nodes.items():
                if node_id not in self.down:
                    start = self.clock.ms
                    elapse(node, self.clock, 100)
                    self.clock.ms = start
            self.clock.ms += 100
            self.pump()


def _leaving(node: Node) -> None:
    node.cluster.set_leaving(True)
    node.refresh_cluster_view()
    assert node.leaving


def test_a_retry_0_job_added_on_a_leaving_node_is_queued_by_its_holder() -> None:
    """Two nodes, the first leaving: its ADDJOB RETRY 0 REPLICATE 1 was
    answered, and the copy on the other node stayed active for ever."""
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 0, "REPLICATE", 1)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str) and job_id.startswith("D-"), waiter.reply
    assert job_id not in a.jobs  # a leaving node keeps no copy
    [delivered] = get(b, "q")
    assert delivered[1] == job_id
    w.elapse(5000)
    assert get(b, "q") == []  # at most once


def test_a_retry_0_job_with_a_delay_added_on_a_leaving_node_is_queued_after_it() -> None:
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 0, "REPLICATE", 1, "DELAY", 2)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str), job_id
    assert b.jobs[job_id].state == JobState.ACTIVE
    w.elapse(1500)
    assert get(b, "q") == []  # not before the delay
    w.elapse(1000)
    [delivered] = get(b, "q")
    assert delivered[1] == job_id
    w.elapse(5000)
    assert get(b, "q") == []


def test_a_delayed_job_added_on_a_leaving_node_is_queued_after_the_delay() -> None:
    w = Wired(A_ID, B_ID)
    a, b = w.nodes[A_ID], w.nodes[B_ID]
    _leaving(a)
    waiter = run(a, "ADDJOB", "q", "hello", 0, "RETRY", 30, "REPLICATE", 1, "DELAY", 2)
    w.pump()
    job_id = waiter.reply
    assert isinstance(job_id, str), job_id
    w.elapse(1500)
    assert get(b, "q") == []
    w.elapse(1000)
    [delivered] = get(b, "q")
    assert delivered[1] == job_id
