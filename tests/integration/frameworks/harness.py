"""What the Celery and Dramatiq process tests share: starting a worker or
the producer as a real process (its own session, output to a file, a
timeout on every wait, killed whole at the end), reading what the tasks
recorded, and the dead letters the nodes hold."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from disque_trio.client import Client
from disque_trio.worker import DeadLetter

HERE = Path(__file__).resolve().parent  # tests/integration/frameworks
COUNT = 2000  # tasks the producer sends
FAILING = {n for n in range(COUNT) if n % 100 == 7}  # tasks that always raise


def worker_argv(framework: str) -> list[str]:
    """The frameworks' own worker commands, unchanged but for the pool:
    Celery's threads pool, Dramatiq's one process of 8 threads."""
    if framework == "celery":
        return [
            *(sys.executable, "-m", "celery", "-A", "frameworks.celery_app", "worker"),
            *("--pool", "threads", "--concurrency", "8", "--loglevel", "INFO"),
        ]
    return [
        *(sys.executable, "-m", "dramatiq", "frameworks.dramatiq_app"),
        *("--processes", "1", "--threads", "8"),
    ]


def dead_queue(framework: str) -> str:
    return ("celery" if framework == "celery" else "default") + ":dead"


class Proc:
    """A process in its own session (Dramatiq forks its workers: the whole
    group is signalled), its output in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}-{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=HERE.parent,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """``sig`` to the process (its own children are its to stop: a
        second SIGTERM makes Dramatiq's workers quit at once), then SIGKILL
        to the group after ``timeout`` seconds; the exit status, None if it
        had to be killed."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)
            return None
        finally:
            self.send_signal(signal.SIGKILL)  # a forked child left behind

    def output(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Run:
    """One test's processes, files and environment."""

    framework: str
    url: str
    workdir: Path
    retry: int
    replicate: int | None = None
    pace: int = 400  # tasks per second the producer sends at most
    procs: list[Proc] = field(default_factory=list)

    @property
    def record_path(self) -> Path:
        return self.workdir / "record.txt"

    @property
    def sent_path(self) -> Path:
        return self.workdir / "sent.txt"

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(HERE.parent),
            "PYTHONUNBUFFERED": "1",
            "DISQUE_URL": self.url,
            "RECORD": str(self.record_path),
            "RETRY": str(self.retry),
            "PACE": str(self.pace),
        }
        if self.replicate is not None:
            env["REPLICATE"] = str(self.replicate)
        return env

    def start(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.env(), self.workdir)
        self.procs.append(proc)
        return proc

    def worker(self, name: str = "worker") -> Proc:
        return self.start(name, worker_argv(self.framework))

    def producer(self) -> Proc:
        argv = [sys.executable, "-m", "frameworks.produce", self.framework, str(COUNT)]
        return self.start("producer", [*argv, str(self.sent_path)])

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.stop(signal.SIGKILL, timeout=15)

    # ------------------------------------------------------------ what happened

    def records(self) -> Records:
        return Records.read(self.record_path)

    def sent(self) -> tuple[set[int], list[str]]:
        """The tasks whose delay()/send() returned, and the refusals."""
        sent: set[int] = set()
        refused: list[str] = []
        if self.sent_path.exists():
            for line in self.sent_path.read_text().splitlines():
                kind, _, rest = line.partition(" ")
                if kind == "sent":
                    sent.add(int(rest))
                elif kind == "refused":
                    refused.append(rest)
        return sent, refused

    def dead_letters(self, ports: list[int]) -> dict[int, list[DeadLetter]]:
        """The dead letters the nodes on ``ports`` hold, by task number."""
        letters: dict[str, DeadLetter] = {}
        for port in ports:
            with Client(f"127.0.0.1:{port}", max_attempts=1, follow_producers=False) as c:
                for info in c.jscan_jobs(queue=dead_queue(self.framework)):
                    if info.state != "acked":
                        letters[info.id] = DeadLetter.from_body(info.body)
        by_task: dict[int, list[DeadLetter]] = {}
        for letter in letters.values():
            by_task.setdefault(task_number(self.framework, letter.body), []).append(letter)
        return by_task


def task_number(framework: str, body: bytes) -> int:
    """The ``n`` of a ``work(n, fail)`` message, from its job body."""
    if framework == "celery":
        payload = json.loads(body)
        args = json.loads(base64.b64decode(payload["body"]))[0]
        return int(args[0])
    return int(json.loads(body)["args"][0])


@dataclass
class Records:
    started: Counter[int]
    done: Counter[int]
    failed: Counter[int]

    @classmethod
    def read(cls, path: Path) -> Records:
        counters: dict[str, Counter[int]] = {
            "start": Counter(),
            "done": Counter(),
            "fail": Counter(),
        }
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] in counters:
                    counters[parts[0]][int(parts[1])] += 1
        return cls(counters["start"], counters["done"], counters["fail"])

    def in_flight(self) -> set[int]:
        """Tasks started and not finished (failing tasks left out)."""
        return {n for n in self.started if n not in self.done and n not in FAILING}


def wait_until(what: str, check: Callable[[], bool], timeout: float, *procs: Proc) -> None:
    """Poll ``check`` every 0.2 s; fail after ``timeout`` seconds, or when
    one of ``procs`` exited, with its output."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    try:
        _wait(what, check, deadline, timeout, procs)
    finally:
        print(f"[{time.strftime('%X')}] waited {time.monotonic() - t0:.1f} s for {what}")


def _wait(
    what: str, check: Callable[[], bool], deadline: float, timeout: float, procs: tuple[Proc, ...]
) -> None:
    while not check():
        for proc in procs:
            if not proc.alive():
                raise AssertionError(
                    f"{proc.name} exited ({proc.proc.returncode}) while waiting for {what}:\n"
                    + proc.output()
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.output(30)}" for p in procs)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(0.2)


@contextlib.contextmanager
def running(run: Run) -> Iterator[Run]:
    try:
        yield run
    finally:
        run.close()


def active_jobs(port: int) -> list[str]:
    """The jobs a node holds as delivered-and-not-acknowledged (or waiting
    for a delay)."""
    with Client(f"127.0.0.1:{port}", max_attempts=1, follow_producers=False) as c:
        return list(c.jscan(states=["active"]))
