#!/usr/bin/env python3
"""Single-node benchmark: disque-trio side by side with redis-server.

Starts a disque-trio node and a redis-server on free loopback ports, drives
both with the same load in the same run, and prints a table of ops/s with the
disque-trio / Redis ratio and the project's targets (see bench/README.md).

    python bench/bench_single.py            # full run (~5-10 min on 2 cores)
    python bench/bench_single.py --quick    # smoke run (< 60 s)
    python bench/bench_single.py --only addjob_p1 --repeat 5 --json out.json

This is a benchmark that prints figures, not a test: it exits 0 even when a
target is missed (exit 1 only if the benchmark itself could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import platform
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import cycle, islice
from typing import Any

import hiredis

HOST = "127.0.0.1"
BODY = b"0123456789"  # the fixed 10-byte job body / list element
CLIENTS = 50
PREFILL_BATCH = 10_000  # commands per pipelined batch when pre-filling

# Sizes of each run. "p1"/"p16": requests of one redis-benchmark run at -P 1
# and -P 16; disque-trio is ~10-50x slower than Redis, so it gets smaller
# counts (ops/s is a rate: the counts only set how long a run lasts).
SIZES: dict[str, dict[str, int]] = {
    "full": {
        "redis_p1": 200_000,
        "redis_p16": 1_000_000,
        "disque_p1": 50_000,
        "disque_p16": 150_000,
        "ack_redis": 200_000,
        "ack_disque": 50_000,
        "mixed_seconds": 5,
        "rss_jobs": 1_000_000,
        "small_queue": 1_000,
    },
    "quick": {
        "redis_p1": 20_000,
        "redis_p16": 100_000,
        "disque_p1": 5_000,
        "disque_p16": 15_000,
        "ack_redis": 20_000,
        "ack_disque": 5_000,
        "mixed_seconds": 1,
        "rss_jobs": 100_000,
        "small_queue": 1_000,
    },
}

# The benchmark names accepted by --only, in run order.
BENCHES = (
    "addjob_p1",
    "addjob_p16",
    "getjob_p1",
    "getjob_p16",
    "ackjob",
    "mixed",  # ADDJOB+GETJOB with 1k then 1M queued; includes the RSS figure
)
ALIASES = {"rss": "mixed", "memory": "mixed", "addjob": "addjob_", "getjob": "getjob_"}


class BenchError(RuntimeError):
    """The benchmark could not run (a server died, a tool failed, a timeout)."""


# --------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def read_proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024  # the kernel reports kB
    return out


class Server:
    """One server child process on a loopback port."""

    def __init__(self, kind: str, argv: list[str], port: int, workdir: str) -> None:
        self.kind = kind
        self.port = port
        self.log_path = os.path.join(workdir, f"{kind}-{port}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            # Own process group: a Ctrl-C reaches only this script, which then
            # stops the servers itself (in the finally of main()).
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.kind} exited at start-up:\n{self.log_tail()}")
            try:
                if command(self.port, b"PING", timeout=2.0) in (b"PONG", "PONG"):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise BenchError(f"{self.kind} not answering PING after {timeout:.0f} s")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(
                f"{self.kind} (pid {self.pid}) died with status {self.proc.returncode}:\n"
                + self.log_tail()
            )

    def memory(self) -> dict[str, int]:
        self.check_alive()
        return read_proc_status(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def notable_log_lines(self) -> list[str]:
        """Lines of the server's log that deserve a look (errors, tracebacks)."""
        self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        # " # " is the warning mark of both servers' log lines.
        keys = ("Traceback", "Exception", "WARNING", "CRITICAL", " # ")
        return [line for line in text.splitlines() if any(k in line for k in keys)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


class Servers:
    """Every child server of this run, stopped together in the end."""

    def __init__(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="bench-single-")
        self.started: list[Server] = []
        # What the nodes' logs said that deserves a look, printed at the end.
        self.log_notes: list[str] = []

    def disque(self) -> Server:
        port, bus = free_port(), free_port()
        argv = [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", HOST]
        argv += ["--enable-debug-command", "local"]  # DEBUG FLUSHALL between runs
        argv += ["--cluster-port", str(bus), "--dir", self.workdir, "--loglevel", "notice"]
        return self._start("disque-trio", argv, port)

    def redis(self) -> Server:
        port = free_port()
        exe = shutil.which("redis-server") or "redis-server"
        argv = [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        argv += ["--daemonize", "no", "--dir", self.workdir, "--logfile", ""]
        return self._start("redis", argv, port)

    def _start(self, kind: str, argv: list[str], port: int) -> Server:
        server = Server(kind, argv, port, self.workdir)
        self.started.append(server)
        server.wait_ready()
        return server

    def stop(self, server: Server) -> None:
        if server in self.started:
            self.started.remove(server)
        if server.kind == "disque-trio" and server.proc.poll() is None:
            # Read before stopping: shutting down logs warnings of its own.
            tag = f"{server.kind} :{server.port}"
            self.log_notes += [f"{tag}: {line}" for line in server.notable_log_lines()]
        server.stop()
        if server.kind == "disque-trio" and server.proc.returncode not in (0, -signal.SIGTERM):
            self.log_notes.append(
                f"{server.kind} :{server.port} exited with status {server.proc.returncode}"
            )

    def stop_all(self) -> None:
        for server in list(reversed(self.started)):
            with contextlib.suppress(Exception):
                self.stop(server)
        self.started.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------- RESP client


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def command(port: int, *args: bytes | str | int, timeout: float = 30.0) -> Any:
    """One command on a fresh connection; returns the decoded reply."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(encode(*_split1(args)))
        reader = hiredis.Reader()
        while (reply := reader.gets()) is False:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("connection closed before the reply")
            reader.feed(data)
        return reply


def _split1(args: tuple[bytes | str | int, ...]) -> tuple[bytes | str | int, ...]:
    # command(port, b"PING") and command(port, b"DEBUG FLUSHALL") as a shorthand.
    if len(args) == 1 and isinstance(args[0], bytes):
        return tuple(args[0].split())
    return args


@dataclass
class DriveResult:
    ops: int = 0
    seconds: float = 0.0
    errors: int = 0
    nulls: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


class _Conn:
    __slots__ = ("out", "outstanding", "reader", "sock", "source", "writing")

    def __init__(self, port: int, source: Iterator[bytes]) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.reader = hiredis.Reader()
        self.source = source
        self.out = b""
        self.outstanding = 0
        self.writing = False


def drive(
    port: int,
    sources: list[Iterator[bytes]],
    depth: int = 1,
    duration: float | None = None,
    timeout: float = 300.0,
    on_reply: Callable[[Any], None] | None = None,
) -> DriveResult:
    """Run len(sources) connections at once, each sending its source's
    (pre-encoded) commands in batches of `depth` and waiting for a batch's
    replies before sending the next batch (like redis-benchmark -P depth).

    Stops when every source is exhausted, or when `duration` seconds have
    passed (then the replies in flight are awaited and counted). ops/s is
    replies received / wall seconds from the first send to the last reply.
    """
    result = DriveResult()
    sel = selectors.DefaultSelector()
    conns = [_Conn(port, src) for src in sources]
    stopping = False
    active = len(conns)

    def send_some(c: _Conn) -> None:
        try:
            n = c.sock.send(c.out)
        except BlockingIOError:
            n = 0
        c.out = c.out[n:]
        want = bool(c.out)
        if want != c.writing:
            c.writing = want
            sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), c)

    def refill(c: _Conn) -> bool:
        """Send the next batch; False when the connection has nothing more."""
        batch = [] if stopping else list(islice(c.source, depth))
        if not batch:
            return False
        c.outstanding = len(batch)
        c.out = b"".join(batch)
        send_some(c)
        return True

    try:
        for c in conns:
            sel.register(c.sock, selectors.EVENT_READ, c)
        start = time.perf_counter()
        end_by = start + duration if duration is not None else None
        hard_deadline = start + timeout
        for c in conns:
            if not refill(c):
                active -= 1
        while active:
            now = time.perf_counter()
            if now > hard_deadline:
                raise BenchError(f"driver timed out after {timeout:.0f} s ({result.ops} replies)")
            if end_by is not None and now >= end_by:
                stopping = True
            for key, events in sel.select(timeout=0.5):
                c = key.data
                if events & selectors.EVENT_WRITE and c.out:
                    send_some(c)
                if not events & selectors.EVENT_READ:
                    continue
                try:
                    data = c.sock.recv(1 << 18)
                except BlockingIOError:
                    continue
                if not data:
                    raise BenchError("server closed a benchmark connection")
                c.reader.feed(data)
                while (reply := c.reader.gets()) is not False:
                    result.ops += 1
                    c.outstanding -= 1
                    if reply is None:
                        result.nulls += 1
                    elif isinstance(reply, hiredis.ReplyError):
                        result.errors += 1
                        if not result.first_error:
                            result.first_error = str(reply)
                    if on_reply is not None:
                        on_reply(reply)
                if c.outstanding == 0:
                    if end_by is not None and time.perf_counter() >= end_by:
                        stopping = True
                    if not refill(c):
                        active -= 1
        result.seconds = time.perf_counter() - start
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                sel.unregister(c.sock)
            c.sock.close()
        sel.close()
    return result


def pipeline(
    port: int, commands: Iterable[bytes], on_reply: Callable[[Any], None] | None = None
) -> DriveResult:
    """Send commands on one connection in pipelined batches of PREFILL_BATCH."""
    return drive(port, [iter(commands)], depth=PREFILL_BATCH, timeout=600, on_reply=on_reply)


def split(items: list[bytes], parts: int) -> list[Iterator[bytes]]:
    return [iter(items[i::parts]) for i in range(parts)]


# ------------------------------------------------------------ redis-benchmark


def redis_benchmark(
    port: int, n: int, pipeline_depth: int, args: list[str], timeout: float, clients: int = CLIENTS
) -> float:
    """One redis-benchmark run; returns requests per second (from --csv)."""
    exe = shutil.which("redis-benchmark") or "redis-benchmark"
    argv = [exe, "-h", HOST, "-p", str(port), "-c", str(clients), "-n", str(n)]
    argv += ["-P", str(pipeline_depth), "--csv", *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"redis-benchmark timed out after {timeout:.0f} s: {' '.join(argv)}"
        ) from None
    rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if r and r[0] != "test"]
    if proc.returncode != 0 or not rows:
        raise BenchError(
            f"redis-benchmark failed (status {proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return float(rows[-1][1])


def bench_timeout(n: int, slowest_rate: float = 500.0) -> float:
    """A bound for one run: n requests at a (pessimistic) slowest rate."""
    return max(60.0, n / slowest_rate)


# ------------------------------------------------------------------- results


@dataclass
class Row:
    test: str
    unit: str  # "ops/s", "B/job", "x"
    disque: float
    redis: float | None
    ratio: float | None  # the figure the target is checked on
    target: str = ""
    passed: bool | None = None
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)


def count_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(xs: list[float], ys: list[float]) -> float:
    """Median of the per-repetition ratios x_i / y_i. The two runs of one
    repetition are back to back, so this cancels most of a change of machine
    load between repetitions (better than median(xs) / median(ys))."""
    return median([x / y for x, y in zip(xs, ys, strict=True) if y > 0])


def check(value: float, op: str, bound: float) -> bool:
    return value >= bound if op == ">=" else value <= bound


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"x{value:.3f}"
    if unit == "B/job":
        return f"{value:,.0f} B"
    return f"{value:,.0f}"


def print_table(rows: list[Row]) -> None:
    head = ("test", "disque-trio", "redis", "ratio", "target", "result")
    lines = []
    for r in rows:
        result = "-" if r.passed is None else ("PASS" if r.passed else "MISS")
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(
            (r.test, fmt(r.disque, r.unit), fmt(r.redis, r.unit), ratio, r.target or "-", result)
        )
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    sep = "  "
    print(sep.join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print(sep.join("-" * w for w in widths))
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
        ]
        print(sep.join(cells))
    notes = [f"  {r.test}: {r.note}" for r in rows if r.note]
    if notes:
        print("\nnotes:")
        print("\n".join(notes))


# --------------------------------------------------------------- benchmarks


class Bench:
    def __init__(self, args: argparse.Namespace, servers: Servers) -> None:
        self.args = args
        self.servers = servers
        self.size = dict(SIZES["quick" if args.quick else "full"])
        for k in ("redis_p1", "redis_p16", "disque_p1", "disque_p16", "ack_redis", "ack_disque"):
            self.size[k] = max(1000, int(self.size[k] * args.scale))
        self.size["mixed_seconds"] = max(1, round(self.size["mixed_seconds"] * args.scale))
        self.repeat = args.repeat
        self.rows: list[Row] = []
        self._disque: Server | None = None
        self._redis: Server | None = None

    # Long-lived servers for the redis-benchmark runs (flushed between runs).
    @property
    def disque(self) -> Server:
        if self._disque is None:
            self._disque = self.servers.disque()
        return self._disque

    @property
    def redis(self) -> Server:
        if self._redis is None:
            self._redis = self.servers.redis()
        return self._redis

    def flush(self) -> None:
        command(self.disque.port, b"DEBUG FLUSHALL")
        command(self.redis.port, b"FLUSHALL")

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        red = "-" if row.redis is None else fmt(row.redis, row.unit)
        self.log(f"  => {row.test}: disque-trio {fmt(row.disque, row.unit)}, redis {red}")

    # ---- ADDJOB vs LPUSH (redis-benchmark)

    def addjob(self, depth: int) -> None:
        n_d, n_r = self.size[f"disque_p{depth}"], self.size[f"redis_p{depth}"]
        target = {1: 0.27, 16: 0.085}[depth]
        ds, rs = [], []
        for i in range(self.repeat):
            self.flush()
            ds.append(
                redis_benchmark(
                    self.disque.port,
                    n_d,
                    depth,
                    ["ADDJOB", "bq", BODY.decode(), "0"],
                    bench_timeout(n_d),
                )
            )
            rs.append(
                redis_benchmark(
                    self.redis.port, n_r, depth, ["LPUSH", "bq", BODY.decode()], bench_timeout(n_r)
                )
            )
            self.disque.check_alive()
            self.log(
                f"ADDJOB -P {depth} #{i + 1}: disque-trio {ds[-1]:,.0f}  redis LPUSH {rs[-1]:,.0f}"
            )
        d, r, ratio = median(ds), median(rs), paired_ratio(ds, rs)
        self.add(
            Row(
                f"ADDJOB vs LPUSH -P {depth}",
                "ops/s",
                d,
                r,
                ratio,
                f"ratio >= {target}",
                check(ratio, ">=", target),
                samples={"disque": ds, "redis": rs},
            )
        )

    # ---- GETJOB NOHANG vs RPOP (redis-benchmark, on a pre-filled queue)

    def getjob(self, depth: int) -> None:
        n_d, n_r = self.size[f"disque_p{depth}"], self.size[f"redis_p{depth}"]
        margin = 1000
        ds, rs = [], []
        for i in range(self.repeat):
            self.flush()
            fill = pipeline(
                self.disque.port,
                (encode(b"ADDJOB", b"gq", BODY, b"0") for _ in range(n_d + margin)),
            )
            self._check_fill("disque-trio GETJOB prefill", fill)
            fill = pipeline(
                self.redis.port, (encode(b"LPUSH", b"gq", BODY) for _ in range(n_r + margin))
            )
            self._check_fill("redis RPOP prefill", fill)
            ds.append(
                redis_benchmark(
                    self.disque.port,
                    n_d,
                    depth,
                    ["GETJOB", "NOHANG", "FROM", "gq"],
                    bench_timeout(n_d),
                )
            )
            rs.append(
                redis_benchmark(self.redis.port, n_r, depth, ["RPOP", "gq"], bench_timeout(n_r))
            )
            left_d = command(self.disque.port, b"QLEN gq")
            left_r = command(self.redis.port, b"LLEN gq")
            if left_d < margin // 2 or left_r < margin // 2:
                self.log(
                    f"  warning: queue nearly drained during the run (disque {left_d}, redis {left_r})"
                )
            self.log(
                f"GETJOB -P {depth} #{i + 1}: disque-trio {ds[-1]:,.0f}  redis RPOP {rs[-1]:,.0f}"
            )
        d, r, ratio = median(ds), median(rs), paired_ratio(ds, rs)
        self.add(
            Row(
                f"GETJOB NOHANG vs RPOP -P {depth}",
                "ops/s",
                d,
                r,
                ratio,
                samples={"disque": ds, "redis": rs},
            )
        )

    def _check_fill(self, what: str, res: DriveResult) -> None:
        if res.errors:
            raise BenchError(f"{what}: {res.errors} errors, first: {res.first_error}")

    # ---- ACKJOB vs HDEL (custom driver: every request names a different ID)

    def ackjob(self) -> None:
        n_d, n_r = self.size["ack_disque"], self.size["ack_redis"]
        ds, rs = [], []
        for i in range(self.repeat):
            self.flush()
            ids: list[bytes] = []
            fill = pipeline(
                self.disque.port,
                (encode(b"ADDJOB", b"aq", BODY, b"0") for _ in range(n_d)),
                on_reply=ids.append,
            )
            self._check_fill("ACKJOB prefill", fill)
            # Deliver them first (GETJOB), so ACKJOB acts on active jobs as in real use.
            got = pipeline(
                self.disque.port,
                (
                    encode(b"GETJOB", b"NOHANG", b"COUNT", b"1000", b"FROM", b"aq")
                    for _ in range(-(-n_d // 1000))
                ),
            )
            self._check_fill("ACKJOB delivery", got)
            acked = [0]

            def count_known(reply: Any, acked: list[int] = acked) -> None:
                if isinstance(reply, int):
                    acked[0] += reply

            res = drive(
                self.disque.port,
                split([encode(b"ACKJOB", j) for j in ids], CLIENTS),
                timeout=bench_timeout(n_d),
                on_reply=count_known,
            )
            if res.errors or acked[0] != n_d:
                raise BenchError(
                    f"ACKJOB: {res.errors} errors ({res.first_error}), {acked[0]}/{n_d} acked"
                )
            ds.append(res.rate)
            # Redis analogue: delete one field of a hash by key (HDEL), same driver.
            keys = [b"D-%038d" % k for k in range(n_r)]
            fill = pipeline(self.redis.port, (encode(b"HSET", b"ah", k, BODY) for k in keys))
            self._check_fill("HDEL prefill", fill)
            res = drive(
                self.redis.port,
                split([encode(b"HDEL", b"ah", k) for k in keys], CLIENTS),
                timeout=bench_timeout(n_r),
            )
            if res.errors:
                raise BenchError(f"HDEL: {res.errors} errors ({res.first_error})")
            rs.append(res.rate)
            self.disque.check_alive()
            self.log(f"ACKJOB #{i + 1}: disque-trio {ds[-1]:,.0f}  redis HDEL {rs[-1]:,.0f}")
        d, r, ratio = median(ds), median(rs), paired_ratio(ds, rs)
        self.add(
            Row(
                "ACKJOB vs HDEL -P 1 (driver)",
                "ops/s",
                d,
                r,
                ratio,
                note="50 connections of the Python driver, one request in flight each; "
                "the driver can cap the Redis figure",
                samples={"disque": ds, "redis": rs},
            )
        )

    # ---- ADDJOB+GETJOB with 1k vs 1M queued; RSS per job

    def mixed_once(self, server: Server, add: bytes, get: bytes) -> float:
        """One timed run: 50 connections alternating add / get, one in flight each."""
        res = drive(
            server.port,
            [cycle((add, get)) for _ in range(CLIENTS)],
            duration=self.size["mixed_seconds"],
            timeout=120,
        )
        if res.errors:
            raise BenchError(f"{server.kind} mixed run: {res.errors} errors ({res.first_error})")
        if res.nulls:
            self.log(f"  warning: {res.nulls} GETJOB/RPOP found the queue empty")
        server.check_alive()
        return res.rate

    def fill(self, srv: Server, add: bytes, queued: int) -> dict[str, float]:
        """Fill a fresh server's queue; return memory figures and the fill rate."""
        before = srv.memory()
        t0 = time.perf_counter()
        fill = pipeline(srv.port, (add for _ in range(queued)))
        fill_s = time.perf_counter() - t0
        self._check_fill(f"{srv.kind} fill of {queued}", fill)
        length = command(srv.port, b"QLEN mq" if srv.kind == "disque-trio" else b"LLEN mq")
        if length != queued:
            raise BenchError(f"{srv.kind}: {length} queued after adding {queued}")
        after = srv.memory()
        self.log(
            f"{srv.kind}: {queued:,} added in {fill_s:.1f} s ({queued / fill_s:,.0f}/s pipelined), "
            f"VmRSS {before['VmRSS'] / 2**20:.1f} -> {after['VmRSS'] / 2**20:.1f} MiB, "
            f"VmHWM {after['VmHWM'] / 2**20:.1f} MiB"
        )
        return {
            "rss_before": before["VmRSS"],
            "rss_after": after["VmRSS"],
            "hwm_after": after["VmHWM"],
            "bytes_per_job": (after["VmRSS"] - before["VmRSS"]) / queued,
            "fill_ops_per_s": queued / fill_s,
        }

    def mixed(self) -> None:
        # The redis-benchmark servers are no longer needed: free their memory
        # and CPU before the big fill.
        for attr in ("_disque", "_redis"):
            running = getattr(self, attr)
            if running is not None:
                self.servers.stop(running)
                setattr(self, attr, None)
        small, big = self.size["small_queue"], self.size["rss_jobs"]
        secs = self.size["mixed_seconds"]
        cmds = {
            "disque": (
                encode(b"ADDJOB", b"mq", BODY, b"0"),
                encode(b"GETJOB", b"NOHANG", b"FROM", b"mq"),
            ),
            "redis": (encode(b"LPUSH", b"mq", BODY), encode(b"RPOP", b"mq")),
        }
        # Four fresh servers, each filled once: (kind, size) -> server. The
        # "big" fill of a fresh process gives the RSS-per-job figure.
        srv: dict[tuple[str, str], Server] = {}
        mem: dict[str, dict[str, float]] = {}
        results: dict[str, dict[str, list[float]]] = {"small": {}, "big": {}}
        try:
            for kind in ("disque", "redis"):
                for label, queued in (("small", small), ("big", big)):
                    s = self.servers.disque() if kind == "disque" else self.servers.redis()
                    srv[kind, label] = s
                    figures = self.fill(s, cmds[kind][0], queued)
                    if label == "big":
                        mem[kind] = figures
                    results[label][kind] = []
            # Repetitions interleaved (small, big, small, big...) so that a
            # change of machine load hits both sizes alike.
            for i in range(self.repeat):
                for kind in ("disque", "redis"):
                    for label in ("small", "big"):
                        rate = self.mixed_once(srv[kind, label], *cmds[kind])
                        results[label][kind].append(rate)
                self.log(
                    f"mixed #{i + 1}: disque-trio {results['small']['disque'][-1]:,.0f} / "
                    f"{results['big']['disque'][-1]:,.0f}, redis {results['small']['redis'][-1]:,.0f} / "
                    f"{results['big']['redis'][-1]:,.0f} ops/s ({count_label(small)} / {count_label(big)} queued)"
                )
        finally:
            for s in srv.values():
                self.servers.stop(s)
        for label, queued in (("small", small), ("big", big)):
            d, r = median(results[label]["disque"]), median(results[label]["redis"])
            ratio = paired_ratio(results[label]["disque"], results[label]["redis"])
            self.add(
                Row(
                    f"ADDJOB+GETJOB, {count_label(queued)} queued (driver)",
                    "ops/s",
                    d,
                    r,
                    ratio,
                    samples=dict(results[label]),
                )
            )
        d_scale = paired_ratio(results["big"]["disque"], results["small"]["disque"])
        r_scale = paired_ratio(results["big"]["redis"], results["small"]["redis"])
        self.add(
            Row(
                f"ADDJOB+GETJOB {count_label(big)}/{count_label(small)} queued",
                "x",
                d_scale,
                r_scale,
                None,
                "disque >= 0.8",
                check(d_scale, ">=", 0.8),
                note=f"50 connections alternating ADDJOB / GETJOB NOHANG (Redis: LPUSH / RPOP), "
                f"{secs} s per run, ops = both commands",
            )
        )
        dm, rm = mem["disque"], mem["redis"]
        self.add(
            Row(
                f"RSS per queued job ({big:,} jobs)",
                "B/job",
                dm["bytes_per_job"],
                rm["bytes_per_job"],
                dm["bytes_per_job"] / rm["bytes_per_job"],
                "disque <= 700 B",
                check(dm["bytes_per_job"], "<=", 700),
                note=f"VmRSS delta / jobs; disque-trio VmRSS {dm['rss_before'] / 2**20:.0f} -> "
                f"{dm['rss_after'] / 2**20:.0f} MiB, VmHWM {dm['hwm_after'] / 2**20:.0f} MiB; "
                f"redis VmRSS {rm['rss_before'] / 2**20:.0f} -> {rm['rss_after'] / 2**20:.0f} MiB",
            )
        )
        self.add(
            Row(
                f"pipelined ADDJOB vs LPUSH fill ({big:,})",
                "ops/s",
                dm["fill_ops_per_s"],
                rm["fill_ops_per_s"],
                dm["fill_ops_per_s"] / rm["fill_ops_per_s"],
                note=f"one connection, batches of {PREFILL_BATCH:,}; informational",
            )
        )

    def run(self, names: list[str]) -> None:
        table: dict[str, Callable[[], None]] = {
            "addjob_p1": lambda: self.addjob(1),
            "addjob_p16": lambda: self.addjob(16),
            "getjob_p1": lambda: self.getjob(1),
            "getjob_p16": lambda: self.getjob(16),
            "ackjob": self.ackjob,
            "mixed": self.mixed,
        }
        for name in names:
            self.log(f"--- {name}")
            table[name]()


# --------------------------------------------------------------------- main


def select(only: list[str] | None) -> list[str]:
    if not only:
        return list(BENCHES)
    chosen = set()
    for raw in only:
        for name in raw.lower().split(","):
            name = ALIASES.get(name, name)
            matches = [b for b in BENCHES if b == name or b.startswith(name)]
            if not matches:
                raise SystemExit(
                    f"--only: unknown benchmark {name!r}; choose from {', '.join(BENCHES)}"
                )
            chosen.update(matches)
    return [b for b in BENCHES if b in chosen]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=1800)
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these (comma separated, repeatable; prefixes allowed): {', '.join(BENCHES)}",
    )
    p.add_argument(
        "--scale", type=float, default=1.0, help="multiply every request count (default 1.0)"
    )
    p.add_argument(
        "--disque-c",
        metavar="PATH",
        help="compare with the original C Disque (a disque-server you built) instead of "
        "Redis: ADDJOB, GETJOB NOHANG and RSS per job, as bench_vs_c.py does",
    )
    return settle_repeat(p, p.parse_args(argv))


def bench_parser(doc: str | None, timeout: float) -> argparse.ArgumentParser:
    """The options every bench script has: --quick, --repeat, --json, --timeout."""
    p = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="small counts, 1 repetition: a smoke run under 60 s"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="repetitions per figure, median reported (default 3; 1 with --quick)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=timeout,
        help=f"abort the whole run after this many seconds (default {timeout:g})",
    )
    return p


def with_disque_c(args: argparse.Namespace, parts: list[str]) -> int:
    """--disque-c PATH: the same figures side by side with the original C
    Disque instead of redis-server: bench/bench_vs_c.py, these parts, run
    as a process of its own (it imports this module: importing it back
    would make an import circle)."""
    argv = ["--disque-c", args.disque_c, "--timeout", str(args.timeout)]
    argv += ["--repeat", str(args.repeat)] + (["--quick"] if args.quick else [])
    argv += ["--json", args.json] if args.json else []
    for part in parts:
        argv += ["--only", part]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_vs_c.py")
    return subprocess.run([sys.executable, script, *argv], check=False).returncode


def settle_repeat(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """--repeat defaults to 3, 1 with --quick (every bench script)."""
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def _on_signal(signum: int, frame: object) -> None:
    # SIGINT and SIGTERM alike: unwind to guarded()'s finally, which stops
    # the servers. (Installed explicitly: a background job starts with
    # SIGINT ignored, and Python would then not raise KeyboardInterrupt.)
    raise KeyboardInterrupt


def _on_alarm(signum: int, frame: object) -> None:
    raise BenchError("the whole run exceeded --timeout")


def arm_signals(timeout: float) -> None:
    """Ctrl-C, SIGTERM and the --timeout alarm all unwind to guarded()."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(int(timeout))


def guarded(name: str, run: Callable[[], None], stop: Callable[[], None]) -> int:
    """Run the benchmark; whatever happens, stop the servers. The exit
    status: 0, 130 when interrupted, 1 when aborted."""
    status = 0
    try:
        run()
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        status = 130
    except BenchError as e:
        print(f"\n{name}: aborted: {e}", file=sys.stderr)
        status = 1
    except Exception:
        traceback.print_exc()
        print(f"\n{name}: aborted by an unexpected error", file=sys.stderr)
        status = 1
    finally:
        signal.alarm(0)
        # No second Ctrl-C may cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            stop()
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.disque_c:
        return with_disque_c(args, ["single", "rss"])
    names = select(args.only)
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            print(
                f"bench_single: {tool} not found (apt-get install redis-server redis-tools)",
                file=sys.stderr,
            )
            return 1
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    load_start = os.getloadavg()[0]
    print(
        f"bench_single: {'quick' if args.quick else 'full'} run, repeat {args.repeat}, {CLIENTS} clients, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {redis_version.split(' sha=')[0]}"
    )
    if load_start > 0.5:
        print(
            f"warning: load average is {load_start:.2f} before the start: other processes "
            "compete for the CPUs, figures will be low and noisy (ratios less so)"
        )
    arm_signals(args.timeout)
    servers = Servers()
    bench = Bench(args, servers)
    print("sizes: " + ", ".join(f"{k}={v:,}" for k, v in bench.size.items()), flush=True)
    t0 = time.perf_counter()
    status = guarded("bench_single", lambda: bench.run(names), servers.stop_all)
    if bench.rows:
        print(
            f"\n== disque-trio vs redis-server, single node, median of {args.repeat} "
            f"({time.perf_counter() - t0:.0f} s) =="
        )
        print_table(bench.rows)
        if servers.log_notes:
            print("\nnode log lines worth a look:")
            print("\n".join(f"  {line}" for line in servers.log_notes[:50]))
        print(
            f"\nload average (1 min): {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"
        )
    if args.json:
        doc = {
            "mode": "quick" if args.quick else "full",
            "repeat": args.repeat,
            "clients": CLIENTS,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "redis": redis_version,
            "sizes": bench.size,
            "loadavg_start": load_start,
            "complete": status == 0,
            "rows": [asdict(r) for r in bench.rows],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
