"""The pure parts of the web port's hardening: which errors a peer can cause,
the Host allow-list, WebSocket keys, and choosing the queues /metrics lists."""

from __future__ import annotations

import logging
import random
from typing import Any

import h11
import pytest
import trio
import trio.testing
import trio_websocket
import wsproto.utilities

from disque_trio.server import metrics, web
from disque_trio.server.http import HttpConnection, HttpError
from disque_trio.server.websocket import Hub

# ------------------------------------------------------ connection errors


@pytest.mark.parametrize(
    "error",
    [
        HttpError(400, "bad"),
        h11.RemoteProtocolError("bad", 400),
        trio.BrokenResourceError(),
        trio.ClosedResourceError(),
        ConnectionResetError(),
        BrokenPipeError(),
        trio_websocket.HandshakeError(),
        wsproto.utilities.LocalProtocolError("Event Pong cannot be sent in state LOCAL_CLOSING"),
    ],
)
def test_what_a_peer_causes_is_not_a_bug(error: Exception) -> None:
    assert web._unexpected(error) is None
    assert web._unexpected(ExceptionGroup("nursery", [error, trio.BrokenResourceError()])) is None


def test_bugs_are_told_apart_even_inside_groups() -> None:
    bug = KeyError("oops")
    assert web._unexpected(bug) is bug
    assert web._unexpected(h11.LocalProtocolError("our own mistake")) is not None
    grouped = ExceptionGroup("nursery", [trio.BrokenResourceError(), bug])
    rest = web._unexpected(grouped)
    assert isinstance(rest, ExceptionGroup) and rest.exceptions == (bug,)
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [OSError(), ValueError()])])
    assert web._unexpected(nested) is not None


class BrokenView:
    def __init__(self) -> None:
        self.calls = 0

    def nodes(self) -> list[dict[str, Any]]:
        self.calls += 1
        raise RuntimeError("a bug in a snapshot")


async def test_a_bug_in_periodic_events_is_logged_not_fatal(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    view = BrokenView()
    # _tick reads only the view (nobody watches the cluster topic)
    hub = Hub(None, view, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="disque_trio.web"):
        with trio.move_on_after(25.5):
            await hub.run()
    assert view.calls == 25  # it went on, once a second
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # At most one report every 10 s, the later ones counting those held back.
    assert len(errors) == 3 and errors[0].exc_info is not None
    assert "more like it" in errors[1].getMessage()


# ------------------------------------------------------------ timeouts


async def _read_one(
    sent: bytes, idle_s: float = 60.0, request_s: float = 20.0
) -> tuple[h11.Request | HttpError | None, float]:
    """next_request on a stream the peer wrote ``sent`` to and then went
    quiet: what it returned or raised, and when."""
    ours, theirs = trio.testing.memory_stream_pair()
    if sent:
        await theirs.send_all(sent)
    http = HttpConnection(ours)
    started = trio.current_time()
    try:
        result: h11.Request | HttpError | None = await http.next_request(idle_s, request_s)
    except HttpError as e:
        result = e
    return result, trio.current_time() - started


async def test_an_idle_connection_ends_quietly(autojump_clock: trio.testing.MockClock) -> None:
    result, took = await _read_one(b"")
    assert result is None and took == 60.0


async def test_a_request_trickled_too_slowly_gets_408(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result, took = await _read_one(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert isinstance(result, HttpError) and result.status == 408 and took == 20.0
    # A body that stops short, the same.
    result, took = await _read_one(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
    assert isinstance(result, HttpError) and result.status == 408 and took == 20.0


async def test_a_complete_request_is_read(autojump_clock: trio.testing.MockClock) -> None:
    result, took = await _read_one(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(result, h11.Request) and result.target == b"/healthz" and took == 0


# ------------------------------------------------- queues /metrics lists


class FakeQueue:
    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.length = length

    def __len__(self) -> int:
        return self.length


@pytest.mark.parametrize("limit", [0, 1, 7, 50, 99, 100, 1000])
async def test_choose_queues_keeps_the_longest_in_chunks(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "CHOOSE_CHUNK", 13)
    rng = random.Random(limit)
    queues: list[Any] = [
        FakeQueue(f"q{rng.randrange(10**6)}-{i}", rng.randrange(5)) for i in range(100)
    ]
    chosen, omitted_jobs = await metrics.choose_queues(queues, limit)
    expected = sorted(queues, key=lambda q: (-len(q), q.name))[:limit]
    assert chosen == sorted(expected, key=lambda q: q.name)
    assert omitted_jobs == sum(map(len, queues)) - sum(map(len, expected))


async def test_choosing_among_many_queues_yields_to_other_tasks() -> None:
    queues: list[Any] = [FakeQueue(f"q{i}", i % 7) for i in range(10 * metrics.CHOOSE_CHUNK)]
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()
        before = ticks
        chosen, _ = await metrics.choose_queues(queues, 10)
        # Ten chunks, a yield after each: the other task ran in each of
        # those scheduler passes, but Trio picks the order within a pass at
        # random, so one of its runs may fall just before `before` was read.
        assert ticks - before >= 10 - 1
        nursery.cancel_scope.cancel()
    assert [len(q) for q in chosen] == [6] * 10


# -------------------------------------------------------------- Host


@pytest.mark.parametrize(
    ("host", "binds", "extra", "allowed"),
    [
        (None, ["127.0.0.1"], [], True),  # HTTP/1.0: no browser sends that
        ("127.0.0.1:8711", ["127.0.0.1"], [], True),
        ("localhost:8711", ["127.0.0.1"], [], True),
        ("LocalHost.", ["127.0.0.1"], [], True),
        ("[::1]:8711", ["127.0.0.1"], [], True),
        ("10.1.2.3", ["0.0.0.0"], [], True),  # an address cannot be rebound
        ("rebind.example:8786", ["127.0.0.1"], [], False),
        ("rebind.example:8786", ["0.0.0.0"], [], False),
        ("localhost.rebind.example", ["127.0.0.1"], [], False),
        ("node1.lan:8711", ["node1.lan"], [], True),  # a name given as bind
        ("disque.example", ["0.0.0.0"], ["Disque.Example"], True),
        ("disque.example:443", ["0.0.0.0"], ["disque.example."], True),
        ("other.example", ["0.0.0.0"], ["disque.example"], False),
        ("anything.example", ["127.0.0.1"], ["*"], True),
        ("", ["127.0.0.1"], ["*"], False),  # malformed, even with *
        ("[::1", ["127.0.0.1"], [], False),
        ("a b", ["127.0.0.1"], [], False),
        ("localhost:99999", ["127.0.0.1"], [], False),
        ("user@localhost", ["127.0.0.1"], [], False),
        ("2130706433", ["127.0.0.1"], [], False),  # not an address as browsers write them
    ],
)
def test_host_allowed(host: str | None, binds: list[str], extra: list[str], allowed: bool) -> None:
    assert web.host_allowed(host, binds, extra) is allowed


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("MDEyMzQ1Njc4OWFiY2RlZg==", True),
        (" MDEyMzQ1Njc4OWFiY2RlZg== ", True),
        ("MDEyMzQ1Njc4OWFiY2RlZg", False),  # unpadded
        ("MDEyMzQ1Njc4OWFiY2Rl", False),  # 15 bytes
        ("MDEyMzQ1Njc4OWFiY2RlZmc=", False),  # 17 bytes
        ("!!", False),
        ("", False),
        ("MDEyMzQ1Njc4OWFiY2RlZg==\u00e9", False),
    ],
)
def test_valid_websocket_key(key: str, valid: bool) -> None:
    assert web.valid_websocket_key(key) is valid
