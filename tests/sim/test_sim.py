"""The simulator's foundation: checkers pass, runs are reproducible."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import types
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.checkers import Crashes, check
from sim.clock import Timers
from sim.disk import DiskHandle, SimDisk
from sim.explore import ADMIN_ACTIONS, MJob, Model
from sim.net import SimNet
from sim.plan import DRAWN_KINDS, FAULT_KINDS, Fault, Plan
from sim.probes import COMMAND_PROBES
from sim.runner import Outcome, execute
from sim.runs import load_plan, replay_verdict
from sim.shrink import shrink_plan
from sim.sweep import REGRESSIONS
from sim.trace import Trace
from sim.workload import Event
from sim.world import PROBES, World

from .conftest import sim_cli


def with_connection(
    body: Callable[[SimNet, trio.abc.Stream, trio.abc.Stream], Awaitable[None]],
) -> None:
    """Run ``body(net, client, server)`` under MockClock: node 2's connection
    to node 1's listener on port 10001. Twice: chunks delivered by the net's
    delivery task, then by the clock's timers (as in a World)."""

    async def main(net: SimNet) -> None:
        async with trio.open_nursery() as nursery:
            net.nursery = nursery
            [listener] = await net.view(1).open_listeners("127.0.0.1", 10001)
            client = await net.view(2).connect("127.0.0.1", 10001)
            server = await listener.accept()
            await body(net, client, server)
            nursery.cancel_scope.cancel()

    for with_timers in (False, True):
        clock = trio.testing.MockClock(autojump_threshold=0)
        timers = Timers(clock) if with_timers else None
        trio.run(main, SimNet(random.Random(1), Trace(), timers=timers), clock=clock)


def run(seed: int, nodes: int | None = None, duration: int | None = None) -> Outcome:
    return execute(Plan.from_seed(seed, nodes, duration))


def test_seed_1_three_nodes_passes_the_checkers() -> None:
    outcome = run(1, nodes=3, duration=8)
    report = outcome.report
    assert outcome.ok, outcome.violations
    assert report.added_ok > 20
    assert report.delivered >= report.added_ok - sum(
        1
        for e in outcome.workload.history
        if e.op == "add" and e.data["ok"] and (e.data["retry"] == 0 or e.data["ttl"])
    )
    assert outcome.workload.drained
    assert not outcome.workload.converged


@pytest.mark.parametrize("seed", range(1, 13))
def test_swarm_seeds_pass_every_check(seed: int) -> None:
    outcome = run(seed)
    assert outcome.ok, outcome.violations
    assert all(n.up for n in outcome.world.nodes)
    assert outcome.world.virtual_seconds > outcome.plan.duration


def test_swarm_varies_cluster_size_faults_and_job_options() -> None:
    plans = [Plan.from_seed(seed) for seed in range(1, 61)]
    assert {p.nodes for p in plans} >= {1, 3, 5, 7}
    kinds = {f.name for p in plans for f in p.faults}
    assert kinds == set(FAULT_KINDS[1:DRAWN_KINDS])
    # The disk's faults come from fields of their own (issue 58).
    active = {f.name for p in plans for f in p.active_faults()}
    assert active == set(FAULT_KINDS) - {"none"}
    assert {p.appendfsync for p in plans} == {"always", "everysec", "no"}
    assert any(p.retry0_pct for p in plans) and any(p.async_pct for p in plans)
    assert any(p.nack_pct for p in plans) and any(p.ttl_pct for p in plans)
    assert any(p.nack_delay_pct for p in plans) and any(p.enqueue_delay_pct for p in plans)
    assert any(p.waiters for p in plans) and any(p.wait_other_pct for p in plans)


def test_plans_saved_before_delays_and_waits_load_with_them_off() -> None:
    """The regression corpus predates NACK/ENQUEUE DELAY and WAITJOB in the
    workload: its plans load with those fields 0 and replay as they did."""
    plan, _ = load_plan(str(REGRESSIONS / "seed-180270.json"))
    assert (plan.nack_delay_pct, plan.enqueue_delay_pct, plan.waiters) == (0, 0, 0)


def test_plans_saved_before_long_retry_jobs_load_without_them() -> None:
    """Fail-over's long RETRY jobs (issue 57) are a plan field of their own,
    drawn from a generator of its own: plans saved before load with it 0
    (and replay without them), and some seeds draw them."""
    plan, _ = load_plan(str(REGRESSIONS / "seed-180270.json"))
    assert plan.long_retry_pct == 0
    plans = [Plan.from_seed(seed) for seed in range(40)]
    assert any(p.long_retry_pct for p in plans) and not all(p.long_retry_pct for p in plans)


def test_plans_saved_before_disk_faults_load_without_them() -> None:
    """The disk's faults (issue 58) are plan fields drawn from a generator
    of their own: plans saved before load with them 0, every other field of
    a seed stays what it was, and some seeds draw them, a crash with some."""
    plan, _ = load_plan(str(REGRESSIONS / "seed-180270.json"))
    assert plan.disk_fault == 0 and not plan.disk_faults()
    plans = [Plan.from_seed(seed) for seed in range(1, 61)]
    with_disk = [p for p in plans if p.disk_fault]
    assert 5 < len(with_disk) < 40
    assert {p.disk_fault for p in with_disk} == {1, 2}
    assert {p.disk_crash for p in with_disk} == {0, 1, 2}
    without = [attrs.evolve(p, disk_fault=0) for p in with_disk]
    assert all(
        len(p.active_faults()) < len(q.active_faults())
        for p, q in zip(without, with_disk, strict=True)
    )


def test_restarted_node_keeps_its_id_and_fsynced_jobs() -> None:
    plan = Plan(seed=2, extra_nodes=2, extra_seconds=4, faults=(Fault(1, 1, 20, 20),))
    outcome = execute(plan)
    lines = outcome.world.trace.lines
    assert sum('"crashed"' in line for line in lines) == 1
    ids: dict[str, set[str]] = {}
    for line in lines:
        if '"ev":"started"' in line:
            data = line.split('"id":"')[1].split('"')[0]
            node = line.split('"node":"')[1].split('"')[0]
            ids.setdefault(node, set()).add(data)
    assert all(len(v) == 1 for v in ids.values()), ids  # nodes.conf recovered
    assert not outcome.world.amnesia  # appendfsync always
    assert outcome.ok, outcome.violations


def test_job_expired_while_down_is_not_amnesia() -> None:
    """First seen on seed 922367157: n2 (appendfsync always) held a short-TTL
    job, crashed for 8 s and came back after its TTL: the AOF load rightly
    drops it. That is not amnesia; a job still within its TTL and not loaded
    would be. (The plan is spelled out: a seed's plan draws it only as long
    as nothing else in the run moves: the fail-over checks' tasks moved the
    schedule, and the crash now comes at 1 s, for 9 s.)"""
    crash = Fault(kind=FAULT_KINDS.index("crash"), victim=2, start=10, length=90)
    plan = Plan(seed=1, extra_nodes=2, extra_seconds=8, fsync=0, ttl_pct=40, faults=(crash,))
    outcome = execute(plan)
    n2 = outcome.world.nodes[2]
    assert set(n2.held_at_crash) - n2.loaded  # some job expired while n2 was down
    assert not outcome.world.amnesia
    assert outcome.ok, outcome.violations


def test_wiped_node_rejoins_with_a_new_id_and_is_forgotten() -> None:
    plan = Plan(seed=5, extra_nodes=2, extra_seconds=5, faults=(Fault(10, 2, 20, 20),))
    outcome = execute(plan)
    node = outcome.world.nodes[2]
    assert node.old_ids and node.old_ids[0] != node.server.node.node_id
    assert outcome.world.probes["wipe"] == 1
    assert outcome.ok, outcome.violations


def test_same_seed_same_digest() -> None:
    first = run(7, nodes=3, duration=4)
    second = run(7, nodes=3, duration=4)
    assert first.world.trace.lines == second.world.trace.lines
    assert first.world.trace.digest() == second.world.trace.digest()


def test_different_seeds_different_digests() -> None:
    a = run(1, nodes=3, duration=3)
    b = run(2, nodes=3, duration=3)
    assert a.world.trace.digest() != b.world.trace.digest()


@pytest.mark.parametrize("seed", [3, 28])
def test_same_digest_across_processes_and_hash_seeds(seed: int) -> None:
    lines = []
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = sim_cli("run", "--seed", str(seed), "--quiet", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        lines.append(out.stdout.strip().splitlines()[-1])
    assert lines[0].startswith("digest ")
    assert lines[0] == lines[1]


CORPUS = sorted(REGRESSIONS.glob("*.json"))


@pytest.fixture(scope="module")
def corpus_violations() -> Iterator[dict[Path, Future[list[str]]]]:
    """Every regression plan replayed, on every core (one process each,
    started fresh: spawn), in the background from the first test that
    asks; each test waits for its own plan only."""
    workers = max(2, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {path: pool.submit(replay_verdict, str(path)) for path in CORPUS}
        try:
            yield futures
        finally:
            for future in futures.values():
                future.cancel()


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_regression_corpus_passes(
    path: Path, corpus_violations: dict[Path, Future[list[str]]]
) -> None:
    violations = corpus_violations[path].result(timeout=600)
    assert not violations, violations


def test_explorer_model_orders_its_queue_by_ctime_not_by_add_order() -> None:
    # Seed 3176: a job made before a backward clock jump sorts after one
    # added later; seed 5057: jobs active when the model was read back take
    # their ctime's place when NACKed, whatever order JSCAN listed them in.
    m = Model()
    m.jobs["a"] = MJob(1, ctime=5_000, state="active")
    m.jobs["b"] = MJob(2, ctime=2_000, state="active")
    m.jobs["c"] = MJob(3, ctime=3_000)
    m.jobs["d"] = MJob(4, ctime=1_000)
    assert m.queued() == ["d", "c"]
    m.jobs["a"].state = m.jobs["b"].state = "queued"
    assert m.queued() == ["d", "b", "c", "a"]


def test_a_late_chaos_frame_from_a_forgotten_node_is_dropped_on_arrival() -> None:
    """Seed 1191: bus chaos held a NEEDJOBS from n1's old ID back past the
    CLUSTER FORGET of that ID on n2. The node's bus drops a frame from a
    node it does not know when it reads it; the late frame gets the same
    check when it arrives (``World._late``), instead of being served (which
    listed the forgotten ID as a holder of an acked job that was then never
    collected). Whether a plan's run holds a frame back past a FORGET
    depends on the scheduling, so the check is driven directly: a late
    frame from a node the receiver forgot is dropped and traced, one from a
    known node is delivered; and seed 1191's plan passes."""
    known, forgotten = "a" * 40, "b" * 40
    trace = Trace()
    delivered: list[tuple[str, object]] = []
    bus_events: list[None] = []
    cluster = types.SimpleNamespace(nodes={known: object()})
    server = types.SimpleNamespace(
        node=types.SimpleNamespace(cluster=cluster),
        after_bus_event=lambda: bus_events.append(None),
    )
    node = types.SimpleNamespace(name="n2", up=True, incarnation=0, server=server)
    world = types.SimpleNamespace(trace=trace)

    def deliver(sender: str, msg: object) -> None:
        delivered.append((sender, msg))

    async def main() -> None:
        for sender in (forgotten, known):
            await World._late(world, node, deliver, 0.5, sender, "NEEDJOBS")  # type: ignore[arg-type]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert delivered == [(known, "NEEDJOBS")] and len(bus_events) == 1
    late = [line for line in trace.lines if '"late-stranger"' in line]
    assert len(late) == 1 and '"n2"' in late[0], trace.lines
    plan, _ = load_plan(str(REGRESSIONS / "seed-1191.json"))
    outcome = execute(plan)
    assert outcome.ok, outcome.violations


def test_clock_timers_run_at_their_time_without_a_task() -> None:
    """Canary for ``sim.clock``: Trio's run loop calls the MockClock's
    private ``_autojump`` when every task is blocked, and the timers the
    network delivers by run there, at their virtual time, in order, while
    sleeps still end on time."""
    import inspect

    import trio._core._run as trio_run

    assert "clock._autojump()" in inspect.getsource(trio_run.unrolled_run)
    clock = trio.testing.MockClock(autojump_threshold=0)
    timers = Timers(clock)
    fired: list[float] = []

    async def main() -> None:
        timers.call_at(2.5, lambda: fired.append(trio.current_time()))
        timers.call_at(1.0, lambda: fired.append(trio.current_time()))
        event = trio.Event()
        timers.call_at(3.0, event.set)
        await trio.sleep(2.0)
        assert fired == [1.0] and trio.current_time() == 2.0
        await event.wait()
        assert fired == [1.0, 2.5] and trio.current_time() == 3.0
        await trio.sleep(10)
        assert trio.current_time() == 13.0

    trio.run(main, clock=clock)
    assert fired == [1.0, 2.5]


def test_a_disarmed_timer_at_the_head_is_dropped_not_jumped_to() -> None:
    """A timer called off (its armed flag cleared) is not run, and the clock
    does not stop at its time: no pass of the run loop there."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    timers = Timers(clock)
    passes_at: list[float] = []
    ran: list[str] = []

    class Passes(trio.abc.Instrument):
        def before_io_wait(self, timeout: float) -> None:
            passes_at.append(trio.current_time())

    async def main() -> None:
        armed = [True]
        timers.call_at(1.0, lambda: ran.append("off"), armed)
        timers.call_at(2.0, lambda: ran.append("on"), [True])
        armed[0] = False
        await trio.sleep(3.0)

    trio.run(main, clock=clock, instruments=[Passes()])
    assert ran == ["on"]
    assert 2.0 in passes_at and 1.0 not in passes_at


def test_the_fast_hook_table_keeps_trios_instruments_working() -> None:
    """Canary and check for ``fast_hook_table``: Trio's loop keeps its
    instruments in a UserDict (``Instruments``); the simulator gives it the
    same table as a dict, whose instruments are still called, added and
    removed as Trio's own."""
    import trio._core._run as trio_run
    from trio._core._instrumentation import Instruments

    from sim.clock import _HookTable, fast_hook_table

    steps: list[str] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps.append(task.name)

    async def main() -> None:
        runner = trio_run.GLOBAL_RUN_CONTEXT.runner
        assert type(runner.instruments) is Instruments
        fast_hook_table()
        assert type(runner.instruments) is _HookTable
        assert "before_task_step" in runner.instruments  # Steps, given to trio.run
        await trio.lowlevel.checkpoint()
        assert steps
        instrument = Steps()
        trio.lowlevel.add_instrument(instrument)
        assert len(runner.instruments["before_task_step"]) == 2
        trio.lowlevel.remove_instrument(instrument)
        assert len(runner.instruments["before_task_step"]) == 1

    trio.run(main, instruments=[Steps()])


def test_cheap_sleeps_and_clock_end_on_time_obey_cancels_and_are_undone() -> None:
    """``virtual_time``: trio.sleep and sleep_until become timers inside the
    block (ending at their virtual time, in order with other timers, a
    cancel from an enclosing scope still ending them, sleep(0) still a
    checkpoint), trio.current_time reads the virtual clock (the value
    Trio's own gives), and Trio's own are back outside it."""
    from sim.clock import virtual_time

    original = trio.sleep, trio.sleep_until, trio.current_time
    clock = trio.testing.MockClock(autojump_threshold=0)
    timers = Timers(clock)
    order: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await trio.sleep(seconds)
        order.append(f"{name}@{trio.current_time()}")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper, "b", 2.0)
            nursery.start_soon(sleeper, "a", 1.0)
            timers.call_at(1.5, lambda: order.append("timer@1.5"))
        assert order == ["a@1.0", "timer@1.5", "b@2.0"]
        assert trio.current_time() == original[2]() == 2.0
        with trio.move_on_after(0.5) as scope:
            await trio.sleep(100)
        assert scope.cancelled_caught and trio.current_time() == 2.5
        await trio.sleep_until(4.0)
        assert trio.current_time() == 4.0
        await trio.sleep(0)
        with pytest.raises(ValueError):
            await trio.sleep(-1)

    with virtual_time(timers):
        assert (trio.sleep, trio.sleep_until, trio.current_time) != original
        trio.run(main, clock=clock)
    assert (trio.sleep, trio.sleep_until, trio.current_time) == original


def test_virtual_time_skips_empty_polls_but_runs_the_entry_queue() -> None:
    """Inside ``virtual_time`` a zero-timeout poll with Trio's entry queue
    empty asks no kernel; a run_sync_soon callback (how a Ctrl-C, an async
    generator's finalizer or a thread's result comes in) still runs at
    once, and the poll is Trio's own again after the block."""
    from trio._core._io_epoll import EpollIOManager

    from sim.clock import virtual_time

    real = EpollIOManager.get_events
    clock = trio.testing.MockClock(autojump_threshold=0)
    timers = Timers(clock)
    polls: list[float] = []
    ran: list[float] = []

    def counting(self: EpollIOManager, timeout: float) -> object:
        polls.append(timeout)
        return real(self, timeout)

    async def main() -> None:
        await trio.sleep(1)
        for _ in range(50):
            await trio.lowlevel.checkpoint()
        assert polls == []  # fifty passes, not one system call
        token = trio.lowlevel.current_trio_token()
        token.run_sync_soon(lambda: ran.append(trio.current_time()))
        await trio.sleep(5)

    EpollIOManager.get_events = counting  # type: ignore[method-assign]
    try:
        with virtual_time(timers):
            assert EpollIOManager.get_events is not counting
            trio.run(main, clock=clock)
        assert EpollIOManager.get_events is counting
    finally:
        EpollIOManager.get_events = real  # type: ignore[method-assign]
    assert ran == [1.0] and polls  # polled for the callback, at its instant


def test_trio_deterministic_scheduling_hook_is_where_the_simulator_expects() -> None:
    """Canary: the simulator seeds Trio's private scheduling hook. If a Trio
    upgrade moves it, runs silently stop being reproducible; fail loudly."""
    import trio._core._run as trio_run

    assert hasattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    assert isinstance(trio_run._r, random.Random)
    first = run(4, nodes=3, duration=3).world.trace.digest()
    assert run(4, nodes=3, duration=3).world.trace.digest() == first
    assert run(5, nodes=3, duration=3).world.trace.digest() != first


def test_the_scheduler_generator_shuffles_as_random_does() -> None:
    """The generator a run gives Trio's scheduler skips the shuffle of a
    batch of one task: every batch still comes out in the order, and the
    generator in the state, that ``random.Random`` with the seed gives."""
    from sim.world import _SchedulerRandom

    ours, plain = _SchedulerRandom(99), random.Random(99)
    for size in [1, 0, 2, 1, 1, 5, 3, 1, 4, 1, 0, 7] * 20:
        a, b = list(range(size)), list(range(size))
        ours.shuffle(a)
        plain.shuffle(b)
        assert a == b
        assert ours.random() == plain.random()


def test_sim_disk_crash_drops_only_pending() -> None:
    disk = SimDisk()
    disk.append("aof", b"one")
    disk.fsync("aof")
    disk.append("aof", b"two")
    assert disk.read("aof") == b"onetwo"
    assert disk.size("aof") == 6
    disk.replace("nodes.conf", b"x")
    disk.crash()
    assert disk.read("aof") == b"one"
    assert disk.read("nodes.conf") == b"x"
    assert disk.read("missing") is None


def test_sim_net_partition_breaks_and_refuses() -> None:
    async def body(net: SimNet, client: trio.abc.Stream, server: trio.abc.Stream) -> None:
        await client.send_all(b"hello")
        assert await server.receive_some(100) == b"hello"
        net.partition([1], [2])
        with pytest.raises(trio.BrokenResourceError):
            await server.receive_some(100)
        with pytest.raises(ConnectionRefusedError):
            await net.view(2).connect("127.0.0.1", 10001)
        # Clients (owner None) are not partitioned.
        other = await net.view(None).connect("127.0.0.1", 10001)
        net.heal()
        again = await net.view(2).connect("127.0.0.1", 10001)
        await again.aclose()
        await other.aclose()

    with_connection(body)


def test_sim_net_one_way_partition_stalls_one_direction() -> None:
    async def body(net: SimNet, client: trio.abc.Stream, server: trio.abc.Stream) -> None:
        net.one_way([2], [1])  # 2 -> 1 dropped
        await server.send_all(b"flows")
        assert await client.receive_some(100) == b"flows"
        await client.send_all(b"stalled")
        with trio.move_on_after(5) as waited:
            await server.receive_some(100)
        assert waited.cancelled_caught
        with pytest.raises(ConnectionRefusedError):
            await net.view(2).connect("127.0.0.1", 10001)
        net.heal()
        assert await server.receive_some(100) == b"stalled"
        net.fence(1)
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some(100)
        with pytest.raises(ConnectionRefusedError):
            await net.view(None).connect("127.0.0.1", 10001)

    with_connection(body)


def test_dead_disk_handle_writes_nothing() -> None:
    disk = SimDisk()
    handle = DiskHandle(disk)
    handle.append("aof", b"a")
    handle.fsync("aof")
    handle.alive = False
    handle.append("aof", b"b")
    handle.replace("nodes.conf", b"x")
    assert disk.read("aof") == b"a"
    assert disk.read("nodes.conf") is None


def test_checker_excuses_losses_only_with_amnesia_below_replicate() -> None:
    history = [
        Event(0.0, "p", "invoke", {"body": "j", "retry": 2, "copies": 2}),
        Event(0.1, "p", "add", {"body": "j", "retry": 2, "ok": True, "reply": "D-1"}),
    ]
    holders = {"D-1": {"n0", "n1"}}
    forgot = {"D-1": {"n0"}}
    everysec = check(history, crashes=Crashes("everysec", holders, forgot))
    assert everysec.ok and len(everysec.excused) == 1
    no_amnesia = check(history, crashes=Crashes("everysec", holders, {}))
    assert not no_amnesia.ok
    kept_enough = check(history, crashes=Crashes("everysec", {"D-1": {"n0", "n1", "n2"}}, forgot))
    assert not kept_enough.ok


def test_sweep_cli_reports_and_writes_regressions(tmp_path: Path) -> None:
    env = {**os.environ, "SIM_REGRESSIONS": str(tmp_path)}
    out = sim_cli("run", "--seeds", "1..2", "--jobs", "2", "--duration", "3", env=env)
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "seeds: 2 passed, 0 failed", out.stdout + out.stderr
    assert out.returncode == 0
    assert sum(1 for line in lines if line.startswith("seed ")) == 2
    assert not list(tmp_path.iterdir())
    # Each probe with the share of the seeds that hit it.
    assert "probe shares (2 seeds):" in lines
    shares = [line.split() for line in lines if line.startswith("  ") and line.endswith("%")]
    assert {row[0] for row in shares} == set(PROBES)
    assert all(row[1] in ("0", "1", "2") for row in shares)


def test_explorer_runs_every_admin_action_and_checks_reads() -> None:
    """Every admin action of the explorer (sim/explore.py) in one healthy
    run, with its model-checked reads; the run passes every check."""
    plan = Plan(
        seed=1,
        extra_nodes=2,
        extra_seconds=14,
        extra_producers=2,
        async_pct=30,
        explore=3,
        admin_mask=(1 << len(ADMIN_ACTIONS)) - 1,
        aof_rewrite_kb=4,
    )
    outcome = execute(plan)
    assert outcome.ok, outcome.violations
    probes = outcome.world.probes
    wanted = [p for p in COMMAND_PROBES if p.startswith(("admin-", "model-", "async-"))]
    assert [p for p in wanted if not probes[p]] == []
    assert probes["leaving-refused-getjob"] > 0


def test_failing_run_prints_violation_trace_and_replay(tmp_path: Path) -> None:
    """A planted bug: exit 1, the violation, the trace files, the replay
    command; the last line is still the digest."""
    out = sim_cli(
        "run",
        "--seed",
        "1",
        "--mutant",
        "aof-write-dropped",
        "--trace",
        str(tmp_path / "t.jsonl"),
        "--quiet",
    )
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(line.startswith("VIOLATION ") for line in lines)
    assert "replay: python -m sim run --seed 1 --mutant aof-write-dropped" in lines
    assert lines[-1].startswith("digest ")
    trace = (tmp_path / "t.jsonl").read_text().splitlines()
    header, footer = json.loads(trace[0])["header"], json.loads(trace[-1])["footer"]
    assert header["seed"] == 1 and header["mutant"] == "aof-write-dropped"
    assert header["replay"].startswith("python -m sim")
    assert "trio" in header["versions"] and header["swarm"]["nodes"] >= 1
    assert footer["violations"] and footer["ok"] is False
    assert all(json.loads(line)["t"] >= 0 for line in trace[1:-1])
    log = (tmp_path / "t.log").read_text().splitlines()
    assert log[0] == "# seed: 1" and any("VIOLATION" in line for line in log)


def test_checker_flags_lost_phantom_and_retry0_duplicates() -> None:
    def add(body: str, retry: int, ok: bool, job_id: str) -> list[Event]:
        return [
            Event(0.0, "p", "invoke", {"body": body, "retry": retry}),
            Event(0.1, "p", "add", {"body": body, "retry": retry, "ok": ok, "reply": job_id}),
        ]

    def get(body: str, job_id: str) -> Event:
        return Event(1.0, "c", "get", {"body": body, "id": job_id})

    history = [
        *add("lost", 2, True, "D-1"),
        *add("twice", 0, True, "D-2"),
        get("twice", "D-2"),
        get("twice", "D-2"),
        get("phantom", "D-3"),
        *add("dup", 2, True, "D-4"),
        get("dup", "D-4"),
        get("dup", "D-4"),
    ]
    report = check(history)
    assert report.duplicates == 2
    text = "\n".join(report.violations)
    assert "'lost'" in text and "never delivered" in text
    assert "'phantom' never added" in text
    assert "RETRY 0 job 'twice'" in text
    assert len(report.violations) == 3


def test_sim_net_clog_holds_bytes_both_ways_and_reset_breaks() -> None:
    async def body(net: SimNet, client: trio.abc.Stream, server: trio.abc.Stream) -> None:
        key = net.add_rule("clog", [1], [2])
        await client.send_all(b"held")
        await server.send_all(b"back")
        with trio.move_on_after(3) as waited:
            await server.receive_some(100)
        assert waited.cancelled_caught
        net.remove_rule(key)
        assert await server.receive_some(100) == b"held"
        assert await client.receive_some(100) == b"back"
        assert net.reset(1) == 1
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some(100)
        again = await net.view(2).connect("127.0.0.1", 10001)  # resets do not refuse
        await again.aclose()

    with_connection(body)


def test_sim_net_overlapping_rules_heal_one_at_a_time() -> None:
    net = SimNet(random.Random(1), Trace())
    a = net.partition([1], [2, 3])
    b = net.one_way([3], [1])
    assert net.stalled(3, 1) and net.stalled(1, 3)
    net.remove_rule(a)
    assert net.stalled(3, 1) and not net.stalled(1, 3)
    net.remove_rule(b)
    assert not net.faulty


def test_sim_disk_torn_crash_keeps_a_prefix_and_wipe_forgets() -> None:
    disk = SimDisk()
    disk.append("aof", b"synced")
    disk.fsync("aof")
    disk.append("aof", b"0123456789")
    assert disk.crash(torn=0.5) == 5
    assert disk.read("aof") == b"synced01234"
    disk.wipe()
    assert disk.read("aof") is None


@given(st.integers(0, 10_000))
@settings(max_examples=50, deadline=None)
def test_plans_round_trip_through_values_and_json(seed: int) -> None:
    plan = Plan.from_seed(seed)
    assert Plan.from_values(seed, plan.encode()) == plan
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_values(seed, [0] * len(plan.encode())).active_faults() == []


def test_shrinker_finds_the_smallest_failing_plan() -> None:
    """A plan "fails" when it has a crash in a cluster of at least two
    nodes; the shrinker must remove every other fault and option."""
    plan = Plan.from_seed(3)
    assert any(f.name == "crash" for f in plan.faults) and plan.nodes >= 2

    def fails(candidate: Plan) -> bool:
        return candidate.nodes >= 2 and any(f.name == "crash" for f in candidate.faults)

    small = shrink_plan(plan, fails, max_runs=500)
    assert fails(small)
    assert small.nodes == 2 and len(small.faults) == 1
    assert small.faults[0] == Fault(kind=1)
    assert small.encode().count(0) == len(small.encode()) - 2


@given(st.integers(0, 10_000), st.data())
@settings(max_examples=40, deadline=None)
def test_shrinker_lowers_to_the_threshold_and_keeps_the_right_fault(
    seed: int, data: st.DataObject
) -> None:
    """Against synthetic failure conditions the smallest failing plan is
    known: every value zero but the one the condition needs, and that one
    exactly at its threshold; and a fault condition keeps a single fault."""
    plan = Plan.from_seed(seed)
    values = plan.encode()
    index = data.draw(st.sampled_from([i for i, v in enumerate(values[:10]) if v] or [0]))
    threshold = data.draw(st.integers(0, values[index]))
    runs = []

    def value_fails(candidate: Plan) -> bool:
        runs.append(candidate)
        return candidate.encode()[index] >= threshold

    small = shrink_plan(plan, value_fails, max_runs=500)
    expected = [0] * len(values)
    expected[index] = threshold
    assert small.encode() == expected
    assert len(runs) <= 500 + 1

    if plan.faults:
        kind = data.draw(st.sampled_from([f.kind for f in plan.faults]))
        small = shrink_plan(plan, lambda p: any(f.kind == kind for f in p.faults))
        assert small.faults == (Fault(kind=kind),)
        assert sum(small.encode()) == kind


def test_shrinker_stops_at_its_budget() -> None:
    plan = Plan.from_seed(3)
    runs: list[Plan] = []

    def fails(candidate: Plan) -> bool:
        runs.append(candidate)
        return bool(candidate.faults)

    small = shrink_plan(plan, fails, max_runs=5)
    assert len(runs) == 1 + 5  # the check of the plan itself, then the budget
    assert fails(small)
    assert sum(small.encode()) <= sum(plan.encode())


def test_shrink_cli_writes_a_plan_that_replay_reproduces(tmp_path: Path) -> None:
    out_path = tmp_path / "plan.json"
    shrink = sim_cli(
        "shrink",
        "--seed",
        "2",
        "--mutant",
        "pause-in-ignored",
        "--max-runs",
        "60",
        "--out",
        str(out_path),
        timeout=300,
    )
    assert shrink.returncode == 0, shrink.stdout + shrink.stderr
    plan, mutant = load_plan(str(out_path))
    assert mutant == "pause-in-ignored"
    original = Plan.from_seed(2)
    assert sum(plan.encode()) < sum(original.encode())
    assert len(plan.active_faults()) <= len(original.active_faults())
    replay = sim_cli("replay", str(out_path), "--quiet")
    lines = replay.stdout.strip().splitlines()
    assert replay.returncode == 1
    assert any(line.startswith("VIOLATION pause-in") for line in lines)
    assert lines[-1].startswith("digest ")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read"),
        ('{"plan": {"seed": 1,', "is not valid JSON"),
        ('{"plan": {"nodes": 2}}', "does not hold a simulator plan"),
    ],
    ids=["missing", "malformed", "not-a-plan"],
)
def test_replay_of_a_bad_plan_file_is_one_line_and_nonzero(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    out = sim_cli("replay", str(path), "--quiet")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("python -m sim replay: ") and expected in lines[0]
    assert str(path) in lines[0]


def test_sim_net_bounded_buffers_make_a_sender_wait_for_the_reader() -> None:
    """With net.buffer set, a connection direction holds that many bytes
    (on the wire and delivered but not read): write_nowait takes what fits,
    send_all waits until the receiver reads, and a reset wakes it."""

    async def main() -> None:
        net = SimNet(random.Random(1), Trace())
        net.buffer = 10
        async with trio.open_nursery() as nursery:
            net.nursery = nursery
            [listener] = await net.view(1).open_listeners("127.0.0.1", 10001)
            client = await net.view(2).connect("127.0.0.1", 10001)
            server = await listener.accept()
            assert client.write_nowait(b"0123456789abc") == 10  # type: ignore[attr-defined]
            assert client.write_nowait(b"x") == 0  # type: ignore[attr-defined]
            sent = trio.Event()

            async def send() -> None:
                await client.send_all(b"ABCDEFGHIJKLMNO")
                sent.set()

            nursery.start_soon(send)
            await trio.sleep(1)
            assert not sent.is_set() and net.full_waits == 1
            got = b""
            while len(got) < 25:
                got += await server.receive_some(4)
            assert got == b"0123456789ABCDEFGHIJKLMNO"
            await trio.sleep(0)
            assert sent.is_set()
            # A sender waiting on a full pipe is woken by a reset, and raises.
            assert client.write_nowait(b"0123456789") == 10  # type: ignore[attr-defined]
            waits = net.full_waits
            broken = trio.Event()

            async def send_more() -> None:
                with pytest.raises(trio.BrokenResourceError):
                    await client.send_all(b"more")
                broken.set()

            nursery.start_soon(send_more)
            await trio.sleep(0.5)
            assert not broken.is_set() and net.full_waits == waits + 1
            net.reset(1)
            with trio.fail_after(1):
                await broken.wait()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_slow_fsync_stalls_every_task_of_its_node_and_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 12 draws a slow disk (each fsync of n3 takes 4 s): the node's
    tasks are held back by the scheduler while it is stuck, the others run,
    its own trace is silent meanwhile, and the run passes every check."""
    plan = Plan.from_seed(12)
    assert plan.slow_fsync == 4
    held: list[int] = []
    original = World.hold_stalled

    def hold(self: World, batch: list[object]) -> None:
        before = len(batch)
        original(self, batch)
        held.append(before - len(batch))

    monkeypatch.setattr(World, "hold_stalled", hold)
    outcome = execute(plan)
    assert outcome.ok, outcome.violations
    assert outcome.world.probes["slow-fsync"] > 0 and sum(held) > 0
    victim = f"n{plan.slow_node % plan.nodes}"
    events = [json.loads(line) for line in outcome.world.trace.lines]
    stalls = [
        (e["t"], e["t"] + e["data"]["s"])
        for e in events
        if e["node"] == victim
        and isinstance(e["data"], dict)
        and e["data"].get("ev") == "slow-fsync"
    ]
    assert stalls
    start, end = stalls[0]
    quiet = [
        e
        for e in events
        if e["node"] == victim and start < e["t"] < end - 1e-9 and e["cat"] == "job"
    ]
    assert not quiet, quiet[:3]
