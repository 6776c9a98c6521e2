"""A run's trace as one self-contained HTML page, like Jepsen's timeline.

Pure: trace events (the dicts of sim/trace.py's lines) in, an HTML string
out, with inline CSS, SVG and a few lines of JS; no network resource. Time
runs left to right in virtual seconds. The page shows

* one lane per node, shaded where a fault held it: crashes (down to
  restart), partitions, one-way partitions, clogs and pauses (the side the
  rule names first), bus chaos; clock jumps and resets as thin marks;
* one lane per client, each operation a bar from call to reply coloured by
  its result. ADDJOB records its call as an "invoke" event; a consumer's
  GETJOB, ACKJOB, NACK and WORKING carry their call's time (``t0``) in the
  reply's record; an operation with neither (forget, share) is a tick;
* the jobs the violations name (by id ``D-...`` or by body ``p0-12``): their
  operations outlined, their state changes marked on the node lanes, and
  the bus messages about them (``cat bus``, send then recv) as arrows from
  sender to receiver; a message sent and never delivered ends in a cross. A
  menu, or a click on a violation, picks which of these jobs is highlighted.

The page's size is bounded for long runs: at most ``MAX_OPS`` client bars
(the highlighted jobs' first), ``MAX_ARROWS`` arrows and ``MAX_MARKS`` job
marks; what is left out is counted on the page.
"""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any

import attrs

MAX_OPS = 6000
MAX_ARROWS = 1500
MAX_MARKS = 1500
MAX_FOCUS = 12  # jobs offered in the menu
BASE_PORT = 7711  # sim/world.py: node i listens on BASE_PORT + i

NODE_LANE_H = 36
CLIENT_LANE_H = 16
LEFT = 70  # lane labels
TOP = 40  # time axis and phase labels

JOB_ID = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/=]{8,40}-[0-9a-z]{4}")
BODY = re.compile(r"(?<![\w-])[p]\d+-\d+(?![\w-])")
FAULT = re.compile(r"^(\S+) n(\d+) at \+[\d.]+s for ([\d.]+)s")

Event = dict[str, Any]


@attrs.frozen
class Window:
    """A fault holding some lanes from t0 to t1 (t0 == t1: an instant)."""

    kind: str
    label: str
    lanes: tuple[str, ...]
    t0: float
    t1: float


@attrs.frozen
class Op:
    """One client operation: a bar from call to reply (t0 == t1: a tick)."""

    client: str
    op: str
    result: str  # ok | fail | unknown | get | forget | admin: the colour
    job: str  # the job id, or the body of an ADDJOB never answered with one
    t0: float
    t1: float
    title: str


@attrs.frozen
class Arrow:
    """A bus message about a job, from its sender's lane to its receiver's;
    t1 is None when it was never delivered."""

    msg: str
    job: str
    src: str
    dst: str
    t0: float
    t1: float | None


@attrs.frozen
class Mark:
    """A job's state change on a node (registered, queued, acked...)."""

    node: str
    job: str
    ev: str
    t: float
    via: str


@attrs.frozen
class Meta:
    """What the page says above the timeline."""

    title: str
    replay: str = ""
    violations: tuple[str, ...] = ()


# ------------------------------------------------------------ reading the trace


def node_lanes(events: list[Event]) -> list[str]:
    """n0..nK-1, for every node that started at least once."""
    count = 0
    for e in events:
        if e["cat"] == "node" and e["data"].get("ev") == "started":
            count = max(count, int(e["node"][1:]) + 1)
    return [f"n{i}" for i in range(count)]


def client_lanes(events: list[Event]) -> list[str]:
    names = {e["node"] for e in events if e["cat"] == "client"}
    return sorted(names, key=lambda n: (n[0] != "p", n[0], len(n), n))


def lane_of_port(port: str) -> str | None:
    """A rule's port ("7713") as its node's lane; None for the clients."""
    return f"n{int(port) - BASE_PORT}" if port.isdigit() else None


def focus_jobs(events: list[Event], violations: Iterable[str]) -> list[str]:
    """The jobs the violations name, in order: ids, and bodies mapped to
    the id their ADDJOB or a delivery gave them."""
    return jobs_named(violations, ids_of_bodies(events))


def ids_of_bodies(events: list[Event]) -> dict[str, str]:
    """Each job body the clients saw, and the id its ADDJOB or its first
    delivery gave it."""
    id_of_body: dict[str, str] = {}
    for e in events:
        data = e["data"]
        if e["cat"] != "client" or "body" not in data:
            continue
        if data.get("op") == "add" and data.get("ok"):
            id_of_body.setdefault(data["body"], data["reply"])
        elif data.get("op") == "get":
            id_of_body.setdefault(data["body"], data["id"])
    return id_of_body


def jobs_named(violations: Iterable[str], id_of_body: dict[str, str]) -> list[str]:
    """The jobs ``violations`` name, in order, without repeats (at most
    MAX_FOCUS)."""
    jobs: list[str] = []
    for text in violations:
        found = [(m.start(), m.group()) for m in JOB_ID.finditer(text)]
        found += [(m.start(), id_of_body.get(m.group(), m.group())) for m in BODY.finditer(text)]
        for _, job in sorted(found):
            if job not in jobs:
                jobs.append(job)
    return jobs[:MAX_FOCUS]


def end_time(events: list[Event]) -> float:
    return max((float(e["t"]) for e in events), default=0.0)


def fault_windows(events: list[Event], lanes: list[str]) -> list[Window]:
    """Crashes from the node's "crashed" to its next "started"; network
    rules from their record to "unrule" or "heal"; the rest from their
    "begin" record and the plan's length, cut at the heal."""
    end = end_time(events)
    healed = next(
        (e["t"] for e in events if e["cat"] == "fault" and e["data"].get("ev") == "heal"), end
    )
    out: list[Window] = []
    down: dict[str, tuple[float, str]] = {}
    rules: dict[str, tuple[float, str, tuple[str, ...]]] = {}
    label_at: dict[float, str] = {}
    for e in events:
        cat, data, t = e["cat"], e["data"], float(e["t"])
        ev = data.get("ev")
        if cat == "begin":
            label_at[t] = data["fault"]
            out += _begin_window(data["fault"], t, healed, lanes)
        elif cat == "node" and ev == "crashed":
            kind = "wipe" if data.get("wipe") else "torn-crash" if data.get("torn") else "crash"
            down[e["node"]] = (t, label_at.get(t, kind))
        elif cat == "node" and ev == "started" and e["node"] in down:
            t0, label = down.pop(e["node"])
            out.append(Window("crash", label, (e["node"],), t0, t))
        elif cat == "fault" and ev in ("cut", "stall", "clog"):
            label = label_at.get(t, ev)
            rules[data["key"]] = (t, label, _rule_lanes(label, data["a"], lanes))
        elif cat == "fault" and ev in ("unrule", "heal"):
            keys = [data["key"]] if ev == "unrule" else list(rules)
            for key in keys:
                if key in rules:
                    t0, label, sides = rules.pop(key)
                    out.append(Window(_rule_kind(label), label, sides, t0, t))
        elif cat == "fault" and ev == "clock-jump":
            out.append(Window("clock-jump", f"clock jump {data['ms']:+d} ms", (e["node"],), t, t))
    out += [Window("crash", label, (n,), t0, end) for n, (t0, label) in down.items()]
    out += [Window(_rule_kind(lb), lb, sides, t0, end) for t0, lb, sides in rules.values()]
    return out


def _rule_lanes(label: str, side_a: list[str], lanes: list[str]) -> tuple[str, ...]:
    """The fault's victim (a one-way partition into it names the others
    first), or for random halves the side the rule names first."""
    m = FAULT.match(label)
    if m is not None and m.group(1) != "halves" and lanes:
        return (lanes[int(m.group(2)) % len(lanes)],)
    return tuple(x for x in map(lane_of_port, side_a) if x is not None)


def _rule_kind(label: str) -> str:
    kind = label.split(" ", 1)[0]
    return (
        kind
        if kind in ("isolate", "halves", "oneway-out", "oneway-in", "clog", "pause")
        else "cut"
    )


def _begin_window(describe: str, t: float, healed: float, lanes: list[str]) -> list[Window]:
    """Faults that leave no record of their own: bus chaos (a window) and
    connection resets (an instant)."""
    m = FAULT.match(describe)
    if m is None or not lanes:
        return []
    kind, victim, length = m.group(1), lanes[int(m.group(2)) % len(lanes)], float(m.group(3))
    if kind == "bus-chaos":
        return [Window(kind, describe, (victim,), t, max(t, min(t + length, healed)))]
    if kind == "reset":
        return [Window(kind, describe, (victim,), t, t)]
    return []


def client_ops(events: list[Event]) -> list[Op]:
    """Every client operation; an ADDJOB spans its invoke to its reply."""
    out: list[Op] = []
    called: dict[str, float] = {}
    for e in events:
        if e["cat"] != "client":
            continue
        data, t, client = e["data"], float(e["t"]), e["node"]
        op = str(data.get("op", "?"))
        if op == "invoke":
            called[client] = t
            continue
        if op == "add":
            t0 = called.pop(client, t)
        else:  # consumers record their call's time with the reply
            t0 = float(data["t0"]) if isinstance(data.get("t0"), int | float) else t
        job = str(data.get("id") or (data["reply"] if data.get("ok") else data.get("body", "")))
        title = f"{client} {op} " + " ".join(f"{k}={v}" for k, v in sorted(data.items()))
        out.append(Op(client, op, _result(op, data), job, t0, t, title))
    return out


def _result(op: str, data: dict[str, Any]) -> str:
    if op == "add":
        if data.get("ok"):
            return "ok"
        return "unknown" if str(data.get("reply", "")).startswith("connection") else "fail"
    if op in ("get", "forget"):
        return op
    if op == "error":
        return "unknown"
    if op in ("pause", "resume"):
        return "admin"
    reply = str(data.get("reply", ""))
    return "fail" if reply.startswith(("ERR", "NOJOB", "conn", "MISCONF")) else "ok"


def bus_arrows(events: list[Event], jobs: set[str]) -> list[Arrow]:
    """The bus messages about ``jobs``: each delivery paired with the
    earliest undelivered send of the same message, job, sender and
    receiver; sends never paired are messages lost."""
    lane_of_id: dict[str, str] = {}
    pending: dict[tuple[str, str, str, str], deque[float]] = defaultdict(deque)
    out: list[Arrow] = []
    for e in events:
        data = e["data"]
        if e["cat"] == "node" and data.get("ev") == "started":
            lane_of_id[data["id"][:8]] = e["node"]
        if e["cat"] != "bus":
            continue
        for job in jobs.intersection(data["ids"]):
            if data["ev"] == "send":
                dst = lane_of_id.get(data["to"], data["to"])
                pending[(data["msg"], job, e["node"], dst)].append(float(e["t"]))
                continue
            src = lane_of_id.get(data["from"], data["from"])
            sent = pending[(data["msg"], job, src, e["node"])]
            t0 = sent.popleft() if sent else float(e["t"])
            out.append(Arrow(data["msg"], job, src, e["node"], t0, float(e["t"])))
    for (msg, job, src, dst), times in pending.items():
        out += [Arrow(msg, job, src, dst, t0, None) for t0 in times]
    return sorted(out, key=lambda a: a.t0)


def job_marks(events: list[Event], jobs: set[str]) -> list[Mark]:
    return [
        Mark(e["node"], e["data"]["id"], e["data"]["ev"], float(e["t"]), e["data"].get("via", ""))
        for e in events
        if e["cat"] == "job" and e["data"]["id"] in jobs
    ]


def phases(events: list[Event]) -> list[tuple[str, float]]:
    return [
        (e["data"]["ev"], float(e["t"]))
        for e in events
        if e["cat"] == "phase" and e["node"] == "workload"
    ]


# ------------------------------------------------------------ drawing


@attrs.define
class Canvas:
    """Lane geometry and the SVG elements drawn so far."""

    lanes: dict[str, tuple[float, float]]  # lane -> (top y, height)
    scale: float  # pixels per virtual second
    width: float
    height: float
    parts: list[str] = attrs.field(factory=list)

    def x(self, t: float) -> float:
        return round(LEFT + t * self.scale, 1)

    def mid(self, lane: str) -> float:
        top, h = self.lanes[lane]
        return round(top + h / 2, 1)


def _canvas(nodes: list[str], clients: list[str], end: float) -> Canvas:
    scale = min(200.0, max(20.0, 1600.0 / max(end, 1.0)))
    lanes: dict[str, tuple[float, float]] = {}
    y = float(TOP)
    for name in nodes:
        lanes[name] = (y, NODE_LANE_H)
        y += NODE_LANE_H
    y += 8
    for name in clients:
        lanes[name] = (y, CLIENT_LANE_H)
        y += CLIENT_LANE_H
    return Canvas(lanes, scale, LEFT + end * scale + 20, y + 8)


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def _title(text: str) -> str:
    return f"<title>{html.escape(text)}</title>"


def _draw_lanes(c: Canvas, nodes: list[str], end: float) -> None:
    for name, (top, h) in c.lanes.items():
        kind = "node" if name in nodes else "client"
        c.parts.append(
            f'<g class="lane {kind}-lane" data-lane="{_attr(name)}">'
            f'<rect class="lane-bg" x="{LEFT}" y="{top}" width="{c.x(end) - LEFT}" height="{h}"/>'
            "</g>"
        )
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600) if s * c.scale >= 60)
    for i in range(int(end // step) + 1):
        x = c.x(i * step)
        c.parts.append(
            f'<line class="tick" x1="{x}" y1="{TOP - 4}" x2="{x}" y2="{c.height}"/>'
            f'<text class="tick-label" x="{x}" y="{TOP - 8}">{i * step}s</text>'
        )


def _draw_phases(c: Canvas, marks: list[tuple[str, float]]) -> None:
    for i, (name, t) in enumerate(marks):
        x = c.x(t)
        y = TOP - 18 - 9 * (i % 2)  # phases close together: labels on two rows
        c.parts.append(
            f'<g class="phase"><line x1="{x}" y1="{y + 2}" x2="{x}" y2="{c.height}"/>'
            f'<text x="{x + 3}" y="{y}">{html.escape(name)}</text></g>'
        )


def _draw_faults(c: Canvas, windows: list[Window]) -> None:
    for w in windows:
        for lane in w.lanes:
            if lane not in c.lanes:
                continue
            top, h = c.lanes[lane]
            x0 = c.x(w.t0)
            span = round((w.t1 - w.t0) * c.scale, 1)
            c.parts.append(
                f'<rect class="fault fault-{_attr(w.kind)}" data-kind="{_attr(w.kind)}" '
                f'x="{x0}" y="{top + 1}" width="{max(2.0, span)}" data-span="{span}" '
                f'data-min="2" height="{h - 2}">'
                f"{_title(f'{w.label} ({w.t0:.2f}s to {w.t1:.2f}s)')}</rect>"
            )


def _draw_ops(c: Canvas, ops: list[Op], focus: list[str]) -> int:
    """Client bars, the highlighted jobs' first; returns how many were left out."""
    wanted = set(focus)
    chosen = [o for o in ops if o.job in wanted] + [o for o in ops if o.job not in wanted]
    shown = sorted(chosen[:MAX_OPS], key=lambda o: o.t0)
    first = focus[0] if focus else None
    for o in shown:
        top, h = c.lanes[o.client]
        x0 = c.x(o.t0)
        span = round((o.t1 - o.t0) * c.scale, 1)
        hl = " hl" if o.job == first else ""
        c.parts.append(
            f'<rect class="op op-{o.op} res-{o.result}{hl}" data-job="{_attr(o.job)}" '
            f'x="{x0}" y="{top + 2}" width="{max(3.0, span)}" data-span="{span}" data-min="3" '
            f'height="{h - 4}">{_title(o.title)}</rect>'
        )
    return len(ops) - len(shown)


def _draw_marks(c: Canvas, marks: list[Mark], focus: list[str]) -> int:
    first = focus[0] if focus else None
    for m in marks[:MAX_MARKS]:
        if m.node not in c.lanes:
            continue
        x, y = c.x(m.t), c.lanes[m.node][0] + 6
        hidden = "" if m.job == first else " off"
        via = f" via {m.via}" if m.via else ""
        c.parts.append(
            f'<g class="mark{hidden}" data-job="{_attr(m.job)}">'
            f'<line x1="{x}" y1="{y - 4}" x2="{x}" y2="{y + 4}"/>'
            f"{_title(f'{m.t:.4f}s {m.node} {m.ev}{via} {m.job}')}"
            "</g>"
        )
    return max(0, len(marks) - MAX_MARKS)


def _draw_arrows(c: Canvas, arrows: list[Arrow], focus: list[str]) -> int:
    first = focus[0] if focus else None
    for a in arrows[:MAX_ARROWS]:
        if a.src not in c.lanes or a.dst not in c.lanes:
            continue
        hidden = "" if a.job == first else " off"
        lost = a.t1 is None
        x1, y1 = c.x(a.t0), c.mid(a.src)
        x2 = c.x(a.t1) if a.t1 is not None else round(x1 + 12, 1)
        y2 = c.mid(a.dst) if not lost else round((y1 + c.mid(a.dst)) / 2, 1)
        when = f"{a.t0:.4f}s -> " + ("lost" if lost else f"{a.t1:.4f}s")
        c.parts.append(
            f'<g class="arrow{" lost" if lost else ""}{hidden}" data-job="{_attr(a.job)}">'
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" marker-end="url(#{"x" if lost else "head"})"/>'
            f"{_title(f'{a.msg} {a.src} -> {a.dst} {when} {a.job}')}</g>"
        )
    return max(0, len(arrows) - MAX_ARROWS)


# ------------------------------------------------------------ the page


def render(events: list[Event], meta: Meta) -> str:
    """The whole page for one run."""
    nodes, clients = node_lanes(events), client_lanes(events)
    end = end_time(events)
    id_of_body = ids_of_bodies(events)
    focus = jobs_named(meta.violations, id_of_body)
    c = _canvas(nodes, clients, end)
    _draw_lanes(c, nodes, end)
    _draw_faults(c, fault_windows(events, nodes))
    _draw_phases(c, phases(events))
    left_out = _draw_ops(c, client_ops(events), focus)
    left_out += _draw_marks(c, job_marks(events, set(focus)), focus)
    left_out += _draw_arrows(c, bus_arrows(events, set(focus)), focus)
    svg = (
        _labels(c) + f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{c.width}" '
        f'height="{c.height}" viewBox="0 0 {c.width} {c.height}">{_DEFS}'
        + "".join(c.parts)
        + "</svg>"
    )
    firsts = [(v, next(iter(jobs_named([v], id_of_body)), "")) for v in meta.violations]
    return _page(meta, focus, firsts, svg, left_out)


def _labels(c: Canvas) -> str:
    """The lane names, in an SVG of their own that stays in view (sticky)
    over the timeline's left margin when it scrolls."""
    texts = "".join(
        f'<text class="lane-label" x="{LEFT - 6}" y="{top + h / 2 + 4}">{html.escape(name)}</text>'
        for name, (top, h) in c.lanes.items()
    )
    return (
        f'<svg id="labels" xmlns="http://www.w3.org/2000/svg" width="{LEFT}" height="{c.height}">'
        f'<rect width="{LEFT}" height="{c.height}" class="labels-bg"/>{texts}</svg>'
    )


def _page(
    meta: Meta, focus: list[str], firsts: list[tuple[str, str]], svg: str, left_out: int
) -> str:
    """``firsts``: each violation and the first job it names (a click on
    it highlights that job)."""
    verdict = "FAIL" if meta.violations else "PASS"
    violations = "".join(
        f'<li class="violation" data-job="{_attr(job)}">{html.escape(v)}</li>' for v, job in firsts
    )
    options = "".join(f'<option value="{_attr(j)}">{html.escape(j)}</option>' for j in focus)
    picker = f'<label>highlighted job <select id="job">{options}</select></label>' if focus else ""
    note = f'<p class="note">{left_out} elements not drawn (size cap)</p>' if left_out else ""
    replay = f"<p>replay: <code>{html.escape(meta.replay)}</code></p>" if meta.replay else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(meta.title)} {verdict}</title><style>{_CSS}</style></head><body>"
        f'<h1>{html.escape(meta.title)} <span class="verdict {verdict.lower()}">{verdict}</span></h1>'
        f'{replay}<ul id="violations">{violations}</ul>'
        f'<div class="controls">{picker}{_ZOOM}{_LEGEND}</div>{note}'
        f'<div id="scroll">{svg}</div><script>{_JS}</script></body></html>\n'
    )


def from_trace_lines(lines: Iterable[str], meta: Meta) -> str:
    """The page from a run's trace lines (sim/trace.py's ``Trace.lines``)."""
    return render([json.loads(line) for line in lines], meta)


def from_trace_file(path: str) -> str:
    """The page from a trace written by ``--trace`` or a failing run
    (a header line, the events, a footer line)."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    header = records[0].get("header", {}) if records else {}
    footer = records[-1].get("footer", {}) if records else {}
    events = [r for r in records if "cat" in r]
    title = f"seed {header.get('seed')}" + (
        f" mutant {header['mutant']}" if header.get("mutant") else ""
    )
    meta = Meta(title, header.get("replay", ""), tuple(footer.get("violations", ())))
    return render(events, meta)


_DEFS = (
    "<defs>"
    '<marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
    'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="head"/></marker>'
    '<marker id="x" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="8" markerHeight="8">'
    '<path d="M1,1 L9,9 M9,1 L1,9" class="cross"/></marker>'
    "</defs>"
)

_ZOOM = '<button id="zoom-out">zoom out</button><button id="zoom-in">zoom in</button>'

_LEGEND = (
    '<span class="legend">'
    '<i class="sw res-ok"></i>ok <i class="sw res-fail"></i>error '
    '<i class="sw res-unknown"></i>connection lost / unknown <i class="sw res-get"></i>delivered '
    '<i class="sw res-forget"></i>forgotten <i class="sw fault-crash"></i>crash '
    '<i class="sw fault-isolate"></i>partition <i class="sw fault-pause"></i>pause / clog '
    '<i class="sw fault-bus-chaos"></i>bus chaos <i class="sw fault-clock-jump"></i>clock jump / reset'
    "</span>"
)

_CSS = """
body{font:13px system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:17px;margin:0 0 6px}
.verdict{padding:1px 6px;border-radius:3px;color:#fff}.verdict.fail{background:#c0392b}
.verdict.pass{background:#27ae60}
code{background:#f3f3f3;padding:1px 4px}
#violations .pick{cursor:pointer;text-decoration:underline dotted}
#violations{margin:4px 0;padding-left:18px;color:#a01010;font-family:monospace;font-size:12px}
.controls{margin:6px 0}.legend{margin-left:12px}
.sw{display:inline-block;width:12px;height:10px;margin:0 3px 0 8px;vertical-align:middle}
.note{color:#777}
button{margin-left:8px}
#scroll{overflow:auto;border:1px solid #ccc;max-height:80vh;display:flex;align-items:flex-start}
#labels{position:sticky;left:0;z-index:1;flex:none;margin-right:-LEFT_PXpx}
#timeline{flex:none}.labels-bg{fill:#fff;opacity:.9}
svg text{font-size:10px;fill:#444}
.lane-label{text-anchor:end;font-weight:600}
.node-lane .lane-bg{fill:#f7f7fa;stroke:#ddd}.client-lane .lane-bg{fill:#fff;stroke:#f0f0f0}
.tick{stroke:#eee}.tick-label{text-anchor:middle}
.phase line{stroke:#888;stroke-dasharray:3 3}.phase text{fill:#666}
.fault{opacity:.55}
.fault-crash,.fault-wipe,.fault-torn-crash{fill:#e74c3c;background:#e74c3c}
.fault-isolate,.fault-halves,.fault-cut,.fault-oneway-out,.fault-oneway-in{fill:#f39c12;background:#f39c12}
.fault-pause,.fault-clog{fill:#8e44ad;background:#8e44ad}
.fault-bus-chaos{fill:#16a085;background:#16a085}
.fault-clock-jump,.fault-reset{fill:#2c3e50;background:#2c3e50;opacity:.9}
.op{stroke:none}
.res-ok{fill:#2ecc71;background:#2ecc71}.res-fail{fill:#e74c3c;background:#e74c3c}
.res-unknown{fill:#f5b041;background:#f5b041}.res-get{fill:#3498db;background:#3498db}
.res-forget{fill:#aaa;background:#aaa}.res-admin{fill:#8e44ad;background:#8e44ad}
.op.hl{stroke:#000;stroke-width:2}
.mark line{stroke:#000;stroke-width:3}
.arrow line{stroke:#1f3a93;stroke-width:1.3}.arrow.lost line{stroke:#c0392b;stroke-dasharray:2 2}
.head{fill:#1f3a93}.cross{stroke:#c0392b;stroke-width:2}
.off{display:none}
""".replace("LEFT_PX", str(LEFT))

# The menu (or a click on a violation) moves the highlight: outlines on the
# job's bars, its marks and arrows shown, everyone else's hidden; the view
# scrolls to its first bar.
# Zoom stretches time only: x coordinates are recomputed from the originals.
_JS = """
(function(){
  var svg=document.getElementById('timeline'),scroll=document.getElementById('scroll');
  var menu=document.getElementById('job'),z=1,left=LEFT_PX;
  var width=+svg.getAttribute('width'),height=svg.getAttribute('height');
  var moving=svg.querySelectorAll('[x],[x1]');
  moving.forEach(function(e){
    ['x','x1','x2'].forEach(function(a){if(e.hasAttribute(a))e.dataset[a]=e.getAttribute(a);});
  });
  function focus(){
    var first=document.querySelector('.op.hl, .arrow:not(.off), .mark:not(.off)');
    if(first&&first.getBBox){scroll.scrollLeft=Math.max(0,first.getBBox().x-200);}
  }
  function at(v){var x=+v;return x<left?x:left+(x-left)*z;}
  function zoom(f){
    z=Math.min(256,Math.max(1,z*f));
    var w=left+(width-left)*z;
    svg.setAttribute('width',w);svg.setAttribute('viewBox','0 0 '+w+' '+height);
    moving.forEach(function(e){
      ['x','x1','x2'].forEach(function(a){if(a in e.dataset)e.setAttribute(a,at(e.dataset[a]));});
      if('span' in e.dataset){e.setAttribute('width',Math.max(+e.dataset.min,e.dataset.span*z));}
      else if(e.classList.contains('lane-bg')){e.setAttribute('width',(width-left-20)*z);}
    });
    focus();
  }
  function show(job){
    document.querySelectorAll('.op').forEach(function(e){
      e.classList.toggle('hl',e.getAttribute('data-job')===job);});
    document.querySelectorAll('.mark,.arrow').forEach(function(e){
      e.classList.toggle('off',e.getAttribute('data-job')!==job);});
    focus();
  }
  document.getElementById('zoom-in').addEventListener('click',function(){zoom(2);});
  document.getElementById('zoom-out').addEventListener('click',function(){zoom(0.5);});
  if(!menu)return;
  menu.addEventListener('change',function(){show(menu.value);});
  document.querySelectorAll('.violation').forEach(function(li){
    var job=li.getAttribute('data-job');
    if(!job||!menu.querySelector('option[value="'+CSS.escape(job)+'"]'))return;
    li.classList.add('pick');
    li.addEventListener('click',function(){menu.value=job;show(job);});
  });
  show(menu.value);
})();
""".replace("LEFT_PX", str(LEFT))
