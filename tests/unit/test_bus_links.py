"""Bus links (server/peers.py): a link task that ended is replaced, a node
back in the table while its link is up is a member (and pinged), stale frames are not
sent, a starting node does not wait for a peer that is down, a commit
writes to an idle link itself and in order, the commits of one scheduler
pass in one write."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from disque_trio.core.cluster import HANDSHAKE, LEAVING, ClusterTable
from disque_trio.protocol import bus as bus_module
from disque_trio.server.peers import Bus, PeerLink

ME = "a" * 40
PEER = "b" * 40


def test_a_link_whose_task_ended_is_started_again() -> None:
    """A gossiped node the cron dropped (its link task ends) and the next
    gossip named again before a sync must get a new link task, or it stays
    without a link for ever (simulator seed 645595158)."""

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(Any, table, lambda sender, msg: None)  # type: ignore[arg-type]
        started: list[PeerLink] = []

        async def run_link(link: PeerLink) -> None:
            started.append(link)  # the node is gone: the task ends at once

        bus._run_link = run_link  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            bus.sync_links()
            await trio.testing.wait_all_tasks_blocked()
            assert len(started) == 1 and started[0].ended
            bus.sync_links()  # the node is in the table again
            await trio.testing.wait_all_tasks_blocked()
            assert len(started) == 2 and bus.links[PEER] is started[1]

    trio.run(main)


class _Clock:
    def wall_ms(self) -> int:
        return 1_700_000_000_000

    def mono_ms(self) -> int:
        return 0


class _Host:
    env = type("Env", (), {"clock": _Clock()})()


@pytest.mark.parametrize("back_by", ["gossip", "meet"])
def test_a_node_back_in_the_table_while_its_link_is_up_takes_the_links_word(back_by: str) -> None:
    """The cron dropped a gossiped node (no handshake in time) while our
    link to it stayed connected, or was finishing its handshake. Named again
    by gossip, its new entry (HANDSHAKE) must not wait for a handshake that
    already happened and be dropped again every 5 s (simulator seed
    20000951: n2 never counted n0 as a member after heal). Added again by
    CLUSTER MEET (no flag), it must not say "no link": it would never be
    pinged (pings go over a link that is up) and stay PFAIL for ever (seed
    115774: a replaced node saw a restarted one as fail? to the end of the
    run). The link check marks the link up, which sends the first
    heartbeat (a MEET to a node known from gossip)."""

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        bus = Bus(_Host(), table, lambda sender, msg: None)  # type: ignore[arg-type]
        connected = trio.Event()

        async def run_link(link: PeerLink) -> None:
            link.up = True  # connected and past the handshake, for good
            connected.set()
            await trio.sleep_forever()

        bus._run_link = run_link  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            table.add(PEER, "127.0.0.1", 7712, 17712)
            if back_by == "gossip":
                table.nodes[PEER].flags |= HANDSHAKE  # as gossip adds it
            bus.sync_links()
            await connected.wait()
            table.effects.clear()
            assert not table.nodes[PEER].link_up  # nobody said so yet
            bus.sync_links()
            assert table.nodes[PEER].link_up
            assert not table.nodes[PEER].flags & HANDSHAKE and table.size == 2
            first = bus_module.Meet if back_by == "gossip" else bus_module.Ping
            assert [type(m) for _, m in table.effects.sent()] == [first]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_yourjobs_that_waited_too_long_in_the_outbox_is_not_sent() -> None:
    """A YOURJOBS gives jobs with the TTL they had left when it was made:
    one that waits in a link's outbox (the link down) and goes out later
    would let them outlive their TTL on the receiver (simulator seeds
    20003187 and 112967). Past its ``send_by`` it is dropped; other frames
    wait."""
    from disque_trio.protocol import bus as bus_msgs

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(Any, table, lambda sender, msg: None)  # type: ignore[arg-type]
        link = bus.links[PEER] = PeerLink(PEER)
        bus.send(PEER, bus_msgs.YourJobs(()), trio.current_time() + 0.63)
        bus.send(PEER, bus_msgs.WillQueue("D-" + "0" * 8 + "-" + "A" * 24 + "-05a1"))
        first = link.receive_channel.receive_nowait()
        second = link.receive_channel.receive_nowait()
        assert not bus._stale(first[0], first[2]) and not bus._stale(second[0], second[2])
        await trio.sleep(0.62)
        assert not bus._stale(first[0], first[2])
        await trio.sleep(0.02)
        assert bus._stale(first[0], first[2])
        assert not bus._stale(second[0], second[2])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _decoded(frame: bytes) -> bus_module.ReplJob:
    decoder = bus_module.FrameDecoder()
    decoder.feed(frame)
    msg = decoder.next_message()
    assert isinstance(msg, bus_module.ReplJob) and decoder.next_message() is None
    return msg


def test_a_repljob_that_waited_in_the_outbox_carries_the_ttl_left_when_written() -> None:
    """A REPLJOB gives the receiver the TTL its job had left in whole
    seconds. One that waits in a link's outbox (the link down for a
    partition) and went out as made would let the receiver's copy outlive
    the job by the wait. Written, it carries the TTL left then; it is
    re-encoded only if that changed, and dropped once the job is gone."""
    from types import SimpleNamespace

    from disque_trio.core.job import Job, JobState
    from disque_trio.core.records import job_data

    now = [1_700_000_000_250]
    job = Job("D-" + "0" * 8 + "-" + "A" * 24 + "-05a1", "q", b"body", JobState.ACTIVE)
    job.etime = now[0] // 1000 + 30
    node = SimpleNamespace(jobs={job.id: job}, now_ms=lambda: now[0])
    host = SimpleNamespace(node=node, env=SimpleNamespace(clock=_Clock()))

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(host, table, lambda sender, msg: None)  # type: ignore[arg-type]
        link = bus.links[PEER] = PeerLink(PEER)
        msg = bus_module.ReplJob(job_data(job, now[0]), False)
        bus.send(PEER, msg)  # the link is down: queued
        item = link.receive_channel.receive_nowait()
        assert item[1] == bus_module.encode_frame(msg) and item[0] is msg
        now[0] += 700  # the same whole second left: the frame as made
        assert bus._outgoing(item) is item[1]
        bus.send(PEER, msg)  # again, written by the link task 12.7 s later
        now[0] += 12_000
        written = _decoded(bus._batch(link, b""))
        assert written == bus_module.ReplJob(attrs.evolve(msg.job, ttl=18), False)
        now[0] += 60_000  # past its TTL, not yet expired here: at least 1
        assert _decoded(bus._outgoing(item)).job.ttl == 1
        del node.jobs[job.id]  # collected meanwhile: not sent at all
        assert bus._outgoing(item) == b""

    trio.run(main)


def test_a_starting_node_does_not_wait_to_hear_a_peer_that_refused_it() -> None:
    """wait_peers_heard holds a starting node's clients until every peer
    answered its first PING; a peer that refused the connection is down and
    has no flag on us to clear: waiting for it only delayed a node restarted
    among stopped ones (the original's suite, "mass restart", 5 s each)."""

    refuse = trio.Event()

    class Net:
        async def connect(self, ip: str, port: int) -> trio.abc.Stream:
            await refuse.wait()
            raise ConnectionRefusedError(111, "Connection refused")

    class Host:
        env = type("Env", (), {"clock": _Clock(), "net": Net()})()

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(Host(), table, lambda sender, msg: None)  # type: ignore[arg-type]
        heard = False

        async def wait() -> None:
            nonlocal heard
            await bus.wait_peers_heard()
            heard = True

        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            bus.sync_links()
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not heard  # connecting: it may be up
            refuse.set()
            await trio.testing.wait_all_tasks_blocked()
            assert heard and bus.links[PEER].unreachable
            nursery.cancel_scope.cancel()

    trio.run(main)


class TakesSome(trio.abc.SendStream):
    """A connection whose socket takes ``room`` bytes at once, no more."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.written: list[bytes] = []

    def write_nowait(self, data: bytes) -> int:
        taken = data[: self.room]
        self.room -= len(taken)
        if taken:
            self.written.append(bytes(taken))
        return len(taken)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise AssertionError("only the link task writes with send_all")

    async def wait_send_all_might_not_block(self) -> None:
        raise AssertionError("not used")

    async def aclose(self) -> None:
        pass


class LinkHost:
    """What a link task asks of the node."""

    class env:
        class clock:
            @staticmethod
            def wall_ms() -> int:
                return 1_700_000_000_000

    def after_bus_event(self) -> None:
        pass


async def handshaken(
    stream: trio.abc.Stream, initiator: bool, offer: int = bus_module.PROTOCOL_VERSION
) -> tuple[Any, Any]:
    """Bus._handshake for a link task under test: the peer answered as PEER,
    at the version offered."""
    return type("Peer", (), {"node_id": PEER, "version": offer})(), None


class StreamPair(trio.abc.Stream):
    """A connection: writes go to ``out``, reads wait for ever."""

    def __init__(self, out: trio.testing.MemorySendStream) -> None:
        self.out = out

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.out.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _bus_with_link(room: int) -> tuple[Bus, PeerLink, TakesSome]:
    table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
    table.add(PEER, "127.0.0.1", 7712, 17712)
    bus = Bus(LinkHost(), table, lambda sender, msg: None)  # type: ignore[arg-type]
    link = bus.links[PEER] = PeerLink(PEER)
    stream = TakesSome(room)
    link.stream = stream
    return bus, link, stream


def test_a_commit_writes_its_frames_to_an_idle_link_at_once_in_one_write() -> None:
    """The messages of one commit to a link with nothing queued and no write
    in progress go out at the commit's end (Bus.flush), in one write, with
    no wake-up of the link task: a synchronous ADDJOB's REPLJOBs and their
    GOTJOBs each save a scheduler pass."""
    from disque_trio.protocol import bus as bus_msgs

    bus, link, stream = _bus_with_link(1 << 20)
    ping = bus_msgs.Ping(ME, 0, ())
    gone = bus_msgs.WillQueue("D-" + "0" * 8 + "-" + "A" * 24 + "-05a1")
    bus.send(PEER, ping)
    bus.send(PEER, gone)
    assert stream.written == []  # not before the commit ends
    bus.flush()
    assert stream.written == [bus_msgs.encode_frame(ping) + bus_msgs.encode_frame(gone)]
    assert link.queued == 0 and bus.frames_out == 2
    with pytest.raises(trio.WouldBlock):
        link.receive_channel.receive_nowait()


class ReplicatingHost(LinkHost):
    """A link host whose node holds no job (Bus.send looks there for a
    REPLJOB's copy)."""

    class node:
        jobs: dict[str, object] = {}


@contextlib.asynccontextmanager
async def _flushing_bus() -> AsyncIterator[tuple[Bus, TakesSome, trio.Nursery]]:
    """A running bus (its flusher task started) with an idle link to PEER
    whose writes land in a TakesSome; cancelled at the end."""
    table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
    bus = Bus(ReplicatingHost(), table, lambda sender, msg: None)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(bus.run, [])
        table.add(PEER, "127.0.0.1", 7712, 17712)
        link = bus.links[PEER] = PeerLink(PEER)
        stream = TakesSome(1 << 20)
        link.stream = stream
        yield bus, stream, nursery
        nursery.cancel_scope.cancel()


async def test_the_commits_of_one_scheduler_pass_share_one_write_per_link() -> None:
    """Commits ask for a flush (Bus.flush_soon); the flusher task writes
    once the tasks of that pass are done: the messages of every commit of
    the pass, in one write per link."""
    from disque_trio.protocol import bus as bus_msgs

    pings = [bus_msgs.Ping(ME, i, ()) for i in range(3)]
    async with _flushing_bus() as (bus, stream, nursery):

        async def commit(msg: bus_msgs.Ping) -> None:
            bus.send(PEER, msg)
            bus.flush_soon()
            assert stream.written == []  # not before the pass ends

        for msg in pings:
            nursery.start_soon(commit, msg)
        await trio.testing.wait_all_tasks_blocked()
        assert len(stream.written) == 1
        decoder = bus_msgs.FrameDecoder()
        decoder.feed(stream.written[0])
        got = [decoder.next_message() for _ in pings]
        assert decoder.next_message() is None
        # Trio runs the tasks of a pass in an order of its own.
        assert sorted(got, key=lambda m: m.flags) == pings  # type: ignore[union-attr]


async def _two_waves_of_addjobs(first: Any, second: Any) -> list[bytes]:
    """What the link gets when one commit sends ``first``, a REPLJOB, and
    wakes a task that sends ``second`` in the next pass."""
    woken = trio.Event()
    async with _flushing_bus() as (bus, stream, nursery):

        async def commit_first() -> None:
            bus.send(PEER, first)
            bus.flush_soon()
            woken.set()  # its client runs in the next pass

        async def commit_second() -> None:
            await woken.wait()
            bus.send(PEER, second)
            bus.flush_soon()

        nursery.start_soon(commit_second)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(commit_first)
        await trio.testing.wait_all_tasks_blocked()
    return stream.written


async def test_repljobs_wait_a_pass_more_for_the_next_wave_of_addjobs() -> None:
    """A commit that sent a REPLJOB has the flusher yield one pass more
    (Bus._flusher): the REPLJOBs of ADDJOBs read in the next pass, such as
    a client woken by the first commit, join the same write. Without it,
    the flusher writes in the next pass, before the second commit in half
    of Trio's orders of that pass; ten runs cover both."""
    from disque_trio.protocol import bus as bus_msgs

    job_id = "D-" + "0" * 8 + "-" + "1" * 24 + "-05a1"
    job = bus_msgs.JobData(job_id, "q", b"body", 3, 10**15, 86400, 0, 300, 1, 2, (ME,))
    first, second = bus_msgs.ReplJob(job), bus_msgs.ReplJob(attrs.evolve(job, body=b"2"))
    for _ in range(10):
        written = await _two_waves_of_addjobs(first, second)
        assert len(written) == 1
        decoder = bus_msgs.FrameDecoder()
        decoder.feed(written[0])
        assert [decoder.next_message(), decoder.next_message()] == [first, second]
        assert decoder.next_message() is None


async def test_gotjobs_do_not_wait_a_pass_more() -> None:
    """Messages answering the bus (GOTJOB) are written in the pass after
    their commit, as before: the flusher yields only for REPLJOBs."""
    from disque_trio.protocol import bus as bus_msgs

    got = bus_msgs.GotJob("D-" + "0" * 8 + "-" + "1" * 24 + "-05a1")
    async with _flushing_bus() as (bus, stream, _):
        bus.send(PEER, got)
        bus.flush_soon()
        # The flusher runs in the next pass; a second yield of this task
        # ends after that pass, whatever the order within it.
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        assert len(stream.written) == 1


def test_without_a_flusher_task_a_flush_soon_writes_at_once() -> None:
    from disque_trio.protocol import bus as bus_msgs

    bus, _, stream = _bus_with_link(1 << 20)
    ping = bus_msgs.Ping(ME, 0, ())
    bus.send(PEER, ping)
    bus.flush_soon()
    assert stream.written == [bus_msgs.encode_frame(ping)]


def test_a_commit_batches_each_run_of_small_job_messages_in_order() -> None:
    """BATCHABLE messages of one commit to an idle link go as one BATCH frame
    per run of one kind (a run of one as its own frame), other messages
    between them keep their place; the receiver gets them in the order sent."""
    from disque_trio.protocol import bus as bus_msgs

    bus, _, stream = _bus_with_link(1 << 20)
    ids = ["D-" + "0" * 8 + "-" + f"{i:024d}" + "-05a1" for i in range(5)]
    sent = [
        bus_msgs.Queued(ids[0], 0),
        bus_msgs.Queued(ids[1], 0),
        bus_msgs.Queued(ids[2], bus_msgs.FLAG_INCR_DELIV),
        bus_msgs.Ping(ME, 0, ()),
        bus_msgs.WillQueue(ids[3]),
        bus_msgs.WillQueue(ids[4]),
        bus_msgs.Queued(ids[4], 0),
    ]
    for msg in sent:
        bus.send(PEER, msg)
    bus.flush()
    assert stream.written == [
        bus_msgs.encode_batch(sent[:3])
        + bus_msgs.encode_frame(sent[3])
        + bus_msgs.encode_batch(sent[4:6])
        + bus_msgs.encode_frame(sent[6])
    ]
    assert bus.frames_out == 4 and bus.sent_by_type[bus_msgs.Queued] == 4
    decoder = bus_msgs.FrameDecoder()
    decoder.feed(stream.written[0])
    assert [decoder.next_message() for _ in sent] == sent
    assert decoder.next_message() is None and decoder.frames == 4


def test_a_run_longer_than_a_batch_takes_several() -> None:
    from disque_trio.protocol import bus as bus_msgs

    bus, _, stream = _bus_with_link(1 << 24)
    sent = [bus_msgs.DelJob("D-" + "0" * 8 + "-" + f"{i:024d}" + "-05a1") for i in range(2050)]
    for msg in sent:
        bus.send(PEER, msg)
    bus.flush()
    assert stream.written == [
        bus_msgs.encode_batch(sent[:1024])
        + bus_msgs.encode_batch(sent[1024:2048])
        + bus_msgs.encode_batch(sent[2048:])
    ]


def test_frames_wait_behind_a_write_in_progress_and_what_the_socket_refused() -> None:
    """What the socket does not take at once goes to the link task, and every
    later frame queues behind it until the link task has written it all:
    the byte stream keeps the commits' order. The rest of a frame cut short
    is the link's ``rest``, written before anything else on this connection
    and dropped with it (on another connection it would be garbage)."""
    from disque_trio.protocol import bus as bus_msgs

    first = bus_msgs.GotJob("D-" + "0" * 8 + "-" + "A" * 24 + "-05a1")
    second = bus_msgs.GotJob("D-" + "0" * 8 + "-" + "B" * 24 + "-05a1")
    frame = bus_msgs.encode_frame(first)

    async def main() -> None:
        bus, link, stream = _bus_with_link(10)
        bus.send(PEER, first)
        bus.flush()
        assert stream.written == [frame[:10]]
        assert link.rest == frame[10:] and link.queued == 1
        bus.send(PEER, second)  # behind the rest of the first frame
        bus.flush()
        assert stream.written == [frame[:10]] and link.queued == 2
        # The link task writes the rest, then the second frame, in one write.
        connection = trio.testing.MemorySendStream()
        bus._handshake = handshaken  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus._serve_link, link, StreamPair(connection))
            await trio.testing.wait_all_tasks_blocked()
            assert connection.get_data_nowait() == frame[10:] + bus_msgs.encode_frame(second)
            assert link.queued == 0 and not link.rest and link.stream is not None
            link.rest = b"the end of a frame cut short"
            nursery.cancel_scope.cancel()  # the connection ends
        assert link.stream is None and link.rest == b""
        # The socket took nothing: the frames queue whole, stale checks and all.
        stream.room = 0
        link.stream = stream
        bus.send(PEER, first)
        bus.flush()
        assert not link.rest and link.receive_channel.receive_nowait()[1] == frame
        # A link task in a write: a commit's frames queue behind it too.
        link.queued = 0
        link.writing = True
        bus.send(PEER, second)
        bus.flush()
        assert link.queued == 1 and link.receive_channel.receive_nowait()[1] == (
            bus_msgs.encode_frame(second)
        )

    trio.run(main)


def test_heartbeats_go_before_queued_frames_and_a_full_outbox_keeps_them() -> None:
    """A PING or PONG sent while the link task has frames to write goes
    right after the frame cut short (whose rest must come first), ahead of
    the job traffic queued, and is not dropped when the outbox is full: under
    load, PONGs dropped with job messages flagged busy peers failing."""
    from disque_trio.protocol import bus as bus_msgs

    # Frames of their own (not BATCHABLE: those wait for the commit's end).
    jobs = [bus_msgs.NeedJobs(f"queue-{c}", 10) for c in "ABCD"]
    ping = bus_msgs.Ping(ME, 0, ())

    async def main() -> None:
        bus, link, stream = _bus_with_link(10)
        link.send_channel, link.receive_channel = trio.open_memory_channel[
            tuple[str, bytes, float]
        ](3)
        bus.send(PEER, jobs[0])
        bus.flush()  # the socket took 10 bytes: the rest is the link task's
        assert stream.written == [bus_msgs.encode_frame(jobs[0])[:10]]
        for msg in jobs[1:]:
            bus.send(PEER, msg)
        # The outbox holds three: the rest's wake-up and two frames.
        assert link.queued == 3 and link.dropped == 1
        bus.send(PEER, ping)
        assert link.dropped == 1 and link.urgent == [bus_msgs.encode_frame(ping)]
        connection = trio.testing.MemorySendStream()
        bus._handshake = handshaken  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus._serve_link, link, StreamPair(connection))
            await trio.testing.wait_all_tasks_blocked()
            assert connection.get_data_nowait() == (
                bus_msgs.encode_frame(jobs[0])[10:]
                + bus_msgs.encode_frame(ping)
                + bus_msgs.encode_frame(jobs[1])
                + bus_msgs.encode_frame(jobs[2])
            )
            assert not link.urgent and link.queued == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_busy_links_small_job_messages_are_queued_as_one_batch() -> None:
    """While the link task has frames to write, a commit's BATCHABLE messages
    (and those after them) are queued at its end, in BATCH frames, behind
    what was queued; a PING still goes ahead of them all."""
    from disque_trio.protocol import bus as bus_msgs

    bus, link, stream = _bus_with_link(10)
    first = bus_msgs.NeedJobs("queue", 10)
    bus.send(PEER, first)
    bus.flush()  # the socket took 10 bytes: the rest is the link task's
    assert link.queued == 1  # the rest's wake-up
    gotjobs = [bus_msgs.GotJob("D-" + "0" * 8 + "-" + c * 24 + "-05a1") for c in "ABC"]
    need = bus_msgs.NeedJobs("other", 5)
    ping = bus_msgs.Ping(ME, 0, ())
    for msg in (*gotjobs[:2], need, ping, gotjobs[2]):
        bus.send(PEER, msg)
    assert link.queued == 1 and link.urgent == [bus_msgs.encode_frame(ping)]
    bus.flush()
    assert stream.written == [bus_msgs.encode_frame(first)[:10]]  # nothing more written
    frames = []
    while link.queued:
        frames.append(link.receive_channel.receive_nowait()[1])
        link.queued -= 1
    assert (
        frames
        == [
            b"",  # the rest's wake-up
            bus_msgs.encode_batch(gotjobs[:2]),
            bus_msgs.encode_frame(need),
            bus_msgs.encode_frame(gotjobs[2]),
        ]
    )


def test_messages_count_as_sent_once_written_or_queued_and_dropped_by_message() -> None:
    """disque_bus_messages_sent_total counts a message written or queued for
    the link task, not one whose BATCH frame a full outbox dropped; that
    frame's messages count as dropped one by one (a BATCH of three is three
    messages lost, in one frame)."""
    from disque_trio.protocol import bus as bus_msgs

    bus, link, stream = _bus_with_link(10)
    link.send_channel, link.receive_channel = trio.open_memory_channel[tuple[str, bytes, float]](2)
    first = bus_msgs.NeedJobs("queue", 10)
    bus.send(PEER, first)
    bus.flush()  # the socket took 10 bytes: the rest is the link task's
    assert bus.sent_by_type == {bus_msgs.NeedJobs: 1}
    assert link.queued == 1  # the rest's wake-up: room for one more
    ids = ["D-" + "0" * 8 + "-" + c * 24 + "-05a1" for c in "ABCDE"]
    gotjobs = [bus_msgs.GotJob(i) for i in ids[:2]]
    acks = [bus_msgs.SetAck(i, 3) for i in ids[2:]]
    for msg in (*gotjobs, *acks):
        bus.send(PEER, msg)
    assert bus.sent_by_type == {bus_msgs.NeedJobs: 1}  # not before the commit's end
    bus.flush()
    assert bus.sent_by_type == {bus_msgs.NeedJobs: 1, bus_msgs.GotJob: 2}
    assert link.dropped == 1 and link.dropped_messages == 3  # a BATCH of three SETACKs
    assert link.receive_channel.receive_nowait()[1] == b""
    assert link.receive_channel.receive_nowait()[1] == bus_msgs.encode_batch(gotjobs)

    # An idle link: written at the commit's end, counted then.
    bus, link, stream = _bus_with_link(1 << 20)
    bus.send(PEER, acks[0])
    bus.send(PEER, first)
    bus.flush()
    assert len(stream.written) == 1 and link.dropped == link.dropped_messages == 0
    assert bus.sent_by_type == {bus_msgs.SetAck: 1, bus_msgs.NeedJobs: 1}


def test_heartbeats_past_the_urgent_limit_drop_the_oldest_and_count_it() -> None:
    """A busy link keeps at most URGENT_MAX heartbeats waiting: past that the
    oldest goes, counted as dropped (it counted as sent when it was queued,
    as a superseded announcement in the outbox does)."""
    from disque_trio.protocol import bus as bus_msgs
    from disque_trio.server.peers import URGENT_MAX

    bus, link, _ = _bus_with_link(10)
    bus.send(PEER, bus_msgs.NeedJobs("queue", 10))
    bus.flush()  # the socket took 10 bytes: the link task has the rest
    pings = [bus_msgs.Ping(ME, 0, ()), bus_msgs.Ping(ME, LEAVING, ())]
    for k in range(URGENT_MAX + 1):
        bus.send(PEER, pings[k % 2])
    assert len(link.urgent) == URGENT_MAX
    assert link.urgent[0] == bus_msgs.encode_frame(pings[1])  # the first one went
    assert link.dropped == link.dropped_messages == 1
    assert bus.sent_by_type[bus_msgs.Ping] == URGENT_MAX + 1


def test_an_outbox_writes_only_the_last_copy_of_an_announcement() -> None:
    """A link down through a partition collects the same WILLQUEUE or QUEUED
    at every retry point; written back to back when it returns, each copy
    is answered by a QUEUED to every holder (a simulated partition healed
    into a message storm). Only the last copy is written, in its place; a
    QUEUED that counts a NACK or a delivery is never merged."""
    from disque_trio.protocol import bus as bus_msgs

    j1, j2, j3 = ("D-" + "0" * 8 + "-" + c * 24 + "-05a1" for c in "ABC")
    will1 = bus_msgs.WillQueue(j1)
    queued2 = bus_msgs.Queued(j2)
    counted3 = bus_msgs.Queued(j3, bus_msgs.FLAG_INCR_DELIV)
    ping = bus_msgs.Ping(ME, 0, ())
    sequence = [will1, queued2, will1, ping, counted3, counted3, will1, queued2]

    async def main() -> None:
        bus, link, _ = _bus_with_link(0)
        link.stream = None  # down: everything goes to the outbox
        for msg in sequence:
            bus.send(PEER, msg)
        assert link.queued == len(sequence)
        connection = trio.testing.MemorySendStream()
        bus._handshake = handshaken  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus._serve_link, link, StreamPair(connection))
            await trio.testing.wait_all_tasks_blocked()
            written = connection.get_data_nowait()
            nursery.cancel_scope.cancel()
        expected = [ping, counted3, counted3, will1, queued2]
        assert written == b"".join(bus_msgs.encode_frame(m) for m in expected)
        assert link.queued == 0 and link.repeats == {}

    trio.run(main)


def test_links_follow_the_table_after_a_heartbeat_only_when_it_moved() -> None:
    """After each PING and PONG the node syncs its links only if a node
    entered or left the table since the last sync: a heartbeat whose gossip
    names known nodes starts and stops nothing and builds nothing; one that
    names a new node starts its link; a node the cron dropped (handshake
    timed out) loses its link at the next heartbeat."""
    third = "c" * 40

    async def main() -> None:
        table = ClusterTable(ME, "127.0.0.1", 7711, 17711, random.Random(0), 1000)
        table.add(PEER, "127.0.0.1", 7712, 17712)
        bus = Bus(Any, table, lambda sender, msg: None)  # type: ignore[arg-type]
        syncs: list[int] = []
        sync = bus.sync_links

        def counted() -> None:
            syncs.append(table.membership)
            sync()

        bus.sync_links = counted  # type: ignore[method-assign]

        async def run_link(link: PeerLink) -> None:
            await trio.sleep_forever()

        bus._run_link = run_link  # type: ignore[method-assign]

        def entry(node_id: str, port: int) -> bus_module.GossipEntry:
            return bus_module.GossipEntry(node_id, "127.0.0.1", port, port + 10000, 0, 0, 0)

        async with trio.open_nursery() as nursery:
            bus._nursery = nursery
            bus.sync_links()
            assert list(bus.links) == [PEER] and len(syncs) == 1
            known = bus_module.Ping(PEER, 0, (entry(PEER, 7712),))
            for _ in range(3):
                table.on_heartbeat(known, 1000)
                bus.sync_links_if_moved()
            assert len(syncs) == 1  # nothing moved: no sync
            table.on_heartbeat(bus_module.Pong(PEER, 0, (entry(third, 7713),)), 1000)
            bus.sync_links_if_moved()
            assert len(syncs) == 2 and sorted(bus.links) == [PEER, third]
            assert table.nodes[third].flags & HANDSHAKE
            table.cron(1000 + 60_000)  # no handshake in time: dropped
            assert third not in table.nodes
            table.on_heartbeat(known, 61_000)
            bus.sync_links_if_moved()
            assert len(syncs) == 3 and list(bus.links) == [PEER]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_link_that_speaks_an_older_protocol_gets_no_newer_message() -> None:
    """A rolling upgrade: the link to a node of the release before speaks
    bus protocol 3, which has no POSTPONE; the message is not sent (as if
    lost: that holder re-queues at its RETRY). At version 4 it goes."""
    job_id = "D-" + "0" * 8 + "-" + "A" * 24 + "-05a1"
    bus, link, stream = _bus_with_link(1 << 20)
    link.version = 3
    bus.send(PEER, bus_module.Postpone(job_id, 5000, 2))
    bus.send(PEER, bus_module.WillQueue(job_id))
    bus.flush()
    assert stream.written == [bus_module.encode_frame(bus_module.WillQueue(job_id))]
    link.version = 4
    bus.send(PEER, bus_module.Postpone(job_id, 5000, 2))
    bus.flush()
    assert stream.written[-1] == bus_module.encode_frame(bus_module.Postpone(job_id, 5000, 2))


def test_a_peer_that_closes_on_our_offer_is_offered_one_version_less() -> None:
    """A node of a release before version 4 refuses a handshake of a
    version it does not know by closing the connection: each next one
    offers one less (5, 4, then 3); once a link is up, the one after
    offers our highest again."""
    ours = bus_module.PROTOCOL_VERSION

    async def main() -> None:
        bus, link, _ = _bus_with_link(1 << 20)
        offers: list[int] = []

        async def closes_unless_3(
            stream: trio.abc.Stream, initiator: bool, offer: int = ours
        ) -> tuple[Any, Any]:
            offers.append(offer)
            if offer != 3:
                return None, None
            return type("Peer", (), {"node_id": PEER, "version": 3})(), None

        bus._handshake = closes_unless_3  # type: ignore[method-assign]
        for _ in range(ours - 3):
            await bus._serve_link(link, StreamPair(trio.testing.MemorySendStream()))
        assert offers == list(range(ours, 3, -1)) and link.offer == 3
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus._serve_link, link, StreamPair(trio.testing.MemorySendStream()))
            await trio.testing.wait_all_tasks_blocked()
            assert offers == list(range(ours, 2, -1))
            assert link.version == 3 and link.offer == ours
            assert bus.table.nodes[PEER].bus_version == 3
            nursery.cancel_scope.cancel()

    trio.run(main)
