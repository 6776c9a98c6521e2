"""What the web side shows of a node: the stats and nodes snapshots that the
WebSocket streams, and the figures /metrics exports.

Everything here reads the node and changes nothing. The costly figures
come from looking at every job (the core keeps no such counters: a job's
state is set in many places): the count of jobs by state, for /metrics,
and the dashboard's census (jobcensus.py: by state too, the jobs this
node counts for the cluster, the jobs waiting to be queued again). Each is
reused for a time that grows with the number of jobs, so that its share of
the event loop stays small: at a million jobs the count by state takes
about 60 ms and is reused for 5 s, the census 300 ms (a quarter of the
jobs waiting, ``bench/bench_census.py`` on a loaded 2-core VM), reused for
11 s. A fresh census serves the count by state too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.cluster import FAIL, PFAIL
from ..protocol.wsjson import text_json
from . import jobcensus
from .jobcensus import Census, Requeue
from .version import PACKAGE_VERSION, commit

if TYPE_CHECKING:
    from ..core.queue import Queue
    from .host import ServerHost

# The count by state is reused for 1 s plus 1 s per 250,000 jobs, the
# dashboard's census (about 5 times as costly) for 1 s plus 1 s per 100,000.
CENSUS_MIN_AGE_MS = 1000
CENSUS_JOBS_PER_S = 250_000
FULL_CENSUS_JOBS_PER_S = 100_000
# The stats event lists at most this many queues (the longest ones); a node
# with more queues than a page can show still sends a bounded message.
STATS_MAX_QUEUES = 1000
# CLUSTER NODES says "fail?"; JSON readers get a name without punctuation.
_FLAG_JSON = {"fail?": "pfail"}


class NodeView:
    """Snapshots of one node for the dashboard and the metrics endpoint."""

    def __init__(self, server: ServerHost) -> None:
        self.server = server
        self._census: Census | None = None
        self._census_ms = 0
        self._states: dict[str, int] = {}
        self._states_ms: int | None = None

    def _fresh(self, since_ms: int | None, jobs_per_s: int) -> bool:
        if since_ms is None:
            return False
        age = self.server.env.clock.wall_ms() - since_ms
        held = len(self.server.node.jobs)
        return 0 <= age < CENSUS_MIN_AGE_MS + held * 1000 // jobs_per_s

    def census(self) -> Census:
        """A recent census of the node's jobs (jobcensus.py), for the
        dashboard."""
        if self._census is None or not self._fresh(self._census_ms, FULL_CENSUS_JOBS_PER_S):
            node = self.server.node
            self._census = jobcensus.take(node, jobcensus.can_answer(node))
            self._census_ms = self.server.env.clock.wall_ms()
        return self._census

    def job_counts(self) -> dict[str, int]:
        """Jobs held by state (``total`` too): from the census while it is
        fresh (someone watches the dashboard), else from a recent count."""
        if self._census is not None and self._fresh(self._census_ms, FULL_CENSUS_JOBS_PER_S):
            states = self._census.states
        else:
            if not self._fresh(self._states_ms, CENSUS_JOBS_PER_S):
                by_state = [0, 0, 0, 0]  # indexed by JobState (an IntEnum)
                for job in self.server.node.jobs.values():
                    by_state[job.state] += 1
                self._states = jobcensus.states_json(by_state)
                self._states_ms = self.server.env.clock.wall_ms()
            states = self._states
        return {"total": sum(states.values()), **states}

    def queue_row(self, q: Queue, now_ms: int, requeue: Requeue | None = None) -> dict[str, Any]:
        """One queue as QSTAT describes it, with JSON-friendly keys, and
        the copies of its jobs that wait here to be queued again."""
        row = q.stat(now_ms)
        del row["import-from"]
        row["name"] = text_json(q.name)
        row = {key.replace("-", "_"): value for key, value in row.items()}
        row["requeue"] = requeue_json(requeue, now_ms)
        return row

    def queue_rows(self, now_ms: int, limit: int = STATS_MAX_QUEUES) -> list[dict[str, Any]]:
        """The ``stats`` event's queues, by name: the node's ``limit``
        longest, and while there is room, the queues this node has no queue
        of but holds jobs of that wait here to be queued again (a consumer
        of another node has them, or their queue here was collected), those
        with the most such jobs. Those rows have no age or idle time."""
        waiting = self.census().mine
        named = [
            (q.name, self.queue_row(q, now_ms, waiting.get(q.name))) for q in self.queues(limit)
        ]
        room = limit - len(named)
        if room > 0:
            have = self.server.node.queues
            others = {name: r for name, r in waiting.items() if name not in have}
            named += [
                (name, _held_only_row(name, requeue, now_ms))
                for name, requeue in jobcensus.longest(others, room)
            ]
            named.sort(key=lambda item: item[0])
        return [row for _, row in named]

    def queues(self, limit: int | None = None) -> list[Queue]:
        """The node's queues by name; with a limit, the longest ones."""
        queues = list(self.server.node.queues.values())
        if limit is not None and len(queues) > limit:
            queues.sort(key=lambda q: -len(q.jobs))
            del queues[limit:]
        queues.sort(key=lambda q: q.name)
        return queues

    def stats(self) -> dict[str, Any]:
        """The ``stats`` event's data (shape documented in docs/websocket.md)."""
        server = self.server
        now = server.node.now_ms()  # the node's time: queue figures are kept in it
        aof = server.aof
        census = self.census()
        return {
            "time": now,
            "node_id": server.node.node_id,
            "release": PACKAGE_VERSION,
            "commit": commit(),
            "uptime": server.uptime_s(),
            "clients": len(server.clients),
            "blocked_clients": server.node.stats.blocked_clients,
            "used_memory": server.used_memory(),
            "jobs": {"total": census.total, **census.states},
            "queues": self.queue_rows(now),
            "ops_per_sec": server.ops_per_sec(),
            "aof": {"enabled": aof.state != "off", "size": aof.current_size},
        }

    def nodes(self) -> list[dict[str, Any]]:
        """The ``nodes`` event's data: what CLUSTER NODES shows, as objects."""
        rows = []
        for peer in self.server.node.cluster.nodes.values():
            names = peer.flag_names()
            flags = [] if names == "noflags" else names.split(",")
            if peer is self.server.node.cluster.myself:
                link = "self"
            else:
                link = "connected" if peer.link_up else "disconnected"
            rows.append(
                {
                    "id": peer.node_id,
                    "addr": f"{peer.ip}:{peer.port}",
                    "flags": [_FLAG_JSON.get(f, f) for f in flags],
                    "link": link,
                    "last_ping": peer.ping_sent,
                    "last_pong": peer.pong_received,
                }
            )
        return rows

    def failing_nodes(self) -> int:
        return sum(1 for n in self.server.node.cluster.nodes.values() if n.flags & (PFAIL | FAIL))


def requeue_json(requeue: Requeue | None, now_ms: int) -> dict[str, int] | None:
    """Jobs waiting to be queued again, and in how long the first is
    (0: due now); None when there are none."""
    if requeue is None or not requeue.jobs:
        return None
    return {"jobs": requeue.jobs, "next_in_ms": max(0, requeue.next_ms - now_ms)}


def _held_only_row(name: str, requeue: Requeue, now_ms: int) -> dict[str, Any]:
    """A ``stats`` queue row for jobs held here of a queue this node has
    not (or no longer): nothing queued, nothing measured."""
    return {
        "name": text_json(name),
        "len": 0,
        "age": None,
        "idle": None,
        "blocked": 0,
        "import_rate": 0,
        "jobs_in": 0,
        "jobs_out": 0,
        "pause": "none",
        "requeue": requeue_json(requeue, now_ms),
    }
