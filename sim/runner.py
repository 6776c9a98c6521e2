"""Run a plan in a World and judge it: the black-box checkers over the
history, the World's white-box checks, and the end-of-run liveness checks."""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import attrs

from disque_trio.core.clusterjobs import REFUSED_BUS_VERSION
from disque_trio.core.job import JobState

from . import buggify
from .checkers import (
    Crashes,
    Report,
    check,
    check_acked,
    check_answered,
    check_delay_ends,
    check_delay_holds,
    check_failover_holds,
    check_nack,
    check_requeue,
    check_retry0_refused,
    check_waitjob,
    check_working,
)
from .observing import Observing
from .plan import Plan
from .workload import Workload
from .world import StormError, World


@attrs.define
class Outcome:
    plan: Plan
    world: World
    workload: Workload
    report: Report
    violations: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def speed(self) -> float:
        """Simulated seconds per wall second."""
        return self.world.virtual_seconds / max(1e-9, self.world.wall_seconds)


def before_refused(plan: Plan) -> frozenset[int]:
    """The node playing a release before REFUSED (bus protocol 6), if any:
    it reads a refused ADDJOB's DELJOB as an ack (check_waitjob)."""
    old = plan.old_version
    if old is None or old[1] >= REFUSED_BUS_VERSION:
        return frozenset()
    return frozenset({old[0]})


def allowance_s(world: World) -> float:
    """How far two nodes' wall clocks may disagree in this run, plus the
    timers' one-second granularity and network latency."""
    plan = world.plan
    drift = 2 * plan.drift_ppm / 1_000_000 * max(60.0, world.virtual_seconds)
    return 2 * plan.skew_ms / 1000 + drift + world.jumps_ms / 1000 + 0.5 + plan.latency_ms / 500


def end_checks(world: World, workload: Workload) -> list[str]:
    """Liveness after heal and settle, and replicated-before-ok."""
    out: list[str] = []
    # A job delivered (and acked) before its ADDJOB answered is answered OK
    # whatever its copies: the ack it got proves it existed.
    got_at: dict[str, float] = {}
    for e in workload.history:
        if e.op == "get":
            got_at.setdefault(e.data["id"], e.t)
    for e in workload.history:
        data = e.data
        if e.op == "add" and data["ok"] and data["retry"] > 0 and not data.get("async"):
            job_id = data["reply"]
            if got_at.get(job_id, e.t + 1) <= e.t:
                continue
            want = data["copies"]
            regs = world.registered_at.get(job_id, {})
            early = [n for n, t in regs.items() if t <= e.t]
            # A node that confirmed a copy, then lost it in a crash (a wiped
            # disk, unsynced writes) and took a new copy before the OK held
            # two: one per incarnation (seed 20005351: the first confirmed,
            # the wiped restart confirmed again).
            again = [n for n in early if world.amnesia_at.get((job_id, n), math.inf) <= e.t]
            if len(early) + len(again) < want:
                out.append(f"replicated-before-ok: {job_id} OK with {len(early)} holders < {want}")
    acked_ok = {
        e.data["id"]
        for e in workload.history
        if e.op == "ack"
        and not e.data["reply"].startswith(("ERR", "conn", "NOJOB", "MISCONF"))
        and not e.data.get("noop")
    }
    for n in world.nodes:
        for job in n.server.node.jobs.values():
            if job.id in world.ever_reloaded or job.id in world.acks_lost:
                continue  # an ack lost with unsynced AOF writes: legal
            if job.id in acked_ok:
                out.append(
                    f"acked-collected: {n.name} still holds acked {job.id} "
                    f"({job.state.name}) after settling"
                )
            elif job.state == JobState.ACKED:
                out.append(f"acked-collected: {n.name} still holds ack {job.id} after settling")
    out += [f"converged: {p}" for p in workload.converged]
    return out


# The cycle collector's first threshold during a run (CPython's default is
# 700): a run allocates millions of short-lived objects (frames, messages,
# events), nearly none in cycles, and the default collects every 700 net
# allocations. The node does the same at start-up (disque_trio/cli.py).
RUN_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def _collector_tuned() -> Iterator[None]:
    """Collect less often during the run; the process's thresholds after."""
    saved = gc.get_threshold()
    gc.set_threshold(RUN_GC_THRESHOLD, *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def execute(plan: Plan, world_cls: type[World] = World, **config: Any) -> Outcome:
    world = world_cls(plan, **config)
    Observing(world)  # what users observe (sim/observing.py)
    buggify.install(world)  # the plan's BUGGIFY knobs
    workload = Workload(plan)
    started = time.perf_counter()
    try:
        with _collector_tuned():
            world.run(workload)
    except* StormError:
        pass  # recorded in world.violations; the history so far is checked
    world.wall_seconds = time.perf_counter() - started
    crashes = Crashes(
        world.appendfsync, world.holders, world.amnesia, world.held_back, world.delivered_at
    )
    report = check(workload.history, workload.drained, crashes, allowance_s(world))
    requeue, excused = check_requeue(workload.history, allowance_s(world), crashes)
    report.excused += excused
    timing = (
        requeue
        + check_nack(workload.history, world.calm, world.queued_at)
        + check_working(workload.history, world.calm, world.queued_at)
        + check_failover_holds(
            workload.history, world.calm_but_crash, world.queued_at, world.retry_points
        )
        + check_acked(workload.history, world.calm)
        + check_answered(workload.history)
        + check_delay_holds(workload.history, world.calm, allowance_s(world), world.delivered_at)
        + check_delay_ends(
            workload.history, world.calm, allowance_s(world), world.queued_at, crashes
        )
        + check_retry0_refused(workload.history)
        + check_waitjob(
            workload.history,
            world.calm,
            allowance_s(world),
            2 * plan.latency_ms / 1000,
            before_refused(plan),
        )
    )
    violations = report.violations + world.violations + end_checks(world, workload) + timing
    return Outcome(plan, world, workload, report, violations)
