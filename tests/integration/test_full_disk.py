"""A full disk, for real: a node whose AOF lives on a small tmpfs the test
mounts (as root, as CI runs; skipped, saying why, otherwise) fills it, is
refused writes, serves reads, and once the filesystem grows writes again
within about a second, with nothing half-applied: every ADDJOB is either
answered with its ID and recorded, or refused with -MISCONF and changed
nothing, here or on the other node (no REPLJOB left for it); an ADDJOB
whose record could not be written waits for the disk and is then
answered."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from .conftest import NodeProcess

pytestmark = pytest.mark.slow

BODY = "x" * 2000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs, unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
        capture_output=True,
        timeout=30,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _grow(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=30m", str(mnt)], check=True, timeout=30)


def _connect(node: NodeProcess) -> redis.Redis:
    return redis.Redis(port=node.port, decode_responses=True, socket_timeout=60, retry=None)


class Producer(threading.Thread):
    """ADDJOBs one at a time on one connection until told to stop; the IDs
    answered, and the error that ended it, if any."""

    def __init__(self, node: NodeProcess, replicate: int) -> None:
        super().__init__(daemon=True)
        self.r = _connect(node)
        self.replicate = replicate
        self.ids: list[str] = []
        self.error: str | None = None
        self.last_reply = time.monotonic()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                job_id = self.r.execute_command(
                    "ADDJOB", "q", BODY, 0, "REPLICATE", self.replicate, "RETRY", 60
                )
            except (redis.ResponseError, redis.ConnectionError) as e:
                self.error = str(e)
                return
            self.ids.append(job_id)
            self.last_reply = time.monotonic()


def _wait_for(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _fill_then_grow(
    node: NodeProcess, mnt: Path, replicate: int, while_full: Any = None
) -> tuple[Producer, float]:
    """Add jobs until the disk is full; check what a full disk means (and
    ``while_full(jobs answered)``); grow it. Returns the producer (stopped)
    and the seconds from the growth to the first ADDJOB accepted again."""
    producer = Producer(node, replicate)
    producer.start()
    # Full: the producer's ADDJOB whose record could not be written waits.
    _wait_for(lambda: time.monotonic() - producer.last_reply > 1.5, 120, "the disk to fill")
    r = _connect(node)
    with pytest.raises(redis.ResponseError, match="MISCONF Errors writing to the AOF file"):
        r.execute_command("ADDJOB", "q", BODY, 0, "REPLICATE", replicate)
    answered = len(producer.ids)
    assert r.execute_command("QLEN", "q") == answered + 1  # the one waiting is applied
    assert r.info("persistence")["aof_last_write_status"] == "err"
    assert r.info("persistence")["aof_buffer_length"] > 0
    if while_full is not None:
        while_full(answered)
    _grow(mnt)
    grown = time.monotonic()
    while True:
        try:
            r.execute_command("ADDJOB", "probe", "p", 0, "REPLICATE", replicate)
            break
        except redis.ResponseError as e:
            assert "MISCONF" in str(e)
            assert time.monotonic() - grown < 10, "still MISCONF 10 s after the disk grew"
            time.sleep(0.01)
    recovered = time.monotonic() - grown
    _wait_for(lambda: len(producer.ids) > answered, 10, "the waiting ADDJOB's reply")
    producer.stop.set()
    producer.join(timeout=30)
    assert producer.error is None
    assert r.info("persistence")["aof_last_write_status"] == "ok"
    return producer, recovered


def _log_lines(node: NodeProcess) -> tuple[int, int]:
    out = node.output()
    return out.count("Error writing to the AOF file"), out.count("AOF write error looks solved")


def test_a_full_disk_refuses_writes_and_heals_once_space_is_back(
    node_factory: Any, small_disk: Path
) -> None:
    node: NodeProcess = node_factory(
        "--appendonly", "yes", "--appendfsync", "always", "--dir", str(small_disk)
    )
    before = _connect(node).execute_command("CLUSTER", "MYID")

    def no_reset(answered: int) -> None:
        # A reset kept in memory only would be undone by a crash: refused,
        # nothing changed.
        r = _connect(node)
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            r.execute_command("CLUSTER", "RESET", "HARD")
        assert r.execute_command("CLUSTER", "MYID") == before
        assert r.execute_command("QLEN", "q") == answered + 1

    producer, recovered = _fill_then_grow(node, small_disk, replicate=1, while_full=no_reset)
    print(f"writes accepted again {recovered:.3f} s after the disk grew")
    assert recovered < 2.0
    assert _log_lines(node) == (1, 1)
    r = _connect(node)
    assert r.execute_command("QLEN", "q") == len(producer.ids)
    # Everything answered is in the file, which loads whole after a kill -9.
    node.kill(signal.SIGKILL)
    node.start()
    r = _connect(node)
    assert r.info("jobs")["registered_jobs"] == len(producer.ids) + 1  # and the probe
    assert "Bad file format" not in node.output()


def test_a_full_disk_sends_no_copy_of_what_it_could_not_record(
    node_factory: Any, small_disk: Path
) -> None:
    full: NodeProcess = node_factory(
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--dir",
        str(small_disk),
        "--cluster-node-timeout",
        "2000",
    )
    other: NodeProcess = node_factory("--cluster-node-timeout", "2000")
    _connect(full).execute_command("CLUSTER", "MEET", "127.0.0.1", other.port)
    _wait_for(lambda: len(_connect(other).execute_command("HELLO")) == 4, 20, "the cluster")

    def copies_on_other() -> int:
        return int(_connect(other).info("jobs")["registered_jobs"])

    def while_full(answered: int) -> None:
        # The ADDJOB waiting for its record got its copy first (the maker
        # records a job once replicated): it will be answered. One refused
        # with -MISCONF made none.
        assert copies_on_other() == answered + 1
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            _connect(full).execute_command("ADDJOB", "q", BODY, 0, "REPLICATE", 2)
        time.sleep(1.0)
        assert copies_on_other() == answered + 1

    producer, recovered = _fill_then_grow(full, small_disk, 2, while_full)
    assert recovered < 2.0
    _wait_for(lambda: copies_on_other() == len(producer.ids) + 1, 10, "the copies")
    assert _log_lines(full) == (1, 1)
