"""server/sockio: Trio's SocketStream semantics, without its wrapper."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from disque_trio.server.sockio import receive_some, send_all


def _pair() -> tuple[trio.SocketStream, socket.socket]:
    a, b = socket.socketpair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(a)), b


async def _runs_meanwhile(op: object) -> bool:
    """Whether another task got a turn while ``op`` (an awaitable) ran."""
    ran: list[bool] = []

    async def other() -> None:
        ran.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await op  # type: ignore[misc]
        meanwhile = bool(ran)
    return meanwhile


async def test_a_write_the_kernel_takes_does_not_yield() -> None:
    stream, peer = _pair()
    assert not await _runs_meanwhile(send_all(stream, b"+OK\r\n"))
    assert peer.recv(100) == b"+OK\r\n"
    await stream.aclose()
    peer.close()


async def test_a_read_of_data_already_there_still_yields_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A connection that always has input still lets others run: the read
    # ends with a checkpoint, as Trio's does.
    stream, peer = _pair()
    peer.sendall(b"PING\r\n")
    yields: list[None] = []
    real = trio.lowlevel.cancel_shielded_checkpoint

    async def counted() -> None:
        yields.append(None)
        await real()

    monkeypatch.setattr(trio.lowlevel, "cancel_shielded_checkpoint", counted)
    assert await receive_some(stream, 100) == b"PING\r\n"
    assert len(yields) == 1
    await stream.aclose()
    peer.close()


async def test_a_read_waits_for_data_and_sees_the_end() -> None:
    stream, peer = _pair()

    async def later() -> None:
        await trio.sleep(0.05)
        peer.sendall(b"late")
        await trio.sleep(0.05)
        peer.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await receive_some(stream, 100) == b"late"
        assert await receive_some(stream, 100) == b""
    await stream.aclose()


async def test_the_rest_of_a_partial_write_waits_for_the_reader() -> None:
    stream, peer = _pair()
    data = bytes(range(256)) * 40_000  # 10 MB: far more than a socket buffer
    received = bytearray()

    def drain() -> None:
        while len(received) < len(data):
            received.extend(peer.recv(1 << 20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, drain)
        await send_all(stream, data)
    assert received == data
    await stream.aclose()
    peer.close()


async def test_a_cancelled_task_neither_writes_nor_reads() -> None:
    # (A SHUTDOWN cancels its client's connection before the reply, which
    # must not go out; Trio's send_all behaves so.)
    stream, peer = _pair()
    peer.sendall(b"input")
    with trio.CancelScope() as scope:
        scope.cancel()
        await send_all(stream, b"+OK\r\n")
    assert scope.cancelled_caught
    with trio.CancelScope() as scope:
        scope.cancel()
        await receive_some(stream, 100)
    assert scope.cancelled_caught
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(100)
    assert await receive_some(stream, 100) == b"input"  # still there
    await stream.aclose()
    peer.close()


async def test_a_closed_stream_raises_closed_resource_error() -> None:
    stream, peer = _pair()
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await send_all(stream, b"x")
    with pytest.raises(trio.ClosedResourceError):
        await receive_some(stream, 10)
    peer.close()


async def test_a_peer_gone_raises_broken_resource_error() -> None:
    stream, peer = _pair()
    peer.close()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(10):  # the first write may still be accepted
            await send_all(stream, b"x" * 1000)
    await stream.aclose()


async def test_a_reset_connection_raises_broken_resource_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(server))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # linger 0: RST
    with pytest.raises(trio.BrokenResourceError):
        await receive_some(stream, 10)
    await stream.aclose()
    listener.close()


async def test_other_streams_use_their_own_methods() -> None:
    left, right = trio.testing.memory_stream_pair()
    await send_all(left, b"hello")
    assert await receive_some(right, 10) == b"hello"


async def test_a_read_expected_to_block_waits_before_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # wait_first: no read that fails first; the data, there already or
    # arriving later, is read once the descriptor is readable.
    import disque_trio.server.sockio as sockio

    stream, peer = _pair()
    calls: list[str] = []
    real_read, real_wait = sockio.os.read, trio.lowlevel.wait_readable

    def read(fd: int, n: int) -> bytes:
        calls.append("read")
        return real_read(fd, n)

    async def wait(fd: int) -> None:
        calls.append("wait")
        await real_wait(fd)

    monkeypatch.setattr(sockio.os, "read", read)
    monkeypatch.setattr(trio.lowlevel, "wait_readable", wait)
    peer.sendall(b"PING\r\n")
    assert await receive_some(stream, 100, wait_first=True) == b"PING\r\n"
    assert calls == ["wait", "read"]

    async def later() -> None:
        await trio.sleep(0.05)
        peer.sendall(b"late")

    calls.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await receive_some(stream, 100, wait_first=True) == b"late"
    assert calls == ["wait", "read"]
    await stream.aclose()
    peer.close()
