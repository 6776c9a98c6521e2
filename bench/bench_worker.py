"""Jobs per second and CPU per job of the worker (``disque-trio worker``,
no-op async handler) against one disque-trio node on loopback, beside raw
pipelined ADDJOB / GETJOB / ACKJOB.

Prints figures; not a test (exit 0 unless it could not run). Starts its own
node (AOF off) on a free port in a scratch directory and kills it on the
way out.

    python bench/bench_worker.py                       # 20,000 jobs, concurrency 50, 3 runs
    python bench/bench_worker.py --quick               # 2,000 jobs, one run
    python bench/bench_worker.py --log-level warning --repeat 5
    python bench/bench_worker.py --peer /tmp/older     # A/B against another checkout
    python bench/bench_worker.py --nodes 3             # a 3-node cluster (REPLICATE 3)
    python bench/bench_worker.py --nodes 1,3 --json out.json   # one node, then three

The worker runs as it does in production: a ``disque-trio worker`` process
(``--log-level``, ``--backend``) loading a module with one no-op handler;
its log goes to a file. Two phases, each with a fresh worker process that
is first left waiting in its GETJOB (the node's ``blocked_clients``):

drain   the jobs are added beforehand to a queue paused for output
        (``PAUSE q out``); the clock starts when the pause is lifted.
steady  a producer process adds the jobs while the worker runs (ADDJOB
        pipelined in batches of ``--producer-batch``, as fast as it can);
        the clock starts when it is told to begin. Its own rate is
        printed: steady cannot exceed it.

Both end when the node holds no job any more (``registered_jobs`` 0: every
job acknowledged). Worker CPU is the process's user + system time
(/proc/PID/stat) over that span, per 1,000 jobs; the node's is given too.

With ``--nodes 3`` the nodes form a cluster (CLUSTER MEET) and every job is
added with the default replication, 3 copies; the producer and the worker
talk to the first node. The phases end when no node holds a job (each ack
collected from the three holders), and the node CPU is summed over them.
Each figure is the median of ``--repeat`` runs; with ``--peer DIR``, the
other checkout's worker (the same module, imported from DIR) runs
alternately with this one's, against the same node.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from disque_trio.client import NEED_DATA, ClientProtocol, Job, commands  # noqa: E402
from disque_trio.client.commands import Command  # noqa: E402

QUEUE = "workq"
TICK = os.sysconf("SC_CLK_TCK")


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """A free port whose bus port (+10000) is free too (and not one of
    ``avoid``, taken by nodes started already)."""
    for port in range(21000 + os.getpid() % 9000, 40000, 7):
        ok = port not in avoid
        for p in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Node:
    def __init__(self, avoid: tuple[int, ...] = ()) -> None:
        self.port = free_port(avoid)
        self.dir = tempfile.mkdtemp(prefix="bench-worker-")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "disque_trio",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--web-port",
                "0",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError("the node did not start")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)


class Raw:
    """Pipelined commands over one blocking socket, through ClientProtocol."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = ClientProtocol()

    def run(self, batch: list[Command[object]]) -> list[object]:
        self.sock.sendall(self.proto.send(*batch))
        out: list[object] = []
        while len(out) < len(batch):
            event = self.proto.next_event()
            if event is NEED_DATA:
                self.proto.receive_data(self.sock.recv(1 << 20))
                continue
            out.append(event.result())
        return out

    def call(self, *args: str) -> object:
        return self.run([commands.raw(*args)])[0]

    def add(self, queue: str, count: int, batch: int = 1000) -> None:
        for start in range(0, count, batch):
            n = min(batch, count - start)
            self.run([commands.addjob(queue, b"0123456789", 0) for _ in range(n)])

    def info_field(self, section: str, name: str) -> int:
        return self.info_field_of("INFO", section, name)

    def info_field_of(self, *args_and_name: str) -> int:
        """A ``name:value`` line of what a command answers (INFO, CLUSTER INFO)."""
        *args, name = args_and_name
        text = self.run([commands.raw(*args)])[0]
        if isinstance(text, bytes):
            text = text.decode()
        assert isinstance(text, str)
        for line in text.splitlines():
            if line.startswith(name + ":"):
                return int(line.split(":", 1)[1])
        raise KeyError(name)

    def close(self) -> None:
        self.sock.close()


def start_nodes(count: int) -> list[Node]:
    """``count`` nodes, met into one cluster when more than one."""
    nodes: list[Node] = []
    try:
        for _ in range(count):
            nodes.append(Node(tuple(n.port for n in nodes)))
        if count > 1:
            first = Raw(nodes[0].port)
            try:
                for other in nodes[1:]:
                    first.call("CLUSTER", "MEET", "127.0.0.1", str(other.port))
            finally:
                first.close()
            wait_for(
                lambda: all(reachable(n.port) == count - 1 for n in nodes), "a full mesh", 30, 0.1
            )
    except BaseException:
        for node in nodes:
            node.close()
        raise
    return nodes


def reachable(port: int) -> int:
    raw = Raw(port)
    try:
        return raw.info_field_of("CLUSTER", "INFO", "cluster_reachable_nodes")
    finally:
        raw.close()


def raw_round_trip(port: int, jobs: int) -> tuple[float, float]:
    raw = Raw(port)
    try:
        t0 = time.perf_counter()
        raw.add("rawq", jobs)
        t1 = time.perf_counter()
        done = 0
        while done < jobs:
            got = raw.run([commands.getjob(["rawq"], count=1000, nohang=True)])[0]
            assert isinstance(got, list) and got, "the queue ran dry"
            ids = [j.id for j in got if isinstance(j, Job)]
            acked = raw.run([commands.ackjob(*ids)])[0]
            assert acked == len(ids)
            done += len(ids)
        t2 = time.perf_counter()
    finally:
        raw.close()
    return jobs / (t1 - t0), jobs / (t2 - t1)


WORKER_MODULE = """
from disque_trio.worker import Worker

worker = Worker("disque://127.0.0.1:{port}")


@worker.handler("{queue}", concurrency={concurrency})
async def noop(job):
    pass
"""


@dataclass
class Setup:
    port: int
    jobs: int
    concurrency: int
    backend: str
    log_level: str
    producer_batch: int
    scratch: Path


@dataclass
class Run:
    rate: float  # jobs/s
    worker_cpu: float  # ms per 1,000 jobs
    node_cpu: float  # ms per 1,000 jobs
    added: float = 0.0  # steady: the producer's own jobs/s


class WorkerProcess:
    """``disque-trio worker`` from ``checkout``, its log in a file."""

    def __init__(self, setup: Setup, checkout: Path) -> None:
        module = setup.scratch / "bench_worker_tasks.py"
        module.write_text(
            textwrap.dedent(WORKER_MODULE).format(
                port=setup.port, queue=QUEUE, concurrency=setup.concurrency
            )
        )
        self.log = open(setup.scratch / "worker.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "disque_trio",
                "worker",
                "bench_worker_tasks:worker",
                "--path",
                str(setup.scratch),
                "--backend",
                setup.backend,
                "--log-level",
                setup.log_level,
            ],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=15)
        self.log.close()


def wait_for(predicate: object, what: str, timeout: float = 60.0, every: float = 0.01) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def measured(setup: Setup, checkout: Path, nodes: list[Node], steady: bool) -> Run:
    """One phase with a fresh worker: drain, or steady with a producer."""
    raw = Raw(setup.port)
    others = [Raw(n.port) for n in nodes[1:]]
    pids = [n.proc.pid for n in nodes]

    def node_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in pids)

    def none_left() -> bool:
        return all(r.info_field("jobs", "registered_jobs") == 0 for r in [raw, *others])

    producer = None
    added = 0.0
    if steady:
        producer = start_producer(setup)
    else:
        raw.call("PAUSE", QUEUE, "out")
        raw.add(QUEUE, setup.jobs)
    worker = WorkerProcess(setup, checkout)
    try:
        wait_for(lambda: raw.info_field("clients", "blocked_clients") >= 1, "the worker's GETJOB")
        time.sleep(0.2)  # its start settles (the connection pool, HELLO)
        cpu0, node0, t0 = worker.cpu(), node_cpu(), time.perf_counter()
        if producer is not None:
            assert producer.stdin is not None
            producer.stdin.write(b"go\n")
            producer.stdin.close()
            assert producer.stdout is not None
            added = setup.jobs / float(producer.stdout.read())
            producer.wait(timeout=120)
        else:
            raw.call("PAUSE", QUEUE, "none")
        wait_for(none_left, "the last ack", 300)
        elapsed = time.perf_counter() - t0
        cpu1, node1 = worker.cpu(), node_cpu()
    finally:
        worker.close()
        if producer is not None and producer.poll() is None:
            producer.kill()
        raw.close()
        for other in others:
            other.close()
    per_k = 1000 / setup.jobs
    return Run(
        setup.jobs / elapsed,
        (cpu1 - cpu0) * 1000 * per_k,
        (node1 - node0) * 1000 * per_k,
        added,
    )


def start_producer(setup: Setup) -> subprocess.Popen[bytes]:
    """This script in producer mode, waiting for a line on its stdin."""
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--produce",
            str(setup.port),
            "--jobs",
            str(setup.jobs),
            "--producer-batch",
            str(setup.producer_batch),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def produce(port: int, jobs: int, batch: int) -> None:
    """Wait for a line, add the jobs, print how many seconds that took."""
    raw = Raw(port)
    sys.stdin.readline()
    t0 = time.perf_counter()
    raw.add(QUEUE, jobs, batch)
    print(time.perf_counter() - t0)
    raw.close()


def median_run(runs: list[Run]) -> Run:
    return Run(
        statistics.median(r.rate for r in runs),
        statistics.median(r.worker_cpu for r in runs),
        statistics.median(r.node_cpu for r in runs),
        statistics.median(r.added for r in runs),
    )


def report(name: str, drain: Run, steady: Run) -> None:
    print(
        f"  {name:<14} {drain.rate:8,.0f} {steady.rate:9,.0f}"
        f" {drain.worker_cpu:10.0f} {steady.worker_cpu:8.0f}"
        f" {drain.node_cpu:10.0f} {steady.node_cpu:8.0f} {steady.added:10,.0f}"
    )


def compare(
    setup: Setup, checkouts: dict[str, Path], repeat: int, nodes: list[Node]
) -> dict[str, tuple[Run, Run]]:
    """Every checkout's worker, alternately, ``repeat`` times; the medians
    (drain, steady) by checkout."""
    drains: dict[str, list[Run]] = {name: [] for name in checkouts}
    steadies: dict[str, list[Run]] = {name: [] for name in checkouts}
    for _ in range(repeat):
        for name, checkout in checkouts.items():
            drains[name].append(measured(setup, checkout, nodes, steady=False))
            steadies[name].append(measured(setup, checkout, nodes, steady=True))
    print(
        f"  {'':<14} {'jobs/s':>8} {'':>9} {'worker CPU ms/1k':>19} {'node CPU ms/1k':>19}"
        f" {'producer':>10}\n"
        f"  {'':<14} {'drain':>8} {'steady':>9} {'drain':>10} {'steady':>8}"
        f" {'drain':>10} {'steady':>8} {'jobs/s':>10}"
    )
    medians = {n: (median_run(drains[n]), median_run(steadies[n])) for n in checkouts}
    for name, (drain, steady) in medians.items():
        report(name, drain, steady)
    if len(medians) == 2:
        (a_drain, a_steady), (b_drain, b_steady) = medians.values()
        print(
            f"  {'ratio':<14} {a_drain.rate / b_drain.rate:8.2f}x"
            f" {a_steady.rate / b_steady.rate:8.2f}x"
            f" {a_drain.worker_cpu / b_drain.worker_cpu:10.2f}x"
            f" {a_steady.worker_cpu / b_steady.worker_cpu:7.2f}x"
        )
    return medians


RESULT_COLUMNS = [
    "nodes",
    "worker",
    "drain jobs/s",
    "steady jobs/s",
    "worker CPU ms/1k, drain / steady",
    "node CPU ms/1k, drain / steady",
    "producer jobs/s",
]


def result_row(count: int, name: str, drain: Run, steady: Run) -> list[str]:
    where = "1" if count == 1 else f"{count} (REPLICATE {min(3, count)})"
    return [
        where,
        name,
        f"{drain.rate:,.0f}",
        f"{steady.rate:,.0f}",
        f"{drain.worker_cpu:.0f} / {steady.worker_cpu:.0f}",
        f"{drain.node_cpu:.0f} / {steady.node_cpu:.0f}",
        f"{steady.added:,.0f}",
    ]


def write_json(
    path: Path, args: argparse.Namespace, jobs: int, repeat: int, rows: list[list[str]]
) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    ).stdout.strip()
    table = "\n".join(
        ["| " + " | ".join(RESULT_COLUMNS) + " |", "|" + "---|" * len(RESULT_COLUMNS)]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    data = {
        "benchmark": "worker-nodes",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M"),
        "commit": commit,
        "command": " ".join(["python", "bench/bench_worker.py", *sys.argv[1:]]),
        "conditions": (
            f"{jobs:,} jobs, medians of {repeat} run(s); worker concurrency {args.concurrency},"
            f" {args.backend}, log level {args.log_level}; the producer pipelines ADDJOB in"
            f" batches of {args.producer_batch}; CPython {platform.python_version()},"
            f" {os.cpu_count()} cores"
        ),
        "table": table,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 7 for c in counts):
        raise argparse.ArgumentTypeError("node counts from 1 to 7, comma separated")
    return counts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per checkout (medians)")
    parser.add_argument("--peer", type=Path, help="another checkout, run alternately")
    parser.add_argument("--producer-batch", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, one run")
    parser.add_argument(
        "--nodes",
        type=_counts,
        default=[1],
        metavar="N[,N...]",
        help="nodes in the cluster, the worker on the first (default 1); 1,3: one, then three",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the medians as JSON")
    parser.add_argument("--produce", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser


def print_raw(port: int, jobs: int, args: argparse.Namespace, repeat: int, nodes: int) -> None:
    add_rate, consume_rate = raw_round_trip(port, jobs)
    where = "one node" if nodes == 1 else f"{nodes} nodes (REPLICATE {min(3, nodes)})"
    print(
        f"{jobs} jobs, 10-byte bodies, {where} on 127.0.0.1 ({os.cpu_count()} CPUs); "
        f"worker: concurrency {args.concurrency}, {args.backend}, log level "
        f"{args.log_level}; medians of {repeat} run(s)"
    )
    print(f"  raw pipelined ADDJOB (batches of 1000)                 {add_rate:10,.0f} jobs/s")
    print(f"  raw pipelined GETJOB COUNT 1000 + ACKJOB of the batch  {consume_rate:10,.0f} jobs/s")


def main() -> int:
    args = _parser().parse_args()
    if args.produce:
        produce(args.produce, args.jobs, args.producer_batch)
        return 0
    jobs, repeat = (2000, 1) if args.quick else (args.jobs, args.repeat)
    checkouts = {"this checkout": ROOT}
    if args.peer is not None:
        checkouts["peer"] = args.peer.resolve()
    rows: list[list[str]] = []
    for count in args.nodes:
        nodes = start_nodes(count)
        node = nodes[0]
        scratch = Path(tempfile.mkdtemp(prefix="bench-worker-tasks-"))
        try:
            print_raw(node.port, jobs, args, repeat, len(nodes))
            if args.peer is not None:
                print(f"  peer: {checkouts['peer']}")
            setup = Setup(
                node.port,
                jobs,
                args.concurrency,
                args.backend,
                args.log_level,
                args.producer_batch,
                scratch,
            )
            medians = compare(setup, checkouts, repeat, nodes)
            rows += [result_row(count, name, d, st) for name, (d, st) in medians.items()]
        finally:
            for each in nodes:
                each.close()
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json is not None:
        write_json(args.json, args, jobs, repeat, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
