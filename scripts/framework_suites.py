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

* ``dramatiq``: every test of Dramatiq's repository (``tests/``, at the
  tag of the pinned version, or ``FRAMEWORK_SUITES_DRAMATIQ_GIT``: a URL
  or a local git directory, whose HEAD is used when it lacks the tag) that
  takes the ``stub_broker`` fixture, with that fixture a ``DisqueBroker``
  on the nodes (``DRAMATIQ_CONFTEST`` replaces the repository's conftest).
* ``celery``: Celery's ``t/integration/test_tasks.py`` (and
  ``test_canvas.py`` with ``--celery-canvas``) from the sdist of the
  pinned version, with ``TEST_BROKER`` the nodes and a redis-server
  started for the run as the result backend, as the suite's own CI pairs
  a broker with a backend.

Dramatiq's and Celery's suites need packages of their own (pika, pytest's
timeout and rerun plugins, pytest-celery...): they run in a virtual
environment made once under the cache (``SUITE_PACKAGES``).
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

SUITE_PACKAGES = [
    "pytest",
    "redis",
    "pika",
    "pydantic",
    "pytest-timeout",
    "pytest-rerunfailures",
    "pytest-subtests",
    "pytest-order",
    "pytest-celery",
]

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

DRAMATIQ_CONFTEST = '''\
"""Dramatiq's tests on Disque nodes (scripts/framework_suites.py).

This replaces the repository's own conftest: its ``stub_broker`` fixture,
which every broker-parametrized test takes, is a ``DisqueBroker`` on the
nodes named by ``DISQUE_NODES``; tests that do not take it are not run.
The other fixtures are the originals' (result and rate-limiter backends:
the stub's, and Redis' on the redis-server of ``DRAMATIQ_REDIS_URL``;
memcached's are skipped).
"""

import logging
import os
import subprocess
import sys

import pytest
import redis

import dramatiq
from dramatiq import Worker
from dramatiq.results import backends as res_backends
from dramatiq.rate_limits import backends as rl_backends

from disque_trio.client import Client
from disque_trio.integrations.dramatiq import DisqueBroker

NODES = os.environ["DISQUE_NODES"].split(",")
logging.basicConfig(level=logging.INFO)


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if "stub_broker" in getattr(item, "fixturenames", ())]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _flush_nodes():
    for node in NODES:
        with Client(node) as client:
            client.call("DEBUG", "FLUSHALL")


@pytest.fixture()
def stub_broker():
    _flush_nodes()
    broker = DisqueBroker(url="disque://" + ",".join(NODES))
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()
    _flush_nodes()


@pytest.fixture()
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def info_logging():
    logger = logging.getLogger()
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(logging.DEBUG)


@pytest.fixture
def start_cli():
    proc = None

    def run(broker_module, *, extra_args=None, **kwargs):
        nonlocal proc
        kwargs.setdefault("bufsize", 0)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", broker_module, *(extra_args or [])], **kwargs
        )
        return proc

    yield run
    if proc is not None:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _redis_or_skip(client):
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("No connection to Redis server.")


def _redis_backend(backends):
    backend = backends.RedisBackend(url=os.environ.get("DRAMATIQ_REDIS_URL"))
    _redis_or_skip(backend.client)
    backend.client.flushall()
    return backend


@pytest.fixture
def redis_result_backend():
    return _redis_backend(res_backends)


@pytest.fixture
def memcached_result_backend():
    pytest.skip("memcached is not used here")


@pytest.fixture
def stub_result_backend():
    return res_backends.StubBackend()


@pytest.fixture(params=["memcached", "redis", "stub"])
def result_backend(request):
    return request.getfixturevalue(f"{request.param}_result_backend")


@pytest.fixture
def redis_rate_limiter_backend():
    return _redis_backend(rl_backends)


@pytest.fixture
def memcached_rate_limiter_backend():
    pytest.skip("memcached is not used here")


@pytest.fixture
def stub_rate_limiter_backend():
    return rl_backends.StubBackend()


@pytest.fixture(params=["memcached", "redis", "stub"])
def rate_limiter_backend(request):
    return request.getfixturevalue(f"{request.param}_rate_limiter_backend")
'''

CELERY_CONFIG = {"broker_transport": "disque_trio.integrations.celery:Transport"}


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
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port = 0

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
                        # The Dramatiq suite's fixture flushes the nodes
                        # between tests (DEBUG FLUSHALL), from loopback.
                        "--enable-debug-command",
                        "local",
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

    def start_redis(self) -> int:
        """A redis-server for the run (a result backend), on a free port."""
        if self.redis is None:
            server = shutil.which("redis-server")
            if server is None:
                raise SystemExit("redis-server is needed (apt install redis-server)")
            self.redis_port = free_port()
            self.redis = subprocess.Popen(
                [server, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            self._wait(self.redis_port)
        return self.redis_port

    def __exit__(self, *exc: object) -> None:
        for proc in [*self.procs, *([self.redis] if self.redis else [])]:
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


def _pytest(
    python: str, cwd: Path, args: list[str], env: dict[str, str], timeout: int
) -> tuple[dict[str, int], list[str], float]:
    """Run pytest; its counts, the failing tests' names and the seconds."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-q",
                "-rfE",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                *args,
            ],
            cwd=cwd,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\n1 errors (the run passed its {timeout} s)"
    took = time.monotonic() - started
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {
        kind.rstrip("s") if kind == "errors" else kind: int(n)
        for n, kind in re.findall(
            r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", summary
        )
    }
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return counts, failing, took


def suite_python() -> str:
    """The Python of a virtual environment for Dramatiq's and Celery's
    suites (this project with its celery and dramatiq extras, and
    SUITE_PACKAGES, under constraints.txt), made once in the cache."""
    venv = CACHE / "venv"
    python = venv / "bin" / "python"
    stamp = venv / "installed.txt"
    want = f"{ROOT}\n" + "\n".join(SUITE_PACKAGES) + "\n"
    if stamp.is_file() and stamp.read_text() == want:
        return str(python)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            str(ROOT / "constraints.txt"),
            "-e",
            f"{ROOT}[celery,dramatiq]",
            *SUITE_PACKAGES,
        ],
        check=True,
    )
    stamp.write_text(want)
    return str(python)


def dramatiq_tree() -> tuple[Path, str]:
    """Dramatiq's tests (its sdist ships them without their conftest and
    helpers) from its repository, at the pinned version's tag; and the
    commit they come from."""
    version = pinned("dramatiq")
    source = os.environ.get(
        "FRAMEWORK_SUITES_DRAMATIQ_GIT", "https://github.com/Bogdanp/dramatiq.git"
    )
    target = CACHE / f"dramatiq-tests-{version}"
    git_dir = CACHE / "dramatiq.git"
    if Path(source).is_dir():
        git_dir = Path(source)
    elif not git_dir.is_dir():
        subprocess.run(["git", "clone", "-q", "--bare", source, str(git_dir)], check=True)
    tag = f"v{version}"
    has_tag = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", "-q", "--verify", f"{tag}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    ref = tag if has_tag.returncode == 0 else "HEAD"
    if ref == "HEAD":
        print(f"dramatiq: {source} has no tag {tag}; its HEAD's tests are used", file=sys.stderr)
    commit = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", "--short", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "--git-dir", str(git_dir), "archive", ref, "tests"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "x"], input=archive, cwd=target, check=True)
    (target / "tests" / "conftest.py").write_text(DRAMATIQ_CONFTEST)
    return target, commit


def run_kombu(nodes: Nodes, args: argparse.Namespace) -> tuple[dict[str, int], list[str], float]:
    tree = sdist("kombu")
    (tree / "t" / "integration" / "test_disque.py").write_text(KOMBU_TESTS)
    return _pytest(
        sys.executable,
        tree,
        ["t/integration/test_disque.py"],
        {"DISQUE_NODES": nodes.addresses},
        1800,
    )


def run_dramatiq(
    nodes: Nodes, args: argparse.Namespace
) -> tuple[dict[str, int], list[str], float]:
    tree, commit = dramatiq_tree()
    args.source = f"dramatiq@{commit}"
    redis_port = nodes.start_redis()
    return _pytest(
        suite_python(),
        tree,
        ["tests", "--ignore", "tests/benchmarks", "--timeout", "120"],
        {
            "DISQUE_NODES": nodes.addresses,
            "DRAMATIQ_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        },
        3600,
    )


def run_celery(nodes: Nodes, args: argparse.Namespace) -> tuple[dict[str, int], list[str], float]:
    tree = sdist("celery")
    (tree / "integration-tests-config.json").write_text(json.dumps(CELERY_CONFIG))
    redis_port = nodes.start_redis()
    files = ["t/integration/test_tasks.py"]
    if args.celery_canvas:
        files.append("t/integration/test_canvas.py")
    return _pytest(
        suite_python(),
        tree,
        [*files, "--timeout", "120", "-p", "no:rerunfailures"],
        {
            "TEST_BROKER": "disque://" + nodes.addresses,
            "TEST_BACKEND": f"redis://127.0.0.1:{redis_port}/0",
            "REDIS_HOST": "127.0.0.1",
            "REDIS_PORT": str(redis_port),
        },
        3600,
    )


SUITES = {"kombu": run_kombu, "dramatiq": run_dramatiq, "celery": run_celery}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,3", help="cluster sizes, comma separated")
    parser.add_argument("--suite", action="append", choices=sorted(SUITES))
    parser.add_argument("--record", type=Path, help="append one JSON line per run")
    parser.add_argument(
        "--celery-canvas", action="store_true", help="Celery's test_canvas.py too (long)"
    )
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
            args.source = None
            with Nodes(size) as nodes:
                counts, failing, took = SUITES[suite](nodes, args)
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
                if args.source:
                    line["source"] = args.source
                if suite == "celery":
                    line["files"] = "tasks+canvas" if args.celery_canvas else "tasks"
                with args.record.open("a") as f:
                    f.write(json.dumps(line, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
