"""A simulated network implementing the Env net seam.

Every connection is two one-way pipes. A sender's bytes go into its pipe's
queue with a delivery time (now + a delay drawn from the net's seeded
random.Random, never earlier than the previous chunk: TCP keeps order); one
delivery task for the whole net sleeps until the earliest chunk due (a heap
holds the head chunk of each pipe) and hands it to its receiver; under the
World's clock, its timers (``sim.clock``) do that without a task. So
``send_all`` never blocks on the peer, and under MockClock delays cost no
wall time.

Endpoints are owned by nodes (identified by their client port) or by
nobody (workload clients, which partitions do not touch).
``partition(a, b)`` breaks the existing connections between the two groups
and refuses new ones until ``heal()``. ``one_way(a, b)`` drops a -> b only:
new connections between the groups are refused (the handshake needs both
directions) and existing ones stall in the a -> b direction (TCP keeps
retransmitting) while b -> a flows; the stalled bytes arrive after ``heal()``
unless a side closed the connection meanwhile. ``fence(port)`` (a crashed
node) breaks every connection of that node, client ones included, drops its
listeners and refuses connections to or from it until ``unfence(port)``.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence

import trio

from .clock import Timers
from .trace import Trace, delivery_text

Owner = int | None


class _Inbox:
    """The receiving end of a pipe: the bytes delivered and not yet read.

    It reads like the node's real sockets (``disque_trio/server/sockio.py``):
    a read that finds bytes takes them and yields once, a read that finds
    none parks until the net delivers some. (Trio's MemoryReceiveStream
    yields twice more on every read, to catch concurrent readers: those
    yields were about a third of a simulated run's scheduler passes.)
    """

    __slots__ = ("closed", "data", "eof", "on_read", "waiter")

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.closed = False  # the reading side closed: deliveries fail
        self.waiter: trio.lowlevel.Task | None = None
        # Called once bytes were read or dropped (room in a bounded pipe).
        self.on_read: Callable[[], None] | None = None

    def put_data(self, data: bytes) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the receiving side closed")
        self.data += data
        self._wake()

    def put_eof(self) -> None:
        self.eof = True
        self._wake()

    def close(self) -> None:
        self.closed = True
        self.data.clear()
        self._wake()
        if self.on_read is not None:
            self.on_read()

    def _wake(self) -> None:
        if self.waiter is not None:
            task, self.waiter = self.waiter, None
            trio.lowlevel.reschedule(task)

    async def receive_some(self, max_bytes: int | None) -> bytes:
        """Up to ``max_bytes`` (all there is, if None); b"" at EOF."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.closed:
            raise trio.ClosedResourceError("stream closed")
        if self.data or self.eof:
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            if self.waiter is not None:
                raise trio.BusyResourceError("another task is reading this stream")
            self.waiter = trio.lowlevel.current_task()

            def abort(_: object) -> trio.lowlevel.Abort:
                self.waiter = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        if self.closed:
            raise trio.ClosedResourceError("stream closed")
        data = self.data
        if max_bytes is None or max_bytes >= len(data):
            chunk = bytes(data)
            data.clear()
        else:
            chunk = bytes(data[:max_bytes])
            del data[:max_bytes]
        if chunk and self.on_read is not None:
            self.on_read()
        return chunk


class _Pipe:
    """One direction of a connection."""

    def __init__(
        self, net: SimNet, src: str, dst: str, owners: tuple[Owner, Owner] = (None, None)
    ) -> None:
        self.net = net
        self.src = src
        self.dst = dst
        self.owners = owners  # (sender, receiver)
        self.traced_as = delivery_text(src, dst)
        self.receiver = _Inbox()
        # Unbounded: this queue is the data in flight on the wire (due time,
        # bytes or None for FIN); the sender must not block on it (a real
        # socket buffer is large, and bus outboxes bound what nodes send).
        self.wire: deque[tuple[float, bytes | None]] = deque()
        self._last_due = 0.0
        self.broken = False
        self.done = False  # FIN delivered or the receiver closed: nothing more arrives
        # A bounded pipe (net.buffer > 0), like a TCP connection's two socket
        # buffers: the bytes on the wire and those delivered but not read
        # count against it, and a sender waits for room (``room_event``).
        self.limit = net.buffer
        self.on_wire = 0
        self.room_event: trio.Event | None = None
        if self.limit:
            self.receiver.on_read = self._room_made

    def room(self) -> int:
        """Bytes a write may add now (any number when unbounded)."""
        if not self.limit:
            return 1 << 62
        return max(0, self.limit - self.on_wire - len(self.receiver.data))

    def _room_made(self) -> None:
        event = self.room_event
        if event is not None and (self.room() > 0 or self.broken or self.done):
            self.room_event = None
            event.set()

    async def wait_room(self) -> None:
        """Until a write may add a byte, or the pipe broke or ended."""
        if self.room() > 0 or self.broken or self.done:
            await trio.lowlevel.checkpoint()
            return
        if self.room_event is None:
            self.room_event = trio.Event()
            self.net.full_waits += 1
        await self.room_event.wait()

    def push(self, data: bytes | None) -> None:
        delay = self.net.rng.uniform(self.net.min_delay, self.net.max_delay)
        due = max(self._last_due, trio.current_time() + delay)
        self._last_due = due
        if self.broken or self.done:
            return
        self.wire.append((due, data))
        if data:
            self.on_wire += len(data)
        if len(self.wire) == 1:
            self.net.schedule(due, self)

    def deliver(self) -> None:
        """Hand the head chunk (due now) to the receiver, unless the pipe is
        stalled (then the net holds it until the rules change)."""
        if self.broken or self.done:
            self.wire.clear()
            self.on_wire = 0
            self._room_made()
            return
        if self.net.stalled(*self.owners):
            self.net.held.append(self)
            return
        due, data = self.wire.popleft()
        if data:
            self.on_wire -= len(data)
        late = trio.current_time() - due
        if late > 0 and self.owners[1] is not None:
            # Held back by a fault: when, and how long (sim/world.py counts
            # it on the job copies the bytes carried).
            self.net.held_back[self.owners[1]] = (trio.current_time(), late)
        if data is None:
            self.done = True
            self.wire.clear()
            self.on_wire = 0
            self.receiver.put_eof()
            self._room_made()
            return
        self.net.trace.record_delivery_between(self.traced_as, len(data))
        try:
            self.receiver.put_data(data)
        except trio.ClosedResourceError:
            self.done = True  # the receiving side closed its end
            self.wire.clear()
            self.on_wire = 0
            self._room_made()
            return
        if self.wire:
            self.net.schedule(self.wire[0][0], self)

    def break_(self) -> None:
        self.broken = True
        self.wire.clear()
        self.on_wire = 0
        try:
            self.receiver.put_eof()
        except trio.ClosedResourceError:
            pass
        self._room_made()


class SimStream(trio.abc.Stream):
    def __init__(self, outgoing: _Pipe, incoming: _Pipe) -> None:
        self.outgoing = outgoing
        self.incoming = incoming
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise trio.ClosedResourceError("stream closed")
        # As the node's real sockets (sockio.send_all): no yield when the
        # kernel takes every byte, which an unbounded wire always does; a
        # bounded one (net.buffer) takes what it has room for, and the rest
        # waits for the receiver to read.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.outgoing.broken:
            raise trio.BrokenResourceError("connection reset (partition)")
        written = self.write_nowait(data)  # all of it unless the pipe is bounded and full
        while written < len(data):
            await self.outgoing.wait_room()
            if self.closed:
                raise trio.ClosedResourceError("stream closed")
            if self.outgoing.done:
                return  # the receiver is gone: the rest vanishes, as before
            if self.outgoing.broken:
                raise trio.BrokenResourceError("connection reset (partition)")
            written += self.write_nowait(memoryview(data)[written:])

    def write_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """What ``sockio.write_nowait`` calls: the bytes the wire takes now,
        all of them unless it is bounded and full (0 on a closed or reset
        connection: ``send_all`` then raises)."""
        if self.closed or self.outgoing.broken:
            return 0
        take = min(len(data), self.outgoing.room())
        if take:
            self.outgoing.push(bytes(data[:take]))
        return take

    async def wait_send_all_might_not_block(self) -> None:
        await self.outgoing.wait_room()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.closed:
            raise trio.ClosedResourceError("stream closed")
        data = await self.incoming.receiver.receive_some(max_bytes)
        if not data and self.incoming.broken:
            raise trio.BrokenResourceError("connection reset (partition)")
        return data

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.outgoing.broken:
                self.outgoing.push(None)  # FIN after the data in flight
            self.incoming.receiver.close()
        await trio.lowlevel.checkpoint()


class SimListener(trio.abc.Listener[trio.abc.Stream]):
    def __init__(self, net: SimNet, port: int, owner: Owner) -> None:
        self.net = net
        self.port = port
        self.owner = owner
        # A listen backlog; the simulator opens few connections at once.
        self.send_channel, self.receive_channel = trio.open_memory_channel[trio.abc.Stream](1000)

    async def accept(self) -> trio.abc.Stream:
        return await self.receive_channel.receive()

    async def aclose(self) -> None:
        if self.net.listeners.get(self.port) is self:
            del self.net.listeners[self.port]
        self.receive_channel.close()
        await trio.lowlevel.checkpoint()


class _Connection:
    def __init__(self, a: Owner, b: Owner, pipes: tuple[_Pipe, _Pipe]) -> None:
        self.a = a
        self.b = b
        self.pipes = pipes


class SimNet:
    """The shared network. Give each node ``net.view(port)`` as its Env net.

    Faults are rules, each added under a key and removed by it (faults can
    overlap): ``cut`` pairs drop traffic both ways (connections broken, new
    ones refused), ``stall`` pairs hold back one direction (new connections
    refused), ``clog`` pairs hold back bytes in both directions while the
    connections stay up and new ones are accepted. A rule may make refused
    connects hang for ``hang_s`` before failing, like a SYN into the void.
    """

    def __init__(
        self,
        rng: random.Random,
        trace: Trace,
        min_delay: float = 0.0005,
        max_delay: float = 0.005,
        timers: Timers | None = None,
    ) -> None:
        self.rng = rng
        # With the clock's timers (the World's) chunks are delivered by
        # them, with no task; otherwise by the delivery task.
        self.timers = timers
        self.trace = trace
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.listeners: dict[int, SimListener] = {}
        self.connections: list[_Connection] = []
        self.rules: dict[str, tuple[str, frozenset[tuple[Owner, Owner]], float]] = {}
        self.blocked: set[tuple[Owner, Owner]] = set()  # (a, b): a -> b is dropped
        self.clogged: set[tuple[Owner, Owner]] = set()  # (a, b): a -> b is held back
        self.hang: dict[tuple[Owner, Owner], float] = {}
        self.fenced: set[int] = set()
        self.nursery: trio.Nursery | None = None
        # Chunks in flight: (due, order, pipe) for the head chunk of each
        # pipe with data on the wire; the delivery task sleeps in ``_wake``
        # until the first is due. ``held``: pipes whose head chunk is due
        # but stalled, in the order they stalled.
        self._due: list[tuple[float, int, _Pipe]] = []
        self._order = 0
        self._wake: trio.CancelScope | None = None
        self._delivering = False
        self.held: list[_Pipe] = []
        self._conn_ids = 0
        self._rule_ids = 0
        self.resets = 0  # connection resets so far (frames in flight lost)
        # Each pipe's bound in bytes (socket buffers; 0: unbounded), for the
        # connections made from now on (the World sets it from the plan).
        self.buffer = 0
        self.full_waits = 0  # writes that waited for room in a bounded pipe
        self.changed_at = 0.0  # virtual time of the last fault change
        self.held_back: dict[int, tuple[float, float]] = {}  # receiver -> (at, seconds)

    def view(self, owner: Owner) -> NodeNet:
        return NodeNet(self, owner)

    @property
    def faulty(self) -> bool:
        """Any partition or clog in force, or a node fenced."""
        return bool(self.rules or self.fenced)

    def schedule(self, due: float, pipe: _Pipe) -> None:
        """Deliver ``pipe``'s head chunk at ``due``."""
        if self.timers is not None:
            self.timers.call_at(due, pipe.deliver)
            return
        self._order += 1
        heapq.heappush(self._due, (due, self._order, pipe))
        if self._wake is not None and due < self._wake.deadline:
            self._wake.deadline = due

    async def _deliveries(self) -> None:
        """The delivery task: sleep until the first chunk is due, deliver
        every chunk due by then, in due order."""
        due = self._due
        while True:
            with trio.CancelScope(deadline=due[0][0] if due else math.inf) as self._wake:
                await trio.sleep_forever()
            self._wake = None
            now = trio.current_time()
            while due and due[0][0] <= now:
                heapq.heappop(due)[2].deliver()

    def _cut(self, a: Owner, b: Owner) -> bool:
        """No connection can be made or kept between a and b."""
        if a in self.fenced or b in self.fenced:
            return True
        if a is None or b is None:
            return False
        return (a, b) in self.blocked and (b, a) in self.blocked

    def stalled(self, src: Owner, dst: Owner) -> bool:
        """Bytes from src to dst are held back (one-way partition, clog)."""
        if (src, dst) in self.clogged:
            return True
        if src is None or dst is None:
            return False
        return (src, dst) in self.blocked

    def _refused(self, a: Owner, b: Owner) -> bool:
        if a is None or b is None:
            return self._cut(a, b)
        return self._cut(a, b) or (a, b) in self.blocked or (b, a) in self.blocked

    async def open_listeners(
        self, owner: Owner, port: int
    ) -> list[trio.abc.Listener[trio.abc.Stream]]:
        await trio.lowlevel.checkpoint()
        if port in self.listeners:
            raise OSError(f"port {port} in use")
        listener = SimListener(self, port, owner)
        self.listeners[port] = listener
        return [listener]

    async def connect(self, owner: Owner, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        listener = self.listeners.get(port)
        target = listener.owner if listener is not None else None
        if listener is None or self._refused(owner, target):
            hang = self.hang.get((owner, target), 0.0) if owner is not None and target else 0.0
            if hang:
                await trio.sleep(hang)
            self.trace.record(str(owner), "net", {"ev": "refused", "port": port})
            raise ConnectionRefusedError(f"nothing reachable on {host}:{port}")
        assert self.nursery is not None, "SimNet.nursery must be set"
        self._conn_ids += 1
        cid = self._conn_ids
        src, dst = f"{owner}#{cid}", f"{port}#{cid}"
        there = _Pipe(self, src, dst, (owner, listener.owner))
        back = _Pipe(self, dst, src, (listener.owner, owner))
        if not self._delivering and self.timers is None:
            self._delivering = True
            self.nursery.start_soon(self._deliveries)
        ours, theirs = SimStream(there, back), SimStream(back, there)
        try:
            listener.send_channel.send_nowait(theirs)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            there.break_()
            back.break_()
            raise ConnectionRefusedError(f"{host}:{port} not accepting") from e
        self.connections.append(_Connection(owner, listener.owner, (there, back)))
        self.trace.record(str(owner), "net", {"ev": "connect", "port": port, "conn": cid})
        return ours

    # -------------------------------------------------------------- rules

    def add_rule(
        self, kind: str, a_ports: Sequence[Owner], b_ports: Sequence[Owner], hang_s: float = 0.0
    ) -> str:
        """Start a fault between two groups; returns the key to remove it.
        ``cut``: both ways; ``stall``: a -> b only; ``clog``: both ways held."""
        assert kind in ("cut", "stall", "clog"), kind
        self._rule_ids += 1
        key = f"{kind}-{self._rule_ids}"
        pairs = {(a, b) for a in a_ports for b in b_ports if a != b}
        if kind in ("cut", "clog"):
            pairs |= {(b, a) for a, b in pairs}
        self.rules[key] = (kind, frozenset(pairs), hang_s)
        self.trace.record(
            "net", "fault", {"ev": kind, "key": key, "a": _names(a_ports), "b": _names(b_ports)}
        )
        self._recompute()
        if kind == "cut":
            self._break_cut()
        return key

    def remove_rule(self, key: str) -> None:
        if self.rules.pop(key, None) is not None:
            self.trace.record("net", "fault", {"ev": "unrule", "key": key})
            self._recompute()

    def _recompute(self) -> None:
        self.blocked, self.clogged, self.hang = set(), set(), {}
        for kind, pairs, hang_s in self.rules.values():
            (self.clogged if kind == "clog" else self.blocked).update(pairs)
            if hang_s:
                for pair in pairs:
                    self.hang[pair] = max(hang_s, self.hang.get(pair, 0.0))
        held, self.held = self.held, []
        for pipe in held:  # those still stalled come back to ``held``
            if pipe.wire:
                self.schedule(pipe.wire[0][0], pipe)
        self.mark_changed()

    def partition(self, a_ports: list[int], b_ports: list[int]) -> str:
        """Cut every link between the two groups of nodes (both ways)."""
        return self.add_rule("cut", a_ports, b_ports)

    def one_way(self, a_ports: list[int], b_ports: list[int]) -> str:
        """Drop traffic from group a to group b; b -> a still flows."""
        return self.add_rule("stall", a_ports, b_ports)

    def reset(self, port: int) -> int:
        """Reset every connection of a node (new ones are allowed)."""
        self.resets += 1
        self.mark_changed()
        n = 0
        for conn in self.connections:
            if port in (conn.a, conn.b):
                for pipe in conn.pipes:
                    pipe.break_()
                n += 1
        self.connections = [c for c in self.connections if not all(p.broken for p in c.pipes)]
        self.trace.record("net", "fault", {"ev": "reset", "port": port, "conns": n})
        return n

    def fence(self, port: int) -> None:
        """A crashed node: drop its listeners, break and refuse its connections."""
        self.fenced.add(port)
        self.mark_changed()
        for listen_port, listener in list(self.listeners.items()):
            if listener.owner == port:
                del self.listeners[listen_port]  # its owner closes it
        self.trace.record("net", "fault", {"ev": "fence", "port": port})
        self._break_cut()

    def unfence(self, port: int) -> None:
        self.fenced.discard(port)
        self.mark_changed()

    def mark_changed(self) -> None:
        """A fault began or ended (checks that need a quiet network skip
        the windows around it)."""
        try:
            self.changed_at = trio.current_time()
        except RuntimeError:  # outside trio.run (unit tests)
            pass

    def _break_cut(self) -> None:
        kept: list[_Connection] = []
        for conn in self.connections:
            if self._cut(conn.a, conn.b):
                for pipe in conn.pipes:
                    pipe.break_()
            elif not all(p.broken for p in conn.pipes):
                kept.append(conn)
        self.connections = kept

    def heal(self) -> None:
        """Remove every rule (fenced nodes stay fenced)."""
        self.rules.clear()
        self._recompute()
        self.trace.record("net", "fault", {"ev": "heal"})


def _names(ports: Sequence[Owner]) -> list[str]:
    return sorted("clients" if p is None else str(p) for p in ports)


class NodeNet:
    """One endpoint's view of the SimNet (the Env ``net`` seam)."""

    def __init__(self, net: SimNet, owner: Owner) -> None:
        self.net = net
        self.owner = owner

    async def open_listeners(
        self, host: str, port: int
    ) -> list[trio.abc.Listener[trio.abc.Stream]]:
        return await self.net.open_listeners(self.owner, port)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        return await self.net.connect(self.owner, host, port)
