"""A run's plan: swarm parameters, the fault schedule and the workload mix.

A plan is drawn from a seed (``Plan.from_seed``), saved as JSON
(``Plan.to_json``/``Plan.from_json``) and replayed exactly. It is also a
flat list of bounded non-negative integers (``encode``/``decode``) in which
zero always means the simplest thing: no fault, the smallest cluster, the
shortest run, no exotic job option. The shrinker (``sim.shrink``) moves
that list towards zeros, so a minimised plan is a failing run with as little
going on as possible.

What a plan does not fix is drawn from ``Plan.seed`` at run time: network
delays, Trio's scheduling order, the node a request goes to, think times.
The shrinker keeps ``seed``; replaying a plan re-draws those the same way.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import cattrs

# Fault kinds; 0 is "no fault". Victim, start, length and arg mean what the
# World's fault runner says for each (sim/faults.py).
FAULT_KINDS = (
    "none",
    "crash",  # kill -9, restart after length (unsynced writes lost)
    "isolate",  # one node cut from every other (both ways)
    "halves",  # random halves (arg seeds the split)
    "oneway-out",  # the victim's traffic to the others is dropped
    "oneway-in",  # the others' traffic to the victim is dropped
    "clog",  # bytes between the victim and the others held back, links kept
    "reset",  # the victim's connections reset (instant, new ones allowed)
    "clock-jump",  # the victim's wall clock jumps (arg: size and direction)
    "pause",  # the victim freezes: every byte to and from it held back
    "wipe",  # crash, restart with an empty disk (amnesia), rejoin by MEET
    "bus-chaos",  # bus frames to the victim dropped / duplicated / delayed
    "torn-crash",  # crash keeping a random prefix of the unsynced bytes
    # Issue 58, not drawn among the faults above (their draws stay what they
    # were): the plan's disk_fault fields make one (active_faults).
    "disk-full",  # the victim's disk refuses appends and fsyncs (ENOSPC)
    "disk-error",  # the victim's fsyncs fail (EIO); appends reach its page cache
    # Mixed releases (issue 58): the plan's old_* fields make one.
    "upgrade",  # the node playing an older release restarts as this one
    # Issue 58 too: the plan's slow_* fields make one.
    "slow-fsync",  # each fsync of the victim stalls its process (arg: how long)
)
# The kinds a seed draws among (FAULT_KINDS[1:DRAWN_KINDS]).
DRAWN_KINDS = 13
MAX_FAULTS = 8
FSYNC = ("always", "everysec", "no")

# (field, upper bound) in encoding order. A value is an int in [0, bound].
SWARM_FIELDS: tuple[tuple[str, int], ...] = (
    ("extra_nodes", 6),  # nodes = 1 + extra_nodes
    ("extra_seconds", 20),  # safety phase = 2 + extra_seconds
    ("extra_producers", 3),
    ("extra_consumers", 3),
    ("replicate_cap", 4),  # REPLICATE drawn in 1..min(nodes, 1 + cap)
    ("fsync", 2),  # index into FSYNC
    ("retry0_pct", 60),
    ("async_pct", 60),
    ("delay_pct", 40),  # jobs with a DELAY of 1..3 s
    ("ttl_pct", 40),  # jobs with a short TTL (4..15 s)
    ("noack_pct", 50),  # deliveries the consumer forgets (requeued at RETRY)
    ("nack_pct", 30),
    ("fastack_pct", 50),
    ("working_pct", 30),
    ("skew_ms", 500),  # per-node wall clock skew drawn in +-skew_ms
    ("drift_ppm", 2000),  # per-node wall clock drift in +-drift_ppm
    ("latency_ms", 40),  # one-way network delay up to 0.5 ms + latency_ms
    ("consumer_pause", 8),  # consumers stop for this many seconds mid-run
    ("pause_in", 6),  # one node pauses the queue in input for this many seconds
    # The explorer (sim/explore.py), issue #16:
    ("explore", 3),  # 0: off; 1..3: how busy its command client is
    ("admin_mask", 63),  # a bit per admin action of sim.explore.ADMIN_ACTIONS
    ("aof_rewrite_kb", 64),  # auto-aof-rewrite-min-size in KB (0: the default, 64 MB)
    ("node_timeout", 20),  # cluster-node-timeout in half seconds; 0: the default 15 s
    ("fault_stretch", 3),  # fault lengths multiplied by 1 + fault_stretch
    ("hold_pct", 40),  # deliveries held past RETRY, WORKING sent every RETRY/3
    ("cross_ack_pct", 60),  # acks sent to another node or over a fresh connection
    ("share_pct", 40),  # deliveries handed to another consumer, who acks them
    ("vanish_pct", 20),  # the consumer drops its connection, job unacked
    ("short_pct", 40),  # jobs with RETRY 1 and a TTL of 3..6 s
    ("pinned_producers", 1),  # 1: one more producer on each node
    ("long_cut", 2),  # one more fault: 1 isolates, 2 freezes the last node from +0.5 s to the end
    ("coda", 1),  # 1: after the drain, a few seconds of jobs in a cluster without faults
    # NACK/ENQUEUE with DELAY and WAITJOB (the fields of this group are 0 in
    # plans saved before they existed, which then replay as they did):
    ("nack_delay_pct", 30),  # deliveries NACKed with a DELAY of 1..5 s
    ("enqueue_delay_pct", 30),  # deliveries ENQUEUEd with a DELAY (RETRY 0 ones refused)
    ("late_delay_pct", 60),  # of those, sent after a think time past RETRY
    ("waiters", 2),  # clients calling WAITJOB on jobs added (0: none)
    ("wait_other_pct", 50),  # WAITJOBs sent to a node other than the job's creator
    # BUGGIFY-style knobs (sim/buggify.py), issue #45 (0 in plans saved before):
    ("crash_after_ack", 1),  # 1: a node crashes right after acking a job (twice at most)
    ("slow_yourjobs", 5),  # YOURJOBS arrives this many tenths of a second late
    ("rewrite_often", 1),  # 1: BGREWRITEAOF on some node every 0.3..1 s
    # Fail-over (issue 57; 0 in plans saved before): jobs whose RETRY is
    # longer than the time to FAIL, so that a lost node's queued jobs wait
    # for the survivors' fail-over, not for their RETRY (failover-timely).
    ("long_retry_pct", 40),  # producer jobs with a RETRY of LONG_RETRY_S, acked
    # A calm fail-over phase after the drains (sim/workload.py): a node
    # crashes, its queue of long RETRY jobs full; 1: restarted after 1 s
    # (before FAIL: its new incarnation is the loss), 2: once FAIL.
    ("failover_crash", 2),
    # The disk's faults (issue 58; 0 in plans saved before): 1 full, 2
    # failing fsyncs, on one node for a while; disk_crash 1 crashes it
    # while the disk still fails, 2 a second after it works again.
    ("disk_fault", 2),
    ("disk_victim", 6),  # modulo the node count
    ("disk_start", 200),  # tenths of a second into the safety phase
    ("disk_length", 80),  # tenths of a second
    ("disk_crash", 2),
    # Mixed releases (issue 58; 0 in plans saved before): one node speaks
    # an older bus protocol, 2 + old_bus (3 to 7), as in a rolling upgrade;
    # upgrade_at, if not 0, restarts it as this release then (tenths of a
    # second into the safety phase).
    ("old_bus", 5),
    ("old_node", 6),  # modulo the node count
    ("upgrade_at", 200),
    # 1: every node shares a cluster-secret (bus links authenticated).
    ("secret", 1),
    # Socket buffers: 0 unbounded (a sender never waits), else each
    # direction of a connection holds this many KB (4 << (sock_buffer - 1)):
    # a sender waits while the wire and the receiver's unread bytes fill it.
    ("sock_buffer", 4),
    # A slow disk: for slow_length tenths of a second from slow_start, each
    # fsync of node slow_node stalls its process 0.25 << slow_fsync seconds
    # (0.5 to 4 s; 0: none).
    ("slow_fsync", 4),
    ("slow_node", 6),
    ("slow_start", 200),
    ("slow_length", 80),
)
FAULT_FIELDS: tuple[tuple[str, int], ...] = (
    ("kind", len(FAULT_KINDS) - 1),
    ("victim", 6),  # modulo the node count
    ("start", 200),  # tenths of a second into the safety phase
    ("length", 80),  # tenths of a second
    ("arg", 255),
)


@attrs.frozen
class Fault:
    kind: int = 0
    victim: int = 0
    start: int = 0
    length: int = 0
    arg: int = 0

    @property
    def name(self) -> str:
        return FAULT_KINDS[self.kind]

    def describe(self) -> str:
        return (
            f"{self.name} n{self.victim} at +{self.start / 10:.1f}s "
            f"for {self.length / 10:.1f}s (arg {self.arg})"
        )


@attrs.frozen
class Plan:
    seed: int
    extra_nodes: int = 2
    extra_seconds: int = 8
    extra_producers: int = 1
    extra_consumers: int = 1
    replicate_cap: int = 2
    fsync: int = 0
    retry0_pct: int = 0
    async_pct: int = 0
    delay_pct: int = 0
    ttl_pct: int = 0
    noack_pct: int = 0
    nack_pct: int = 0
    fastack_pct: int = 0
    working_pct: int = 0
    skew_ms: int = 0
    drift_ppm: int = 0
    latency_ms: int = 0
    consumer_pause: int = 0
    pause_in: int = 0
    explore: int = 0
    admin_mask: int = 0
    aof_rewrite_kb: int = 0
    node_timeout: int = 0
    fault_stretch: int = 0
    hold_pct: int = 0
    cross_ack_pct: int = 0
    share_pct: int = 0
    vanish_pct: int = 0
    short_pct: int = 0
    pinned_producers: int = 0
    long_cut: int = 0
    coda: int = 0
    nack_delay_pct: int = 0
    enqueue_delay_pct: int = 0
    late_delay_pct: int = 0
    waiters: int = 0
    wait_other_pct: int = 0
    crash_after_ack: int = 0
    slow_yourjobs: int = 0
    rewrite_often: int = 0
    long_retry_pct: int = 0
    failover_crash: int = 0
    disk_fault: int = 0
    disk_victim: int = 0
    disk_start: int = 0
    disk_length: int = 0
    disk_crash: int = 0
    old_bus: int = 0
    old_node: int = 0
    upgrade_at: int = 0
    secret: int = 0
    sock_buffer: int = 0
    slow_fsync: int = 0
    slow_node: int = 0
    slow_start: int = 0
    slow_length: int = 0
    faults: tuple[Fault, ...] = ()

    # ------------------------------------------------------------ derived

    @property
    def nodes(self) -> int:
        return 1 + self.extra_nodes

    @property
    def duration(self) -> float:
        return float(2 + self.extra_seconds)

    @property
    def producers(self) -> int:
        return 1 + self.extra_producers

    @property
    def consumers(self) -> int:
        return 1 + self.extra_consumers

    @property
    def node_timeout_ms(self) -> int:
        """cluster-node-timeout: the node's default (15 s) unless drawn."""
        return self.node_timeout * 500 if self.node_timeout else 15000

    @property
    def appendfsync(self) -> str:
        return FSYNC[self.fsync]

    @property
    def old_version(self) -> tuple[int, int] | None:
        """(node index, bus protocol version) of the node playing an older
        release, or None."""
        if not self.old_bus or self.nodes < 2:
            return None
        return self.old_node % self.nodes, 2 + self.old_bus

    @property
    def buffer_bytes(self) -> int:
        """Each connection direction's bound in bytes (0: unbounded)."""
        return (4 << (self.sock_buffer - 1)) * 1024 if self.sock_buffer else 0

    @property
    def max_replicate(self) -> int:
        return min(self.nodes, 1 + self.replicate_cap)

    def active_faults(self) -> list[Fault]:
        """Faults that do something in this cluster (not "none")."""
        if self.nodes < 2:
            # One node: only what needs no peer.
            keep = {"crash", "clock-jump", "wipe", "torn-crash"}
            return [f for f in self.faults if f.name in keep] + self.disk_faults()
        out = [f for f in self.faults if f.kind]
        if self.long_cut:
            # Longer than the node timeout (when drawn short): FAIL is
            # reached, spread, and cleared after heal (fail-detected).
            kind = FAULT_KINDS.index(("isolate", "pause")[self.long_cut - 1])
            length = max(1, int(self.duration * 10) - 5)
            out.append(Fault(kind=kind, victim=self.nodes - 1, start=5, length=length))
        out += self.disk_faults()
        if self.slow_fsync:
            out.append(
                Fault(
                    kind=FAULT_KINDS.index("slow-fsync"),
                    victim=self.slow_node % self.nodes,
                    start=self.slow_start,
                    length=max(5, self.slow_length),
                    arg=self.slow_fsync,
                )
            )
        old = self.old_version
        if old is not None and self.upgrade_at:
            kind = FAULT_KINDS.index("upgrade")
            out.append(Fault(kind=kind, victim=old[0], start=self.upgrade_at, length=5))
        return out

    def disk_faults(self) -> list[Fault]:
        """The disk fault the plan's disk_* fields describe, and the crash
        that goes with it (one node's too)."""
        if not self.disk_fault:
            return []
        kind = FAULT_KINDS.index(("disk-full", "disk-error")[self.disk_fault - 1])
        victim = self.disk_victim % self.nodes
        length = max(5, self.disk_length)
        out = [Fault(kind=kind, victim=victim, start=self.disk_start, length=length)]
        if self.disk_crash:
            # While it fails (half a second before it works again), or a
            # second after: down for a second. Fault lengths are stretched
            # at run time (fault_stretch), start times are not.
            end = self.disk_start + length * (1 + self.fault_stretch)
            at = end + (-5 if self.disk_crash == 1 else 10)
            crash = FAULT_KINDS.index("crash")
            out.append(
                Fault(
                    kind=crash,
                    victim=victim,
                    start=max(0, at),
                    length=10 // (1 + self.fault_stretch),
                )
            )
        return out

    def swarm(self) -> dict[str, Any]:
        """The swarm parameters, for trace headers and reports."""
        out = {name: getattr(self, name) for name, _ in SWARM_FIELDS}
        out.update(nodes=self.nodes, duration=self.duration, appendfsync=self.appendfsync)
        return out

    # ----------------------------------------------------------- encoding

    def encode(self) -> list[int]:
        values = [getattr(self, name) for name, _ in SWARM_FIELDS]
        slots = list(self.faults) + [Fault()] * (MAX_FAULTS - len(self.faults))
        for fault in slots[:MAX_FAULTS]:
            values += [getattr(fault, name) for name, _ in FAULT_FIELDS]
        return values

    @classmethod
    def decode(cls, seed: int, draw: Callable[[int], int]) -> Plan:
        """Build a plan from ``draw(bound) -> int in [0, bound]`` calls made
        in ``encode`` order (from a list, as the shrinker does, or any source
        of bounded integers)."""
        swarm = {name: draw(bound) for name, bound in SWARM_FIELDS}
        faults = []
        for _ in range(MAX_FAULTS):
            fault = Fault(**{name: draw(bound) for name, bound in FAULT_FIELDS})
            if fault.kind:
                faults.append(fault)
        return cls(seed=seed, faults=tuple(faults), **swarm)

    @classmethod
    def from_values(cls, seed: int, values: list[int]) -> Plan:
        it: Iterator[int] = iter(values)

        def draw(bound: int) -> int:
            return max(0, min(bound, next(it, 0)))

        return cls.decode(seed, draw)

    # --------------------------------------------------------------- JSON

    def to_json(self) -> str:
        return json.dumps(_converter.unstructure(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return _converter.structure(json.loads(text), cls)

    # ---------------------------------------------------------- from seed

    @classmethod
    def from_seed(cls, seed: int, nodes: int | None = None, duration: float | None = None) -> Plan:
        """The swarm: every seed picks its own cluster size, job mix, clock
        trouble and a handful of faults (VOPR-style swarm testing)."""
        rng = random.Random(f"plan-{seed}")

        def pct(p_on: float, hi: int) -> int:
            return rng.randint(1, hi) if rng.random() < p_on else 0

        n = nodes if nodes is not None else rng.choice((1, 2, 3, 3, 3, 4, 5, 5, 6, 7))
        secs = int(duration) if duration is not None else rng.randint(6, 12)
        cap = rng.randint(0, 4)
        faults = []
        window = max(1, (secs - 1) * 10)
        for _ in range(rng.choice((1, 2, 2, 3, 3, 4, 5))):
            kind = rng.choices(
                range(1, DRAWN_KINDS),
                weights=(5, 4, 3, 2, 2, 2, 2, 2, 2, 1, 2, 2),
            )[0]
            faults.append(
                Fault(
                    kind=kind,
                    victim=rng.randrange(7) % max(1, n),
                    start=rng.randrange(5, max(6, window - 10)),
                    length=rng.randint(5, 60),
                    arg=rng.randrange(256),
                )
            )
        faults.sort(key=lambda f: f.start)
        # The explorer's fields from a generator of their own: the fields
        # above stay what they were before it existed.
        more = random.Random(f"explore-{seed}")
        explore = more.choice((0, 1, 2, 3, 3))
        admin_mask = sum(1 << bit for bit in range(6) if more.random() < 0.3)
        aof_rewrite_kb = more.randint(4, 64) if more.random() < 0.4 else 0
        plan = cls(
            seed=seed,
            extra_nodes=max(0, min(6, n - 1)),
            extra_seconds=max(0, min(20, secs - 2)),
            extra_producers=rng.randint(0, 2),
            extra_consumers=rng.randint(0, 2),
            replicate_cap=cap,
            fsync=rng.choice((0, 0, 1, 1, 2)),
            retry0_pct=pct(0.4, 40),
            async_pct=pct(0.3, 50),
            delay_pct=pct(0.3, 30),
            ttl_pct=pct(0.2, 30),
            noack_pct=pct(0.4, 30),
            nack_pct=pct(0.3, 20),
            fastack_pct=pct(0.3, 50),
            working_pct=pct(0.3, 30),
            skew_ms=pct(0.5, 500),
            drift_ppm=pct(0.3, 2000),
            latency_ms=pct(0.4, 40),
            consumer_pause=pct(0.3, 8),
            pause_in=pct(0.3, 6),
            explore=explore,
            admin_mask=admin_mask,
            aof_rewrite_kb=aof_rewrite_kb,
            faults=tuple(faults[:MAX_FAULTS]),
        )
        # Drawn after the fields above, so that those stay what they were.
        plan = attrs.evolve(
            plan,
            node_timeout=rng.randint(1, 6) if rng.random() < 0.6 else 0,
            fault_stretch=rng.choice((0, 0, 0, 1, 1, 2, 3)),
            hold_pct=pct(0.4, 30),
            cross_ack_pct=pct(0.5, 50),
            share_pct=pct(0.3, 30),
            vanish_pct=pct(0.3, 15),
            short_pct=pct(0.4, 40),
            pinned_producers=rng.choice((0, 1)),
            long_cut=rng.choice((0, 0, 0, 0, 1, 2)),
            coda=rng.choice((0, 1, 1)),
        )
        # NACK/ENQUEUE DELAY and WAITJOB from a generator of their own, as
        # the explorer's: every field above stays what it was.
        late = random.Random(f"delays-{seed}")
        plan = attrs.evolve(
            plan,
            nack_delay_pct=late.randint(1, 30) if late.random() < 0.6 else 0,
            enqueue_delay_pct=late.randint(1, 20) if late.random() < 0.5 else 0,
            late_delay_pct=late.randint(10, 50) if late.random() < 0.6 else 0,
            waiters=late.choice((0, 1, 2, 2)),
            wait_other_pct=late.randint(5, 40) if late.random() < 0.5 else 0,
        )
        # The BUGGIFY knobs, from a generator of their own too.
        knobs = random.Random(f"buggify-{seed}")
        plan = attrs.evolve(
            plan,
            crash_after_ack=int(knobs.random() < 0.15),
            slow_yourjobs=knobs.randint(1, 5) if knobs.random() < 0.2 else 0,
            rewrite_often=int(knobs.random() < 0.2),
        )
        # Fail-over's long RETRY jobs, from a generator of their own too.
        failover = random.Random(f"failover-{seed}")
        long_retry_pct = failover.randint(10, 40) if failover.random() < 0.5 else 0
        crash = failover.choice((1, 2)) if long_retry_pct else 0
        timeout = plan.node_timeout
        if crash == 2 and not 0 < timeout <= 3:
            # Down until the others flag it FAIL: a node timeout of 0.5 to
            # 1.5 s, so that it does not take long.
            timeout = failover.randint(1, 3)
        plan = attrs.evolve(
            plan, long_retry_pct=long_retry_pct, failover_crash=crash, node_timeout=timeout
        )
        # Mixed releases, from a generator of their own too.
        mixed = random.Random(f"mixed-{seed}")
        if mixed.random() < 0.25:
            plan = attrs.evolve(
                plan,
                old_bus=mixed.randint(1, 5),
                old_node=mixed.randrange(7),
                upgrade_at=mixed.randrange(5, max(6, window - 10)) if mixed.random() < 0.5 else 0,
            )
        # The bus secret, from a generator of its own too.
        plan = attrs.evolve(plan, secret=int(random.Random(f"secret-{seed}").random() < 0.3))
        # Bounded socket buffers, from a generator of their own too.
        buffers = random.Random(f"sockbuf-{seed}")
        if buffers.random() < 0.3:
            plan = attrs.evolve(plan, sock_buffer=buffers.randint(1, 4))
        # A slow disk, from a generator of its own too.
        slow = random.Random(f"slowfsync-{seed}")
        if slow.random() < 0.2:
            plan = attrs.evolve(
                plan,
                slow_fsync=slow.randint(1, 4),
                slow_node=slow.randrange(7),
                slow_start=slow.randrange(5, max(6, window - 10)),
                slow_length=slow.randint(10, 60),
            )
        # The disk's faults, from a generator of their own too.
        disk = random.Random(f"disk-{seed}")
        if disk.random() >= 0.3:
            return plan
        return attrs.evolve(
            plan,
            disk_fault=disk.choice((1, 2)),
            disk_victim=disk.randrange(7),
            disk_start=disk.randrange(5, max(6, window - 10)),
            disk_length=disk.randint(10, 40),
            disk_crash=disk.choice((0, 1, 2)),
        )


_converter = cattrs.Converter(forbid_extra_keys=True)
