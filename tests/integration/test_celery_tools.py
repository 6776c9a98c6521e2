"""Celery's own tools on a Disque cluster, through real processes: a worker,
``celery inspect`` and ``celery control``, ``celery events``, Flower's API,
and a node killed under them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from disque_trio.client import Client

from ..helpers import free_port
from .conftest import NodeProcess, form_cluster, url_of
from .frameworks.harness import HERE, Proc, Run

pytestmark = pytest.mark.slow

APP = "frameworks.celery_tools_app"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds it took; AssertionError after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def celery(run: Run, *args: str, timeout: float = 30) -> str:
    """A celery command line (``celery -A app ...``), its output."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, *args],
        cwd=HERE.parent,
        env=run.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.stdout + done.stderr


def send(run: Run, code: str) -> None:
    subprocess.run(
        [sys.executable, "-c", f"from {APP} import *\n{code}"],
        cwd=HERE.parent,
        env=run.env(),
        check=True,
        timeout=30,
    )


def start_worker(run: Run) -> Proc:
    argv = [sys.executable, "-m", "celery", "-A", APP, "worker", "--pool", "threads"]
    worker = run.start("worker", [*argv, "-c", "2", "-n", "tools@%h", "--loglevel", "INFO"])
    wait_for(lambda: "ready." in worker.output(), 60, "the worker to start")
    return worker


def pinged(run: Run) -> bool:
    return "pong" in celery(run, "inspect", "ping", "--timeout", "2")


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


@pytest.fixture
def run(tmp_path: Path) -> object:
    made: list[Run] = []

    def make(url: str) -> Run:
        r = Run("celery", url, tmp_path, retry=30)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_inspect_control_events_and_flower(
    node_factory: object, run: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = form_cluster(node_factory, 3)
    r: Run = run(url_of(nodes))  # type: ignore[operator]
    worker = start_worker(r)
    took = wait_for(lambda: pinged(r), 30, "inspect ping to answer")
    assert "tools@" in celery(r, "inspect", "ping", "--timeout", "2"), took
    registered = celery(r, "inspect", "registered", "--timeout", "2")
    assert "celery_tools_app.slow" in registered and "celery_tools_app.add" in registered
    # inspect active sees a task running.
    send(r, "slow.delay(6)")
    wait_for(
        lambda: "celery_tools_app.slow" in celery(r, "inspect", "active", "--timeout", "2"),
        20,
        "inspect active to list the running task",
    )
    # control rate_limit answers and the worker applies it.
    assert "new rate limit set successfully" in celery(
        r, "control", "rate_limit", "frameworks.celery_tools_app.add", "100/m", "--timeout", "2"
    )
    # control revoke: a queued task revoked by ID does not run; the others do.
    send(
        r,
        "import json, sys\n"
        "doomed = add.apply_async((1,), countdown=3)\n"
        "print(json.dumps(app.control.revoke(doomed.id, reply=True, timeout=3)))\n"
        "add.apply_async((2,), countdown=3)\n",
    )
    wait_for(
        lambda: "done 2" in r.record_path.read_text() if r.record_path.exists() else False,
        30,
        "the task not revoked to run",
    )
    time.sleep(1)
    assert "done 1" not in r.record_path.read_text()
    assert "Discarding revoked task" in worker.output(200)
    # celery events sees a task received, started and succeeded.
    events = r.start("events", [sys.executable, "-m", "celery", "-A", APP, "events", "--dump"])
    time.sleep(3)
    send(r, "add.delay(3)")
    wait_for(lambda: "task succeeded" in events.output(200), 30, "celery events to see a task")
    dump = events.output(200)
    assert "task received" in dump and "task started" in dump, dump
    events.stop()
    # Flower lists the worker and the tasks.
    port = free_port()
    monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", "1")  # its API on loopback
    flower = r.start(
        "flower",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            APP,
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
    )
    base = f"http://127.0.0.1:{port}"

    def flower_sees_worker() -> bool:
        try:
            workers = get_json(f"{base}/api/workers?refresh=1")
        except OSError:
            return False
        return isinstance(workers, dict) and any(w.startswith("tools@") for w in workers)

    wait_for(flower_sees_worker, 60, "Flower to list the worker")
    send(r, "add.delay(4)")

    def flower_sees_task() -> bool:
        tasks = get_json(f"{base}/api/tasks")
        return isinstance(tasks, dict) and any(
            t.get("name") == "frameworks.celery_tools_app.add" and t.get("state") == "SUCCESS"
            for t in tasks.values()
        )

    wait_for(flower_sees_task, 30, "Flower to list a task that succeeded")
    flower.stop()


def listener_node(nodes: list[NodeProcess]) -> NodeProcess:
    """The node the worker's pub/sub listener is on (its patterns)."""
    for node in nodes:
        with Client(f"127.0.0.1:{node.port}") as c:
            if "pubsub_patterns:0" not in c.info("stats"):
                return node
    raise AssertionError("no node has the worker's subscriptions")


def test_remote_control_moves_when_the_workers_node_is_killed(
    node_factory: object, run: object
) -> None:
    nodes = form_cluster(node_factory, 3)
    r: Run = run(url_of(nodes))  # type: ignore[operator]
    r.replicate = 2  # tasks are still added with a node down
    start_worker(r)
    wait_for(lambda: pinged(r), 30, "inspect ping to answer")
    victim = listener_node(nodes)
    assert victim.proc is not None
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    survivors = [n for n in nodes if n is not victim]
    r.url = url_of(survivors)  # the commands' own URL: the dead node is no use to them
    took = wait_for(lambda: pinged(r), 60, "inspect ping to answer after the kill")
    print(f"remote control answered again {took:.1f} s after the worker's node was killed")
    assert took < 20, f"remote control was dark {took:.1f} s after the worker's node died"
    # Events flow again too.
    events = r.start("events", [sys.executable, "-m", "celery", "-A", APP, "events", "--dump"])
    time.sleep(3)
    send(r, "add.delay(5)")
    wait_for(lambda: "task succeeded" in events.output(200), 30, "events after the kill")
    events.stop()
