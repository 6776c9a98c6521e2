#!/usr/bin/env python3
"""Celery and Dramatiq on the brokers they replace: the same no-op task on
Redis, on one disque-trio node and on three (REPLICATE 3).

    python bench/bench_integrations.py                 # 20,000 jobs, median of 3
    python bench/bench_integrations.py --repeat 1      # one run of each
    python bench/bench_integrations.py --quick         # 2,000 jobs, a smoke run
    python bench/bench_integrations.py --only celery --brokers redis,disque-1

Prints figures, not a test: exit 0 when it ran, whether the target is met
or missed (1 when it could not run, 130 when interrupted). It starts every
broker, worker and producer itself, on loopback ports chosen at run time,
and stops them (process groups) on the way out.

Brokers, a fresh one for each phase: ``redis-server --save "" --appendonly
no`` (Debian's); one disque-trio node (no AOF, ``--web-port 0``); three
nodes met into a cluster, the jobs added with REPLICATE 3.

Workers, each framework's own command line: ``celery -A
integration_apps.celery_app worker --pool threads --concurrency 50
--without-gossip --without-mingle --without-heartbeat`` (``task_acks_late``),
and ``dramatiq integration_apps.dramatiq_app --processes 1 --threads 50``.
The apps (bench/integration_apps) differ between brokers only in the
broker settings.

Phases (jobs/s):

enqueue  the producer process calls ``noop.delay()`` / ``noop.send()`` N
         times in a loop, no worker running; from its first call to the
         return of its last.
drain    then the worker starts; from the first poll that sees a job done
         to the first poll that sees none left (the worker's start-up is
         left out).
steady   a fresh broker, the worker started and idle, then the producer
         enqueues N as fast as it can; from its first call to the first
         poll, after its last, that sees none left.

"None left" is read from the broker every 5 ms, confirmed by 50 ms more of
polls: Redis ``LLEN bench`` + ``HLEN unacked`` (Celery) or ``HLEN
dramatiq:bench.msgs`` (Dramatiq); disque-trio ``registered_jobs`` of
``INFO jobs`` on every node, divided by the copies per job (a node deletes
a job once it is acknowledged everywhere).

Broker CPU: utime + stime of the broker process(es) over each phase's
window, from /proc/PID/stat, per 1,000 jobs. The worker's the same, its
whole process tree.

Target: disque-trio on one node drains at least 0.8x the jobs/s of Redis,
for each framework.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import hiredis

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from bench_single import (  # noqa: E402  (the bench directory is not a package)
    HOST,
    BenchError,
    Server,
    arm_signals,
    bench_parser,
    command,
    encode,
    free_port,
    guarded,
    median,
    settle_repeat,
)
from bench_workers import Brokers as WorkerBrokers  # noqa: E402
from bench_workers import (  # noqa: E402  (its process, CPU and table helpers)
    Child,
    cpu_ticks,
    fmt,
    info_field,
    markdown_table,
    tree_delta,
    tree_pids,
    verdict,
)

POLL_S = 0.005
CONFIRM_S = 0.05
IDLE_S = 0.3
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET = 0.8  # disque-trio (one node) / Redis, drain jobs/s
FRAMEWORKS = ("celery", "dramatiq")
BROKERS = ("redis", "disque-1", "disque-3")


# ------------------------------------------------------------- processes


@dataclass
class Broker:
    """One broker under test: its servers, its URL, how to count what is
    left."""

    kind: str  # redis, disque-1, disque-3
    servers: list[Server]
    url: str
    copies: int = 1

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers]

    def check_alive(self) -> None:
        for s in self.servers:
            s.check_alive()


class Brokers(WorkerBrokers):
    """bench_workers' brokers (bench_single's servers: a scratch directory,
    process groups, stopped on the way out; nodes without a web port), and
    a cluster of nodes, each in a directory of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.bus_ports: dict[int, int] = {}

    def member(self) -> Server:
        port, bus = free_port(), free_port()
        self.bus_ports[port] = bus
        argv = [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", HOST]
        argv += ["--cluster-port", str(bus), "--web-port", "0", "--loglevel", "notice"]
        workdir = os.path.join(self.workdir, f"node-{port}")
        os.makedirs(workdir)
        return self._start("disque-trio", [*argv, "--dir", workdir], port)

    def start(self, kind: str) -> Broker:
        if kind == "redis":
            server = self.redis()
            return Broker(kind, [server], f"redis://{HOST}:{server.port}/0")
        count = int(kind.split("-")[1])
        if count == 1:
            server = self.disque()
            return Broker(kind, [server], f"disque://{HOST}:{server.port}")
        nodes = [self.member() for _ in range(count)]
        for other in nodes[1:]:
            reply = command(
                nodes[0].port, "CLUSTER", "MEET", HOST, other.port, self.bus_ports[other.port]
            )
            if reply not in (b"OK", "OK"):
                raise BenchError(f"CLUSTER MEET: {reply!r}")
        deadline = time.monotonic() + 30
        while True:
            infos = [command(n.port, "CLUSTER", "INFO").decode() for n in nodes]
            if all(f"cluster_reachable_nodes:{count - 1}" in i for i in infos):
                break
            if time.monotonic() > deadline:
                raise BenchError("the cluster did not form within 30 s")
            time.sleep(0.1)
        url = "disque://" + ",".join(f"{HOST}:{n.port}" for n in nodes)
        return Broker(kind, nodes, url, copies=count)

    def stop_broker(self, broker: Broker) -> None:
        for server in broker.servers:
            self.stop(server)


class Probe:
    """Connections to the broker's servers that count the jobs left."""

    def __init__(self, broker: Broker, framework: str) -> None:
        self.broker = broker
        if broker.kind == "redis":
            commands = (
                [("LLEN", "bench"), ("HLEN", "unacked")]
                if framework == "celery"
                else [("HLEN", "dramatiq:bench.msgs")]
            )
        else:
            commands = [("INFO", "jobs")]
        self.request = b"".join(encode(*c) for c in commands)
        self.count = len(commands)
        self.socks = []
        for server in broker.servers:
            sock = socket.create_connection((HOST, server.port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks.append(sock)

    def remaining(self) -> int:
        total = 0
        for sock in self.socks:
            sock.sendall(self.request)
            reader = hiredis.Reader()
            replies: list[Any] = []
            while len(replies) < self.count:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(65536)
                    if not data:
                        raise BenchError("a broker closed the probe's connection")
                    reader.feed(data)
                elif isinstance(reply, hiredis.ReplyError):
                    raise BenchError(f"broker error: {reply}")
                else:
                    replies.append(reply)
            if self.broker.kind == "redis":
                total += sum(int(r) for r in replies)
            else:
                total += info_field(replies[0].decode(), "registered_jobs")
        return math.ceil(total / self.broker.copies)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


# ----------------------------------------------------------------- the run


@dataclass
class Phase:
    jobs: int
    seconds: float
    broker_ticks: int
    worker_ticks: int = 0

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")

    def ms_per_1k(self, ticks: int) -> float:
        return ticks * 1000 / CLK_TCK / (self.jobs / 1000)


@dataclass
class Result:
    framework: str
    broker: str
    repetition: int
    enqueue: dict[str, float] | None = None
    drain: dict[str, float] | None = None
    steady: dict[str, float] | None = None
    error: str | None = None


def figures(p: Phase) -> dict[str, float]:
    return {
        "jobs": p.jobs,
        "seconds": p.seconds,
        "rate": p.rate,
        "broker_cpu_ms_per_1k": p.ms_per_1k(p.broker_ticks),
        "worker_cpu_ms_per_1k": p.ms_per_1k(p.worker_ticks),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, brokers: Brokers) -> None:
        self.args = args
        self.brokers = brokers
        self.jobs = args.jobs
        self.children: list[Child] = []
        self.results: list[Result] = []

    def env(self, broker: Broker) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = BENCH + os.pathsep + env.get("PYTHONPATH", "")
        env["BENCH_BROKER"] = "redis" if broker.kind == "redis" else "disque"
        env["BENCH_BROKER_URL"] = broker.url
        if broker.copies > 1:
            env["BENCH_REPLICATE"] = str(broker.copies)
        return env

    def child(self, name: str, argv: list[str], broker: Broker) -> Child:
        child = Child(name, argv, self.env(broker), self.brokers.workdir, talk=name == "producer")
        self.children.append(child)
        return child

    def worker(self, framework: str, broker: Broker) -> Child:
        if framework == "celery":
            argv = [sys.executable, "-m", "celery", "-A", "integration_apps.celery_app", "worker"]
            argv += ["--pool", "threads", "--concurrency", "50", "--loglevel", "WARNING"]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        else:
            argv = [sys.executable, "-m", "dramatiq", "integration_apps.dramatiq_app"]
            argv += ["--processes", "1", "--threads", "50"]
        return self.child("worker", argv, broker)

    def producer(self, framework: str, broker: Broker, warmup: int) -> Child:
        argv = [sys.executable, "-m", "integration_apps.produce", f"{framework}_app"]
        producer = self.child("producer", [*argv, str(warmup), str(self.jobs)], broker)
        if (said := producer.read_line(120)) != "ready":
            raise BenchError(f"producer said {said!r}:\n{producer.log_tail()}")
        return producer

    def stop_children(self) -> None:
        for child in self.children:
            child.stop()
        self.children.clear()

    def polls(self, probe: Probe, broker: Broker, limit: float) -> Iterator[tuple[float, int]]:
        deadline = time.monotonic() + limit
        while True:
            t = time.monotonic()
            if t > deadline:
                raise BenchError(f"no end within {limit:.0f} s")
            broker.check_alive()
            yield t, probe.remaining()
            time.sleep(POLL_S)

    def wait_for(self, probe: Probe, broker: Broker, count: int, limit: float = 120) -> None:
        for _, left in self.polls(probe, broker, limit):
            if left == count:
                return

    def end_of_work(
        self, probe: Probe, broker: Broker, after: float, worker: Child
    ) -> tuple[float, dict[int, int], int]:
        """The first poll at or after ``after`` of the final run of polls
        seeing nothing left (CONFIRM_S long), with the CPU readings taken
        right after that first poll."""
        end: tuple[float, dict[int, int], int] | None = None
        pids = tree_pids(worker.pid)
        for t, left in self.polls(probe, broker, self.timeout()):
            worker.check_alive()
            if left or t < after:
                end = None
                continue
            if end is None:
                end = (t, cpu_ticks(pids), sum(cpu_ticks(broker.pids).values()))
            elif t - end[0] >= CONFIRM_S:
                return end
        raise AssertionError("unreachable")

    def timeout(self) -> float:
        return max(120.0, self.jobs / 50)  # 50 jobs/s would be a broken run

    def enqueue_and_drain(self, framework: str, broker: Broker) -> tuple[Phase, Phase]:
        probe = Probe(broker, framework)
        try:
            producer = self.producer(framework, broker, warmup=0)
            before = sum(cpu_ticks(broker.pids).values())
            producer.say("go")
            sent = json.loads(producer.read_line(self.timeout()))
            after = sum(cpu_ticks(broker.pids).values())
            enqueue = Phase(self.jobs, sent["last"] - sent["first"], after - before)
            self.wait_for(probe, broker, self.jobs)
            worker = self.worker(framework, broker)
            start: tuple[float, dict[int, int], int] | None = None
            for t, left in self.polls(probe, broker, self.timeout()):
                worker.check_alive()
                if left < self.jobs:
                    pids = tree_pids(worker.pid)
                    start = (t, cpu_ticks(pids), sum(cpu_ticks(broker.pids).values()))
                    start_left = left
                    break
            assert start is not None
            t1, w1, b1 = self.end_of_work(probe, broker, start[0], worker)
            drain = Phase(start_left, t1 - start[0], b1 - start[2], tree_delta(start[1], w1))
            return enqueue, drain
        finally:
            probe.close()

    def steady(self, framework: str, broker: Broker) -> Phase:
        probe = Probe(broker, framework)
        try:
            worker = self.worker(framework, broker)
            producer = self.producer(framework, broker, warmup=1)
            self.wait_for(probe, broker, 0)  # the warm-up job is done: the worker runs
            time.sleep(IDLE_S)
            pids = tree_pids(worker.pid)
            w0, b0 = cpu_ticks(pids), sum(cpu_ticks(broker.pids).values())
            producer.say("go")
            sent = json.loads(producer.read_line(self.timeout()))
            t1, w1, b1 = self.end_of_work(probe, broker, sent["last"], worker)
            return Phase(self.jobs, t1 - sent["first"], b1 - b0, tree_delta(w0, w1))
        finally:
            probe.close()

    def phase(self, kind: str, run: Callable[[Broker], Any]) -> Any:
        broker = self.brokers.start(kind)
        try:
            return run(broker)
        finally:
            self.stop_children()
            self.brokers.stop_broker(broker)

    def one(self, framework: str, kind: str, rep: int) -> None:
        result = Result(framework, kind, rep)
        try:
            enqueue, drain = self.phase(kind, lambda b: self.enqueue_and_drain(framework, b))
            result.enqueue, result.drain = figures(enqueue), figures(drain)
            result.steady = figures(self.phase(kind, lambda b: self.steady(framework, b)))
            print(
                f"  {framework:8} {kind:9} #{rep}: enqueue {enqueue.rate:,.0f}/s, "
                f"drain {drain.rate:,.0f}/s, steady {result.steady['rate']:,.0f}/s",
                flush=True,
            )
        except BenchError as e:
            result.error = str(e)
            print(f"  {framework} {kind} #{rep}: FAILED: {e}", flush=True)
        self.results.append(result)

    def run(self, frameworks: Sequence[str], kinds: Sequence[str]) -> None:
        # Repetitions outermost: a change of the machine's load hits every case.
        for rep in range(1, self.args.repeat + 1):
            for framework in frameworks:
                for kind in kinds:
                    self.one(framework, kind, rep)


# ----------------------------------------------------------------- report


@dataclass
class Row:
    framework: str
    broker: str
    values: dict[str, float | None] = field(default_factory=dict)


def summarize(
    results: Sequence[Result], frameworks: Sequence[str], kinds: Sequence[str]
) -> list[Row]:
    rows = []
    for framework in frameworks:
        for kind in kinds:
            mine = [r for r in results if r.framework == framework and r.broker == kind]
            row = Row(framework, kind)
            for part in ("enqueue", "drain", "steady"):
                for key in ("rate", "broker_cpu_ms_per_1k", "worker_cpu_ms_per_1k"):
                    values = [d[key] for r in mine if (d := getattr(r, part)) is not None]
                    row.values[f"{part}_{key}"] = median(values) if values else None
            rows.append(row)
    return rows


def paired(results: Sequence[Result], framework: str, kind: str, part: str) -> float | None:
    """The median, over repetitions, of this broker's rate / Redis's rate in
    the same repetition."""
    ratios = []
    for r in results:
        if r.framework != framework or r.broker != kind or getattr(r, part) is None:
            continue
        base = next(
            (
                b
                for b in results
                if b.framework == framework
                and b.broker == "redis"
                and b.repetition == r.repetition
                and getattr(b, part) is not None
            ),
            None,
        )
        if base is not None:
            ratios.append(getattr(r, part)["rate"] / getattr(base, part)["rate"])
    return median(ratios) if ratios else None


LABELS = {
    "redis": "Redis",
    "disque-1": "disque-trio, 1 node",
    "disque-3": "disque-trio, 3 nodes, REPLICATE 3",
}


def report(results: Sequence[Result], frameworks: Sequence[str], kinds: Sequence[str]) -> str:
    head = [
        "framework, broker",
        "enqueue/s",
        "drain/s",
        "steady/s",
        "broker CPU ms/1k (enq, drain, steady)",
        "worker CPU ms/1k (drain)",
        "vs Redis (enq, drain, steady)",
        "target",
    ]
    rows = []
    for row in summarize(results, frameworks, kinds):
        v = row.values
        cpu = ", ".join(
            fmt(v[f"{p}_broker_cpu_ms_per_1k"]) for p in ("enqueue", "drain", "steady")
        )
        ratios = target = "-"
        if row.broker != "redis":
            r = [
                paired(results, row.framework, row.broker, p)
                for p in ("enqueue", "drain", "steady")
            ]
            ratios = ", ".join(fmt(x, ".2f") for x in r)
            if row.broker == "disque-1":
                target = f"drain >= {TARGET}x: " + verdict(r[1], ">=", TARGET)
        rows.append(
            [
                f"{row.framework.capitalize()}, {LABELS[row.broker]}",
                fmt(v["enqueue_rate"]),
                fmt(v["drain_rate"]),
                fmt(v["steady_rate"]),
                cpu,
                fmt(v["drain_worker_cpu_ms_per_1k"]),
                ratios,
                target,
            ]
        )
    return markdown_table(head, rows)


# ------------------------------------------------------------------ setup


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("disque-trio", "celery", "kombu", "dramatiq", "redis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=7200)
    p.add_argument("--jobs", type=int, default=None, help="jobs per phase (default 20,000)")
    p.add_argument(
        "--only",
        metavar="FRAMEWORKS",
        default=",".join(FRAMEWORKS),
        help="comma separated: celery, dramatiq (default both)",
    )
    p.add_argument(
        "--brokers",
        default=",".join(BROKERS),
        help="comma separated: redis, disque-1, disque-3 (default all three)",
    )
    args = settle_repeat(p, p.parse_args(argv))
    if args.jobs is None:
        args.jobs = 2000 if args.quick else 20_000
    if args.jobs < 10:
        p.error("--jobs must be >= 10")
    args.frameworks = [f for f in args.only.split(",") if f]
    args.kinds = [b for b in args.brokers.split(",") if b]
    if not set(args.frameworks) <= set(FRAMEWORKS) or not args.frameworks:
        p.error(f"--only: choose among {', '.join(FRAMEWORKS)}")
    if not set(args.kinds) <= set(BROKERS) or not args.kinds:
        p.error(f"--brokers: choose among {', '.join(BROKERS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("redis-server") is None:
        print("bench_integrations: redis-server not found (apt-get install redis-server)")
        return 1
    found = versions()
    missing = [f for f in args.frameworks if f not in found]
    if missing or "redis" not in found:
        print(f"bench_integrations: not installed: {missing or ['redis']}")
        print("  pip install -c constraints.txt -e '.[test]'")
        return 1
    redis = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, timeout=10
    ).stdout.split(" sha=")[0]
    load = os.getloadavg()[0]
    print(
        f"bench_integrations: {args.jobs:,} jobs, repeat {args.repeat}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {redis}, load {load:.2f}\nversions: {found}",
        flush=True,
    )
    arm_signals(args.timeout)
    brokers = Brokers()
    bench = Bench(args, brokers)

    def stop() -> None:
        bench.stop_children()
        brokers.stop_all()

    t0 = time.monotonic()
    status = guarded("bench_integrations", lambda: bench.run(args.frameworks, args.kinds), stop)
    text = report(bench.results, args.frameworks, args.kinds)
    print(
        f"\n== {args.jobs:,} jobs, median of {args.repeat} ({time.monotonic() - t0:.0f} s; "
        f"load {load:.2f} -> {os.getloadavg()[0]:.2f}) ==\n"
    )
    print(text)
    if brokers.log_notes:
        print("\nnode log lines worth a look:\n" + "\n".join(brokers.log_notes[:20]))
    if args.json:
        doc = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", "bench/bench_integrations.py", *sys.argv[1:]]),
            "jobs": args.jobs,
            "repeat": args.repeat,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "redis_server": redis,
            "versions": found,
            "complete": status == 0,
            "table": text,
            "runs": [asdict(r) for r in bench.results],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
