#!/usr/bin/env python3
"""Workers side by side: the disque-trio worker against Dramatiq, Celery and
arq, each on its own broker on loopback, a no-op task, one worker process.

    python bench/bench_workers.py                   # 20,000 jobs, median of 3
    python bench/bench_workers.py --quick           # 2,000 jobs, 1 repetition
    python bench/bench_workers.py --only disque,dramatiq-50 --json out.json

Prints figures, not a test: exit 0 when it ran, whether targets are met or
missed (1 when it could not run, 130 when interrupted). The script starts
every broker, worker and producer itself and kills them (process group)
on the way out.

Brokers: one disque-trio node (``--web-port 0``, AOF off, scratch ``--dir``)
for disque-trio; ``redis-server --save "" --appendonly no`` for the peers.
A fresh broker for each framework and repetition.

drain: the framework's own producer API enqueues N jobs in a loop in a
separate process (its rate is printed, for information), then the worker
process starts. Timed from the first poll that sees a job done to the
first poll that sees none left; the worker's start-up (imports,
connecting) is reported apart.

steady: the worker is started, a warm-up job is enqueued and done, the
worker is left idle 0.3 s, then the producer process (started beforehand,
waiting on stdin) enqueues N jobs as fast as the API allows while the
worker runs. Timed from the producer's first enqueue call to the first
poll sent after its last enqueue that sees no job left.

"Every job done" is read from the broker, so the worker does no extra work
per job: this script polls every 5 ms on its own connection.

    disque-trio  INFO jobs: registered_jobs (a single node deletes a job when
                 it is acknowledged; queued and active jobs both count)
    Dramatiq     HLEN dramatiq:bench.msgs (a message's body stays there
                 until its ack, queued or prefetched)
    Celery       LLEN bench + HLEN unacked (acks_late: acked after the task
                 ran; prefetched messages sit in 'unacked')
    arq          ZCARD arq:queue (a job leaves the queue when it finished)

The end is the first poll of the final run of polls that see nothing
left, confirmed by 50 ms more of them: Celery pops a message before it
writes it to 'unacked', and a poll could fall in between.

Worker CPU: utime + stime (+ cutime + cstime) of the worker's process tree
over the timed window, per 1,000 jobs, read from /proc/PID/stat with each
poll. Dramatiq forks its worker process: the tree is found through
/proc/PID/task/*/children up to the window's opening. A process of it
gone by the end counts for nothing (a start-up helper such as the
``ldconfig -p`` of ctypes or the ``uname -p`` of platform; reaped, its
ticks show in its parent's cutime). The broker's CPU is read the same way.

arq runs from its own virtual environment (arq 0.28 requires redis<6, the
project pins redis 8): ``--arq-python``, by default ``.venv-arq`` at the
checkout's root, made on first use from bench/requirements-arq.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hiredis

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from bench_single import (  # noqa: E402  (the bench directory is not a package)
    HOST,
    BenchError,
    Server,
    Servers,
    arm_signals,
    bench_parser,
    encode,
    free_port,
    guarded,
    median,
    settle_repeat,
)

POLL_S = 0.005  # between two polls of the broker: the timing's resolution
CONFIRM_S = 0.05  # how long "nothing left" must hold before the end counts
IDLE_S = 0.3  # the worker waits idle this long before a steady run starts
CLK_TCK = os.sysconf("SC_CLK_TCK")
STOP_S = 15.0  # a process gets this long after SIGTERM, then SIGKILL
TARGET_VS_DRAMATIQ = 1.5
TARGET_VS_CELERY = 2.0
TARGET_CPU_MS = 150.0
DEFAULT_ARQ_VENV = ROOT / ".venv-arq"


# ------------------------------------------------------------ pure parts


def stat_ticks(text: str) -> int:
    """utime + stime + cutime + cstime from a /proc/PID/stat line, in clock
    ticks. The command name (field 2) may hold spaces and parentheses, so
    the fields are counted from its closing parenthesis."""
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime..cstime are fields 14..17.
    return sum(int(x) for x in fields[11:15])


def children_pids(texts: Sequence[str]) -> list[int]:
    """The PIDs listed in /proc/PID/task/TID/children files."""
    return [int(pid) for text in texts for pid in text.split()]


def info_field(text: str, name: str) -> int:
    """An integer field of an INFO reply."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return int(value)
    raise BenchError(f"INFO has no {name}")


@dataclass(frozen=True)
class Sample:
    """One poll: when it was sent (monotonic), the jobs not yet done it saw,
    and the CPU ticks after it of each process of the worker's tree (by
    PID) and of the broker."""

    t: float
    remaining: int
    worker: dict[int, int]
    broker: int


def tree_delta(start: dict[int, int], end: dict[int, int]) -> int:
    """The ticks a process tree spent between two readings. A process gone
    by the end counts for nothing: a short helper (ctypes runs ldconfig,
    platform runs uname at import) is reaped, and its ticks then show in
    its parent's cutime; one born since counts whole."""
    return sum(ticks - start.get(pid, 0) for pid, ticks in end.items())


@dataclass(frozen=True)
class Window:
    jobs: int
    seconds: float
    worker_ticks: int
    broker_ticks: int

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")

    def cpu_ms_per_1k(self, ticks: int) -> float:
        return ticks * 1000 / CLK_TCK / (self.jobs / 1000)


def end_of_work(samples: Sequence[Sample], after: float, confirm: float) -> Sample | None:
    """The first poll sent at or after ``after`` in the final run of polls
    that saw nothing left, once that run has lasted ``confirm`` seconds."""
    end = None
    for s in reversed(samples):
        if s.remaining != 0 or s.t < after:
            break
        end = s
    if end is None or samples[-1].t - end.t < confirm:
        return None
    return end


def drain_window(
    samples: Sequence[Sample], total: int, confirm: float = CONFIRM_S
) -> tuple[Sample, Window] | None:
    """From the first poll that sees a job done to the end of the work; the
    jobs counted are those still there at that first poll."""
    start = next((s for s in samples if s.remaining < total), None)
    if start is None:
        return None
    end = end_of_work(samples, start.t, confirm)
    if end is None:
        return None
    return start, window(start, end, start.remaining, start.t)


def steady_window(
    samples: Sequence[Sample],
    start: Sample,
    first: float,
    last: float,
    count: int,
    confirm: float = CONFIRM_S,
) -> Window | None:
    """From the producer's first enqueue to the end of the work after its
    last; CPU from ``start``, read just before the producer was let go."""
    end = end_of_work(samples, last, confirm)
    return None if end is None else window(start, end, count, first)


def window(start: Sample, end: Sample, jobs: int, t0: float) -> Window:
    return Window(
        jobs, end.t - t0, tree_delta(start.worker, end.worker), end.broker - start.broker
    )


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0 or a != a or b != b:  # a != a: NaN
        return None
    return a / b


def verdict(value: float | None, op: str, bound: float) -> str:
    if value is None:
        return "-"
    ok = value >= bound if op == ">=" else value <= bound
    return "PASS" if ok else "MISS"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with padded columns (readable as printed text too);
    numbers right-aligned, the first column left-aligned."""
    cols = list(zip(head, *rows, strict=True))
    widths = [max(len(c) for c in col) for col in cols]

    def line(cells: Sequence[str]) -> str:
        padded = [cells[0].ljust(widths[0])]
        padded += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    if value is None or value != value:
        return "-"
    return f"{value:{spec}}{suffix}"


# -------------------------------------------------------------- processes


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def tree_pids(pid: int) -> list[int]:
    """The process and its descendants, alive now."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        with contextlib.suppress(OSError):
            tasks = os.listdir(f"/proc/{p}/task")
            texts = []
            for tid in tasks:
                with contextlib.suppress(OSError):
                    texts.append(read_text(f"/proc/{p}/task/{tid}/children"))
            todo += children_pids(texts)
    return pids


def cpu_ticks(pids: Sequence[int]) -> dict[int, int]:
    """Each process's ticks; one that has exited is left out."""
    ticks = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            ticks[pid] = stat_ticks(read_text(f"/proc/{pid}/stat"))
    return ticks


def broker_ticks(pid: int) -> int:
    if (ticks := cpu_ticks([pid]).get(pid)) is None:
        raise BenchError(f"the broker (pid {pid}) exited")
    return ticks


class Child:
    """A worker or producer: its own process group (killed whole: Celery and
    Dramatiq fork), output to a log file, optionally a pipe to talk to."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], scratch: str, talk: bool
    ) -> None:
        self.name = name
        self.log_path = os.path.join(scratch, f"{name}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.started = time.monotonic()
        # A worker's stdout goes to the log too: a pipe nobody reads (Celery
        # prints a banner there) could fill up and block it.
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
            stdout=subprocess.PIPE if talk else self._log,
            stderr=self._log,
            cwd=scratch,
            env=env,
            start_new_session=True,
        )
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise BenchError(
                f"{self.name} exited with status {self.proc.returncode}:\n{self.log_tail()}"
            )

    def read_line(self, timeout: float) -> str:
        """The next line of its stdout, within ``timeout`` seconds."""
        line = self.poll_line(timeout)
        if line is None:
            raise BenchError(f"{self.name}: no output within {timeout:.0f} s")
        return line

    def poll_line(self, timeout: float = 0.0) -> str | None:
        """The next line of its stdout if one comes within ``timeout``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                data = os.read(self.proc.stdout.fileno(), 65536)
                if not data:
                    raise BenchError(f"{self.name} closed its output:\n{self.log_tail()}")
                self._buffer += data
            elif left == 0:
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")

    def log_lines(self) -> int:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path, "rb") as f:
            return sum(1 for _ in f)

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to it after STOP_S; idempotent."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pass
        # Whatever of the group is left (a forked child outliving its parent).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._log.close()


class Brokers(Servers):
    """bench_single's servers (scratch dir, process groups, stop on exit),
    with the node started as bench_worker.py starts it: no web port."""

    def disque(self) -> Server:
        port, bus = free_port(), free_port()
        argv = [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", HOST]
        argv += ["--cluster-port", str(bus), "--web-port", "0", "--dir", self.workdir]
        return self._start("disque-trio", argv, port)


class Probe:
    """One connection to the broker, pipelining the commands that count the
    jobs not yet done."""

    def __init__(self, port: int, commands: Sequence[Sequence[str]]) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = b"".join(encode(*c) for c in commands)
        self.count = len(commands)
        self.reader = hiredis.Reader()

    def replies(self) -> list[Any]:
        self.sock.sendall(self.request)
        out: list[Any] = []
        while len(out) < self.count:
            reply = self.reader.gets()
            if reply is False:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise BenchError("the broker closed the connection")
                self.reader.feed(data)
            elif isinstance(reply, hiredis.ReplyError):
                raise BenchError(f"broker error: {reply}")
            else:
                out.append(reply)
        return out

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------- frameworks


@dataclass(frozen=True)
class Peer:
    name: str  # for --only
    label: str  # the table's row
    app: str  # module in bench/worker_peers
    broker: str  # "disque" or "redis"
    worker: Callable[[Context], list[str]]
    probe: tuple[tuple[str, ...], ...]  # commands whose replies sum to the jobs left
    uses_arq: bool = False

    def remaining(self, replies: list[Any]) -> int:
        if self.broker == "disque":
            return info_field(replies[0].decode(), "registered_jobs")
        return sum(int(r) for r in replies)


@dataclass
class Context:
    """What a worker's command line needs."""

    url: str
    arq_python: str


def disque_worker(level: str) -> Callable[[Context], list[str]]:
    def argv(ctx: Context) -> list[str]:
        return [
            *(sys.executable, "-m", "disque_trio", "worker"),
            "worker_peers.disque_trio_app:worker",
            *("--nodes", ctx.url, "--log-level", level, "--path", str(BENCH)),
        ]

    return argv


def dramatiq_worker(threads: int) -> Callable[[Context], list[str]]:
    def argv(ctx: Context) -> list[str]:
        # --path takes several values: it goes before the other options.
        return [
            *(sys.executable, "-m", "dramatiq", "--path", str(BENCH)),
            *("--processes", "1", "--threads", str(threads), "worker_peers.dramatiq_app"),
        ]

    return argv


def celery_worker(ctx: Context) -> list[str]:
    return [
        *(sys.executable, "-m", "celery", "-A", "worker_peers.celery_app", "worker"),
        *("--pool", "threads", "--concurrency", "50", "--loglevel", "WARNING"),
        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
    ]


def arq_worker(ctx: Context) -> list[str]:
    return [ctx.arq_python, "-m", "arq", "worker_peers.arq_app.WorkerSettings"]


DISQUE_PROBE = (("INFO", "jobs"),)
PEERS = (
    Peer(
        "disque",
        "disque-trio worker, concurrency 50 (default log level, info)",
        "disque_trio_app",
        "disque",
        disque_worker("info"),
        DISQUE_PROBE,
    ),
    Peer(
        "disque-warning",
        "the same, log level warning",
        "disque_trio_app",
        "disque",
        disque_worker("warning"),
        DISQUE_PROBE,
    ),
    Peer(
        "dramatiq-50",
        "Dramatiq, 1 process x 50 threads (Redis)",
        "dramatiq_app",
        "redis",
        dramatiq_worker(50),
        (("HLEN", "dramatiq:bench.msgs"),),
    ),
    Peer(
        "dramatiq-8",
        "Dramatiq, 1 x 8 (Redis)",
        "dramatiq_app",
        "redis",
        dramatiq_worker(8),
        (("HLEN", "dramatiq:bench.msgs"),),
    ),
    Peer(
        "celery",
        "Celery, threads pool 50 (Redis)",
        "celery_app",
        "redis",
        celery_worker,
        (("LLEN", "bench"), ("HLEN", "unacked")),
    ),
    Peer(
        "arq",
        "arq, max_jobs 50, poll delay 0.05 s (Redis)",
        "arq_app",
        "redis",
        arq_worker,
        (("ZCARD", "arq:queue"),),
        uses_arq=True,
    ),
)
# The distribution whose version each peer's row depends on.
DISTRIBUTIONS = {
    "disque_trio_app": ["disque-trio"],
    "dramatiq_app": ["dramatiq", "redis"],
    "celery_app": ["celery", "kombu", "redis"],
    "arq_app": ["arq", "redis"],
}


def select_peers(only: list[str] | None) -> list[Peer]:
    """--only: comma separated, repeatable, a name or a prefix of names."""
    if not only:
        return list(PEERS)
    wanted = [w for raw in only for w in raw.lower().split(",") if w]
    for w in wanted:
        if not any(p.name.startswith(w) for p in PEERS):
            names = ", ".join(p.name for p in PEERS)
            raise SystemExit(f"--only: unknown worker {w!r}; choose from {names}")
    return [p for p in PEERS if any(p.name == w or p.name.startswith(w) for w in wanted)]


# ----------------------------------------------------------------- results


@dataclass
class RunResult:
    """One repetition of one peer; None where that part failed."""

    peer: str
    repetition: int
    drain: dict[str, float] | None = None
    steady: dict[str, float] | None = None
    error: str | None = None


def figures(w: Window) -> dict[str, float]:
    return {
        "jobs": w.jobs,
        "seconds": w.seconds,
        "rate": w.rate,
        "worker_cpu_ms_per_1k": w.cpu_ms_per_1k(w.worker_ticks),
        "broker_cpu_ms_per_1k": w.cpu_ms_per_1k(w.broker_ticks),
    }


def median_of(results: Sequence[RunResult], part: str, key: str) -> float | None:
    values = [
        d[key] for r in results if (d := getattr(r, part)) is not None and d.get(key) is not None
    ]
    return median(values) if values else None


@dataclass
class Summary:
    peer: Peer
    drain: float | None
    steady: float | None
    cpu_drain: float | None
    cpu_steady: float | None
    enqueue: float | None
    startup: float | None
    broker_cpu: float | None
    runs: int

    @classmethod
    def of(cls, peer: Peer, results: Sequence[RunResult]) -> Summary:
        mine = [r for r in results if r.peer == peer.name]
        return cls(
            peer,
            median_of(mine, "drain", "rate"),
            median_of(mine, "steady", "rate"),
            median_of(mine, "drain", "worker_cpu_ms_per_1k"),
            median_of(mine, "steady", "worker_cpu_ms_per_1k"),
            median_of(mine, "drain", "enqueue_rate"),
            median_of(mine, "drain", "startup_s"),
            median_of(mine, "drain", "broker_cpu_ms_per_1k"),
            sum(1 for r in mine if r.drain is not None and r.steady is not None),
        )


def figures_table(summaries: Sequence[Summary]) -> str:
    head = [
        "",
        "drain jobs/s",
        "steady jobs/s",
        "worker CPU ms per 1k jobs (drain)",
        "(steady)",
        "enqueue jobs/s",
        "worker start s",
        "broker CPU ms per 1k (drain)",
    ]
    rows = [
        [
            s.peer.label,
            fmt(s.drain),
            fmt(s.steady),
            fmt(s.cpu_drain),
            fmt(s.cpu_steady),
            fmt(s.enqueue),
            fmt(s.startup, ".2f"),
            fmt(s.broker_cpu),
        ]
        for s in summaries
    ]
    return markdown_table(head, rows)


def ratio_rows(ours: Summary, theirs: Summary, target: float | None) -> list[str]:
    d, s = ratio(ours.drain, theirs.drain), ratio(ours.steady, theirs.steady)
    wanted = "-" if target is None else f">= {target:g}x"
    results = "-" if target is None else f"{verdict(d, '>=', target)} / {verdict(s, '>=', target)}"
    return [theirs.peer.label, fmt(d, ".2f", "x"), fmt(s, ".2f", "x"), wanted, results]


def ratios_table(ours: Summary, others: Sequence[Summary]) -> str:
    targets = {"dramatiq-50": TARGET_VS_DRAMATIQ, "celery": TARGET_VS_CELERY}
    rows = [ratio_rows(ours, o, targets.get(o.peer.name)) for o in others]
    head = [f"{ours.peer.label} against", "drain", "steady", "target", "drain / steady"]
    return markdown_table(head, rows)


def cpu_table(ours: Sequence[Summary]) -> str:
    rows = [
        [
            s.peer.label,
            fmt(s.cpu_drain),
            fmt(s.cpu_steady),
            f"<= {TARGET_CPU_MS:g}",
            f"{verdict(s.cpu_drain, '<=', TARGET_CPU_MS)} / "
            f"{verdict(s.cpu_steady, '<=', TARGET_CPU_MS)}",
        ]
        for s in ours
    ]
    head = ["worker CPU ms per 1k jobs", "drain", "steady", "target", "drain / steady"]
    return markdown_table(head, rows)


def report(summaries: Sequence[Summary]) -> str:
    by_name = {s.peer.name: s for s in summaries}
    parts = [figures_table(summaries)]
    ours = [by_name[n] for n in ("disque", "disque-warning") if n in by_name]
    others = [s for s in summaries if not s.peer.name.startswith("disque")]
    parts += [ratios_table(o, others) for o in ours if others]
    if ours:
        parts.append(cpu_table(ours))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- running


class Bench:
    def __init__(self, args: argparse.Namespace, brokers: Brokers) -> None:
        self.args = args
        self.jobs: int = args.jobs
        self.brokers = brokers
        self.scratch = brokers.workdir
        self.children: list[Child] = []
        self.results: list[RunResult] = []
        self.timeout = 60.0 + self.jobs / 200  # one phase, at 200 jobs/s or faster

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # ---- processes

    def env(self, url: str) -> dict[str, str]:
        env = dict(os.environ, BENCH_BROKER_URL=url)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), env.get("PYTHONPATH")]))
        return env

    def start(self, name: str, argv: list[str], url: str, talk: bool = False) -> Child:
        child = Child(name, argv, self.env(url), self.scratch, talk)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        for child in list(self.children):
            with contextlib.suppress(Exception):
                self.stop(child)

    def python(self, peer: Peer) -> str:
        return self.args.arq_python if peer.uses_arq else sys.executable

    def producer(self, peer: Peer, url: str, warmup: int) -> Child:
        argv = [self.python(peer), "-m", "worker_peers.produce", peer.app, str(warmup)]
        child = self.start(f"{peer.name}-producer", [*argv, str(self.jobs)], url, talk=True)
        if (line := child.read_line(60)) != "ready":
            raise BenchError(f"{child.name} said {line!r}:\n{child.log_tail()}")
        return child

    def worker(self, peer: Peer, url: str) -> Child:
        ctx = Context(url, self.args.arq_python)
        return self.start(f"{peer.name}-worker", peer.worker(ctx), url)

    # ---- polling

    def poll(self, probe: Probe, peer: Peer, pids: list[int], broker_pid: int) -> Iterator[Sample]:
        """A sample every POLL_S, until the caller stops asking, at most
        the phase's timeout."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            t = time.monotonic()
            left = peer.remaining(probe.replies())
            yield Sample(t, left, cpu_ticks(pids), broker_ticks(broker_pid))
            time.sleep(POLL_S)
        raise BenchError(f"{peer.name}: the jobs were not done within {self.timeout:.0f} s")

    def wait_for_jobs(self, probe: Probe, peer: Peer, want: int, worker: Child | None) -> None:
        deadline = time.monotonic() + self.timeout
        while (left := peer.remaining(probe.replies())) != want:
            if worker is not None:
                worker.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{peer.name}: {left} jobs left, expected {want}")
            time.sleep(POLL_S)

    # ---- the two phases

    def drain(self, peer: Peer, server: Server, url: str, probe: Probe) -> dict[str, float]:
        producer = self.producer(peer, url, warmup=0)
        producer.say("go")
        sent = json.loads(producer.read_line(self.timeout))
        self.stop(producer)
        self.wait_for_jobs(probe, peer, self.jobs, None)
        worker = self.worker(peer, url)
        samples: list[Sample] = []
        pids = [worker.pid]
        found: tuple[Sample, Window] | None = None
        for sample in self.poll(probe, peer, pids, server.pid):
            worker.check_alive()
            if not any(s.remaining < self.jobs for s in samples[-1:]):
                # Until a job is done the tree may still grow (Dramatiq forks).
                pids[:] = tree_pids(worker.pid)
                sample = Sample(sample.t, sample.remaining, cpu_ticks(pids), sample.broker)
            samples.append(sample)
            if (found := drain_window(samples, self.jobs)) is not None:
                break
        self.stop(worker)
        assert found is not None
        start, w = found
        return {
            **figures(w),
            "enqueue_rate": sent["count"] / (sent["last"] - sent["first"]),
            "startup_s": start.t - worker.started,
            "worker_log_lines": worker.log_lines(),
        }

    def steady(self, peer: Peer, server: Server, url: str, probe: Probe) -> dict[str, float]:
        worker = self.worker(peer, url)
        producer = self.producer(peer, url, warmup=1)
        self.wait_for_jobs(probe, peer, 0, worker)  # the warm-up job is done
        time.sleep(IDLE_S)
        pids = tree_pids(worker.pid)
        start = Sample(time.monotonic(), 0, cpu_ticks(pids), broker_ticks(server.pid))
        producer.say("go")
        samples: list[Sample] = []
        sent: dict[str, float] | None = None
        w: Window | None = None
        for sample in self.poll(probe, peer, pids, server.pid):
            worker.check_alive()
            samples.append(sample)
            if sent is None and (line := producer.poll_line()) is not None:
                sent = json.loads(line)
            if sent is not None:
                args = (sent["first"], sent["last"], self.jobs)
                if (w := steady_window(samples, start, *args)) is not None:
                    break
        self.stop(worker)
        self.stop(producer)
        assert w is not None and sent is not None
        return {**figures(w), "enqueue_rate": self.jobs / (sent["last"] - sent["first"])}

    def phase(self, peer: Peer, run: Callable[..., dict[str, float]]) -> dict[str, float]:
        """One phase on a fresh broker."""
        server = self.brokers.disque() if peer.broker == "disque" else self.brokers.redis()
        scheme = "disque" if peer.broker == "disque" else "redis"
        url = f"{scheme}://{HOST}:{server.port}" + ("/0" if scheme == "redis" else "")
        probe = Probe(server.port, peer.probe)
        try:
            return run(peer, server, url, probe)
        finally:
            probe.close()
            self.stop_all()
            self.brokers.stop(server)

    def one(self, peer: Peer, rep: int) -> RunResult:
        result = RunResult(peer.name, rep)
        try:
            result.drain = self.phase(peer, self.drain)
            result.steady = self.phase(peer, self.steady)
        except BenchError as e:
            result.error = str(e)
            self.log(f"{peer.name} #{rep}: FAILED: {e}")
        self.results.append(result)
        return result

    def run(self, peers: Sequence[Peer]) -> None:
        # Repetitions outermost: a change of the machine's load hits every peer.
        for rep in range(1, self.args.repeat + 1):
            for peer in peers:
                r = self.one(peer, rep)
                if r.drain and r.steady:
                    self.log(
                        f"{peer.name} #{rep}: drain {r.drain['rate']:,.0f} jobs/s "
                        f"(CPU {r.drain['worker_cpu_ms_per_1k']:.0f} ms/1k), "
                        f"steady {r.steady['rate']:,.0f} jobs/s "
                        f"(CPU {r.steady['worker_cpu_ms_per_1k']:.0f} ms/1k), "
                        f"enqueue {r.drain['enqueue_rate']:,.0f} jobs/s"
                    )


# ------------------------------------------------------------------ setup


def version_of(python: str, distributions: Sequence[str]) -> dict[str, str] | None:
    """The installed versions under that interpreter; None if one is missing."""
    code = (
        "import sys, json, importlib.metadata as m;"
        "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code, *distributions],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


def make_arq_venv(path: Path) -> None:
    """arq cannot share the project's environment (it needs redis<6): a
    venv of its own, made once from bench/requirements-arq.txt."""
    print(f"making arq's environment in {path} (once; bench/requirements-arq.txt)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-r", str(BENCH / "requirements-arq.txt")], check=True, timeout=600)


def available(peers: Sequence[Peer], args: argparse.Namespace) -> tuple[list[Peer], dict]:
    """The peers whose framework is installed, and every version found."""
    if any(p.uses_arq for p in peers) and args.arq_python is None:
        if not (DEFAULT_ARQ_VENV / "bin" / "python").exists():
            make_arq_venv(DEFAULT_ARQ_VENV)
        args.arq_python = str(DEFAULT_ARQ_VENV / "bin" / "python")
    versions: dict[str, dict[str, str]] = {}
    kept = []
    for peer in peers:
        python = args.arq_python if peer.uses_arq else sys.executable
        found = version_of(python, DISTRIBUTIONS[peer.app])
        if found is None:
            print(f"skipping {peer.name}: {DISTRIBUTIONS[peer.app]} not importable by {python}")
            print("  (pip install -c constraints.txt -e '.[bench]' for Dramatiq and Celery)")
            continue
        versions[peer.app] = found
        kept.append(peer)
    return kept, versions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=3600)
    p.add_argument("--jobs", type=int, default=None, help="jobs per run (default 20,000)")
    names = ", ".join(p.name for p in PEERS)
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these (comma separated, repeatable, prefixes allowed): {names}",
    )
    p.add_argument(
        "--arq-python",
        metavar="PATH",
        help="the interpreter with arq installed (default: .venv-arq/bin/python, made if missing)",
    )
    args = settle_repeat(p, p.parse_args(argv))
    if args.jobs is None:
        args.jobs = 2000 if args.quick else 20_000
    if args.jobs < 10:
        p.error("--jobs must be >= 10")
    return args


def document(args: argparse.Namespace, bench: Bench, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/bench_workers.py", *sys.argv[1:]]),
        "jobs": args.jobs,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "poll_s": POLL_S,
        "confirm_s": CONFIRM_S,
        **extra,
        "runs": [asdict(r) for r in bench.results],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("redis-server") is None:
        print("bench_workers: redis-server not found (apt-get install redis-server)")
        return 1
    peers, versions = available(select_peers(args.only), args)
    if not peers:
        return 1
    redis = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, timeout=10
    ).stdout.split(" sha=")[0]
    load_start = os.getloadavg()[0]
    print(
        f"bench_workers: {args.jobs:,} jobs, repeat {args.repeat}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {redis}, load {load_start:.2f}"
    )
    print("versions: " + json.dumps(versions), flush=True)
    arm_signals(args.timeout)
    brokers = Brokers()
    bench = Bench(args, brokers)

    def stop() -> None:
        bench.stop_all()
        brokers.stop_all()

    t0 = time.monotonic()
    status = guarded("bench_workers", lambda: bench.run(peers), stop)
    summaries = [Summary.of(p, bench.results) for p in peers]
    print(f"\n== workers, {args.jobs:,} jobs, median of {args.repeat} ==")
    print(f"({time.monotonic() - t0:.0f} s; load {load_start:.2f} -> {os.getloadavg()[0]:.2f})\n")
    print(report(summaries))
    if brokers.log_notes:
        print("\nnode log lines worth a look:\n" + "\n".join(brokers.log_notes[:20]))
    if args.json:
        extra = {"versions": versions, "redis_server": redis, "loadavg_start": load_start}
        extra["loadavg_end"] = os.getloadavg()[0]
        extra["complete"] = status == 0
        extra["table"] = report(summaries)
        with open(args.json, "w") as f:
            json.dump(document(args, bench, extra), f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
