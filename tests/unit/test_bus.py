"""The cluster bus codec: messages, frames, and every way a frame is refused."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, get_args

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio.protocol import bus
from disque_trio.protocol.bus import (
    MAX_FRAME,
    PROTOCOL_VERSION,
    Auth,
    BusError,
    Delivered,
    DelJob,
    Enqueue,
    Fail,
    FindJob,
    FrameDecoder,
    GetStats,
    GossipEntry,
    GotAck,
    GotJob,
    Handshake,
    HaveJobs,
    JobCopy,
    JobData,
    Meet,
    Message,
    MsgType,
    NeedJobs,
    NodeFigures,
    NodeStats,
    Pause,
    Ping,
    Pong,
    Postpone,
    Publish,
    Queued,
    QueueLength,
    QueueRequeue,
    Refused,
    ReplJob,
    SetAck,
    WillQueue,
    Working,
    YourJobs,
    encode_batch,
    encode_frame,
)

# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

U64 = 2**64 - 1
uints = st.integers(0, 2**63 - 1)  # every int on the wire (protocol/limits.py)
small_uints = st.integers(0, 2**32 - 1)
ports = st.integers(0, 0xFFFF)
node_ids = st.integers(0, 2**160 - 1).map(lambda n: f"{n:040x}")
job_ids = st.text(st.characters(codec="ascii"), min_size=40, max_size=40)
# Queue names come from client bytes decoded with surrogateescape.
queue_names = st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape"))
ips = st.one_of(st.ip_addresses().map(str), st.text(max_size=50))

job_data = st.builds(
    JobData,
    id=job_ids,
    queue=queue_names,
    body=st.binary(max_size=300),
    repl=small_uints,
    ctime=st.integers(0, 2**63 - 1),
    ttl=small_uints,
    delay=small_uints,
    retry=small_uints,
    nacks=uints,
    deliveries=uints,
    nodes_delivered=st.lists(node_ids, max_size=7).map(tuple),
)
gossip_entries = st.builds(
    GossipEntry,
    node_id=node_ids,
    ip=ips,
    port=ports,
    cluster_port=ports,
    flags=small_uints,
    ping_sent_ms=uints,
    pong_received_ms=uints,
)


def heartbeat(cls: type[Ping | Pong | Meet]) -> st.SearchStrategy[Message]:
    gossip = st.lists(gossip_entries, max_size=5).map(tuple)
    return st.builds(cls, sender=node_ids, flags=small_uints, gossip=gossip)


node_stats = st.builds(
    NodeStats,
    request=uints,
    uptime=uints,
    used_memory=uints,
    clients=uints,
    ops_per_sec=uints,
    queued=uints,
    active=uints,
    acked=uints,
    wait_repl=uints,
    queues=uints,
    lengths=st.lists(st.builds(QueueLength, name=queue_names, length=uints), max_size=5).map(
        tuple
    ),
    omitted_jobs=uints,
    aof=st.sampled_from(["off", "on", "rewriting", "failing", "wait-rewrite"]),
    aof_size=uints,
)


STRATEGIES: dict[type[Any], st.SearchStrategy[Message]] = {
    Auth: st.builds(Auth, proof=st.binary(max_size=64)),
    Handshake: st.builds(
        Handshake,
        node_id=node_ids,
        ip=ips,
        port=ports,
        cluster_port=ports,
        nonce=st.binary(max_size=32),
        version=uints,
    ),
    Ping: heartbeat(Ping),
    Pong: heartbeat(Pong),
    Meet: heartbeat(Meet),
    Fail: st.builds(Fail, node_id=node_ids),
    ReplJob: st.builds(ReplJob, job=job_data, noreply=st.booleans()),
    GotJob: st.builds(GotJob, job_id=job_ids),
    Enqueue: st.builds(Enqueue, job_id=job_ids, delay=small_uints),
    Queued: st.builds(Queued, job_id=job_ids, flags=st.sampled_from([0, 2, 4, 6])),
    SetAck: st.builds(SetAck, job_id=job_ids, may_have=small_uints),
    WillQueue: st.builds(WillQueue, job_id=job_ids),
    GotAck: st.builds(GotAck, job_id=job_ids, known=st.booleans()),
    DelJob: st.builds(DelJob, job_id=job_ids),
    Refused: st.builds(Refused, job_id=job_ids),
    NeedJobs: st.builds(NeedJobs, queue=queue_names, count=small_uints),
    HaveJobs: st.builds(HaveJobs, queue=queue_names),
    Delivered: st.builds(Delivered, job_id=job_ids),
    Publish: st.builds(Publish, channel=st.binary(max_size=40), message=st.binary(max_size=200)),
    YourJobs: st.builds(YourJobs, jobs=st.lists(job_data, max_size=4).map(tuple)),
    Working: st.builds(Working, job_id=job_ids),
    Pause: st.builds(Pause, queue=queue_names, flags=st.integers(0, 3)),
    Postpone: st.builds(
        Postpone, job_id=job_ids, delay_ms=uints, flags=st.sampled_from([0, 2, 4])
    ),
    GetStats: st.builds(GetStats, request=uints),
    NodeStats: node_stats,
    NodeFigures: st.builds(
        NodeFigures,
        stats=node_stats,
        jobs=uints,
        requeue=st.lists(
            st.builds(QueueRequeue, name=queue_names, jobs=uints, next_ms=uints), max_size=5
        ).map(tuple),
        omitted_requeue=uints,
    ),
    FindJob: st.builds(FindJob, request=uints, job_id=job_ids),
    JobCopy: st.builds(
        JobCopy,
        request=uints,
        job_id=job_ids,
        state=st.sampled_from(["", "queued", "active", "acked", "wait-repl"]),
        gone=st.sampled_from(["", "acked", "expired", "moved", "deleted"]),
        queue=queue_names,
        nacks=uints,
        deliveries=uints,
        requeue_ms=uints,
        ttl=uints,
        nodes_delivered=st.lists(node_ids, max_size=7).map(tuple),
    ),
}
messages = st.one_of(list(STRATEGIES.values()))

NODE = "0123456789abcdef0123456789abcdef01234567"
JOB_ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
JOB = JobData(JOB_ID, "q", b"body", 3, 10**15, 86400, 0, 300, 1, 2, (NODE,))


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def decode_all(chunks: Iterable[bytes], max_frame: int = MAX_FRAME) -> list[Message]:
    """Every message in ``chunks``, checking that nothing is left pending."""
    decoder = FrameDecoder(max_frame)
    out: list[Message] = []
    for chunk in chunks:
        decoder.feed(chunk)
        while (msg := decoder.next_message()) is not None:
            out.append(msg)
    return out


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` split at the given (unsorted, possibly repeated) offsets."""
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def frame_of(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def packed(obj: Any) -> bytes:
    """A frame around any msgpack value (bytes stay bin, str becomes str)."""
    return frame_of(msgpack.packb(obj, use_bin_type=True))


def wire_body(msg: Message) -> list[Any]:
    """The msgpack body of ``msg`` as lists, ready to be tampered with."""
    code, body = msgpack.unpackb(encode_frame(msg)[4:])
    assert code == msg.TYPE
    assert isinstance(body, list)
    return body


def job_with(index: int, value: Any) -> list[Any]:
    """JOB's wire fields with one replaced."""
    fields: list[Any] = wire_body(ReplJob(JOB))[0]
    fields[index] = value
    return fields


def refused(frame: bytes, max_frame: int = MAX_FRAME) -> str:
    """The BusError text for ``frame``; fails if it decodes."""
    with pytest.raises(BusError) as info:
        decode_all([frame], max_frame)
    return str(info.value)


# --------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------


def test_every_message_type_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(get_args(Message))


def test_type_codes_follow_the_original() -> None:
    # CLUSTERMSG_TYPE_* in the original cluster.h, in order.
    original = "PING PONG MEET FAIL REPLJOB GOTJOB ENQUEUE QUEUED SETACK WILLQUEUE"
    original += " GOTACK DELJOB NEEDJOBS YOURJOBS WORKING PAUSE"
    for code, name in enumerate(original.split()):
        assert MsgType[name] == code
    classes = get_args(Message)
    # Every code but BATCH's (a frame of other messages) is a message class.
    assert sorted(cls.TYPE for cls in classes) == sorted(set(MsgType) - {MsgType.BATCH})
    assert {cls.TYPE.name for cls in classes} == {cls.__name__.upper() for cls in classes}


@given(messages)
def test_round_trip(msg: Message) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(msg))
    assert decoder.next_message() == msg
    assert decoder.next_message() is None


batchable = st.sampled_from(sorted(bus.BATCHABLE, key=lambda cl: cl.TYPE))


@given(batchable.flatmap(lambda cl: st.lists(STRATEGIES[cl], min_size=1, max_size=40)), st.data())
def test_a_batch_gives_its_messages_in_order_among_frames(
    msgs: list[Message], data: st.DataObject
) -> None:
    before = data.draw(st.lists(messages, max_size=3))
    after = data.draw(st.lists(messages, max_size=3))
    cuts = data.draw(st.lists(st.integers(0, 10**5), max_size=8))
    stream = b"".join(
        [*(encode_frame(m) for m in before), encode_batch(msgs), *(encode_frame(m) for m in after)]
    )
    assert decode_all(chunked(stream, cuts)) == [*before, *msgs, *after]


def test_a_batch_is_one_frame_of_its_messages() -> None:
    msgs = [Queued(JOB_ID, 0), Queued(JOB_ID[:-1] + "b", 1)]
    frame = encode_batch(msgs)
    code, (inner, bodies) = msgpack.unpackb(frame[4:])
    assert (code, inner) == (102, 7) and bodies == [
        [JOB_ID.encode(), 0],
        [JOB_ID[:-1].encode() + b"b", 1],
    ]
    decoder = FrameDecoder()
    decoder.feed(frame + encode_frame(GotJob(JOB_ID)))
    assert [decoder.next_message() for _ in range(3)] == [*msgs, GotJob(JOB_ID)]
    assert decoder.frames == 2 and decoder.next_message() is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param([7, [[JOB_ID.encode(), 0]], 1], "expected [type, [body, ...]]", id="long"),
        pytest.param([7], "expected [type, [body, ...]]", id="short"),
        pytest.param([4, [[JOB_ID.encode()]]], "type int 4 cannot be batched", id="repljob"),
        pytest.param([0, [[NODE.encode(), 0, []]]], "type int 0 cannot be batched", id="ping"),
        pytest.param([102, [[7, [[JOB_ID.encode(), 0]]]]], "type int 102 cannot be batched", id="nested"),
        pytest.param([100, []], "cannot be batched", id="handshake"),
        pytest.param([True, [[JOB_ID.encode()]]], "cannot be batched", id="bool-type"),
        pytest.param([9, []], "expected 1 to 1024 bodies", id="empty"),
        pytest.param([9, [[JOB_ID.encode()]] * 1025], "expected 1 to 1024 bodies", id="too-many"),
        pytest.param([9, [JOB_ID.encode()]], "bad WILLQUEUE in a BATCH: expected an array", id="bare-id"),
        pytest.param([9, [[JOB_ID.encode()], [b"x" * 39]]], "bad WILLQUEUE in a BATCH: job_id", id="bad-second"),
    ],
)  # fmt: skip
def test_refused_batches(body: Any, error: str) -> None:
    assert error in refused(packed([102, body]))


def test_a_batch_with_a_bad_message_gives_none_of_its_messages() -> None:
    good = wire_body(Queued(JOB_ID, 0))
    decoder = FrameDecoder()
    decoder.feed(packed([102, [7, [good, good, [b"x", 0]]]]))
    with pytest.raises(BusError, match="in a BATCH"):
        decoder.next_message()
    with pytest.raises(BusError):
        decoder.next_message()  # sticky


@pytest.mark.parametrize(
    ("msgs", "error"),
    [
        ([ReplJob(JOB)], "cannot batch"),
        ([Queued(JOB_ID, 0)] * 1025, "cannot batch"),
        ([Queued(JOB_ID, 0), WillQueue(JOB_ID)], "a QUEUED batch holds"),
        ([SetAck(JOB_ID, 2**64)], "cannot encode a SETACK batch"),
    ],
)
def test_batch_encode_errors(msgs: list[Message], error: str) -> None:
    with pytest.raises(BusError, match=error):
        encode_batch(msgs)


@given(st.binary(max_size=64))
def test_queue_names_round_trip_to_the_same_bytes(raw: bytes) -> None:
    name = raw.decode("utf-8", "surrogateescape")
    for msg in (NeedJobs(name, 1), Pause(name, 3), ReplJob(attrs.evolve(JOB, queue=name))):
        (decoded,) = decode_all([encode_frame(msg)])
        assert decoded == msg
        queue = decoded.job.queue if isinstance(decoded, ReplJob) else decoded.queue
        assert queue.encode("utf-8", "surrogateescape") == raw


@given(st.lists(messages, max_size=6), st.lists(st.integers(0, 10**6), max_size=12))
def test_any_chunking_gives_the_same_messages(msgs: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    assert decode_all(chunked(stream, cuts)) == msgs


@given(st.lists(messages, min_size=1, max_size=3))
def test_one_byte_at_a_time(msgs: list[Message]) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    assert decode_all(stream[i : i + 1] for i in range(len(stream))) == msgs


@given(messages, st.data())
def test_a_truncated_frame_is_not_an_error(msg: Message, data: st.DataObject) -> None:
    frame = encode_frame(msg)
    cut = data.draw(st.integers(0, len(frame) - 1))
    decoder = FrameDecoder()
    decoder.feed(frame[:cut])
    assert decoder.next_message() is None
    decoder.feed(frame[cut:])
    assert decoder.next_message() == msg


def test_one_byte_feeds_of_a_big_frame_take_linear_time() -> None:
    # 1 MB fed byte by byte: a decoder copying its buffer per feed would copy
    # about 500 GB; a linear one takes about a second.
    frame = encode_frame(ReplJob(attrs.evolve(JOB, body=bytes(1_000_000))))
    decoder = FrameDecoder()
    started = time.perf_counter()
    for i in range(len(frame) - 1):
        decoder.feed(frame[i : i + 1])
        assert decoder.next_message() is None
    decoder.feed(frame[-1:])
    assert decoder.next_message() == ReplJob(attrs.evolve(JOB, body=bytes(1_000_000)))
    assert time.perf_counter() - started < 20


def test_the_wire_format() -> None:
    """A frame is a big-endian length, then msgpack [type, [fields...]]."""
    frame = encode_frame(SetAck(JOB_ID, 3))
    assert frame == frame_of(b"\x92\x08\x92\xc4\x28" + JOB_ID.encode() + b"\x03")
    # Every str travels as bin; nested classes are nested arrays.
    assert wire_body(ReplJob(JOB, noreply=True)) == [
        [JOB_ID.encode(), b"q", b"body", 3, 10**15, 86400, 0, 300, 1, 2, [NODE.encode()]],
        True,
    ]
    assert wire_body(Handshake(NODE, "10.0.0.1", 7711, 17711, b"n" * 16)) == [
        NODE.encode(),
        b"10.0.0.1",
        7711,
        17711,
        b"n" * 16,
        PROTOCOL_VERSION,
    ]
    assert wire_body(Auth(b"proof")) == [b"proof"]


def test_ping_pong_and_meet_are_distinct_messages() -> None:
    gossip = (GossipEntry(NODE, "::1", 7711, 17711, 0, 0, 5),)
    ping, pong, meet = (cls(NODE, bus.NODE_FLAG_LEAVING, gossip) for cls in (Ping, Pong, Meet))
    assert ping != pong != meet
    assert decode_all([encode_frame(m) for m in (ping, pong, meet)]) == [ping, pong, meet]


# --------------------------------------------------------------------------
# Refused frames
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        pytest.param(frame_of(b"\xc1"), "bad msgpack", id="reserved-byte"),
        pytest.param(frame_of(b""), "bad msgpack", id="empty-frame"),
        pytest.param(frame_of(b"\x92\x05"), "bad msgpack", id="payload-cut-short"),
        pytest.param(frame_of(msgpack.packb([5, [b"x" * 40]]) + b"\x00"), "bad msgpack", id="extra-data"),
        pytest.param(frame_of(b"\xd4\x01\x00"), "[type, body]", id="ext-type"),
        pytest.param(packed(5), "[type, body]", id="int-payload"),
        pytest.param(packed(b"ping"), "[type, body]", id="bin-payload"),
        pytest.param(packed({"type": 0}), "[type, body]", id="map-payload"),
        pytest.param(packed([0]), "[type, body]", id="short-envelope"),
        pytest.param(packed([5, [JOB_ID.encode()], 0]), "[type, body]", id="long-envelope"),
        pytest.param(packed([42, []]), "unknown message type int 42", id="unknown-type"),
        pytest.param(packed([-1, []]), "unknown message type", id="negative-type"),
        pytest.param(packed([True, []]), "unknown message type", id="bool-type"),
        pytest.param(packed(["PING", []]), "unknown message type", id="str-type"),
        pytest.param(packed([5.0, [JOB_ID.encode()]]), "unknown message type", id="float-type"),
        pytest.param(packed([5, []]), "bad GOTJOB: expected 1 fields, got 0", id="too-few"),
        pytest.param(packed([5, [JOB_ID.encode()] * 2]), "expected 1 fields, got 2", id="too-many"),
        pytest.param(packed([5, JOB_ID.encode()]), "expected an array of 1", id="body-not-array"),
        pytest.param(packed([5, [JOB_ID]]), "job_id: expected a job ID", id="str-not-bin"),
        pytest.param(packed([5, [b"x" * 39]]), "job_id: expected a job ID", id="short-job-id"),
        pytest.param(packed([5, ["é".encode() * 20]]), "job ID", id="non-ascii-job-id"),
        pytest.param(packed([3, [NODE.upper().encode()]]), "node_id: expected a node ID", id="uppercase-node-id"),
        pytest.param(packed([3, [b"g" * 40]]), "node ID", id="non-hex-node-id"),
        pytest.param(packed([8, [JOB_ID.encode(), "3"]]), "may_have: expected an integer in 0..2**63-1, got str '3'", id="str-for-int"),
        pytest.param(packed([8, [JOB_ID.encode(), b"3"]]), "may_have: expected an integer in 0..2**63-1", id="bin-for-int"),
        pytest.param(packed([8, [JOB_ID.encode(), True]]), "got bool True", id="bool-for-int"),
        pytest.param(packed([8, [JOB_ID.encode(), 3.0]]), "got float 3.0", id="float-for-int"),
        pytest.param(packed([8, [JOB_ID.encode(), -3]]), "got int -3", id="negative-int"),
        pytest.param(packed([8, [JOB_ID.encode(), U64]]), "got int 18446744073709551615", id="u64-int"),
        pytest.param(packed([8, [JOB_ID.encode(), 2**63]]), "may_have: expected an integer in 0..2**63-1", id="int-past-i64"),
        pytest.param(packed([4, [job_with(5, U64), False]]), "job: ttl: expected an integer", id="u64-ttl"),
        pytest.param(packed([4, [job_with(5, 2**32), False]]), "job: ttl: expected seconds in 0..4294967295, got 4294967296", id="ttl-past-u32"),
        pytest.param(packed([4, [job_with(7, 2**40), False]]), "job: retry: expected seconds", id="retry-past-u32"),
        pytest.param(packed([4, [job_with(6, 2**32), False]]), "job: delay: expected seconds", id="delay-past-u32"),
        pytest.param(packed([6, [JOB_ID.encode(), 2**32]]), "delay: expected seconds", id="enqueue-delay-past-u32"),
        pytest.param(packed([8, [JOB_ID.encode(), None]]), "got NoneType None", id="nil-for-int"),
        pytest.param(packed([10, [JOB_ID.encode(), 1]]), "known: expected a boolean", id="int-for-bool"),
        pytest.param(packed([12, ["queue", 1]]), "queue: expected a string as bin, got str", id="msgpack-str-queue"),
        pytest.param(packed([12, [7, 1]]), "queue: expected a string as bin", id="int-for-str"),
        pytest.param(packed([100, [NODE.encode(), b"::1", 65536, 1, b"", 1]]), "port: expected a port number, got 65536", id="port-range"),
        pytest.param(packed([0, [NODE.encode(), 0, {}]]), "gossip: expected an array", id="map-for-array"),
        pytest.param(packed([0, [NODE.encode(), 0, b"xy"]]), "gossip: expected an array", id="bin-for-array"),
        pytest.param(packed([0, [NODE.encode(), 0, [[NODE.encode()]]]]), "gossip: [0]: expected 7 fields, got 1", id="short-gossip"),
        pytest.param(packed([4, [[], False]]), "job: expected 11 fields, got 0", id="empty-job"),
        pytest.param(packed([4, [job_with(10, [b"z" * 40]), False]]), "job: nodes_delivered: [0]: expected a node ID", id="bad-node-in-job"),
        pytest.param(packed([4, [job_with(2, "body"), False]]), "job: body: expected bin, got str", id="str-body"),
        pytest.param(packed([13, [[[]]]]), "bad YOURJOBS: jobs: [0]: expected 11 fields", id="yourjobs-bad-job"),
    ],
)  # fmt: skip
def test_refused_frames(frame: bytes, error: str) -> None:
    assert error in refused(frame)


@given(messages, st.data())
def test_a_wrongly_typed_field_is_refused(msg: Message, data: st.DataObject) -> None:
    # No field of any message is a float, a msgpack str, nil or a map.
    body = wire_body(msg)
    index = data.draw(st.integers(0, len(body) - 1))
    body[index] = data.draw(st.sampled_from([1.5, "text", None, {}]))
    assert type(msg).__name__.upper() in refused(packed([msg.TYPE, body]))


@given(messages, st.data())
def test_a_missing_or_extra_field_is_refused(msg: Message, data: st.DataObject) -> None:
    body = wire_body(msg)
    if data.draw(st.booleans()):
        del body[data.draw(st.integers(0, len(body) - 1))]
    else:
        body.append(data.draw(st.sampled_from([0, b"", True, []])))
    assert "fields, got" in refused(packed([msg.TYPE, body]))


@pytest.mark.parametrize(
    ("header", "max_frame"),
    [
        (b"\xff\xff\xff\xff", MAX_FRAME),  # -1 as an int32
        (b"\x80\x00\x00\x00", bus.MAX_FRAME_LIMIT),  # negative even at the largest limit
        ((MAX_FRAME + 1).to_bytes(4, "big"), MAX_FRAME),
        (b"\x00\x00\x01\x01", 256),
    ],
)
def test_an_oversized_length_is_refused_before_the_frame_arrives(
    header: bytes, max_frame: int
) -> None:
    assert "exceeds" in refused(header, max_frame)


@pytest.mark.parametrize("text", [b"PING\r\n", b"*1\r\n$4\r\nPING\r\n", b"GET / HTTP/1.1\r\n"])
def test_a_client_on_the_bus_port_is_named_as_such(text: bytes) -> None:
    # Plain RESP or HTTP sent to the bus port read as a huge length
    # ("PING" is 1346981447): the error says what it probably is.
    error = refused(text, MAX_FRAME)
    assert "exceeds" in error and "a client on the bus port?" in error


def test_a_frame_at_the_limit_is_accepted() -> None:
    frame = encode_frame(GotJob(JOB_ID))
    assert decode_all([frame], max_frame=len(frame) - 4) == [GotJob(JOB_ID)]
    assert "exceeds" in refused(frame, max_frame=len(frame) - 5)


def test_errors_are_sticky() -> None:
    decoder = FrameDecoder()
    decoder.feed(packed([42, []]) + encode_frame(GotJob(JOB_ID)))
    with pytest.raises(BusError, match="unknown message type") as first:
        decoder.next_message()
    decoder.feed(encode_frame(GotJob(JOB_ID)))
    with pytest.raises(BusError) as again:
        decoder.next_message()
    assert again.value is first.value


@pytest.mark.parametrize("max_frame", [0, -1, bus.MAX_FRAME_LIMIT + 1])
def test_max_frame_must_be_sensible(max_frame: int) -> None:
    with pytest.raises(ValueError, match="max_frame"):
        FrameDecoder(max_frame)


# --------------------------------------------------------------------------
# Messages that cannot be encoded
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: NeedJobs("\ud800", 1), "cannot encode NEEDJOBS"),  # not from surrogateescape
        (lambda: SetAck(JOB_ID, 2**64), "cannot encode SETACK"),
        (lambda: ReplJob(attrs.evolve(JOB, body=bytes(300))), "exceeds 256"),
        (lambda: "PING", "not a bus message"),
    ],
)
def test_encode_errors(make: Callable[[], Any], error: str) -> None:
    with pytest.raises(BusError, match=error):
        encode_frame(make(), max_frame=256)


# --------------------------------------------------------------------------
# Fuzzing: nothing but messages, None or BusError
# --------------------------------------------------------------------------


def outcome(chunks: Iterable[bytes]) -> list[Message | BusError]:
    decoder = FrameDecoder(max_frame=1 << 16)
    out: list[Message | BusError] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (msg := decoder.next_message()) is not None:
                out.append(msg)
    except BusError as exc:
        out.append(exc)
    return out


@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_random_bytes(chunks: list[bytes]) -> None:
    outcome(chunks)


msgpack_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), U64),
        st.floats(),
        st.binary(max_size=48),
        st.text(max_size=48),
        st.sampled_from([NODE.encode(), JOB_ID.encode()]),
    ),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=40,
)


@given(st.sampled_from(list(MsgType)), msgpack_values, st.lists(st.integers(0, 4096)))
def test_fuzz_well_framed_random_values(code: int, body: Any, cuts: list[int]) -> None:
    # A known type code with any body reaches the field hooks, not just msgpack.
    result = outcome(chunked(packed([code, body]), cuts))
    assert len(result) <= 1 or code == MsgType.BATCH
    if result and not isinstance(result[0], BusError):
        assert decode_all([encode_frame(result[0])]) == result


@given(messages, st.data())
def test_fuzz_corrupted_frames(msg: Message, data: st.DataObject) -> None:
    frame = bytearray(encode_frame(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    outcome([bytes(frame)])


# Each wire rule's edges: ints, ports and seconds just in and out of range,
# node and job IDs a byte short or long, in the wrong case or alphabet, and
# values of the wrong msgpack type.
EDGES: list[Any] = [
    None,
    True,
    False,
    1.0,
    "x",
    b"",
    -1,
    0,
    0xFFFF,
    0x10000,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    NODE.encode(),
    NODE.upper().encode(),
    NODE.encode()[:39],
    NODE.encode() + b"0",
    b"g" * 40,
    JOB_ID.encode(),
    JOB_ID.encode()[:39],
    JOB_ID.encode() + b"x",
    "é".encode() * 20,
    (),
    (1,),
    (NODE.encode(),),
]


def variants(value: Any) -> Iterator[Any]:
    """``value`` (msgpack arrays as tuples) with one position changed: any
    leaf or array replaced by each edge value, any array item dropped or
    doubled, at any depth."""
    yield from EDGES
    if type(value) is tuple:
        for index, item in enumerate(value):
            head, tail = value[:index], value[index + 1 :]
            yield head + tail
            yield (*head, item, item, *tail)
            for changed in variants(item):
                yield (*head, changed, *tail)


def structured(hook: Any, body: Any, cl: Any) -> Any:
    try:
        return hook(body, cl)
    except BusError as exc:
        return ("BusError", str(exc))


@settings(deadline=None)  # a YOURJOBS of four jobs has thousands of variants
@given(messages)
def test_generated_decoders_agree_with_the_checking_hooks(msg: Message) -> None:
    # Each message class's generated hook checks every field inline and calls
    # its checking hook on anything it does not accept: on the good body and
    # on every body one change away, both give the same message or the same
    # error text.
    _, body = msgpack.unpackb(encode_frame(msg)[4:], use_list=False, raw=False)
    cl = type(msg)
    generated = bus._CONVERTER.get_structure_hook(cl)
    assert generated is not bus._CHECKING[cl]
    assert generated(body, cl) == msg
    for changed in variants(body):
        assert structured(generated, changed, cl) == structured(bus._CHECKING[cl], changed, cl)


def test_handshake_proofs_bind_secret_role_nonces_and_ids() -> None:
    connector = Handshake(NODE, "10.0.0.1", 7711, 17711, b"c" * 16)
    acceptor = Handshake("f" * 40, "10.0.0.2", 7712, 17712, b"a" * 16)
    proof = bus.handshake_proof(b"secret", b"connector", connector, acceptor)
    assert len(proof) == 32
    assert bus.handshake_proof(b"", b"connector", connector, acceptor) == b""
    others = [
        bus.handshake_proof(b"secreT", b"connector", connector, acceptor),
        bus.handshake_proof(b"secret", b"acceptor", connector, acceptor),
        bus.handshake_proof(b"secret", b"connector", attrs.evolve(connector, nonce=b"d" * 16), acceptor),
        bus.handshake_proof(b"secret", b"connector", connector, attrs.evolve(acceptor, nonce=b"b" * 16)),
        bus.handshake_proof(b"secret", b"connector", attrs.evolve(connector, node_id="e" * 40), acceptor),
    ]  # fmt: skip
    assert proof not in others and len(set(others)) == len(others)


def test_two_nodes_speak_the_highest_version_both_know() -> None:
    assert bus.negotiate(4) == 4
    assert bus.negotiate(3) == 3  # a node of the release before
    assert bus.negotiate(11) == PROTOCOL_VERSION  # a newer one speaks ours
    assert bus.negotiate(2) is None and bus.negotiate(0) is None
    assert bus.negotiate(4, mine=3) == 3
    assert bus.SINCE_VERSION[Postpone] == 4 and bus.MIN_PROTOCOL_VERSION == 3
    # 5: the cluster dashboard's questions and answers.
    for cl in (GetStats, NodeStats, FindJob, JobCopy):
        assert bus.SINCE_VERSION[cl] == 5
    # 6: REFUSED, what an ADDJOB answered -NOREPL tells its copies.
    assert bus.SINCE_VERSION[Refused] == 6
    # 7: a POSTPONE relayed by a holder (a flag, no new message).
    assert bus.RELAY_VERSION == 7
    # 8: HAVEJOBS, and the sender's incarnation in a heartbeat's flags.
    assert bus.SINCE_VERSION[HaveJobs] == bus.HAVEJOBS_VERSION == 8
    # 9: PUBLISH, a client's pub/sub message for the other nodes' subscribers.
    assert bus.SINCE_VERSION[Publish] == bus.PUBLISH_VERSION == 9
    # 10: NODEFIGURES, GETSTATS answered with the job census.
    assert bus.SINCE_VERSION[NodeFigures] == bus.FIGURES_VERSION == 10 == PROTOCOL_VERSION


def test_the_dashboard_messages_refuse_what_they_cannot_carry() -> None:
    """A job ID of the wrong shape or a negative count closes the link, as
    for the job messages; a queue name is any bytes."""
    copy = JobCopy(1, JOB_ID, "queued", "", "q\udcff", 0, 1, 500, 60, (NODE,))
    assert decode_all([encode_frame(copy)]) == [copy]
    body = wire_body(copy)
    body[1] = b"D-short"
    assert "job ID" in refused(packed([JobCopy.TYPE, body]))
    stats = NodeStats(1, 5, 100, 1, 0, 2, 0, 0, 0, 1, (QueueLength("q", 2),), 0, "off", 0)
    body = wire_body(stats)
    body[5] = -1
    assert refused(packed([NodeStats.TYPE, body]))
    figures = NodeFigures(stats, 3, (QueueRequeue("q\udcff", 2, 500),), 0)
    assert decode_all([encode_frame(figures)]) == [figures]
    body = wire_body(figures)
    body[2] = [[b"q", -2, 500]]
    assert "requeue" in refused(packed([NodeFigures.TYPE, body]))
