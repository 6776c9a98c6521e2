"""The cluster dashboard's pure pieces (server/clustersnap.py): which rows
show figures and why not, the queues summed across nodes, a node's copy of
a job as a JOBCOPY, whom a job lookup asks, and the lookup's answer."""

from __future__ import annotations

from disque_trio.protocol import bus
from disque_trio.server import clustersnap
from disque_trio.server.clustersnap import Heard, Member

from .core_support import NODE_ID, OTHER_ID, make_node, run

NOW = 1_700_000_000_000
A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)
JOB = "D-aaaaaaaa-8YL1NT17e9+wsA/09NqxscQI-05a1"


def member(node_id: str, port: int, *flags: str, link: str = "connected", v: int = 5) -> Member:
    return Member(node_id, f"127.0.0.1:{port}", flags, link, v, NOW - 500)


def stats(*lengths: tuple[str, int], omitted: int = 0, queued: int = 0) -> bus.NodeStats:
    listed = tuple(bus.QueueLength(name, n) for name, n in lengths)
    return bus.NodeStats(
        7, 60, 1000, 2, 5, queued, 1, 0, 0, len(listed), listed, omitted, "on", 10
    )


MYSELF = member(A, 7711, "myself", link="self")


def figures(
    stats: bus.NodeStats, jobs: int, *requeue: tuple[str, int, int], omitted: int = 0
) -> bus.NodeFigures:
    """A NODEFIGURES: ``requeue`` as (queue, jobs, next_ms)."""
    waits = tuple(bus.QueueRequeue(name, n, next_ms) for name, n, next_ms in requeue)
    return bus.NodeFigures(stats, jobs, waits, omitted)


def test_a_nodes_state_is_its_worst_flag() -> None:
    assert clustersnap.state_of(()) == "ok"
    assert clustersnap.state_of(("myself",)) == "ok"
    assert clustersnap.state_of(("leaving", "pfail")) == "pfail"
    assert clustersnap.state_of(("pfail", "fail")) == "fail"
    assert clustersnap.state_of(("handshake",)) == "handshake"


def test_a_node_whose_link_is_down_is_not_ok() -> None:
    """Killed, a node's link drops at once; PFAIL comes a node timeout
    later. Meanwhile it is unreachable, not ok beside a link that is down."""
    assert clustersnap.state_of((), "connected") == "ok"
    assert clustersnap.state_of((), "disconnected") == "unreachable"
    assert clustersnap.state_of(("pfail",), "disconnected") == "pfail"
    assert clustersnap.state_of(("handshake",), "disconnected") == "handshake"
    assert clustersnap.state_of(("myself",), "self") == "ok"
    members = [MYSELF, member(B, 7712, link="disconnected"), member(C, 7713)]
    data = clustersnap.cluster_event(NOW, members, {A: Heard(stats(), NOW)})
    assert [r["state"] for r in data["nodes"]] == ["ok", "unreachable", "ok"]
    assert data["nodes"][1]["no_figures"] == "unreachable"
    assert (data["totals"]["unreachable"], data["totals"]["failing"]) == (1, 0)
    # A job lookup names the node's state the same way.
    found = clustersnap.lookup_result(JOB, members, {B: "unreachable"})
    assert found["copies"][0]["node_state"] == "unreachable"


def test_why_a_row_has_no_figures() -> None:
    fresh = Heard(stats(), NOW - 1000)
    stale = Heard(stats(), NOW - clustersnap.FRESH_MS - 1)
    missing = clustersnap.missing_figures
    assert missing(MYSELF, fresh, NOW) is None
    assert missing(member(B, 7712), fresh, NOW) is None
    assert missing(member(B, 7712), stale, NOW) == "no answer"
    assert missing(member(B, 7712), None, NOW) == "asking"
    assert missing(member(B, 7712), None, NOW, asked_ms=NOW - 1000) == "asking"
    # Asked long ago and never answered (a node that hangs, its link up).
    assert missing(member(B, 7712), None, NOW, asked_ms=NOW - 5000) == "no answer"
    # The link is down: not asked, whatever it said before.
    assert missing(member(B, 7712, "pfail", link="disconnected"), fresh, NOW) == "unreachable"
    # A release before bus protocol 5 is never asked.
    assert missing(member(B, 7712, v=4), None, NOW) == "older release"
    # A node whose link never came up: not an older release, unreachable.
    assert missing(member(B, 7712, link="disconnected", v=0), None, NOW) == "unreachable"


def test_the_cluster_event() -> None:
    members = [
        member(D, 7714, v=4),  # an older release
        member(C, 7713, "fail", link="disconnected"),  # killed
        member(B, 7712),
        MYSELF,
    ]
    heard = {
        A: Heard(stats(("mail", 1), ("only-a", 4), queued=5), NOW),
        B: Heard(stats(("mail", 2), omitted=3, queued=2), NOW - 900),
        C: Heard(stats(("mail", 30)), NOW - 2000),  # before it died: not counted
    }
    data = clustersnap.cluster_event(NOW, members, heard)
    rows = data["nodes"]
    assert [r["id"] for r in rows] == [A, B, C, D]  # itself, then by address
    assert [r["state"] for r in rows] == ["ok", "ok", "fail", "ok"]
    assert [r["no_figures"] for r in rows] == [None, None, "unreachable", "older release"]
    assert rows[0]["myself"] and rows[0]["flags"] == ["myself"]
    assert rows[1]["figures_age_ms"] == 900
    assert rows[1]["figures"]["jobs"] == {
        "total": 3,
        "queued": 2,
        "active": 1,
        "acked": 0,
        "wait_repl": 0,
    }
    assert rows[1]["figures"]["waiting"] == 5  # listed 2 + omitted 3
    assert rows[1]["figures"]["aof"] == {"state": "on", "size": 10}
    assert rows[2]["figures"] is None and rows[3]["figures"] is None
    queues = data["queues"]
    assert queues["nodes"] == [A, B]
    assert queues["rows"] == [
        {"name": "only-a", "total": 4, "lengths": {A: 4}, "requeue": None},
        {"name": "mail", "total": 3, "lengths": {A: 1, B: 2}, "requeue": None},
    ]
    assert (queues["total"], queues["omitted_jobs"]) == (10, 3)
    totals = data["totals"]
    assert (totals["nodes"], totals["failing"], totals["with_figures"]) == (4, 1, 2)
    assert totals["jobs"]["total"] == 6 + 3 and totals["used_memory"] == 2000
    # NODESTATS (bus protocol 5 to 9) carry no census: jobs unknown.
    assert rows[1]["figures"]["jobs_counted"] is None
    assert rows[1]["figures"]["requeue"] is None
    assert totals["distinct_jobs"] is None and totals["requeue"] is None


def test_jobs_not_copies_and_jobs_waiting_to_come_back() -> None:
    """Each node counts the jobs it is the counting holder of; the totals
    add those up beside the copies. Jobs waiting for their RETRY or a delay
    are summed per queue, with the earliest due (the times each node sent
    are from when its answer arrived here)."""
    members = [MYSELF, member(B, 7712), member(C, 7713)]
    heard = {
        # 6 copies, of which A counts 4 jobs; 2 of queue "mail" wait, the
        # first due 30 s after its answer (made now).
        A: Heard.of(figures(stats(("mail", 1), queued=5), 4, ("mail", 2, 30_000)), NOW),
        # 3 copies, 1 job counted; 1 job of "mail" due in 10 s from its
        # answer a second ago, 1 of "thumbs" (no queue anywhere) in 5 s,
        # and 2 of queues it did not list.
        B: Heard.of(
            figures(stats(queued=2), 1, ("mail", 1, 10_000), ("thumbs", 1, 5_000), omitted=2),
            NOW - 1000,
        ),
        # 1 copy, no job counted (a job whose lowest holder is A).
        C: Heard.of(figures(stats(queued=0), 0), NOW),
    }
    data = clustersnap.cluster_event(NOW, members, heard)
    totals = data["totals"]
    assert totals["jobs"]["total"] == 6 + 3 + 1  # copies
    assert totals["distinct_jobs"] == 5
    assert totals["requeue"] == {"jobs": 6, "next_in_ms": 4_000}
    rows = {r["name"]: r for r in data["queues"]["rows"]}
    assert rows["mail"]["requeue"] == {"jobs": 3, "next_in_ms": 9_000}
    assert rows["thumbs"] == {
        "name": "thumbs",
        "total": 0,
        "lengths": {},
        "requeue": {"jobs": 1, "next_in_ms": 4_000},
    }
    assert (data["queues"]["requeue"], data["queues"]["omitted_requeue"]) == (6, 2)
    node_rows = {r["id"]: r["figures"] for r in data["nodes"]}
    assert node_rows[A]["jobs_counted"] == 4
    assert node_rows[A]["requeue"] == {"jobs": 2, "next_in_ms": 30_000}
    assert node_rows[B]["requeue"] == {"jobs": 4, "next_in_ms": 4_000}
    assert node_rows[C]["jobs_counted"] == 0 and node_rows[C]["requeue"] is None
    # A due time passed shows as 0, not as a negative wait.
    early = {A: Heard.of(figures(stats(), 1, ("mail", 1, 500)), NOW - 2000)}
    late = clustersnap.cluster_event(NOW, [MYSELF], early)
    assert late["totals"]["requeue"] == {"jobs": 1, "next_in_ms": 0}
    # One node without a census (an older release) makes the count unknown.
    heard[C] = Heard(stats(), NOW)
    assert clustersnap.cluster_event(NOW, members, heard)["totals"]["distinct_jobs"] is None


def test_queues_summed_beyond_the_limit_are_counted_as_omitted() -> None:
    heard = {
        A: Heard(stats(("b", 5), ("a", 5), ("c", 1)), NOW),
        B: Heard.of(figures(stats(("c", 1), ("name\udcff", 2)), 0, ("d", 3, 0)), NOW),
    }
    summed = clustersnap.sum_queues(heard, NOW, limit=3)
    # The most jobs queued or waiting first, ties by name; the rest counted.
    assert [r["name"] for r in summed["rows"]] == ["a", "b", "d"]
    assert summed["omitted_jobs"] == 2 + 2
    assert summed["total"] == 14
    assert (summed["requeue"], summed["omitted_requeue"]) == (3, 0)
    cut = clustersnap.sum_queues(heard, NOW, limit=2)
    assert (cut["total"], cut["omitted_jobs"], cut["omitted_requeue"]) == (14, 4, 3)
    every = clustersnap.sum_queues(heard, NOW)
    assert {"base64": "bmFtZf8="} in [r["name"] for r in every["rows"]]  # not UTF-8
    assert clustersnap.sum_queues({}, NOW) == {
        "rows": [],
        "nodes": [],
        "total": 0,
        "omitted_jobs": 0,
        "requeue": 0,
        "omitted_requeue": 0,
    }


def test_a_nodes_copy_as_a_jobcopy() -> None:
    node, clock = make_node()
    job_id = run(node, "ADDJOB", "q", "body", 0, "RETRY", 30, "TTL", 600)
    copy = clustersnap.job_copy(node, 9, job_id)
    assert (copy.request, copy.job_id, copy.state, copy.queue) == (9, job_id, "queued", "q")
    assert (copy.nacks, copy.deliveries, copy.ttl, copy.gone) == (0, 0, 600, "")
    assert copy.nodes_delivered == (NODE_ID,)
    run(node, "GETJOB", "FROM", "q")
    clock.ms += 10_000
    copy = clustersnap.job_copy(node, 9, job_id)
    assert copy.state == "active" and copy.ttl == 590
    assert 19_000 <= copy.requeue_ms <= 20_000  # RETRY 30, less the core's time error
    decoder = bus.FrameDecoder()
    decoder.feed(bus.encode_frame(copy))
    assert decoder.next_message() == copy  # what travels is what was made
    run(node, "ACKJOB", job_id)
    gone = clustersnap.job_copy(node, 9, job_id)
    assert (gone.state, gone.gone) == ("", "acked")
    unknown = clustersnap.job_copy(node, 9, JOB)
    assert (unknown.state, unknown.gone, unknown.nodes_delivered) == ("", "", ())


def copy_of(*holders: str) -> bus.JobCopy:
    return bus.JobCopy(1, JOB, "queued", "", "q", 1, 2, 0, 60, holders)


def test_a_lookup_asks_the_holders_or_everyone() -> None:
    members = [
        MYSELF,
        member(B, 7712),
        member(C, 7713, "pfail", link="disconnected"),
        member(D, 7714, v=4),
    ]
    held = copy_of(A, B, C, OTHER_ID)
    ask, reasons = clustersnap.lookup_plan(A, held, members)
    assert ask == [B]
    assert reasons == {C: "unreachable", OTHER_ID: "not in the cluster table"}
    not_held = bus.JobCopy(1, JOB, "", "", "", 0, 0, 0, 0, ())
    ask, reasons = clustersnap.lookup_plan(A, not_held, members)
    assert ask == [B] and reasons == {C: "unreachable", D: "older release"}


def test_the_lookup_answer() -> None:
    members = [MYSELF, member(C, 7713, "fail", link="disconnected"), member(B, 7712)]
    outcomes: dict[str, bus.JobCopy | str] = {
        C: "unreachable",
        B: copy_of(A, B),
        A: bus.JobCopy(1, JOB, "", "acked", "", 0, 0, 0, 0, ()),
        OTHER_ID: "not in the cluster table",
    }
    result = clustersnap.lookup_result(JOB, members, outcomes)
    assert result["id"] == JOB and result["held"] == 1
    copies = result["copies"]
    assert [c["node"] for c in copies] == [A, B, C, OTHER_ID]
    assert copies[0] == {
        "node": A,
        "addr": "127.0.0.1:7711",
        "node_state": "ok",
        "myself": True,
        "status": "gone",
        "gone": "acked",
    }
    assert copies[1]["status"] == "held" and copies[1]["state"] == "queued"
    assert (copies[1]["nacks"], copies[1]["deliveries"], copies[1]["ttl"]) == (1, 2, 60)
    assert copies[1]["requeue_in_ms"] is None
    assert copies[2] == {
        "node": C,
        "addr": "127.0.0.1:7713",
        "node_state": "fail",
        "myself": False,
        "status": "unreachable",
    }
    assert copies[3]["addr"] is None and copies[3]["status"] == "not in the cluster table"
