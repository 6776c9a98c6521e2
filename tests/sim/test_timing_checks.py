"""The timing checkers of sim/checkers.py on hand-made histories."""

from __future__ import annotations

from typing import Any

from sim.checkers import (
    Crashes,
    check,
    check_acked,
    check_answered,
    check_nack,
    check_requeue,
    check_working,
)
from sim.workload import Event

JOB = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"


def calm(start: float, end: float) -> bool:
    return True


def never_calm(start: float, end: float) -> bool:
    return False


def ev(t: float, op: str, **data: Any) -> Event:
    return Event(t, "c0", op, data)


def added(t: float = 0.0, retry: int = 2, ttl: int = 0) -> list[Event]:
    spec = {"node": 0, "body": "b", "retry": retry, "copies": 1, "ttl": ttl}
    return [ev(t, "invoke", **spec), ev(t, "add", **spec, ok=True, reply=JOB)]


def phases(drain: float, settle: float) -> list[Event]:
    return [ev(drain, "phase", ev="drain"), ev(settle, "phase", ev="settle")]


def test_requeue_timely_wants_a_forgotten_job_back() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), ev(1.0, "forget", id=JOB)]
    late, _ = check_requeue([*base, *phases(2.0, 60.0)], allowance_s=0.5)
    assert late and late[0].startswith("requeue-timely:")
    back = [*base, ev(4.0, "get", node=0, id=JOB, body="b"), ev(4.1, "ack", node=0, id=JOB)]
    assert check_requeue([*back, *phases(2.0, 60.0)], allowance_s=0.5) == ([], [])
    # Acked before (the ack may reach the holders after a later delivery).
    acked = [*added(), ev(0.5, "ack", node=1, id=JOB, reply="0"), *base[2:]]
    assert check_requeue([*acked, *phases(2.0, 60.0)], allowance_s=0.5) == ([], [])


def test_requeue_timely_excuses_a_job_every_holder_forgot() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), *phases(2.0, 60.0)]
    crashes = Crashes("everysec", {JOB: {"n0"}}, {JOB: {"n0"}})
    violations, excused = check_requeue(base, 0.5, crashes)
    assert not violations and excused


def test_nack_prompt() -> None:
    base = [
        *added(),
        ev(1.0, "get", node=0, id=JOB, body="b"),
        ev(1.1, "nack", node=0, id=JOB, reply="1"),
    ]
    slow = [*base, ev(3.2, "get", node=0, id=JOB, body="b"), *phases(0.0, 60.0)]
    assert check_nack(slow, calm)[0].startswith("nack-prompt:")
    assert check_nack(slow, never_calm) == []
    quick = [*base, ev(1.15, "get", node=0, id=JOB, body="b"), *phases(0.0, 60.0)]
    assert check_nack(quick, calm) == []
    # Delivered to another consumer before the NACK's answer was read.
    raced = [*base[:3], Event(1.05, "c1", "get", {"node": 0, "id": JOB, "body": "b"}), base[3]]
    assert check_nack([*raced, *phases(0.0, 60.0)], calm) == []
    # Seed 5124: queued again at once, fetched late: the node did its part;
    # queued only at RETRY (the mutant nack-at-retry) it did not.
    assert check_nack(slow, calm, {JOB: [0.0, 1.104]}) == []
    assert check_nack(slow, calm, {JOB: [0.0, 3.1]})[0].startswith("nack-prompt:")


def test_working_holds() -> None:
    hold = ev(7.0, "hold", node=0, id=JOB, start=1.0, retry=2)
    again = [
        *added(),
        ev(1.0, "get", node=0, id=JOB, body="b"),
        ev(4.0, "get", node=1, id=JOB, body="b"),
        hold,
    ]
    assert check_working(again, calm)[0].startswith("working-holds:")
    assert check_working(again, never_calm) == []
    held = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), hold]
    assert check_working(held, calm) == []
    # Queued again at RETRY while held (the mutant working-no-postpone) and
    # nobody asked for it before the ack: the node's re-queue is caught.
    assert check_working(held, calm, {JOB: [0.0, 3.0]})[0].endswith("queued again at t=3.00")
    assert check_working(held, calm, {JOB: [0.0, 7.5]}) == []


def test_ack_final() -> None:
    history = [
        *added(),
        ev(1.0, "get", node=0, id=JOB, body="b"),
        ev(1.1, "ack", node=2, id=JOB, fast=False, reply="0"),
        ev(4.0, "get", node=0, id=JOB, body="b"),
    ]
    assert check_acked(history, calm)[0].startswith("ack-final:")
    assert check_acked(history, never_calm) == []
    lost = [*history[:3], ev(1.1, "ack", node=2, id=JOB, reply="connection error: EOFError")]
    assert check_acked([*lost[:2], lost[3], history[3]], calm) == []


def test_ack_final_skips_only_an_ackjob_a_leaving_node_answered_0() -> None:
    """A node told CLUSTER LEAVING yes makes no dummy ack (seed 1163: the
    consumer acked on leaving n0, which never held the job, and the holder
    re-queued it); any other ack on it stays final."""
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b")]
    again = ev(4.0, "get", node=0, id=JOB, body="b")

    def ack(**data: Any) -> list[Event]:
        return [*base, ev(1.1, "ack", node=2, id=JOB, **data), again]

    assert check_acked(ack(fast=False, reply="0", leaving=True), calm) == []
    # It held the job (answered 1), or was not leaving, or FASTACKed: final.
    assert check_acked(ack(fast=False, reply="1", leaving=True), calm)
    assert check_acked(ack(fast=False, reply="0"), calm)
    assert check_acked(ack(fast=True, reply="0", leaving=True), calm)


def test_ttl_judges_a_late_reply_by_when_the_node_sent_it() -> None:
    """Seed 621213044: a TTL 3 job delivered at t=2.94, inside its TTL, by
    a node a pause then froze; its client read the reply at t=6.17. The
    delivery was in time. A delivery the node made after the TTL is still
    caught, as is a late reply when the node's side is unknown."""
    history = [*added(0.0, retry=1, ttl=3), ev(6.17, "get", node=0, id=JOB, body="b", t0=2.77)]
    in_time = Crashes(delivered_at={JOB: [2.94]})
    assert not check(history, crashes=in_time).violations
    too_late = Crashes(delivered_at={JOB: [2.94, 5.9]})
    assert any("after its TTL" in v for v in check(history, crashes=too_late).violations)
    unknown = Crashes()
    assert any("after its TTL" in v for v in check(history, crashes=unknown).violations)


def test_answered_reports_pipelined_adds_left_without_a_reply() -> None:
    spec = {"node": 2, "body": "pp-7", "retry": 1, "copies": 2, "ttl": 0}
    answered = [ev(1.0, "invoke", **spec), ev(1.2, "add", **spec, ok=True, reply=JOB)]
    assert check_answered(answered) == []
    left = [
        ev(1.0, "invoke", **spec),
        ev(30.0, "unanswered", node=2, count=1, bodies=["pp-7"]),
        ev(30.0, "add", **spec, ok=False, reply="no reply"),
    ]
    [violation] = check_answered(left)
    assert violation.startswith("answered: 1 pipelined ADDJOB(s) to n2 (pp-7)")
