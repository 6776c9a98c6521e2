"""Shared test helpers: a small RESP client and in-process nodes."""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from disque_trio.config import Config
from disque_trio.env import Env, FileDisk, TcpNet, TrioClock
from disque_trio.server.connections import serve_client
from disque_trio.server.node import NodeServer
from disque_trio.testing import RespClient


def make_config(**overrides: Any) -> Config:
    pairs = [(k.replace("_", "-"), [str(v)]) for k, v in overrides.items()]
    return Config.load(None, pairs)


def virtual_env(seed: int = 1) -> Env:
    return Env(clock=TrioClock(), rng=random.Random(seed), net=TcpNet(), disk=FileDisk())


@asynccontextmanager
async def memory_node(seed: int = 1, **config: Any) -> AsyncIterator[MemoryNode]:
    """A node in this trio.run, reached over in-memory streams, on Trio's
    clock (so an autojump clock makes job timers instant)."""
    server = NodeServer(make_config(**config), virtual_env(seed), persist_cluster=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [])
        yield MemoryNode(server, nursery)
        server.shutdown()
        nursery.cancel_scope.cancel()


class MemoryNode:
    def __init__(self, server: NodeServer, nursery: trio.Nursery) -> None:
        self.server = server
        self.nursery = nursery

    async def client(self) -> RespClient:
        ours, theirs = trio.testing.memory_stream_pair()
        self.nursery.start_soon(serve_client, self.server, theirs)
        return RespClient(ours)


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port that is free, and so are port+1000 (web) and
    port+10000 (cluster bus), the node's derived ports. All three lie below
    the kernel's range for outgoing connections' local ports: a port picked
    inside it was free when checked and taken by some client's connection
    before the node bound it (CI at 7dda601: "port 38636 is already in use")."""
    rng = random.Random()
    top = max(10_001, _ephemeral_low() - 10_000)
    for _ in range(200):
        port = rng.randrange(10_000, top)
        if all(_bindable(p) for p in (port, port + 1000, port + 10000)):
            return port
    raise RuntimeError("no free port triple found")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """A listener fed by MemoryNet.connect()."""

    def __init__(self, net: MemoryNet, key: tuple[str, int]) -> None:
        self.net = net
        self.key = key
        # Unbounded is fine here: tests open a handful of connections.
        self.send_channel, self.receive_channel = trio.open_memory_channel[trio.abc.Stream](1000)

    async def accept(self) -> trio.abc.Stream:
        return await self.receive_channel.receive()

    async def aclose(self) -> None:
        self.net.listeners.pop(self.key, None)
        self.receive_channel.close()
        await trio.lowlevel.checkpoint()


class MemoryNet:
    """Loopback in memory: nodes of one trio.run reach each other by
    (host, port) over memory streams. ``down`` holds ports whose node is
    unreachable (connections refused, existing ones broken)."""

    def __init__(self) -> None:
        self.listeners: dict[tuple[str, int], MemoryListener] = {}
        self.streams: dict[int, list[trio.abc.Stream]] = {}
        self.down: set[int] = set()

    async def open_listeners(
        self, host: str, port: int
    ) -> list[trio.abc.Listener[trio.abc.Stream]]:
        listener = MemoryListener(self, (host, port))
        self.listeners[(host, port)] = listener
        return [listener]

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        listener = self.listeners.get((host, port))
        if listener is None or port in self.down:
            raise ConnectionRefusedError(f"nothing listens on {host}:{port}")
        ours, theirs = trio.testing.memory_stream_pair()
        listener.send_channel.send_nowait(theirs)
        self.streams.setdefault(port, []).extend([ours, theirs])
        return ours

    async def cut(self, port: int) -> None:
        """Make the node on this bus port unreachable."""
        self.down.add(port)
        for stream in self.streams.pop(port, []):
            await stream.aclose()


@asynccontextmanager
async def memory_cluster(
    count: int, seed: int = 1, bus_versions: dict[int, int] | None = None, **config: Any
) -> AsyncIterator[list[MemoryNode]]:
    """``count`` nodes in this trio.run, meshed by CLUSTER MEET over MemoryNet;
    ``bus_versions``: node index -> the older bus protocol it plays."""
    net = MemoryNet()
    nodes: list[MemoryNode] = []
    async with trio.open_nursery() as nursery:
        for i in range(count):
            port = 7711 + i
            env = virtual_env(seed * 100 + i)
            env.net = net
            server = NodeServer(
                make_config(port=port, **config),
                env,
                persist_cluster=False,
                bus_version=(bus_versions or {}).get(i),
            )
            bus_listeners = await net.open_listeners("127.0.0.1", port + 10000)
            await nursery.start(server.run, [], bus_listeners)
            nodes.append(MemoryNode(server, nursery))
        first = await nodes[0].client()
        for other in nodes[1:]:
            await first.call("CLUSTER", "MEET", "127.0.0.1", other.server.config.port)
        with trio.fail_after(30):
            while any(len(n.server.node.cluster.reachable()) < count - 1 for n in nodes):
                await trio.sleep(0.05)
        yield nodes
        for n in nodes:
            n.server.shutdown()
        nursery.cancel_scope.cancel()
