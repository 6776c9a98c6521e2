"""A simple workload: producers ADDJOB, consumers GETJOB + ACKJOB, a fault
schedule in the middle (partitions, one-way partitions, node crashes and
restarts), then a drain phase.

Every operation lands in the history as (virtual time, client, op, data).
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio

from disque_trio.protocol.replies import Status

from .world import RespClient, World

QUEUE = "q"
ADD_TIMEOUT_MS = 1000
# What a client sees when its node crashes or refuses it.
CONN_ERRORS = (
    EOFError,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


@attrs.define
class Event:
    t: float
    client: str
    op: str  # "add" | "get" | "ack"
    data: dict[str, Any]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@attrs.define
class Workload:
    duration: float = 10.0
    producers: int = 2
    consumers: int = 2
    partition: bool = True  # the fault schedule's partitions (both kinds)
    crashes: bool = True
    drain_timeout: float = 30.0
    retry0_fraction: float = 0.2
    history: list[Event] = attrs.field(factory=list)
    drained: bool = False
    _world: World | None = None
    _stop_producing: trio.Event = attrs.field(factory=trio.Event)
    # Bodies of RETRY > 0 jobs added OK and not yet delivered; the drain
    # ends when it is empty.
    _undelivered: set[str] = attrs.field(factory=set)
    _delivered: set[str] = attrs.field(factory=set)
    _all_delivered: trio.Event = attrs.field(factory=trio.Event)

    def record(self, client: str, op: str, data: dict[str, Any]) -> None:
        assert self._world is not None
        self.history.append(Event(trio.current_time(), client, op, data))
        self._world.trace.record(client, "client", {"op": op, **data})
        if op == "add" and data["ok"] and data["retry"] > 0:
            if data["body"] not in self._delivered:
                self._undelivered.add(data["body"])
        elif op == "get":
            self._delivered.add(data["body"])
            self._undelivered.discard(data["body"])
        if self._stop_producing.is_set() and not self._undelivered:
            self._all_delivered.set()

    async def __call__(self, world: World) -> None:
        self._world = world
        self._stop_producing = trio.Event()
        self._all_delivered = trio.Event()
        rngs = [world.child_rng() for _ in range(self.producers + self.consumers)]
        faults = world.child_rng()
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(self.consumers):
                nursery.start_soon(
                    self._consumer, world, f"c{i}", i % world.count, rngs[self.producers + i]
                )
            async with trio.open_nursery() as producers:
                for i in range(self.producers):
                    producers.start_soon(self._producer, world, f"p{i}", rngs[i])
                await self._faults(world, faults, start)
                await trio.sleep_until(start + self.duration)
                self._stop_producing.set()
            # Every producer has its last ADDJOB answer: drain.
            world.trace.record("workload", "phase", {"ev": "drain"})
            if not self._undelivered:
                self._all_delivered.set()
            with trio.move_on_after(self.drain_timeout):
                await self._all_delivered.wait()
                self.drained = True
            world.trace.record("workload", "phase", {"ev": "end", "drained": self.drained})
            nursery.cancel_scope.cancel()

    async def _faults(self, world: World, rng: random.Random, start: float) -> None:
        """Faults one at a time between 20% and 85% of the duration: at least
        one crash (if enabled) and one partition (two-way or one-way, if
        enabled), plus maybe one more, in a seeded order. Everything is
        healed and every node is back up before the duration ends."""
        if world.count < 2:
            return
        kinds: list[str] = []
        if self.crashes:
            kinds.append("crash")
        if self.partition:
            kinds.append(rng.choice(["partition", "oneway"]))
        if kinds and rng.random() < 0.5:
            kinds.append(rng.choice([*kinds, "oneway"] if self.partition else kinds))
        rng.shuffle(kinds)
        slot = self.duration * 0.65 / max(1, len(kinds))
        for k, kind in enumerate(kinds):
            slot_start = start + self.duration * 0.2 + k * slot
            await trio.sleep_until(slot_start + rng.uniform(0.0, slot * 0.2))
            length = rng.uniform(slot * 0.3, slot * 0.7)
            victim = rng.randrange(world.count)
            ports = world.ports()
            others = [p for p in ports if p != ports[victim]]
            if kind == "crash":
                await world.crash(victim)
                await trio.sleep(length)
                await world.restart(victim)
                continue
            if kind == "partition":
                world.net.partition([ports[victim]], others)
            elif rng.random() < 0.5:
                world.net.one_way([ports[victim]], others)
                world.probes["one-way-partition"] += 1
            else:
                world.net.one_way(others, [ports[victim]])
                world.probes["one-way-partition"] += 1
            await trio.sleep(length)
            world.net.heal()

    async def _producer(self, world: World, name: str, rng: random.Random) -> None:
        clients: dict[int, RespClient] = {}
        replicate = min(3, world.count)
        n = 0
        while not self._stop_producing.is_set():
            index = rng.randrange(world.count)
            retry = 0 if rng.random() < self.retry0_fraction else 2
            body = f"{name}-{n}"
            n += 1
            # At-most-once (RETRY 0) requires REPLICATE 1, as in Disque.
            copies = replicate if retry else 1
            self.record(
                name, "invoke", {"node": index, "body": body, "retry": retry, "copies": copies}
            )
            try:
                client = clients.get(index)
                if client is None:
                    client = clients[index] = await world.client(index)
                reply: Any = await client.call(
                    "ADDJOB", QUEUE, body, ADD_TIMEOUT_MS, "REPLICATE", copies, "RETRY", retry
                )
            except CONN_ERRORS as e:
                # Unknown outcome: the job may exist (not OK, so not checked
                # for loss; a delivery of it is still legal).
                clients.pop(index, None)
                reply = f"connection error: {type(e).__name__}"
            ok = isinstance(reply, Status | bytes) and _text(reply).startswith("D-")
            self.record(
                name,
                "add",
                {"node": index, "body": body, "retry": retry, "ok": ok, "reply": _text(reply)},
            )
            await trio.sleep(rng.uniform(0.05, 0.2))

    async def _consumer(self, world: World, name: str, index: int, rng: random.Random) -> None:
        client: RespClient | None = None
        while True:
            try:
                if client is None:
                    client = await world.client(index)
                reply = await client.call("GETJOB", "TIMEOUT", 200, "COUNT", 1, "FROM", QUEUE)
                if not isinstance(reply, list) or not reply:
                    continue
                for _queue, job_id, body in reply:
                    jid, text = _text(job_id), _text(body)
                    self.record(name, "get", {"node": index, "id": jid, "body": text})
                    await trio.sleep(rng.uniform(0.0, 0.05))
                    acked = await client.call("ACKJOB", jid)
                    self.record(name, "ack", {"node": index, "id": jid, "reply": _text(acked)})
            except CONN_ERRORS as e:
                # Its node crashed: consume from another node meanwhile.
                self.record(name, "error", {"node": index, "error": type(e).__name__})
                client = None
                index = (index + 1) % world.count
                await trio.sleep(rng.uniform(0.1, 0.3))
