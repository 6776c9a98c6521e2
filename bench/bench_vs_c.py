#!/usr/bin/env python3
"""disque-trio side by side with the original C Disque, in the same run.

Give it a ``disque-server`` binary you built yourself from the original's
source (``make`` in its ``src/``; it is never shipped with this project). It
starts one node of each, then three of each as a cluster, drives both with
the same load back to back, and prints every figure as a ratio
(disque-trio / C Disque; for latency, how many times slower):

* single node: PING at -P 1, ADDJOB and GETJOB NOHANG at -P 1 and -P 16
  (redis-benchmark, 50 clients, 10-byte body); and PING at -P 1 against a
  bare Trio server (bench/trio_floor.py), the ceiling of any -P 1 ratio;
* three nodes: ADDJOB REPLICATE 3 (synchronous) at -P 1 and -P 16, and
  REPLICATE 3 ASYNC at -P 1, against the first node;
* one client, ADDJOB REPLICATE 3: median (p50) and p99 latency;
* RSS per queued job after adding many jobs (10-byte bodies).

    python bench/bench_vs_c.py --disque-c /path/to/disque/src/disque-server
    python bench/bench_vs_c.py --disque-c PATH --quick     # smoke run (< 2 min)
    python bench/bench_vs_c.py --disque-c PATH --only cluster --repeat 5
    python bench/bench_vs_c.py --disque-c PATH --node-python PYTHON

``--node-python`` runs the disque-trio nodes (and the bare Trio server) with
another interpreter, say PyPy (``bench/pypy39.py`` prepares one from
Debian's PyPy 3.9); the benchmark itself stays on this one.

This is a benchmark that prints figures, not a test: it exits 0 even when a
target is missed (exit 1 only if the benchmark itself could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from bench_single import (
    BODY,
    CLIENTS,
    HOST,
    BenchError,
    Server,
    arm_signals,
    bench_parser,
    bench_timeout,
    command,
    encode,
    free_port,
    guarded,
    median,
    paired_ratio,
    pipeline,
    redis_benchmark,
    settle_repeat,
)

PARTS = ("single", "cluster", "latency", "rss")

SIZES: dict[str, dict[str, int]] = {
    "full": {
        "ping_p1": 50_000,
        "add_p1": 50_000,
        "add_p16": 150_000,
        "get_p1": 50_000,
        "get_p16": 150_000,
        "repl3_p1": 20_000,
        "repl3_p16": 40_000,
        "repl3_async": 50_000,
        "latency": 5_000,
        "rss_jobs": 1_000_000,
    },
    "quick": {
        "ping_p1": 5_000,
        "add_p1": 5_000,
        "add_p16": 15_000,
        "get_p1": 5_000,
        "get_p16": 15_000,
        "repl3_p1": 3_000,
        "repl3_p16": 5_000,
        "repl3_async": 5_000,
        "latency": 1_000,
        "rss_jobs": 100_000,
    },
}

# (figure, target on the ratio, the bound): None when there is none.
TARGETS: dict[str, tuple[str, float]] = {
    "ADDJOB -P 1": (">=", 0.4),
    "ADDJOB -P 16": (">=", 0.6),
    "GETJOB NOHANG -P 1": (">=", 0.5),
    "GETJOB NOHANG -P 16": (">=", 0.8),
    "3 nodes, ADDJOB REPLICATE 3, -P 1": (">=", 0.5),
    "3 nodes, ADDJOB REPLICATE 3, -P 16": (">=", 0.5),
    "1 client, ADDJOB REPLICATE 3, p50": ("<=", 2.0),
    "RSS per queued job": ("<=", 1.0),
}


def free_pair() -> tuple[int, int]:
    """A client port P whose P + 10000 is free too (the original's bus port
    is always its client port + 10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            for p in (port, port + 10000):
                with socket.socket() as t:
                    t.bind((HOST, p))
        except OSError:
            continue
        return port, port + 10000
    raise BenchError("no free port pair P, P+10000 on loopback")


class Fleet:
    """Every node of one kind ("trio" or "c") in its own scratch directory."""

    def __init__(self, kind: str, exe: str, root: str) -> None:
        # exe: C Disque's binary, or the interpreter of the disque-trio nodes.
        self.kind, self.exe, self.root = kind, exe, root
        self.nodes: list[Server] = []

    def start(self, count: int) -> list[Server]:
        for i in range(count):
            port, bus = free_pair()
            workdir = tempfile.mkdtemp(prefix=f"{self.kind}{i}-", dir=self.root)
            if self.kind == "trio":
                argv = [self.exe or sys.executable, "-m", "disque_trio", "--port", str(port)]
                argv += ["--cluster-port", str(bus), "--loglevel", "notice"]
                argv += ["--enable-debug-command", "local"]  # DEBUG FLUSHALL between runs
            else:
                argv = [self.exe, "--port", str(port), "--daemonize", "no"]
                argv += ["--appendonly", "no", "--loglevel", "notice"]
            argv += ["--bind", HOST, "--dir", workdir]
            srv = Server(f"{self.kind}{i}", argv, port, workdir)
            self.nodes.append(srv)
            srv.wait_ready()
        if count > 1:
            first = self.nodes[0].port
            for srv in self.nodes[1:]:
                extra = [srv.port + 10000] if self.kind == "trio" else []
                reply = command(first, b"CLUSTER", b"MEET", HOST, srv.port, *extra)
                if reply != b"OK":
                    raise BenchError(f"{self.kind}: CLUSTER MEET: {reply!r}")
            self.wait_mesh(count - 1)
        return self.nodes

    def wait_mesh(self, want: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = [reachable(s.port) for s in self.nodes]
            if all(n == want for n in seen):
                return
            time.sleep(0.1)
        raise BenchError(f"{self.kind}: no full mesh after {timeout:.0f} s: {seen}")

    def flush(self) -> None:
        for srv in self.nodes:
            srv.check_alive()
            if command(srv.port, b"DEBUG FLUSHALL") != b"OK":
                raise BenchError(f"{srv.kind}: DEBUG FLUSHALL failed")

    def stop(self) -> None:
        for srv in self.nodes:
            with contextlib.suppress(Exception):
                srv.stop()
        self.nodes.clear()


def reachable(port: int) -> int:
    text = command(port, b"HELLO", timeout=10)
    # HELLO: version, my ID, then one entry per known node (me included).
    return len(text) - 3 if isinstance(text, list) else -1


@dataclass
class Row:
    figure: str
    unit: str
    trio: float
    c: float
    ratio: float
    target: str = ""
    passed: bool | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, exe: str) -> None:
        self.args = args
        self.exe = exe
        self.size = SIZES["quick" if args.quick else "full"]
        self.repeat: int = args.repeat
        self.root = tempfile.mkdtemp(prefix="bench-vs-c-")
        self.fleets: list[Fleet] = []
        self.rows: list[Row] = []

    def log(self, msg: str) -> None:
        print(msg, flush=True)

    def fleets_of(self, count: int) -> tuple[Fleet, Fleet]:
        self.stop_all()
        trio = Fleet("trio", self.args.node_python, self.root)
        c = Fleet("c", self.exe, self.root)
        self.fleets = [trio, c]
        trio.start(count)
        c.start(count)
        return trio, c

    def stop_all(self) -> None:
        for fleet in self.fleets:
            fleet.stop()
        self.fleets = []

    def add(self, figure: str, unit: str, trio: list[float], c: list[float]) -> None:
        """One row: the ratio is trio / c, for latency and memory read as
        'times slower / bigger'."""
        ratio = paired_ratio(trio, c)
        target, passed = "", None
        if figure in TARGETS:
            op, bound = TARGETS[figure]
            target = f"{op} {bound:g}x"
            passed = ratio >= bound if op == ">=" else ratio <= bound
        row = Row(figure, unit, median(trio), median(c), ratio, target, passed)
        row.samples = {"trio": trio, "c": c}
        self.rows.append(row)
        self.log(f"  => {figure}: {row.trio:,.2f} vs {row.c:,.2f} {unit}, x{ratio:.2f}")

    def throughput(
        self,
        figure: str,
        fleets: tuple[Fleet, Fleet],
        n: int,
        depth: int,
        argv: list[str],
        prepare: Callable[[Fleet], None] | None = None,
    ) -> None:
        out: dict[str, list[float]] = {"trio": [], "c": []}
        for i in range(self.repeat):
            for fleet in fleets:
                fleet.flush()
                if prepare is not None:
                    prepare(fleet)
                rate = redis_benchmark(fleet.nodes[0].port, n, depth, argv, bench_timeout(n))
                fleet.nodes[0].check_alive()
                out[fleet.kind].append(rate)
                self.log(f"{figure} #{i + 1} {fleet.kind}: {rate:,.0f} ops/s")
        self.add(figure, "ops/s", out["trio"], out["c"])

    def single(self) -> None:
        fleets = self.fleets_of(1)
        s = self.size
        self.throughput("PING -P 1", fleets, s["ping_p1"], 1, ["PING"])
        self.floor(fleets[1], s["ping_p1"])
        add = ["ADDJOB", "q", BODY.decode(), "0"]
        self.throughput("ADDJOB -P 1", fleets, s["add_p1"], 1, add)
        self.throughput("ADDJOB -P 16", fleets, s["add_p16"], 16, add)
        get = ["GETJOB", "NOHANG", "FROM", "q"]

        def fill(n: int) -> Callable[[Fleet], None]:
            def run(fleet: Fleet) -> None:
                cmd = encode("ADDJOB", "q", BODY, 0)
                res = pipeline(fleet.nodes[0].port, (cmd for _ in range(n)))
                if res.errors:
                    raise BenchError(f"{fleet.kind}: fill: {res.first_error}")

            return run

        # Filled with more than the run takes: every GETJOB finds a job.
        self.throughput(
            "GETJOB NOHANG -P 1", fleets, s["get_p1"], 1, get, fill(s["get_p1"] + 1000)
        )
        self.throughput(
            "GETJOB NOHANG -P 16", fleets, s["get_p16"], 16, get, fill(s["get_p16"] + 1000)
        )

    def floor(self, c: Fleet, n: int) -> None:
        """The bare Trio server (bench/trio_floor.py) beside C Disque: PING
        at -P 1. What the node can reach at -P 1 is below this ratio."""
        port = free_port()
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trio_floor.py")
        srv = Server("floor", [self.args.node_python, script, str(port)], port, self.root)
        try:
            srv.wait_ready()
            out: dict[str, list[float]] = {"trio": [], "c": []}
            for i in range(self.repeat):
                for kind, p in (("trio", port), ("c", c.nodes[0].port)):
                    rate = redis_benchmark(p, n, 1, ["PING"], bench_timeout(n))
                    out[kind].append(rate)
                    self.log(f"Trio floor, PING -P 1 #{i + 1} {kind}: {rate:,.0f} ops/s")
            self.add("Trio floor (bare server), PING -P 1", "ops/s", out["trio"], out["c"])
        finally:
            srv.stop()

    def cluster(self) -> None:
        fleets = self.fleets_of(3)
        s = self.size
        sync = ["ADDJOB", "q", BODY.decode(), "5000", "REPLICATE", "3"]
        self.throughput("3 nodes, ADDJOB REPLICATE 3, -P 1", fleets, s["repl3_p1"], 1, sync)
        self.throughput("3 nodes, ADDJOB REPLICATE 3, -P 16", fleets, s["repl3_p16"], 16, sync)
        asy = ["ADDJOB", "q", BODY.decode(), "0", "REPLICATE", "3", "ASYNC"]
        self.throughput(
            "3 nodes, ADDJOB REPLICATE 3 ASYNC, -P 1", fleets, s["repl3_async"], 1, asy
        )
        self.latency(fleets)

    def latency(self, fleets: tuple[Fleet, Fleet] | None = None) -> None:
        if fleets is None:
            fleets = self.fleets_of(3)
        n = self.size["latency"]
        p50: dict[str, list[float]] = {"trio": [], "c": []}
        p99: dict[str, list[float]] = {"trio": [], "c": []}
        cmd = encode("ADDJOB", "q", BODY, 5000, "REPLICATE", 3)
        for i in range(self.repeat):
            for fleet in fleets:
                fleet.flush()
                times = one_client(fleet.nodes[0].port, cmd, n)
                p50[fleet.kind].append(times[len(times) // 2] * 1000)
                p99[fleet.kind].append(times[int(len(times) * 0.99)] * 1000)
                self.log(
                    f"1 client REPLICATE 3 #{i + 1} {fleet.kind}: p50 {p50[fleet.kind][-1]:.3f} ms,"
                    f" p99 {p99[fleet.kind][-1]:.3f} ms"
                )
        self.add("1 client, ADDJOB REPLICATE 3, p50", "ms", p50["trio"], p50["c"])
        self.add("1 client, ADDJOB REPLICATE 3, p99", "ms", p99["trio"], p99["c"])

    def rss(self) -> None:
        n = self.size["rss_jobs"]
        per_job: dict[str, list[float]] = {"trio": [], "c": []}
        cmd = encode("ADDJOB", "q", BODY, 0)
        for i in range(self.repeat):
            for fleet in self.fleets_of(1):
                srv = fleet.nodes[0]
                before = srv.memory()["VmRSS"]
                res = pipeline(srv.port, (cmd for _ in range(n)))
                if res.errors:
                    raise BenchError(f"{fleet.kind}: fill: {res.first_error}")
                if command(srv.port, b"QLEN", b"q") != n:
                    raise BenchError(f"{fleet.kind}: QLEN is not {n} after the fill")
                after = srv.memory()["VmRSS"]
                per_job[fleet.kind].append((after - before) / n)
                self.log(f"RSS #{i + 1} {fleet.kind}: {(after - before) / n:.0f} B per job")
        self.add("RSS per queued job", "B", per_job["trio"], per_job["c"])

    def run(self, parts: list[str]) -> None:
        for part in parts:
            if part == "latency" and "cluster" in parts:
                continue  # measured on the cluster of that part
            getattr(self, part)()
        self.stop_all()


def one_client(port: int, cmd: bytes, n: int) -> list[float]:
    """n requests one after another on one connection; sorted seconds each."""
    times: list[float] = []
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(cmd)
            data = s.recv(4096)
            while not data.endswith(b"\r\n"):
                more = s.recv(4096)
                if not more:
                    raise BenchError("connection closed")
                data += more
            times.append(time.perf_counter() - t0)
            if data.startswith(b"-"):
                raise BenchError(f"ADDJOB: {data!r}")
    return sorted(times)


def print_table(rows: list[Row]) -> None:
    head = ("figure", "disque-trio", "C Disque", "ratio", "target", "")
    lines = [
        (
            r.figure,
            f"{r.trio:,.0f} {r.unit}" if r.unit == "ops/s" else f"{r.trio:,.3g} {r.unit}",
            f"{r.c:,.0f} {r.unit}" if r.unit == "ops/s" else f"{r.c:,.3g} {r.unit}",
            f"{r.ratio:.2f}",
            r.target,
            "" if r.passed is None else ("met" if r.passed else "MISSED"),
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    for line in (head, *lines):
        print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


def node_version(python: str) -> str:
    """What ``python`` says it is, on one line (``--node-python``)."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version.replace(chr(10), ' '))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise BenchError(f"--node-python {python}: does not run: {e}") from None
    return f"{python} (Python {out.stdout.strip()})"


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, timeout=3600)
    p.add_argument(
        "--disque-c",
        required=True,
        metavar="PATH",
        help="a disque-server binary built from the original's source",
    )
    p.add_argument(
        "--only", action="append", choices=PARTS, help="run only these parts (repeatable)"
    )
    p.add_argument(
        "--node-python",
        default=sys.executable,
        metavar="PYTHON",
        help="the interpreter of the disque-trio nodes (default: this one)",
    )
    args = settle_repeat(p, p.parse_args(argv))
    exe = os.path.abspath(args.disque_c)
    if not os.access(exe, os.X_OK):
        print(f"bench_vs_c: {exe} is not an executable", file=sys.stderr)
        return 1
    if shutil.which("redis-benchmark") is None:
        print(
            "bench_vs_c: redis-benchmark not found (apt-get install redis-tools)", file=sys.stderr
        )
        return 1
    parts = [x for x in PARTS if not args.only or x in args.only]
    load = os.getloadavg()[0]
    print(
        f"bench_vs_c: {'quick' if args.quick else 'full'} run, repeat {args.repeat}, "
        f"{CLIENTS} clients, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load {load:.2f}"
    )
    if args.node_python != sys.executable:
        try:
            print(f"bench_vs_c: the disque-trio nodes run on {node_version(args.node_python)}")
        except BenchError as e:
            print(f"bench_vs_c: {e}", file=sys.stderr)
            return 1
    arm_signals(args.timeout)
    bench = Bench(args, exe)
    t0 = time.perf_counter()

    def stop() -> None:
        bench.stop_all()
        shutil.rmtree(bench.root, ignore_errors=True)

    status = guarded("bench_vs_c", lambda: bench.run(parts), stop)
    if bench.rows:
        print(
            f"\n== disque-trio vs C Disque, median of {args.repeat} "
            f"({time.perf_counter() - t0:.0f} s); ratio = disque-trio / C Disque =="
        )
        print_table(bench.rows)
        print(f"\nload average (1 min): {load:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if args.json:
        doc = {
            "repeat": args.repeat,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": load,
            "complete": status == 0,
            "rows": [asdict(r) for r in bench.rows],
            "median_spread": {
                r.figure: statistics.pstdev(r.samples["trio"]) if len(r.samples["trio"]) > 1 else 0
                for r in bench.rows
            },
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
