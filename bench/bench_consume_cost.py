#!/usr/bin/env python3
"""Consuming's cost per job: CPU time per GETJOB + ACKJOB, per node role.

bench_repl_cost.py measures ADDJOB; this is the other half of a job's
life. A 3-node cluster (bench_repl_cost's Fleet: met, DEBUG FLUSHALL
between runs) gets N jobs ``ADDJOB q <10 bytes> 0 REPLICATE 3`` on node 0,
pipelined (not measured); once the nodes are quiet, 50 clients take them
from node 0, each ``GETJOB NOHANG FROM q`` then ``ACKJOB <id>``, one
request in flight, until the queue is empty; then the nodes are left to
become quiet again (the acks travel to the other two copies after the
last reply). CPU microseconds per job (``cpu_ns``: /proc/<pid>/task/*/
schedstat) for the origin (node 0: the queue, the GETJOBs and the
ACKJOBs), the two replicas together and the whole cluster, medians of
``--repeat`` runs.

    python bench/bench_consume_cost.py                         # this checkout
    python bench/bench_consume_cost.py --checkout /tmp/before  # another one
    python bench/bench_consume_cost.py --peer /tmp/before      # both, same run
    python bench/bench_consume_cost.py --quick

About 1-2 minutes for 20,000 jobs x 3 repetitions on the 2-core VM (twice
that with ``--peer``). ``--checkout DIR`` runs DIR's ``disque_trio`` (first
on ``PYTHONPATH``; default: this checkout); ``--peer DIR`` a second
cluster of DIR's, driven in turn in each repetition. Prints figures, not a
test: exit 0 when it ran, 1 when it could not.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_repl_cost import (  # noqa: E402  (the bench directory is not a package)
    SCHEDSTAT,
    Fleet,
    Sample,
    markdown,
    trio_fleet,
    wait_quiet,
)
from bench_single import (  # noqa: E402
    BODY,
    HOST,
    BenchError,
    arm_signals,
    bench_parser,
    command,
    encode,
    guarded,
    median,
    pipeline,
    settle_repeat,
)

CLIENTS = 50


def fill(port: int, n: int) -> None:
    """N jobs, REPLICATE 3, on one connection in pipelined batches."""
    cmd = encode("ADDJOB", "q", BODY, 0, "REPLICATE", 3)
    result = pipeline(port, (cmd for _ in range(n)))
    if result.errors or result.ops != n:
        raise BenchError(
            f"fill: {result.ops} replies, {result.errors} errors {result.first_error}"
        )
    if (qlen := command(port, "QLEN", "q")) != n:
        raise BenchError(f"fill: QLEN {qlen}, not {n}")


def consume(port: int, clients: int, timeout: float) -> tuple[int, float]:
    """``clients`` connections, each GETJOB NOHANG then ACKJOB of the job it
    got, until a GETJOB finds the queue empty. Returns (jobs, seconds)."""
    getjob = encode("GETJOB", "NOHANG", "FROM", "q")
    sel = selectors.DefaultSelector()
    socks = []
    state: dict[socket.socket, tuple[hiredis.Reader, list[str]]] = {}
    jobs = 0
    try:
        for _ in range(clients):
            s = socket.create_connection((HOST, port), timeout=10)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(s)
            state[s] = (hiredis.Reader(), ["get"])
            sel.register(s, selectors.EVENT_READ, s)
        start = time.perf_counter()
        for s in socks:
            s.sendall(getjob)
        open_ = len(socks)
        while open_:
            if time.perf_counter() - start > timeout:
                raise BenchError(f"consume: not done after {timeout:.0f} s ({jobs} jobs)")
            for key, _ in sel.select(timeout=0.5):
                s = key.data
                reader, step = state[s]
                data = s.recv(65536)
                if not data:
                    raise BenchError("consume: the node closed a connection")
                reader.feed(data)
                while (reply := reader.gets()) is not False:
                    if isinstance(reply, hiredis.ReplyError):
                        raise BenchError(f"consume: {reply}")
                    if step[0] == "get":
                        if not reply:  # the queue is empty: this client is done
                            sel.unregister(s)
                            open_ -= 1
                            break
                        s.sendall(encode("ACKJOB", reply[0][1]))
                        step[0] = "ack"
                        jobs += 1
                    else:
                        if reply != 1:
                            raise BenchError(f"consume: ACKJOB answered {reply!r}")
                        s.sendall(getjob)
                        step[0] = "get"
        return jobs, time.perf_counter() - start
    finally:
        for s in socks:
            s.close()
        sel.close()


def registered(fleet: Fleet) -> list[int]:
    out = []
    for srv in fleet.three:
        info = command(srv.port, "INFO", "jobs").decode()
        line = next((x for x in info.splitlines() if x.startswith("registered_jobs:")), "")
        out.append(int(line.split(":")[1]) if line else -1)
    return out


def run_once(fleet: Fleet, n: int) -> tuple[Sample, list[int]]:
    nodes = fleet.three
    for srv in nodes:
        srv.check_alive()
        if command(srv.port, b"DEBUG", b"FLUSHALL") != b"OK":
            raise BenchError(f"{srv.kind}: DEBUG FLUSHALL failed")
    fill(nodes[0].port, n)
    pids = [s.pid for s in nodes]
    before = wait_quiet(pids)
    jobs, seconds = consume(nodes[0].port, CLIENTS, max(120.0, n / 100))
    after = wait_quiet(pids)
    if jobs != n:
        raise BenchError(f"{fleet.label}: {jobs} jobs consumed, not {n}")
    us = [(b - a) / 1e3 / n for a, b in zip(before, after, strict=True)]
    return Sample(us, n / seconds), registered(fleet)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, 1800)
    p.add_argument("--checkout", default=str(BENCH.parent), help="the code the nodes run")
    p.add_argument("--peer", metavar="DIR", help="a second checkout's cluster, same run")
    p.add_argument("--jobs", type=int, help="jobs per run (default 20,000; 3,000 --quick)")
    args = settle_repeat(p, p.parse_args(argv))
    n = args.jobs or (3000 if args.quick else 20_000)
    arm_signals(args.timeout)
    root = tempfile.mkdtemp(prefix="bench-consume-cost-")
    fleets: list[Fleet] = []
    samples: dict[str, list[Sample]] = {}
    leftovers: dict[str, list[list[int]]] = {}
    load = [os.getloadavg()[0]]
    # Labelled by directory name: "before", "agent-bench"...
    checkouts = {Path(args.checkout).resolve().name: args.checkout}
    if args.peer:
        name = Path(args.peer).resolve().name
        checkouts[name if name not in checkouts else f"peer {name}"] = args.peer

    def run() -> None:
        for label, where in checkouts.items():
            fleet = trio_fleet(label, root, str(Path(where).resolve()))
            fleets.append(fleet)
            print(f"starting {label} ({where}): a 3-node cluster", flush=True)
            fleet.start(lone=False)
            samples[label], leftovers[label] = [], []
        for i in range(args.repeat):
            for fleet in fleets:
                s, left = run_once(fleet, n)
                samples[fleet.label].append(s)
                leftovers[fleet.label].append(left)
                per = " + ".join(f"{x:.0f}" for x in s.us)
                print(
                    f"#{i + 1} {fleet.label:12} {s.total:6.1f} us/job ({per})  "
                    f"{s.rate:7,.0f} jobs/s; jobs left {left}",
                    flush=True,
                )
        load.append(os.getloadavg()[0])
        head = ["GETJOB + ACKJOB, 3 nodes REPLICATE 3", "us/job, all nodes", "origin"]
        head += ["replicas", "jobs/s"]
        rows = [
            [
                f"{label} ({checkouts[label]})",
                f"{median([s.total for s in xs]):.0f}",
                f"{median([s.origin for s in xs]):.0f}",
                f"{median([s.replicas for s in xs]):.0f}",
                f"{median([s.rate for s in xs]):,.0f}",
            ]
            for label, xs in samples.items()
        ]
        table = markdown(head, rows)
        print(f"\nCPU per job consumed, medians of {args.repeat} ({n:,} jobs a run):\n")
        print(table)
        print(f"\nload average (1 min): {load[0]:.2f} at the start, {load[-1]:.2f} at the end")
        if args.json:
            write(args, n, checkouts, table, samples, leftovers, load)

    def stop() -> None:
        for fleet in fleets:
            fleet.stop()
        shutil.rmtree(root, ignore_errors=True)

    return guarded("bench_consume_cost", run, stop)


def write(
    args: Any,
    n: int,
    checkouts: dict[str, str],
    table: str,
    samples: dict[str, list[Sample]],
    leftovers: dict[str, list[list[int]]],
    load: list[float],
) -> None:
    def commit(where: str) -> str:
        out = subprocess.run(
            ["git", "-C", where, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return out.stdout.strip()

    data = {
        "benchmark": "consume-cost",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M"),
        "commit": commit(str(BENCH.parent)),
        "command": "python bench/bench_consume_cost.py " + " ".join(sys.argv[1:]),
        "checkouts": {k: {"path": v, "commit": commit(v)} for k, v in checkouts.items()},
        "conditions": (
            f"medians of {args.repeat} runs of {n:,} jobs, {CLIENTS} clients on node 0, CPU "
            f"read {'in ns (schedstat)' if SCHEDSTAT else 'in clock ticks'}; CPython "
            f"{platform.python_version()}, {os.cpu_count()} cores, load average "
            f"{load[0]:.1f} to {load[-1]:.1f}"
        ),
        "table": table,
        "samples": {
            label: [{"us": s.us, "rate": s.rate} for s in xs] for label, xs in samples.items()
        },
        "registered_jobs_left": leftovers,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
