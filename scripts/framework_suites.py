"""Run the frameworks' own integration suites against Disque nodes.

    python scripts/framework_suites.py [--nodes 1,3] [--suite kombu] [--record FILE]

For each suite and cluster size it starts real ``disque-trio`` nodes on
loopback (a fresh directory each), points the suite's own base classes at
them, runs pytest, and prints the counts (passed, failed, skipped, errors)
with the failing tests' names. ``--record`` appends one JSON line per run
(the data ``docs/integrations.md`` quotes).

Suites:

* ``kombu``: kombu's ``t/integration/common.py`` base classes
  (``BasicFunctionality``, ``BaseExchangeTypes``, ``BaseTimeToLive``,
  ``BasePriority``, ``BaseMessage``, ``BaseEventLoop``, ``BaseFailover``)
  from the kombu sdist of the pinned version (``pip download``; needs the
  package index once, then the cache), subclassed with a connection to the
  nodes through ``disque_trio.integrations.celery:Transport``, as the
  suite's own Redis and RabbitMQ modules subclass them.

Dramatiq's broker-parametrized tests and Celery's ``t/integration`` are
not run by this script yet (docs/integrations.md says where they stand).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(
    os.environ.get("FRAMEWORK_SUITES_CACHE", Path(tempfile.gettempdir()) / "disque-suites")
)

KOMBU_TESTS = '''\
"""kombu's integration base classes on Disque nodes (scripts/framework_suites.py)."""

import os

import kombu
import pytest

from .common import (
    BaseEventLoop,
    BaseExchangeTypes,
    BaseFailover,
    BaseMessage,
    BasePriority,
    BaseTimeToLive,
    BasicFunctionality,
)

TRANSPORT = "disque_trio.integrations.celery:Transport"
NODES = os.environ["DISQUE_NODES"].split(",")


def get_connection(url):
    return kombu.Connection(url, transport=TRANSPORT)


@pytest.fixture()
def connection():
    return get_connection("disque://" + ",".join(NODES))


@pytest.fixture()
def invalid_connection():
    return kombu.Connection("disque://127.0.0.1:1", transport=TRANSPORT, connect_timeout=1)


@pytest.fixture()
def failover_connection():
    # The scheme alone names the transport here (its import registers
    # "disque" with kombu), as kombu's switch to an alternate URL expects.
    import disque_trio.integrations.celery  # noqa: F401

    return kombu.Connection("disque://127.0.0.1:1;disque://" + NODES[-1], connect_timeout=1)


class test_DisqueBasicFunctionality(BasicFunctionality):
    pass


class test_DisqueExchangeTypes(BaseExchangeTypes):
    pass


class test_DisqueTimeToLive(BaseTimeToLive):
    pass


class test_DisquePriority(BasePriority):
    pass


class test_DisqueMessage(BaseMessage):
    pass


class test_DisqueEventLoop(BaseEventLoop):
    pass


class test_DisqueFailover(BaseFailover):
    pass
'''


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port whose derived ones (web +1000, bus +10000) are free too,
    below the kernel's range for outgoing connections."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 30_000)
        if all(_bindable(p) for p in (port, port + 1000, port + 10000)):
            return port
    raise SystemExit("no free port triple found")


def pinned(package: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise SystemExit(f"{package} is not pinned in constraints.txt")


def sdist(package: str) -> Path:
    """The unpacked sdist of the pinned version, downloaded once."""
    version = pinned(package)
    target = CACHE / f"{package}-{version}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{package}=={version}",
            "-d",
            str(CACHE),
        ],
        check=True,
    )
    archive = next(CACHE.glob(f"{package}-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return target


class Nodes:
    """``count`` nodes on loopback, met into one cluster."""

    def __init__(self, count: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="disque-suite-"))
        self.ports = [free_port() for _ in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Nodes:
        for port in self.ports:
            workdir = self.dir / str(port)
            workdir.mkdir()
            log = open(workdir / "node.log", "wb")
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "disque_trio",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                    cwd=workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for port in self.ports:
            self._wait(port)
        for a, b in zip(self.ports, self.ports[1:], strict=False):
            self._call(a, "CLUSTER", "MEET", "127.0.0.1", str(b))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            sizes = [
                self._call(p, "CLUSTER", "INFO").count(
                    "cluster_known_nodes:" + str(len(self.ports))
                )
                for p in self.ports
            ]
            if all(sizes):
                break
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _call(port: int, *args: str) -> str:
        from disque_trio.client import Client

        with Client(f"127.0.0.1:{port}") as c:
            reply = c.call(*args)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    @staticmethod
    def _wait(port: int) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"node on port {port} did not start")

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)


def run_kombu(nodes: Nodes) -> tuple[dict[str, int], list[str], float]:
    tree = sdist("kombu")
    (tree / "t" / "integration" / "test_disque.py").write_text(KOMBU_TESTS)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
            "t/integration/test_disque.py",
            "-o",
            "addopts=",
        ],
        cwd=tree,
        env={**os.environ, "DISQUE_NODES": nodes.addresses},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    counts = {
        kind: int(n)
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", out)
    }
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return counts, failing, took


SUITES = {"kombu": run_kombu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,3", help="cluster sizes, comma separated")
    parser.add_argument("--suite", action="append", choices=sorted(SUITES))
    parser.add_argument("--record", type=Path, help="append one JSON line per run")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    for suite in args.suite or sorted(SUITES):
        for size in (int(n) for n in args.nodes.split(",")):
            with Nodes(size) as nodes:
                counts, failing, took = SUITES[suite](nodes)
            print(f"{suite} on {size} node(s): {counts} in {took:.0f} s")
            for name in failing:
                print(f"    {name}")
            if args.record:
                line = {
                    "commit": commit,
                    "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                    "suite": suite,
                    "nodes": size,
                    "counts": counts,
                    "failing": failing,
                    "seconds": round(took),
                }
                with args.record.open("a") as f:
                    f.write(json.dumps(line, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
