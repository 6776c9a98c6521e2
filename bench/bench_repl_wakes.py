#!/usr/bin/env python3
"""What a replica pays per wake-up: CPU per job against wake-ups per job.

A replica's CPU per job falls as the REPLJOBs it reads come in larger
batches (``bench_repl_cost.py``: its -P 1 figure against its -P 16 one).
This script measures how much each batch costs, whatever its size: a
3-node cluster of each implementation given, ``redis-benchmark`` driving
``ADDJOB q <10 bytes> 0 REPLICATE 3`` at -P 1 with 10, 25, 50, 100 and 200
clients (more clients in flight, larger batches), and at -P 16 with 50.
For each run it reads, before and after, each replica's CPU time
(``bench_repl_cost.cpu_ns``) and how often it went to sleep waiting for its
sockets (``voluntary_ctxt_switches`` in ``/proc/<pid>/status``: one per
wake-up of its event loop, which then reads whatever batch of frames came),
and prints them per job. A least-squares line through the runs, replicas'
CPU per job = base + cost x wake-ups per job, gives the cost of a wake-up
(the event loop's pass, the read, the GOTJOB frame back, the caches filled
again after other processes ran) and the cost of a job.

    python bench/bench_repl_wakes.py
    python bench/bench_repl_wakes.py --disque-c /path/to/disque/src/disque-server
    python bench/bench_repl_wakes.py --peer /tmp/before   # another checkout, same run
    python bench/bench_repl_wakes.py --quick

Prints figures; exits 0 whatever they are (1 if it could not run).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bench_repl_cost import Fleet, wait_quiet
from bench_single import (
    BODY,
    BenchError,
    arm_signals,
    bench_parser,
    bench_timeout,
    command,
    guarded,
    median,
    redis_benchmark,
    settle_repeat,
)

RUNS = [(10, 1), (25, 1), (50, 1), (100, 1), (200, 1), (50, 16)]  # (clients, -P)


def wakeups(pid: int) -> int:
    """Times the process slept waiting (its main thread: the event loop)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise BenchError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


@dataclass
class Point:
    server: str
    clients: int
    depth: int
    rate: float  # jobs/s
    origin_us: float  # CPU per job
    replica_us: float  # CPU per job, the mean of the two replicas
    replica_wakes: float  # wake-ups per job, the mean of the two replicas


def run_point(fleet: Fleet, clients: int, depth: int, n: int) -> Point:
    nodes = fleet.three
    for srv in nodes:
        srv.check_alive()
        if command(srv.port, b"DEBUG", b"FLUSHALL") != b"OK":
            raise BenchError(f"{srv.kind}: DEBUG FLUSHALL failed")
    pids = [s.pid for s in nodes]
    wakes0 = [wakeups(p) for p in pids[1:]]
    cpu0 = wait_quiet(pids)
    argv = ["ADDJOB", "q", BODY.decode(), "0", "REPLICATE", "3"]
    rate = redis_benchmark(nodes[0].port, n, depth, argv, bench_timeout(n, 200.0), clients)
    cpu1 = wait_quiet(pids)
    wakes1 = [wakeups(p) for p in pids[1:]]
    us = [(b - a) / 1e3 / n for a, b in zip(cpu0, cpu1, strict=True)]
    wakes = [(b - a) / n for a, b in zip(wakes0, wakes1, strict=True)]
    return Point(fleet.label, clients, depth, rate, us[0], sum(us[1:]) / 2, sum(wakes) / 2)


def fit(points: list[Point]) -> tuple[float, float]:
    """Least squares: replica_us = base + cost * replica_wakes; (base, cost)."""
    xs = [p.replica_wakes for p in points]
    ys = [p.replica_us for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise BenchError("every run woke the replicas as often: nothing to fit")
    cost = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - cost * mx, cost


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, 1800)
    p.add_argument("--disque-c", metavar="PATH", help="C Disque's disque-server, run beside")
    p.add_argument("--peer", metavar="DIR", help="another checkout's disque-trio, run beside")
    p.add_argument("--jobs", type=int, help="ADDJOBs per run (default 20,000; 3,000 --quick)")
    args = settle_repeat(p, p.parse_args(argv))
    n = args.jobs or (3000 if args.quick else 20_000)
    arm_signals(args.timeout)
    root = tempfile.mkdtemp(prefix="bench-repl-wakes-")
    node = ["--loglevel", "notice", "--enable-debug-command", "local"]
    fleets = [Fleet("disque-trio", [sys.executable, "-m", "disque_trio", *node], False, root)]
    if args.peer:
        peer = str(Path(args.peer).resolve())
        argv_peer = ["env", f"PYTHONPATH={peer}", sys.executable, "-m", "disque_trio", *node]
        fleets.append(Fleet("before", argv_peer, False, root))
    if args.disque_c:
        c_argv = [args.disque_c, "--daemonize", "no", "--appendonly", "no", "--loglevel", "notice"]
        fleets.append(Fleet("C Disque", c_argv, True, root))
    samples: dict[tuple[str, int, int], list[Point]] = {}
    load = [os.getloadavg()[0]]
    summary: dict[str, dict[str, float]] = {}

    def run() -> None:
        for fleet in fleets:
            print(f"starting {fleet.label}: a 3-node cluster", flush=True)
            fleet.start(lone=False)
        for i in range(args.repeat):
            for clients, depth in RUNS:
                for fleet in fleets:
                    pt = run_point(fleet, clients, depth, n)
                    samples.setdefault((fleet.label, clients, depth), []).append(pt)
                    print(
                        f"#{i + 1} {fleet.label:11} -c {clients:3} -P {depth:2}: replica"
                        f" {pt.replica_us:5.1f} us/job, {pt.replica_wakes:.3f} wake-ups/job;"
                        f" origin {pt.origin_us:5.1f} us/job; {pt.rate:8,.0f} jobs/s",
                        flush=True,
                    )
        load.append(os.getloadavg()[0])
        rows = []
        for fleet in fleets:
            pts = []
            for clients, depth in RUNS:
                runs = samples[(fleet.label, clients, depth)]
                pt = Point(
                    fleet.label,
                    clients,
                    depth,
                    median([r.rate for r in runs]),
                    median([r.origin_us for r in runs]),
                    median([r.replica_us for r in runs]),
                    median([r.replica_wakes for r in runs]),
                )
                pts.append(pt)
                per = f"{1 / pt.replica_wakes:,.0f}" if pt.replica_wakes else "-"
                rows.append(
                    f"| {fleet.label} | {clients} | {depth} | {pt.replica_wakes:.3f} | {per}"
                    f" | {pt.replica_us:.1f} us | {pt.rate:,.0f} |"
                )
            base, cost = fit(pts)
            summary[fleet.label] = {"us_per_job": base, "us_per_wakeup": cost}
        fits = [
            f"| {label} | {fig['us_per_wakeup']:.0f} us | {fig['us_per_job']:.1f} us |"
            for label, fig in summary.items()
        ]
        table = "\n".join(
            [
                "| server | per wake-up | per job |",
                "|---|---|---|",
                *fits,
                "",
                "| server | clients | -P | wake-ups per job | jobs per wake-up"
                " | CPU per job | jobs/s |",
                "|---|---|---|---|---|---|---|",
                *rows,
            ]
        )
        conditions = (
            f"medians of {args.repeat} runs of {n:,} jobs, REPLICATE 3, a replica's CPU"
            " (the mean of the two) and its fit, CPU per job = per job + per wake-up x"
            f" wake-ups per job; CPython {platform.python_version()}, {os.cpu_count()} cores,"
            f" load average {load[0]:.1f} to {load[-1]:.1f}"
        )
        print(f"\n{conditions}:\n\n{table}")
        if args.json:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            doc = {
                "benchmark": "repl-wakes",
                "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M"),
                "commit": commit,
                "command": " ".join(["python", "bench/bench_repl_wakes.py", *shown(argv)]),
                "conditions": conditions,
                "table": table,
                "fit": summary,
                "samples": {
                    f"{k[0]} -c {k[1]} -P {k[2]}": [asdict(r) for r in v]
                    for k, v in samples.items()
                },
            }
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")

    def stop() -> None:
        for fleet in fleets:
            fleet.stop()

    return guarded("bench_repl_wakes", run, stop)


def shown(argv: list[str] | None) -> list[str]:
    args = sys.argv[1:] if argv is None else argv
    return [
        "PATH" if prev == "--disque-c" else a for prev, a in zip(["", *args], args, strict=False)
    ]


if __name__ == "__main__":
    sys.exit(main())
