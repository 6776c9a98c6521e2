"""Celery and Dramatiq on real nodes, through real processes: the
frameworks' own worker commands (Celery's threads pool, Dramatiq's one
process of 8 threads) and a producer process sending 2,000 tasks with
``delay()`` / ``send()`` (tests/integration/frameworks).

* a 3-node cluster, one node killed with SIGKILL while the producer sends,
  restarted a few seconds later: every task whose call returned runs at
  least once, the tasks the worker had started and not finished when the
  node died run to the end, the failing ones are retried twice and then
  reach the dead letter;
* one node, the worker stopped with SIGTERM in the middle and a new one
  started: the same, and the stopped worker left nothing behind for a
  RETRY to find (everything acknowledged or given back at once).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from disque_trio.client import Client

from .conftest import NodeProcess, form_cluster, url_of
from .frameworks.harness import COUNT, FAILING, Run, active_jobs, running, wait_until

pytestmark = pytest.mark.slow

FRAMEWORKS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(name) is None,
            reason=f"{name} is not installed (pip install -c constraints.txt -e '.[test]')",
        ),
    )
    for name in ("celery", "dramatiq")
]


def settled(run: Run, ports: list[int], sent: set[int]) -> tuple[bool, str]:
    """Every sent task done; every sent failing task run three times and
    dead-lettered. With what is missing, for the message."""
    records = run.records()
    missing = sorted(n for n in sent - FAILING if not records.done[n])
    short = sorted(n for n in sent & FAILING if records.started[n] < 3)
    if missing or short:
        return False, f"not done: {missing[:10]} ({len(missing)}), failing run < 3: {short}"
    letters = run.dead_letters(ports)
    unburied = sorted((sent & FAILING) - letters.keys())
    return not unburied, f"no dead letter for {unburied}"


def check_outcome(run: Run, ports: list[int], sent: set[int]) -> None:
    records = run.records()
    assert not any(records.done[n] for n in FAILING), "a failing task was done"
    letters = run.dead_letters(ports)
    assert set(letters) <= FAILING, (
        f"dead letters of tasks that do not fail: {set(letters) - FAILING}"
    )
    for n in sent & FAILING:
        letter = letters[n][0]
        assert letter.queue == ("celery" if run.framework == "celery" else "default")
        if run.framework == "dramatiq":  # Dramatiq's error reaches the broker's nack
            assert letter.error == f"ValueError: task {n} fails", letter
            assert "raise ValueError" in letter.traceback
            # The retries were NACK DELAYs of the one job (its counter says
            # so), or new jobs carrying Dramatiq's count when that could
            # not be done (a node out).
            retries = json.loads(letter.body)["options"].get("retries", 0)
            assert letter.nacks + retries >= 2, letter
        else:  # Celery rejects without saying why
            assert letter.error == "rejected without requeue"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_node_killed_and_restarted_loses_no_task(
    framework: str, node_factory: Any, tmp_path: Path
) -> None:
    """REPLICATE 2 on 3 nodes, RETRY 3. The node holding the most delivered
    jobs is killed (SIGKILL) a third of the way through the sends, while
    the worker runs on (its client moves to the other nodes), and started
    again 1.5 s later, empty. Then the same node is killed again together
    with the worker, as when the machine running both is lost: the tasks
    that worker had started and not finished (acks_late: unacknowledged)
    must run again, on a new worker, from the copies the other nodes
    hold."""
    nodes: list[NodeProcess] = form_cluster(node_factory, 3)
    ports = [n.port for n in nodes]
    run = Run(framework, url_of(nodes), tmp_path, retry=3, replicate=2)
    with running(run):
        worker = run.worker("worker-1")
        wait_until("the worker ready", lambda: _consumers(nodes) > 0, 60, worker)
        producer = run.producer()  # 2,000 tasks in 5 s
        wait_until(
            "a quarter of the tasks sent", lambda: len(run.sent()[0]) >= COUNT // 4, 60, producer
        )
        held = {n.port: len(active_jobs(n.port)) for n in nodes}
        victim = max(nodes, key=lambda n: held[n.port])
        victim.kill(signal.SIGKILL)
        time.sleep(1.5)
        victim.start()
        other = next(n for n in nodes if n is not victim)
        wait_until("the node back in the cluster", lambda: _usable(other) == 3, 30)
        # The machine lost, the producer still sending: the node and the
        # worker together.
        assert producer.alive()
        victim.kill(signal.SIGKILL)
        worker.stop(signal.SIGKILL, timeout=15)
        in_flight = run.records().in_flight()
        worker = run.worker("worker-2")
        time.sleep(1.5)
        victim.start()
        wait_until("the producer's end", lambda: not producer.alive(), 120)
        assert producer.wait(5) == 0, producer.output()
        sent, refused = run.sent()
        assert len(sent) >= COUNT * 0.9, (len(sent), refused[:5])
        outcome = [""]

        def check() -> bool:
            done, outcome[0] = settled(run, ports, sent)
            return done

        wait_until("every sent task run", check, 90, worker)
        records = run.records()
        check_outcome(run, ports, sent)
        assert all(records.started[n] >= 2 and records.done[n] for n in in_flight), {
            n: (records.started[n], records.done[n]) for n in in_flight
        }
        twice = sum(1 for n in sent if records.done[n] > 1)
        print(
            f"{framework}: sent {len(sent)}, refused {len(refused)}, killed {victim.port} "
            f"holding {held[victim.port]} active jobs, {len(in_flight)} tasks in flight on "
            f"the lost worker, {twice} tasks done twice or more"
        )
        assert worker.stop(signal.SIGTERM, timeout=30) == 0, worker.output()


def _consumers(nodes: list[NodeProcess]) -> int:
    """Clients blocked in GETJOB on the nodes (a worker waiting for jobs)."""
    total = 0
    for n in nodes:
        with Client(f"127.0.0.1:{n.port}", max_attempts=1, follow_producers=False) as c:
            info = c.info("clients")
        total += int(info.split("blocked_clients:")[1].split()[0])
    return total


def _usable(node: NodeProcess) -> int:
    """How many nodes the node's HELLO lists as usable."""
    with Client(f"127.0.0.1:{node.port}", max_attempts=1, follow_producers=False) as c:
        return sum(p.priority == 1 for p in c.hello().nodes)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_worker_stopped_mid_run_loses_nothing(
    framework: str, node: NodeProcess, tmp_path: Path
) -> None:
    """RETRY 60: a job the stopping worker neither acknowledged nor gave
    back would hold up the end for a minute."""
    run = Run(framework, f"disque://127.0.0.1:{node.port}", tmp_path, retry=60)
    with running(run):
        first = run.worker("worker-1")
        producer = run.producer()
        wait_until("600 tasks done", lambda: len(run.records().done) >= 600, 90, first)
        assert first.stop(signal.SIGTERM, timeout=30) == 0, first.output()
        stopped = run.records()
        # Nothing left delivered and unsettled: acknowledged or given back
        # (a retry's NACK DELAY, 1 s, is over after 2.5 s).
        time.sleep(2.5)
        assert active_jobs(node.port) == []
        second = run.worker("worker-2")
        wait_until("the producer's end", lambda: not producer.alive(), 120)
        assert producer.wait(5) == 0, producer.output()
        sent, refused = run.sent()
        assert len(sent) == COUNT, refused[:5]
        outcome = [""]

        def check() -> bool:
            done, outcome[0] = settled(run, [node.port], sent)
            return done

        wait_until("every sent task run", check, 90, second)
        check_outcome(run, [node.port], sent)
        records = run.records()
        assert stopped.in_flight() <= set(records.done)
        twice = sum(1 for n in sent if records.done[n] > 1)
        print(f"{framework}: {len(stopped.done)} done before the stop, {twice} twice or more")
        assert second.stop(signal.SIGTERM, timeout=30) == 0, second.output()
