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


def test_a_nodes_state_is_its_worst_flag() -> None:
    assert clustersnap.state_of(()) == "ok"
    assert clustersnap.state_of(("myself",)) == "ok"
    assert clustersnap.state_of(("leaving", "pfail")) == "pfail"
    assert clustersnap.state_of(("pfail", "fail")) == "fail"
    assert clustersnap.state_of(("handshake",)) == "handshake"


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
        {"name": "only-a", "total": 4, "lengths": {A: 4}},
        {"name": "mail", "total": 3, "lengths": {A: 1, B: 2}},
    ]
    assert (queues["total"], queues["omitted_jobs"]) == (10, 3)
    totals = data["totals"]
    assert (totals["nodes"], totals["failing"], totals["with_figures"]) == (4, 1, 2)
    assert totals["jobs"]["total"] == 6 + 3 and totals["used_memory"] == 2000


def test_queues_summed_beyond_the_limit_are_counted_as_omitted() -> None:
    figures = {
        A: stats(("b", 5), ("a", 5), ("c", 1)),
        B: stats(("c", 1), ("name\udcff", 2)),
    }
    summed = clustersnap.sum_queues(figures, limit=2)
    # Longest first, ties by name; the rest counted, not listed.
    assert [r["name"] for r in summed["rows"]] == ["a", "b"]
    assert summed["omitted_jobs"] == 2 + 2
    assert summed["total"] == 14
    every = clustersnap.sum_queues(figures)
    assert {"base64": "bmFtZf8="} in [r["name"] for r in every["rows"]]  # not UTF-8
    assert clustersnap.sum_queues({}) == {"rows": [], "nodes": [], "total": 0, "omitted_jobs": 0}


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
