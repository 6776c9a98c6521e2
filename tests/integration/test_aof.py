"""The append-only file with real processes: kill -9 and restart, controlled
restarts, turning it on at run time, rewrites under load, torn tails, damage."""

from __future__ import annotations

import errno
import os
import pty
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
import trio.testing

from disque_trio.core.job import FLAG_BCAST_WILLQUEUE, JobState
from disque_trio.core.records import dummy_ack
from disque_trio.env import Env, FileDisk, TcpNet, TrioClock
from disque_trio.protocol import aof as aof_records
from disque_trio.protocol.replies import ReplyError, Status
from disque_trio.protocol.resp import encode

from .. import helpers
from ..helpers import MemoryNode, RespClient, free_port, memory_node
from .conftest import NodeProcess

AOF = "disque.aof"


def connect(node: NodeProcess) -> redis.Redis:
    # No retries: a command the node never answered must fail, not be resent.
    return redis.Redis(port=node.port, socket_timeout=10, decode_responses=True, retry=None)


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def persistence(r: redis.Redis) -> dict[str, Any]:
    return r.info("persistence")


def add_jobs(r: redis.Redis, queue: str, n: int, retry: int = 1, body: str = "b") -> list[str]:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("ADDJOB", queue, f"{body}{i}", 0, "RETRY", retry)
    return list(pipe.execute())


def shows(r: redis.Redis, ids: list[str]) -> list[Any]:
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.execute_command("SHOW", job_id)
    return list(pipe.execute())


def state(show: list[Any] | None) -> str | None:
    return None if show is None else dict(zip(show[::2], show[1::2], strict=True))["state"]


def shutdown(r: redis.Redis, *args: str) -> None:
    """SHUTDOWN closes the connection without a reply, like Redis."""
    with pytest.raises(redis.ConnectionError):
        r.execute_command("SHUTDOWN", *args)


def record_ends(data: bytes) -> list[int]:
    return [end for _, end, _ in aof_records.records(data)]


def aof_node(node_factory: Any, policy: str = "always", *extra: str) -> NodeProcess:
    node: NodeProcess = node_factory("--appendonly", "yes", "--appendfsync", policy, *extra)
    return node


@pytest.fixture
def conf_nodes(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Nodes started from a config file in their own directory (so that
    CONFIG REWRITE has a file to rewrite)."""
    started: list[NodeProcess] = []

    def make(*lines: str) -> NodeProcess:
        port = free_port()
        workdir = tmp_path / f"conf-node-{port}"
        workdir.mkdir()
        conf = workdir / "disque.conf"
        conf.write_text("\n".join([f"port {port}", "bind 127.0.0.1", *lines]) + "\n")
        node = NodeProcess(port, workdir, [str(conf)])
        started.append(node)
        node.start()
        return node

    yield make
    for node in started:
        node.stop()


# ---------------------------------------------------------------- kill -9


@pytest.mark.parametrize("policy", ["always", "everysec", "no"])
def test_kill9_keeps_every_acknowledged_job(node_factory: Any, policy: str) -> None:
    node = aof_node(node_factory, policy)
    r = connect(node)
    ids = add_jobs(r, "q", 8)
    [acked] = add_jobs(r, "qa", 1)
    [(_, got, _)] = r.execute_command("GETJOB", "FROM", "qa")
    assert got == acked and r.execute_command("ACKJOB", acked) == 1
    [once] = add_jobs(r, "q0", 1, retry=0)
    [(_, got, _)] = r.execute_command("GETJOB", "FROM", "q0")
    assert got == once
    # kill -9 right after the replies: the process dies, the page cache
    # survives, so even appendfsync no loses nothing a client was told.
    assert node.kill() == -9
    node.start()
    r = connect(node)

    # Back as active (not queued): RETRY re-queues them, one second after load.
    assert [state(s) for s in shows(r, ids)] == ["active"] * len(ids)
    assert state(shows(r, [once])[0]) == "active"
    assert r.execute_command("QLEN", "q") == 0
    assert r.info()["registered_jobs"] == len(ids) + 1

    delivered: set[str] = set()
    deadline = time.monotonic() + 8
    while len(delivered) < len(ids) and time.monotonic() < deadline:
        reply = r.execute_command("GETJOB", "TIMEOUT", 3000, "COUNT", 100, "FROM", "q")
        delivered.update(job_id for _, job_id, _ in reply or ())
    assert delivered == set(ids)
    # By now the re-queue time of everything loaded has passed: the acked
    # job is gone and the delivered RETRY 0 job stays out of its queue.
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "qa", "q0") is None
    assert shows(r, [acked]) == [None]
    assert state(shows(r, [once])[0]) == "active"


def test_load_log_says_when_reloaded_jobs_are_queued_again(node_factory: Any) -> None:
    """Reloaded jobs are active, not queued: QLEN is 0 until their RETRY
    comes. The load line says so, with the first and last re-queue times."""
    node = aof_node(node_factory)
    r = connect(node)
    add_jobs(r, "q", 1, retry=12)
    add_jobs(r, "q", 2, retry=300)
    add_jobs(r, "q", 1, retry=0)
    assert node.kill() == -9
    node.start()
    r = connect(node)
    assert r.execute_command("QLEN", "q") == 0
    cursor, active = r.execute_command("JSCAN", "STATE", "active", "COUNT", 100)
    assert cursor == "0" and len(active) == 4
    node.kill()
    line = next(x for x in node.output().splitlines() if "loaded from the AOF" in x)
    found = re.search(
        r"4 jobs loaded from the AOF \(3 active: queued again by their RETRY, "
        r"the first in (\d+) s, the last in (\d+) s; "
        r"1 active with RETRY 0: not queued again \(at most once\)\)$",
        line,
    )
    assert found is not None, line
    # At least RETRY seconds from the load (rounded up, minus the time error).
    assert 11 <= int(found[1]) <= 13 and 299 <= int(found[2]) <= 301, line


# ----------------------------------------------------------- controlled restart


@pytest.mark.parametrize("appendonly", ["yes", "no"])
def test_controlled_restart_puts_queues_back(
    conf_nodes: Callable[..., NodeProcess], appendonly: str
) -> None:
    node = conf_nodes(f"appendonly {appendonly}")
    conf = Path(node.args[0])
    r = connect(node)
    ids = add_jobs(r, "q1", 12, retry=60)
    once = add_jobs(r, "q2", 3, retry=0)
    # Two delivered jobs are active, not queued: they must stay out.
    taken = [j for _, j, _ in r.execute_command("GETJOB", "COUNT", 2, "FROM", "q1")]
    assert taken == ids[:2]
    before = {q: r.execute_command("QLEN", q) for q in ("q1", "q2")}
    assert before == {"q1": 10, "q2": 3}

    assert r.config_set("aof-enqueue-jobs-once", "yes")
    r.execute_command("CONFIG", "REWRITE")
    assert "aof-enqueue-jobs-once yes" in conf.read_text()
    shutdown(r, "REWRITE-AOF")
    assert node.proc is not None and node.proc.wait(timeout=15) == 0
    assert (node.workdir / AOF).stat().st_size > 0

    node.start()
    r = connect(node)
    # Right after start, long before any retry: queues exactly as they were.
    assert {q: r.execute_command("QLEN", q) for q in ("q1", "q2")} == before
    assert state(shows(r, [taken[0]])[0]) == "active"
    assert r.config_get("aof-enqueue-jobs-once") == {"aof-enqueue-jobs-once": "no"}
    text = conf.read_text()
    assert "aof-enqueue-jobs-once yes" not in text and f"port {node.port}" in text
    assert persistence(r)["aof_enabled"] == (1 if appendonly == "yes" else 0)
    for queue, expected in (("q1", ids[2:]), ("q2", once)):
        got = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", queue)
        assert [j for _, j, _ in got] == expected  # same jobs, same order

    # The option is off now: a second restart reloads jobs as active only.
    if appendonly == "yes":
        assert node.kill() == -9
        node.start()
        r = connect(node)
        assert r.execute_command("QLEN", "q1") == 0
        assert r.info()["registered_jobs"] == len(ids) + len(once)


@pytest.mark.parametrize("appendonly", ["yes", "no"])
def test_controlled_restart_of_a_node_started_with_flags_only(
    node_factory: Callable[..., NodeProcess], appendonly: str
) -> None:
    """The recipe of docs/persistence.md, for a node with no config file (CONFIG REWRITE
    has nothing to write): SHUTDOWN REWRITE-AOF leaves a marker beside the
    AOF, and the next start with the same flags puts the queues back."""
    node = node_factory("--appendonly", appendonly)
    r = connect(node)
    ids = add_jobs(r, "q", 5, retry=60)
    assert r.config_set("aof-enqueue-jobs-once", "yes")
    shutdown(r, "REWRITE-AOF")
    assert node.proc is not None and node.proc.wait(timeout=15) == 0
    assert (node.workdir / (AOF + ".enqueue-once")).exists()

    node.start()
    r = connect(node)
    assert r.execute_command("QLEN", "q") == 5
    got = r.execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
    assert [j for _, j, _ in got] == ids
    assert not (node.workdir / (AOF + ".enqueue-once")).exists()
    assert r.config_get("aof-enqueue-jobs-once") == {"aof-enqueue-jobs-once": "no"}

    # Once only: a later restart reloads jobs as active (or, with the AOF
    # off, not at all).
    shutdown(r, "NOSAVE")
    assert node.proc.wait(timeout=15) == 0
    node.start()
    r = connect(node)
    assert r.execute_command("QLEN", "q") == 0
    assert r.info()["registered_jobs"] == (5 if appendonly == "yes" else 0)


# ------------------------------------------------------ turning it on and off


def test_config_set_appendonly_at_runtime(node_factory: Any) -> None:
    node: NodeProcess = node_factory()
    r = connect(node)
    info = persistence(r)
    assert (info["aof_enabled"], info["aof_state"]) == (0, "off")
    assert "aof_current_size" not in info
    before = add_jobs(r, "q", 5, retry=60)
    assert r.config_set("appendonly", "yes")
    wait_for(lambda: persistence(r)["aof_state"] == "on", what="aof_state on")
    assert persistence(r)["aof_enabled"] == 1
    path = node.workdir / AOF
    # Turning it on writes every job held so far.
    loaded = [rec for _, _, (_, rec) in aof_records.records(path.read_bytes())]
    assert {rec.id for rec in loaded if isinstance(rec, aof_records.JobRecord)} == set(before)
    after = add_jobs(r, "q", 2, retry=60)

    assert node.kill() == -9
    node.args += ["--appendonly", "yes"]
    node.start()
    r = connect(node)
    assert r.info()["registered_jobs"] == 7
    assert None not in shows(r, before + after)

    # And off again: the file stays, nothing is appended any more.
    size = path.stat().st_size
    assert r.config_set("appendonly", "no")
    info = persistence(r)
    assert (info["aof_enabled"], info["aof_state"]) == (0, "off")
    add_jobs(r, "q", 3)
    assert path.stat().st_size == size


async def fill(c: RespClient, n: int) -> list[str]:
    await c.send_raw(b"".join(encode([b"ADDJOB", b"q", b"x", b"0"]) for _ in range(n)))
    return [str(await c.read()) for _ in range(n)]


@asynccontextmanager
async def aof_memory_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: Any
) -> AsyncIterator[MemoryNode]:
    """An in-process node (it writes its AOF in the working directory)."""
    monkeypatch.chdir(tmp_path)
    async with memory_node(**config) as node:
        try:
            yield node
        finally:
            # Shutting down leaves the append handle to the process exit.
            node.server.env.disk.close(AOF)


async def settle(node: MemoryNode) -> None:
    with trio.fail_after(30):
        while node.server.aof.rewriting or node.server.aof.state == "wait-rewrite":
            await trio.sleep(0.01)


def ids_in_file(path: Path) -> set[str]:
    return {
        rec.id
        for _, _, (_, rec) in aof_records.records(path.read_bytes())
        if isinstance(rec, aof_records.JobRecord)
    }


async def test_appendonly_yes_during_a_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aof_memory_node(tmp_path, monkeypatch) as node:
        c = await node.client()
        ids = await fill(c, 5000)  # a rewrite of several steps
        assert await c.call("BGREWRITEAOF")
        assert node.server.aof.rewriting
        # Used to return at once (a rewrite is running): AOF off, config yes.
        assert await c.call("CONFIG", "SET", "appendonly", "yes")
        await settle(node)
        assert node.server.aof.state == "on" and node.server.node.persisting
        [late] = await fill(c, 1)
        assert ids_in_file(tmp_path / AOF) == {*ids, late}


async def test_appendonly_yes_then_no_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aof_memory_node(tmp_path, monkeypatch) as node:
        aof = node.server.aof
        c = await node.client()
        await fill(c, 3000)
        # In one batch: turning on is spawned, and runs after the "no".
        await c.send_raw(
            encode([b"CONFIG", b"SET", b"appendonly", b"yes"])
            + encode([b"CONFIG", b"SET", b"appendonly", b"no"])
        )
        assert [await c.read(), await c.read()] == ["OK", "OK"]
        await settle(node)
        assert (aof.state, node.server.node.persisting) == ("off", False)
        # Off while the fresh file is being written, then on again.
        assert await c.call("CONFIG", "SET", "appendonly", "yes")
        with trio.fail_after(10):
            while not aof.rewriting:
                await trio.sleep(0)
        assert await c.call("CONFIG", "SET", "appendonly", "no")
        assert (aof.state, node.server.node.persisting) == ("off", False)
        await settle(node)
        # Used to end "on" with nothing written, and no way to turn it on again.
        assert (aof.state, node.server.node.persisting) == ("off", False)
        assert await c.call("CONFIG", "SET", "appendonly", "yes")
        await settle(node)
        assert aof.state == "on" and node.server.node.persisting
        [late] = await fill(c, 1)
        assert late in ids_in_file(tmp_path / AOF)


async def test_delay_survives_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        delayed = str(await c.call("ADDJOB", "q", "b", 0, "DELAY", 60, "RETRY", 5))
        plain = str(await c.call("ADDJOB", "p", "b", 0, "RETRY", 5))
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        t0 = trio.current_time()
        [[_, got, _]] = await c.call("GETJOB", "TIMEOUT", 0, "FROM", "p")
        # RETRY seconds after the load
        assert got.decode() == plain and 4.5 <= trio.current_time() - t0 <= 6
        # Used to come back RETRY seconds after the load too, ignoring DELAY.
        [[_, got, _]] = await c.call("GETJOB", "TIMEOUT", 0, "FROM", "q")
        assert got.decode() == delayed and 59 <= trio.current_time() - t0 <= 61


async def test_a_reloaded_job_announces_its_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reloaded job goes back to its queue at its RETRY, and sends
    WILLQUEUE before, as any re-queue: the holders that saw it acked while
    this node was down answer SETACK. The record of a job added here is
    written before its first queueing sets the flag, so it used to be
    re-queued unannounced (found reading the code behind the chaos test)."""
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        job_id = str(await c.call("ADDJOB", "q", "b", 0, "RETRY", 5))
        assert node.server.node.jobs[job_id].flags & FLAG_BCAST_WILLQUEUE
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        job = node.server.node.jobs[job_id]
        assert job.state == JobState.ACTIVE and job.flags & FLAG_BCAST_WILLQUEUE


async def test_a_reloaded_job_queued_again_counts_an_additional_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulator seed 91 (issue #16 explorer): a job added and delivered,
    reloaded after a restart, then ENQUEUEd: SHOW said 0 additional
    deliveries, as if it had never been queued (its record is written just
    before its first queueing). A job still in its DELAY was never queued:
    its first queueing after a reload is no additional delivery."""
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        job_id = str(await c.call("ADDJOB", "q", "b", 0, "RETRY", 60))
        delayed = str(await c.call("ADDJOB", "d", "b", 0, "RETRY", 60, "DELAY", 30))
        [[_, got, _]] = await c.call("GETJOB", "NOHANG", "FROM", "q")
        assert got.decode() == job_id
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        assert await c.call("ENQUEUE", job_id, delayed) == 2
        for jid, want in ((job_id, 1), (delayed, 0)):
            show = await c.call("SHOW", jid)
            assert show[show.index(b"additional-deliveries") + 1] == want, jid


async def test_reload_on_a_clock_that_went_back_keeps_timers_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        delayed = str(await c.call("ADDJOB", "q", "b", 0, "DELAY", 10, "RETRY", 5))

    def env_behind(seed: int = 1) -> Env:  # restarted on a clock 47.5 s behind
        return Env(TrioClock(skew_ms=-47_500), random.Random(seed), TcpNet(), FileDisk())

    monkeypatch.setattr(helpers, "virtual_env", env_behind)
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        t0 = trio.current_time()
        [[_, got, _]] = await c.call("GETJOB", "TIMEOUT", 0, "FROM", "q")
        # At most DELAY + RETRY after the load: the recorded queue time,
        # 57.5 s away on the new clock, used to be kept.
        assert got.decode() == delayed and trio.current_time() - t0 <= 16


def test_info_persistence_fields(node_factory: Any) -> None:
    node = aof_node(node_factory)
    r = connect(node)
    path = node.workdir / AOF
    info = persistence(r)
    assert info["aof_enabled"] == 1 and info["aof_state"] == "on"
    assert info["aof_rewrite_in_progress"] == 0
    assert info["aof_last_bgrewrite_status"] == "ok"
    assert info["aof_last_write_status"] == "ok"
    assert info["aof_current_size"] == info["aof_base_size"] == 0

    ids = add_jobs(r, "q", 20, retry=60)
    r.execute_command("ACKJOB", *ids[:10])
    info = persistence(r)
    assert info["aof_current_size"] == path.stat().st_size > 0
    assert info["aof_base_size"] == 0

    assert r.execute_command("BGREWRITEAOF")
    wait_for(lambda: persistence(r)["aof_rewrite_in_progress"] == 0, what="rewrite")
    info = persistence(r)
    assert info["aof_last_bgrewrite_status"] == "ok"
    # The rewrite keeps only the 10 jobs still held: smaller than before.
    assert info["aof_current_size"] == info["aof_base_size"] == path.stat().st_size
    assert len(record_ends(path.read_bytes())) == 10
    add_jobs(r, "q", 1)
    info = persistence(r)
    assert info["aof_current_size"] == path.stat().st_size > info["aof_base_size"]

    # Automatic rewrite once the file doubled since the last one.
    base = info["aof_base_size"]
    r.execute_command("ACKJOB", *add_jobs(r, "q", 20, retry=60))
    assert persistence(r)["aof_current_size"] > 2 * base
    assert r.config_set("auto-aof-rewrite-min-size", "1kb")  # default 64mb
    info = wait_for(
        lambda: (i := persistence(r))["aof_base_size"] != base and i, what="auto rewrite"
    )
    assert info["aof_base_size"] < base * 2 and info["aof_last_bgrewrite_status"] == "ok"
    assert len(record_ends(path.read_bytes())) == 11


# ------------------------------------------------------------- rewrite under load


def test_bgrewriteaof_under_load(node_factory: Any) -> None:
    node = aof_node(node_factory, "everysec")
    r = connect(node)
    # Enough jobs that a rewrite takes several steps (1000 jobs each) and
    # commands are served between them.
    prefill = add_jobs(r, "q", 10_000, retry=60)
    added: list[str] = []
    acked: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    during = 0  # jobs added while a rewrite ran (give or take one)

    def writer() -> None:
        w = connect(node)
        try:
            i = 0
            while not stop.is_set():
                job_id = w.execute_command("ADDJOB", "w", f"x{i}", 0, "RETRY", 60)
                added.append(job_id)
                if i % 10 == 0:
                    assert w.execute_command("ACKJOB", job_id) == 1
                    acked.append(job_id)
                i += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(3):
            n = len(added)
            wait_for(lambda n=n: len(added) > n + 20, what="writes before a rewrite")
            n = len(added)
            assert r.execute_command("BGREWRITEAOF")  # redis-py: "+Background ..." -> True
            wait_for(lambda: persistence(r)["aof_rewrite_in_progress"] == 0, what="rewrite")
            assert persistence(r)["aof_last_bgrewrite_status"] == "ok"
            during += len(added) - n
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert during > 0
    assert node.kill() == -9
    node.start()
    r = connect(node)
    kept = [j for j in added if j not in set(acked)]
    assert r.info()["registered_jobs"] == len(prefill) + len(kept)
    assert None not in shows(r, prefill + kept)
    assert shows(r, acked) == [None] * len(acked)


# -------------------------------------------------------- torn tail and damage


def test_torn_tail_is_cut_with_a_warning(node_factory: Any) -> None:
    node = aof_node(node_factory)
    r = connect(node)
    ids = add_jobs(r, "q", 4, retry=60)
    assert node.kill() == -9
    path = node.workdir / AOF
    data = path.read_bytes()
    ends = record_ends(data)
    assert len(ends) == 4 and ends[-1] == len(data)
    cut = (ends[-2] + ends[-1]) // 2  # in the middle of the last record
    path.write_bytes(data[:cut])

    node.start()
    r = connect(node)
    assert [s is not None for s in shows(r, ids)] == [True, True, True, False]
    assert path.stat().st_size == ends[-2]
    # The node goes on appending after the cut.
    [extra] = add_jobs(r, "q", 1)
    assert node.kill() == -9
    out = node.output()
    assert "short read" in out and f"offset {ends[-2]}" in out
    node.start()
    assert None not in shows(connect(node), [*ids[:3], extra])


def test_damage_stops_the_node_with_one_line(node_factory: Any) -> None:
    node = aof_node(node_factory)
    ids = add_jobs(connect(node), "q", 3, retry=60)
    assert node.kill() == -9
    path = node.workdir / AOF
    data = path.read_bytes()
    at = record_ends(data)[0]
    path.write_bytes(data[:at] + b"\x00\x07garbage\r\n" + data[at:])

    args = ["--port", str(node.port), "--bind", "127.0.0.1", "--appendonly", "yes"]
    result = subprocess.run(
        [sys.executable, "-m", "disque_trio", *args],
        cwd=node.workdir,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if " # " in line]  # warning level
    assert len(lines) == 1, result.stderr
    assert f"byte offset {at}" in lines[0] and "check-aof --fix" in lines[0]
    assert "Traceback" not in result.stderr
    assert path.read_bytes()[at : at + 2] == b"\x00\x07"  # left alone

    fixed = check_aof("--fix", "--yes", path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert path.read_bytes() == data  # only the garbage went
    node.start()
    assert [s is not None for s in shows(connect(node), ids)] == [True, True, True]


def check_aof(
    *args: str | Path, stdin: int | None = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    """``disque-trio check-aof`` in a process of its own; no terminal on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "disque_trio", "check-aof", *map(os.fspath, args)],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def by_job(data: bytes) -> dict[tuple[bytes, str], bytes]:
    """Each record's bytes, keyed by (kind, job ID)."""
    out = {}
    for start, end, (kind, payload) in aof_records.records(data):
        job_id = payload.id if isinstance(payload, aof_records.JobRecord) else str(payload)
        out[(kind, job_id)] = data[start:end]
    return out


def test_check_aof_fix_keeps_every_record_around_the_damage(node_factory: Any) -> None:
    """A real AOF damaged in two places in the middle: check-aof says what a
    repair drops, refuses to change it without a terminal or --yes, then
    keeps every untouched job and ack record, with a backup."""
    node = aof_node(node_factory)
    r = connect(node)
    ids = add_jobs(r, "q", 5, retry=60)
    assert r.execute_command("ACKJOB", ids[1], ids[3]) == 2
    assert node.kill() == -9
    path = node.workdir / AOF
    data = path.read_bytes()
    recs = by_job(data)
    load, ack, dele = aof_records.LOADJOB, aof_records.ACKJOB, aof_records.DELJOB
    assert set(recs) == {(load, i) for i in ids} | {
        (k, ids[j]) for k in (ack, dele) for j in (1, 3)
    }
    # Damage job 2's LOADJOB (its trailing CRLF) and both the ACKJOB and the
    # DELJOB of job 3 (garbage over the bytes where one ends and the next starts).
    damaged = data
    rec = recs[(load, ids[2])]
    damaged = damaged.replace(rec, rec[:-2] + b"\x00\x00", 1)
    pair = recs[(ack, ids[3])] + recs[(dele, ids[3])]
    cut = len(recs[(ack, ids[3])])
    assert pair in data  # one ACKJOB command: each ACKJOB is followed by its DELJOB
    damaged = damaged.replace(pair, pair[: cut - 2] + b"\xff" * 6 + pair[cut + 4 :], 1)
    assert len(damaged) == len(data) and pair not in damaged and rec not in damaged
    path.write_bytes(damaged)

    checked = check_aof(path)
    assert checked.returncode == 1
    out = checked.stdout
    assert "Damaged: bytes" in out and "Torn" not in out
    assert f"LOADJOB of {ids[2]}: this job is lost on this node" in out
    assert f"ACKJOB of {ids[3]}: the acknowledgement is lost" in out
    assert f"DELJOB of {ids[3]}: the deletion is lost" in out
    assert (
        "Jobs affected: 1 job lost, 1 acknowledged job comes back not acknowledged, "
        "0 deleted jobs come back"
    ) in out
    assert "A repair keeps all 6 valid records" in out

    refused = check_aof("--fix", path)  # stdin is no terminal
    assert refused.returncode == 1
    assert refused.stderr == (
        f"Refusing to change {path} without confirmation: stdin is not a terminal "
        "(add --yes to repair it)\n"
    )
    assert path.read_bytes() == damaged and not list(node.workdir.glob("*.bak*"))

    fixed = check_aof("--fix", "--yes", path)
    assert fixed.returncode == 0, fixed.stderr
    assert f"Original kept as {path}.bak" in fixed.stdout
    assert (node.workdir / (AOF + ".bak")).read_bytes() == damaged
    kept = [
        c for key, c in recs.items() if key not in {(load, ids[2]), (ack, ids[3]), (dele, ids[3])}
    ]
    assert path.read_bytes() == b"".join(sorted(kept, key=data.index))
    assert check_aof(path).returncode == 0

    # A second repair of the same name keeps the first backup.
    path.write_bytes(damaged)
    assert check_aof("--fix", "--yes", path).returncode == 0
    assert (node.workdir / (AOF + ".bak.1")).read_bytes() == damaged

    node.start()
    got = [state(s) for s in shows(connect(node), ids)]
    # Job 1 stays acknowledged and deleted, job 2 is lost, job 3 comes back.
    assert got[1] is None and got[2] is None
    assert None not in (got[0], got[3], got[4])


def test_check_aof_leaves_a_file_that_is_not_an_aof_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    text = b"shopping list\n*2 eggs\n"
    path.write_bytes(text)
    for args in ([path], ["--fix", path], ["--fix", "--yes", path]):
        result = check_aof(*args)
        assert result.returncode == 1
        assert result.stdout.startswith(f"{path} is not an AOF: it does not start with")
        assert ("Nothing was changed." in result.stdout) == ("--fix" in args)
    assert path.read_bytes() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_check_aof_asks_on_a_terminal(tmp_path: Path) -> None:
    data = aof_records.loadjob(sample_record(1)) + aof_records.loadjob(sample_record(2))
    damaged = data[:10] + b"junk" + data[10:]
    path = tmp_path / AOF
    path.write_bytes(damaged)
    for answer, code in ((b"\n", 1), (b"n\n", 1), (b"y\n", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, answer)
            result = check_aof("--fix", path, stdin=terminal)
        finally:
            os.close(controller)
            os.close(terminal)
        assert result.returncode == code, result.stdout + result.stderr
        assert f"Repair {path} (the original is kept as {path}.bak" in result.stdout
        assert "[y/N]" in result.stdout
        if code:
            assert "Nothing was changed." in result.stdout
            assert path.read_bytes() == damaged
    assert path.read_bytes() == data[:0] + aof_records.loadjob(sample_record(2))
    assert (tmp_path / (AOF + ".bak")).read_bytes() == damaged


def sample_record(n: int) -> aof_records.JobRecord:
    return aof_records.JobRecord(
        f"D-dcb833cf-{n:024x}-05a1", "q", b"body", 3, 1, n, 1_800_000_000, 0, 60, 0, 0, (), 0, 0
    )


async def test_unwritable_aof_never_acknowledges_a_job(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from disque_trio.env import FileDisk

    class FullDisk(FileDisk):
        full = False

        def append(self, path: str, data: bytes) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().append(path, data)

    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        disk = FullDisk()
        node.server.env.disk = disk
        node.server.aof.state = "on"
        c = await node.client()
        assert isinstance(await c.call("ADDJOB", "q", "ok", 0), Status)
        disk.full = True
        await c.send("ADDJOB", "q", "waits", 0)
        with trio.move_on_after(5):  # five retries, virtual seconds
            await c.read()
            raise AssertionError("a job ID for a job that is not on disk")
        other = await node.client()
        refused = await other.call("ADDJOB", "q", "x", 0)
        assert isinstance(refused, ReplyError) and refused.code == "MISCONF"
        assert "No space left" in refused.message
        assert await other.call("QLEN", "q") == 2  # reads still work; the refused one is not in
        disk.full = False  # space again: the next retry writes it, and the ID goes out
        with trio.fail_after(1.5):
            assert isinstance(await c.read(), Status)
        assert isinstance(await other.call("ADDJOB", "q", "x", 0), Status)
        disk.close(node.server.aof.path)
    assert (tmp_path / AOF).read_bytes().count(b"waits") == 1  # written once, whole


async def test_a_rewrite_keeps_the_dummy_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dummy ack is an ACKJOB record of an ID no LOADJOB names: a rewrite
    writes it again (it keeps only jobs with a body otherwise)."""
    async with aof_memory_node(tmp_path, monkeypatch, appendonly="yes") as node:
        c = await node.client()
        [kept] = await fill(c, 1)
        core = node.server.node
        dummy = "D-" + "77e1a0b2" + "-" + "A" * 24 + "-0003"
        core.register(dummy_ack(dummy, core.now_ms()))
        node.server.commit()  # its own ACKJOB record, as an ACKJOB command's
        await trio.sleep(0.1)  # written before the rewrite starts
        assert await c.call("BGREWRITEAOF")
        await settle(node)
        data = (tmp_path / AOF).read_bytes()
        written = [
            (name, rec.id if isinstance(rec, aof_records.JobRecord) else rec)
            for _, _, (name, rec) in aof_records.records(data)
        ]
        assert written == [(aof_records.LOADJOB, kept), (aof_records.ACKJOB, dummy)]
