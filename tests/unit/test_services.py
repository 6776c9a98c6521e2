"""Each service of the shell through its narrow interface, with fakes (h11's
ConnectionPair style: the service on one side, a scripted peer on the
other). The whole node is tested elsewhere; here each piece alone."""

from __future__ import annotations

import errno
import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from disque_trio.config import Config
from disque_trio.core.effects import Persist
from disque_trio.core.node import Node
from disque_trio.core.waiters import Waiter
from disque_trio.env import Alarm, Env, ScopeAlarm, TrioClock
from disque_trio.protocol import aof as aof_records
from disque_trio.protocol.replies import NULL_ARRAY, Reply, Status
from disque_trio.protocol.resp import NOT_READY, ReplyReader
from disque_trio.server.aof import AppendOnlyFile
from disque_trio.server.client import Client
from disque_trio.server.connections import serve_client
from disque_trio.server.delivery import Delivery
from disque_trio.server.timer import CRON_PERIOD_S, MAX_SLEEP_S, Cron, Timer
from sim.clock import TimerAlarm, Timers
from sim.disk import DiskHandle, SimDisk

from .core_support import add


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --------------------------------------------------------------- Timer


@pytest.fixture(params=["scope", "virtual"])
def alarm(request: pytest.FixtureRequest, clock: trio.testing.MockClock) -> Alarm | None:
    """The timer's two alarms: the node's (a cancel scope whose deadline
    moves) and the simulator's (its virtual timers): the same ticks."""
    return None if request.param == "scope" else TimerAlarm(Timers(clock))


async def test_timer_ticks_at_the_deadline_and_earlier_when_rescheduled(
    clock: trio.testing.MockClock, alarm: Alarm | None
) -> None:
    # The tick runs what is due, as the node's does; the timer also wakes
    # with nothing due, at least every MAX_SLEEP_S, to notice clock jumps.
    due: list[int | None] = [5_000]
    wakes: list[float] = []
    ticks: list[float] = []

    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    def tick() -> None:
        wakes.append(trio.current_time())
        if due[0] is not None and now_ms() >= due[0]:
            ticks.append(trio.current_time())
            due[0] = None

    timer = Timer(lambda: due[0], now_ms, tick, alarm)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        await trio.sleep(0.5)
        due[0] = 2_000
        timer.reschedule(2_000)  # a commit moved it earlier
        await trio.sleep(1.6)
        assert ticks == [pytest.approx(2.0)]
        assert wakes == [pytest.approx(MAX_SLEEP_S), pytest.approx(2.0)]
        # With nothing due it still wakes every MAX_SLEEP_S (clock jumps).
        await trio.sleep(2 * MAX_SLEEP_S + 0.01)
        assert wakes[2:] == [
            pytest.approx(2.0 + MAX_SLEEP_S),
            pytest.approx(2.0 + 2 * MAX_SLEEP_S),
        ]
        nursery.cancel_scope.cancel()


async def test_a_reschedule_never_stretches_the_sleep_past_max_sleep(
    clock: trio.testing.MockClock, alarm: Alarm | None
) -> None:
    # Node time stepped back a minute while the timer slept: the deadline a
    # commit reports is now far off in node time. The timer must still look
    # at the clock within MAX_SLEEP_S (seed 198: a minute's sleep held a job
    # past its TTL).
    offset = [0]
    due: list[int | None] = [None]
    wakes: list[float] = []

    def now_ms() -> int:
        return int(trio.current_time() * 1000) + offset[0]

    timer = Timer(lambda: due[0], now_ms, lambda: wakes.append(trio.current_time()), alarm)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        await trio.sleep(0.2)
        offset[0] = -60_000
        due[0] = 1_000
        timer.reschedule(1_000)
        await trio.sleep(MAX_SLEEP_S)
        assert wakes == [pytest.approx(MAX_SLEEP_S)]
        nursery.cancel_scope.cancel()


async def test_a_later_deadline_does_not_delay_an_earlier_one(
    clock: trio.testing.MockClock, alarm: Alarm | None
) -> None:
    due: list[int | None] = [300]
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(trio.current_time())
        due[0] = None

    timer = Timer(lambda: due[0], lambda: int(trio.current_time() * 1000), tick, alarm)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        await trio.sleep(0.1)
        timer.reschedule(900)  # later than the one it sleeps for: ignored
        await trio.sleep(0.25)
        assert ticks == [pytest.approx(0.3)]
        nursery.cancel_scope.cancel()


async def test_each_timer_runs_at_its_own_millisecond(
    clock: trio.testing.MockClock, alarm: Alarm | None
) -> None:
    # Jobs due at 501, 504, 509 and 513 ms, and one at 502 ms added while the
    # timer sleeps for 501: a tick at each one's millisecond, never before it
    # is due and never rounded to a shared grid (two holders of one job whose
    # re-queue times fell in one 10 ms grain both re-queued at its end).
    pending = [501, 504, 509, 513]
    ticks: list[tuple[int, list[int]]] = []

    def now_ms() -> int:
        return round(trio.current_time() * 1000)

    def tick() -> None:
        now = now_ms()
        ran = [due for due in pending if due <= now]
        pending[:] = [due for due in pending if due > now]
        ticks.append((now, ran))

    timer = Timer(lambda: min(pending, default=None), now_ms, tick, alarm)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        await trio.sleep(0.2)
        pending.append(502)
        timer.reschedule(502)  # later than the one it sleeps for: kept
        await trio.sleep(0.4)
        nursery.cancel_scope.cancel()
    assert ticks == [(501, [501]), (502, [502]), (504, [504]), (509, [509]), (513, [513])]


async def test_an_alarm_cancelled_while_it_sleeps_never_fires(
    clock: trio.testing.MockClock, alarm: Alarm | None
) -> None:
    """A sleep cancelled from outside (the node stopping) leaves nothing
    armed: its deadline passes and then a new sleep runs to its own end; a
    move to a time already past wakes it at once."""
    chosen = alarm if alarm is not None else ScopeAlarm()
    with trio.move_on_after(1):
        await chosen.sleep_until(5)
    assert trio.current_time() == pytest.approx(1)
    chosen.move(2)  # nothing sleeps: nothing to move
    await chosen.sleep_until(8)
    assert trio.current_time() == pytest.approx(8)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chosen.sleep_until, 20)
        await trio.sleep(1)
        chosen.move(trio.current_time() - 0.5)
    assert trio.current_time() == pytest.approx(9)


async def test_cron_runs_ten_times_a_second_and_once_a_second(
    clock: trio.testing.MockClock,
) -> None:
    counts = {"tick": 0, "second": 0}
    cron = Cron(
        lambda: counts.__setitem__("tick", counts["tick"] + 1),
        lambda: counts.__setitem__("second", counts["second"] + 1),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cron.run)
        await trio.sleep(3 + CRON_PERIOD_S / 2)
        nursery.cancel_scope.cancel()
    assert counts == {"tick": 30, "second": 3}


# ------------------------------------------------------------ Delivery


class FakeDeliveryHost:
    """Queues with waiting consumers, and a federation deadline each."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}  # queue -> consumers still waiting
        self.jobs: dict[str, int] = {}
        self.due: dict[str, int | None] = {}
        self.served: list[str] = []
        self.asked: list[tuple[str, float]] = []

    def serve_queue(self, name: str) -> bool:
        self.served.append(name)
        handed = min(self.waiting.get(name, 0), self.jobs.get(name, 0))
        self.waiting[name] = self.waiting.get(name, 0) - handed
        self.jobs[name] = self.jobs.get(name, 0) - handed
        return self.waiting[name] > 0

    def federation_due(self, name: str) -> int | None:
        return self.due.get(name)

    def ask_for_jobs(self, name: str) -> None:
        self.asked.append((name, trio.current_time()))
        self.due[name] = None

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)


async def test_delivery_runs_a_task_per_queue_only_while_consumers_wait(
    clock: trio.testing.MockClock,
) -> None:
    host = FakeDeliveryHost()
    delivery = Delivery(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(delivery.run)
        host.waiting["q"] = 2
        delivery.wake("q")  # a consumer blocked
        await trio.sleep(0.01)
        assert delivery.tasks == 1 and host.served == ["q"]
        host.jobs["q"] = 1
        delivery.wake("q")  # a job arrived: one consumer served
        await trio.sleep(0.01)
        assert host.served == ["q", "q"] and delivery.tasks == 1
        host.jobs["q"] = 1
        delivery.wake("q")  # the last consumer served: the task ends
        await trio.sleep(0.01)
        assert delivery.tasks == 0
        host.waiting["empty"] = 0
        delivery.wake("empty")  # nobody waits: a round, then nothing
        await trio.sleep(0.01)
        assert delivery.tasks == 0
        nursery.cancel_scope.cancel()


async def test_delivery_asks_other_nodes_at_the_federation_deadline(
    clock: trio.testing.MockClock,
) -> None:
    host = FakeDeliveryHost()
    delivery = Delivery(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(delivery.run)
        host.waiting["q"] = 1
        host.due["q"] = 2_500  # node-time ms
        delivery.wake("q")
        await trio.sleep(3)
        assert host.asked == [("q", pytest.approx(2.5))]
        nursery.cancel_scope.cancel()


# --------------------------------------------------------- AOF writer


@attrs.define
class FakeAofHost:
    config: Config
    env: Env
    node: Node

    def held_sent(self) -> None:
        pass


class CountingDisk(DiskHandle):
    def __init__(self, disk: SimDisk, fail: bool = False) -> None:
        super().__init__(disk)
        self.writes = 0
        self.fail = fail

    def append(self, path: str, data: bytes) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        self.writes += 1
        super().append(path, data)


def aof_for(policy: str, fail: bool = False) -> tuple[AppendOnlyFile, CountingDisk, SimDisk]:
    sim_disk = SimDisk()
    disk = CountingDisk(sim_disk, fail)
    env = Env(clock=TrioClock(), rng=random.Random(1), net=None, disk=disk)  # type: ignore[arg-type]
    config = Config.load(None, [("appendfsync", [policy])])
    aof = AppendOnlyFile(FakeAofHost(config, env, Node("a" * 40, env.clock, env.rng)))
    aof.state = "on"
    return aof, disk, sim_disk


async def test_aof_group_commit_one_write_and_one_fsync_per_round() -> None:
    aof, disk, sim_disk = aof_for("always")
    released: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        # Three clients commit in the same scheduler pass.
        seqs = [aof.append([f"record {n}\n".encode()]) for n in range(3)]
        aof.after_written(seqs[-1], lambda: released.append("GOTJOB"))
        assert aof.pending == seqs[-1] and released == []
        assert await aof.written(seqs[0]) and await aof.written(seqs[-1])
        assert (disk.writes, sim_disk.fsyncs) == (1, 1)
        assert sim_disk.durable[aof.path] == b"record 0\nrecord 1\nrecord 2\n"
        assert released == ["GOTJOB"] and aof.pending == 0
        nursery.cancel_scope.cancel()


async def test_aof_everysec_writes_now_and_fsyncs_when_asked() -> None:
    aof, disk, sim_disk = aof_for("everysec")
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        assert await aof.written(aof.append([b"x\n"]))
        assert (disk.writes, sim_disk.fsyncs) == (1, 0)
        aof.every_second()  # the cron
        await trio.sleep(0)
        await trio.sleep(0)
        assert sim_disk.fsyncs == 1
        nursery.cancel_scope.cancel()


async def test_aof_write_failure_holds_back_what_depended_on_it_until_a_retry_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk: the records stay in memory, what waits for them waits
    (a reply, a GOTJOB), write commands get MISCONF; the writer retries
    only when the cron says (once a second), not at every append; once a
    retry works, everything is written once, in order, and released. One
    log line when it fails, one when it works again."""
    aof, disk, sim_disk = aof_for("always", fail=True)
    released: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        seq = aof.append([b"x\n"])
        aof.after_written(seq, lambda: released.append("GOTJOB"))
        await trio.testing.wait_all_tasks_blocked()
        assert aof.misconf() is not None and aof.pending == seq
        later = aof.append([b"y\n"])  # a timer's record meanwhile: no retry
        await trio.testing.wait_all_tasks_blocked()
        assert disk.writes == 0 and released == [] and aof.failing
        aof.every_second()  # the cron's retry: still full
        await trio.testing.wait_all_tasks_blocked()
        assert aof.failing and dict(aof.info())["aof_buffer_length"] == 4
        disk.fail = False  # space again
        aof.every_second()
        assert await aof.written(later)
        assert sim_disk.durable[aof.path] == b"x\ny\n" and disk.writes == 1
        assert released == ["GOTJOB"] and aof.misconf() is None
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "disque_trio.aof"]
    assert len(lines) == 2, lines
    assert "No space left on device" in lines[0] and "looks solved" in lines[1]


async def test_a_rewrite_that_works_ends_a_write_failure() -> None:
    aof, _, sim_disk = aof_for("everysec", fail=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        seq = aof.append([b"lost?\n"])
        await trio.testing.wait_all_tasks_blocked()
        assert aof.failing
        assert await aof.rewrite()  # replace() works where append() failed
        assert await aof.written(seq) and not aof.failing
        assert dict(aof.info())["aof_buffer_length"] == 0
        assert aof.path in sim_disk.durable
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("end", ["cron", "shutdown"])
async def test_a_failed_fsync_is_not_retried_but_the_file_rewritten(
    end: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An fsync that fails (EIO) may have dropped what was written since
    the last good one, and a later fsync answers success all the same
    (SimDisk keeps those bytes in limbo, as Linux does). The reply waits;
    once the disk works, the file is rewritten from memory, not fsynced
    again, so the job is durable before anyone hears of it."""
    aof, _, sim_disk = aof_for("always")
    node = aof.server.node
    node.persisting = True
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        job_id = add(node, "q", "kept")
        records = [e.record for e in node.effects if isinstance(e, Persist)]
        node.effects.clear()
        assert records
        sim_disk.fail(errno.EIO, writes=False)  # appends reach the cache only
        seq = aof.append(records)
        await trio.testing.wait_all_tasks_blocked()
        assert aof.failing and aof.pending == seq and sim_disk.limbo_bytes > 0
        assert job_id.encode() not in sim_disk.durable.get(aof.path, b"")
        sim_disk.heal()
        if end == "cron":
            aof.every_second()
            assert await aof.written(seq) and not aof.failing
        else:
            aof.write_now(force=True)  # NodeServer.shutdown
            assert aof.pending == 0 and not aof.failing
        assert job_id.encode() in sim_disk.durable[aof.path]
        sim_disk.crash()
        assert job_id.encode() in (sim_disk.read(aof.path) or b"")
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "disque_trio.aof"]
    assert any("fsync of the AOF file" in line for line in lines), lines


async def test_a_torn_aof_that_cannot_be_cut_on_a_full_disk_loads_and_is_rewritten() -> None:
    """At start-up the AOF ends in a torn record and the disk is full, so
    the cut cannot be written (simulator seed 42: the node's start ended in
    the exception). The node loads what is whole, refuses writes, and once
    the disk works rewrites the file from memory: appends never land after
    the torn bytes."""
    aof, _, sim_disk = aof_for("always")
    node = aof.server.node
    node.persisting = True
    job_id = add(node, "q", "kept")
    records = b"".join(e.record for e in node.effects if isinstance(e, Persist))
    node.effects.clear()
    aof.state = "off"
    node.jobs.clear()
    node.queues.clear()
    sim_disk.replace(aof.path, records + records[:7])  # a torn record after a whole one
    sim_disk.fail(errno.ENOSPC, writes=True)
    assert aof.load() == 1 and job_id in node.jobs
    assert aof.failing and aof.misconf() is not None
    sim_disk.heal()
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        aof.every_second()
        await trio.testing.wait_all_tasks_blocked()
        assert not aof.failing
        data = sim_disk.durable[aof.path]
        whole = list(aof_records.records(data))
        assert whole and whole[-1][1] == len(data) and job_id.encode() in data
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["background", "shutdown"])
async def test_aof_rewrites_keep_the_pending_holders(how: str) -> None:
    """A holder still in its handshake when a peer's list named it is
    written with the job's record (seed 594353), by rewrites too."""
    aof, _, sim_disk = aof_for("always")
    node = aof.server.node
    third = "5a5a5a5a" * 5
    held, alone = (add(node, "q", body, "RETRY", 5) for body in ("held", "alone"))
    node.pending_holders[third] = {held}
    async with trio.open_nursery() as nursery:
        await nursery.start(aof.run)
        if how == "background":
            assert await aof.rewrite()
        else:
            aof.shutdown_rewrite()
        nursery.cancel_scope.cancel()
    written = {
        rec.id: rec.pending
        for _, _, (kind, rec) in aof_records.records(sim_disk.durable[aof.path])
        if isinstance(rec, aof_records.JobRecord)
    }
    assert written == {held: (third,), alone: ()}


def test_turning_the_aof_off_releases_what_waited_for_a_failed_write() -> None:
    aof, _, _ = aof_for("always", fail=True)
    seq = aof.append([b"x\n"])
    aof.write_now()
    assert aof.failing and aof.pending == seq
    aof.turn_off()
    assert aof.pending == 0 and aof.misconf() is None


# --------------------------------------------------- client connections


class FakeClientHost:
    """A node as a connection sees it: commands answer from a table; a
    blocking one returns a Waiter; durability is a gate the test opens."""

    def __init__(self) -> None:
        self.config = Config.load(None, [])
        self.stat_net_in = self.stat_net_out = self.stat_query_buffer_closed = 0
        self.waiters: list[Waiter] = []
        self.cancelled: list[tuple[Waiter, float]] = []
        self.dropped: list[Client] = []
        self.durable_gate = trio.Event()
        self.durable_gate.set()
        self.seq = 0

    def new_client(self, stream: trio.abc.Stream) -> Client | None:
        return Client(1, "test", "test", 0, "normal")

    def wall_ms(self) -> int:
        return 0

    def drop_client(self, client: Client) -> None:
        self.dropped.append(client)

    def execute(self, client: Client, argv: list[bytes]) -> Reply | Waiter:
        if argv[0] == b"BLOCK":
            waiter = Waiter(queues=("q",), timeout_ms=60_000)
            self.waiters.append(waiter)
            return waiter
        if argv[0] == b"ADDJOB":  # a synchronous ADDJOB waiting for its copies
            waiter = Waiter(timeout_ms=60_000, job_id=f"job-{len(self.waiters)}")
            self.waiters.append(waiter)
            return waiter
        if argv[0] == b"WRITE":
            self.seq += 1
        return Status(argv[0].decode())

    def cancel_wait(self, waiter: Waiter) -> Reply:
        waiter.done = True
        self.cancelled.append((waiter, trio.current_time()))
        return NULL_ARRAY

    def commit(self) -> int:
        return self.seq

    async def durable(self, seq: int) -> bool:
        await self.durable_gate.wait()
        return True

    def monitor_feed(self, client: Client) -> trio.MemoryReceiveChannel[bytes]:
        raise NotImplementedError


async def _read_reply(stream: trio.abc.Stream, reader: ReplyReader) -> Any:
    while True:
        reply = reader.next_reply()
        if reply is not NOT_READY:
            return reply
        reader.feed(await stream.receive_some(65536))


async def test_a_client_that_leaves_while_blocked_is_noticed_at_once(
    clock: trio.testing.MockClock,
) -> None:
    host = FakeClientHost()
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_client, host, theirs)
        await ours.send_all(b"PING\r\nBLOCK\r\n")
        reader = ReplyReader()
        assert await _read_reply(ours, reader) == Status("PING")
        await trio.sleep(1)
        assert len(host.waiters) == 1 and not host.cancelled
        started = trio.current_time()
        await ours.aclose()  # gone while blocked, 59 s before the timeout
        await trio.sleep(0.01)
    [(waiter, when)] = host.cancelled
    assert waiter is host.waiters[0] and when - started < 0.01 and host.dropped


async def test_replies_wait_for_their_records_to_be_written(
    clock: trio.testing.MockClock,
) -> None:
    host = FakeClientHost()
    host.durable_gate = trio.Event()  # the AOF writer has not run yet
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_client, host, theirs)
        await ours.send_all(b"WRITE\r\nPING\r\n")
        with trio.move_on_after(1):
            data = await ours.receive_some(100)
            pytest.fail(f"a reply went out before its record was written: {data!r}")
        host.durable_gate.set()
        reader = ReplyReader()
        assert await _read_reply(ours, reader) == Status("WRITE")
        assert await _read_reply(ours, reader) == Status("PING")
        await ours.aclose()


async def test_pipelined_input_read_while_blocked_runs_after_it(
    clock: trio.testing.MockClock,
) -> None:
    host = FakeClientHost()
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_client, host, theirs)
        await ours.send_all(b"BLOCK\r\n")
        await trio.sleep(0.1)
        await ours.send_all(b"AFTER\r\n")  # the reader takes it, the executor waits
        await trio.sleep(0.1)
        [waiter] = host.waiters
        waiter.finish([b"a job"])
        waiter.wake()
        reader = ReplyReader()
        assert await _read_reply(ours, reader) == [b"a job"]
        assert await _read_reply(ours, reader) == Status("AFTER")
        await ours.aclose()


async def test_commands_read_while_a_run_of_addjobs_waits_run_after_it(
    clock: trio.testing.MockClock,
) -> None:
    """The end of a pipelined batch of ADDJOBs waits for their copies; past
    the grace the reader takes the input, and what it reads meanwhile must
    run once the run is answered, not wait for more input (the client is
    waiting for these replies: that hung a pipelining client for good)."""
    host = FakeClientHost()
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_client, host, theirs)
        await ours.send_all(b"ADDJOB\r\nADDJOB\r\n")
        await trio.sleep(0.1)  # past the grace: the reader reads
        await ours.send_all(b"ADDJOB\r\nAFTER\r\n")
        await trio.sleep(0.1)
        assert len(host.waiters) == 2  # read, not run yet
        for waiter in host.waiters[:2]:
            waiter.finish(Status("OK"))
            waiter.wake()
        reader = ReplyReader()
        with trio.fail_after(10):
            assert await _read_reply(ours, reader) == Status("OK")
            assert await _read_reply(ours, reader) == Status("OK")
            await trio.sleep(0.1)
            assert len(host.waiters) == 3  # what the reader read ran
            third = host.waiters[2]
            third.finish(Status("OK"))
            third.wake()
            assert await _read_reply(ours, reader) == Status("OK")
            assert await _read_reply(ours, reader) == Status("AFTER")
        await ours.aclose()


async def test_a_run_of_addjobs_whose_copies_came_back_is_answered_in_one_write(
    clock: trio.testing.MockClock,
) -> None:
    """Pipelined synchronous ADDJOBs: once the run's first one has waited,
    the others' copies are there too, and all the replies go out in one
    write (they went out one write each: 16 writes for redis-benchmark -P 16
    REPLICATE 3)."""
    host = FakeClientHost()
    ours, theirs = trio.testing.memory_stream_pair()
    writes: list[bytes] = []
    send_all = theirs.send_all

    async def counted(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        await send_all(data)

    theirs.send_all = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_client, host, theirs)
        await ours.send_all(b"ADDJOB\r\nADDJOB\r\nADDJOB\r\nADDJOB\r\n")
        await trio.sleep(0.001)  # the run waits on its first ADDJOB
        assert len(host.waiters) == 4 and not writes
        for waiter in host.waiters:
            waiter.finish(Status("OK"))
        host.waiters[0].wake()  # the only one the connection waits on
        reader = ReplyReader()
        with trio.fail_after(10):
            for _ in range(4):
                assert await _read_reply(ours, reader) == Status("OK")
        assert writes == [b"+OK\r\n" * 4]
        await ours.aclose()


async def test_a_background_task_asked_for_as_the_node_stops_is_dropped() -> None:
    """The cron, cancelled in the same pass as the background nursery
    closed, may tick once more and start the automatic AOF rewrite: not
    started, and the stop goes on (simulator seed 773936: it failed with
    "Nursery is closed to new arrivals")."""
    from disque_trio.server.node import NodeServer

    server = NodeServer.__new__(NodeServer)
    async with trio.open_nursery() as nursery:
        server._background = nursery
    ran: list[int] = []

    async def rewrite() -> None:
        ran.append(1)

    server.spawn(rewrite)
    await trio.sleep(0)
    assert ran == []
    async with trio.open_nursery() as nursery:  # while it runs, it starts
        server._background = nursery
        server.spawn(rewrite)
    assert ran == [1]
