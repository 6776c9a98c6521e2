#!/usr/bin/env python3
"""The CPU cost of timer traffic: seven nodes holding jobs with RETRY 1.

A job with RETRY 1 keeps its holders talking for as long as it lives: once
a second each holder that does not have it queued announces its re-queue
(WILLQUEUE), and the holder that has it queued answers every holder
(QUEUED). The original's Tcl unit 04-ttl ("Jobs mass expire test") adds
1,000 such jobs (TTL 5, so RETRY 1; REPLICATE 3 by default on seven nodes)
to a seven-node cluster one at a time, and expects all of them to be there
at the end of the loop: this traffic competes with its ADDJOBs.

The script starts seven disque-trio nodes (and seven C Disque nodes with
``--disque-c``, a binary you built from the original's source). Each round,
for each kind in turn: DEBUG FLUSHALL on every node, add ``--jobs`` such
jobs to the first node (pipelined), wait 0.5 s, and read the seven
processes' CPU time (``/proc/PID/stat``, Linux only) over ``--window``
seconds. It prints the cores used per round, the medians, and the ratio.

    python bench/bench_chatter.py [--jobs 1000] [--rounds 3] [--disque-c PATH]

``--nodes``, ``--retry`` and ``--ttl`` measure other holdings: three nodes
holding 100,000 jobs with RETRY 5 (REPLICATE 3, no consumer), say:

    python bench/bench_chatter.py --nodes 3 --jobs 100000 --retry 5 --ttl 3600

Jobs that outlive the round are flushed after it, so the next kind runs on
a quiet machine.

A benchmark that prints figures, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_single import BenchError, encode, median, pipeline
from bench_vs_c import Fleet

NODES = 7
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of these processes so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # Fields 14 and 15 (utime, stime); the command name (field 2)
            # may hold spaces, so count from its closing parenthesis.
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def one_round(fleet: Fleet, jobs: int, window: float, ttl: int, retry: int | None) -> float:
    """Cores the fleet used while ``jobs`` jobs (TTL ``ttl``, RETRY ``retry``
    or the default for that TTL) sat on it."""
    fleet.flush()
    extra: tuple[str | int, ...] = ("TTL", ttl)
    if retry is not None:
        extra += ("RETRY", retry)
    if len(fleet.nodes) < 3:
        extra += ("REPLICATE", len(fleet.nodes))
    adds = [encode("ADDJOB", "myqueue", f"job-{i}", 10000, *extra) for i in range(jobs)]
    result = pipeline(fleet.nodes[0].port, adds)
    if result.errors:
        raise BenchError(f"{fleet.kind}: {result.errors} ADDJOBs failed")
    time.sleep(0.5)
    pids = [srv.pid for srv in fleet.nodes]
    before, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(window)
    cores = (cpu_seconds(pids) - before) / (time.monotonic() - t0)
    for srv in fleet.nodes:
        srv.check_alive()
    return cores


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=2.0, help="seconds of CPU time sampled")
    p.add_argument("--disque-c", metavar="PATH", help="a disque-server built from the original")
    p.add_argument("--nodes", type=int, default=NODES, help="nodes per cluster (1 to 16)")
    p.add_argument("--ttl", type=int, default=5, help="the jobs' TTL in seconds")
    p.add_argument("--retry", type=int, help="the jobs' RETRY (default: the TTL's default)")
    args = p.parse_args(argv)
    if not 1 <= args.nodes <= 16:
        p.error("--nodes: 1 to 16")
    if args.ttl < 5 or args.jobs > 4000 * (args.ttl // 5):
        # The adds must finish well before the first jobs expire.
        p.error(f"--jobs: at most {4000 * max(1, args.ttl // 5)} (the jobs live {args.ttl} s)")
    root = tempfile.mkdtemp(prefix="bench-chatter-")
    fleets = [Fleet("trio", "", root)]
    if args.disque_c:
        fleets.append(Fleet("c", os.path.abspath(args.disque_c), root))
    cores: dict[str, list[float]] = {f.kind: [] for f in fleets}
    try:
        for fleet in fleets:
            fleet.start(args.nodes)
        for r in range(args.rounds):
            for fleet in fleets:
                used = one_round(fleet, args.jobs, args.window, args.ttl, args.retry)
                cores[fleet.kind].append(used)
                print(f"round {r + 1} {fleet.kind}: {used:.2f} cores", flush=True)
                # The next kind runs on a quiet machine: the jobs expire, or go.
                if args.ttl > 5:
                    fleet.flush()
                time.sleep(5.5)
    except BenchError as exc:
        print(f"bench_chatter: {exc}", file=sys.stderr)
        return 1
    finally:
        for fleet in fleets:
            fleet.stop()
        shutil.rmtree(root, ignore_errors=True)
    retry = f"RETRY {args.retry}" if args.retry is not None else f"TTL {args.ttl}"
    line = f"{args.jobs} {retry} jobs on {args.nodes} nodes, CPU over {args.window:g} s: "
    line += ", ".join(f"{kind} {median(v):.2f} cores (median)" for kind, v in cores.items())
    if "c" in cores:
        line += f"; disque-trio / C Disque = {median(cores['trio']) / median(cores['c']):.2f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
