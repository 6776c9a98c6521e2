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
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio._core._run as trio_run
import trio.testing

from disque_trio.config import Config
from disque_trio.core.job import Job
from disque_trio.env import Env, TrioClock
from disque_trio.protocol.resp import NOT_READY, ReplyReader, encode
from disque_trio.server.runtime import NodeServer

from .disk import SimDisk
from .net import SimNet
from .trace import Trace

BASE_PORT = 7711
BASE_WALL_MS = 1_700_000_000_000
MESH_TIMEOUT_S = 30.0


class RespClient:
    """A minimal RESP client over any trio Stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = ReplyReader()

    async def call(self, *args: Any) -> Any:
        await self.stream.send_all(encode([_arg(a) for a in args]))
        while True:
            reply = self.reader.next_reply()
            if reply is not NOT_READY:
                return reply
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("connection closed by the node")
            self.reader.feed(bytes(data))

    async def aclose(self) -> None:
        await self.stream.aclose()


def _arg(a: Any) -> bytes:
    return a if isinstance(a, bytes) else str(a).encode()


class SimNode:
    def __init__(self, index: int, server: NodeServer, disk: SimDisk) -> None:
        self.index = index
        self.server = server
        self.disk = disk
        self.port = server.config.port
        self.name = f"n{index}"


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
        self.nodes: list[SimNode] = []
        self.wall_seconds = 0.0
        self.virtual_seconds = 0.0

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
                for i in range(self.count):
                    await self._start_node(nursery, i)
                await self._mesh()
                self.trace.record("world", "meshed", {"nodes": self.count})
                await body(self)
                self.virtual_seconds = trio.current_time()
                for node in self.nodes:
                    node.server.shutdown()
                nursery.cancel_scope.cancel()
            net_nursery.cancel_scope.cancel()

    async def _start_node(self, nursery: trio.Nursery, i: int) -> None:
        port = BASE_PORT + i
        pairs = [("port", [str(port)])]
        pairs += [(k.replace("_", "-"), [str(v)]) for k, v in sorted(self.config.items())]
        config = Config.load(None, pairs)
        disk = SimDisk()
        env = Env(
            clock=TrioClock(BASE_WALL_MS, self.skews_ms[i]),
            rng=random.Random(self.node_seeds[i]),
            net=self.net.view(port),
            disk=disk,
        )
        server = NodeServer(config, env, persist_cluster=False)
        node = SimNode(i, server, disk)
        server.node.observers.append(self._observer(node.name))
        listeners = await env.net.open_listeners("127.0.0.1", port)
        bus_listeners = await env.net.open_listeners("127.0.0.1", config.cluster_bus_port())
        await nursery.start(server.run, listeners, bus_listeners)
        self.nodes.append(node)
        self.trace.record(node.name, "node", {"ev": "started", "id": server.node.node_id})

    def _observer(self, name: str) -> Callable[[str, Job], None]:
        def observe(event: str, job: Job) -> None:
            self.trace.record(name, "job", {"ev": event, "id": job.id})

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

    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]
