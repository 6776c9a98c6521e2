"""The pub/sub hub (server/pubsub.py) without sockets: who receives what,
in which order, within which limits."""

from __future__ import annotations

import trio
from hypothesis import given
from hypothesis import strategies as st

from disque_trio.protocol.replies import Push
from disque_trio.protocol.resp import encode
from disque_trio.server.client import Client, Subscriber
from disque_trio.server.pubsub import PubSub


def make_client(client_id: int, proto: int = 2) -> Client:
    client = Client(client_id, f"127.0.0.1:{client_id}", "127.0.0.1:7711", 0, "normal")
    client.proto = proto
    client.cancel_scope = trio.CancelScope()
    return client


def outbox(sub: Subscriber) -> bytes:
    return b"".join(sub.outbox)


def test_channels_and_patterns_receive_and_count() -> None:
    hub = PubSub()
    a, b = hub.subscriber(make_client(1)), hub.subscriber(make_client(2, proto=3))
    hub.subscribe(a, b"news")
    hub.psubscribe(a, b"n*")
    hub.psubscribe(b, b"N*")  # patterns are case-sensitive, as in Redis
    hub.psubscribe(b, b"n?ws")
    assert hub.deliver(b"news", b"hi") == 3
    assert outbox(a) == encode(Push(("message", b"news", b"hi"))) + encode(
        Push(("pmessage", b"n*", b"news", b"hi"))
    )
    assert outbox(b) == b">4\r\n$8\r\npmessage\r\n$4\r\nn?ws\r\n$4\r\nnews\r\n$2\r\nhi\r\n"
    assert hub.deliver(b"\xff\x00", b"") == 0
    assert hub.delivered == 3


def test_messages_wait_behind_the_confirmations_of_their_batch() -> None:
    hub = PubSub()
    sub = hub.subscriber(make_client(1))
    sub.hold = True  # SUBSCRIBE ran; its batch is not committed yet
    hub.subscribe(sub, b"c")
    hub.deliver(b"c", b"early")
    assert not sub.outbox and sub.size > 0
    hub.release(sub, b"<replies>")
    assert outbox(sub) == b"<replies>" + encode(Push(("message", b"c", b"early")))
    assert sub.size == len(outbox(sub)) and sub.wake.is_set()


def test_hard_limit_drops_the_subscriber_only() -> None:
    hub = PubSub()
    hub.hard = 1000
    slow = hub.subscriber(make_client(1))
    fine = hub.subscriber(make_client(2))
    for sub in (slow, fine):
        hub.subscribe(sub, b"c")
    for _ in range(30):
        hub.deliver(b"c", b"x" * 40)
        hub.written(fine, fine.size)  # this one keeps up
    assert slow.dropped and slow.client.cancel_scope is not None
    assert slow.client.cancel_scope.cancel_called
    assert not fine.dropped and hub.dropped_clients == 1
    assert slow.size == 0 and not slow.outbox  # its memory is given back


def test_soft_limit_drops_only_after_its_seconds() -> None:
    hub = PubSub()
    clock = [0.0]
    hub.now = lambda: clock[0]
    hub.soft, hub.soft_seconds = 100, 5
    sub = hub.subscriber(make_client(1))
    hub.subscribe(sub, b"c")
    hub.deliver(b"c", b"x" * 200)
    clock[0] = 4.9
    hub.deliver(b"c", b"y")
    assert not sub.dropped
    hub.written(sub, sub.size)  # it caught up: the clock restarts
    hub.deliver(b"c", b"x" * 200)
    clock[0] = 9.0
    hub.deliver(b"c", b"y")
    assert not sub.dropped
    clock[0] = 9.9
    hub.deliver(b"c", b"y")
    assert sub.dropped


def test_a_connection_that_ends_leaves_nothing_behind() -> None:
    hub = PubSub()
    client = make_client(1)
    sub = hub.subscriber(client)
    hub.subscribe(sub, b"a")
    hub.psubscribe(sub, b"*")
    hub.deliver(b"a", b"m")
    hub.drop(client)
    assert hub.channels == {} and hub.patterns == {} and hub.subscribers == {}
    assert hub.buffered() == 0


names = st.sampled_from([b"a", b"b", b"c*", b"?"])
actions = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["sub", "unsub", "psub", "punsub"]), names),
    max_size=40,
)


@given(actions)
def test_the_index_matches_every_subscriber(steps: list[tuple[int, str, bytes]]) -> None:
    """Whatever the order of (un)subscriptions, the hub's channel and pattern
    index lists exactly the subscriptions each subscriber has, and a
    message reaches each subscription once."""
    hub = PubSub()
    subs = [hub.subscriber(make_client(i)) for i in range(4)]
    for who, action, name in steps:
        sub = subs[who]
        {
            "sub": hub.subscribe,
            "unsub": hub.unsubscribe,
            "psub": hub.psubscribe,
            "punsub": hub.punsubscribe,
        }[action](sub, name)
    for channel, by_client in hub.channels.items():
        assert by_client and all(channel in s.channels for s in by_client.values())
    for pattern, (_, by_client) in hub.patterns.items():
        assert by_client and all(pattern in s.patterns for s in by_client.values())
    for s in subs:
        assert all(s.client.id in hub.channels[c] for c in s.channels)
        assert all(s.client.id in hub.patterns[p][1] for p in s.patterns)
    expected = sum(b"a" in s.channels for s in subs)
    expected += sum(1 for s in subs for p in s.patterns if p in (b"a", b"?"))
    assert hub.deliver(b"a", b"m") == expected


# --------------------------------------------------------------------------
# The client's sans-I/O side (disque_trio.client.pubsub)
# --------------------------------------------------------------------------


def test_subscriber_protocol_reads_messages_and_eats_confirmations() -> None:
    from disque_trio.client.pubsub import Message, SubscriberProtocol

    proto = SubscriberProtocol()
    assert proto.subscribe("a", "b") == encode([b"SUBSCRIBE", b"a", b"b"])
    assert proto.psubscribe("n*") == encode([b"PSUBSCRIBE", b"n*"])
    wire = b"".join(
        encode(Push(p), proto)
        for p, proto in [
            (("subscribe", b"a", 1), 2),
            (("subscribe", b"b", 2), 3),
            (("message", b"a", b"x"), 2),
            (("pmessage", b"n*", b"news", b"\xff"), 3),
            (("pong", b""), 2),
        ]
    )
    for cut in range(1, len(wire)):  # any split of the bytes gives the same
        proto2 = SubscriberProtocol()
        proto2.receive_data(wire[:cut])
        got = []
        while (m := proto2.next_message()) is not None:
            got.append(m)
        proto2.receive_data(wire[cut:])
        while (m := proto2.next_message()) is not None:
            got.append(m)
        assert got == [Message("a", b"x"), Message("news", b"\xff", "n*")]
    # A new connection subscribes to what was asked, minus what was dropped.
    proto.unsubscribe("a")
    assert proto.resubscribe() == encode([b"SUBSCRIBE", b"b"]) + encode([b"PSUBSCRIBE", b"n*"])


def test_subscriber_protocol_raises_error_replies() -> None:
    import pytest

    from disque_trio.client.errors import AuthenticationError, ProtocolViolationError
    from disque_trio.client.pubsub import SubscriberProtocol

    proto = SubscriberProtocol()
    proto.receive_data(b"-NOAUTH Authentication required.\r\n")
    with pytest.raises(AuthenticationError):
        proto.next_message()
    proto = SubscriberProtocol()
    proto.receive_data(b":1\r\n")
    with pytest.raises(ProtocolViolationError):
        proto.next_message()
