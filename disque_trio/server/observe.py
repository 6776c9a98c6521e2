"""What the web side shows of a node: the stats and nodes snapshots that the
WebSocket streams, and the figures /metrics exports.

Everything here reads the node and changes nothing. The one costly figure is
the count of jobs by state (the core keeps no such counters: a job's state
is set in many places), so it is a census over every job, cached for a time
that grows with the number of jobs: at a million jobs a census costs tens of
milliseconds of the event loop, taken once every few seconds at most.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.cluster import FAIL, PFAIL
from ..core.job import JobState
from ..protocol.wsjson import text_json

if TYPE_CHECKING:
    from ..core.queue import Queue
    from .host import ServerHost

# A census is reused for 1 s plus 1 s per 250,000 jobs.
CENSUS_MIN_AGE_MS = 1000
CENSUS_JOBS_PER_S = 250_000
# The stats event lists at most this many queues (the longest ones); a node
# with more queues than a page can show still sends a bounded message.
STATS_MAX_QUEUES = 1000

_STATE_KEYS = {
    JobState.WAIT_REPL: "wait_repl",
    JobState.ACTIVE: "active",
    JobState.QUEUED: "queued",
    JobState.ACKED: "acked",
}
STATE_NAMES = tuple(_STATE_KEYS.values())
# CLUSTER NODES says "fail?"; JSON readers get a name without punctuation.
_FLAG_JSON = {"fail?": "pfail"}


class NodeView:
    """Snapshots of one node for the dashboard and the metrics endpoint."""

    def __init__(self, server: ServerHost) -> None:
        self.server = server
        self._census: dict[str, int] = dict.fromkeys(STATE_NAMES, 0)
        self._census_ms: int | None = None

    def job_counts(self) -> dict[str, int]:
        """Jobs held by state (``total`` too), from a recent census."""
        node = self.server.node
        now = self.server.env.clock.wall_ms()
        max_age = CENSUS_MIN_AGE_MS + len(node.jobs) * 1000 // CENSUS_JOBS_PER_S
        if self._census_ms is None or not 0 <= now - self._census_ms < max_age:
            counts = dict.fromkeys(STATE_NAMES, 0)
            by_state = dict.fromkeys(JobState, 0)
            for job in node.jobs.values():
                by_state[job.state] += 1
            for state, n in by_state.items():
                counts[_STATE_KEYS[state]] = n
            self._census, self._census_ms = counts, now
        return {"total": sum(self._census.values()), **self._census}

    def queue_row(self, q: Queue, now_ms: int) -> dict[str, Any]:
        """One queue as QSTAT describes it, with JSON-friendly keys."""
        row = q.stat(now_ms)
        del row["import-from"]
        row["name"] = text_json(q.name)
        return {key.replace("-", "_"): value for key, value in row.items()}

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
        return {
            "time": now,
            "node_id": server.node.node_id,
            "uptime": server.uptime_s(),
            "clients": len(server.clients),
            "blocked_clients": server.node.stats.blocked_clients,
            "used_memory": server.used_memory(),
            "jobs": self.job_counts(),
            "queues": [self.queue_row(q, now) for q in self.queues(STATS_MAX_QUEUES)],
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
