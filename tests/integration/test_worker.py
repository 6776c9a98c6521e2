"""The worker against a real node: acknowledgements (ACKJOB, or FASTACK as
the node's MONITOR feed shows, batched), NACKs, the dead-letter queue
(after max_retries failures; shutdowns do not count), WORKING keep-alive
and -TOOLATE, time limits, thread-pool handlers, metrics, graceful stop
(jobs given back with ENQUEUE); and ``disque-trio worker`` as a process
receiving SIGTERM. AnyIO tests run under asyncio and Trio."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from disque_trio.client import AsyncClient, Client, Job, JobInfo
from disque_trio.worker import DeadLetter, JobContext, Middleware, Next, Worker

from .conftest import NodeProcess

ROOT = Path(__file__).resolve().parents[2]


def url(node: NodeProcess) -> str:
    return f"disque://127.0.0.1:{node.port}"


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


class Recorder:
    """Extra middleware (innermost): what KeepAlive noted per job."""

    def __init__(self) -> None:
        self.notes: dict[str, dict[str, object]] = {}

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        try:
            await call_next()
        finally:
            self.notes[ctx.job.id] = dict(ctx.notes)


async def _http_get(port: int, path: str) -> str:
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        with anyio.fail_after(5):
            while True:
                try:
                    data += await s.receive()
                except anyio.EndOfStream:
                    break
    return data.decode()


@pytest.mark.anyio
async def test_acks_nacks_dead_letters_and_metrics(node: NodeProcess) -> None:
    with Client(url(node)) as c:
        ok_ids = {c.add_job("ok", f"job {i}") for i in range(20)}
        bad_id = c.add_job("bad", b"\xff\x00binary")
    worker = Worker(url(node), max_deliveries=3, metrics_port=0)
    handled: list[Job] = []
    attempts: list[Job] = []

    @worker.handler("ok", concurrency=5)
    async def ok(job: Job) -> None:
        handled.append(job)

    @worker.handler("bad")
    async def bad(job: Job) -> None:
        attempts.append(job)
        raise ValueError(f"cannot handle {job.id}")

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with Client(url(node)) as c:
            await wait_until(lambda: c.qlen("bad:dead") == 1, what="the dead letter")
        await wait_until(lambda: len(handled) == 20)
        assert worker.metrics_bound_port is not None
        # A job counts as done once its handler returned and its ACKJOB was
        # answered: the last one may still be on its way (seen on a loaded
        # machine: 19 of 20). Likewise a dead letter is counted once the
        # original's ACKJOB, sent after the letter was added, is answered
        # (seen: the letter queued, the counters at 2 failures, 0 dead).
        counted = (
            'disque_worker_jobs_done_total{queue="ok"} 20.0',
            'disque_worker_jobs_dead_lettered_total{queue="bad"} 1.0',
        )
        with anyio.fail_after(10):
            while True:
                text = await _http_get(worker.metrics_bound_port, "/metrics")
                if all(line in text for line in counted):
                    break
                await anyio.sleep(0.05)
        assert "404" in (await _http_get(worker.metrics_bound_port, "/nope")).split("\r\n")[0]
        worker.stop()
    assert {j.id for j in handled} == ok_ids and all(j.body.startswith(b"job ") for j in handled)
    # Delivered 3 times: NACKed twice, then moved with its error.
    assert [(j.nacks, j.deliveries) for j in attempts] == [(0, 1), (1, 2), (2, 3)]
    with Client(url(node)) as c:
        assert c.qlen("ok") == 0 and c.qlen("bad") == 0
        assert all(c.show(i) is None for i in ok_ids | {bad_id})  # acknowledged, collected
        letter = DeadLetter.from_body(c.get_job("bad:dead", timeout=2).body)  # type: ignore[union-attr]
    assert letter.id == bad_id and letter.queue == "bad" and letter.body == b"\xff\x00binary"
    assert letter.error == f"ValueError: cannot handle {bad_id}" and letter.deliveries == 3
    assert "raise ValueError" in letter.traceback and "disque_trio/worker/" not in letter.traceback
    body = text.split("\r\n\r\n", 1)[1]
    values = {
        (s.name, s.labels.get("queue")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert values[("disque_worker_jobs_done_total", "ok")] == 20
    assert values[("disque_worker_jobs_failed_total", "bad")] == 3
    assert values[("disque_worker_jobs_dead_lettered_total", "bad")] == 1
    assert values[("disque_worker_handler_duration_seconds_count", "ok")] == 20


@pytest.mark.anyio
async def test_keep_alive_and_time_limit(node: NodeProcess) -> None:
    with Client(url(node)) as c:
        long_id = c.add_job("long", "x", retry=1)
        stuck_id = c.add_job("stuck", "y", retry=30)
    recorder = Recorder()
    worker = Worker(url(node), max_deliveries=1, middleware=[recorder])
    runs: list[str] = []

    @worker.handler("long")
    async def long(job: Job) -> None:
        runs.append(job.id)
        await anyio.sleep(2.6)  # RETRY 1: WORKING about every 0.5 s keeps it ours

    @worker.handler("stuck", timeout=0.3)
    async def stuck(job: Job) -> None:
        await anyio.sleep(30)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(lambda: long_id in recorder.notes and stuck_id in recorder.notes)
        worker.stop()
    assert runs == [long_id]  # never queued again meanwhile
    assert int(recorder.notes[long_id]["working"]) >= 3  # type: ignore[call-overload]
    with Client(url(node)) as c:
        letter = DeadLetter.from_body(c.get_job("stuck:dead", timeout=2).body)  # type: ignore[union-attr]
    assert (
        letter.id == stuck_id
        and letter.error == "HandlerTimeout: handler ran past its 0.3 s timeout"
    )


@pytest.mark.anyio
async def test_toolate_stops_the_keep_alive_and_is_logged(
    node: NodeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with Client(url(node)) as c:
        job_id = c.add_job("short", "x", ttl=3, retry=1)
    recorder = Recorder()
    worker = Worker(url(node), middleware=[recorder], working_fraction=0.3)

    @worker.handler("short")
    async def short(job: Job) -> None:
        await anyio.sleep(2.2)

    with caplog.at_level(logging.WARNING, logger="disque_trio.worker"):
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await wait_until(lambda: job_id in recorder.notes)
            worker.stop()
    toolate = [r for r in caplog.records if getattr(r, "event", "") == "toolate"]
    assert len(toolate) == 1 and toolate[0].job_id == job_id  # type: ignore[attr-defined]
    assert "TOOLATE" in toolate[0].getMessage()


@pytest.mark.anyio
async def test_plain_functions_run_in_a_bounded_thread_pool(node: NodeProcess) -> None:
    with Client(url(node)) as c:
        ids = {c.add_job("cpu", str(i)) for i in range(6)}
    worker = Worker(url(node), threads=2)
    lock = threading.Lock()
    active, peak, done = [0], [0], set()

    @worker.handler("cpu", concurrency=6)
    def crunch(job: Job) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
            done.add(job.id)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(lambda: len(done) == 6)
        worker.stop()
    assert done == ids and peak[0] == 2


@pytest.mark.anyio
async def test_stop_lets_handlers_finish_then_gives_back_the_rest(node: NodeProcess) -> None:
    with Client(url(node)) as c:
        quick_id = c.add_job("quick", "x")
        hung_id = c.add_job("hung", "y")
    worker = Worker(url(node), shutdown_timeout=0.8)
    started: set[str] = set()
    finished: set[str] = set()

    @worker.handler("quick")
    async def quick(job: Job) -> None:
        started.add(job.id)
        await anyio.sleep(0.4)
        finished.add(job.id)

    @worker.handler("hung")
    async def hung(job: Job) -> None:
        started.add(job.id)
        await anyio.sleep(60)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(lambda: started == {quick_id, hung_id})
        t0 = anyio.current_time()
        worker.stop()
    assert anyio.current_time() - t0 < 5  # fetches in flight (1 s) + grace (0.8 s)
    assert finished == {quick_id}
    with Client(url(node)) as c:
        assert c.show(quick_id) is None
        info = c.show(hung_id)
    # Given back with ENQUEUE: a delivery more, no failure (no NACK).
    assert info is not None and info.state == "queued"
    assert (info.nacks, info.additional_deliveries) == (0, 1)


@pytest.mark.anyio
async def test_an_interrupted_job_is_given_back_once_not_again_by_a_fetch_in_flight(
    node: NodeProcess,
) -> None:
    """The grace ends while a fetch of the same queue is still waiting (its
    timeout is longer): given back at once, the job went straight into that
    fetch, which gave it back a second time, a delivery of the job's
    max_deliveries spent on nothing. The ENQUEUE waits for the fetches."""
    with Client(url(node)) as c:
        job_id = c.add_job("long", "z")
    worker = Worker(url(node), shutdown_timeout=0.3, fetch_timeout=2.0)
    started: list[str] = []

    @worker.handler("long", concurrency=2)
    async def long(job: Job) -> None:
        started.append(job.id)
        await anyio.sleep(60)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(lambda: started == [job_id])
        await anyio.sleep(0.3)  # the second slot's fetch is waiting, 2 s
        worker.stop()
    assert started == [job_id]
    with Client(url(node)) as c:
        info = c.show(job_id)
    assert info is not None and info.state == "queued"
    assert (info.nacks, info.additional_deliveries) == (0, 1)


class Monitor:
    """A MONITOR connection read in the background: the commands the node
    received from other clients, each as its list of arguments."""

    WORD = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def __init__(self, port: int) -> None:
        self.port = port
        self.commands: list[list[str]] = []

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
            await stream.send(b"MONITOR\r\n")
            buffer = b""
            while b"\r\n" not in buffer:
                buffer += await stream.receive()
            ok, buffer = buffer.split(b"\r\n", 1)
            assert ok == b"+OK", ok
            task_status.started()
            while True:
                *lines, buffer = buffer.split(b"\r\n")
                self.commands += [self.WORD.findall(line.decode()) for line in lines]
                buffer += await stream.receive()

    def ids(self, command: str) -> list[str]:
        """The arguments of every ``command`` seen (job IDs for acks)."""
        return [a for argv in self.commands if argv[:1] == [command] for a in argv[1:]]


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["worker", "handler"])
async def test_fastack_deletes_the_job_at_once_with_fastack_not_ackjob(
    node: NodeProcess, where: str
) -> None:
    # fastack=True on the Worker (a handler can still say False), or on
    # one handler of a Worker that acknowledges with ACKJOB.
    fast_options: dict[str, Any] = {} if where == "worker" else {"fastack": True}
    plain_options: dict[str, Any] = {"fastack": False} if where == "worker" else {}
    right_after: dict[str, tuple[str, JobInfo | None]] = {}

    class ShowWorker(Worker):
        """Asks SHOW the moment the job's outcome is known (outermost piece)."""

        def chain(self) -> list[Middleware]:
            return [self.show, *super().chain()]

        async def show(self, ctx: JobContext, call_next: Next) -> None:
            await call_next()
            right_after[ctx.job.id] = (ctx.outcome, await ctx.client.show(ctx.job.id))

    worker = ShowWorker(url(node), fastack=where == "worker", fetch_timeout=0.2)

    @worker.handler("fast", concurrency=3, **fast_options)
    async def fast(job: Job) -> None:
        await anyio.sleep(0.01)

    @worker.handler("plain", **plain_options)
    async def plain(job: Job) -> None:
        await anyio.sleep(0.01)

    monitor = Monitor(node.port)
    async with anyio.create_task_group() as watching:
        await watching.start(monitor.run)
        with Client(url(node)) as c:
            fast_ids = {c.add_job("fast", f"f{i}") for i in range(6)}
            plain_ids = {c.add_job("plain", f"p{i}") for i in range(2)}
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                await wait_until(lambda: right_after.keys() == fast_ids | plain_ids)
                worker.stop()
            # Everything the worker sent is in the feed once this is.
            assert c.call("PING", "the end") == b"the end"
            await wait_until(lambda: ["PING", "the end"] in monitor.commands)
            stats = dict(
                line.split(":", 1)
                for line in c.info("stats").splitlines()
                if ":" in line and not line.startswith("#")
            )
        watching.cancel_scope.cancel()
    # Acknowledged, and gone from the node at once: SHOW right after the
    # FASTACK has nothing.
    assert [right_after[i] for i in fast_ids] == [("done", None)] * len(fast_ids)
    assert [right_after[i][0] for i in plain_ids] == ["done"] * len(plain_ids)
    # The node saw each fast job in a FASTACK, once, and ACKJOB only for
    # the others.
    assert sorted(monitor.ids("FASTACK")) == sorted(fast_ids)
    assert sorted(monitor.ids("ACKJOB")) == sorted(plain_ids)
    # Its counter of acknowledgements counts ACKJOBs only.
    assert int(stats["acked_jobs"]) == len(plain_ids)


async def _run_until(worker: Worker, done: Callable[[], bool], timeout: float = 10.0) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(done, timeout)
        worker.stop()


class Delaying(anyio.abc.ByteStream):
    """A connection to the node whose sends go through ``before_send``
    (the worker's client, given ``connector=``): to delay or break the
    acknowledgements."""

    def __init__(
        self, inner: anyio.abc.ByteStream, before_send: Callable[[bytes], Awaitable[None]]
    ) -> None:
        self.inner = inner
        self.before_send = before_send

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.inner.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self.before_send(item)
        await self.inner.send(item)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _connector(before_send: Callable[[bytes], Awaitable[None]]) -> Any:
    async def connect(host: str, port: int) -> anyio.abc.ByteStream:
        return Delaying(await anyio.connect_tcp(host, port), before_send)

    return connect


class Outcomes(Worker):
    """Notes each job's outcome, as the job log and the metrics see it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, tuple[str, str]] = {}

    def chain(self) -> list[Middleware]:
        return [self.note, *super().chain()]

    async def note(self, ctx: JobContext, call_next: Next) -> None:
        try:
            await call_next()
        finally:  # cancelled too (a stop at once)
            self.outcomes[ctx.job.id] = (ctx.outcome, type(ctx.error).__name__)


@pytest.mark.anyio
async def test_acks_are_batched_and_each_job_is_acked_once(node: NodeProcess) -> None:
    """Jobs that finish together are acknowledged by one ACKJOB (far fewer
    commands than jobs); each ID is sent once, and the job counts as done
    once the node answered it."""
    worker = Outcomes(url(node))
    outcomes = worker.outcomes

    @worker.handler("many", concurrency=50)
    async def noop(job: Job) -> None:
        pass

    monitor = Monitor(node.port)
    async with anyio.create_task_group() as watching:
        await watching.start(monitor.run)
        with Client(url(node)) as c:
            ids = {c.add_job("many", str(i)) for i in range(300)}
            await _run_until(worker, lambda: outcomes.keys() == ids)
            assert c.call("PING", "the end") == b"the end"
            await wait_until(lambda: ["PING", "the end"] in monitor.commands)
            assert all(c.show(i) is None for i in ids)
        watching.cancel_scope.cancel()
    monitor.commands = monitor.commands[: monitor.commands.index(["PING", "the end"])]
    assert set(outcomes.values()) == {("done", "NoneType")}
    acks = [argv for argv in monitor.commands if argv[:1] == ["ACKJOB"]]
    assert sorted(monitor.ids("ACKJOB")) == sorted(ids)
    assert len(acks) <= len(ids) // 10, [len(a) - 1 for a in acks]
    # Short jobs cost no keep-alive command.
    assert not [a for a in monitor.commands if a[:1] in (["SHOW"], ["WORKING"])]


@pytest.mark.anyio
async def test_jobs_coming_one_by_one_are_fetched_and_acked_several_at_a_time(
    node: NodeProcess,
) -> None:
    """A producer adding jobs one call at a time: a fetch or an ack batch
    that comes out small lingers for more (50 ms here, for a loaded
    machine's producer; 5 ms by default), so the worker sends far fewer
    GETJOBs and ACKJOBs than there are jobs (about one of each per job
    without)."""
    worker = Outcomes(url(node), fetch_timeout=0.5, linger=0.05)

    @worker.handler("trickle", concurrency=50)
    async def noop(job: Job) -> None:
        pass

    monitor = Monitor(node.port)
    async with anyio.create_task_group() as watching:
        await watching.start(monitor.run)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            async with AsyncClient(url(node)) as producer:
                ids = set()
                for i in range(100):
                    ids.add(await producer.add_job("trickle", str(i)))
                    await anyio.sleep(0.0005)
            await wait_until(lambda: worker.outcomes.keys() == ids)
            worker.stop()
        watching.cancel_scope.cancel()
    assert set(worker.outcomes.values()) == {("done", "NoneType")}
    getjobs = [a for a in monitor.commands if a[:1] == ["GETJOB"]]
    acks = [a for a in monitor.commands if a[:1] == ["ACKJOB"]]
    assert sorted(monitor.ids("ACKJOB")) == sorted(ids)
    assert len(getjobs) <= 50 and len(acks) <= 50, (len(getjobs), len(acks))


@pytest.mark.anyio
async def test_a_lost_acknowledgement_is_the_outcome_of_its_jobs(node: NodeProcess) -> None:
    """The ACKJOB of a batch breaks its connection: every job of it is
    "lost" (not "done"), and still on the node, to come back at its RETRY."""

    async def break_acks(data: bytes) -> None:
        if b"ACKJOB" in data:
            raise anyio.BrokenResourceError

    with Client(url(node)) as c:
        ids = {c.add_job("lossy", str(i), retry=30) for i in range(5)}
    worker = Outcomes(url(node), connector=_connector(break_acks), max_attempts=1)

    @worker.handler("lossy", concurrency=5)
    async def noop(job: Job) -> None:
        pass

    await _run_until(worker, lambda: worker.outcomes.keys() == ids)
    assert set(worker.outcomes.values()) == {("lost", "ConnectionLostError")}
    with Client(url(node)) as c:
        assert all(c.show(i).state == "active" for i in ids)  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_stop_at_once_waits_for_the_acks_on_their_way(node: NodeProcess) -> None:
    """Stopped at once while a batch's ACKJOB is on its way (slow here):
    the handlers' tasks are cancelled, yet the ack goes out, and the jobs'
    outcome is its answer."""
    handled: set[str] = set()

    async def slow_acks(data: bytes) -> None:
        if b"ACKJOB" in data:
            await anyio.sleep(0.5)

    with Client(url(node)) as c:
        ids = {c.add_job("slow", str(i)) for i in range(3)}
    worker = Outcomes(url(node), connector=_connector(slow_acks), fetch_timeout=0.2)

    @worker.handler("slow", concurrency=3)
    async def noop(job: Job) -> None:
        handled.add(job.id)

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(lambda: handled == ids)
        await anyio.sleep(0.1)  # the ACKJOB is being sent
        worker.stop(now=True)
    assert {i: worker.outcomes[i][0] for i in ids} == dict.fromkeys(ids, "done")
    with Client(url(node)) as c:
        assert all(c.show(i) is None for i in ids)


@pytest.mark.anyio
async def test_keep_alive_only_for_jobs_that_run_long_enough(node: NodeProcess) -> None:
    """Short jobs get no SHOW and no WORKING. Long ones (RETRY 2 s, running
    2.7 s): their RETRY is read (SHOW) once they have run half the shortest
    RETRY there is, then WORKING every second keeps them from being queued
    again while they run."""
    with Client(url(node)) as c:
        short_ids = {c.add_job("short", str(i), retry=1) for i in range(40)}
        long_ids = {c.add_job("long", str(i), retry=2) for i in range(2)}
    recorder = Recorder()
    worker = Worker(url(node), middleware=[recorder])
    runs: list[str] = []

    @worker.handler("short", concurrency=10)
    async def short(job: Job) -> None:
        await anyio.sleep(0.01)

    @worker.handler("long", concurrency=2)
    async def long(job: Job) -> None:
        runs.append(job.id)
        await anyio.sleep(2.7)

    monitor = Monitor(node.port)
    async with anyio.create_task_group() as watching:
        await watching.start(monitor.run)
        await _run_until(worker, lambda: recorder.notes.keys() == short_ids | long_ids)
        watching.cancel_scope.cancel()
    assert sorted(runs) == sorted(long_ids)  # never queued again meanwhile
    shows = monitor.ids("SHOW")
    assert shows and set(shows) <= long_ids  # once per queue, twice if both raced
    assert sorted(set(monitor.ids("WORKING"))) == sorted(long_ids)
    assert all(recorder.notes[i]["working"] == 2 for i in long_ids), recorder.notes
    assert not [i for i in short_ids if "working" in recorder.notes[i]]


@pytest.mark.anyio
async def test_a_job_interrupted_by_six_stops_still_runs_and_succeeds(node: NodeProcess) -> None:
    """A stop gives a running job back with ENQUEUE: a delivery more, no
    failure. Six stops in a row leave it with six additional deliveries
    and no NACK; the seventh worker runs it to the end (the default
    max_retries, 4, and the old max_deliveries, 5, are both below that)."""
    with Client(url(node)) as c:
        job_id = c.add_job("restarts", "x")
    seen: list[tuple[int, int]] = []
    done: list[str] = []
    worker = Worker(url(node), shutdown_timeout=0.1, fetch_timeout=0.2)

    @worker.handler("restarts")
    async def handle(job: Job) -> None:
        seen.append((job.nacks, job.additional_deliveries))
        if len(seen) <= 6:
            await anyio.sleep(60)  # interrupted by the stop
        done.append(job.id)

    for stop in range(1, 7):
        await _run_until(worker, functools.partial(lambda n: len(seen) == n, stop))
        with Client(url(node)) as c:
            info = c.show(job_id)
        assert info is not None and info.state == "queued"
        assert (info.nacks, info.additional_deliveries) == (0, stop)
    await _run_until(worker, lambda: bool(done))
    assert seen == [(0, n) for n in range(7)]
    with Client(url(node)) as c:
        assert done == [job_id] and c.show(job_id) is None  # acknowledged at last
    with Client(url(node)) as c:
        assert c.qlen("restarts:dead") == 0


@pytest.mark.anyio
async def test_failures_not_interruptions_lead_to_the_dead_letter(node: NodeProcess) -> None:
    """max_retries counts failures (the job's NACKs): a job interrupted
    twice, then failing, is retried max_retries times before it goes to
    the dead letters. A handler's own max_retries replaces the worker's."""
    with Client(url(node)) as c:
        job_id = c.add_job("flaky", "x")
        strict_id = c.add_job("strict", "y")
    attempts: list[tuple[str, int, int]] = []

    def make_worker() -> Worker:
        worker = Worker(url(node), max_retries=2, shutdown_timeout=0.1, fetch_timeout=0.2)

        @worker.handler("flaky")
        async def flaky(job: Job) -> None:
            attempts.append((job.id, job.nacks, job.additional_deliveries))
            if job.additional_deliveries < 2:
                await anyio.sleep(60)  # interrupted by the stop
            raise ValueError("no luck")

        @worker.handler("strict", max_retries=0)
        async def strict(job: Job) -> None:
            attempts.append((job.id, job.nacks, job.additional_deliveries))
            raise ValueError("never")

        return worker

    for runs in (2, 3):  # the first worker gets both jobs, the second only one
        await _run_until(make_worker(), functools.partial(lambda n: len(attempts) >= n, runs))
    with Client(url(node)) as c:
        await _run_until(make_worker(), lambda: c.qlen("flaky:dead") == 1, timeout=15)
        letter = DeadLetter.from_body(c.get_job("flaky:dead", timeout=2).body)  # type: ignore[union-attr]
        strict_letter = DeadLetter.from_body(c.get_job("strict:dead", timeout=2).body)  # type: ignore[union-attr]
    flaky_runs = [(n, a) for i, n, a in attempts if i == job_id]
    assert flaky_runs == [(0, 0), (0, 1), (0, 2), (1, 2), (2, 2)]
    assert (letter.id, letter.nacks, letter.additional_deliveries) == (job_id, 2, 2)
    assert letter.error == "ValueError: no luck" and letter.deliveries == 5
    assert [(n, a) for i, n, a in attempts if i == strict_id] == [(0, 0)]
    assert (strict_letter.id, strict_letter.nacks) == (strict_id, 0)


@pytest.mark.anyio
async def test_a_failed_job_is_retried_after_an_exponential_back_off(node: NodeProcess) -> None:
    """Each failure NACKs with a DELAY: min_backoff doubled for each
    failure before (the job's nacks), at most max_backoff, from half to
    all of it at random, in whole seconds; the node does not deliver the
    job again before. After max_retries failures, the dead letter as ever.
    A handler's min_backoff 0 NACKs at once."""
    with Client(url(node)) as c:
        job_id = c.add_job("flaky", "x", retry=30)
        eager_id = c.add_job("eager", "y", retry=30)
    worker = Worker(url(node), max_retries=3, min_backoff=1, max_backoff=2, fetch_timeout=0.2)
    attempts: list[tuple[int, float]] = []

    @worker.handler("flaky")
    async def flaky(job: Job) -> None:
        attempts.append((job.nacks, anyio.current_time()))
        raise ValueError("down")

    @worker.handler("eager", max_retries=1, min_backoff=0)
    async def eager(job: Job) -> None:
        raise ValueError("at once")

    monitor = Monitor(node.port)
    async with anyio.create_task_group() as watching:
        await watching.start(monitor.run)
        with Client(url(node)) as c:
            dead = lambda: c.qlen("flaky:dead") == 1 and c.qlen("eager:dead") == 1  # noqa: E731
            await _run_until(worker, dead, timeout=20)
            letter = DeadLetter.from_body(c.get_job("flaky:dead", timeout=2).body)  # type: ignore[union-attr]
        watching.cancel_scope.cancel()
    nacks = [argv[1:] for argv in monitor.commands if argv[:1] == ["NACK"]]
    flaky_nacks = [argv[1:] for argv in nacks if argv[0] == job_id]
    assert [a[0] for a in flaky_nacks] == ["DELAY"] * 3
    delays = [int(a[1]) for a in flaky_nacks]
    # Ceilings 1, 2 and 2 (max_backoff) seconds, from half to all of each.
    assert delays[0] == 1 and delays[1] in (1, 2) and delays[2] in (1, 2), delays
    assert [n for n, _ in attempts] == [0, 1, 2, 3]
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(attempts)]
    assert all(gap >= delay - 0.05 for gap, delay in zip(gaps, delays, strict=True)), gaps
    assert (letter.id, letter.nacks, letter.error) == (job_id, 3, "ValueError: down")
    assert [a for a in nacks if a[0] == eager_id] == [[eager_id]]  # no DELAY


# ------------------------------------------------------------ the process


WORKER_MODULE = """
import time
import anyio
from disque_trio.worker import Worker

worker = Worker("{url}", shutdown_timeout={grace})

@worker.handler("tasks", concurrency=4)
async def handle(job):
    print("start", job.id, flush=True)
    await anyio.sleep(float(job.body))
    print("end", job.id, flush=True)
"""


def _start_worker(
    tmp_path: Path, node: NodeProcess, grace: float, *extra: str
) -> subprocess.Popen[str]:
    (tmp_path / "myapp_tasks.py").write_text(
        textwrap.dedent(WORKER_MODULE).format(url=url(node), grace=grace)
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "disque_trio",
            "worker",
            "myapp_tasks:worker",
            "--log-format",
            "json",
            *extra,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 20) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(
        f"no line {prefix!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    )


def _json_logs(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_sigterm_lets_the_running_job_finish(tmp_path: Path, node: NodeProcess) -> None:
    # A job done is logged at DEBUG (docs/worker.md, "Logs").
    proc = _start_worker(tmp_path, node, 10, "--log-level", "debug")
    try:
        with Client(url(node)) as c:
            job_id = c.add_job("tasks", "1.5")
            _wait_for_line(proc, "start")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            assert f"end {job_id}" in out
            assert c.show(job_id) is None  # acknowledged
        logs = _json_logs(err)
        done = [r for r in logs if r.get("event") == "job"]
        assert done and done[0]["outcome"] == "done" and done[0]["job_id"] == job_id
        assert done[0]["queue"] == "tasks" and done[0]["duration_ms"] >= 1400
        assert any("SIGTERM" in r["message"] for r in logs)
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_sigterm_grace_then_give_back_and_second_signal_stops_at_once(
    tmp_path: Path, node: NodeProcess
) -> None:
    proc = _start_worker(tmp_path, node, grace=1)
    try:
        with Client(url(node)) as c:
            job_id = c.add_job("tasks", "60")
            _wait_for_line(proc, "start")
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            info = c.show(job_id)
            assert info is not None and info.state == "queued"
            assert (info.nacks, info.additional_deliveries) == (0, 1)
            interrupted = [r for r in _json_logs(err) if r.get("event") == "job"]
            assert interrupted[0]["outcome"] == "interrupted"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    proc = _start_worker(tmp_path, node, grace=60)
    try:
        with Client(url(node)) as c:
            _wait_for_line(proc, "start")  # the same job, delivered again
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            assert time.monotonic() - t0 < 5
            info = c.show(job_id)
            # Given back again (twice if a fetch in flight got it back meanwhile).
            assert info is not None and info.state == "queued" and info.nacks == 0
            assert info.additional_deliveries in (2, 3)
            assert "stopping at once" in err
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_worker_command_errors(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "disque_trio", "worker", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("nope_module:worker").returncode == 1
    (tmp_path / "notaworker.py").write_text("worker = 42\n")
    result = run("notaworker:worker")
    assert result.returncode != 0 and "not a disque_trio.worker.Worker" in result.stderr
    assert "MODULE:ATTRIBUTE" in run("--help").stdout
