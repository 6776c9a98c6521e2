"""Fixtures that start real ``disque-trio`` processes on loopback."""

from __future__ import annotations

import itertools
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from disque_trio.client import Client

from ..helpers import free_port


class NodeProcess:
    """A ``python -m disque_trio`` child process and how to reach it."""

    def __init__(
        self,
        port: int,
        workdir: Path,
        args: list[str],
        nofile: int | None = None,
        python: str = sys.executable,
    ) -> None:
        self.port = port
        self.workdir = workdir
        self.args = args
        self.nofile = nofile  # the open files limit (soft and hard) to start it with
        # The interpreter it runs under: another venv's runs another release.
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        # Output goes to a file, not a pipe: a pipe nobody reads fills up
        # (64 KB) and a node that logs a lot then blocks on its next line.
        self.log_path = workdir / "node-output.log"
        self._log_from = 0  # where this start's output begins in the file

    def start(self, timeout: float = 15.0) -> None:
        cmd = [self.python, "-m", "disque_trio", *self.args]
        self.stop()  # a restart: reap the previous process and its pipe
        nofile = self.nofile
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = self._spawn(cmd, log, nofile)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}: {self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    # NOAUTH: up, with requirepass set.
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("node did not answer PING in time")

    def _spawn(self, cmd: list[str], log: BinaryIO, nofile: int | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=(
                (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
                if nofile is not None
                else None
            ),
        )

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=15)

    def output(self) -> str:
        """What the current (or last) process printed so far."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_from)
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=15)


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[object]:
    started: list[NodeProcess] = []

    def make(
        *extra: str,
        port: int | None = None,
        nofile: int | None = None,
        python: str = sys.executable,
    ) -> NodeProcess:
        port = port or free_port()
        workdir = tmp_path / f"node-{port}"
        workdir.mkdir(exist_ok=True)
        args = ["--port", str(port), "--bind", "127.0.0.1", *extra]
        node = NodeProcess(port, workdir, args, nofile, python)
        started.append(node)
        node.start()
        return node

    yield make
    for node in started:
        node.stop()


@pytest.fixture
def node(node_factory: object) -> NodeProcess:
    return node_factory()  # type: ignore[operator,no-any-return]


def url_of(nodes: list[NodeProcess]) -> str:
    """The client URL naming every node."""
    return "disque://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


def form_cluster(node_factory: object, count: int, *extra: str) -> list[NodeProcess]:
    """``count`` nodes (node timeout 1 s), met in a chain; returns once
    every node's HELLO lists them all as usable."""
    make = node_factory
    assert callable(make)
    nodes: list[NodeProcess] = [
        make("--cluster-node-timeout", "1000", *extra) for _ in range(count)
    ]
    for a, b in itertools.pairwise(nodes):
        with Client(f"127.0.0.1:{a.port}") as c:
            c.call("CLUSTER", "MEET", "127.0.0.1", b.port)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sizes = []
        for n in nodes:
            with Client(f"127.0.0.1:{n.port}") as c:
                hello = c.hello()
            sizes.append(sum(p.priority == 1 for p in hello.nodes))
        if sizes == [count] * count:
            return nodes
        time.sleep(0.1)
    raise AssertionError("the cluster did not form")


# The last release before bus protocol 4 (POSTPONE) and its negotiation: it
# speaks protocol 3 only, and refuses any other in a handshake.
PREVIOUS_RELEASE = "edc387141e8f0478620c337c5e63f6d3d7e54d61"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a new virtual environment holding the release
    before, installed from its commit in this clone's history (with its
    own constraints.txt). Skipped, saying why, in a clone without that
    history."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", PREVIOUS_RELEASE + "^{commit}"],
        capture_output=True,
        timeout=30,
    )
    if known.returncode:
        pytest.skip(f"commit {PREVIOUS_RELEASE[:7]} is not in this clone (shallow?)")
    base = tmp_path_factory.mktemp("previous-release")
    src = base / "src"
    src.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE],
        capture_output=True,
        check=True,
        timeout=60,
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=120)
    python = str(base / "venv" / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(src / "constraints.txt"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python
