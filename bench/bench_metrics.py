#!/usr/bin/env python3
"""What a /metrics scrape costs a node with many queues.

Starts one disque-trio node on free loopback ports, fills it with
``--queues`` queues (one job each, and a few longer ones), then scrapes
``/metrics`` ``--scrapes`` times in a row while another thread sends PING on
the client port every 5 ms. Prints, for each scrape, its wall time and size,
and the PING round trips seen while it ran (median, p99, max), next to those
of a quiet period before the first scrape.

    python bench/bench_metrics.py                        # 50,000 queues, 5 scrapes
    python bench/bench_metrics.py --queues 10000 --scrapes 3
    python bench/bench_metrics.py --node-arg=--metrics-max-queues --node-arg=0

A benchmark that prints figures, not a test: exit 0 whatever they are, 1
only when it could not run. The node runs in its own process group with a
scratch --dir and is killed on exit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HOST = "127.0.0.1"


def free_port() -> int:
    """A client port whose web (+1000) and bus (+10000) ports look free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            for extra in (1000, 10000):
                with socket.socket() as t:
                    t.bind((HOST, port + extra))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def send_all_replies(sock: socket.socket, payload: bytes, replies: int) -> None:
    """Send pipelined commands and read ``replies`` single-line replies."""
    sock.sendall(payload)
    got = 0
    buf = b""
    while got < replies:
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("node closed the connection")
        buf += data
        got += buf.count(b"\r\n")
        buf = buf[buf.rfind(b"\r\n") + 2 :]


def fill(port: int, queues: int) -> None:
    with socket.create_connection((HOST, port), timeout=60) as s:
        batch = 5000
        for start in range(0, queues, batch):
            end = min(queues, start + batch)
            cmds = b"".join(f"ADDJOB bench-{i:06d} x 0\r\n".encode() for i in range(start, end))
            send_all_replies(s, cmds, end - start)
        # A few longer queues, so that "the longest first" has something to pick.
        cmds = b"".join(
            f"ADDJOB bench-{i:06d} x 0\r\n".encode()
            for i in range(min(queues, 50))
            for _ in range(i)
        )
        send_all_replies(s, cmds, sum(range(min(queues, 50))))


class Pinger(threading.Thread):
    """PING every 5 ms on one connection, recording (start time, round trip)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.sock.sendall(b"PING\r\n")
            if self.sock.recv(64) != b"+PONG\r\n":
                raise RuntimeError("bad PING reply")
            self.samples.append((started, time.monotonic() - started))
            time.sleep(0.005)

    def between(self, t0: float, t1: float) -> list[float]:
        return [rtt for start, rtt in self.samples if t0 <= start + rtt and start <= t1]


def summary(rtts: list[float]) -> str:
    if not rtts:
        return "no samples"
    rtts = sorted(rtts)
    p99 = rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))]
    return (
        f"{len(rtts)} PINGs, median {statistics.median(rtts) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {rtts[-1] * 1000:.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=50_000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument(
        "--node-arg", action="append", default=[], help="extra argument for the node"
    )
    args = parser.parse_args()
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="bench-metrics-")
    node = subprocess.Popen(
        [
            *(sys.executable, "-m", "disque_trio", "--port", str(port)),
            *("--bind", HOST, "--dir", scratch, *args.node_arg),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or node.poll() is not None:
                    print("the node did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
        began = time.monotonic()
        fill(port, args.queues)
        print(
            f"{args.queues} queues filled in {time.monotonic() - began:.1f} s; "
            f"node RSS {rss_mb(node.pid):.0f} MB; load average {os.getloadavg()[0]:.2f}"
        )
        pinger = Pinger(port)
        pinger.start()
        time.sleep(1.0)
        quiet_end = time.monotonic()
        print(f"quiet:    {summary(pinger.between(quiet_end - 1.0, quiet_end))}")
        url = f"http://{HOST}:{port + 1000}/metrics"
        for i in range(args.scrapes):
            t0 = time.monotonic()
            with urllib.request.urlopen(url, timeout=60) as response:
                body = response.read()
            t1 = time.monotonic()
            time.sleep(0.05)  # let the PINGs queued behind the scrape come back
            lines = body.count(b"\n")
            print(
                f"scrape {i + 1}: {t1 - t0:.3f} s, {len(body) / 1e6:.2f} MB, {lines} lines; "
                f"during it: {summary(pinger.between(t0, t1))}"
            )
            time.sleep(0.2)
        pinger.stop.set()
        pinger.join(timeout=10)
        print(f"node RSS after: {rss_mb(node.pid):.0f} MB")
        return 0
    finally:
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.wait(timeout=15)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
