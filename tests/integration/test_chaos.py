"""Chaos against real node processes: kill -9, SIGSTOP and partitions under load.

Three ``disque-trio`` processes with the AOF on form a cluster (CLUSTER
MEET). Producers and consumers on every node, through redis-py, keep a
ledger: each job ID with the time its ADDJOB was answered, every delivery
(GETJOB reply) with its time, and the time of the first ACKJOB answer for
each job. Meanwhile a fault loop, on a schedule drawn from a seed, kill -9s
a node and restarts it (same port, same dir: it reloads its AOF and
nodes.conf), SIGSTOPs one for a few seconds then SIGCONTs it, and, where the
machine allows it, cuts the network between nodes. Then everything heals,
the cluster settles, consumers drain, and keep polling for a while (the
tail) to see stale copies come back.

Clients survive every fault the way a real client must: on a connection
error or a timeout they drop the connection and go to another node. Nothing
is retried blindly: redis-py's own retries are off (its default retries a
command three times on a connection error, which would add a job twice). An
ADDJOB whose reply was lost is not in the ledger as added; its job may
still be delivered (it is then acked like any other). An ACKJOB whose reply
was lost is sent again, to any node, until one answers: acks are idempotent.

What is checked
---------------

1. **No acknowledged job is lost.** Every job whose ADDJOB was answered
   with an ID is delivered and acked by the end of the drain, unless its TTL
   ran out (the TTL is set well beyond the run). ``appendfsync everysec``
   does not excuse anything here: kill -9 keeps the page cache, only a
   power loss would lose the last second.

2. **Deliveries after the ack.** The property is: no delivery of J is
   *answered* after J's ACKJOB was answered. Times are the client's: when
   the GETJOB reply arrived (a GETJOB already blocked when the ack happened
   counts by its reply), and when the ACKJOB reply arrived.

   The node cannot promise it outright, and neither does the original
   Disque ("best effort"): ACKJOB is answered once the ack is recorded (and
   in the AOF) on the node that got it; the other holders of the job learn
   it asynchronously (SETACK, retried with back-off until every holder
   confirmed with GOTACK, then DELJOB; see core/clusterjobs.py). A holder
   that has not heard of the ack re-queues its copy at its retry time.
   Before each re-queue it sends WILLQUEUE to the other holders, 500 ms
   ahead (still 500 ms ahead after a stall, and for a job reloaded from the
   AOF: two fixes this test led to); a holder that has the job acked (or
   acked and collected within the last minute) answers SETACK, so the
   re-queue does not happen when that answer comes back in time. A peer's
   outbox keeps the SETACK while a holder is down, and sends it when the
   link comes back. The window therefore stays open:

   * while the SETACK is in flight (a holder re-queued and a blocked
     consumer got the copy just before the SETACK arrived): bounded by the
     bus latency; allowed here up to ``INFLIGHT_S``;
   * while the node that took the ack, or the holder, is down, stopped or
     cut off: the SETACK cannot arrive and the WILLQUEUE is not answered.
     The ack survives (AOF), and reaches every holder once everything
     heals.

   So the test measures every late delivery and classifies it:

   * *unexplained*, whatever the faults: delivered by the very node that
     answered the ACKJOB while holding the job, more than ``INFLIGHT_S``
     after it (ACKED never goes back, and the ack is in that node's AOF
     before the reply);
   * *fault*: a fault was active, or had ended less than ``SETTLE_S``
     before, at some moment between the ack and the delivery;
   * *in flight*: within ``INFLIGHT_S`` of the ack (this also absorbs the
     client's own timing: two replies recorded by two threads);
   * *unexplained*: any other.

   It asserts that there is no unexplained one, and bounds the fault ones:
   each is answered at most ``LATE_AFTER_HEAL_S`` after the end of the last
   fault before it (once everything is healed, the ack reaches every holder
   within a retry period, so no stale copy comes back later than that).
   After the tail, with no fault at all, no node may still hold an acked
   job as active or queued.

Partitions
----------
Nodes on one loopback interface cannot be partitioned without a packet
filter, which this machine does not have (no iptables or nft), and firewall
rules in the host's namespace would touch other users of the machine. So
``test_chaos_with_partitions`` runs every node in its own network namespace
(``ip netns``), joined by veth pairs to a bridge in a hub namespace; the
test's client threads enter the hub namespace (setns(2)). A partition is a
pair of blackhole routes (``ip route add blackhole``) in two nodes'
namespaces: packets between them vanish, as on a real network, while
clients still reach both sides. Everything lives in namespaces the test
creates and deletes (a leftover from a killed run is deleted by the next
run); the host's network is never touched. Where namespaces cannot be
made (not root, no ``ip``), the test is skipped with the reason, and
partitions are left to the simulator (``python -m sim``), which covers
them with isolation, halves, one-way cuts and clogged links.

Running it
----------
CI runs the short version (a fixed seed, 20 s of faults per test, about
30 s each). By hand::

    DISQUE_CHAOS_SECONDS=300 DISQUE_CHAOS_FSYNC=everysec DISQUE_CHAOS_SEED=7 \\
        python -m pytest tests/integration/test_chaos.py -s

``DISQUE_CHAOS_FAULTS=stop`` (a comma-separated list of ``kill``, ``stop``,
``isolate``, ``cut``) draws only those faults. ``-s`` shows the summary of
each run (jobs, deliveries, faults, late deliveries, each late delivery). A
failure prints the seed, the fault schedule as planned and as run, the jobs
involved with their state on every node, and the node logs' tails; every
run writes its whole ledger to ``chaos-ledger.json`` in the test's
temporary directory, beside the nodes' directories and logs.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..helpers import free_port

pytestmark = pytest.mark.slow

T = TypeVar("T")

NODES = 3
QUEUE = "chaos"
RETRY_S = 2  # ADDJOB RETRY: a short one, so that re-queues happen during the run
ADD_TIMEOUT_MS = 2000  # ADDJOB's replication timeout
GETJOB_TIMEOUT_MS = 300
SOCKET_TIMEOUT_S = 4.0  # longer than any command may block: beyond it, the node is stuck
NODE_TIMEOUT_MS = 1500  # cluster-node-timeout: failures are detected during the faults
PRODUCE_PAUSE_S = 0.03  # between two ADDJOBs of a producer
NO_ACK_RATE = 0.03  # a consumer "crashes" before acking: RETRY brings the job back
INFLIGHT_S = 0.5  # a late delivery this close to the ack: the SETACK was in flight
SETTLE_S = 3.0  # after a fault ends, links and failure flags need this long
LATE_AFTER_HEAL_S = RETRY_S + SETTLE_S + 2.0
SETTLE_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 45.0
TAIL_S = 2 * RETRY_S + 1.5  # polling on after the drain: stale copies come back by then
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Settings:
    seconds: float
    fsync: str
    seed: int
    kinds: tuple[str, ...] | None = None  # fault kinds to draw from (default: all)

    @classmethod
    def from_env(cls) -> Settings:
        fsync = os.environ.get("DISQUE_CHAOS_FSYNC", "always")
        if fsync not in ("always", "everysec", "no"):
            raise ValueError(f"DISQUE_CHAOS_FSYNC must be always, everysec or no, not {fsync!r}")
        kinds = os.environ.get("DISQUE_CHAOS_FAULTS")
        return cls(
            seconds=float(os.environ.get("DISQUE_CHAOS_SECONDS", "20")),
            fsync=fsync,
            seed=int(os.environ.get("DISQUE_CHAOS_SEED", "20240611")),
            kinds=tuple(kinds.split(",")) if kinds else None,
        )

    @property
    def ttl(self) -> int:
        # Long enough that nothing expires during the run, the drain included.
        return int(max(600, 2 * self.seconds + 300))


# ----------------------------------------------------------------- topology


class Topology:
    """Where the nodes listen and how the test reaches them."""

    partitions = False

    def address(self, index: int) -> tuple[str, int]:
        raise NotImplementedError

    def command_prefix(self, index: int) -> list[str]:
        return []

    def run_inside(self, fn: Callable[[], T]) -> T:
        """Run the scenario where the client sockets must be opened."""
        return fn()

    def cut(self, a: int, b: int) -> None:
        raise NotImplementedError

    def heal(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class LoopbackTopology(Topology):
    def __init__(self, count: int) -> None:
        self.ports = [free_port() for _ in range(count)]

    def address(self, index: int) -> tuple[str, int]:
        return "127.0.0.1", self.ports[index]


_CLONE_NEWNET = 0x40000000
NETNS_PREFIX = "dqchaos-"
NODE_PORT = 7711


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _enter_netns(name: str) -> None:
    """Move the calling thread (and the threads it starts) into a namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def _delete_stale_namespaces() -> None:
    """Namespaces left by a chaos run whose process is gone (killed)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    for line in done.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        pid = name[len(NETNS_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _kill_namespace_processes(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


def _kill_namespace_processes(name: str) -> None:
    """Node processes still running in one of our namespaces (orphans of a
    killed run, or of a test that failed half-way)."""
    done = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=20
    )
    for pid in done.stdout.split():
        if pid.isdigit() and int(pid) != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)


class NetnsTopology(Topology):
    """Each node in its own network namespace, veth-linked to a bridge in a
    hub namespace where the test's clients live. Partitions are blackhole
    routes between two nodes' addresses."""

    partitions = True

    def __init__(self, count: int) -> None:
        tag = f"{NETNS_PREFIX}{os.getpid()}-{random.getrandbits(24):06x}"
        self.hub = f"{tag}-hub"
        self.names = [f"{tag}-n{i}" for i in range(count)]
        self.ips = [f"10.201.7.{i + 1}" for i in range(count)]
        self.created: list[str] = []
        self.routes: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    @classmethod
    def create_or_skip(cls, count: int) -> NetnsTopology:
        if sys.platform != "linux":
            pytest.skip("partitions need Linux network namespaces")
        if os.geteuid() != 0:
            pytest.skip("partitions need root (ip netns); left to the simulator")
        if shutil.which("ip") is None:
            pytest.skip("partitions need iproute2's ip (apt-get install iproute2)")
        topo = cls(count)
        try:
            _delete_stale_namespaces()
            topo._build()
        except (OSError, subprocess.SubprocessError) as e:
            topo.destroy()
            pytest.skip(f"network namespaces unavailable here: {e}")
        return topo

    def _build(self) -> None:
        for name in (self.hub, *self.names):
            _ip("netns", "add", name)
            self.created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("-n", self.hub, "addr", "add", "10.201.7.254/24", "dev", "br0")
        for i, (name, ip) in enumerate(zip(self.names, self.ips, strict=True)):
            _ip(
                *("link", "add", "eth0", "netns", name, "type", "veth"),
                *("peer", "name", f"b{i}", "netns", self.hub),
            )
            _ip("-n", self.hub, "link", "set", f"b{i}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")

    def address(self, index: int) -> tuple[str, int]:
        return self.ips[index], NODE_PORT

    def command_prefix(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[index]]

    def run_inside(self, fn: Callable[[], T]) -> T:
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                _enter_netns(self.hub)
                outcome["value"] = fn()
            except BaseException as e:
                outcome["error"] = e

        thread = threading.Thread(target=body, name="chaos-hub", daemon=True)
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]  # type: ignore[no-any-return]

    def cut(self, a: int, b: int) -> None:
        with self.lock:
            for x, y in ((a, b), (b, a)):
                _ip("-n", self.names[x], "route", "add", "blackhole", f"{self.ips[y]}/32")
                self.routes.append((x, y))

    def heal(self) -> None:
        with self.lock:
            while self.routes:
                x, y = self.routes.pop()
                _ip("-n", self.names[x], "route", "del", "blackhole", f"{self.ips[y]}/32")

    def destroy(self) -> None:
        with self.lock:
            for name in reversed(self.created):
                if name != self.hub:
                    _kill_namespace_processes(name)
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
            self.created.clear()
            self.routes.clear()


# -------------------------------------------------------------------- nodes


class ChaosNode:
    """One node process: started, killed, restarted, stopped, continued.
    Its output goes to ``node.log`` in its directory (a pipe nobody reads
    would fill up and freeze it)."""

    def __init__(self, index: int, topo: Topology, workdir: Path, settings: Settings) -> None:
        self.index = index
        self.topo = topo
        self.host, self.port = topo.address(index)
        self.workdir = workdir
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.stopped = False
        self.lock = threading.Lock()
        self.incarnation = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "node.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *self.topo.command_prefix(self.index),
            sys.executable,
            *("-m", "disque_trio"),
            *("--port", str(self.port), "--bind", self.host, "--web-port", "0"),
            *("--appendonly", "yes", "--appendfsync", self.settings.fsync),
            *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
        ]
        with self.lock:
            self._reap()
            self.incarnation += 1
            self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed by _reap)
            self.log.write(f"==== test: start #{self.incarnation} {time.ctime()}\n".encode())
            self.log.flush()
            proc = self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"node {self.index} exited with {proc.returncode}: {self.log_tail()}"
                )
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"node {self.index} did not answer PING in time: {self.log_tail()}")

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.settimeout(1.0)
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def send(self, sig: int) -> None:
        with self.lock:
            assert self.proc is not None and self.proc.poll() is None
            self.proc.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False
            elif sig == signal.SIGKILL:
                self.proc.wait(timeout=15)

    def _reap(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                if self.stopped:
                    proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=15)
        self.stopped = False
        if self.log is not None:
            self.log.close()
            self.log = None

    def destroy(self) -> None:
        with self.lock:
            self._reap()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def connect(host: str, port: int, timeout: float = SOCKET_TIMEOUT_S) -> redis.Redis:
    # retry=Retry(NoBackoff(), 0): redis-py retries a command three times on
    # a connection error by default, which would send an ADDJOB again.
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )  # connects on the first command: errors come from execute_command


def query(node: ChaosNode, *args: Any) -> Any:
    client = connect(node.host, node.port, timeout=5.0)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


# ------------------------------------------------------------------- ledger


@dataclass
class Added:
    job_id: str
    body: str
    t: float  # when the ADDJOB reply (the ID) arrived
    node: int
    repl: int


@dataclass
class Delivery:
    job_id: str
    body: str
    t_sent: float
    t: float  # when the GETJOB reply arrived
    node: int
    consumer: int


@dataclass
class Ack:
    t: float  # when the first ACKJOB reply arrived
    node: int
    known: bool  # the node held the job (else, or not sure: a dummy ack)


@dataclass
class FaultRecord:
    kind: str
    nodes: tuple[int, ...]
    start: float
    end: float = float("inf")


@dataclass
class Ledger:
    t0: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    attempts: dict[str, int] = field(default_factory=dict)  # body -> node asked
    added: dict[str, Added] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # bodies whose ADDJOB reply was lost
    refused: dict[str, int] = field(default_factory=dict)  # command and error -> count
    deliveries: list[Delivery] = field(default_factory=list)
    acks: dict[str, Ack] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    client_errors: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def all_added_acked(self) -> bool:
        with self.lock:
            return all(job_id in self.acks for job_id in self.added)

    def missing(self) -> list[str]:
        with self.lock:
            return [job_id for job_id in self.added if job_id not in self.acks]

    def refusal(self, error: str) -> None:
        """An error reply, counted by command and error code."""
        key = " ".join(error.split()[:2])
        with self.lock:
            self.refused[key] = self.refused.get(key, 0) + 1

    def error(self) -> None:
        with self.lock:
            self.client_errors += 1


# ------------------------------------------------------------------ clients


class Session:
    """A client's connection to one node at a time: on an error it goes to
    the next node, and back home after a while."""

    def __init__(self, nodes: list[ChaosNode], home: int, ledger: Ledger) -> None:
        self.nodes = nodes
        self.home = home
        self.current = home
        self.ledger = ledger
        self.client: redis.Redis | None = None
        self.left_home = 0.0

    def get(self) -> tuple[int, redis.Redis]:
        if self.current != self.home and time.monotonic() - self.left_home > 5.0:
            self._switch(self.home)
        if self.client is None:
            node = self.nodes[self.current]
            self.client = connect(node.host, node.port)
        return self.current, self.client

    def failed(self) -> None:
        self.ledger.error()
        if self.current == self.home:
            self.left_home = time.monotonic()
        self._switch((self.current + 1) % len(self.nodes))
        time.sleep(0.05)

    def _switch(self, index: int) -> None:
        self.close()
        self.current = index

    def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None


CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


class Worker(threading.Thread):
    def __init__(self, name: str, body: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.body()
        except BaseException as e:
            self.error = e


def producer(
    index: int, nodes: list[ChaosNode], ledger: Ledger, stop: threading.Event, settings: Settings
) -> None:
    rng = random.Random(f"{settings.seed}-producer-{index}")
    session = Session(nodes, index, ledger)
    seq = 0
    try:
        while not stop.is_set():
            seq += 1
            body = f"p{index}-{seq}"
            repl = rng.choice((2, 3))
            node, client = session.get()
            with ledger.lock:
                ledger.attempts[body] = node
            try:
                job_id = client.execute_command(
                    *("ADDJOB", QUEUE, body, ADD_TIMEOUT_MS, "REPLICATE", repl),
                    *("RETRY", RETRY_S, "TTL", settings.ttl),
                )
            except redis.ResponseError as e:
                ledger.refusal(f"ADDJOB {e}")
            except CONNECTION_ERRORS:
                with ledger.lock:
                    ledger.unknown.add(body)
                session.failed()
            else:
                t = ledger.now()
                with ledger.lock:
                    ledger.added[job_id] = Added(job_id, body, t, node, repl)
            stop.wait(PRODUCE_PAUSE_S)
    finally:
        session.close()


def consumer(
    index: int, nodes: list[ChaosNode], ledger: Ledger, stop: threading.Event, settings: Settings
) -> None:
    rng = random.Random(f"{settings.seed}-consumer-{index}")
    session = Session(nodes, index, ledger)
    to_ack: list[str] = []
    try:
        while not stop.is_set():
            node, client = session.get()
            if to_ack:
                try:
                    known = client.execute_command("ACKJOB", *to_ack)
                except CONNECTION_ERRORS:
                    session.failed()  # acked or not: send it again elsewhere
                    continue
                except redis.ResponseError as e:
                    ledger.refusal(f"ACKJOB {e}")
                    session.failed()
                    continue
                t = ledger.now()
                with ledger.lock:
                    for job_id in to_ack:
                        if job_id not in ledger.acks:
                            ledger.acks[job_id] = Ack(t, node, known == len(to_ack))
                to_ack = []
                continue
            t_sent = ledger.now()
            try:
                reply = client.execute_command(
                    "GETJOB", "TIMEOUT", GETJOB_TIMEOUT_MS, "COUNT", 4, "FROM", QUEUE
                )
            except CONNECTION_ERRORS:
                session.failed()
                continue
            except redis.ResponseError as e:
                ledger.refusal(f"GETJOB {e}")
                session.failed()
                continue
            if not reply:
                continue
            t = ledger.now()
            with ledger.lock:
                for _queue, job_id, body in reply:
                    ledger.deliveries.append(Delivery(job_id, body, t_sent, t, node, index))
            for _queue, job_id, _body in reply:
                if rng.random() >= NO_ACK_RATE:
                    to_ack.append(job_id)
    finally:
        session.close()


# ------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start of the fault phase
    kind: str  # kill | stop | isolate | cut
    node: int
    duration: float
    peer: int = -1

    def describe(self) -> str:
        what = {
            "kill": f"kill -9 node {self.node}, restart after {self.duration:.1f}s",
            "stop": f"SIGSTOP node {self.node} for {self.duration:.1f}s",
            "isolate": f"cut node {self.node} from the others for {self.duration:.1f}s",
            "cut": f"cut nodes {self.node}<->{self.peer} for {self.duration:.1f}s",
        }[self.kind]
        return f"t+{self.at:5.1f}s {what}"


FAULT_KINDS = ("kill", "stop", "isolate", "cut")


def plan_faults(
    seed: int, seconds: float, partitions: bool, only: tuple[str, ...] | None = None
) -> list[Fault]:
    """The schedule a seed gives: one fault at a time, a gap between them.
    Kinds come from a shuffled bag (every kind once, then again), so that
    even a short run has each of them."""
    rng = random.Random(seed)
    kinds = ["kill", "stop"] + (["isolate", "cut"] if partitions else [])
    if only is not None:
        unknown = set(only) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"DISQUE_CHAOS_FAULTS: unknown kinds {sorted(unknown)}")
        kinds = [k for k in kinds if k in only]
    if not kinds:
        pytest.skip(f"no fault kind left for this test in {only}")
    faults: list[Fault] = []
    bag: list[str] = []
    t = rng.uniform(1.0, 2.5)
    while t < seconds:
        if not bag:
            bag = rng.sample(kinds, len(kinds))
        kind = bag.pop()
        node = rng.randrange(NODES)
        duration = {
            "kill": rng.uniform(0.2, 3.0),
            "stop": rng.uniform(1.0, 4.0),
            "isolate": rng.uniform(2.0, 6.0),
            "cut": rng.uniform(2.0, 6.0),
        }[kind]
        peer = (node + rng.randrange(1, NODES)) % NODES if kind == "cut" else -1
        faults.append(Fault(round(t, 2), kind, node, round(duration, 2), peer))
        t += duration + rng.uniform(1.0, 3.0)
    return faults


def run_fault(fault: Fault, nodes: list[ChaosNode], topo: Topology, ledger: Ledger) -> None:
    node = nodes[fault.node]
    if fault.kind == "kill":
        record = FaultRecord("kill", (fault.node,), ledger.now())
        ledger.faults.append(record)
        node.send(signal.SIGKILL)
        time.sleep(fault.duration)
        node.start()  # same port, same dir: AOF and nodes.conf reloaded
        record.end = ledger.now()
    elif fault.kind == "stop":
        record = FaultRecord("stop", (fault.node,), ledger.now())
        ledger.faults.append(record)
        node.send(signal.SIGSTOP)
        time.sleep(fault.duration)
        node.send(signal.SIGCONT)
        record.end = ledger.now()
    else:
        others = [i for i in range(NODES) if i != fault.node]
        peers = others if fault.kind == "isolate" else [fault.peer]
        record = FaultRecord(fault.kind, (fault.node, *peers), ledger.now())
        ledger.faults.append(record)
        try:
            for peer in peers:
                topo.cut(fault.node, peer)
            time.sleep(fault.duration)
        finally:
            topo.heal()
            record.end = ledger.now()


# ----------------------------------------------------------------- scenario


def nodes_lines(node: ChaosNode) -> list[list[str]]:
    return [line.split() for line in query(node, "CLUSTER", "NODES").splitlines()]


def settled(nodes: list[ChaosNode]) -> bool:
    """Every node knows every other one, linked, with no failure flag."""
    try:
        for node in nodes:
            lines = nodes_lines(node)
            if len(lines) != len(nodes):
                return False
            for fields in lines:
                if "myself" in fields[2]:
                    continue
                if fields[-1] != "connected" or "fail" in fields[2]:
                    return False
    except (redis.RedisError, OSError):
        return False
    return True


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@dataclass
class Outcome:
    ledger: Ledger
    planned: list[Fault]
    drained: bool
    drain_seconds: float
    settled: bool
    stale: dict[str, list[str]]  # acked job -> "node N: state"
    lost_state: dict[str, list[str]]  # job not acked -> "node N: SHOW fields"
    worker_errors: list[str]
    phases: dict[str, float]


def scenario(nodes: list[ChaosNode], topo: Topology, settings: Settings) -> Outcome:
    planned = plan_faults(settings.seed, settings.seconds, topo.partitions, settings.kinds)
    for node in nodes:
        node.start()
    for a, b in itertools.pairwise(nodes):
        assert query(a, "CLUSTER", "MEET", b.host, b.port) == "OK"
    assert wait_until(lambda: settled(nodes), SETTLE_TIMEOUT_S), "the cluster did not form"

    ledger = Ledger()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    producers = [
        Worker(f"producer-{i}", partial(producer, i, nodes, ledger, stop_producing, settings))
        for i in range(NODES)
    ]
    consumers = [
        Worker(f"consumer-{i}", partial(consumer, i, nodes, ledger, stop_consuming, settings))
        for i in range(NODES)
    ]
    phases: dict[str, float] = {}
    workers = producers + consumers
    try:
        for w in workers:
            w.start()
        start = time.monotonic()
        for fault in planned:
            delay = start + fault.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            run_fault(fault, nodes, topo, ledger)
        time.sleep(max(0.0, start + settings.seconds - time.monotonic()))
        phases["faults_end"] = ledger.now()
        stop_producing.set()
        for w in producers:
            w.join(timeout=SOCKET_TIMEOUT_S + 5)
        is_settled = wait_until(lambda: settled(nodes), SETTLE_TIMEOUT_S)
        phases["settled"] = ledger.now()
        drain_start = time.monotonic()
        drained = wait_until(ledger.all_added_acked, DRAIN_TIMEOUT_S)
        drain_seconds = time.monotonic() - drain_start
        phases["drained"] = ledger.now()
        time.sleep(TAIL_S)
    finally:
        stop_producing.set()
        stop_consuming.set()
        for w in workers:
            w.join(timeout=SOCKET_TIMEOUT_S + 5)
    phases["end"] = ledger.now()
    worker_errors = [
        f"{w.name}: {''.join(traceback.format_exception(w.error))}"
        for w in workers
        if w.error is not None
    ]
    worker_errors += [f"{w.name}: still running" for w in workers if w.is_alive()]
    acked = set(ledger.acks)
    stale: dict[str, list[str]] = {}
    for node in nodes:
        cursor, ids = query(
            node, "JSCAN", 0, "BUSYLOOP", "STATE", "active", "STATE", "queued", "REPLY", "id"
        )
        assert str(cursor) == "0"
        for job_id in ids:
            if job_id in acked:
                state = query(node, "SHOW", job_id)
                label = state[state.index("state") + 1] if state else "gone"
                stale.setdefault(job_id, []).append(f"node {node.index}: {label}")
    lost_state: dict[str, list[str]] = {}
    for job_id in ledger.missing()[:20]:
        lost_state[job_id] = [f"node {n.index}: {query(n, 'SHOW', job_id)}" for n in nodes]
    return Outcome(
        ledger,
        planned,
        drained,
        drain_seconds,
        is_settled,
        stale,
        lost_state,
        worker_errors,
        phases,
    )


# ----------------------------------------------------------------- analysis


@dataclass
class Late:
    job_id: str
    ack: Ack
    delivery: Delivery
    kind: str  # inflight | fault | unexplained
    after_heal: float  # seconds after the end of the last fault before it

    def describe(self) -> str:
        d = self.delivery
        return (
            f"{self.job_id}: acked t={self.ack.t:.3f} on node {self.ack.node}"
            f"{'' if self.ack.known else ' (dummy ack)'}, delivered t={d.t:.3f} "
            f"(+{d.t - self.ack.t:.3f}s, GETJOB sent t={d.t_sent:.3f}) by node {d.node}: "
            f"{self.kind}, {self.when()}"
        )

    def when(self) -> str:
        if self.after_heal < 0:
            return "during a fault"
        if self.after_heal == float("inf"):
            return "no fault before it"
        return f"{self.after_heal:.1f}s after the last fault ended"


def classify_late(ledger: Ledger) -> list[Late]:
    faults = sorted(ledger.faults, key=lambda f: f.start)
    late: list[Late] = []
    for d in ledger.deliveries:
        ack = ledger.acks.get(d.job_id)
        if ack is None or d.t <= ack.t:
            continue
        overlapping = any(f.start <= d.t and f.end + SETTLE_S >= ack.t for f in faults)
        ended = [f.end for f in faults if f.start <= d.t]
        after_heal = d.t - max(ended) if ended else float("inf")
        if d.t - ack.t > INFLIGHT_S and ack.known and d.node == ack.node:
            # The node held the job and acked it (in its AOF before the
            # reply): ACKED never goes back, whatever the faults.
            kind = "unexplained"
        elif overlapping:
            kind = "fault"
        elif d.t - ack.t <= INFLIGHT_S:
            kind = "inflight"
        else:
            kind = "unexplained"
        late.append(Late(d.job_id, ack, d, kind, after_heal))
    return late


def summarize(outcome: Outcome, settings: Settings, late: list[Late]) -> str:
    ledger = outcome.ledger
    delivered_ids = {d.job_id for d in ledger.deliveries}
    kinds = [f.kind for f in ledger.faults]
    counts = {k: kinds.count(k) for k in FAULT_KINDS}
    by_kind = {
        k: sum(1 for x in late if x.kind == k) for k in ("inflight", "fault", "unexplained")
    }
    phases = {k: round(v, 1) for k, v in outcome.phases.items()}
    return (
        f"chaos seed={settings.seed} fsync={settings.fsync} seconds={settings.seconds:g}: "
        f"{len(ledger.attempts)} ADDJOB, {len(ledger.added)} added, "
        f"{len(ledger.unknown)} unknown, refused {ledger.refused}; "
        f"{len(ledger.deliveries)} deliveries of {len(delivered_ids)} jobs, "
        f"{len(ledger.acks)} acked; faults {counts}; client errors {ledger.client_errors}; "
        f"late deliveries {by_kind}; drain {outcome.drain_seconds:.1f}s; "
        f"phases {phases}"
    )


def failure_report(
    outcome: Outcome, settings: Settings, nodes: list[ChaosNode], problems: list[str], dump: Path
) -> str:
    ledger = outcome.ledger
    lines = [
        "CHAOS FAILURE, replay with "
        f"DISQUE_CHAOS_SEED={settings.seed} DISQUE_CHAOS_SECONDS={settings.seconds:g} "
        f"DISQUE_CHAOS_FSYNC={settings.fsync}",
        *problems,
        "planned faults:",
        *(f"  {f.describe()}" for f in outcome.planned),
        "faults as run (test clock):",
        *(
            f"  {f.kind} nodes {f.nodes} t={f.start:.2f}..{f.end:.2f}"
            for f in sorted(ledger.faults, key=lambda f: f.start)
        ),
        f"ledger written to {dump}",
    ]
    for node in nodes:
        lines += [f"--- node {node.index} log tail ({node.log_path}):", node.log_tail()]
    return "\n".join(lines)


def dump_ledger(outcome: Outcome, path: Path) -> None:
    ledger = outcome.ledger
    data = {
        "added": [asdict(a) for a in ledger.added.values()],
        "unknown": sorted(ledger.unknown),
        "refused": ledger.refused,
        "deliveries": [asdict(d) for d in ledger.deliveries],
        "acks": {k: asdict(v) for k, v in ledger.acks.items()},
        "faults": [asdict(f) for f in ledger.faults],
        "planned": [asdict(f) for f in outcome.planned],
        "stale": outcome.stale,
        "phases": outcome.phases,
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def check(outcome: Outcome, settings: Settings, nodes: list[ChaosNode], workdir: Path) -> str:
    ledger = outcome.ledger
    late = classify_late(ledger)
    summary = summarize(outcome, settings, late)
    print(summary)
    for x in late:
        print("  late:", x.describe())
    dump = workdir / "chaos-ledger.json"
    dump_ledger(outcome, dump)
    problems: list[str] = []
    problems += [f"worker failed: {e}" for e in outcome.worker_errors]
    if not outcome.settled:
        problems.append(f"the cluster did not settle within {SETTLE_TIMEOUT_S}s after the faults")
    # The ledger is consistent with itself: a delivered body was sent by a
    # producer, under the ID its ADDJOB answered.
    ids_of = {a.body: a.job_id for a in ledger.added.values()}
    for d in ledger.deliveries:
        if d.body not in ledger.attempts:
            problems.append(f"{d.job_id} delivered with body {d.body!r} that nobody added")
        elif d.body in ids_of and ids_of[d.body] != d.job_id:
            problems.append(f"{d.body!r} added as {ids_of[d.body]}, delivered as {d.job_id}")
    # (1) No acknowledged job lost (none can expire: the TTL outlives the run).
    now = ledger.now()
    missing = [j for j in ledger.missing() if now < ledger.added[j].t + settings.ttl - 5]
    if missing:
        delivered = {d.job_id for d in ledger.deliveries}
        problems.append(
            f"{len(missing)} acknowledged jobs never acked by the end of the drain "
            f"({DRAIN_TIMEOUT_S}s); never delivered: {len(set(missing) - delivered)}"
        )
        for job_id in missing[:20]:
            a = ledger.added[job_id]
            problems.append(
                f"  {job_id} ({a.body}) added t={a.t:.3f} on node {a.node} REPLICATE {a.repl}; "
                + "; ".join(outcome.lost_state.get(job_id, []))
            )
    # (2) Deliveries answered after the ack: none unexplained, the others bounded.
    for x in late:
        if x.kind == "unexplained":
            problems.append("delivered after its ack with no fault to explain it: " + x.describe())
        elif x.kind == "fault" and x.after_heal > LATE_AFTER_HEAL_S:
            problems.append(
                f"delivered after its ack more than {LATE_AFTER_HEAL_S}s after the faults "
                "healed: " + x.describe()
            )
    # After the tail, no node still holds an acked job as active or queued
    # (it would be delivered again at its retry).
    for job_id, where in sorted(outcome.stale.items())[:20]:
        problems.append(f"acked job {job_id} still held unacked: {', '.join(where)}")
    if problems:
        pytest.fail(
            summary + "\n" + failure_report(outcome, settings, nodes, problems, dump),
            pytrace=False,
        )
    assert ledger.added, "no job was added: the run proves nothing"
    assert ledger.faults, "no fault ran: the run proves nothing"
    return summary


def run_chaos(topo: Topology, workdir: Path, settings: Settings) -> str:
    nodes = [ChaosNode(i, topo, workdir / f"node{i}", settings) for i in range(NODES)]
    try:
        outcome = topo.run_inside(lambda: scenario(nodes, topo, settings))
    finally:
        for node in nodes:
            node.destroy()
    return check(outcome, settings, nodes, workdir)


@pytest.fixture
def netns_topology() -> Iterator[NetnsTopology]:
    topo = NetnsTopology.create_or_skip(NODES)
    try:
        yield topo
    finally:
        topo.destroy()


def test_chaos_kill_and_stop(tmp_path: Path) -> None:
    """kill -9 with restarts and SIGSTOP/SIGCONT, nodes on loopback."""
    run_chaos(LoopbackTopology(NODES), tmp_path, Settings.from_env())


def test_chaos_with_partitions(tmp_path: Path, netns_topology: NetnsTopology) -> None:
    """The same with partitions too, each node in its own network namespace."""
    run_chaos(netns_topology, tmp_path, Settings.from_env())
