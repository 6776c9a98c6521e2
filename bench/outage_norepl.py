#!/usr/bin/env python3
"""How long a node may be down before the others refuse REPLICATE N at once.

Seven nodes with ``cluster-node-timeout 3000`` (what the original's Tcl
cluster suite sets), on free loopback ports. For each outage length: kill
node 1 with SIGKILL, wait, restart it on the same port and directory, kill
it again as soon as it answers PING, then send ``ADDJOB ... REPLICATE 7
TIMEOUT 8000`` to node 0. Node 0 answers ``-NOREPL Not enough reachable
nodes`` at once if it still flags node 1 as failing (PFAIL after the node
timeout without a reply), else it waits for the copy and answers after its
8 s timeout. The Tcl test "Sync REPLJOB messages are retried against old
nodes" does exactly this after the previous test's outage; it expects the
waiting answer.

    python bench/outage_norepl.py                                 # disque-trio
    python bench/outage_norepl.py --disque-c /path/to/disque-server  # both

Prints one line per server and outage; a diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_single import HOST, command
from bench_vs_c import free_pair

NODES = 7


def start(
    exe: list[str], port: int, bus: int, workdir: str, trio: bool
) -> subprocess.Popen[bytes]:
    argv = [*exe, "--port", str(port), "--bind", HOST, "--cluster-node-timeout", "3000"]
    if trio:  # the original's bus port is always port + 10000
        argv += ["--cluster-port", str(bus), "--dir", workdir]
    return subprocess.Popen(
        argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_pong(port: int, limit: float = 30.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        try:
            if command(port, "PING", timeout=1) == b"PONG":
                return time.perf_counter() - t0
        except OSError:
            time.sleep(0.005)
    raise RuntimeError(f"port {port} did not answer PING in {limit:.0f} s")


def reachable(port: int) -> int:
    info = command(port, "CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    found = re.search(r"cluster_reachable_nodes:(\d+)", text)
    return int(found.group(1)) if found else -1


def trial(exe: list[str], trio: bool, outage: float) -> str:
    root = tempfile.mkdtemp(prefix="outage-")
    ports = [free_pair() for _ in range(NODES)]  # (client port, its + 10000)
    dirs = [tempfile.mkdtemp(dir=root) for _ in range(NODES)]
    procs = [start(exe, p, b, d, trio) for (p, b), d in zip(ports, dirs, strict=True)]
    try:
        for port, _ in ports:
            wait_pong(port)
        first = ports[0][0]
        for port, _ in ports[1:]:
            command(first, "CLUSTER", "MEET", HOST, port)
        deadline = time.monotonic() + 30
        while any(reachable(p) != NODES - 1 for p, _ in ports):
            if time.monotonic() > deadline:
                return "cluster did not form in 30 s"
            time.sleep(0.1)
        time.sleep(1)
        procs[1].kill()
        procs[1].wait()
        time.sleep(outage)
        procs[1] = start(exe, *ports[1], dirs[1], trio)
        up = wait_pong(ports[1][0])
        procs[1].kill()
        procs[1].wait()
        t0 = time.perf_counter()
        try:
            reply: object = command(first, "ADDJOB", "q", "job", 8000, "REPLICATE", NODES)
        except Exception as e:  # an error reply
            reply = e
        took = time.perf_counter() - t0
        text = str(reply)[:40]
        return f"restart answered PING in {up:.2f} s; ADDJOB answered in {took:.2f} s: {text}"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--disque-c", help="a disque-server built from the original's source")
    parser.add_argument(
        "--outages", default="1,2,2.5,3,3.5", help="seconds node 1 stays down, comma-separated"
    )
    args = parser.parse_args()
    servers = [("disque-trio", [sys.executable, "-m", "disque_trio"], True)]
    if args.disque_c:
        servers.append(("C Disque", [args.disque_c], False))
    for outage in (float(x) for x in args.outages.split(",")):
        for name, exe, trio in servers:
            print(f"{name:11} outage {outage:.1f} s: {trial(exe, trio, outage)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
