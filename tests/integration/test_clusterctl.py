"""``disque-trio cluster create`` and ``cluster status`` against real nodes:
three nodes introduced to each other by the command, then seen, one line
each, before and after one of them is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from .conftest import NodeProcess

pytestmark = pytest.mark.slow


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "disque_trio", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_create_then_status_one_line_per_node(node_factory: Any) -> None:
    nodes: list[NodeProcess] = [node_factory("--cluster-node-timeout", "1000") for _ in range(3)]
    addresses = [f"127.0.0.1:{n.port}" for n in nodes]
    made = cluster("create", *addresses)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == "cluster of 3 nodes: every node knows every other"
    seen = cluster("status", addresses[1])
    assert seen.returncode == 0, seen.stderr
    header, *rows = seen.stdout.splitlines()
    assert header.split() == [
        "NODE",
        "ADDRESS",
        "STATE",
        "LINK",
        "JOBS",
        "QUEUES",
        "MEMORY",
        "AOF",
    ]
    assert sorted(r.split()[1] for r in rows) == sorted(addresses)
    assert sorted(r.split()[2] for r in rows) == ["myself", "ok", "ok"]
    assert all(r.split()[3] == "connected" and r.split()[7] == "off" for r in rows)
    nodes[2].kill(signal.SIGKILL)
    deadline = time.monotonic() + 15
    while True:
        seen = cluster("status", addresses[0])
        line = next(r for r in seen.stdout.splitlines() if addresses[2] in r)
        if line.split()[2] == "fail":
            break
        assert time.monotonic() < deadline, seen.stdout
        time.sleep(0.3)
    assert seen.returncode == 1
    assert line.split()[3:] == ["disconnected", "-", "-", "-", "-"]


def test_bad_arguments() -> None:
    assert cluster("create", "127.0.0.1:1").returncode == 2  # one node
    assert cluster("status", "a:1", "b:2").returncode == 2
    unreachable = cluster("status", "127.0.0.1:1")
    assert unreachable.returncode == 1 and "127.0.0.1:1" in unreachable.stderr
