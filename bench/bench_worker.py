"""Jobs per second through the worker (no-op handler) versus raw pipelined
ADDJOB / GETJOB / ACKJOB, against one disque-trio node on loopback.

Prints figures; not a test (exit 0 unless it could not run). Starts its own
node on a free port in a scratch directory and kills it on the way out.

    python bench/bench_worker.py                 # 20,000 jobs, concurrency 50
    python bench/bench_worker.py --jobs 5000 --quick
    python bench/bench_worker.py --backend asyncio --concurrency 200

Raw: one connection, the client's sans-I/O ClientProtocol over a blocking
socket; ADDJOB pipelined in batches of 1,000; then GETJOB NOHANG COUNT
1,000 followed by one ACKJOB of that batch, pipelined. Worker: the same
number of jobs pre-filled (raw, pipelined), then a Worker with an async
no-op handler runs until every job was handled and acknowledged (one
GETJOB per free slot batch, one ACKJOB per job, as the worker does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from disque_trio.client import NEED_DATA, ClientProtocol, Job, commands  # noqa: E402
from disque_trio.client.commands import Command  # noqa: E402
from disque_trio.worker import Worker  # noqa: E402


def free_port() -> int:
    """A free port whose bus port (+10000) is free too."""
    for port in range(21000 + os.getpid() % 9000, 40000, 7):
        ok = True
        for p in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port")


class Node:
    def __init__(self) -> None:
        self.port = free_port()
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

    def add(self, queue: str, count: int, batch: int = 1000) -> None:
        for start in range(0, count, batch):
            n = min(batch, count - start)
            self.run([commands.addjob(queue, b"0123456789", 0) for _ in range(n)])

    def close(self) -> None:
        self.sock.close()


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


def through_worker(port: int, jobs: int, concurrency: int, backend: str) -> float:
    raw = Raw(port)
    try:
        raw.add("workq", jobs)
    finally:
        raw.close()
    worker = Worker(f"disque://127.0.0.1:{port}", fetch_timeout=0.2)
    handled = 0
    all_done: anyio.Event | None = None

    @worker.handler("workq", concurrency=concurrency)
    async def noop(job: Job) -> None:
        nonlocal handled
        handled += 1
        if handled == jobs and all_done is not None:
            all_done.set()

    elapsed = 0.0

    async def main() -> None:
        nonlocal elapsed, all_done
        all_done = anyio.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(
                lambda task_status: worker.run(handle_signals=False, task_status=task_status)
            )
            t0 = anyio.current_time()
            await all_done.wait()
            worker.stop()  # returns once the last acks are in
        elapsed = anyio.current_time() - t0

    anyio.run(main, backend=backend)
    return jobs / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--backend", choices=["trio", "asyncio", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs")
    args = parser.parse_args()
    jobs = 2000 if args.quick else args.jobs
    backends = ["trio", "asyncio"] if args.backend == "both" else [args.backend]
    node = Node()
    try:
        add_rate, consume_rate = raw_round_trip(node.port, jobs)
        print(f"{jobs} jobs, 10-byte bodies, one node on 127.0.0.1 ({os.cpu_count()} CPUs)")
        print(f"  raw pipelined ADDJOB (batches of 1000)                 {add_rate:10,.0f} jobs/s")
        print(
            f"  raw pipelined GETJOB COUNT 1000 + ACKJOB of the batch  {consume_rate:10,.0f} jobs/s"
        )
        for backend in backends:
            rate = through_worker(node.port, jobs, args.concurrency, backend)
            print(
                f"  worker, no-op async handler, concurrency {args.concurrency:<4} ({backend:7})"
                f"   {rate:10,.0f} jobs/s  ({rate / consume_rate:.0%} of raw consume)"
            )
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
