#!/usr/bin/env python3
"""AOF benchmark: ADDJOB throughput with the append-only file off, everysec, always.

Starts three disque-trio nodes on free loopback ports, each in its own scratch
directory (AOF off / appendfsync everysec / appendfsync always), drives each in
turn with the same redis-benchmark load in the same run, and prints ops/s with
the ratios everysec/off and always/off and the target (everysec >= 0.7x off).

    python bench/bench_aof.py              # full run (~2-3 min on 2 cores)
    python bench/bench_aof.py --quick      # smoke run (< 60 s)
    python bench/bench_aof.py --repeat 5 --dir /var/tmp --json out.json

This is a benchmark that prints figures, not a test: it exits 0 even when the
target is missed (exit 1 only if the benchmark itself could not run). Helpers
(servers, clean-up, redis-benchmark runner, medians) come from bench_single.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_single import (
    CLIENTS,
    HOST,
    BenchError,
    Server,
    Servers,
    arm_signals,
    bench_parser,
    bench_timeout,
    command,
    free_port,
    guarded,
    median,
    paired_ratio,
    redis_benchmark,
    settle_repeat,  # the bench directory is not a package: via sys.path
)

POLICIES = ("off", "everysec", "always")
TARGET = 0.7  # everysec must keep at least this fraction of the AOF-off rate
ADDJOB = ["ADDJOB", "bq", "0123456789", "0"]

SIZES: dict[str, dict[int, int]] = {
    # requests per redis-benchmark run, by pipeline depth
    "full": {1: 50_000, 16: 150_000},
    "quick": {1: 5_000, 16: 15_000},
}


class AofServers(Servers):
    """bench_single's server set, with the scratch directory where asked and
    one sub-directory (so one AOF) per node."""

    def __init__(self, base: str | None) -> None:
        super().__init__()
        os.rmdir(self.workdir)  # made by Servers in the default temp dir
        self.workdir = tempfile.mkdtemp(prefix="bench-aof-", dir=base)

    def node(self, policy: str) -> Server:
        port, bus = free_port(), free_port()
        nodedir = os.path.join(self.workdir, f"node-{policy}")
        os.mkdir(nodedir)
        argv = [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", HOST]
        argv += ["--enable-debug-command", "local"]  # DEBUG FLUSHALL between runs
        argv += ["--cluster-port", str(bus), "--dir", nodedir, "--loglevel", "notice"]
        if policy != "off":
            argv += ["--appendonly", "yes", "--appendfsync", policy]
        return self._start("disque-trio", argv, port)


def filesystem_of(path: str) -> str:
    """The type of the filesystem holding path (from /proc/mounts)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mount = parts[1] if len(parts) >= 3 else ""
                inside = (real + "/").startswith(mount.rstrip("/") + "/")
                if mount and inside and len(mount) > len(best):
                    best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


@dataclass
class Row:
    depth: int
    requests: int
    rates: dict[str, list[float]] = field(default_factory=dict)

    def median(self, policy: str) -> float:
        return median(self.rates[policy])

    def ratio(self, policy: str) -> float:
        return paired_ratio(self.rates[policy], self.rates["off"])


class Bench:
    def __init__(self, args: argparse.Namespace, servers: AofServers) -> None:
        self.args = args
        self.servers = servers
        self.size = {
            d: max(1000, int(n * args.scale))
            for d, n in SIZES["quick" if args.quick else "full"].items()
        }
        self.nodes: dict[str, Server] = {}
        self.rows: list[Row] = []
        self.aof_sizes: dict[str, int] = {}

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def start(self) -> None:
        for policy in POLICIES:
            self.nodes[policy] = self.servers.node(policy)
            self.log(f"node {policy}: port {self.nodes[policy].port}")

    def reset(self, policy: str) -> None:
        """Forget every job; on an AOF node also compact the file, so that
        no automatic rewrite of earlier runs' records lands in a measurement."""
        node = self.nodes[policy]
        command(node.port, b"DEBUG FLUSHALL")
        if policy == "off":
            return
        info = command(node.port, "INFO", "persistence")
        self.aof_sizes[policy] = max(
            self.aof_sizes.get(policy, 0), _info_int(info, "aof_current_size")
        )
        command(node.port, "BGREWRITEAOF")
        deadline = time.monotonic() + 60
        while True:
            # Done when the file is just the (empty) snapshot: the reply to
            # BGREWRITEAOF may come before the rewrite task even started.
            info = command(node.port, "INFO", "persistence")
            if _info_int(info, "aof_rewrite_in_progress") == 0 and _info_int(
                info, "aof_current_size"
            ) == _info_int(info, "aof_base_size"):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{policy}: BGREWRITEAOF did not finish in 60 s")
            time.sleep(0.05)

    def check(self, policy: str) -> None:
        node = self.nodes[policy]
        node.check_alive()
        if policy == "off":
            return
        info = command(node.port, "INFO", "persistence")
        if b"aof_state:on" not in info or b"aof_last_write_status:ok" not in info:
            raise BenchError(f"{policy}: the AOF is not being written:\n{info.decode()}")
        if _info_int(info, "aof_current_size") == 0:
            raise BenchError(f"{policy}: the AOF stayed empty after a run")

    def run(self) -> None:
        self.start()
        for depth in (1, 16):
            n = self.size[depth]
            row = Row(depth, n, {p: [] for p in POLICIES})
            self.log(f"--- ADDJOB -P {depth}, {n:,} requests, {CLIENTS} clients")
            for i in range(self.args.repeat):
                # The three nodes back to back in each repetition (paired ratios).
                for policy in POLICIES:
                    self.reset(policy)
                    rate = redis_benchmark(
                        self.nodes[policy].port, n, depth, ADDJOB, bench_timeout(n)
                    )
                    self.check(policy)
                    row.rates[policy].append(rate)
                self.log(
                    f"#{i + 1}: "
                    + "  ".join(f"{p} {row.rates[p][-1]:,.0f}" for p in POLICIES)
                    + " ops/s"
                )
            self.rows.append(row)
        for policy in POLICIES[1:]:
            node = self.nodes[policy]
            info = command(node.port, "INFO", "persistence")
            size = max(self.aof_sizes.get(policy, 0), _info_int(info, "aof_current_size"))
            self.aof_sizes[policy] = size


def _info_int(info: Any, key: str) -> int:
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value)
    return 0


def print_table(rows: list[Row]) -> None:
    head = ("test", "off", "everysec", "always", "everysec/off", "always/off", "target", "result")
    lines = []
    for r in rows:
        ev = r.ratio("everysec")
        lines.append(
            (
                f"ADDJOB -P {r.depth}",
                *(f"{r.median(p):,.0f}" for p in POLICIES),
                f"{ev:.3f}",
                f"{r.ratio('always'):.3f}",
                f"everysec >= {TARGET}",
                "PASS" if ev >= TARGET else "MISS",
            )
        )
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        cells = [line[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
        print("  ".join(cells))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=900)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request count")
    p.add_argument(
        "--dir",
        default=None,
        help="where to make the scratch directory (default: the temp dir); "
        "the fsync cost depends on its filesystem",
    )
    return settle_repeat(p, p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("redis-benchmark") is None:
        print(
            "bench_aof: redis-benchmark not found (apt-get install redis-tools)", file=sys.stderr
        )
        return 1
    load_start = os.getloadavg()[0]
    arm_signals(args.timeout)
    servers = AofServers(args.dir)
    fs = filesystem_of(servers.workdir)
    bench = Bench(args, servers)
    print(
        f"bench_aof: {'quick' if args.quick else 'full'} run, repeat {args.repeat}, "
        f"{CLIENTS} clients, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"scratch {servers.workdir} ({fs}), sizes -P 1: {bench.size[1]:,}, -P 16: {bench.size[16]:,}",
        flush=True,
    )
    if fs in ("tmpfs", "ramfs"):
        print("warning: the scratch directory is in memory: fsync costs nothing there")
    if load_start > 0.5:
        print(f"warning: load average is {load_start:.2f} before the start: figures will be noisy")
    t0 = time.perf_counter()
    status = guarded("bench_aof", bench.run, servers.stop_all)
    if bench.rows:
        print(
            f"\n== ADDJOB ops/s by AOF policy, median of {args.repeat} "
            f"({time.perf_counter() - t0:.0f} s) =="
        )
        print_table(bench.rows)
        sizes = ", ".join(f"{p} {s / 2**20:.1f} MiB" for p, s in bench.aof_sizes.items())
        print(f"\nlargest AOF between rewrites: {sizes}")
        print(f"ratios: median of per-repetition ratios (runs back to back); scratch on {fs}")
        if servers.log_notes:
            print("\nnode log lines worth a look:")
            print("\n".join(f"  {line}" for line in servers.log_notes[:50]))
        print(f"load average (1 min): {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if args.json:
        doc = {
            "mode": "quick" if args.quick else "full",
            "repeat": args.repeat,
            "clients": CLIENTS,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "filesystem": fs,
            "sizes": bench.size,
            "complete": status == 0,
            "rows": [
                {**asdict(r), "everysec_off": r.ratio("everysec"), "always_off": r.ratio("always")}
                for r in bench.rows
            ],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
