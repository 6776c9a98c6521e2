"""BUGGIFY-style knobs (issue #45): a share of plans stretch the narrow
windows where a bug would need a race, as FoundationDB's BUGGIFY does.

* ``crash_after_ack``: a node that has just acked a job (its ACKJOB record
  written, the GOTACKs and so its DELJOB record still to come) crashes at
  once, and restarts after a moment: the window between the two records.
* ``slow_yourjobs``: YOURJOBS (a NEEDJOBS answer) takes this many tenths
  of a second more to arrive: it crosses the FASTACKs, ACKJOBs and NACKs
  sent meanwhile (in the World's bus hook, sim/world.py).
* ``rewrite_often``: BGREWRITEAOF on some node every fraction of a second,
  so that rewrites meet every state (rewrite-keeps-state).

Each draws from a generator of its own (the plan's and the run's other
draws stay what they were). A crash or a slowed frame is a fault window,
as the fault runner's are, for the checks that want calm.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from disque_trio.core.job import Job

from .faults import FAILOVER_WAIT_S

if TYPE_CHECKING:
    from .explore import Explorer
    from .world import SimNode, World

CONN_ERRORS = (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)

CRASHES_AFTER_ACK = 2  # at most this many per run
CRASH_AFTER_ACK_PCT = 20  # of the client acks, while crashes are left


def install(world: World) -> None:
    """Arm the plan's knobs on the world (observers, the bus hook)."""
    plan = world.plan
    if plan.crash_after_ack:
        rng = random.Random(f"crash-after-ack-{plan.seed}")
        left = [CRASHES_AFTER_ACK]

        def observe(node: SimNode, event: str, job: Job, loading: bool) -> None:
            if (
                event != "acked"
                or loading
                or world.phase != "safety"
                or not left[0]
                or job.body is None
                or world.nursery is None
                or not world.healthy()  # a frozen or cut-off node: the faults' own
                or rng.randrange(100) >= CRASH_AFTER_ACK_PCT
            ):
                return
            left[0] -= 1
            world.nursery.start_soon(_crash_now, world, node, rng.uniform(0.3, 2.0))

        world.observers.append(observe)


async def _crash_now(world: World, node: SimNode, down: float) -> None:
    if not node.up:
        return
    window = world.fault_begin(node.index, "crash")
    # Restarted before FAIL: the others take its queued jobs over at once
    # (a new incarnation: failover-timely).
    world.watch_failover(node.index, window, "crash", down + FAILOVER_WAIT_S)
    try:
        with trio.CancelScope(shield=True):
            world.trace.record(node.name, "fault", {"ev": "crash-after-ack"})
            world.probes["crash-after-ack"] += 1
            await world.crash(node.index)
        await trio.sleep(down)
        with trio.CancelScope(shield=True):
            if not node.up:
                await world.restart(node.index)
    finally:
        world.fault_end(window)


async def rewrite_often(world: World, until: float, explorer: Explorer | None) -> None:
    """BGREWRITEAOF on a random node every 0.3..1 s until ``until`` (the
    explorer, told, does not count them as automatic rewrites)."""
    rng = random.Random(f"rewrite-often-{world.plan.seed}")
    while trio.current_time() < until:
        await trio.sleep(rng.uniform(0.3, 1.0))
        i = rng.randrange(world.count)
        if not world.nodes[i].up:
            continue
        if explorer is not None:
            explorer.bg_pending.add(i)
        try:
            client = await world.client(i)
            try:
                with trio.move_on_after(2):
                    await client.call("BGREWRITEAOF")
                    world.probes["rewrite-often"] += 1
            finally:
                await client.aclose()
        except CONN_ERRORS:
            pass
