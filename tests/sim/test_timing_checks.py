"""The timing checkers of sim/checkers.py on hand-made histories."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.checkers import (
    Crashes,
    check,
    check_acked,
    check_answered,
    check_delay_ends,
    check_delay_holds,
    check_failover_holds,
    check_nack,
    check_requeue,
    check_retry0_refused,
    check_waitjob,
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


def crash_of(origin: int) -> Callable[[int, float, float, float], bool]:
    """calm_but_crash for a run whose one fault is a crash of ``origin``
    that began at t=3."""
    return lambda victim, start, end, after: victim == origin and after < 3.0


def test_failover_holds_a_moved_hold() -> None:
    hold = ev(7.0, "hold", node=1, id=JOB, start=1.0, retry=2, acked=6.9, moved=3.2, **{"from": 0})
    again = [
        *added(),
        ev(1.0, "get", node=0, id=JOB, body="b"),
        ev(4.0, "get", node=2, id=JOB),
        hold,
    ]
    (v,) = check_failover_holds(again, crash_of(0))
    assert v.startswith("failover-holds:") and "delivered again at t=4.00" in v
    # Another fault (or the crash of another node): not judged.
    assert check_failover_holds(again, crash_of(1)) == []
    # Queued again on a node while held: the node's doing, whoever asks.
    held = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), hold]
    assert check_failover_holds(held, crash_of(0), {JOB: [0.5, 5.0]})[0].endswith("t=5.00")
    assert check_failover_holds(held, crash_of(0), {JOB: [0.5, 7.5]}) == []
    # A hold that never moved is working-holds' business.
    still = ev(7.0, "hold", node=0, id=JOB, start=1.0, retry=2, acked=6.9, **{"from": 0})
    assert check_failover_holds([*again[:-1], still], crash_of(0)) == []


def test_failover_holds_a_job_worked_on_within_its_retry() -> None:
    work = ev(6.0, "work", node=1, id=JOB, start=1.0, retry=20, acked=5.9, **{"from": 0})
    base = [*added(retry=20), ev(1.0, "get", node=0, id=JOB, body="b"), work]
    # Delivered at 0.99 by n0, whose next retry point for it was 15 s later.
    points = {JOB: [(0.99, 16.0)]}
    (v,) = check_failover_holds(base, crash_of(0), {JOB: [0.5, 4.0]}, points)
    assert "worked on until its ack at t=5.90" in v and v.endswith("queued again at t=4.00")
    assert check_failover_holds(base, crash_of(0), {JOB: [0.5, 6.5]}, points) == []
    # Seed 3000: queued 17 s before its delivery, its retry point there came
    # 4 s after it (a delivery does not move it, as in the original): the
    # ack came too late for the check.
    assert check_failover_holds(base, crash_of(0), {JOB: [0.5, 4.0]}, {JOB: [(0.99, 5.0)]}) == []


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


def delayed(t: float, delay: int, op: str = "nack", reply: str = "1", **data: Any) -> Event:
    return ev(t, op, node=0, id=JOB, reply=reply, t0=t - 0.01, delay=delay, retry=2, **data)


def test_nack_delay_holds() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), delayed(1.1, 4)]
    early = [*base, ev(2.5, "get", node=1, id=JOB, body="b")]
    [violation] = check_delay_holds(early, calm, allowance_s=0.5)
    assert violation.startswith("nack-delay-holds:")
    assert check_delay_holds(early, never_calm, allowance_s=0.5) == []
    # After the delay (less the allowance), or judged by the node's side.
    late = [*base, ev(4.7, "get", node=1, id=JOB, body="b")]
    assert check_delay_holds(late, calm, allowance_s=0.5) == []
    assert check_delay_holds(early, calm, 0.5, {JOB: [1.0, 4.8]}) == []
    # Another client's plain NACK (a duplicate delivery) queues it its way.
    other = [*base, ev(2.0, "nack", node=1, id=JOB, reply="1", t0=1.99), early[-1]]
    assert check_delay_holds(other, calm, allowance_s=0.5) == []
    # Refused (0): no delay promised; and nack-prompt leaves a DELAY alone.
    refused = [*base[:-1], delayed(1.1, 4, reply="0"), early[-1]]
    assert check_delay_holds(refused, calm, allowance_s=0.5) == []
    assert check_nack([*early, *phases(0.0, 60.0)], calm) == []


def test_nack_delay_checks_excuse_a_command_in_flight_with_it() -> None:
    # Seed 551573: c1's ENQUEUE DELAY 1 was sent just before c0's ENQUEUE
    # DELAY 2 and answered after it; the node may apply them in either order.
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b")]
    mine = delayed(1.1, 2, op="enqueue")  # sent 1.09, answered 1.1
    crossing = Event(1.105, "c1", "enqueue", {**mine.data, "delay": 1, "t0": 1.085})
    early = ev(2.12, "get", node=0, id=JOB, body="b")
    assert check_delay_holds([*base, mine, crossing, early], calm, allowance_s=0.5) == []
    # One answered before mine was sent was applied first: mine holds.
    before = Event(1.08, "c1", "enqueue", {**mine.data, "delay": 1, "t0": 1.07})
    [violation] = check_delay_holds([*base, before, mine, early], calm, allowance_s=0.5)
    assert violation.startswith("nack-delay-holds:") and "DELAY 2" in violation
    # nack-delay-ends: the crossing DELAY 5 may be the one that counts.
    late = Event(1.105, "c1", "enqueue", {**mine.data, "delay": 5, "t0": 1.085})
    never = [*base, mine, late, *phases(0.0, 60.0)]
    assert check_delay_ends(never, calm, allowance_s=0.5) == []
    alone = [*base, mine, *phases(0.0, 60.0)]
    assert check_delay_ends(alone, calm, allowance_s=0.5)


def test_nack_delay_ends_waits_for_a_longer_delay_still_running() -> None:
    # Seed 622230: two consumers got the job; c1's ENQUEUE DELAY 4 was
    # answered on n1, then c0's ENQUEUE DELAY 1 on n0. The holders queue it
    # at the later of the two ends (n1's), not 1 s after c0's answer.
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b")]
    longer = Event(1.05, "c1", "enqueue", {**delayed(1.05, 4).data, "node": 1})
    shorter = delayed(1.2, 1, op="enqueue")  # sent 1.19
    back = ev(5.1, "get", node=1, id=JOB, body="b")
    assert check_delay_ends([*base, longer, shorter, back, *phases(0.0, 60.0)], calm, 0.5) == []
    # Due by that end all the same.
    [violation] = check_delay_ends([*base, longer, shorter, *phases(0.0, 60.0)], calm, 0.5)
    assert "DELAY 1 answered at t=1.20" in violation and "not queued again by t=6.55" in violation
    # A longer delay already over (the job delivered again since) counts
    # for nothing: the shorter one is due by its own end.
    between = ev(1.1, "get", node=1, id=JOB, body="b")
    [violation] = check_delay_ends(
        [*base, longer, between, shorter, *phases(0.0, 60.0)], calm, 0.5
    )
    assert "not queued again by t=3.70" in violation


def test_nack_delay_ends() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), delayed(1.1, 2, op="enqueue")]
    never = [*base, *phases(0.0, 60.0)]
    [violation] = check_delay_ends(never, calm, allowance_s=0.5)
    assert violation.startswith("nack-delay-ends:") and "ENQUEUE DELAY 2" in violation
    assert check_delay_ends(never, never_calm, allowance_s=0.5) == []
    assert check_delay_ends(never, calm, 0.5, {JOB: [0.0, 3.1]}) == []
    assert check_delay_ends(never, calm, 0.5, {JOB: [0.0, 5.0]})  # queued too late
    acked = [*base, ev(2.0, "ack", node=1, id=JOB, reply="1", t0=1.9), *phases(0.0, 60.0)]
    assert check_delay_ends(acked, calm, allowance_s=0.5) == []
    # An ack sent just before the delayed NACK (another consumer's, on
    # another node, seed 491515) also means no re-queue.
    crossed = [*base, ev(1.2, "ack", node=1, id=JOB, reply="1", t0=1.08), *phases(0.0, 60.0)]
    assert check_delay_ends(crossed, calm, allowance_s=0.5) == []
    # Forgotten by the node that took the delay (DEBUG FLUSHALL, seed 120).
    flushed = Crashes(amnesia={JOB: {"n0"}})
    assert check_delay_ends(never, calm, 0.5, crashes=flushed) == []
    # A TTL that runs out first, or the consumers stopped first.
    ttl = [*added(ttl=3), *base[2:], *phases(0.0, 60.0)]
    assert check_delay_ends(ttl, calm, allowance_s=0.5) == []
    assert check_delay_ends([*base, *phases(0.0, 3.0)], calm, allowance_s=0.5) == []


def test_requeue_timely_waits_for_a_delay() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), delayed(1.1, 5)]
    # Due at the delay's end plus RETRY and the slack, not from the delivery.
    back = [*base, ev(12.0, "get", node=0, id=JOB, body="b"), ev(12.1, "ack", node=0, id=JOB)]
    assert check_requeue([*back, *phases(2.0, 60.0)], allowance_s=0.5) == ([], [])
    late, _ = check_requeue([*base, *phases(2.0, 60.0)], allowance_s=0.5)
    assert late and "not delivered again by t=13.60" in late[0]


def test_retry0_refused() -> None:
    base = [*added(retry=0), ev(1.0, "get", node=0, id=JOB, body="b")]
    refused = [*base, ev(1.1, "enqueue", node=0, id=JOB, reply="0", delay=3, retry=0)]
    assert check_retry0_refused(refused) == []
    taken = [*base, ev(1.1, "nack", node=0, id=JOB, reply="1", delay=3, retry=0)]
    [violation] = check_retry0_refused(taken)
    assert violation.startswith("retry0-refused: RETRY 0 job") and "NACK DELAY 3" in violation


def wait(
    t0: float, t: float, reply: list[str], creator: bool = True, timeout: int = 4000
) -> Event:
    data = {"node": 0, "id": JOB, "ids": [JOB], "timeout": timeout, "creator": [creator]}
    return Event(t, "w0", "waitjob", {**data, "t0": t0, "reply": reply})


def ack(t0: float, t: float, reply: str = "1", **data: Any) -> Event:
    return ev(t, "ack", node=1, id=JOB, fast=False, t0=t0, reply=reply, **data)


def test_waitjob_true_acked_only_after_an_ack_was_sent() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b")]
    [violation] = check_waitjob([*base, wait(1.5, 2.0, ["acked"])], calm, 0.5, 0.0)
    assert violation.startswith("waitjob-true:") and "no client acked it" in violation
    # Sent before the answer, its reply lost or read later: it acked.
    lost = ack(1.8, 2.5, reply="connection error: EOFError")
    assert check_waitjob([*base, lost, wait(1.5, 2.0, ["acked"])], calm, 0.5, 0.0) == []


def test_waitjob_true_never_gone_for_an_acked_job() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b"), ack(1.1, 1.2)]
    [violation] = check_waitjob([*base, wait(3.0, 3.0, ["gone"])], calm, 0.5, 0.0)
    assert "answered gone" in violation
    assert check_waitjob([*base, wait(3.0, 3.0, ["gone"])], never_calm, 0.5, 0.0) == []
    # An ACKJOB 0 that acked nothing (a leaving node): gone may be right.
    noop = [*base[:2], ack(1.1, 1.2, reply="0", leaving=True)]
    assert check_waitjob([*noop, wait(3.0, 3.0, ["gone"])], calm, 0.5, 0.0) == []


def test_waitjob_true_answers_within_a_second_of_the_ack() -> None:
    base = [*added(), ev(1.0, "get", node=0, id=JOB, body="b")]
    slow = [*base, ack(1.5, 1.6), wait(1.2, 5.2, ["pending"])]
    [violation] = check_waitjob(slow, calm, 0.5, 0.0)
    assert "bound 1.0s on the creator" in violation
    assert check_waitjob(slow, never_calm, 0.5, 0.0) == []
    quick = [*base, ack(1.5, 1.6), wait(1.2, 1.61, ["acked"])]
    assert check_waitjob(quick, calm, 0.5, 0.0) == []
    # Not the creator, or its timeout came first: no bound.
    elsewhere = [*base, ack(1.5, 1.6), wait(1.2, 5.2, ["pending"], creator=False)]
    assert check_waitjob(elsewhere, calm, 0.5, 0.0) == []
    short = [*base, ack(1.5, 1.6), wait(1.2, 1.5, ["pending"], timeout=300)]
    assert check_waitjob(short, calm, 0.5, 0.0) == []
    # Expired (TTL 5): gone by its creator within the bound, not pending.
    ttl = [*added(ttl=5), wait(2.0, 10.5, ["pending"], timeout=9000)]
    assert "acked or expired by t=8.00" in check_waitjob(ttl, calm, 0.5, 0.0)[0]
    assert check_waitjob([*ttl[:-1], wait(2.0, 8.2, ["gone"])], calm, 0.5, 0.0) == []
