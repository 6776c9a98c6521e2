"""GET /metrics: the node's figures in Prometheus' text exposition format 0.0.4.

Every family has HELP and TYPE lines and a name starting with ``disque_``;
counters end in ``_total``. Per-queue families carry a ``queue`` label, bus
message counters a ``type`` label (the message name: ping, repljob, ...).

The cost of a scrape is bounded whatever the number of queues: per-queue
series are emitted for ``metrics-max-queues`` queues at most, the longest
ones, and the others are only counted (``disque_queues``,
``disque_metrics_queues_omitted``, ``disque_metrics_queues_omitted_jobs``).
Choosing them looks at every queue, in chunks with a checkpoint between
two, and so does building the rows: other clients wait for one chunk at
most, not for the whole page (50,000 queues once made a 12 MB page that held
the event loop for up to 2 s).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from .observe import NodeView

if TYPE_CHECKING:
    from ..core.queue import Queue
    from .host import ServerHost

# Queues looked at (choosing) and rows built between two checkpoints.
CHOOSE_CHUNK = 2000
ROWS_CHUNK = 200
SAMPLES_CHUNK = 1000  # sample lines written between two checkpoints

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[dict[str, str], float]


class Exposition:
    """Families of samples, rendered as exposition text."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def add(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        self.family(name, kind, help_text)
        self.samples(name, samples)

    def family(self, name: str, kind: str, help_text: str) -> None:
        """A family's HELP and TYPE lines; its samples must follow."""
        self._lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} {kind}")

    def samples(self, name: str, samples: Iterable[Sample]) -> None:
        for labels, value in samples:
            self._lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.add(name, kind, help_text, [({}, value)])

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


async def render(server: ServerHost, view: NodeView) -> str:
    out = Exposition()
    _jobs(out, server, view)
    await _queues(out, server, view)
    _clients(out, server)
    _pubsub(out, server)
    _cluster(out, server, view)
    _persistence(out, server)
    return out.text()


def _jobs(out: Exposition, server: ServerHost, view: NodeView) -> None:
    counts = view.job_counts()
    out.add(
        "disque_jobs",
        "gauge",
        "Jobs held by this node, by state.",
        [({"state": s}, n) for s, n in counts.items() if s != "total"],
    )
    st = server.node.stats
    out.one("disque_jobs_added_total", "counter", "Jobs created by ADDJOB here.", st.added_jobs)
    out.one(
        "disque_jobs_delivered_total",
        "counter",
        "Jobs handed to GETJOB clients.",
        st.delivered_jobs,
    )
    out.one("disque_jobs_acked_total", "counter", "Jobs acknowledged here.", st.acked_jobs)
    out.one(
        "disque_jobs_expired_total",
        "counter",
        "Jobs dropped when their TTL ran out.",
        st.expired_jobs,
    )
    out.one(
        "disque_replication_failures_total",
        "counter",
        "ADDJOBs answered NOREPL (too few nodes reachable, timeout, or expiry).",
        st.replication_failures,
    )


def longest_queues(queues: Iterable[Queue], limit: int) -> list[Queue]:
    """The ``limit`` longest queues (jobs waiting), ties by name."""
    return heapq.nsmallest(limit, queues, key=lambda q: (-len(q), q.name))


async def choose_queues(queues: list[Queue], limit: int) -> tuple[list[Queue], int]:
    """(the ``limit`` longest queues sorted by name, jobs waiting in the
    others), looking at CHOOSE_CHUNK queues between two checkpoints."""
    if len(queues) <= limit:
        return sorted(queues, key=lambda q: q.name), 0
    chosen: list[Queue] = []
    waiting = 0
    for start in range(0, len(queues), CHOOSE_CHUNK):
        chunk = queues[start : start + CHOOSE_CHUNK]
        waiting += sum(len(q) for q in chunk)
        chosen = longest_queues(chosen + chunk, limit)
        await trio.lowlevel.checkpoint()
    chosen.sort(key=lambda q: q.name)
    return chosen, waiting - sum(len(q) for q in chosen)


async def _queues(out: Exposition, server: ServerHost, view: NodeView) -> None:
    now = server.env.clock.wall_ms()
    queues = list(server.node.queues.values())
    chosen, omitted_jobs = await choose_queues(queues, server.config.metrics_max_queues)
    out.one("disque_queues", "gauge", "Queues on this node.", len(queues))
    out.one(
        "disque_metrics_queues_omitted",
        "gauge",
        "Queues without per-queue series here: the shortest ones, beyond metrics-max-queues.",
        len(queues) - len(chosen),
    )
    out.one(
        "disque_metrics_queues_omitted_jobs",
        "gauge",
        "Jobs waiting in the queues without per-queue series.",
        omitted_jobs,
    )
    rows = []
    for i, q in enumerate(chosen):
        rows.append((_label_text(q.name), view.queue_row(q, now)))
        if i % ROWS_CHUNK == ROWS_CHUNK - 1:
            await trio.lowlevel.checkpoint()
    for name, kind, key, help_text in (
        ("disque_queue_length", "gauge", "len", "Jobs waiting in the queue."),
        ("disque_queue_jobs_in_total", "counter", "jobs_in", "Jobs ever queued."),
        ("disque_queue_jobs_out_total", "counter", "jobs_out", "Jobs ever delivered."),
        (
            "disque_queue_import_rate",
            "gauge",
            "import_rate",
            "Jobs per second imported from other nodes.",
        ),
        ("disque_queue_blocked_clients", "gauge", "blocked", "Clients blocked in GETJOB on it."),
    ):
        out.family(name, kind, help_text)
        for start in range(0, len(rows), SAMPLES_CHUNK):
            part = rows[start : start + SAMPLES_CHUNK]
            out.samples(name, [({"queue": q}, row[key]) for q, row in part])
            await trio.lowlevel.checkpoint()


def _clients(out: Exposition, server: ServerHost) -> None:
    out.one(
        "disque_clients_connected",
        "gauge",
        "Clients connected (RESP and WebSocket).",
        len(server.clients),
    )
    out.one(
        "disque_web_connections",
        "gauge",
        "HTTP connections open on the web port, this scrape's included "
        "(WebSocket sessions are clients).",
        server.web_connections,
    )
    out.one(
        "disque_blocked_clients",
        "gauge",
        "Commands blocked in GETJOB or WAITJOB right now.",
        server.node.stats.blocked_clients,
    )
    out.one(
        "disque_commands_processed_total", "counter", "Commands executed.", server.stat_commands
    )
    out.one(
        "disque_connections_received_total",
        "counter",
        "Client connections accepted.",
        server.stat_connections,
    )
    out.one("disque_memory_used_bytes", "gauge", "Memory used (estimate).", server.used_memory())
    out.one(
        "disque_memory_max_bytes",
        "gauge",
        "maxmemory: at 75 % of it no new local copies, at 95 % evictions, at 100 % -OOM.",
        server.config.maxmemory,
    )
    out.one("disque_uptime_seconds", "gauge", "Seconds since the node started.", server.uptime_s())


def _pubsub(out: Exposition, server: ServerHost) -> None:
    hub = server.pubsub
    out.one(
        "disque_pubsub_channels", "gauge", "Channels with a subscriber here.", len(hub.channels)
    )
    out.one(
        "disque_pubsub_patterns", "gauge", "Patterns with a subscriber here.", len(hub.patterns)
    )
    out.one(
        "disque_pubsub_subscribers",
        "gauge",
        "Clients here with a channel or pattern subscribed.",
        hub.subscribed_clients(),
    )
    out.one(
        "disque_pubsub_buffered_bytes",
        "gauge",
        "Messages and replies waiting to be written to subscribers here.",
        hub.buffered(),
    )
    out.add(
        "disque_pubsub_messages_total",
        "counter",
        "Pub/sub messages: published by clients here, received from other "
        "nodes, delivered to subscribers here.",
        [
            ({"way": "published"}, hub.published),
            ({"way": "received"}, hub.received),
            ({"way": "delivered"}, hub.delivered),
        ],
    )
    out.one(
        "disque_pubsub_dropped_clients_total",
        "counter",
        "Subscribers disconnected over pubsub-output-buffer-limit.",
        hub.dropped_clients,
    )


def _cluster(out: Exposition, server: ServerHost, view: NodeView) -> None:
    bus = server.bus
    for name, counts, help_text in (
        (
            "disque_bus_messages_sent_total",
            bus.sent_by_type,
            "Bus messages written or queued to peers.",
        ),
        (
            "disque_bus_messages_received_total",
            bus.received_by_type,
            "Bus messages received from peers.",
        ),
    ):
        samples = sorted((cls.__name__.lower(), n) for cls, n in counts.items())
        out.add(name, "counter", help_text, [({"type": t}, n) for t, n in samples])
    out.one(
        "disque_bus_messages_dropped_total",
        "counter",
        "Bus messages dropped: a peer's outbox was full, or newer heartbeats replaced them.",
        bus.dropped_messages(),
    )
    cluster = server.node.cluster
    out.one(
        "disque_cluster_nodes_known",
        "gauge",
        "Nodes known, this one included.",
        len(cluster.nodes),
    )
    out.one(
        "disque_cluster_nodes_failing",
        "gauge",
        "Nodes flagged PFAIL or FAIL.",
        view.failing_nodes(),
    )


def _persistence(out: Exposition, server: ServerHost) -> None:
    aof = server.aof
    out.one(
        "disque_aof_enabled", "gauge", "1 when the append-only file is on.", aof.state != "off"
    )
    out.one("disque_aof_size_bytes", "gauge", "Size of the append-only file.", aof.current_size)
    out.one(
        "disque_aof_rewrite_in_progress", "gauge", "1 while the AOF is rewritten.", aof.rewriting
    )
    out.one("disque_loading", "gauge", "1 while the AOF is loaded at start-up.", aof.loading)
    out.one(
        "disque_aof_write_ok",
        "gauge",
        "0 while AOF writes fail (a full disk): write commands get MISCONF; else 1.",
        not aof.failing,
    )
    out.one(
        "disque_aof_write_errors_total",
        "counter",
        "AOF writes and fsyncs that failed (each retry counts).",
        aof.write_failures,
    )


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(name: str) -> str:
    """A queue name as valid UTF-8 (names may hold arbitrary bytes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
