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
from disque_trio.protocol.resp import NOT_READY, ReplyReader, encode
from disque_trio.server.connection import serve_client
from disque_trio.server.runtime import NodeServer


class RespClient:
    """Talks RESP over any trio Stream; decodes replies with ReplyReader."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = ReplyReader()

    async def send(self, *args: Any) -> None:
        await self.stream.send_all(encode([_arg(a) for a in args]))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read(self) -> Any:
        while True:
            reply = self.reader.next_reply()
            if reply is not NOT_READY:
                return reply
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("connection closed by the node")
            self.reader.feed(data)

    async def call(self, *args: Any) -> Any:
        await self.send(*args)
        return await self.read()

    async def closed(self) -> bool:
        """True when the node closed the connection (reads to EOF)."""
        try:
            while await self.stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True

    async def aclose(self) -> None:
        await self.stream.aclose()


def _arg(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    return str(a).encode()


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


def free_port() -> int:
    """A loopback port that is free, and so are port+1000 (web) and
    port+10000 (cluster bus), the node's derived ports."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 40000)
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
