"""The client's sans-I/O core: commands, ClientProtocol, Router, Scan,
seed parsing. No sockets, no clocks: time is an argument."""

from __future__ import annotations

import random

import pytest

from disque_trio.client import (
    NEED_DATA,
    BadIdError,
    ClientProtocol,
    ConnectionLostError,
    DisqueConnectionError,
    DisqueError,
    LeavingError,
    NoJobError,
    NoReplError,
    ProducerTracker,
    ProtocolViolationError,
    Response,
    ResponseError,
    Router,
    Scan,
    TooLateError,
    commands,
    parse_nodes,
)
from disque_trio.client.cluster import LEAVING_GOSSIP_S, Backoff
from disque_trio.client.held import MAX_ROUNDS, HeldJobs
from disque_trio.client.types import HelloInfo, Job, NodeInfo, ScanPage
from disque_trio.protocol.replies import NULL_ARRAY, ReplyError, Status
from disque_trio.protocol.resp import RequestParser, encode

A = "aaaaaaaa" + "1" * 32
B = "bbbbbbbb" + "2" * 32
C = "cccccccc" + "3" * 32


def job_id(node: str, n: int = 0) -> str:
    return f"D-{node[:8]}-{n:024d}-05a1"


def sent(data: bytes) -> list[list[bytes]]:
    parser = RequestParser()
    parser.feed(data)
    out = []
    while (cmd := parser.next_command()) is not None:
        out.append(cmd)
    return out


# ------------------------------------------------------------ commands


def test_addjob_arguments_and_flags() -> None:
    cmd = commands.addjob("q", b"\x00body", 500, replicate=2, retry=5, ttl=60, asynchronous=True)
    assert cmd.args == (
        b"ADDJOB",
        b"q",
        b"\x00body",
        b"500",
        b"REPLICATE",
        b"2",
        b"RETRY",
        b"5",
        b"TTL",
        b"60",
        b"ASYNC",
    )
    assert not cmd.idempotent and commands.addjob("q", b"", resend=True).idempotent
    assert cmd.block == 0.5 and commands.addjob("q", b"", 0).block is None


def test_getjob_arguments_and_blocking() -> None:
    cmd = commands.getjob(["a", "b"], count=10, timeout_ms=250)
    assert cmd.args == (
        b"GETJOB",
        b"TIMEOUT",
        b"250",
        b"COUNT",
        b"10",
        b"WITHCOUNTERS",
        b"FROM",
        b"a",
        b"b",
    )
    assert cmd.block == 0.25 and cmd.idempotent
    assert commands.getjob(["a"]).block is None
    assert commands.getjob(["a"], nohang=True).block == 0
    with pytest.raises(ValueError):
        commands.getjob([])


def test_job_replies_parse_with_and_without_counters() -> None:
    reply = [
        [b"q", b"D-1", b"\xffbody", b"nacks", 2, b"additional-deliveries", 3],
        [b"q", b"D-2", b"x"],
    ]
    assert commands.parse_jobs(reply) == [
        Job("D-1", "q", b"\xffbody", 2, 3),
        Job("D-2", "q", b"x", 0, 0),
    ]
    assert commands.parse_jobs(NULL_ARRAY) == [] and commands.parse_jobs(None) == []
    assert Job("D-aaaaaaaa-x", "q", b"caf\xc3\xa9", 1, 1).text == "café"
    assert Job("D-aaaaaaaa-x", "q", b"", 1, 2).deliveries == 4


def test_show_and_qstat_from_flat_arrays_and_resp3_maps() -> None:
    flat = [
        b"id",
        b"D-1",
        b"queue",
        b"q",
        b"state",
        b"active",
        b"repl",
        3,
        b"ttl",
        100,
        b"ctime",
        7,
        b"delay",
        0,
        b"retry",
        30,
        b"nacks",
        1,
        b"additional-deliveries",
        2,
        b"nodes-delivered",
        [A.encode()],
        b"nodes-confirmed",
        [],
        b"next-requeue-within",
        999,
        b"next-awake-within",
        None,
        b"body",
        b"hi",
        b"future-field",
        b"z",
    ]
    info = commands.parse_job_info(flat)
    assert info is not None
    assert (info.state, info.retry, info.nacks, info.additional_deliveries) == ("active", 30, 1, 2)
    assert info.nodes_delivered == [A] and info.next_awake_within is None
    assert info.extra == {"future-field": b"z"}
    as_map = dict(zip(flat[::2], flat[1::2], strict=True))
    assert commands.parse_job_info(as_map) == info
    assert commands.parse_job_info(None) is None
    stats = commands.parse_queue_stats(
        [
            b"name",
            b"q",
            b"len",
            4,
            b"age",
            1,
            b"idle",
            0,
            b"blocked",
            2,
            b"import-from",
            [B.encode()],
            b"import-rate",
            5,
            b"jobs-in",
            9,
            b"jobs-out",
            5,
            b"pause",
            b"none",
        ]
    )
    assert stats is not None and (stats.len, stats.blocked, stats.import_from) == (4, 2, [B])
    assert commands.parse_queue_stats(NULL_ARRAY) is None


def test_hello_parses_nodes_with_string_numbers() -> None:
    hello = commands.parse_hello([1, A.encode(), [A.encode(), b"", b"7711", b"1"]])
    assert hello == HelloInfo(1, A, [NodeInfo(A, "", 7711, 1)])


def test_jscan_checks_states() -> None:
    assert commands.jscan(5, count=2, queue="q", states=["queued"]).args == (
        b"JSCAN",
        b"5",
        b"COUNT",
        b"2",
        b"QUEUE",
        b"q",
        b"STATE",
        b"queued",
        b"REPLY",
        b"id",
    )
    with pytest.raises(ValueError):
        commands.jscan(states=["lost"])


# ------------------------------------------------------------ ClientProtocol


def test_protocol_pipelines_and_parses_byte_by_byte() -> None:
    proto = ClientProtocol()
    data = proto.send(commands.qlen("q"), commands.addjob("q", b"b"), commands.working("D-x"))
    assert [c[0] for c in sent(data)] == [b"QLEN", b"ADDJOB", b"WORKING"]
    replies = encode(7) + encode(Status("D-1")) + encode(ReplyError("TOOLATE", "Half of job TTL"))
    events = []
    for i in range(len(replies)):
        proto.receive_data(replies[i : i + 1])
        while (event := proto.next_event()) is not NEED_DATA:
            events.append(event)
    assert [e.command.name for e in events] == ["QLEN", "ADDJOB", "WORKING"]
    assert events[0].result() == 7 and events[1].result() == "D-1"
    with pytest.raises(TooLateError):
        events[2].result()
    assert proto.pending == 0


def test_protocol_types_error_codes() -> None:
    proto = ClientProtocol()
    proto.send(commands.ackjob("nope"), commands.working("D-x"), commands.getjob(["q"]))
    proto.receive_data(
        encode(ReplyError("BADID", "Invalid Job ID format."))
        + encode(ReplyError("NOJOB", "Job not known"))
        + encode(ReplyError("LEAVING", "This node is leaving"))
    )
    errors = [proto.next_event().error for _ in range(3)]  # type: ignore[union-attr]
    assert [type(e) for e in errors] == [BadIdError, NoJobError, LeavingError]


def test_protocol_eof_fails_what_is_due_and_refuses_more() -> None:
    proto = ClientProtocol()
    proto.send(commands.ping(), commands.ping())
    proto.receive_data(b"+PONG\r\n")
    proto.receive_data(b"")
    first, second = proto.next_event(), proto.next_event()
    assert first.result() == "PONG"  # type: ignore[union-attr]
    assert isinstance(second.error, ConnectionLostError)  # type: ignore[union-attr]
    assert proto.next_event() is NEED_DATA
    with pytest.raises(ConnectionLostError):
        proto.send(commands.ping())


def test_protocol_bad_reply_breaks_the_connection() -> None:
    proto = ClientProtocol()
    proto.send(commands.qlen("q"))
    proto.receive_data(b"?what\r\n")
    event = proto.next_event()
    assert isinstance(event.error, ProtocolViolationError)  # type: ignore[union-attr]
    assert proto.broken is not None
    proto = ClientProtocol()
    proto.send(commands.qlen("q"))
    proto.receive_data(encode(Status("not a number")))
    assert isinstance(proto.next_event().error, ProtocolViolationError)  # type: ignore[union-attr]


def test_protocol_resp3_replies() -> None:
    proto = ClientProtocol()
    proto.send(commands.show("D-1"), commands.qstat("none"))
    proto.receive_data(encode({"id": b"D-1", "state": b"queued", "body": b"x"}, 3) + b"_\r\n")
    info = proto.next_event().result()  # type: ignore[union-attr]
    assert info.state == "queued" and proto.next_event().result() is None  # type: ignore[union-attr]


# ------------------------------------------------------------ seeds


def test_parse_nodes_forms() -> None:
    seeds = parse_nodes("disque://:s3cr%40t@10.0.0.1:7711,10.0.0.2,[::1]:7712/")
    assert seeds.addresses == (("10.0.0.1", 7711), ("10.0.0.2", 7711), ("::1", 7712))
    assert seeds.password == "s3cr@t"
    assert parse_nodes(["a:1", ("b", 2), "disque://c:3"]).addresses == (
        ("a", 1),
        ("b", 2),
        ("c", 3),
    )
    assert parse_nodes(("h", 9)).addresses == (("h", 9),)
    assert parse_nodes("a:1,a:1").addresses == (("a", 1),)
    for bad in ("redis://a:1", "a:0", "a:x", "", "disque://"):
        with pytest.raises(ValueError):
            parse_nodes(bad)


# ------------------------------------------------------------ Router


def hello_from(me: str, *nodes: tuple[str, int, int]) -> HelloInfo:
    return HelloInfo(1, me, [NodeInfo(i, "127.0.0.1", port, prio) for i, port, prio in nodes])


def three_nodes(rng: random.Random | None = None, **kw: object) -> Router:
    router = Router([("127.0.0.1", 1)], rng=rng or random.Random(1), **kw)  # type: ignore[arg-type]
    router.connected(("127.0.0.1", 1), hello_from(A, (A, 1, 1), (B, 2, 1), (C, 3, 100)), 0.0)
    return router


def test_seeds_are_tried_in_random_order() -> None:
    seeds = [("h", p) for p in range(1, 9)]
    orders = {tuple(Router(seeds, rng=random.Random(s)).connect_order(0.0)) for s in range(20)}
    assert len(orders) > 10 and all(sorted(o) == seeds for o in orders)


def test_connect_order_follows_priority_and_rests_failed_nodes() -> None:
    router = three_nodes()
    order = router.connect_order(0.0)
    assert order[-1] == ("127.0.0.1", 3)  # priority 100 last
    router.failed(("127.0.0.1", 1), now=10.0)
    assert router.current is None
    order = router.connect_order(10.0)
    assert order[0] == ("127.0.0.1", 2) and order[-1] == ("127.0.0.1", 1)
    # Once its back-off has passed, it ranks by priority again.
    assert router.connect_order(1000.0)[-1] == ("127.0.0.1", 3)


def test_backoff_is_capped_and_jittered() -> None:
    backoff, rng = Backoff(base=0.1, cap=1.0), random.Random(3)
    delays = [backoff.delay(n, rng) for n in range(40)]
    assert all(0.05 <= d <= 1.0 for d in delays) and max(delays) > 0.5
    assert delays[0] <= 0.1


def test_empty_host_in_hello_means_the_address_dialed() -> None:
    router = Router([("10.1.1.1", 7711)])
    router.connected(
        ("10.1.1.1", 7711),
        HelloInfo(1, A, [NodeInfo(A, "", 7711, 1), NodeInfo(B, "", 7712, 1)]),
        0.0,
    )
    assert {n.address for n in router.nodes.values()} == {("10.1.1.1", 7711), ("10.1.1.1", 7712)}


def test_route_by_job_id_groups_and_falls_back_to_current() -> None:
    router = three_nodes()
    # A's jobs go to the current node (A itself), B's to B, C is unusable
    # (priority 100) and unknown prefixes stay on the current node.
    parts = router.route(
        commands.ackjob(job_id(A), job_id(B, 1), job_id(C), job_id("dddddddd"), job_id(B, 2))
    )
    assert [(addr, cmd.job_ids) for addr, cmd in parts] == [
        (None, (job_id(A), job_id(C), job_id("dddddddd"))),
        (("127.0.0.1", 2), (job_id(B, 1), job_id(B, 2))),
    ]
    assert [p[1].args[0] for p in parts] == [b"ACKJOB", b"ACKJOB"]
    assert router.route(commands.show(job_id(B)))[0][0] == ("127.0.0.1", 2)
    assert [addr for addr, _ in router.route(commands.qlen("q"))] == [None]
    assert Router([("h", 1)], route_by_job_id=False).route(commands.nack(job_id(B)))[0][0] is None
    router.leaving(("127.0.0.1", 2), 0.0)
    assert router.route(commands.working(job_id(B)))[0][0] is None


def test_retry_and_fallback_rules() -> None:
    lost, refused = ConnectionLostError("lost"), DisqueConnectionError("refused")
    leaving = LeavingError("LEAVING", "bye")
    assert Router.retryable(commands.getjob(["q"]), lost)
    assert not Router.retryable(commands.addjob("q", b""), lost)
    assert Router.retryable(commands.addjob("q", b"", resend=True), lost)
    assert not Router.retryable(commands.nack("D-x"), lost)
    assert Router.retryable(commands.addjob("q", b""), refused)  # never sent
    assert Router.retryable(commands.getjob(["q"]), leaving)
    assert Router.fall_back(commands.nack("D-x"), 0) and not Router.fall_back(
        commands.nack("D-x"), 1
    )
    assert Router.fall_back(commands.show("D-x"), None)
    assert Router.fall_back(commands.working("D-x"), NoJobError("NOJOB", ""))
    assert not Router.fall_back(commands.working("D-x"), TooLateError("TOOLATE", ""))
    assert not Router.fall_back(commands.nack("D-x"), lost)
    assert Router.fall_back(commands.nack("D-x"), refused)
    # An ack that counted fewer jobs than it named goes again, whole; a
    # NACK that queued some does not.
    assert Router.fall_back(commands.ackjob("D-x", "D-y", "D-z"), 1)
    assert Router.fall_back(commands.fastack("D-x", "D-y"), 0)
    assert not Router.fall_back(commands.ackjob("D-x", "D-y"), 2)
    assert not Router.fall_back(commands.nack("D-x", "D-y"), 1)
    assert not Router.fall_back(commands.working("D-x"), 300)


def test_follow_producers_moves_with_hysteresis() -> None:
    tracker = ProducerTracker(window=20, min_jobs=10, share=0.75, cooldown=30.0)
    router = three_nodes(tracker=tracker)
    # Mixed sources: no move.
    assert router.jobs_received([job_id(A), job_id(B)] * 10, now=1.0) is None
    # 9 of 10 from B, but fewer than min_jobs after a reset... fill the window.
    ids = [job_id(B, n) for n in range(18)] + [job_id(A), job_id(A)]
    assert router.jobs_received(ids, now=2.0) == ("127.0.0.1", 2)
    router.move_to(("127.0.0.1", 2), B)
    assert router.moves == 1 and router.current_id == B
    # Cooling down: even a clear majority from A does not move it back.
    assert router.jobs_received([job_id(A, n) for n in range(20)], now=10.0) is None
    # After the cooldown a fresh majority does.
    assert router.jobs_received([job_id(A, n) for n in range(20)], now=40.0) == ("127.0.0.1", 1)


def test_follow_producers_never_moves_to_an_unusable_node_or_when_off() -> None:
    router = three_nodes(tracker=ProducerTracker(window=10, min_jobs=5, cooldown=0.0))
    assert router.jobs_received([job_id(C, n) for n in range(10)], now=1.0) is None  # priority 100
    off = three_nodes(follow_producers=False, tracker=ProducerTracker(window=10, min_jobs=5))
    assert off.jobs_received([job_id(B, n) for n in range(10)], now=1.0) is None
    with pytest.raises(ValueError):
        ProducerTracker(share=0.5)


def test_leaving_node_goes_last_until_hello_says_otherwise() -> None:
    router = three_nodes()
    router.leaving(("127.0.0.1", 1), 0.0)
    assert router.current is None
    assert router.connect_order(0.0)[0] == ("127.0.0.1", 2)
    assert router.connect_order(0.0)[-2:] in (
        [("127.0.0.1", 1), ("127.0.0.1", 3)],
        [("127.0.0.1", 3), ("127.0.0.1", 1)],
    )
    # Another node's HELLO right after the -LEAVING may not have heard of
    # it yet: believed only LEAVING_GOSSIP_S later.
    router.learn(("127.0.0.1", 2), hello_from(B, (A, 1, 1), (B, 2, 1)), 0.5)
    assert router.node_for_job(job_id(A)) is None
    assert ("127.0.0.1", 1) in router.connect_order(0.5)[-2:]
    router.learn(("127.0.0.1", 2), hello_from(B, (A, 1, 1), (B, 2, 1)), LEAVING_GOSSIP_S)
    assert router.node_for_job(job_id(A)) is not None
    # Its own HELLO is believed at once.
    router.leaving(("127.0.0.1", 1), 10.0)
    assert router.node_for_job(job_id(A)) is None
    router.learn(("127.0.0.1", 1), hello_from(A, (A, 1, 1), (B, 2, 1)), 10.1)
    assert router.node_for_job(job_id(A)) is not None


# ------------------------------------------------------------ Scan


def test_scan_follows_cursor_and_dedupes() -> None:
    pages = {0: ScanPage(7, ["a", "b"]), 7: ScanPage(9, ["b", "c"]), 9: ScanPage(0, ["d"])}
    scan = Scan(lambda cursor: commands.qscan(cursor, count=2))
    got = []
    while (cmd := scan.next_command()) is not None:
        cursor = int(cmd.args[1])
        got += scan.feed(pages[cursor])
    assert got == ["a", "b", "c", "d"] and scan.done
    assert Scan(lambda c: commands.qscan(c), dedupe=False).feed(ScanPage(0, ["x", "x"])) == [
        "x",
        "x",
    ]


def test_jobs_from_a_node_whose_creator_is_unusable_go_back_where_they_came_from() -> None:
    router = three_nodes()
    # C (priority 100) created the job; B delivered it: its ACK goes to B.
    router.delivered(("127.0.0.1", 2), [job_id(C, 7)])
    assert router.route(commands.ackjob(job_id(C, 7)))[0][0] == ("127.0.0.1", 2)
    router.forget_jobs([job_id(C, 7)])
    assert router.route(commands.ackjob(job_id(C, 7)))[0][0] is None
    # The creator, when usable, comes first.
    router.delivered(("127.0.0.1", 3), [job_id(B, 1)])
    assert router.route(commands.nack(job_id(B, 1)))[0][0] == ("127.0.0.1", 2)


def test_sweep_targets_are_leaving_or_failing_nodes_not_resting() -> None:
    router = three_nodes()
    assert router.sweep_targets(0.0) == [("127.0.0.1", 3)]  # priority 100
    router.leaving(("127.0.0.1", 2), 0.0)
    assert router.sweep_targets(0.0) == [("127.0.0.1", 2), ("127.0.0.1", 3)]
    router.sweep_failed(("127.0.0.1", 3), now=1.0, rest=30.0)
    assert router.sweep_targets(10.0) == [("127.0.0.1", 2)]
    assert router.sweep_targets(40.0) == [("127.0.0.1", 2), ("127.0.0.1", 3)]
    router.move_to(("127.0.0.1", 3), C)
    assert ("127.0.0.1", 3) not in router.sweep_targets(40.0)  # the current node is never swept


def test_hello_refresh_is_due_by_interval() -> None:
    router = Router([("h", 1)], hello_interval=5.0)
    assert router.hello_due(0.0)
    router.heard(10.0)
    assert not router.hello_due(14.0) and router.hello_due(15.0)


# ------------------------------------------------------------ held jobs


def answers(command_list: list[commands.Command[int]], *outcomes: object) -> list[Response[int]]:
    """One Response per WORKING: an int is the RETRY, an exception the error."""
    out = []
    for command, outcome in zip(command_list, outcomes, strict=True):
        if isinstance(outcome, int):
            out.append(Response(command, value=outcome))
        else:
            assert isinstance(outcome, DisqueError)
            out.append(Response(command, error=outcome))
    return out


NODE_A, NODE_B, NODE_C = ("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)


def test_held_jobs_are_delivered_jobs_until_settled() -> None:
    router = three_nodes()
    router.delivered(NODE_A, [job_id(A, 1), job_id(B, 2), job_id(B, 3)])
    assert len(router.held) == 3 and router.held.node_of(job_id(B, 2)) == NODE_A
    router.forget_jobs([job_id(A, 1)])  # acked
    router.held.release([job_id(B, 2)])  # nacked, enqueued...
    assert list(router.held.orphans()) == [] and len(router.held) == 1
    assert router.held.nodes() == [NODE_A] and not router.held.due
    off = three_nodes(hold_jobs=False)
    off.delivered(NODE_A, [job_id(A, 1)])
    assert len(off.held) == 0
    # Bounded: the oldest are forgotten.
    small = HeldJobs(limit=2)
    small.hold(NODE_A, ["x", "y", "z"])
    assert "x" not in small and "z" in small and len(small) == 2


def test_a_failed_or_failing_node_orphans_its_held_jobs() -> None:
    router = three_nodes()
    router.delivered(NODE_A, [job_id(A, 1)])
    router.delivered(NODE_B, [job_id(B, 2)])
    router.failed(NODE_A, now=1.0)
    assert router.held.due and router.held.orphans() == [job_id(A, 1)]
    assert router.held.nodes() == [NODE_B]  # A is no longer watched
    # A connection to A answering HELLO again: back.
    router.learn(NODE_A, hello_from(A, (A, 1, 1), (B, 2, 1), (C, 3, 1)), 0.0)
    assert not router.held.due
    # HELLO calling B failing (or leaving): its jobs are orphans too.
    router.learn(NODE_A, hello_from(A, (A, 1, 1), (B, 2, 100), (C, 3, 1)), 0.0)
    assert router.held.orphans() == [job_id(B, 2)]
    router.learn(NODE_A, hello_from(A, (A, 1, 1), (B, 2, 1), (C, 3, 1)), 0.0)
    assert router.held.due  # only a connection to B itself brings it back
    router.leaving(NODE_A, 0.0)
    assert set(router.held.orphans()) == {job_id(A, 1), job_id(B, 2)}


def test_reassert_asks_the_creators_first_then_the_next_nodes_on_nojob() -> None:
    router = Router([NODE_A], rng=random.Random(1))
    router.connected(NODE_A, hello_from(A, (A, 1, 1), (B, 2, 1), (C, 3, 1)), 0.0)
    ids = [job_id(B, 1), job_id(C, 2), job_id(C, 3), job_id(A, 4)]
    router.delivered(NODE_A, ids)
    router.failed(NODE_A, now=1.0)
    plan = router.reassert(now=1.0)
    address, batch = plan.next_batch() or (None, [])
    assert address == NODE_B  # created the first orphan; A (gone) is never asked
    assert [c.args for c in batch] == [(b"WORKING", i.encode()) for i in ids]
    nojob, late = NoJobError("NOJOB", "Job not known"), TooLateError("TOOLATE", "")
    plan.feed(NODE_B, answers(batch, 30, nojob, late, nojob))
    address, batch = plan.next_batch() or (None, [])
    assert address == NODE_C and [c.job_ids for c in batch] == [(job_id(C, 2),), (job_id(A, 4),)]
    plan.feed(NODE_C, answers(batch, 30, nojob))
    assert plan.next_batch() is None  # no other node to ask
    result = router.reasserted(plan)
    assert result.moved == {NODE_B: [job_id(B, 1)], NODE_C: [job_id(C, 2)]}
    assert result.too_late == [job_id(C, 3)] and result.no_holder == [job_id(A, 4)]
    assert not router.held.due and len(router.held) == 4  # still held, until settled
    assert (
        router.held.node_of(job_id(C, 2)) == NODE_C and router.held.node_of(job_id(A, 4)) is None
    )
    # Acks of a job kept alive go where it was kept alive while its creator is out.
    assert router.route(commands.ackjob(job_id(A, 4)))[0][0] is None
    assert router.delivered_by(job_id(C, 2)) == NODE_C
    assert router.route(commands.ackjob(job_id(C, 2)))[0][0] == NODE_C


def test_reassert_tries_again_when_no_node_could_be_reached_then_gives_up() -> None:
    router = three_nodes()
    router.delivered(NODE_A, [job_id(A, 1)])
    router.failed(NODE_A, now=1.0)
    for round_ in range(MAX_ROUNDS):
        plan = router.reassert(now=1.0)
        while (batch := plan.next_batch()) is not None:
            address, sent_batch = batch
            if address == NODE_B:
                plan.unreachable(address)
            else:
                lost = ConnectionLostError("lost")
                plan.feed(address, answers(sent_batch, *[lost] * len(sent_batch)))
        result = router.reasserted(plan)
        if round_ < MAX_ROUNDS - 1:
            assert result.deferred == [job_id(A, 1)] and router.held.due
    assert result.no_holder == [job_id(A, 1)] and not router.held.due


def test_a_job_kept_alive_at_a_node_that_dies_in_turn_is_reasserted_again() -> None:
    router = Router([NODE_A], rng=random.Random(1))
    router.connected(NODE_A, hello_from(A, (A, 1, 1), (B, 2, 1), (C, 3, 1)), 0.0)
    router.delivered(NODE_A, [job_id(A, 1)])
    router.failed(NODE_A, now=1.0)
    plan = router.reassert(now=1.0)
    first, batch = plan.next_batch() or (None, [])
    assert first in (NODE_B, NODE_C)
    plan.feed(first, answers(batch, 30))
    router.reasserted(plan)
    router.failed(first, now=2.0)
    assert router.held.orphans() == [job_id(A, 1)]
    second, _ = router.reassert(now=2.0).next_batch() or (None, [])
    assert second in (NODE_B, NODE_C) and second != first


def test_addjob_is_sent_again_after_norepl_only() -> None:
    norepl = NoReplError(
        "NOREPL", "Not enough reachable nodes for the requested replication level"
    )
    assert Router.retryable(commands.addjob("q", b""), norepl)
    assert not Router.retryable(commands.nack("D-x"), norepl)
    assert not Router.retryable(commands.addjob("q", b""), ResponseError("PAUSED", "paused"))
    assert commands.addjob("q", b"", attempts=3).attempts == 3
    router = three_nodes()
    router.refused(NODE_A, norepl, now=5.0)
    assert router.current is None and router.connect_order(5.0)[-1] == NODE_A
    assert not router.held.is_gone(NODE_A)  # not out of reach: only refused
    leaving = NoReplError("NOREPL", norepl.message + ", since ...: I'm leaving the cluster")
    router.refused(NODE_B, leaving, now=5.0)
    assert router.sweep_targets(100.0)[0] == NODE_B  # left, as after -LEAVING
