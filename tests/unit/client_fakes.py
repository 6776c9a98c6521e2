"""A fake Disque cluster in memory, behind fake transports for both shells.

Each ``FakeNode`` parses real RESP requests (the project's RequestParser)
and answers with real RESP bytes, so the client code under test is the
real one from the socket up. The cluster keeps one shared list of queued
jobs (as if federation moved them instantly), records which node received
each command, and can refuse connections, answer -LEAVING or -NOREPL, or drop a
connection after reading a command.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.lowlevel

from disque_trio.client.types import Address
from disque_trio.protocol.replies import NULL_ARRAY, OK, ReplyError, Status
from disque_trio.protocol.resp import RequestParser, encode


@dataclass
class FakeJob:
    id: str
    queue: str
    body: bytes
    nacks: int = 0
    holders: set[str] = field(default_factory=set)
    too_late: bool = False  # WORKING answers -TOOLATE


class FakeNode:
    def __init__(self, cluster: FakeCluster, index: int) -> None:
        self.cluster = cluster
        self.id = f"{index:x}" * 40
        self.address: Address = ("127.0.0.1", 7711 + index)
        self.priority = 1
        self.refuse = False  # connections are refused
        self.leaving = False  # GETJOB answers -LEAVING
        self.drop_next = 0  # close the connection instead of answering this many commands
        self.silent = False  # read commands, never answer
        self.norepl = 0  # answer this many ADDJOBs -NOREPL
        self.norepl_reason = ""  # appended to the -NOREPL message
        self.seen: list[list[bytes]] = []
        self.password: str | None = None
        self._ids = itertools.count()

    @property
    def prefix(self) -> str:
        return self.id[:8]

    def new_id(self) -> str:
        return f"D-{self.prefix}-{next(self._ids):024d}-05a1"

    def answer(self, args: list[bytes], state: dict[str, object]) -> object:
        """One command's reply value (``None`` for nil)."""
        name = args[0].decode().upper()
        a = [x.decode() for x in args[1:]]
        self.seen.append(args)
        c = self.cluster
        if self.password and not state.get("auth") and name not in ("AUTH", "HELLO"):
            return ReplyError("NOAUTH", "Authentication required.")
        if name == "AUTH":
            if a[0] != self.password:
                return ReplyError("ERR", "invalid password")
            state["auth"] = True
            return OK
        if name == "HELLO":
            if a:  # HELLO 3 [AUTH user pass]
                if len(a) > 1 and a[1].upper() == "AUTH":
                    if a[3] != self.password:
                        return ReplyError("WRONGPASS", "invalid password")
                    state["auth"] = True
                state["proto"] = int(a[0])
                return {"server": "fake", "proto": int(a[0])}
            nodes = [self, *(n for n in c.nodes if n is not self)]
            return [1, self.id] + [
                [n.id, "127.0.0.1", str(n.address[1]), str(n.priority)] for n in nodes
            ]
        if name == "PING":
            return Status("PONG")
        if name == "ADDJOB":
            if self.norepl:
                self.norepl -= 1
                message = "Not enough reachable nodes for the requested replication level"
                return ReplyError("NOREPL", message + self.norepl_reason)
            job = FakeJob(self.new_id(), a[0], args[2], holders={self.id})
            c.jobs[job.id] = job
            c.queued.append(job)
            return Status(job.id)
        if name == "GETJOB":
            if self.leaving:
                return ReplyError("LEAVING", "This node is leaving the cluster")
            queues = a[a.index("FROM") + 1 :]
            count = int(a[a.index("COUNT") + 1]) if "COUNT" in a else 1
            out = []
            for job in list(c.queued):
                if job.queue in queues and len(out) < count:
                    c.queued.remove(job)
                    job.holders.add(self.id)
                    out.append(
                        [
                            job.queue,
                            job.id,
                            job.body,
                            "nacks",
                            job.nacks,
                            "additional-deliveries",
                            0,
                        ]
                    )
            return out or NULL_ARRAY
        if name in ("ACKJOB", "FASTACK", "NACK"):
            done = 0
            for job_id in a:
                job = c.jobs.get(job_id)
                if job is None or self.id not in job.holders:
                    continue
                done += 1
                if name == "NACK":
                    job.nacks += 1
                    c.queued.append(job)
                else:
                    del c.jobs[job_id]
            return done
        if name == "WORKING":
            job = c.jobs.get(a[0])
            if job is None or self.id not in job.holders:
                return ReplyError("NOJOB", "Job not known in the context of this node.")
            if job.too_late:
                return ReplyError("TOOLATE", "Half of job TTL already elapsed")
            return 30
        if name == "SHOW":
            job = c.jobs.get(a[0])
            if job is None or self.id not in job.holders:
                return None
            return [
                "id",
                job.id,
                "queue",
                job.queue,
                "state",
                "active",
                "retry",
                30,
                "body",
                job.body,
            ]
        if name == "QLEN":
            return sum(1 for j in c.queued if j.queue == a[0])
        if name == "CLIENT":
            return OK
        return ReplyError("ERR", f"unknown command '{name}'")


class FakeCluster:
    def __init__(self, size: int = 3) -> None:
        self.nodes = [FakeNode(self, i + 1) for i in range(size)]
        self.jobs: dict[str, FakeJob] = {}
        self.queued: list[FakeJob] = []
        self.connects: list[Address] = []

    def node_at(self, address: Address) -> FakeNode:
        for node in self.nodes:
            if node.address == address:
                return node
        raise ConnectionRefusedError(f"nothing at {address}")

    def add(self, node: FakeNode, queue: str, body: bytes = b"x") -> str:
        """A job as if a producer had added it on ``node``."""
        job = FakeJob(node.new_id(), queue, body, holders={node.id})
        self.jobs[job.id] = job
        self.queued.append(job)
        return job.id

    def commands(self, node: FakeNode, name: str) -> list[list[str]]:
        return [[x.decode() for x in c] for c in node.seen if c[0].decode().upper() == name]

    # ------------------------------------------------------------ transports

    def open(self, address: Address) -> FakeConnection:
        self.connects.append(address)
        node = self.node_at(address)
        if node.refuse:
            raise ConnectionRefusedError(f"{address} refuses connections")
        return FakeConnection(node)

    def socket_connector(self) -> Callable[[Address, float], FakeSocket]:
        return lambda address, timeout: FakeSocket(self.open(address))

    def stream_connector(self) -> Callable[[str, int], object]:
        async def connect(host: str, port: int) -> anyio.abc.ByteStream:
            await anyio.lowlevel.checkpoint()
            return FakeStream(self.open((host, port)))

        return connect


class FakeConnection:
    """One connection's server side: bytes in, bytes out."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.parser = RequestParser()
        self.state: dict[str, object] = {}
        self.out = bytearray()
        self.closed = False

    def feed(self, data: bytes) -> None:
        if self.closed:
            raise BrokenPipeError("closed")
        self.parser.feed(data)
        while (args := self.parser.next_command()) is not None:
            if self.node.silent:
                self.node.seen.append(args)
                continue
            if self.node.drop_next:
                self.node.drop_next -= 1
                self.node.seen.append(args)
                self.closed = True
                return
            reply = self.node.answer(args, self.state)
            self.out += encode(reply, int(self.state.get("proto", 2)))  # type: ignore[arg-type, call-overload]

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data


class FakeSocket:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    def settimeout(self, value: float | None) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.conn.feed(data)

    def recv(self, size: int) -> bytes:
        data = self.conn.take()
        if not data and not self.conn.closed:
            raise TimeoutError("the fake node has nothing to say")
        return data

    def close(self) -> None:
        self.conn.closed = True


class FakeStream(anyio.abc.ByteStream):
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        try:
            self.conn.feed(item)
        except BrokenPipeError as e:
            raise anyio.BrokenResourceError from e

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        data = self.conn.take()
        if data:
            return data
        if self.conn.closed:
            raise anyio.EndOfStream
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.conn.closed = True
        await anyio.lowlevel.checkpoint()
