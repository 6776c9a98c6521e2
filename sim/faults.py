"""Apply a plan's faults to a World, each in its own task, overlapping when
the plan says so. Every fault undoes itself after its length; ``heal_all``
(the liveness phase) undoes whatever is left."""

from __future__ import annotations

import random

import trio

from .disk import EIO, ENOSPC
from .plan import Fault
from .world import World

# Bus chaos probabilities by the fault's arg (drop, duplicate, delay).
CHAOS_LEVELS = ((0.05, 0.05, 0.05), (0.15, 0.1, 0.1), (0.3, 0.1, 0.2), (0.0, 0.3, 0.0))
# Faults that cut the victim from every other node (for fail-detected).
CUT_OFF = ("crash", "wipe", "torn-crash", "isolate", "pause", "upgrade")
# An instantaneous fault disturbs the run this long (links re-made, timers
# following a jumped clock).
AFTERMATH_S = {"reset": 2.0, "clock-jump": 5.0, "slow-fsync": 4.5}


# failover-timely waits this much longer than the detection bound for a
# holder to flag the victim FAIL (it runs while the majority flags it).
FAILOVER_WAIT_S = 5.0


def detection_bound(timeout_ms: int) -> float:
    """How long after a cut the majority must flag the victim FAIL: a PING
    within half the timeout, PFAIL a timeout later, then the others' reports
    by gossip (heartbeats every half timeout) and the FAIL broadcast."""
    return 3.0 * timeout_ms / 1000 + 3.0


async def run_fault(world: World, fault: Fault, start: float) -> None:
    await trio.sleep_until(start + fault.start / 10)
    i = fault.victim % world.count
    node = world.nodes[i]
    length = max(0.1, fault.length / 10) * (1 + world.plan.fault_stretch)
    ports = world.ports()
    others = [p for p in ports if p != node.port]
    name = fault.name
    world.trace.record("fault", "begin", {"fault": fault.describe()})
    window = world.fault_begin(-1 if name == "halves" else i, name)
    try:
        if name in CUT_OFF and world.count >= 3 and world.nursery is not None:
            bound = detection_bound(world.plan.node_timeout_ms)
            if length > bound:
                world.nursery.start_soon(world.check_detection, i, window, bound)
        if name in CUT_OFF and world.count >= 2:
            # The survivors queue what it had queued (failover-timely), once
            # they flag it FAIL (well within the detection bound: past it,
            # fail-detected's business) or hear it restarted.
            bound = detection_bound(world.plan.node_timeout_ms)
            world.watch_failover(i, window, name, bound + FAILOVER_WAIT_S)
        await _run_fault(world, fault, i, length, ports, others)
    finally:
        world.fault_end(window, AFTERMATH_S.get(name, 0.0))


async def _run_fault(
    world: World, fault: Fault, i: int, length: float, ports: list[int], others: list[int]
) -> None:
    node = world.nodes[i]
    name = fault.name
    if name in ("crash", "wipe", "torn-crash", "upgrade"):
        if name == "upgrade":
            # Restarted as this release (from the next start on).
            world.bus_versions.pop(i, None)
            world.probes["upgrade"] += 1
        if not node.up:
            return
        torn = (1 + fault.arg) / 256 if name == "torn-crash" else 0.0
        with trio.CancelScope(shield=True):
            await world.crash(i, torn=torn, wipe=name == "wipe")
        await trio.sleep(length)
        with trio.CancelScope(shield=True):
            if not node.up:
                await world.restart(i)
        return
    if name == "reset":
        world.net.reset(node.port)
        return
    if name == "clock-jump":
        # arg: low bit the direction, the rest the size (up to ~64 s).
        size = (fault.arg >> 1) * 500 + 500
        ms = size if fault.arg & 1 else -size
        assert node.clock is not None
        node.clock.jump(ms)
        world.jumps_ms += size
        world.last_jump_at = trio.current_time()
        world.probes["clock-jump"] += 1
        world.trace.record(node.name, "fault", {"ev": "clock-jump", "ms": ms})
        return
    if name in ("disk-full", "disk-error"):
        full = name == "disk-full"
        node.disk.fail(ENOSPC if full else EIO, writes=full)
        failure = [trio.current_time(), float("inf")]
        world.disk_failures[i].append(failure)
        world.probes[name] += 1
        world.trace.record(node.name, "fault", {"ev": name})
        try:
            await trio.sleep(length)
        finally:
            node.disk.heal()
            failure[1] = trio.current_time()
            world.trace.record(node.name, "fault", {"ev": "disk-healed"})
        return
    if name == "slow-fsync":
        # From the fault's start, each fsync of the node stalls its process
        # (World.slow_fsync): 0.5 to 4 s.
        node.disk.slow_s = 0.25 * (1 << max(1, min(4, fault.arg)))
        try:
            await trio.sleep(length)
        finally:
            node.disk.slow_s = 0.0
        return
    if name == "bus-chaos":
        world.chaos[i] = CHAOS_LEVELS[fault.arg % len(CHAOS_LEVELS)]
        world.net.mark_changed()
        await trio.sleep(length)
        world.chaos.pop(i, None)
        world.net.mark_changed()
        return
    hang = (fault.arg % 4) * 0.5 if fault.arg & 8 else 0.0
    if name == "isolate":
        key = world.net.add_rule("cut", [node.port], others, hang)
    elif name == "halves":
        rng = random.Random(fault.arg)
        shuffled = sorted(ports)
        rng.shuffle(shuffled)
        cut = max(1, len(shuffled) // 2)
        key = world.net.add_rule("cut", shuffled[:cut], shuffled[cut:], hang)
    elif name == "oneway-out":
        key = world.net.add_rule("stall", [node.port], others, hang)
        world.probes["one-way-partition"] += 1
    elif name == "oneway-in":
        key = world.net.add_rule("stall", others, [node.port], hang)
        world.probes["one-way-partition"] += 1
    elif name == "clog":
        key = world.net.add_rule("clog", [node.port], others)
    elif name == "pause":
        # Frozen: nothing goes in or out (clients included) until it wakes.
        key = world.net.add_rule("clog", [node.port], [*others, None])
    else:  # pragma: no cover - a new kind without a runner
        raise AssertionError(f"no runner for fault {name}")
    await trio.sleep(length)
    world.net.remove_rule(key)


async def run_faults(world: World, faults: list[Fault], start: float) -> None:
    async with trio.open_nursery() as nursery:
        for fault in faults:
            nursery.start_soon(run_fault, world, fault, start)


async def heal_all(world: World) -> None:
    """The liveness phase's start: every rule and chaos gone, every node up,
    wiped identities forgotten."""
    world.net.heal()
    world.chaos.clear()
    # A slow disk's stall in progress ends too (seed 711198: one outlived
    # the heal by 3 s, and the calm checks read the stalled node's lag).
    for node in world.nodes:
        node.disk.slow_s = 0.0
    for root in list(world.stalls):
        world.release_stall(root)
    for window in world.fault_windows:
        # A membership change (a node replaced: a new ID, FORGET, MEET) is
        # not undone by healing: its window stays open until every node
        # knows every other again (World.split_watch). Closed here, it let
        # the checks count a node that had not met the replacement yet as
        # calm: that node dropped the WORKING of the replacement's consumer
        # as coming from a stranger and queued the job again (seed 95333).
        if world.open_split(window):
            world.split_watch(window)  # (again, if already watched: harmless)
        else:
            world.fault_end(window)
    for node in world.nodes:
        if not node.up:
            await world.restart(node.index)
    for node in world.nodes:
        if node.old_ids:
            await world.introduce(node.index)  # its MEET may have met a partition
    world.trace.record("world", "phase", {"ev": "healed"})
