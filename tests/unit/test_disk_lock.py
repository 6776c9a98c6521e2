"""Disk.lock: one node per cluster-config-file (issue 57)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from disque_trio.env import FileDisk, LockedError
from sim.disk import DiskHandle, SimDisk


def test_a_second_lock_on_a_path_fails_until_the_first_is_released(tmp_path: Path) -> None:
    conf = str(tmp_path / "nodes.conf")
    first, second = FileDisk(), FileDisk()
    first.lock(conf)
    with pytest.raises(LockedError) as refused:
        second.lock(conf)
    assert str(refused.value) == (
        f"{conf} is in use by another disque-trio node (pid {os.getpid()})"
    )
    assert (refused.value.path, refused.value.pid) == (conf, os.getpid())
    assert (tmp_path / "nodes.conf.lock").read_text() == f"{os.getpid()}\n"
    first.unlock(conf)
    second.lock(conf)
    second.unlock(conf)


def test_the_lock_outlives_the_files_replacement(tmp_path: Path) -> None:
    """nodes.conf is saved by renaming a new file over it: the lock is on a
    file beside it, so saving does not drop it."""
    disk = FileDisk()
    conf = str(tmp_path / "nodes.conf")
    disk.lock(conf)
    try:
        disk.replace(conf, b"saved\n")
        disk.replace(conf, b"saved again\n")
        with pytest.raises(LockedError):
            FileDisk().lock(conf)
    finally:
        disk.unlock(conf)


def test_a_relative_path_is_named_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    disk = FileDisk()
    disk.lock("nodes.conf")
    try:
        with pytest.raises(LockedError, match=f"^{tmp_path / 'nodes.conf'} is in use"):
            FileDisk().lock("nodes.conf")
    finally:
        disk.unlock("nodes.conf")


def test_an_empty_lock_file_names_no_pid(tmp_path: Path) -> None:
    """A holder that has not written its pid yet (or could not)."""
    conf = str(tmp_path / "nodes.conf")
    disk = FileDisk()
    disk.lock(conf)
    try:
        (tmp_path / "nodes.conf.lock").write_text("")
        with pytest.raises(LockedError) as refused:
            FileDisk().lock(conf)
        assert refused.value.pid is None
        assert str(refused.value) == f"{conf} is in use by another disque-trio node"
    finally:
        disk.unlock(conf)


def test_a_path_that_cannot_be_locked_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileDisk().lock(str(tmp_path / "missing" / "nodes.conf"))


def test_the_simulated_disk_locks_nothing() -> None:
    """The simulator runs several nodes, and restarts them, in one process."""
    disk = SimDisk()
    disk.lock("nodes.conf")
    disk.lock("nodes.conf")
    DiskHandle(disk).lock("nodes.conf")
    assert disk.read("nodes.conf.lock") is None
