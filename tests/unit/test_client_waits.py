"""The client's new job commands, sans I/O: NACK/ENQUEUE with DELAY,
WAITJOB and its slices (JobWait), ADDJOB's delay from an ETA."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from disque_trio.client import JobNodeUnavailableError, Router, commands
from disque_trio.client._base import combine, schedule_delay
from disque_trio.client.waits import JobWait
from disque_trio.protocol.replies import NULL_ARRAY

from .test_client_sansio import A, B, C, job_id, three_nodes


def test_nack_and_enqueue_delay_arguments() -> None:
    assert commands.nack(job_id(A), delay=2.1).args == (
        b"NACK",
        job_id(A).encode(),
        b"DELAY",
        b"3",
    )
    assert commands.nack(job_id(A), delay=0).args == (b"NACK", job_id(A).encode())
    assert commands.enqueue(job_id(A), delay=5).args[-2:] == (b"DELAY", b"5")


def test_a_routed_command_split_by_node_keeps_its_tail() -> None:
    router = three_nodes()
    parts = router.route(commands.nack(job_id(A), job_id(B), delay=4))
    assert [cmd.args for _, cmd in parts] == [
        (b"NACK", job_id(A).encode(), b"DELAY", b"4"),
        (b"NACK", job_id(B).encode(), b"DELAY", b"4"),
    ]


def test_waitjob_command() -> None:
    cmd = commands.waitjob(job_id(A), job_id(B), timeout_ms=250)
    assert cmd.args == (b"WAITJOB", job_id(A).encode(), job_id(B).encode(), b"TIMEOUT", b"250")
    assert cmd.block == 0.25 and cmd.idempotent and cmd.routed
    assert commands.waitjob(job_id(A)).block is None  # no TIMEOUT: for ever
    assert cmd.parse([b"acked", "pending"]) == ["acked", "pending"]
    with pytest.raises(Exception, match="WAITJOB outcome"):
        cmd.parse([b"done"])
    with pytest.raises(ValueError):
        commands.waitjob()


def test_split_waitjob_answers_come_back_in_the_order_asked() -> None:
    cmd = commands.waitjob(job_id(B), job_id(A), job_id(B, 1))
    parts = [cmd.for_ids([job_id(A)]), cmd.for_ids([job_id(B), job_id(B, 1)])]
    assert combine(cmd, parts, [["gone"], ["acked", "unknown"]]) == ["acked", "gone", "unknown"]
    counted = commands.ackjob(job_id(A), job_id(B))
    assert combine(counted, [counted, counted], [1, 1]) == 2


def test_a_waitjob_part_that_knows_nothing_is_asked_again_on_the_current_node() -> None:
    cmd = commands.waitjob(job_id(B))
    assert Router.fall_back(cmd, ["unknown"])
    assert not Router.fall_back(cmd, ["unknown", "acked"])
    assert not Router.fall_back(cmd, ["pending"])


def test_jobwait_slices_and_drops_what_is_done() -> None:
    wait = JobWait([job_id(A), job_id(B), job_id(A)], timeout=12.0, poll=5.0, now=100.0)
    first = wait.next_command(100.0)
    assert first is not None and first.args[1:3] == (job_id(A).encode(), job_id(B).encode())
    assert first.args[-2:] == (b"TIMEOUT", b"5000")
    wait.feed(["acked", "pending"], first)
    second = wait.next_command(110.0)
    assert second is not None and second.job_ids == (job_id(B),)
    assert second.args[-1] == b"2000"  # what is left of the 12 s
    wait.feed(["pending"], second)
    assert wait.next_command(112.0) is None
    router = three_nodes()
    assert wait.result(router, 112.0) == {job_id(A): "acked", job_id(B): "pending"}


def test_jobwait_for_ever_and_at_once() -> None:
    forever = JobWait([job_id(A)], timeout=None, poll=5.0, now=0.0)
    for now in (0.0, 1e6):
        cmd = forever.next_command(now)
        assert cmd is not None and cmd.args[-1] == b"5000"
        forever.feed(["pending"], cmd)
    now_only = JobWait([job_id(A)], timeout=0, poll=5.0, now=0.0)
    cmd = now_only.next_command(0.0)
    assert cmd is not None and cmd.args[-1] == b"1"  # asked once, at once
    now_only.feed(["pending"], cmd)
    assert now_only.next_command(0.0) is None


def test_unknown_is_an_error_when_the_jobs_node_is_out_of_reach() -> None:
    router = three_nodes()  # C has priority 100: failing or leaving
    wait = JobWait([job_id(A), job_id(C)], timeout=1.0, poll=5.0, now=0.0)
    cmd = wait.next_command(0.0)
    assert cmd is not None
    wait.feed(["unknown", "acked"], cmd)
    assert wait.result(router, 0.0) == {job_id(A): "unknown", job_id(C): "acked"}
    wait = JobWait([job_id(C)], timeout=1.0, poll=5.0, now=0.0)
    cmd = wait.next_command(0.0)
    assert cmd is not None
    wait.feed(["unknown"], cmd)
    with pytest.raises(JobNodeUnavailableError, match=job_id(C)):
        wait.result(router, 0.0)


def test_creator_out() -> None:
    router = three_nodes()
    assert not router.creator_out(job_id(B), 0.0)
    assert router.creator_out(job_id(C), 0.0)  # priority 100
    assert router.creator_out(job_id("dddddddd"), 0.0)  # not in the cluster
    router.failed(("127.0.0.1", 2), now=10.0)
    assert router.creator_out(job_id(B), 10.0)
    assert not router.creator_out(job_id(B), 1e6)  # its rest is over
    assert not Router([("h", 1)]).creator_out(job_id(B), 0.0)  # knows nothing yet


def test_schedule_delay() -> None:
    now = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
    assert schedule_delay(None, None, now) is None
    assert schedule_delay(2.2, None, now) == 3
    assert schedule_delay(None, now + timedelta(seconds=90.5), now) == 91
    assert schedule_delay(None, now - timedelta(hours=1), now) == 0  # past: at once
    paris = timezone(timedelta(hours=1))
    assert schedule_delay(None, datetime(2026, 12, 4, 13, 1, tzinfo=paris), now) == 60
    with pytest.raises(ValueError, match="not both"):
        schedule_delay(1, now, now)
    with pytest.raises(ValueError, match="negative"):
        schedule_delay(-1, None, now)


def test_show_reads_delayed_requeue() -> None:
    reply = ["id", job_id(A), "queue", "q", "state", "active", "delayed-requeue", 1]
    info = commands.show(job_id(A)).parse(reply)
    assert info is not None and info.delayed_requeue and info.extra == {}
    assert commands.show(job_id(A)).parse(NULL_ARRAY) is None
    original = commands.show(job_id(A)).parse(["id", job_id(A), "queue", "q"])
    assert original is not None and not original.delayed_requeue
