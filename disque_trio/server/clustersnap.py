"""The cluster as the dashboard shows it, as plain data: pure functions.

From the serving node's own cluster table (read into :class:`Member` rows
by ``clusterview.py``) and the figures the other nodes sent over the bus
(``bus.NodeStats``), :func:`cluster_event` builds the ``cluster`` event; from
the copies they described (``bus.JobCopy``), :func:`lookup_result` builds
the answer to a job lookup. No I/O and no clock here: times are arguments,
so the unit tests give every case directly.

A node's state and link always come from the serving node's table, never
from the node itself: a node that is down cannot say so, and the table
marks it PFAIL within ``cluster-node-timeout`` (then FAIL, when a majority
agrees). Until then a node whose link is down is ``unreachable``, not
``ok``: the link drops at once when a process dies, and a state that said
ok beside it would say what nobody knows. Its figures are shown only while
they are fresh (``FRESH_MS``) and our link to it is up; otherwise the row
says why there are none.

Copies and jobs: each node's figures count the copies it holds, so their
sum counts a job with three copies three times. The nodes of bus protocol
10 also say how many jobs they count for the cluster (``jobcensus.py``:
each job is counted by one of its holders), and the totals add those up
to the jobs (``distinct_jobs``), unknown while a node with figures sent
none (an older release). The jobs waiting to be queued again (``requeue``)
are counted the same way, per queue, with the earliest time one is due.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..core.job import JobState
from ..core.node import Node
from ..protocol import bus
from ..protocol.wsjson import text_json

# The first bus protocol version whose nodes answer GETSTATS and FINDJOB.
FIGURES_SINCE: Final = bus.SINCE_VERSION[bus.GetStats]
# Figures older than this are not shown: three periods of the gathering
# (one a second), so one answer lost or late does not blank a row.
FRESH_MS: Final = 3000
# The ``cluster`` event lists this many queues at most, the longest first
# (the jobs of the others are counted in ``omitted_jobs``).
EVENT_MAX_QUEUES: Final = 1000

# Why a row has no figures (the dashboard shows these words).
NO_LINK = "unreachable"  # our link to it is down: it cannot be asked
OLDER = "older release"  # its bus protocol has no GETSTATS
NO_ANSWER = "no answer"  # asked, and nothing came back (in time)
ASKING = "asking"  # just asked for the first time
NOT_KNOWN = "not in the cluster table"  # a job's holder this node does not know

# Flags in the order they decide a node's one-word state.
_STATE_ORDER = ("fail", "pfail", "leaving", "handshake", "noaddr")
# The state of a node none of those flags apply to, whose link is down.
LINK_DOWN = "unreachable"


@attrs.frozen
class Member:
    """One node of the serving node's table, as the dashboard names it."""

    node_id: str
    addr: str  # ip:port of its client port
    flags: tuple[str, ...]  # myself, pfail, fail, leaving, handshake, noaddr
    link: str  # self, connected, disconnected (our outbound link)
    bus_version: int  # the version our link to it spoke last; 0: never up
    last_pong: int  # ms


@attrs.frozen
class Heard:
    """A node's last answer to GETSTATS and when it arrived (wall ms,
    here). ``jobs`` and ``requeue`` (its job census) come with NODEFIGURES:
    None and () from a node that answers NODESTATS (bus protocol 5 to 9)."""

    stats: bus.NodeStats
    at_ms: int
    jobs: int | None = None  # the jobs it counts for the cluster
    requeue: tuple[bus.QueueRequeue, ...] = ()  # next_ms from at_ms
    omitted_requeue: int = 0

    @classmethod
    def of(cls, msg: bus.NodeStats | bus.NodeFigures, at_ms: int) -> Heard:
        if isinstance(msg, bus.NodeStats):
            return cls(msg, at_ms)
        return cls(msg.stats, at_ms, msg.jobs, msg.requeue, msg.omitted_requeue)


def state_of(flags: Iterable[str], link: str = "self") -> str:
    """One word for a node: ``fail``, ``pfail``, ``leaving``,
    ``handshake``, ``noaddr`` (the first of its flags in that order), else
    ``unreachable`` when our ``link`` to it is down, else ``ok``."""
    have = set(flags)
    state = next((name for name in _STATE_ORDER if name in have), "ok")
    return LINK_DOWN if state == "ok" and link == "disconnected" else state


def missing_figures(
    member: Member, heard: Heard | None, now_ms: int, asked_ms: int | None = None
) -> str | None:
    """Why a row shows no figures, or None when it shows ``heard``.
    ``asked_ms``: when this node first asked it (since someone watches)."""
    if member.link == "self":
        return None
    if member.link != "connected":
        return NO_LINK
    if 0 < member.bus_version < FIGURES_SINCE:
        return OLDER
    since = heard.at_ms if heard is not None else asked_ms
    if since is not None and not 0 <= now_ms - since <= FRESH_MS:
        return NO_ANSWER
    return ASKING if heard is None else None


def figures_json(heard: Heard, now_ms: int) -> dict[str, Any]:
    """A node's figures in the event (the names of the ``stats`` event),
    and its census: ``jobs_counted``, ``requeue`` (None before NODEFIGURES)."""
    stats = heard.stats
    jobs = {
        "queued": stats.queued,
        "active": stats.active,
        "acked": stats.acked,
        "wait_repl": stats.wait_repl,
    }
    waiting = sum(q.length for q in stats.lengths) + stats.omitted_jobs
    requeue = None
    if heard.jobs is not None:
        due = [heard.at_ms + q.next_ms for q in heard.requeue]
        count = sum(q.jobs for q in heard.requeue) + heard.omitted_requeue
        requeue = requeue_json(count, min(due, default=None), now_ms)
    return {
        "uptime": stats.uptime,
        "used_memory": stats.used_memory,
        "clients": stats.clients,
        "ops_per_sec": stats.ops_per_sec,
        "jobs": {"total": sum(jobs.values()), **jobs},
        "jobs_counted": heard.jobs,
        "queues": stats.queues,
        "waiting": waiting,
        "requeue": requeue,
        "aof": {"state": stats.aof, "size": stats.aof_size},
    }


def requeue_json(jobs: int, due_ms: int | None, now_ms: int) -> dict[str, Any] | None:
    """Jobs waiting to be queued again and in how long the first one is
    due (null when unknown: its queue was not listed), or None for none."""
    if not jobs:
        return None
    next_in = None if due_ms is None else max(0, due_ms - now_ms)
    return {"jobs": jobs, "next_in_ms": next_in}


def node_row(
    member: Member, heard: Heard | None, now_ms: int, asked_ms: int | None = None
) -> dict[str, Any]:
    missing = missing_figures(member, heard, now_ms, asked_ms)
    shown = heard if missing is None else None
    return {
        "id": member.node_id,
        "addr": member.addr,
        "state": state_of(member.flags, member.link),
        "flags": list(member.flags),
        "link": member.link,
        "myself": member.link == "self",
        "last_pong": member.last_pong,
        "bus_version": member.bus_version,
        "figures": None if shown is None else figures_json(shown, now_ms),
        "figures_age_ms": None if shown is None else max(0, now_ms - shown.at_ms),
        "no_figures": missing,
    }


def ordered(members: Iterable[Member]) -> list[Member]:
    """The serving node first, then by address (a stable, readable order)."""
    return sorted(members, key=lambda m: (m.link != "self", m.addr, m.node_id))


def sum_queues(
    figures: Mapping[str, Heard], now_ms: int, limit: int = EVENT_MAX_QUEUES
) -> dict[str, Any]:
    """The union of the queues the nodes listed: per node lengths and the
    total, and the jobs waiting to be queued again (``requeue``, counted
    once per job, with the earliest due); the ``limit`` with the most jobs
    queued or waiting first (ties by name). ``omitted_jobs`` counts the
    jobs queued in queues not listed (by a node, or here), so that the
    totals and it add up to every job queued on these nodes;
    ``omitted_requeue`` likewise."""
    lengths: dict[str, dict[str, int]] = {}
    waits: dict[str, tuple[int, int]] = {}  # name -> jobs, earliest due (wall ms here)
    unlisted = unlisted_requeue = 0  # jobs of queues the nodes did not list
    for node_id, heard in figures.items():
        stats = heard.stats
        unlisted += stats.omitted_jobs
        unlisted_requeue += heard.omitted_requeue
        for q in stats.lengths:
            lengths.setdefault(q.name, {})[node_id] = q.length
        for w in heard.requeue:
            due = heard.at_ms + w.next_ms
            jobs, first = waits.get(w.name, (0, due))
            waits[w.name] = (jobs + w.jobs, min(first, due))
    names = lengths.keys() | waits.keys()
    totals = {name: sum(lengths.get(name, {}).values()) for name in names}
    ranked = sorted(names, key=lambda n: (-(totals[n] + waits.get(n, (0, 0))[0]), n))
    shown, cut = ranked[:limit], ranked[limit:]
    rows = []
    for name in shown:
        jobs, due = waits.get(name, (0, 0))
        rows.append(
            {
                "name": text_json(name),
                "total": totals[name],
                "lengths": lengths.get(name, {}),
                "requeue": requeue_json(jobs, due, now_ms),
            }
        )
    listed = sum(totals.values())
    listed_requeue = sum(jobs for jobs, _ in waits.values())
    return {
        "rows": rows,
        "nodes": sorted(figures),
        "total": listed + unlisted,
        "omitted_jobs": unlisted + sum(totals[n] for n in cut),
        "requeue": listed_requeue + unlisted_requeue,
        "omitted_requeue": unlisted_requeue + sum(waits.get(n, (0, 0))[0] for n in cut),
    }


def cluster_event(
    now_ms: int,
    members: Iterable[Member],
    heard: Mapping[str, Heard],
    asked: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The ``cluster`` event's data (docs/websocket.md): a row per node of
    the table, the queues summed over the nodes whose figures are shown,
    and cluster-wide totals of those figures. ``asked``: when each node
    was first asked (one that never answered says so after FRESH_MS)."""
    asked = asked or {}
    rows = [
        node_row(m, heard.get(m.node_id), now_ms, asked.get(m.node_id)) for m in ordered(members)
    ]
    shown = {r["id"]: heard[r["id"]] for r in rows if r["figures"] is not None}
    jobs = [r["figures"]["jobs"] for r in rows if r["figures"] is not None]
    counted = [h.jobs for h in shown.values()]
    queues = sum_queues(shown, now_ms)
    due = [r["requeue"]["next_in_ms"] for r in queues["rows"] if r["requeue"] is not None]
    first_due = now_ms + min(due) if due else None
    return {
        "time": now_ms,
        "nodes": rows,
        "queues": queues,
        "totals": {
            "nodes": len(rows),
            "failing": sum(r["state"] in ("pfail", "fail") for r in rows),
            "unreachable": sum(r["state"] == LINK_DOWN for r in rows),
            "with_figures": len(shown),
            "jobs": {k: sum(j[k] for j in jobs) for k in ("total", *_JOB_STATES)},
            # Unknown while a node with figures sent no census.
            "distinct_jobs": None if None in counted else sum(c or 0 for c in counted),
            "requeue": requeue_json(queues["requeue"], first_due, now_ms),
            "used_memory": sum(r["figures"]["used_memory"] for r in rows if r["figures"]),
        },
    }


_JOB_STATES = ("queued", "active", "acked", "wait_repl")


# ------------------------------------------------------------- job lookup


def job_copy(node: Node, request: int, job_id: str) -> bus.JobCopy:
    """This node's copy of a job as a JOBCOPY (what SHOW tells of it), or
    what it remembers of a copy deleted lately."""
    job = node.lookup(job_id)
    if job is None:
        return bus.JobCopy(request, job_id, "", _gone(node, job_id), "", 0, 0, 0, 0, ())
    now = node.now_ms()
    return bus.JobCopy(
        request,
        job_id,
        job.state.label,
        "",
        job.queue if job.body is not None else "",  # a dummy ack has no queue
        job.nacks,
        job.deliveries,
        max(0, job.qtime - now) if job.qtime and job.state != JobState.ACKED else 0,
        max(0, job.etime - now // 1000),
        tuple(job.nodes_delivered),
    )


def _gone(node: Node, job_id: str) -> str:
    if job_id not in node.deleted_ids:
        return ""
    if job_id in node.deleted_expired:
        return "expired"
    if job_id in node.deleted_moved:
        return "moved"
    return "acked" if job_id in node.deleted_acked else "deleted"


def lookup_plan(
    myself: str, local: bus.JobCopy, members: Iterable[Member]
) -> tuple[list[str], dict[str, str]]:
    """Whom to ask about a job, and why the others are not asked. The
    nodes this node's copy lists in ``nodes-delivered`` (the nodes that may
    hold one), else every node it knows. A node that cannot be asked (link
    down, older release) or is not known gets its reason at once."""
    known = {m.node_id: m for m in members}
    if local.state and local.nodes_delivered:
        candidates = list(dict.fromkeys(local.nodes_delivered))
    else:
        candidates = [n for n in known if n != myself]
    ask: list[str] = []
    reasons: dict[str, str] = {}
    for node_id in candidates:
        member = known.get(node_id)
        if node_id == myself:
            continue
        if member is None:
            reasons[node_id] = NOT_KNOWN
        elif member.link != "connected":
            reasons[node_id] = NO_LINK
        elif 0 < member.bus_version < FIGURES_SINCE:
            reasons[node_id] = OLDER
        else:
            ask.append(node_id)
    return ask, reasons


def copy_json(copy: bus.JobCopy) -> dict[str, Any]:
    if not copy.state:
        return {"status": "gone" if copy.gone else "not held", "gone": copy.gone or None}
    return {
        "status": "held",
        "state": copy.state,
        "queue": text_json(copy.queue) if copy.queue else None,
        "nacks": copy.nacks,
        "deliveries": copy.deliveries,
        "requeue_in_ms": copy.requeue_ms or None,
        "ttl": copy.ttl,
    }


def lookup_result(
    job_id: str,
    members: Iterable[Member],
    outcomes: Mapping[str, bus.JobCopy | str],
) -> dict[str, Any]:
    """The answer to a job lookup: a row per node asked or named as a
    holder, with its copy or why there is none (the serving node first)."""
    known = {m.node_id: m for m in members}
    order = [m.node_id for m in ordered(known.values()) if m.node_id in outcomes]
    order += sorted(n for n in outcomes if n not in known)
    copies = []
    for node_id in order:
        member = known.get(node_id)
        outcome = outcomes[node_id]
        row: dict[str, Any] = {
            "node": node_id,
            "addr": member.addr if member else None,
            "node_state": state_of(member.flags, member.link) if member else None,
            "myself": member is not None and member.link == "self",
        }
        if isinstance(outcome, str):
            row.update(status=outcome)
        else:
            row.update(copy_json(outcome))
        copies.append(row)
    return {
        "id": job_id,
        "copies": copies,
        "held": sum(c["status"] == "held" for c in copies),
    }
