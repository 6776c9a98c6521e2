"""Queue commands on one node: GETJOB (immediate and blocking), QLEN, QPEEK,
QSTAT, QSCAN, PAUSE."""

from __future__ import annotations

from typing import Any

import pytest

from disque_trio.core.job import JobState
from disque_trio.core.queue import Pause
from disque_trio.core.waiters import Waiter
from disque_trio.protocol.replies import NULL_ARRAY, Status

from .core_support import (
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
)

# Spelled out here, not imported: the tests pin the text clients see.
USAGE = "GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]"

QSTAT_KEYS = [
    "name",
    "len",
    "age",
    "idle",
    "blocked",
    "import-from",
    "import-rate",
    "jobs-in",
    "jobs-out",
    "pause",
]


def block(node: Any, *args: Any) -> tuple[Waiter, list[int]]:
    """A blocking GETJOB; returns the waiter and a list counting wake-ups."""
    waiter = run(node, "GETJOB", *args)
    assert isinstance(waiter, Waiter), waiter
    calls: list[int] = []
    waiter.wake = lambda: calls.append(1)
    return waiter, calls


# ------------------------------------------------------------------ GETJOB


def test_getjob_nohang_empty_is_null_array() -> None:
    node, _ = make_node()
    assert run(node, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    assert run(node, "GETJOB", "NOHANG", "FROM", "a", "b", "c") is NULL_ARRAY


def test_getjob_delivers_oldest_first_and_marks_active() -> None:
    node, _ = make_node()
    ids = [add(node, "q", f"b{i}") for i in range(5)]
    reply = run(node, "GETJOB", "COUNT", 3, "FROM", "q")
    assert reply == [["q", ids[i], f"b{i}".encode()] for i in range(3)]
    assert all(job(node, i).state == JobState.ACTIVE for i in ids[:3])
    assert run(node, "QLEN", "q") == 2
    assert node.stats.delivered_jobs == 3
    assert run(node, "GETJOB", "COUNT", 10, "FROM", "q") == [
        ["q", ids[3], b"b3"],
        ["q", ids[4], b"b4"],
    ]
    check_invariants(node)


def test_getjob_withcounters_shape() -> None:
    node, _ = make_node()
    a = add(node)
    reply = run(node, "GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert reply == [["q", a, b"body", "nacks", 0, "additional-deliveries", 0]]


def test_getjob_many_queues_left_to_right_round_robin() -> None:
    node, _ = make_node()
    a1, a2, a3 = add(node, "a"), add(node, "a"), add(node, "a")
    b1 = add(node, "b")
    c1, c2 = add(node, "c"), add(node, "c")
    reply = run(node, "GETJOB", "COUNT", 5, "FROM", "empty", "c", "b", "a")
    assert [r[1] for r in reply] == [c1, b1, a1, c2, a2]
    assert get(node, "a", "b", "c") == [["a", a3, b"body"]]


def test_getjob_count_one_takes_from_first_nonempty_queue() -> None:
    node, _ = make_node()
    add(node, "a")
    b = add(node, "b")
    assert get(node, "x", "b", "a") == [["b", b, b"body"]]


def test_getjob_duplicated_queue_names() -> None:
    node, _ = make_node()
    a1, a2 = add(node, "a"), add(node, "a")
    b1 = add(node, "b")
    # A queue named twice is visited twice per round, as in the original.
    assert [r[1] for r in run(node, "GETJOB", "COUNT", 2, "FROM", "a", "a", "b")] == [a1, a2]
    assert [r[1] for r in run(node, "GETJOB", "COUNT", 2, "FROM", "a", "a", "b")] == [b1]
    # Blocking: the client waits once per queue and is served once.
    waiter, calls = block(node, "FROM", "a", "b", "a")
    assert waiter.queues == ("a", "b")
    assert fields(run(node, "QSTAT", "a"))["blocked"] == 1
    a3 = add(node, "a")
    assert waiter.reply == [["a", a3, b"body"]] and calls == [1]
    assert fields(run(node, "QSTAT", "a"))["blocked"] == 0
    check_invariants(node)


def test_getjob_from_consumes_all_remaining_words() -> None:
    node, _ = make_node()
    timeout_job = add(node, "TIMEOUT")
    assert get(node, "TIMEOUT") == [["TIMEOUT", timeout_job, b"body"]]
    waiter, _ = block(node, "FROM", "q", "TIMEOUT", "10", "NOHANG")
    assert waiter.queues == ("q", "TIMEOUT", "10", "NOHANG")
    assert waiter.timeout_ms == 0  # TIMEOUT after FROM is a queue name
    node.cancel_wait(waiter)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # The original answers a bare "ERR syntax error" to the first five;
        # the text now says what is wrong and still starts the same.
        (["NOHANG"], f"ERR syntax error: FROM and at least one queue name are needed ({USAGE})"),
        (["FROM"], f"ERR syntax error: a queue name is needed after FROM ({USAGE})"),
        (["NOHANG", "FROM"], f"ERR syntax error: a queue name is needed after FROM ({USAGE})"),
        (["FOO", "FROM", "q"], f"ERR syntax error: unknown option 'FOO' ({USAGE})"),
        (["COUNT"], f"ERR syntax error: COUNT needs a value ({USAGE})"),  # COUNT as the last word
        (["TIMEOUT"], f"ERR syntax error: TIMEOUT needs a value ({USAGE})"),
        (["COUNT", 1], f"ERR syntax error: FROM and at least one queue name are needed ({USAGE})"),
        (["COUNT", 0, "FROM", "q"], "ERR COUNT must be a number greater than zero"),
        (["COUNT", -2, "FROM", "q"], "ERR COUNT must be a number greater than zero"),
        (["COUNT", "x", "FROM", "q"], "ERR COUNT must be a number greater than zero"),
        (["TIMEOUT", -1, "FROM", "q"], "ERR timeout is negative"),
        (["TIMEOUT", "x", "FROM", "q"], "ERR timeout is not an integer or out of range"),
        (["TIMEOUT", "1.5", "FROM", "q"], "ERR timeout is not an integer or out of range"),
    ],
)
def test_getjob_errors(args: list[Any], message: str) -> None:
    node, _ = make_node()
    assert error_line(run(node, "GETJOB", *args)) == message
    assert node.stats.blocked_clients == 0


def test_getjob_arity() -> None:
    node, _ = make_node()
    assert error_line(run(node, "GETJOB")).startswith("ERR wrong number of arguments")


def test_getjob_options_case_insensitive() -> None:
    node, _ = make_node()
    a = add(node)
    assert run(node, "getjob", "nohang", "withcounters", "count", 2, "from", "q")[0][1] == a


# --------------------------------------------------------- blocking GETJOB


def test_blocking_getjob_returns_waiter_served_by_addjob() -> None:
    node, _ = make_node()
    waiter, calls = block(node, "TIMEOUT", 1500, "FROM", "q")
    assert waiter.timeout_ms == 1500 and not waiter.done
    assert node.stats.blocked_clients == 1
    assert fields(run(node, "QSTAT", "q"))["blocked"] == 1
    check_invariants(node)
    a = add(node, "q", "x")
    assert waiter.done and calls == [1]
    assert waiter.reply == [["q", a, b"x"]]
    assert job(node, a).state == JobState.ACTIVE  # delivered straight away
    assert run(node, "QLEN", "q") == 0
    assert node.stats.blocked_clients == 0
    check_invariants(node)


def test_blocking_withcounters_and_count() -> None:
    node, _ = make_node()
    waiter, _ = block(node, "WITHCOUNTERS", "COUNT", 5, "FROM", "q")
    a = add(node)
    assert waiter.reply == [["q", a, b"body", "nacks", 0, "additional-deliveries", 0]]


def test_waiters_first_come_first_served() -> None:
    node, _ = make_node()
    w1, _ = block(node, "FROM", "q")
    w2, _ = block(node, "FROM", "q")
    a = add(node)
    assert ids_of(w1.reply) == [a] and not w2.done
    b = add(node)
    assert ids_of(w2.reply) == [b]


def test_waiter_on_many_queues_leaves_all_when_served() -> None:
    node, _ = make_node()
    waiter, _ = block(node, "FROM", "a", "b")
    b = add(node, "b")
    assert waiter.reply == [["b", b, b"body"]]
    assert fields(run(node, "QSTAT", "a"))["blocked"] == 0
    a = add(node, "a")  # nobody waits any more: stays queued
    assert job(node, a).state == JobState.QUEUED
    check_invariants(node)


def test_waiter_served_by_nack() -> None:
    node, _ = make_node()
    a = add(node)
    get(node, "q")
    waiter, _ = block(node, "WITHCOUNTERS", "FROM", "q")
    assert run(node, "NACK", a) == 1
    assert waiter.reply == [["q", a, b"body", "nacks", 1, "additional-deliveries", 0]]


def test_waiter_served_by_enqueue() -> None:
    node, _ = make_node()
    a = add(node, "q", "b", "DELAY", 100)
    waiter, _ = block(node, "FROM", "q")
    assert run(node, "ENQUEUE", a) == 1
    assert waiter.reply == [["q", a, b"b"]]


def test_waiter_served_by_delay_timer() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "DELAY", 3)
    waiter, calls = block(node, "FROM", "q")
    elapse(node, clock, 2999)
    assert not waiter.done
    elapse(node, clock, 1)
    assert waiter.reply == [["q", a, b"b"]] and calls == [1]
    check_invariants(node)


def test_waiter_served_by_retry_requeue() -> None:
    node, clock = make_node()
    a = add(node, "q", "b", "RETRY", 5)
    get(node, "q")
    waiter, _ = block(node, "WITHCOUNTERS", "FROM", "q")
    elapse(node, clock, 5300)
    assert waiter.reply == [["q", a, b"b", "nacks", 0, "additional-deliveries", 1]]


def test_cancel_wait() -> None:
    node, _ = make_node()
    waiter, calls = block(node, "FROM", "a", "b")
    node.cancel_wait(waiter)
    assert waiter.done and waiter.reply is None and calls == []
    assert node.stats.blocked_clients == 0
    node.cancel_wait(waiter)  # twice is harmless
    assert node.stats.blocked_clients == 0
    a = add(node, "a")
    assert job(node, a).state == JobState.QUEUED and waiter.reply is None
    check_invariants(node)


def test_leaving_node_refuses_to_block() -> None:
    node, _ = make_node()
    a = add(node, "full")  # added before leaving: a leaving node keeps no new copies
    node.leaving = True
    assert error_line(run(node, "GETJOB", "FROM", "q")) == (
        "LEAVING This node is leaving the cluster, please connect to a different one"
    )
    assert run(node, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    assert get(node, "full")[0][1] == a  # jobs present: served as usual
    assert error_line(run(node, "ADDJOB", "q", "x", 0)).startswith("NOREPL")


def test_unblock_all() -> None:
    node, _ = make_node()
    w1, _ = block(node, "FROM", "a", "b")
    w2, _ = block(node, "FROM", "b")
    node.unblock_all(None)
    assert w1.done and w2.done and node.stats.blocked_clients == 0
    check_invariants(node)


def test_need_jobs_hook_called_for_empty_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    node, _ = make_node()
    asked: list[tuple[str, bool]] = []
    hook(
        monkeypatch,
        node,
        "need_jobs",
        lambda name, reached_zero=False: asked.append((name, reached_zero)),
    )
    add(node, "b")
    run(node, "GETJOB", "NOHANG", "FROM", "a", "b")
    # "a" was empty; "b" was drained by this fetch: ask at once.
    assert asked == [("a", False), ("b", True)]


# ---------------------------------------------------------- QLEN and QPEEK


def test_qlen() -> None:
    node, _ = make_node()
    assert run(node, "QLEN", "nope") == 0
    for _ in range(3):
        add(node)
    assert run(node, "QLEN", "q") == 3
    get(node, "q")
    assert run(node, "QLEN", "q") == 2


def test_qpeek_positive_and_negative() -> None:
    node, clock = make_node()
    ids = []
    for i in range(5):
        clock.ms += 10
        ids.append(add(node, "q", f"b{i}"))
    assert run(node, "QPEEK", "q", 2) == [["q", ids[0], b"b0"], ["q", ids[1], b"b1"]]
    assert run(node, "QPEEK", "q", -2) == [["q", ids[4], b"b4"], ["q", ids[3], b"b3"]]
    assert [e[1] for e in run(node, "QPEEK", "q", 100)] == ids
    assert [e[1] for e in run(node, "QPEEK", "q", -100)] == ids[::-1]
    assert run(node, "QPEEK", "q", 0) == []
    assert run(node, "QPEEK", "nope", 5) == []
    assert run(node, "QLEN", "q") == 5  # peeking takes nothing


def test_qpeek_orders_by_ctime_not_by_queueing() -> None:
    node, clock = make_node()
    old = add(node, "q", "old", "DELAY", 5)
    clock.ms += 1000
    new = add(node, "q", "new")
    elapse(node, clock, 5000)  # the older job is queued after the newer
    assert [e[1] for e in run(node, "QPEEK", "q", 10)] == [old, new]
    assert get(node, "q")[0][1] == old


def test_qpeek_errors() -> None:
    node, _ = make_node()
    assert error_line(run(node, "QPEEK", "q", "x")) == (
        "ERR value is not an integer or out of range"
    )
    assert error_line(run(node, "QPEEK", "q")).startswith("ERR wrong number of arguments")


# ------------------------------------------------------------------- QSTAT


def test_qstat_unknown_is_null_array() -> None:
    node, _ = make_node()
    assert run(node, "QSTAT", "nope") is NULL_ARRAY


def test_qstat_keys_and_values() -> None:
    node, clock = make_node()
    a = add(node)
    add(node)
    clock.ms += 3000
    get(node, "q")
    run(node, "NACK", a)
    clock.ms += 2000
    stat = fields(run(node, "QSTAT", "q"))
    assert list(stat) == QSTAT_KEYS
    assert stat == {
        "name": "q",
        "len": 2,
        "age": 5,
        "idle": 2,
        "blocked": 0,
        "import-from": [],
        "import-rate": 0,
        "jobs-in": 3,  # two ADDJOB, one NACK
        "jobs-out": 1,
        "pause": "none",
    }
    waiter, _ = block(node, "FROM", "other", "q2")
    assert fields(run(node, "QSTAT", "q2"))["blocked"] == 1
    run(node, "PAUSE", "q", "out")
    assert fields(run(node, "QSTAT", "q"))["pause"] == "out"
    node.cancel_wait(waiter)


# ------------------------------------------------------------------- QSCAN


def _qscan_all(node: Any, *opts: Any) -> list[str]:
    cursor, names = "0", []
    for _ in range(10_000):
        cursor, batch = run(node, "QSCAN", cursor, *opts)
        names.extend(batch)
        if cursor == "0":
            return names
    raise AssertionError("scan never finished")


def test_qscan_iterates_everything() -> None:
    node, _ = make_node()
    names = {f"queue-{i}" for i in range(250)}
    for name in names:
        add(node, name)
    assert set(_qscan_all(node, "COUNT", 7)) == names
    assert set(_qscan_all(node)) == names
    cursor, batch = run(node, "QSCAN", "BUSYLOOP")
    assert cursor == "0" and set(batch) == names
    cursor, batch = run(node, "QSCAN", "0")
    assert len(batch) == 100 and cursor != "0"  # default COUNT
    cursor, batch = run(node, "QSCAN", "COUNT", 5, cursor)  # cursor anywhere
    assert len(batch) == 5
    assert isinstance(cursor, str) and int(cursor) > 0


def test_qscan_minlen_maxlen_importrate() -> None:
    node, _ = make_node()
    for name, n in (("zero", 0), ("one", 1), ("two", 2), ("five", 5)):
        node.queue(name)
        for _ in range(n):
            add(node, name)
    assert set(_qscan_all(node, "MINLEN", 2)) == {"two", "five"}
    assert set(_qscan_all(node, "MAXLEN", 1)) == {"zero", "one"}
    assert set(_qscan_all(node, "MINLEN", 1, "MAXLEN", 2)) == {"one", "two"}
    assert set(_qscan_all(node, "IMPORTRATE", 0)) == {"zero", "one", "two", "five"}
    assert _qscan_all(node, "IMPORTRATE", 1) == []


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["abc"], "ERR invalid cursor or option name"),
        (["1.5"], "ERR invalid cursor or option name"),
        (["18446744073709551616"], "ERR invalid cursor or option name"),  # 2**64
        (["0", "1"], "ERR syntax error"),
        (["MINLEN", "x"], "ERR value is not an integer or out of range"),
        (["COUNT", "x"], "ERR value is not an integer or out of range"),
        (["MINLEN"], "ERR invalid cursor or option name"),
    ],
)
def test_qscan_errors(opts: list[Any], message: str) -> None:
    node, _ = make_node()
    assert error_line(run(node, "QSCAN", *opts)) == message


def test_qscan_huge_cursor_is_valid_and_finishes() -> None:
    node, _ = make_node()
    add(node)
    assert run(node, "QSCAN", str(2**64 - 1)) == ["0", []]


# ------------------------------------------------------------------- PAUSE


@pytest.mark.parametrize(
    ("opts", "state"),
    [
        (["in"], "in"),
        (["out"], "out"),
        (["all"], "all"),
        (["none"], "none"),
        (["in", "out"], "all"),
        (["IN", "Out"], "all"),
        (["all", "none"], "none"),
        (["none", "in"], "in"),
        (["in", "state"], "in"),
        (["state"], "none"),
        (["bcast", "out"], "out"),
    ],
)
def test_pause_states(opts: list[str], state: str) -> None:
    node, _ = make_node()
    reply = run(node, "PAUSE", "q", *opts)
    assert isinstance(reply, Status) and reply == state
    assert run(node, "PAUSE", "q", "state") == state


def test_pause_replaces_previous_state() -> None:
    node, _ = make_node()
    assert run(node, "PAUSE", "q", "in") == "in"
    assert run(node, "PAUSE", "q", "out") == "out"  # not "all": flags are replaced
    assert run(node, "PAUSE", "q", "state") == "out"
    assert run(node, "PAUSE", "q", "none") == "none"


def test_pause_unknown_queue_not_created_unless_paused() -> None:
    node, _ = make_node()
    assert run(node, "PAUSE", "q", "state") == "none"
    assert run(node, "PAUSE", "q", "none") == "none"
    assert "q" not in node.queues
    assert run(node, "PAUSE", "q", "out") == "out"
    assert "q" in node.queues


def test_pause_errors_and_bcast(monkeypatch: pytest.MonkeyPatch) -> None:
    node, _ = make_node()
    sent: list[tuple[str, Pause]] = []
    hook(monkeypatch, node, "broadcast_pause", lambda n, p: sent.append((n, p)))
    assert error_line(run(node, "PAUSE", "q", "sideways")) == "ERR syntax error"
    assert error_line(run(node, "PAUSE", "q")).startswith("ERR wrong number of arguments")
    assert sent == []
    run(node, "PAUSE", "q", "in", "bcast")
    run(node, "PAUSE", "r", "bcast")  # state of a queue that does not exist
    assert sent == [("q", Pause.IN), ("r", Pause.NONE)]


def test_paused_out_blocks_getjob_even_with_jobs() -> None:
    node, _ = make_node()
    a = add(node)
    run(node, "PAUSE", "q", "out")
    assert run(node, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    waiter, calls = block(node, "FROM", "q")
    add(node)  # a new job does not reach the waiter either
    assert not waiter.done
    assert run(node, "PAUSE", "q", "in") == "in"  # output resumed
    assert waiter.reply == [["q", a, b"body"]] and calls == [1]
    assert run(node, "QLEN", "q") == 1
    check_invariants(node)


def test_resuming_serves_several_waiters() -> None:
    node, _ = make_node()
    run(node, "PAUSE", "q", "all")
    run(node, "PAUSE", "q", "out")
    a, b = add(node), add(node)
    w1, _ = block(node, "FROM", "q")
    w2, _ = block(node, "FROM", "q")
    w3, _ = block(node, "FROM", "q")
    run(node, "PAUSE", "q", "none")
    assert ids_of(w1.reply) == [a] and ids_of(w2.reply) == [b] and not w3.done
    assert node.stats.blocked_clients == 1
    check_invariants(node)


def test_paused_out_queue_skipped_among_many() -> None:
    node, _ = make_node()
    add(node, "a")
    b = add(node, "b")
    run(node, "PAUSE", "a", "out")
    assert [r[1] for r in run(node, "GETJOB", "COUNT", 5, "FROM", "a", "b")] == [b]


def test_paused_in_allows_nack_and_getjob() -> None:
    node, _ = make_node()
    a = add(node)
    run(node, "PAUSE", "q", "in")
    assert get(node, "q")[0][1] == a
    assert run(node, "NACK", a) == 1  # a local NACK is not refused by an input pause
    assert run(node, "QLEN", "q") == 1


def test_qstat_age_starts_at_creation() -> None:
    node, clock = make_node()
    clock.ms = START_MS + 10_500
    add(node)
    clock.ms = START_MS + 12_000
    stat = fields(run(node, "QSTAT", "q"))
    assert stat["age"] == 2 and stat["idle"] == 2
