"""A World: K real NodeServers on a SimNet, SimDisks and skewed virtual
clocks, inside one deterministic trio.run.

Every source of randomness derives from one ``random.Random(seed)``: each
node's rng, each node's clock skew, the network delays, the workload and
Trio's own scheduler (the ``_ALLOW_DETERMINISTIC_SCHEDULING`` hook that
Hypothesis uses). Time is ``MockClock(autojump_threshold=0)``: whenever every
task is blocked, virtual time jumps to the next deadline.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio._core._run as trio_run
import trio.testing

from disque_trio.client import RespClient
from disque_trio.config import Config
from disque_trio.core.job import Job, JobState
from disque_trio.env import Env, TrioClock
from disque_trio.server.runtime import NodeServer

from .disk import DiskHandle, SimDisk
from .net import SimNet
from .trace import Trace

BASE_PORT = 7711
BASE_WALL_MS = 1_700_000_000_000
FSYNC_POLICIES = ("always", "everysec")
# Coverage probes counted in every run (see World.probes).
CORE_PROBES = (
    "queued-caused-dequeue",
    "willqueue-answered-queued",
    "yourjobs-moved-a-job",
    "ack-collected",
)
PROBES = (*CORE_PROBES, "one-way-partition", "crash", "aof-reload-requeued-job")
MESH_TIMEOUT_S = 30.0


class SimNode:
    """One node slot: its SimDisk and ports survive crashes, the NodeServer
    is replaced by a fresh one at each restart (an incarnation)."""

    def __init__(self, index: int, server: NodeServer, disk: SimDisk) -> None:
        self.index = index
        self.server = server
        self.disk = disk
        self.handle: DiskHandle | None = None
        self.port = server.config.port
        self.name = f"n{index}"
        self.incarnation = 0
        self.up = False
        self.scope: trio.CancelScope | None = None
        self.done = trio.Event()
        self.held_at_crash: set[str] = set()
        self.loaded: set[str] = set()  # job ids loaded from the AOF by this incarnation
        self.reloaded: set[str] = set()  # loaded and not queued since


class World:
    def __init__(self, seed: int, nodes: int = 3, **config: Any) -> None:
        self.seed = seed
        self.count = nodes
        self.config = config
        self.root = random.Random(seed)
        self.trace = Trace()
        self.net = SimNet(random.Random(self.root.getrandbits(64)), self.trace)
        self.node_seeds = [self.root.getrandbits(64) for _ in range(nodes)]
        self.skews_ms = [self.root.randrange(-100, 101) for _ in range(nodes)]
        self.scheduler_seed = self.root.getrandbits(64)
        self.appendfsync = self.root.choice(FSYNC_POLICIES)
        self.nodes: list[SimNode] = []
        self.wall_seconds = 0.0
        self.virtual_seconds = 0.0
        self._nursery: trio.Nursery | None = None
        # Crash bookkeeping for the checkers: job id -> node names.
        self.holders: dict[str, set[str]] = {}
        self.amnesia: dict[str, set[str]] = {}
        self.probes: Counter[str] = Counter(dict.fromkeys(PROBES, 0))

    def child_rng(self) -> random.Random:
        """A new generator derived from the root (workload, faults)."""
        return random.Random(self.root.getrandbits(64))

    def run(self, body: Callable[[World], Awaitable[None]]) -> None:
        """Run ``body(world)`` with the cluster up, deterministically."""
        saved_flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
        saved_state = trio_run._r.getstate()
        logger = logging.getLogger("disque_trio")
        saved_level = logger.level
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
        trio_run._r.seed(self.scheduler_seed)
        logger.setLevel(logging.ERROR)
        try:
            trio.run(self._main, body, clock=trio.testing.MockClock(autojump_threshold=0))
        finally:
            trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag  # type: ignore[misc]
            trio_run._r.setstate(saved_state)
            logger.setLevel(saved_level)

    async def _main(self, body: Callable[[World], Awaitable[None]]) -> None:
        async with trio.open_nursery() as net_nursery:
            self.net.nursery = net_nursery
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for i in range(self.count):
                    await self._start_node(i)
                await self._mesh()
                self.trace.record("world", "meshed", {"nodes": self.count})
                await body(self)
                self.virtual_seconds = trio.current_time()
                for node in self.nodes:
                    if node.up:
                        node.server.shutdown()
                nursery.cancel_scope.cancel()
            net_nursery.cancel_scope.cancel()

    async def _start_node(self, i: int) -> None:
        """Start node i: a fresh NodeServer (first start or restart) on the
        node's own SimDisk, which holds its nodes.conf and AOF."""
        port = BASE_PORT + i
        pairs = [
            ("port", [str(port)]),
            ("appendonly", ["yes"]),
            ("appendfsync", [self.appendfsync]),
        ]
        pairs += [(k.replace("_", "-"), [str(v)]) for k, v in sorted(self.config.items())]
        config = Config.load(None, pairs)
        if i < len(self.nodes):
            node = self.nodes[i]
            disk = node.disk
        else:
            disk = SimDisk()
            node = None
        incarnation = node.incarnation + 1 if node is not None else 0
        handle = DiskHandle(disk)
        env = Env(
            clock=TrioClock(BASE_WALL_MS, self.skews_ms[i]),
            rng=random.Random(self.node_seeds[i] + incarnation * 1_000_003),
            net=self.net.view(port),
            disk=handle,
        )
        server = NodeServer(config, env, persist_cluster=True)
        if node is None:
            node = SimNode(i, server, disk)
            self.nodes.append(node)
        node.server, node.handle, node.incarnation = server, handle, incarnation
        node.done = trio.Event()
        node.loaded, node.reloaded = set(), set()
        server.node.observers.append(self._observer(node, server))
        self.net.unfence(port)
        listeners = await env.net.open_listeners("127.0.0.1", port)
        bus_listeners = await env.net.open_listeners("127.0.0.1", config.cluster_bus_port())
        assert self._nursery is not None
        await self._nursery.start(self._run_node, node, server, listeners, bus_listeners)
        node.up = True
        self.trace.record(
            node.name,
            "node",
            {
                "ev": "started",
                "id": server.node.node_id,
                "incarnation": incarnation,
                "loaded": len(node.loaded),
            },
        )

    async def _run_node(
        self,
        node: SimNode,
        server: NodeServer,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        bus_listeners: list[trio.abc.Listener[trio.abc.Stream]],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        done = node.done
        try:
            with trio.CancelScope() as scope:
                node.scope = scope
                await server.run(listeners, bus_listeners, task_status=task_status)
        finally:
            done.set()

    async def crash(self, i: int) -> None:
        """Kill node i like a power loss: its unsynced writes are gone, its
        connections reset, its tasks cancelled (no shutdown code runs)."""
        node = self.nodes[i]
        assert node.up and node.scope is not None and node.handle is not None
        node.held_at_crash = {
            job.id
            for job in node.server.node.jobs.values()
            if job.body is not None and job.state in (JobState.ACTIVE, JobState.QUEUED)
        }
        node.up = False
        node.handle.alive = False
        node.disk.crash()
        node.scope.cancel()  # before the fence: waiting tasks see Cancelled
        self.net.fence(node.port)
        self.probes["crash"] += 1
        self.trace.record(node.name, "node", {"ev": "crashed", "held": len(node.held_at_crash)})
        await node.done.wait()

    async def restart(self, i: int) -> None:
        """A fresh NodeServer on node i's SimDisk and ports (AOF reloaded)."""
        node = self.nodes[i]
        assert not node.up
        await self._start_node(i)
        forgot = sorted(node.held_at_crash - node.loaded)
        for job_id in forgot:
            self.amnesia.setdefault(job_id, set()).add(node.name)
        if forgot:
            self.trace.record(node.name, "node", {"ev": "amnesia", "ids": forgot})

    def _observer(self, node: SimNode, server: NodeServer) -> Callable[[str, Job], None]:
        name = node.name

        def observe(event: str, job: Job) -> None:
            self.trace.record(name, "job", {"ev": event, "id": job.id})
            if event == "registered":
                self.holders.setdefault(job.id, set()).add(name)
                if server.aof.loading:
                    node.loaded.add(job.id)
                    node.reloaded.add(job.id)
            elif event == "deleted":
                if server.aof.loading:
                    node.loaded.discard(job.id)
                    node.reloaded.discard(job.id)
            elif event == "queued":
                if job.id in node.reloaded and not server.aof.loading:
                    node.reloaded.discard(job.id)
                    self.probes["aof-reload-requeued-job"] += 1
            elif event in CORE_PROBES:
                self.probes[event] += 1

        return observe

    async def client(self, index: int) -> RespClient:
        """A client (not subject to partitions) connected to node ``index``."""
        stream = await self.net.connect(None, "127.0.0.1", self.nodes[index].port)
        return RespClient(stream)

    async def _mesh(self) -> None:
        first = await self.client(0)
        for other in self.nodes[1:]:
            await first.call("CLUSTER", "MEET", "127.0.0.1", other.port)
        await first.aclose()
        with trio.fail_after(MESH_TIMEOUT_S):
            # Polling: the cluster table has no change notification.
            while not self.meshed():  # noqa: ASYNC110
                await trio.sleep(0.05)

    def meshed(self) -> bool:
        want = self.count - 1
        return all(len(n.server.node.cluster.reachable()) >= want for n in self.nodes)

    def up_indexes(self) -> list[int]:
        return [n.index for n in self.nodes if n.up]

    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]
