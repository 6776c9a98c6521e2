"""A named queue: the jobs of one name that this node may deliver.

Jobs are ordered by creation time (``ctime``: best-effort FIFO across
nodes; equal times, rare since ctime carries a per-node counter, in the
order they were queued). The order is kept in a ``SortedKeyList`` of the
jobs themselves keyed by ``ctime``: comparisons stay in C (ints, through
``attrgetter``), and each entry costs two pointers where a ``(ctime, id)``
tuple per job cost 56 bytes more (RSS per queued job 628 -> ~580 B). A job's
ctime never changes while it is queued. Blocked GETJOB clients wait on the
queue in arrival order (first come, first served).
"""

from __future__ import annotations

import enum
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedKeyList

if TYPE_CHECKING:
    from .job import Job
    from .waiters import Waiter


_BY_CTIME = attrgetter("ctime")


class Pause(enum.IntFlag):
    NONE = 0
    IN = 1  # refuse new jobs (ADDJOB -PAUSED, no replication or ENQUEUE from peers)
    OUT = 2  # deliver nothing (GETJOB blocks, no jobs given to other nodes)
    ALL = 3

    @property
    def label(self) -> str:
        return _PAUSE_LABELS[self]


_PAUSE_LABELS = {Pause.NONE: "none", Pause.IN: "in", Pause.OUT: "out", Pause.ALL: "all"}

# The same flags as plain ints: ``Queue.pause`` holds an int because IntFlag's
# ``&`` runs Python code, and ADDJOB, GETJOB and enqueue all test it.
PAUSED_IN = 1
PAUSED_OUT = 2

# A queue that saw no activity for this long, has no jobs, no waiters and no
# pause flags, is dropped from memory; it is recreated on demand.
QUEUE_MAX_IDLE_SECONDS = 300


class Queue:
    __slots__ = (
        "atime",
        "awake",
        "ctime",
        "id",
        "import_current_count",
        "import_current_ms",
        "import_prev_count",
        "import_prev_ms",
        "jobs",
        "jobs_in",
        "jobs_out",
        "name",
        "needjobs_adhoc_attempt",
        "needjobs_adhoc_ms",
        "needjobs_bcast_attempt",
        "needjobs_bcast_ms",
        "needjobs_bcast_seq",
        "needjobs_responders",
        "needjobs_told",
        "pause",
        "waiters",
        "wake_pending",
    )

    def __init__(self, name: str, now_ms: int) -> None:
        self.name = name
        # The awake index holds queues too (idle eviction): its key must never
        # collide with a job ID, which always starts with "D-".
        self.id = "\x00" + name
        self.awake = 0  # when the idle-eviction timer looks at it, ms; 0 = not indexed
        self.jobs: SortedKeyList = SortedKeyList(key=_BY_CTIME)
        # Blocked GETJOB clients, oldest first. A dict used as an ordered set:
        # removal of a client that timed out is O(1).
        self.waiters: dict[Waiter, None] = {}
        # A WakeQueue effect is out and its delivery has not run yet.
        self.wake_pending = False
        self.pause = 0  # PAUSED_IN | PAUSED_OUT bits; Pause(q.pause) to name it
        self.ctime = now_ms // 1000  # unix seconds, like QSTAT reports
        self.atime = now_ms // 1000  # last access, for idle eviction
        self.jobs_in = 0
        self.jobs_out = 0
        # Federation pacing (cluster): when NEEDJOBS was last sent and how
        # many times in a row, and which nodes answered recently (id -> ms).
        self.needjobs_bcast_ms = 0
        self.needjobs_bcast_attempt = 0
        self.needjobs_adhoc_ms = 0
        self.needjobs_adhoc_attempt = 0
        self.needjobs_responders: dict[str, int] = {}
        # The node's link_seq at the last broadcast, and the peers that
        # linked since and were asked on their own (clusterjobs.need_jobs):
        # node id -> the link_seq of that link.
        self.needjobs_bcast_seq = 0
        self.needjobs_told: dict[str, int] = {}
        # Import rate estimate: jobs received from other nodes in the current
        # and the previous window of about one second.
        self.import_current_ms = now_ms
        self.import_current_count = 0
        self.import_prev_ms = now_ms
        self.import_prev_count = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def push(self, job: Job) -> None:
        self.jobs.add(job)

    def remove(self, job: Job) -> None:
        self.jobs.discard(job)

    def pop_oldest(self) -> str | None:
        """Remove and return the ID of the job with the lowest ctime."""
        if not self.jobs:
            return None
        return self.jobs.pop(0).id  # type: ignore[no-any-return]

    def peek_ids(self, count: int, newest_first: bool) -> list[str]:
        if newest_first:
            n = len(self.jobs)
            return [job.id for job in self.jobs.islice(max(0, n - count), n, reverse=True)]
        return [job.id for job in self.jobs.islice(0, count)]

    def import_rate(self, now_ms: int) -> int:
        """Jobs per second received from other nodes, a rough estimate."""
        if now_ms - self.import_current_ms > 5000:
            return 0
        elapsed = max(now_ms - self.import_prev_ms, 50)
        total = self.import_prev_count + self.import_current_count
        return -(-total * 1000 // elapsed)  # ceiling division

    def count_import(self, now_ms: int) -> None:
        if now_ms - self.import_current_ms > 1000:
            self.import_prev_ms = self.import_current_ms
            self.import_prev_count = self.import_current_count
            self.import_current_ms = now_ms
            self.import_current_count = 0
        self.import_current_count += 1

    def stat(self, now_ms: int) -> dict[str, Any]:
        """What QSTAT reports (its keys and order); the dashboard and the
        metrics read the same figures."""
        now_s = now_ms // 1000
        return {
            "name": self.name,
            "len": len(self.jobs),
            "age": max(0, now_s - self.ctime),
            "idle": max(0, now_s - self.atime),
            "blocked": len(self.waiters),
            "import-from": sorted(self.needjobs_responders),
            "import-rate": self.import_rate(now_ms),
            "jobs-in": self.jobs_in,
            "jobs-out": self.jobs_out,
            "pause": Pause(self.pause).label,
        }

    def is_collectable(self, now_s: int, max_idle: int) -> bool:
        return (
            now_s - self.atime >= max_idle
            and not self.waiters
            and not self.jobs
            and not self.pause
        )
