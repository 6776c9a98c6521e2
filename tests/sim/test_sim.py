"""The simulator's foundation: checkers pass, runs are reproducible."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from sim.__main__ import check_world, run_once, sweep_nodes
from sim.checkers import Crashes, check
from sim.disk import DiskHandle, SimDisk
from sim.net import SimNet
from sim.trace import Trace
from sim.workload import Event

ROOT = Path(__file__).resolve().parents[2]


def test_seed_1_three_nodes_passes_the_checkers() -> None:
    world, workload = run_once(1, nodes=3, duration=8)
    report = check(workload.history, workload.drained)
    assert report.ok, report.violations
    assert report.added_ok > 20
    assert report.delivered >= report.added_ok - sum(
        1 for e in workload.history if e.op == "add" and e.data["ok"] and e.data["retry"] == 0
    )
    assert any('"partition"' in line for line in world.trace.lines)


@pytest.mark.parametrize("seed", range(1, 13))
def test_seeds_with_crashes_and_partitions_pass_the_checkers(seed: int) -> None:
    world, workload = run_once(seed, nodes=sweep_nodes(seed), duration=5)
    report = check_world(world, workload)
    assert report.ok, report.violations
    assert world.probes["crash"] >= 1
    assert any('"partition"' in line for line in world.trace.lines)
    restarted = [line for line in world.trace.lines if '"incarnation":1' in line]
    assert restarted, "the crashed node came back"
    assert all(n.up for n in world.nodes)


def test_restarted_node_keeps_its_id_and_fsynced_jobs() -> None:
    world, workload = run_once(2, nodes=3, duration=5, partition=False)
    assert world.appendfsync in ("always", "everysec")
    crashed = [line for line in world.trace.lines if '"crashed"' in line]
    assert len(crashed) == 1
    ids: dict[str, set[str]] = {}
    for line in world.trace.lines:
        if '"ev":"started"' in line:
            data = line.split('"id":"')[1].split('"')[0]
            node = line.split('"node":"')[1].split('"')[0]
            ids.setdefault(node, set()).add(data)
    assert all(len(v) == 1 for v in ids.values()), ids  # nodes.conf recovered
    if world.appendfsync == "always":
        assert not world.amnesia
    assert check_world(world, workload).ok


def test_same_seed_same_digest() -> None:
    first, _ = run_once(7, nodes=3, duration=4)
    second, _ = run_once(7, nodes=3, duration=4)
    assert first.trace.lines == second.trace.lines
    assert first.trace.digest() == second.trace.digest()


def test_different_seeds_different_digests() -> None:
    a, _ = run_once(1, nodes=3, duration=3)
    b, _ = run_once(2, nodes=3, duration=3)
    assert a.trace.digest() != b.trace.digest()


def test_same_digest_across_processes_and_hash_seeds() -> None:
    lines = []
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-m", "sim", "run", "--seed", "3", "--nodes", "3", "--duration", "5"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        lines.append(out.stdout.strip().splitlines()[-1])
    assert lines[0].startswith("digest ")
    assert lines[0] == lines[1]


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
    async def main() -> None:
        net = SimNet(random.Random(1), Trace())
        async with trio.open_nursery() as nursery:
            net.nursery = nursery
            [listener] = await net.view(1).open_listeners("127.0.0.1", 10001)
            client = await net.view(2).connect("127.0.0.1", 10001)
            server = await listener.accept()
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
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_sim_net_one_way_partition_stalls_one_direction() -> None:
    async def main() -> None:
        net = SimNet(random.Random(1), Trace())
        async with trio.open_nursery() as nursery:
            net.nursery = nursery
            [listener] = await net.view(1).open_listeners("127.0.0.1", 10001)
            client = await net.view(2).connect("127.0.0.1", 10001)
            server = await listener.accept()
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
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


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
    always = check(history, crashes=Crashes("always", holders, forgot))
    assert not always.ok
    no_amnesia = check(history, crashes=Crashes("everysec", holders, {}))
    assert not no_amnesia.ok


def test_sweep_cli_reports_and_writes_regressions(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sim", "run", "--seeds", "1..2", "--jobs", "2", "--duration", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "seeds: 2 passed, 0 failed", out.stdout + out.stderr
    assert out.returncode == 0
    assert sum(1 for line in lines if line.startswith("seed ")) == 2


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
