"""The run timeline (sim/timeline.py): what the page holds, from a trace
built by hand and from a real failing run; ``replay --html`` writes it."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from sim import timeline
from sim.plan import Plan
from sim.runs import report_run, run_plan
from sim.timeline import Meta, render

from .conftest import sim_cli

JOB = "D-aaaaaaaa-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
OTHER = "D-bbbbbbbb-BBBBBBBBBBBBBBBBBBBBBBBB-05a1"


class Elements(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, cls: str, tag: str | None = None) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.tags
            if cls in a.get("class", "").split() and (tag is None or t == tag)
        ]


def ev(t: float, node: str, cat: str, /, **data: Any) -> dict[str, Any]:
    return {"t": t, "node": node, "cat": cat, "data": data}


def small_trace() -> list[dict[str, Any]]:
    """Three nodes; n1 crashes 2..3 s, n2 is isolated 1..4 s, n0's clock
    jumps; p0 adds JOB (then a job lost to a connection error), c0 gets
    and acks JOB; JOB's REPLJOB reaches n1, its SETACK to n2 is lost."""
    add = {"node": 0, "body": "p0-0", "retry": 1, "copies": 2, "async": False}
    return [
        *(ev(0.0, f"n{i}", "node", ev="started", id=f"{i}" * 40) for i in range(3)),
        ev(0.5, "workload", "phase", ev="safety"),
        ev(0.6, "p0", "client", op="invoke", **add),
        ev(0.61, "n0", "bus", ev="send", msg="ReplJob", to="1" * 8, ids=[JOB]),
        ev(0.62, "n1", "bus", ev="recv", msg="ReplJob", **{"from": "0" * 8}, ids=[JOB]),
        ev(0.62, "n1", "job", ev="registered", id=JOB, via="ReplJob"),
        ev(0.7, "p0", "client", op="add", ok=True, reply=JOB, **add),
        ev(0.8, "p0", "client", op="invoke", **{**add, "body": "p0-1"}),
        ev(0.9, "p0", "client", op="add", ok=False, reply="connection error: EOFError", **add),
        ev(1.0, "fault", "begin", fault="isolate n2 at +0.5s for 3.0s (arg 1)"),
        ev(1.0, "net", "fault", ev="cut", key="cut-1", a=["7713"], b=["7711", "7712"]),
        ev(1.2, "c0", "client", op="get", node=0, id=JOB, body="p0-0"),
        ev(1.3, "c0", "client", op="ack", node=0, id=JOB, fast=False, reply="1"),
        ev(1.31, "n0", "bus", ev="send", msg="SetAck", to="2" * 8, ids=[JOB]),
        ev(1.4, "c0", "client", op="get", node=0, id=OTHER, body="p0-7"),
        ev(1.5, "n0", "fault", ev="clock-jump", ms=-1500),
        ev(2.0, "fault", "begin", fault="crash n4 at +1.5s for 1.0s (arg 2)"),
        ev(2.0, "n1", "node", ev="crashed", held=1, torn=0, wipe=False),
        ev(3.0, "n1", "node", ev="started", id="1" * 40),
        ev(3.5, "fault", "begin", fault="oneway-in n0 at +3.0s for 1.0s (arg 3)"),
        ev(3.5, "net", "fault", ev="stall", key="stall-2", a=["7712", "7713"], b=["7711"]),
        ev(4.0, "net", "fault", ev="unrule", key="cut-1"),
        ev(5.0, "workload", "phase", ev="end", converged=True),
    ]


def test_page_has_a_lane_per_node_and_client() -> None:
    page = Elements(render(small_trace(), Meta("seed 9")))
    lanes = [a["data-lane"] for a in page.having("lane", "g")]
    assert lanes == ["n0", "n1", "n2", "p0", "c0"]
    assert len(page.having("node-lane")) == 3


def test_faults_are_shaded_on_their_lanes() -> None:
    events = small_trace()
    windows = timeline.fault_windows(events, timeline.node_lanes(events))
    by_kind = {w.kind: w for w in windows}
    assert by_kind["crash"].lanes == ("n1",)
    assert (by_kind["crash"].t0, by_kind["crash"].t1) == (2.0, 3.0)
    assert by_kind["crash"].label.startswith("crash n4")  # victim 4 % 3 nodes = n1
    assert by_kind["isolate"].lanes == ("n2",) and by_kind["isolate"].t1 == 4.0
    assert by_kind["clock-jump"].lanes == ("n0",)
    # The others' traffic into n0 stalled: n0 is shaded, to the end (never healed).
    assert by_kind["oneway-in"].lanes == ("n0",) and by_kind["oneway-in"].t1 == 5.0
    page = Elements(render(events, Meta("seed 9")))
    assert sorted(a["data-kind"] for a in page.having("fault", "rect")) == [
        "clock-jump",
        "crash",
        "isolate",
        "oneway-in",
    ]


def test_operations_are_bars_coloured_by_result() -> None:
    page = Elements(render(small_trace(), Meta("seed 9")))
    ops = page.having("op", "rect")
    assert len(ops) == 5
    add_ok, add_lost = [a for a in ops if "op-add" in a["class"]]
    assert "res-ok" in add_ok["class"] and "res-unknown" in add_lost["class"]
    # An ADDJOB spans invoke to reply: 0.1 s at the page's scale.
    assert float(add_ok["data-span"]) > 10
    assert {c for a in ops for c in a["class"].split() if c.startswith("res-")} == {
        "res-ok",
        "res-unknown",
        "res-get",
    }


def test_consumer_operations_span_their_call_to_their_reply() -> None:
    """GETJOB, ACKJOB, NACK and WORKING records carry their call's time
    (``t0``): bars from call to reply; a record without it is a tick."""
    events = [
        *small_trace()[:-1],
        ev(4.2, "c1", "client", op="get", node=1, id=OTHER, body="p0-7", t0=4.0),
        ev(4.35, "c1", "client", op="working", node=1, id=OTHER, reply="3", t0=4.3),
        ev(4.6, "c1", "client", op="nack", node=1, id=OTHER, reply="1", t0=4.5),
        ev(4.8, "c1", "client", op="ack", node=1, id=OTHER, fast=True, reply="1", t0=4.7),
        ev(5.0, "workload", "phase", ev="end", converged=True),
    ]
    spans = {o.op: (o.t0, o.t1) for o in timeline.client_ops(events) if o.client == "c1"}
    assert spans == {
        "get": (4.0, 4.2),
        "working": (4.3, 4.35),
        "nack": (4.5, 4.6),
        "ack": (4.7, 4.8),
    }
    c0 = [o for o in timeline.client_ops(events) if o.client == "c0"]
    assert all(o.t0 == o.t1 for o in c0)  # no t0 recorded: ticks


def test_the_violating_job_is_highlighted_with_its_bus_messages() -> None:
    violation = "lost: p0-0 added OK, never delivered"
    page = Elements(render(small_trace(), Meta("seed 9", "python -m sim run", (violation,))))
    highlighted = page.having("hl", "rect")
    assert {a["data-job"] for a in highlighted} == {JOB}
    assert len(highlighted) == 3  # add, get, ack
    arrows = page.having("arrow", "g")
    assert len(arrows) == 2 and all(a["data-job"] == JOB for a in arrows)
    assert len(page.having("lost", "g")) == 1  # the SETACK never delivered
    assert len(page.having("mark", "g")) == 1
    assert [a["value"] for t, a in page.tags if t == "option"] == [JOB]
    assert [a["data-job"] for a in page.having("violation", "li")] == [JOB]


def test_jobs_are_found_by_id_and_by_body() -> None:
    events = small_trace()
    texts = [f"phantom: p0-7 and {JOB}", "acked-collected: n0 still holds p0-0"]
    assert timeline.focus_jobs(events, texts) == [OTHER, JOB]


def test_page_size_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_OPS", 2)
    page = render(small_trace(), Meta("seed 9", "", (f"x {JOB}",)))
    elements = Elements(page)
    ops = elements.having("op", "rect")
    assert len(ops) == 2 and all(a["data-job"] == JOB for a in ops)
    assert "3 elements not drawn" in page


def test_page_is_self_contained() -> None:
    page = render(small_trace(), Meta("seed 9"))
    tags = Elements(page).tags
    assert not [
        a for t, a in tags if t in ("script", "link", "img") and ("src" in a or "href" in a)
    ]
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_a_failing_run_draws_its_violation() -> None:
    outcome = run_plan(Plan.from_seed(1), "aof-write-dropped")
    assert not outcome.ok
    lines = outcome.world.trace.lines
    page = timeline.from_trace_lines(lines, Meta("seed 1", "", tuple(outcome.violations)))
    elements = Elements(page)
    assert len(elements.having("node-lane")) == outcome.plan.nodes
    assert elements.having("fault", "rect")
    assert elements.having("hl", "rect") and elements.having("arrow", "g")
    assert len(page) < 2_000_000


def test_replay_html_writes_the_timeline(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    record = {"plan": json.loads(Plan.from_seed(1).to_json()), "mutant": "aof-write-dropped"}
    plan_path.write_text(json.dumps(record))
    out = tmp_path / "out.html"
    trace = tmp_path / "t.jsonl"
    replay = sim_cli(
        "replay", str(plan_path), "--html", str(out), "--trace", str(trace), "--quiet"
    )
    lines = replay.stdout.strip().splitlines()
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert f"timeline: {out}" in lines and lines[-1].startswith("digest ")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "FAIL" in page
    # The same page from the trace file the run wrote.
    drawn = sim_cli("timeline", str(trace))
    assert drawn.stdout.strip() == f"timeline: {tmp_path / 't.html'}", drawn.stderr
    assert Elements((tmp_path / "t.html").read_text()).having("hl", "rect")


def test_a_broken_drawing_does_not_hide_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(lines: list[str], meta: Meta) -> str:
        raise RuntimeError("boom")

    outcome = run_plan(Plan.from_seed(2, 1, 1))
    monkeypatch.setattr(timeline, "from_trace_lines", broken)
    assert report_run(outcome, html=str(tmp_path / "t.html")) == (0 if outcome.ok else 1)
    lines = capsys.readouterr().out.splitlines()
    assert "timeline: not drawn: RuntimeError: boom" in lines
    assert lines[-1].startswith("digest ")
