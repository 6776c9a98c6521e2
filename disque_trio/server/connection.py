"""One RESP client connection: read, parse, execute, reply.

The handler task is the only writer of its socket. It reads what is
available, runs every complete command in the buffer, and sends all the
replies of that read in one ``send_all`` (pipelining for free). A command
that must wait (GETJOB on empty queues) flushes the replies before it, then
waits for the core to answer while still reading the socket, so that a client
that disconnects while blocked is noticed at once and no job is handed to a
dead connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..core.waiters import Waiter
from ..protocol.replies import Reply, ReplyError
from ..protocol.resp import ProtocolError, RequestParser, encode_into, make_parser
from .client import Client
from .logs import VERBOSE

if TYPE_CHECKING:
    from .runtime import NodeServer

log = logging.getLogger("disque_trio.client")

READ_SIZE = 64 * 1024
MAX_CLIENTS_ERROR = b"-ERR max number of clients reached\r\n"


class _Disconnected(Exception):
    """The peer closed the connection (or it broke) while we waited."""


_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, _Disconnected)


def _only_disconnects(e: BaseException) -> bool:
    """True for a disconnect, or a group made of nothing else."""
    if isinstance(e, BaseExceptionGroup):
        return all(_only_disconnects(inner) for inner in e.exceptions)
    return isinstance(e, _GONE)


async def serve_client(server: NodeServer, stream: trio.abc.Stream) -> None:
    """Handle one connection until it closes; never raise into the server."""
    async with stream:
        client = server.new_client(stream)
        if client is None:
            await _try_send(stream, MAX_CLIENTS_ERROR)
            return
        log.log(VERBOSE, "Accepted %s", client.addr)
        try:
            with trio.CancelScope() as scope:
                client.cancel_scope = scope
                await _client_loop(server, client, stream)
        except _GONE:
            pass
        except Exception as e:
            # A bug in a command must not take the node down: log it at the
            # boundary of this connection and drop only this client. A
            # disconnect seen by a task of the connection's own nursery
            # arrives wrapped in an ExceptionGroup: not a bug either.
            if not _only_disconnects(e):
                log.exception("client %d: unexpected error, closing the connection", client.id)
        finally:
            server.drop_client(client)
            log.log(VERBOSE, "Connection from %s closed", client.addr)


async def _client_loop(server: NodeServer, client: Client, stream: trio.abc.Stream) -> None:
    parser = make_parser(server.config.proto_max_bulk_len)
    clock = server.env.clock
    out = bytearray()
    while True:
        data = await _receive(server, stream)
        if not data:
            return
        server.stat_net_in += len(data)
        parser.feed(data)
        if _over_query_limit(server, client, parser):
            return
        client.last_ms = clock.wall_ms()
        while True:
            try:
                argv = parser.next_command()
            except ProtocolError as e:
                encode_into(out, ReplyError("ERR", f"Protocol error: {e}"), 2)
                await _flush(server, stream, out)
                return
            if argv is None:
                break
            reply = server.execute(client, argv)
            if isinstance(reply, Waiter):
                # Listen before the first await: the job may reach the waiter
                # while the earlier replies are being sent.
                done = trio.Event()
                reply.notify = done.set
                await _flush(server, stream, out)
                reply = await _wait(server, client, stream, parser, reply, done)
            encode_into(out, reply, client.proto)
            if client.close_after_reply:
                await _flush(server, stream, out)
                return
            if client.monitoring:
                await _flush(server, stream, out)
                await _monitor_loop(server, client, stream)
                return
        client.qbuf = parser.buffered()
        failures = server.aof.write_failures
        server.after_batch()
        if server.aof.write_failures != failures:
            # The AOF records of this batch could not be written: its replies
            # may acknowledge jobs a crash would lose. Send none of them; the
            # client sees the connection drop, and later writes get -MISCONF.
            return
        await _flush(server, stream, out)


async def _receive(server: NodeServer, stream: trio.abc.Stream) -> bytes:
    """The next chunk of input; b"" at EOF or when the client stayed idle
    longer than the ``timeout`` directive (0 = never)."""
    idle = server.config.timeout
    if not idle:
        return bytes(await stream.receive_some(READ_SIZE))
    with trio.move_on_after(idle):
        return bytes(await stream.receive_some(READ_SIZE))
    return b""


async def _flush(server: NodeServer, stream: trio.abc.Stream, out: bytearray) -> None:
    if out:
        server.stat_net_out += len(out)
        data = bytes(out)
        out.clear()
        await stream.send_all(data)


async def _try_send(stream: trio.abc.Stream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _wait(
    server: NodeServer,
    client: Client,
    stream: trio.abc.Stream,
    parser: RequestParser,
    waiter: Waiter,
    done: trio.Event,
) -> Reply:
    """Wait for the core to answer a blocked command, or its timeout."""
    server.after_batch()
    if waiter.done:
        done.set()  # answered already (during the flush before this wait)
    client.blocked = waiter
    timeout = waiter.timeout_ms / 1000 if waiter.timeout_ms else float("inf")
    gone = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                _watch_input, server, client, stream, parser, gone, nursery.cancel_scope
            )
            with trio.move_on_after(timeout):
                await done.wait()
            nursery.cancel_scope.cancel()
    finally:
        client.blocked = None
        timeout_reply = server.node.cancel_wait(waiter)
    if gone.is_set() and not done.is_set():
        raise _Disconnected
    if not done.is_set():
        return timeout_reply
    return waiter.reply


async def _watch_input(
    server: NodeServer,
    client: Client,
    stream: trio.abc.Stream,
    parser: RequestParser,
    gone: trio.Event,
    scope: trio.CancelScope,
) -> None:
    """While blocked, keep reading: buffer pipelined input (up to the query
    buffer limit), notice EOF."""
    try:
        while data := await stream.receive_some(READ_SIZE):
            server.stat_net_in += len(data)
            parser.feed(bytes(data))
            if _over_query_limit(server, client, parser):
                break
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    gone.set()
    scope.cancel()


def _over_query_limit(server: NodeServer, client: Client, parser: RequestParser) -> bool:
    """True (and logged) when the client's unprocessed input passed
    client-query-buffer-limit: it is then disconnected."""
    size = parser.buffered()
    if size <= server.config.client_query_buffer_limit:
        return False
    server.stat_query_buffer_closed += 1
    log.warning(
        "closing client %d (%s): query buffer of %d bytes is over client-query-buffer-limit",
        client.id,
        client.addr,
        size,
    )
    return True


async def _monitor_loop(server: NodeServer, client: Client, stream: trio.abc.Stream) -> None:
    """After MONITOR: stream the command feed; end when the client leaves."""
    send, receive = trio.open_memory_channel[bytes](admin_monitor_buffer())
    server.monitors[client.id] = send
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain_until_eof, stream, nursery.cancel_scope)
        async with receive:
            async for line in receive:
                await stream.send_all(line)
        nursery.cancel_scope.cancel()


async def _drain_until_eof(stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
    while await stream.receive_some(READ_SIZE):
        pass
    scope.cancel()


def admin_monitor_buffer() -> int:
    # A monitor gets every command; 10,000 lines of slack (a few MB at most)
    # absorbs bursts, and a monitor slower than that is disconnected.
    return 10_000
