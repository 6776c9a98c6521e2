#!/usr/bin/env python3
"""Replication's cost per job: CPU time per ADDJOB, per node role, in one run.

Throughput swings with whatever else the two cores do; the CPU a server
spends per job is steadier. This script starts one node and a 3-node
cluster of each implementation it is given, drives them with
``redis-benchmark`` (50 clients, ``ADDJOB q <10 bytes> 0 [REPLICATE 3]
[ASYNC]``, -P 1 and -P 16) and reads each server's CPU time (``cpu_ns``:
nanoseconds from ``/proc/<pid>/task/*/schedstat``, else utime + stime)
before and after each run, once the nodes are quiet
again (an ASYNC run's copies are still travelling when the last reply
comes). It prints CPU microseconds per job for the origin (the node the
clients talk to), for the two replicas together and for the whole cluster,
then the issue's summary table with its targets:

* 3 nodes, REPLICATE 3, -P 1: CPU per job summed over the nodes at most
  2.5x the one-node -P 1 figure, or C Disque's ratio in the same run if
  that is higher;
* the replicas' CPU per job at -P 1 at most 1.3x their -P 16 figure;
* ASYNC no costlier than synchronous replication (-P 1, whole cluster).

    python bench/bench_repl_cost.py
    python bench/bench_repl_cost.py --disque-c /path/to/disque/src/disque-server
    python bench/bench_repl_cost.py --peer /tmp/before   # another checkout, same run
    python bench/bench_repl_cost.py --profile /tmp/prof  # py-spy, origin and a replica
    python bench/bench_repl_cost.py --quick

``--peer DIR`` runs a second set of disque-trio nodes from another checkout
(its ``disque_trio`` first on ``PYTHONPATH``), for an A/B in one run: the
summary then has a row for it, and ``--json`` writes its figures to a
second file named like the first with ``-before`` added.

This is a benchmark that prints figures, not a test: it exits 0 even when a
target is missed (1 only if it could not run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench_single import (
    BODY,
    HOST,
    BenchError,
    Server,
    arm_signals,
    bench_parser,
    bench_timeout,
    command,
    guarded,
    median,
    redis_benchmark,
    settle_repeat,
)
from bench_vs_c import free_pair, reachable

CLK_TCK = os.sysconf("SC_CLK_TCK")
# The nodes are quiet again when none used more than this share of a core
# over QUIET_WINDOW_S (an idle disque-trio node's cron takes about 1 %).
QUIET_WINDOW_S = 0.25
QUIET_SHARE = 0.08
QUIET_MAX_S = 20.0

# (name, nodes, pipeline depth, extra ADDJOB arguments)
SCENARIOS: list[tuple[str, int, int, list[str]]] = [
    ("1 node, -P 1", 1, 1, []),
    ("1 node, -P 16", 1, 16, []),
    ("3 nodes REPLICATE 3, -P 1", 3, 1, ["REPLICATE", "3"]),
    ("3 nodes REPLICATE 3, -P 16", 3, 16, ["REPLICATE", "3"]),
    ("3 nodes REPLICATE 3 ASYNC, -P 1", 3, 1, ["REPLICATE", "3", "ASYNC"]),
    ("3 nodes REPLICATE 3 ASYNC, -P 16", 3, 16, ["REPLICATE", "3", "ASYNC"]),
]
ONE_P1, ONE_P16, SYNC_P1, SYNC_P16, ASYNC_P1, ASYNC_P16 = (s[0] for s in SCENARIOS)

RATIO_TARGET = 2.5  # 3 nodes / 1 node, -P 1 (or C Disque's ratio, if higher)
REPLICA_TARGET = 1.3  # the replicas' -P 1 / -P 16
ASYNC_TARGET = 1.0  # ASYNC / synchronous, -P 1


def _schedstat_ok() -> bool:
    try:
        with open("/proc/self/schedstat") as f:
            return len(f.read().split()) == 3
    except OSError:
        return False


# The kernel's count of a thread's time on a CPU, in nanoseconds, when it
# keeps one: utime + stime come in clock ticks (10 ms), and a replica's
# 0.25 s for 20,000 jobs is then read to within 4 %.
SCHEDSTAT = _schedstat_ok()


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: the fields after it start
        # after the last ')'; utime and stime are the 12th and 13th.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_ns(pid: int) -> int:
    """CPU time a process used so far, in nanoseconds: the sum over its
    threads of their time on a CPU (``/proc/<pid>/task/*/schedstat``), or
    utime + stime where the kernel keeps no such count."""
    if not SCHEDSTAT:
        return cpu_ticks(pid) * 1_000_000_000 // CLK_TCK
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def wait_quiet(pids: list[int]) -> list[int]:
    """Wait until no process used more than QUIET_SHARE of a core over a
    window; returns their CPU time (``cpu_ns``) at the start of that window."""
    limit = QUIET_SHARE * QUIET_WINDOW_S * 1e9
    deadline = time.monotonic() + QUIET_MAX_S
    before = [cpu_ns(p) for p in pids]
    while True:
        time.sleep(QUIET_WINDOW_S)
        after = [cpu_ns(p) for p in pids]
        if all(b - a <= limit for a, b in zip(before, after, strict=True)):
            return before
        if time.monotonic() > deadline:
            raise BenchError(f"the nodes are still busy {QUIET_MAX_S:.0f} s after a run")
        before = after


@dataclass
class Fleet:
    """One implementation: a lone node and a 3-node cluster."""

    label: str  # "disque-trio", "before", "C Disque"
    argv: list[str]  # how to start one node (port, bus port, dir appended)
    c: bool
    root: str
    one: list[Server] = field(default_factory=list)
    three: list[Server] = field(default_factory=list)

    def start(self, lone: bool = True) -> None:
        """The 3-node cluster, met, and the lone node unless not ``lone``."""
        self.one = [self._node("one")] if lone else []
        self.three = [self._node(f"n{i}") for i in range(3)]
        first = self.three[0].port
        for srv in self.three[1:]:
            extra = [] if self.c else [srv.port + 10000]
            reply = command(first, b"CLUSTER", b"MEET", HOST, srv.port, *extra)
            if reply != b"OK":
                raise BenchError(f"{self.label}: CLUSTER MEET: {reply!r}")
        deadline = time.monotonic() + 30
        while any(reachable(s.port) != 2 for s in self.three):
            if time.monotonic() > deadline:
                raise BenchError(f"{self.label}: no full mesh after 30 s")
            time.sleep(0.1)

    def _node(self, name: str) -> Server:
        port, bus = free_pair()
        workdir = tempfile.mkdtemp(prefix=f"{name}-", dir=self.root)
        argv = [*self.argv, "--port", str(port), "--bind", HOST, "--dir", workdir]
        if not self.c:
            argv += ["--cluster-port", str(bus)]
        srv = Server(f"{self.label} {name}", argv, port, workdir)
        srv.wait_ready()
        return srv

    def nodes(self, count: int) -> list[Server]:
        return self.one if count == 1 else self.three

    def stop(self) -> None:
        for srv in self.one + self.three:
            try:
                srv.stop()
            except Exception as e:  # keep stopping the others
                print(f"stopping {srv.kind}: {e}", file=sys.stderr)


@dataclass
class Sample:
    """One run: CPU microseconds per job of each node, and the rate."""

    us: list[float]
    rate: float

    @property
    def total(self) -> float:
        return sum(self.us)

    @property
    def origin(self) -> float:
        return self.us[0]

    @property
    def replicas(self) -> float:
        return sum(self.us[1:])


def trio_fleet(label: str, root: str, checkout: str | None = None) -> Fleet:
    """disque-trio nodes of this checkout, or of another one's ``disque_trio``
    (first on ``PYTHONPATH``), with DEBUG FLUSHALL allowed between runs.
    This checkout's goes first on ``PYTHONPATH`` too: the interpreter's own
    may be another tree's (an editable install of another clone)."""
    where = (
        Path(checkout).resolve() if checkout is not None else Path(__file__).resolve().parents[1]
    )
    node = ["env", f"PYTHONPATH={where}", sys.executable, "-m", "disque_trio"]
    node += ["--loglevel", "notice", "--enable-debug-command", "local"]
    return Fleet(label, node, False, root)


def run_once(fleet: Fleet, scenario: tuple[str, int, int, list[str]], n: int) -> Sample:
    _, count, depth, extra = scenario
    nodes = fleet.nodes(count)
    for srv in nodes:
        srv.check_alive()
        if command(srv.port, b"DEBUG", b"FLUSHALL") != b"OK":
            raise BenchError(f"{srv.kind}: DEBUG FLUSHALL failed")
    pids = [s.pid for s in nodes]
    before = wait_quiet(pids)
    argv = ["ADDJOB", "q", BODY.decode(), "0", *extra]
    rate = redis_benchmark(nodes[0].port, n, depth, argv, bench_timeout(n, 200.0))
    after = wait_quiet(pids)
    us = [(b - a) / 1e3 / n for a, b in zip(before, after, strict=True)]
    return Sample(us, rate)


class Profiler:
    """py-spy on a process while one run lasts: collapsed stacks to a file."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        exe = shutil.which("py-spy")
        if exe is None:
            raise BenchError("--profile needs py-spy on PATH (pip install py-spy)")
        argv = [exe, "record", "--pid", str(pid), "--rate", "250", "--nonblocking"]
        argv += ["--format", "raw", "--output", str(out)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attached before the load starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def top_functions(path: Path, count: int = 15) -> list[tuple[str, float, float]]:
    """(function, share of samples in it, share under it) from collapsed
    stacks, the busiest by own time first."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        if not stack or not num.isdigit():
            continue
        samples = int(num)
        frames = stack.split(";")
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            under[frame] += samples
    if not total:
        return []
    return [(f, own[f] / total, under[f] / total) for f, _ in own.most_common(count)]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n: int = args.jobs or (3000 if args.quick else 20_000)
        self.root = tempfile.mkdtemp(prefix="bench-repl-cost-")
        self.fleets: list[Fleet] = []
        # fleet label -> scenario -> samples
        self.samples: dict[str, dict[str, list[Sample]]] = {}
        self.load: list[float] = []

    def log(self, msg: str) -> None:
        print(msg, flush=True)

    def start(self) -> None:
        self.fleets.append(trio_fleet("disque-trio", self.root))
        if self.args.peer:
            self.fleets.append(trio_fleet("before", self.root, self.args.peer))
        if self.args.disque_c:
            argv = [self.args.disque_c, "--daemonize", "no", "--appendonly", "no"]
            self.fleets.append(Fleet("C Disque", [*argv, "--loglevel", "notice"], True, self.root))
        for fleet in self.fleets:
            self.log(f"starting {fleet.label}: one node and a 3-node cluster")
            fleet.start()
            self.samples[fleet.label] = {s[0]: [] for s in SCENARIOS}

    def run(self) -> None:
        self.load.append(os.getloadavg()[0])
        self.start()
        for i in range(self.args.repeat):
            for scenario in SCENARIOS:
                for fleet in self.fleets:
                    s = run_once(fleet, scenario, self.n)
                    self.samples[fleet.label][scenario[0]].append(s)
                    per = " + ".join(f"{x:.0f}" for x in s.us)
                    self.log(
                        f"#{i + 1} {fleet.label:11} {scenario[0]:34} {s.total:7.1f} us/job"
                        f" ({per})  {s.rate:8,.0f} jobs/s"
                    )
        if self.args.profile:
            self.profile(Path(self.args.profile))
        self.load.append(os.getloadavg()[0])

    def profile(self, out: Path) -> None:
        """py-spy on this checkout's origin and first replica during one
        REPLICATE 3 -P 1 run (not counted in the figures)."""
        out.mkdir(parents=True, exist_ok=True)
        fleet = self.fleets[0]
        scenario = SCENARIOS[2]
        spies = {
            "origin": Profiler(fleet.three[0].pid, out / "origin.txt"),
            "replica": Profiler(fleet.three[1].pid, out / "replica.txt"),
        }
        try:
            run_once(fleet, scenario, self.n)
        finally:
            for spy in spies.values():
                spy.stop()
        for role, spy in spies.items():
            self.log(f"\nprofile of the {role} ({spy.out}), {scenario[0]}: own, under")
            for name, own, under in top_functions(spy.out):
                self.log(f"  {own * 100:5.1f} % {under * 100:5.1f} %  {name}")

    # ------------------------------------------------------------ results

    def med(self, label: str, scenario: str, part: str) -> float:
        return median([getattr(s, part) for s in self.samples[label][scenario]])

    def paired(self, label: str, a: str, b: str, part_a: str, part_b: str) -> float:
        """Median of the per-repetition ratios (the two runs of a
        repetition are a few seconds apart: a change of load hits both)."""
        xs, ys = self.samples[label][a], self.samples[label][b]
        return median(
            [getattr(x, part_a) / getattr(y, part_b) for x, y in zip(xs, ys, strict=True)]
        )

    def detail_rows(self) -> list[list[str]]:
        rows = []
        for scenario, *_ in SCENARIOS:
            for fleet in self.fleets:
                label = fleet.label
                repl = (
                    "" if "1 node" in scenario else f"{self.med(label, scenario, 'replicas'):.0f}"
                )
                rows.append(
                    [
                        scenario,
                        label,
                        f"{self.med(label, scenario, 'total'):.0f}",
                        f"{self.med(label, scenario, 'origin'):.0f}",
                        repl,
                        f"{median([s.rate for s in self.samples[label][scenario]]):,.0f}",
                    ]
                )
        return rows

    def summary(self) -> tuple[list[list[str]], dict[str, bool | None]]:
        """The issue's table, a row per implementation, and the targets."""
        rows = []
        ratios: dict[str, dict[str, float]] = {}
        for fleet in self.fleets:
            label = fleet.label
            r = {
                "ratio": self.paired(label, SYNC_P1, ONE_P1, "total", "total"),
                "replicas": self.paired(label, SYNC_P1, SYNC_P16, "replicas", "replicas"),
                "async": self.paired(label, ASYNC_P1, SYNC_P1, "total", "total"),
                "async16": self.paired(label, ASYNC_P16, SYNC_P16, "total", "total"),
            }
            ratios[label] = r
            rows.append(
                [
                    label,
                    f"{self.med(label, ONE_P1, 'total'):.0f} us",
                    f"{self.med(label, SYNC_P1, 'total'):.0f} us",
                    f"{r['ratio']:.2f}x",
                    f"{self.med(label, SYNC_P1, 'replicas'):.0f} us vs "
                    f"{self.med(label, SYNC_P16, 'replicas'):.0f} us: {r['replicas']:.2f}x",
                    f"{r['async']:.2f}x (-P 16: {r['async16']:.2f}x)",
                ]
            )
        mine = ratios["disque-trio"]
        c_ratio = ratios.get("C Disque", {}).get("ratio", 0.0)
        bound = max(RATIO_TARGET, c_ratio)
        results: dict[str, bool | None] = {
            f"3 nodes / 1 node at -P 1 <= {bound:.2f}x": mine["ratio"] <= bound,
            f"replicas -P 1 / -P 16 <= {REPLICA_TARGET}x": mine["replicas"] <= REPLICA_TARGET,
            f"ASYNC / sync at -P 1 <= {ASYNC_TARGET}x": mine["async"] <= ASYNC_TARGET,
        }
        return rows, results

    def report(self) -> None:
        head = ["scenario", "server", "us/job, all nodes", "origin", "replicas", "jobs/s"]
        print(f"\nCPU per job, medians of {self.args.repeat} ({self.n:,} jobs a run):\n")
        print(markdown(head, self.detail_rows()))
        rows, results = self.summary()
        print("\nPer job, CPU summed over the nodes:\n")
        print(markdown(SUMMARY_COLUMNS, rows))
        print()
        for name, ok in results.items():
            print(f"  {'PASS' if ok else 'MISS'}  {name}")
        print(
            f"\nload average (1 min): {self.load[0]:.2f} at the start, {self.load[-1]:.2f} at the end"
        )
        if self.args.json:
            self.write_json(Path(self.args.json), rows, results)

    def write_json(
        self, path: Path, rows: list[list[str]], results: dict[str, bool | None]
    ) -> None:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        base = {
            "benchmark": "repl-cost",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M"),
            "commit": commit,
            "command": "python bench/bench_repl_cost.py " + " ".join(self.args.argv_shown),
            "conditions": (
                f"medians of {self.args.repeat} runs of {self.n:,} jobs, 50 clients, CPU read "
                f"{'in ns (schedstat)' if SCHEDSTAT else 'in clock ticks'}; "
                f"CPython {platform.python_version()}, {os.cpu_count()} cores, load average "
                f"{self.load[0]:.1f} to {self.load[-1]:.1f}; "
                + "; ".join(f"{'PASS' if ok else 'MISS'} {k}" for k, ok in results.items())
            ),
        }
        detail = self.detail_rows()
        table = markdown(SUMMARY_COLUMNS, rows) + "\n\n" + markdown(DETAIL_COLUMNS, detail)
        samples = {
            label: {sc: [{"us": s.us, "rate": s.rate} for s in xs] for sc, xs in by.items()}
            for label, by in self.samples.items()
        }
        data = {**base, "table": table, "targets": results, "samples": samples}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        self.log(f"wrote {path}")
        if self.args.peer:
            before = {**base, "peer": self.args.peer, "samples": {"before": samples["before"]}}
            other = path.with_name(path.stem + "-before" + path.suffix)
            other.write_text(json.dumps(before, indent=1) + "\n")
            self.log(f"wrote {other}")

    def stop(self) -> None:
        for fleet in self.fleets:
            fleet.stop()
        shutil.rmtree(self.root, ignore_errors=True)


SUMMARY_COLUMNS = [
    "per job, CPU summed over the nodes",
    "one node, -P 1",
    "3 nodes REPLICATE 3, -P 1",
    "ratio",
    "the two replicas, -P 1 vs -P 16",
    "ASYNC / sync, -P 1",
]
DETAIL_COLUMNS = ["scenario", "server", "us/job, all nodes", "origin", "replicas", "jobs/s"]


def markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser(__doc__, 1800)
    p.add_argument("--disque-c", metavar="PATH", help="C Disque's disque-server, run beside")
    p.add_argument("--peer", metavar="DIR", help="another checkout's disque-trio, run beside")
    p.add_argument("--profile", metavar="DIR", help="py-spy the origin and a replica at -P 1")
    p.add_argument("--jobs", type=int, help="ADDJOBs per run (default 20,000; 3,000 --quick)")
    args = settle_repeat(p, p.parse_args(argv))
    shown = sys.argv[1:] if argv is None else argv
    args.argv_shown = [
        "PATH" if prev == "--disque-c" else a for prev, a in zip(["", *shown], shown, strict=False)
    ]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arm_signals(args.timeout)
    bench = Bench(args)

    def run() -> None:
        bench.run()
        bench.report()

    return guarded("bench_repl_cost", run, bench.stop)


if __name__ == "__main__":
    sys.exit(main())
