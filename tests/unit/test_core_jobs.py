"""Job commands on one node: ADDJOB, ACKJOB, FASTACK, NACK, ENQUEUE, DEQUEUE,
DELJOB, WORKING, SHOW, JSCAN, with the original's exact error texts."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from disque_trio.core.effects import Persist
from disque_trio.core.ids import is_at_most_once_id
from disque_trio.core.job import JobState
from disque_trio.core.jobcmds import AddJobArgs
from disque_trio.core.node import chatter_slot_end
from disque_trio.core.queue import Pause
from disque_trio.core.records import job_record, replay
from disque_trio.protocol import aof
from disque_trio.protocol.replies import ReplyError, Status

from .core_support import (
    NODE_ID,
    OTHER_ID,
    START_MS,
    add,
    check_invariants,
    elapse,
    error_line,
    fields,
    get,
    hook,
    ids_of,
    job,
    make_node,
    run,
    tick_at,
)

NOREPL = "NOREPL Not enough reachable nodes for the requested replication level"
SHOW_KEYS = [
    "id",
    "queue",
    "state",
    "repl",
    "ttl",
    "ctime",
    "delay",
    "retry",
    "nacks",
    "additional-deliveries",
    "nodes-delivered",
    "nodes-confirmed",
    "next-requeue-within",
    "next-awake-within",
    "body",
    "delayed-requeue",  # ours, after the original's fields
]

# ------------------------------------------------------------------ ADDJOB


def test_addjob_returns_status_id_and_queues() -> None:
    node, _ = make_node()
    reply = run(node, "ADDJOB", "q", "hello", 0)
    assert isinstance(reply, Status)
    j = job(node, reply)
    assert j.state == JobState.QUEUED and j.body == b"hello" and j.queue == "q"
    assert run(node, "QLEN", "q") == 1
    assert node.stats.added_jobs == 1
    check_invariants(node)


def test_addjob_empty_and_binary_bodies() -> None:
    node, _ = make_node()
    a = add(node, "q", b"")
    b = add(node, "q", b"\x00\xff\r\n")
    assert get(node, "q", count=2) == [["q", a, b""], ["q", b, b"\x00\xff\r\n"]]


@pytest.mark.parametrize(
    ("ttl", "retry"),
    [(5, 1), (9, 1), (10, 1), (100, 10), (2000, 200), (3000, 300), (86400, 300), (10**6, 300)],
)
def test_default_retry_is_ttl_over_10_capped_min_1(ttl: int, retry: int) -> None:
    node, _ = make_node()
    job_id = add(node, "q", "b", "TTL", ttl)
    assert job(node, job_id).retry == retry


def test_defaults() -> None:
    node, _ = make_node()
    info = fields(run(node, "SHOW", add(node)))
    assert info["ttl"] == 86400 and info["retry"] == 300 and info["delay"] == 0
    assert info["repl"] == 1  # min(3, cluster size) on a node alone


def test_addjob_options_are_case_insensitive_and_applied() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "b", "replicate", 1, "Delay", 5, "rEtRy", 7, "ttl", 60, "maxlen", 9)
    j = job(node, job_id)
    assert (j.repl, j.delay, j.retry, j.etime) == (1, 5, 7, START_MS // 1000 + 60)
    assert j.state == JobState.ACTIVE  # delayed: not queued yet
    assert run(node, "QLEN", "q") == 0


def test_addjob_async_on_single_node() -> None:
    node, _ = make_node()
    job_id = add(node, "q", "b", "ASYNC")
    assert job(node, job_id).state == JobState.QUEUED


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["REPLICATE", 0], "ERR REPLICATE must be between 1 and 65535"),
        (["REPLICATE", 65536], "ERR REPLICATE must be between 1 and 65535"),
        (["REPLICATE", -1], "ERR REPLICATE must be between 1 and 65535"),
        (["REPLICATE", "x"], "ERR REPLICATE must be between 1 and 65535"),
        (["TTL", 0], "ERR TTL must be a number > 0"),
        (["TTL", -5], "ERR TTL must be a number > 0"),
        (["TTL", "1.5"], "ERR TTL must be a number > 0"),
        (["RETRY", -1], "ERR RETRY time must be a non negative number"),
        (["RETRY", "abc"], "ERR RETRY time must be a non negative number"),
        (["DELAY", -1], "ERR DELAY time must be a non negative number"),
        (["DELAY", ""], "ERR DELAY time must be a non negative number"),
        (["MAXLEN", 0], "ERR MAXLEN must be a positive number"),
        (["MAXLEN", -3], "ERR MAXLEN must be a positive number"),
        (["FOO"], "ERR syntax error"),
        (["FOO", 1], "ERR syntax error"),
        (["TTL"], "ERR syntax error"),  # option without its value
        (["ASYNC", "REPLICATE"], "ERR syntax error"),
        (
            ["REPLICATE", 2, "RETRY", 0],
            "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 "
            "(at-most-once delivery)",
        ),
        (
            ["DELAY", 10, "TTL", 10],
            "ERR The specified DELAY is greater than TTL. Job refused since would never "
            "be delivered",
        ),
        (
            ["DELAY", 100],  # default TTL is a day: fine
            None,
        ),
        (["REPLICATE", 2], NOREPL),
        (["REPLICATE", 3, "ASYNC"], NOREPL),
        (["REPLICATE", 65535], NOREPL),
    ],
)
def test_addjob_validation(opts: list[Any], message: str | None) -> None:
    node, _ = make_node()
    reply = run(node, "ADDJOB", "q", "b", 0, *opts)
    if message is None:
        assert not isinstance(reply, ReplyError)
    else:
        assert error_line(reply) == message
        assert not node.jobs and node.stats.added_jobs == 0


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        ("x", "ERR timeout is not an integer or out of range"),
        ("1.5", "ERR timeout is not an integer or out of range"),
        ("99999999999999999999", "ERR timeout is not an integer or out of range"),
        ("-1", "ERR timeout is negative"),
    ],
)
def test_addjob_timeout_errors(timeout: str, message: str) -> None:
    node, _ = make_node()
    assert error_line(run(node, "ADDJOB", "q", "b", timeout)) == message


def test_addjob_options_are_parsed_before_the_timeout() -> None:
    node, _ = make_node()
    reply = run(node, "ADDJOB", "q", "b", "bad", "TTL", 0)
    assert error_line(reply) == "ERR TTL must be a number > 0"


def test_addjob_retry_zero_replicate_checked_before_norepl() -> None:
    node, _ = make_node()
    reply = run(node, "ADDJOB", "q", "b", 0, "REPLICATE", 5, "RETRY", 0)
    assert "RETRY set to 0" in error_line(reply)


def test_addjob_replicate_ok_when_peers_are_reachable() -> None:
    node, _ = make_node()
    node.cluster_size, node.reachable_peers = 3, 2
    assert error_line(run(node, "ADDJOB", "q", "b", 0, "REPLICATE", 4)) == NOREPL
    assert not isinstance(run(node, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "ASYNC"), ReplyError)


# RETRY against TTL. The original (disque 1.0-rc1, job.c addjobCommand)
# checks neither against the other: ADDJOB q body 0 RETRY 100 TTL 10 is
# accepted as given, SHOW says retry 100, and the job, never re-queued
# before it expires, is delivered at most once although its ID says
# at-least-once (odd TTL digits). Only RETRY 0 with REPLICATE > 1 and
# DELAY >= TTL are refused. This node does the same.
@pytest.mark.parametrize(
    ("opts", "ttl", "retry"),
    [
        (["RETRY", 10, "TTL", 10], 10, 10),  # RETRY == TTL
        (["RETRY", 11, "TTL", 10], 10, 11),  # RETRY > TTL
        (["RETRY", 100, "TTL", 10], 10, 100),
        (["TTL", 10, "RETRY", 100], 10, 100),  # order does not matter
        (["RETRY", 2**32 - 1, "TTL", 10], 10, 2**32 - 1),  # the largest RETRY
        (["TTL", 5], 5, 1),  # default RETRY: TTL/10, at least 1
        (["TTL", 1], 1, 1),  # ... so RETRY == TTL
        (["RETRY", 0], 86400, 0),  # alone, REPLICATE defaults to 1: at-most-once
        (["RETRY", 0, "TTL", 1], 1, 0),
        (["REPLICATE", 1, "RETRY", 0, "TTL", 10], 10, 0),
        (["DELAY", 5, "RETRY", 100, "TTL", 10], 10, 100),  # only DELAY is held to TTL
    ],
)
def test_addjob_retry_is_not_checked_against_ttl(opts: list[Any], ttl: int, retry: int) -> None:
    node, _ = make_node()
    args = AddJobArgs(node, [str(a).encode() for a in ["ADDJOB", "q", "b", 0, *opts]])
    assert (args.ttl, args.retry) == (ttl, retry)
    job_id = add(node, "q", "b", *opts)
    info = fields(run(node, "SHOW", job_id))
    assert (info["ttl"], info["retry"]) == (ttl, retry)
    assert is_at_most_once_id(job_id) == (retry == 0)


def test_addjob_retry_zero_needs_replicate_1_in_a_cluster() -> None:
    """Where the default REPLICATE is more than 1, RETRY 0 alone is refused."""
    node, _ = make_node()
    node.cluster_size = node.staying_size = 3
    node.reachable_peers = 2
    message = (
        "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
    )
    assert error_line(run(node, "ADDJOB", "q", "b", 0, "RETRY", 0)) == message
    assert error_line(run(node, "ADDJOB", "q", "b", 0, "RETRY", 0, "TTL", 1)) == message
    assert not isinstance(run(node, "ADDJOB", "q", "b", 0, "RETRY", 0, "REPLICATE", 1), ReplyError)


def test_a_job_whose_retry_outlives_its_ttl_is_delivered_once_then_expires() -> None:
    node, clock = make_node()
    job_id = add(node, "q", "b", "RETRY", 100, "TTL", 10)
    assert ids_of(get(node, "q")) == [job_id]  # delivered, never acked
    elapse(node, clock, 9_000)
    assert job(node, job_id).state == JobState.ACTIVE and run(node, "QLEN", "q") == 0
    elapse(node, clock, 2_000)  # past the TTL, long before RETRY would re-queue it
    assert job_id not in node.jobs and run(node, "QLEN", "q") == 0
    check_invariants(node)


def test_addjob_maxlen() -> None:
    node, _ = make_node()
    add(node, "q", "1", "MAXLEN", 2)  # no queue yet: accepted
    add(node, "q", "2", "MAXLEN", 2)
    reply = run(node, "ADDJOB", "q", "3", 0, "MAXLEN", 2)
    assert error_line(reply) == "MAXLEN Queue is already longer than the specified MAXLEN count"
    add(node, "q", "3", "MAXLEN", 3)
    add(node, "q", "4")  # no MAXLEN: no limit
    assert run(node, "QLEN", "q") == 4


def test_addjob_paused_in() -> None:
    node, _ = make_node()
    assert run(node, "PAUSE", "q", "in") == "in"
    assert (
        error_line(run(node, "ADDJOB", "q", "b", 0)) == "PAUSED Queue paused in input, try later"
    )
    assert run(node, "PAUSE", "q", "out") == "out"  # only input pause refuses jobs
    add(node, "q")
    run(node, "PAUSE", "q", "all")
    assert error_line(run(node, "ADDJOB", "q", "b", 0)).startswith("PAUSED ")


def test_addjob_arity() -> None:
    node, _ = make_node()
    assert error_line(run(node, "ADDJOB", "q", "b")) == (
        "ERR wrong number of arguments for 'addjob' command"
    )


def test_ctime_strictly_increases_within_a_millisecond() -> None:
    node, clock = make_node()
    ids = [add(node) for _ in range(5)]
    ctimes = [job(node, i).ctime for i in ids]
    assert ctimes == [START_MS * 1_000_000 + k for k in range(5)]
    clock.ms -= 5  # the wall clock stepping back does not reorder
    assert job(node, add(node)).ctime == ctimes[-1] + 1


# ------------------------------------------------------------------ ACKJOB


def test_ackjob_counts_and_deletes_on_single_node() -> None:
    node, _ = make_node()
    a, b = add(node), add(node)
    assert run(node, "ACKJOB", a, b, a) == 2
    assert not node.jobs and run(node, "QLEN", "q") == 0
    assert node.stats.acked_jobs == 2
    assert run(node, "ACKJOB", a) == 0  # already gone
    check_invariants(node)


def test_ackjob_of_delivered_job() -> None:
    node, _ = make_node()
    a = add(node)
    get(node, "q")
    assert run(node, "ACKJOB", a) == 1
    assert run(node, "SHOW", a) is None


def test_ackjob_unknown_ids_on_single_node_do_nothing() -> None:
    node, _ = make_node()
    other = add(node, "q", "b", "TTL", 60)
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0001"
    assert run(node, "ACKJOB", unknown) == 0
    assert list(node.jobs) == [other]
    assert run(node, "ACKJOB") == 0  # no IDs at all is fine too


def test_ackjob_unknown_id_creates_dummy_ack_in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    node, _ = make_node()
    node.cluster_size = 2
    sent: list[str] = []
    hook(monkeypatch, node, "send_setack", lambda j: sent.append(j.id))
    at_least_once = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    at_most_once = "D-" + OTHER_ID[:8] + "-" + "B" * 24 + "-0002"
    assert run(node, "ACKJOB", at_least_once, at_most_once) == 0  # not known: not counted
    dummy = job(node, at_least_once)
    assert dummy.state == JobState.ACKED and dummy.body is None and dummy.is_dummy_ack
    assert dummy.etime == START_MS // 1000 + 3 * 60  # TTL from the ID
    assert at_most_once not in node.jobs  # even TTL: RETRY 0, no dummy needed
    assert sent == [at_least_once]
    info = fields(run(node, "SHOW", at_least_once))
    assert info["queue"] is None and info["body"] is None and info["state"] == "acked"
    # JSCAN skips dummy acks, like the original.
    assert run(node, "JSCAN", "BUSYLOOP")[1] == []
    node.leaving = True
    other = "D-" + OTHER_ID[:8] + "-" + "C" * 24 + "-0003"
    run(node, "ACKJOB", other)
    assert other not in node.jobs  # no dummy acks while leaving
    check_invariants(node)


def test_a_dummy_ack_is_recorded_in_the_aof_and_reloaded() -> None:
    """Simulator seed 180270: an isolated node's dummy ack, its SETACKs
    lost, died in a crash under appendfsync always; the holders never heard
    of the ack and delivered the job again for ever."""
    node, clock = make_node()
    node.cluster_size = 2
    node.persisting = True
    at_least_once = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    at_most_once = "D-" + OTHER_ID[:8] + "-" + "B" * 24 + "-0002"
    node.effects.clear()
    assert run(node, "ACKJOB", at_least_once, at_most_once) == 0
    records = b"".join(e.record for e in node.effects if isinstance(e, Persist))
    assert [(name, rec) for _, _, (name, rec) in aof.records(records)] == [
        (aof.ACKJOB, at_least_once)
    ]

    # A reload makes it a dummy ack again, its TTL counted from the load.
    clock.ms += 5000
    again, _ = make_node()
    again.clock = clock
    replay(again, [(aof.ACKJOB, at_least_once), (aof.ACKJOB, at_most_once)], False)
    dummy = job(again, at_least_once)
    assert dummy.state == JobState.ACKED and dummy.body is None and dummy.is_dummy_ack
    assert dummy.etime == clock.ms // 1000 + 3 * 60
    assert at_most_once not in again.jobs  # never a dummy for a RETRY 0 job
    check_invariants(again)

    # Collected, it leaves the AOF too.
    node.effects.clear()
    node.unregister(job(node, at_least_once))
    records = b"".join(e.record for e in node.effects if isinstance(e, Persist))
    assert [(name, rec) for _, _, (name, rec) in aof.records(records)] == [
        (aof.DELJOB, at_least_once)
    ]


def test_ackjob_replicated_job_waits_for_confirmations() -> None:
    node, _ = make_node()
    a = add(node)
    node.cluster_size = 2
    job(node, a).nodes_delivered = (NODE_ID, OTHER_ID)
    assert run(node, "ACKJOB", a) == 1
    j = job(node, a)
    assert j.state == JobState.ACKED and run(node, "QLEN", "q") == 0
    assert run(node, "ACKJOB", a) == 0  # already acked: not counted again
    assert run(node, "ENQUEUE", a) == 0 and run(node, "NACK", a) == 0  # ACKED is absorbing
    assert j.state == JobState.ACKED
    assert error_line(run(node, "WORKING", a)) == "NOJOB Job already acknowledged."
    j.nodes_confirmed = (NODE_ID, OTHER_ID)
    run(node, "ACKJOB", a)  # forces a GC attempt: every holder confirmed
    assert a not in node.jobs


# ----------------------------------------------------------------- FASTACK


def test_fastack(monkeypatch: pytest.MonkeyPatch) -> None:
    node, _ = make_node()
    sent: list[tuple[str, bool]] = []
    hook(monkeypatch, node, "broadcast_deljob", lambda i, j: sent.append((i, j is not None)))
    a, b = add(node), add(node)
    get(node, "q")  # a delivered, b queued
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    assert run(node, "FASTACK", a, b, unknown) == 2
    assert not node.jobs and run(node, "QLEN", "q") == 0
    assert sent == [(a, True), (b, True), (unknown, False)]
    check_invariants(node)


# -------------------------------------------------------- NACK and ENQUEUE


def test_nack_requeues_delivered_job_and_counts() -> None:
    node, _ = make_node()
    a = add(node)
    assert run(node, "NACK", a) == 0  # queued: nothing to do
    get(node, "q")
    assert run(node, "NACK", a) == 1
    assert job(node, a).state == JobState.QUEUED
    assert run(node, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q") == [
        ["q", a, b"body", "nacks", 1, "additional-deliveries", 0]
    ]
    assert run(node, "NACK", a, a) == 1  # the second one finds it queued
    assert job(node, a).nacks == 2
    check_invariants(node)


def test_nack_puts_job_back_at_its_ctime_place() -> None:
    node, _ = make_node()
    a, b = add(node), add(node)
    assert get(node, "q") == [["q", a, b"body"]]
    run(node, "NACK", a)
    assert [e[1] for e in run(node, "QPEEK", "q", 10)] == [a, b]


def test_enqueue_and_dequeue() -> None:
    node, _ = make_node()
    a, b = add(node), add(node)
    assert run(node, "DEQUEUE", a, b, a) == 2
    assert run(node, "QLEN", "q") == 0
    assert job(node, a).state == job(node, b).state == JobState.ACTIVE
    assert run(node, "DEQUEUE", a) == 0
    assert run(node, "ENQUEUE", a) == 1
    assert run(node, "ENQUEUE", a) == 0  # already queued
    assert job(node, a).nacks == 0
    assert run(node, "QLEN", "q") == 1
    check_invariants(node)


def test_enqueue_counts_additional_delivery_on_requeue() -> None:
    node, _ = make_node()
    a = add(node)
    get(node, "q")
    assert run(node, "ENQUEUE", a) == 1
    assert job(node, a).deliveries == 1 and job(node, a).nacks == 0


def test_enqueue_delayed_job_early() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "DELAY", 60)
    assert run(node, "QLEN", "q") == 0
    assert run(node, "ENQUEUE", a) == 1
    assert get(node, "q") == [["q", a, b"b"]]


def test_enqueue_retry_zero_delayed_job_once() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 0, "DELAY", 10)
    assert run(node, "ENQUEUE", a) == 1
    assert job(node, a).qtime == 0
    get(node, "q")
    assert run(node, "ENQUEUE", a) == 0  # at most once, ENQUEUE or not
    assert run(node, "NACK", a) == 0
    tick_at(node, clock, START_MS + 11_000)
    assert run(node, "QLEN", "q") == 0


def test_enqueue_unknown_ids() -> None:
    node, _ = make_node()
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    for cmd in ("ENQUEUE", "NACK", "DEQUEUE", "DELJOB"):
        assert run(node, cmd, unknown) == 0


# ------------------------------------------------------------------ DELJOB


def test_deljob_any_state() -> None:
    node, _ = make_node()
    queued, active, delayed = add(node), add(node), add(node, "q", "b", "DELAY", 5)
    run(node, "DEQUEUE", active)
    assert run(node, "DELJOB", queued, active, delayed, queued) == 3
    assert not node.jobs and run(node, "QLEN", "q") == 0
    assert run(node, "SHOW", queued) is None
    check_invariants(node)


# ----------------------------------------------------------------- WORKING


def test_working_returns_retry_and_postpones() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 30, "TTL", 600)
    get(node, "q")
    clock.ms += 20_000
    qtime_before = job(node, a).qtime
    assert run(node, "WORKING", a) == 30
    j = job(node, a)
    assert j.state == JobState.ACTIVE
    assert qtime_before < j.qtime
    assert abs(j.qtime - (clock.ms + 30_000)) <= 250
    check_invariants(node)


def test_working_on_queued_job_dequeues_it() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "RETRY", 30)
    assert run(node, "WORKING", a) == 30
    assert job(node, a).state == JobState.ACTIVE and run(node, "QLEN", "q") == 0


def test_working_never_brings_a_delayed_job_forward() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 10, "RETRY", 1)
    assert run(node, "WORKING", a) == 1
    assert job(node, a).qtime == START_MS + 10_000  # not now + RETRY
    elapse(node, clock, 9_999)
    assert run(node, "QLEN", "q") == 0
    elapse(node, clock, 1)
    assert run(node, "QLEN", "q") == 1


def test_working_retry_zero() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "RETRY", 0)
    get(node, "q")
    assert run(node, "WORKING", a) == 0
    assert job(node, a).qtime == 0  # still never re-queued


def test_working_too_late_after_half_ttl() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "TTL", 100, "RETRY", 10)
    clock.ms = START_MS + 50_000  # exactly half: still allowed
    assert run(node, "WORKING", a) == 10
    clock.ms = START_MS + 50_001
    assert error_line(run(node, "WORKING", a)) == (
        "TOOLATE Half of job TTL already elapsed, you are no longer allowed to "
        "postpone the next delivery."
    )


def test_working_errors() -> None:
    node, _ = make_node()
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    assert error_line(run(node, "WORKING", unknown)) == (
        "NOJOB Job not known in the context of this node."
    )
    a = add(node)
    run(node, "ACKJOB", a)  # single node: deleted at once
    assert error_line(run(node, "WORKING", a)).startswith("NOJOB ")
    assert error_line(run(node, "WORKING", a, a)).startswith("ERR wrong number of arguments")


# -------------------------------------------------------------------- SHOW


def test_show_fields_in_order() -> None:
    node, clock = make_node()
    a = add(node, "q", "payload", "TTL", 3600, "RETRY", 60)
    clock.ms += 1500
    info = fields(run(node, "SHOW", a))
    assert list(info) == SHOW_KEYS
    assert info["id"] == a and info["queue"] == "q" and info["state"] == "queued"
    assert info["repl"] == 1 and info["ttl"] == 3599 and info["ctime"] == START_MS * 1_000_000
    assert (info["delay"], info["retry"], info["nacks"], info["additional-deliveries"]) == (
        0,
        60,
        0,
        0,
    )
    assert info["nodes-delivered"] == [NODE_ID] and info["nodes-confirmed"] == []
    assert abs(info["next-requeue-within"] - (60_000 - 1500)) <= 250
    # The timer wakes WILLQUEUE_ADVANCE (500 ms) before the re-queue, at the
    # end of that moment's chatter slot.
    announce = chatter_slot_end(clock.ms + info["next-requeue-within"] - 500)
    assert info["next-awake-within"] == announce - clock.ms
    assert 400 < info["next-requeue-within"] - info["next-awake-within"] <= 500
    assert info["body"] == b"payload"


def test_show_retry_zero_and_unknown() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "RETRY", 0, "TTL", 100)
    info = fields(run(node, "SHOW", a))
    assert info["next-requeue-within"] is None
    assert info["next-awake-within"] == 101_000  # expiry (+1 s)
    get(node, "q")
    assert fields(run(node, "SHOW", a))["state"] == "active"
    unknown = "D-" + OTHER_ID[:8] + "-" + "A" * 24 + "-0003"
    assert run(node, "SHOW", unknown) is None


def test_show_delayed_job() -> None:
    node, _ = make_node()
    info = fields(run(node, "SHOW", add(node, "q", "b", "DELAY", 7)))
    assert info["state"] == "active" and info["delay"] == 7
    assert info["next-requeue-within"] == info["next-awake-within"] == 7000


# ------------------------------------------------------------------- JSCAN


def _scan_all(node: Any, cmd: str, *opts: Any) -> list[Any]:
    """Iterate a scan to the end with the cursor last, collecting items."""
    cursor, items = "0", []
    for _ in range(10_000):
        reply = run(node, cmd, *opts, cursor)
        assert isinstance(reply, list), reply
        cursor, batch = reply
        items.extend(batch)
        if cursor == "0":
            return items
    raise AssertionError("scan never finished")


def test_jscan_filters_and_reply_types() -> None:
    node, _ = make_node()
    qa = [add(node, "a") for _ in range(5)]
    qb = [add(node, "b") for _ in range(4)]
    get(node, "a", count=2)  # qa[0], qa[1] active
    run(node, "DEQUEUE", qb[0])
    everything = set(qa + qb)
    assert set(_scan_all(node, "JSCAN", "COUNT", 2)) == everything
    assert set(_scan_all(node, "JSCAN", "QUEUE", "a")) == set(qa)
    assert set(_scan_all(node, "JSCAN", "STATE", "active")) == {qa[0], qa[1], qb[0]}
    assert set(_scan_all(node, "JSCAN", "STATE", "ACTIVE", "QUEUE", "b")) == {qb[0]}
    both = _scan_all(node, "JSCAN", "STATE", "queued", "STATE", "active")
    assert set(both) == everything
    assert _scan_all(node, "JSCAN", "STATE", "acked") == []
    assert _scan_all(node, "JSCAN", "STATE", "wait-repl") == []
    ids = _scan_all(node, "JSCAN", "REPLY", "id")
    assert all(isinstance(i, Status) for i in ids)
    infos = [fields(i) for i in _scan_all(node, "JSCAN", "REPLY", "ALL", "QUEUE", "b")]
    assert {i["id"] for i in infos} == set(qb) and all(list(i) == SHOW_KEYS for i in infos)


def test_jscan_busyloop_and_cursor_anywhere() -> None:
    node, _ = make_node()
    ids = {add(node) for _ in range(300)}
    cursor, items = run(node, "JSCAN", "BUSYLOOP", "COUNT", 1)
    assert cursor == "0" and set(items) == ids
    cursor, items = run(node, "JSCAN", "COUNT", 10, "0", "QUEUE", "q")
    assert cursor != "0" and 10 <= len(items) < 300
    cursor, items = run(node, "JSCAN", "0")
    assert len(items) == 100  # the default COUNT


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["STATE", "done"], "ERR Invalid job state name"),
        (["REPLY", "some"], "ERR Invalid REPLY type, try ID or ALL"),
        (["abc"], "ERR invalid cursor or option name"),
        (["-1"], "ERR invalid cursor or option name"),
        (["0", "FOO"], "ERR syntax error"),  # a second "cursor"
        (["0", "0"], "ERR syntax error"),
        (["COUNT", "x"], "ERR value is not an integer or out of range"),
        (["STATE"], "ERR invalid cursor or option name"),  # no value: read as a cursor
    ],
)
def test_jscan_errors(opts: list[Any], message: str) -> None:
    node, _ = make_node()
    add(node)
    assert error_line(run(node, "JSCAN", *opts)) == message


def test_jscan_empty_node() -> None:
    node, _ = make_node()
    assert run(node, "JSCAN") == ["0", []]


def test_paused_queue_jobs_listed_by_jscan() -> None:
    node, _ = make_node()
    a = add(node)
    node.set_pause("q", Pause.ALL)
    assert _scan_all(node, "JSCAN", "STATE", "queued") == [a]


@pytest.mark.parametrize(
    ("opts", "error"),
    [
        (["RETRY", 2**32], "ERR RETRY is too large: at most 4294967295 seconds"),
        (["RETRY", 2**63 - 1], "ERR RETRY is too large: at most 4294967295 seconds"),
        (["TTL", 99999999999], "ERR TTL is too large: at most 4294967295 seconds"),
        (["DELAY", 2**32, "TTL", 2**32 - 1], "ERR DELAY is too large: at most 4294967295 seconds"),
        (["RETRY", 2**63], "ERR RETRY time must be a non negative number"),  # not a long long
    ],
)
def test_addjob_refuses_seconds_past_32_bits(opts: list[Any], error: str) -> None:
    """The original truncates them to 32 bits (RETRY 4294967297 became 1);
    here they are refused before anything is held, so no AOF record or bus
    message ever carries a value a peer or a reload would refuse."""
    node, _ = make_node()
    reply = run(node, "ADDJOB", "q", "body", 0, *opts)
    assert isinstance(reply, ReplyError) and str(reply) == error
    assert node.jobs == {}


def test_a_controlled_restart_queues_jobs_only_once_the_whole_aof_is_read() -> None:
    """aof-enqueue-jobs-once puts back in their queues the jobs recorded as
    queued, but a later record of the same job (an ACKJOB, a DELJOB, a
    LOADJOB of it delivered) decides: queueing each job at its own record
    queued (and announced to its waiters and holders) jobs the rest of the
    file says are acked, gone or in a consumer's hands."""
    node, clock = make_node()
    acked, gone, taken, kept = (add(node, "q", f"b{i}", "RETRY", 5) for i in range(4))
    queued = {i: job_record(job(node, i)) for i in (acked, gone, taken, kept)}
    assert all(JobState(rec.state) == JobState.QUEUED for rec in queued.values())
    delivered = attrs.evolve(queued[taken], state=int(JobState.ACTIVE))
    entries: list[tuple[bytes, aof.JobRecord | str]] = [
        *((aof.LOADJOB, rec) for rec in queued.values()),
        (aof.ACKJOB, acked),
        (aof.DELJOB, gone),
        (aof.LOADJOB, delivered),
    ]
    again, _ = make_node()
    again.clock = clock
    events: list[tuple[str, str]] = []
    again.observers.append(lambda event, j: events.append((event, j.id)))
    replay(again, entries, True)
    assert [j for e, j in events if e == "queued"] == [kept]
    assert job(again, acked).state == JobState.ACKED
    assert again.lookup(gone) is None
    assert job(again, taken).state == JobState.ACTIVE
    assert [j.id for j in again.queues["q"].jobs] == [kept]
    check_invariants(again)


def test_a_job_a_later_loadjob_replaces_leaves_no_tombstone() -> None:
    """Simulator seed 520222: a restart read two LOADJOB records of a job
    (queued, then delivered); replacing the first left a tombstone, not
    acked, beside the job. DEBUG FLUSHALL dropped the job, and for the
    tombstone's minute WAITJOB there answered gone for a job another node
    had FASTACKed since. A replaced copy is not a deleted one."""
    node, clock = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    queued = job_record(job(node, job_id))
    delivered = attrs.evolve(queued, state=int(JobState.ACTIVE))
    again, _ = make_node()
    again.clock = clock
    replay(again, [(aof.LOADJOB, queued), (aof.LOADJOB, delivered)], False)
    assert job(again, job_id).state == JobState.ACTIVE
    assert job_id not in again.deleted_ids and job_id not in again.deleted_acked
    again.flush_all()  # DEBUG FLUSHALL
    assert run(again, "WAITJOB", job_id, "TIMEOUT", 1) == ["unknown"]
    check_invariants(again)


def test_a_loadjob_after_a_deljob_keeps_the_tombstone_it_had() -> None:
    node, clock = make_node()
    job_id = add(node, "q", "body", "RETRY", 5)
    rec = job_record(job(node, job_id))
    again, _ = make_node()
    again.clock = clock
    replay(again, [(aof.LOADJOB, rec), (aof.DELJOB, job_id), (aof.LOADJOB, rec)], False)
    assert job_id in again.jobs and job_id in again.deleted_ids
