"""Rules of the job protocol that hold at every step, asserted as the node
runs (the way FoundationDB and Antithesis assert "always" properties in
the code under test).

Each rule comes from the rule lists of core/clusterjobs.py and
core/node.py; ``RULES`` names them. The simulator (sim/world.py) checks
them: ``on_event`` on every job event a node reports to its observers
(``Node._notify``: registered, queued, delivered, acked, deleted,
ack-collected...), ``check_node`` over a node's whole state at each of its
monitor's samples, and ``ENABLED`` turns on the one check written inline,
at the end of an AOF load (core/records.replay). Outside the simulator a
node has no observers and ``ENABLED`` stays False: nothing runs.

A broken rule is reported to ``REPORT`` (the simulator's violation list),
never raised: the node goes on, the run ends with the violation named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .host import JobHost
from .job import FLAG_DELIVERED, STATE_ACKED, STATE_QUEUED, Job

# What each rule guards, and where it comes from.
RULES = {
    "always-collect-after-confirms": (
        "GOTACK rule: an acked job is collected (DELJOB to its holders, deleted) "
        "only once every holder it knows of confirmed the ack"
    ),
    "always-no-queue-over-tombstone": (
        "DELJOB rule: a node never queues a job whose acked tombstone it holds "
        "(the job is done for good)"
    ),
    "always-retry0-undelivered": (
        "ENQUEUE/NACK/YOURJOBS and a reload: a RETRY 0 job is queued only if "
        "never delivered (at most once)"
    ),
    "always-acked-indexed": (
        "SETACK/ACKJOB: a held job is in the node's acked set exactly when it is acked"
    ),
    "always-queued-in-queue": "a job is QUEUED exactly when it sits in its queue",
    "always-load-acked-as-aof": (
        "after an AOF load, the acked jobs in memory are those the file's last "
        "record of each says acked (an ACKJOB, or a LOADJOB in state acked)"
    ),
}

ENABLED = False
REPORT: Callable[[str], None] | None = None


def enable(report: Callable[[str], None]) -> None:
    global ENABLED, REPORT
    ENABLED, REPORT = True, report


def disable() -> None:
    global ENABLED, REPORT
    ENABLED, REPORT = False, None


def _broken(rule: str, text: str) -> None:
    assert rule in RULES
    if REPORT is not None:
        REPORT(f"{rule}: {text}")


def on_event(node: JobHost, name: str, event: str, job: Job) -> None:
    """The rules a job event can break, checked as it happens."""
    if event == "queued":
        if job.id in node.deleted_acked:
            _broken(
                "always-no-queue-over-tombstone",
                f"{name} queued {job.id}, whose acked tombstone it holds",
            )
        if job.retry == 0 and job.flags & FLAG_DELIVERED:
            _broken("always-retry0-undelivered", f"{name} queued RETRY 0 {job.id} once delivered")
    elif event == "ack-collected":
        confirmed = set(job.nodes_confirmed or ())
        missing = [n[:8] for n in job.nodes_delivered if n not in confirmed]
        if missing:
            _broken(
                "always-collect-after-confirms",
                f"{name} collected {job.id} before {', '.join(missing)} confirmed",
            )
    elif event in ("acked", "registered"):
        held = node.jobs.get(job.id) is job
        if held and (job.id in node.acked_jobs) != (job.state == STATE_ACKED):
            _broken(
                "always-acked-indexed",
                f"{name} {job.id} {job.state.name}, "
                f"{'in' if job.id in node.acked_jobs else 'not in'} the acked set",
            )


def check_node(node: JobHost, name: str) -> None:
    """The rules over a node's whole state (the simulator's monitor runs
    this at each sample)."""
    members = {q: {id(j) for j in queue.jobs} for q, queue in node.queues.items()}
    for job in node.jobs.values():
        if (job.id in node.acked_jobs) != (job.state == STATE_ACKED):
            _broken(
                "always-acked-indexed",
                f"{name} {job.id} {job.state.name}, "
                f"{'in' if job.id in node.acked_jobs else 'not in'} the acked set",
            )
        if (job.state == STATE_QUEUED) != (id(job) in members.get(job.queue, ())):
            _broken("always-queued-in-queue", f"{name} {job.id} {job.state.name}")
    for job_id in node.acked_jobs:
        if job_id not in node.jobs:
            _broken("always-acked-indexed", f"{name} lists {job_id} as acked, holds no such job")


def after_load(node: JobHost, acked_in_file: Iterable[str]) -> None:
    """always-load-acked-as-aof, at the end of core/records.replay."""
    expected = {job_id for job_id in acked_in_file if job_id in node.jobs}
    held = {job.id for job in node.jobs.values() if job.state == STATE_ACKED}
    if held != expected:
        extra, lost = sorted(held - expected)[:3], sorted(expected - held)[:3]
        _broken(
            "always-load-acked-as-aof",
            f"acked after the load {len(held)}, the file says {len(expected)} "
            f"(not in the file: {extra}; not in memory: {lost})",
        )
