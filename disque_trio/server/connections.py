"""RESP clients: the listeners, and one connection as a reader and an executor.

:class:`Connections` accepts on the client (and TLS client) listeners with
the shared accept loop (``listen.py``) into a nursery of its own, the
connections nursery, so that shutdown can stop accepting, let the
connections finish what they are doing for a moment, then cancel them.

One connection (:func:`serve_client`) is two tasks:

* the **reader** always reads: it parses what arrives into batches of
  commands and hands each to the executor. Because it never waits for the
  executor, it sees at once a client that disconnects while its command is
  blocked (GETJOB waiting for a job, ADDJOB waiting for replicas), and it
  holds the client to ``client-query-buffer-limit``.
* the **executor** is the socket's only writer: it runs the commands of each
  batch in the core, commits (``NodeServer.commit``: AOF records to the
  writer, messages to peers, wake-ups), waits until the batch's records are
  written when the AOF is on, then sends the batch's replies in one write.
  A blocked command waits on a ``trio.Event`` its waiter's wake-up sets,
  with the command's timeout; no task or nursery per wait.

The memory channel between them counts batches without limit: what bounds
it is the bytes in them, kept under ``client-query-buffer-limit`` with the
parser's own buffer, like Redis' query buffer. (A bound on the count would
make the reader stop reading while the executor waits, and miss the
disconnect of a blocked client.)

Errors of one connection end that connection only (``serve_client`` is its
boundary); a bug is logged with its traceback.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from ..config import Config
from ..core.waiters import Waiter
from ..protocol.replies import Reply, ReplyError
from ..protocol.resp import ProtocolError, encode_into, make_parser
from .client import Client
from .listen import accept_loop
from .logs import VERBOSE

log = logging.getLogger("disque_trio.client")

READ_SIZE = 64 * 1024
MAX_CLIENTS_ERROR = b"-ERR max number of clients reached\r\n"
# A monitor gets every command; 10,000 lines of slack (a few MB at most)
# absorb bursts, and a monitor slower than that is disconnected.
MONITOR_BUFFER = 10_000
DRAIN_S = 1.0  # at shutdown, how long connections may finish what they do


class _Disconnected(Exception):
    """The client went away (or must be dropped) while a command waited."""


_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, _Disconnected)

# A batch: the commands parsed from one read, their size in bytes, and the
# protocol error that ended the input after them, if any.
_Batch = tuple[list[list[bytes]], int, ProtocolError | None]


class ClientHost(Protocol):
    """What a client connection needs of the node (``NodeServer``)."""

    config: Config
    stat_net_in: int
    stat_net_out: int
    stat_query_buffer_closed: int

    def new_client(self, stream: trio.abc.Stream) -> Client | None: ...

    def wall_ms(self) -> int: ...

    def drop_client(self, client: Client) -> None: ...

    def execute(self, client: Client, argv: list[bytes]) -> Reply | Waiter: ...

    def cancel_wait(self, waiter: Waiter) -> Reply: ...

    def commit(self) -> int:
        """Apply what the core recorded; the AOF sequence number the
        replies must wait for (0: none)."""
        ...

    async def durable(self, seq: int) -> bool:
        """Wait for ``seq`` to be written; False if its write failed."""
        ...

    def monitor_feed(self, client: Client) -> trio.MemoryReceiveChannel[bytes]: ...


def _only_disconnects(e: BaseException) -> bool:
    """True for a disconnect, or a group made of nothing else."""
    if isinstance(e, BaseExceptionGroup):
        return all(_only_disconnects(inner) for inner in e.exceptions)
    return isinstance(e, _GONE)


# --------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------


class Connections:
    """The client ports: accept loops, and the nursery of the connections."""

    def __init__(
        self,
        host: ClientHost,
        tls_accept: Callable[[trio.abc.Stream], Awaitable[trio.abc.Stream | None]],
    ) -> None:
        self.host = host
        self._tls_accept = tls_accept
        self._accepting: trio.CancelScope | None = None
        self._connections: trio.Nursery | None = None

    async def run(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        tls_listeners: list[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as connections:
            self._connections = connections
            async with trio.open_nursery() as accepting:
                self._accepting = accepting.cancel_scope
                for listener in listeners:
                    accepting.start_soon(accept_loop, listener, self._plain, connections, "client")
                for listener in tls_listeners:
                    accepting.start_soon(
                        accept_loop, listener, self._tls, connections, "TLS client"
                    )
                task_status.started()
            # Accepting stopped (shutdown): let the connections finish
            # their replies for a moment, then cancel them.
            connections.cancel_scope.deadline = trio.current_time() + DRAIN_S

    def stop(self) -> None:
        """Shutdown: close the listeners; the connections drain, then end."""
        if self._accepting is not None:
            self._accepting.cancel()
        elif self._connections is not None:
            self._connections.cancel_scope.cancel()

    async def _plain(self, stream: trio.abc.Stream) -> None:
        await serve_client(self.host, stream)

    async def _tls(self, stream: trio.abc.Stream) -> None:
        async with stream:
            secure = await self._tls_accept(stream)
            if secure is not None:
                await serve_client(self.host, secure)


# --------------------------------------------------------------------------
# One connection
# --------------------------------------------------------------------------


async def serve_client(host: ClientHost, stream: trio.abc.Stream) -> None:
    """Handle one connection until it closes; never raise into the server."""
    async with stream:
        client = host.new_client(stream)
        if client is None:
            await _try_send(stream, MAX_CLIENTS_ERROR)
            return
        log.log(VERBOSE, "Accepted %s", client.addr)
        try:
            with trio.CancelScope() as scope:
                client.cancel_scope = scope
                batches, pending = trio.open_memory_channel[_Batch](math.inf)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_reader, host, client, stream, batches)
                    await _executor(host, client, stream, pending)
                    nursery.cancel_scope.cancel()
        except _GONE:
            pass
        except Exception as e:
            # A bug in a command must not take the node down: log it at the
            # boundary of this connection and drop only this client. A
            # disconnect seen by the other task arrives wrapped in an
            # ExceptionGroup: not a bug either.
            if not _only_disconnects(e):
                log.exception("client %d: unexpected error, closing the connection", client.id)
        finally:
            host.drop_client(client)
            log.log(VERBOSE, "Connection from %s closed", client.addr)


async def _reader(
    host: ClientHost,
    client: Client,
    stream: trio.abc.Stream,
    batches: trio.MemorySendChannel[_Batch],
) -> None:
    parser = make_parser(host.config.proto_max_bulk_len)
    try:
        while data := await _receive(host, client, stream):
            host.stat_net_in += len(data)
            client.last_ms = host.wall_ms()
            before = parser.buffered() + len(data)
            parser.feed(data)
            commands: list[list[bytes]] = []
            error = None
            try:
                while (argv := parser.next_command()) is not None:
                    commands.append(argv)
            except ProtocolError as e:
                error = e
            if commands or error is not None:
                used = before - parser.buffered()
                client.queued_bytes += used
                batches.send_nowait((commands, used, error))
            if error is not None:
                return  # the executor answers it, then closes
            client.qbuf = parser.buffered()
            if client.queued_bytes + client.qbuf > host.config.client_query_buffer_limit:
                _over_query_limit(host, client)
                raise _Disconnected
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        batches.close()
    # The end of the input: what was read still runs (its replies may still
    # be read by a half-closed client), but a blocked command is abandoned.
    client.gone = True
    if client.blocked is not None:
        client.blocked.wake()
    if client.monitor_scope is not None:
        client.monitor_scope.cancel()


async def _receive(host: ClientHost, client: Client, stream: trio.abc.Stream) -> bytes:
    """The next chunk of input; b"" at EOF, or when the client stayed idle
    longer than the ``timeout`` directive (0 = never) while not blocked."""
    while True:
        idle = host.config.timeout
        if not idle:
            return bytes(await stream.receive_some(READ_SIZE))
        with trio.move_on_after(idle):
            return bytes(await stream.receive_some(READ_SIZE))
        if client.blocked is None and not client.monitoring:
            return b""


def _over_query_limit(host: ClientHost, client: Client) -> None:
    host.stat_query_buffer_closed += 1
    log.warning(
        "closing client %d (%s): query buffer of %d bytes is over client-query-buffer-limit",
        client.id,
        client.addr,
        client.queued_bytes + client.qbuf,
    )


async def _executor(
    host: ClientHost,
    client: Client,
    stream: trio.abc.Stream,
    pending: trio.MemoryReceiveChannel[_Batch],
) -> None:
    out = bytearray()
    async for batch in pending:
        client.busy = True
        while True:
            commands, used, error = batch
            for argv in commands:
                reply = host.execute(client, argv)
                if isinstance(reply, Waiter):
                    reply = await _wait(host, client, stream, reply, out)
                encode_into(out, reply, client.proto)
                if client.close_after_reply:
                    await _commit_and_send(host, stream, out)
                    return
                if client.monitoring:
                    await _commit_and_send(host, stream, out)
                    await _monitor(host, client, stream)
                    return
            client.queued_bytes -= used
            if error is not None:
                encode_into(out, ReplyError("ERR", f"Protocol error: {error}"), 2)
                await _commit_and_send(host, stream, out)
                return
            # Pipelined input already read: run it before answering, so
            # that the replies go out in one write.
            try:
                batch = pending.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        await _commit_and_send(host, stream, out)
        client.busy = False


async def _commit_and_send(host: ClientHost, stream: trio.abc.Stream, out: bytearray) -> None:
    """The end of a batch: commit, wait for its AOF records, reply."""
    seq = host.commit()
    if seq and not await host.durable(seq):
        # The batch's records could not be written: its replies may
        # acknowledge jobs a crash would lose. Send none of them; the
        # client sees the connection drop, later writes get -MISCONF.
        raise _Disconnected
    if out:
        host.stat_net_out += len(out)
        data = bytes(out)
        out.clear()
        await stream.send_all(data)


async def _wait(
    host: ClientHost, client: Client, stream: trio.abc.Stream, waiter: Waiter, out: bytearray
) -> Reply:
    """A blocked command: send the replies before it, then wait for the
    core's answer (a Wake), the command's timeout, or the client leaving."""
    await _commit_and_send(host, stream, out)
    if not waiter.done and not client.gone:
        woken = trio.Event()
        waiter.wake = woken.set
        client.blocked = waiter
        timeout = waiter.timeout_ms / 1000 if waiter.timeout_ms else math.inf
        try:
            with trio.move_on_after(timeout):
                await woken.wait()
        finally:
            client.blocked = None
    if waiter.done:
        if waiter.durable and not await host.durable(waiter.durable):
            raise _Disconnected  # the reply depends on records not written
        return waiter.reply
    reply = host.cancel_wait(waiter)
    if client.gone:
        raise _Disconnected
    return reply


async def _monitor(host: ClientHost, client: Client, stream: trio.abc.Stream) -> None:
    """After MONITOR: stream the command feed; end when the client leaves
    (the reader cancels the scope) or cannot keep up."""
    feed = host.monitor_feed(client)
    with trio.CancelScope() as scope:
        client.monitor_scope = scope
        if client.gone:
            return
        async with feed:
            async for line in feed:
                await stream.send_all(line)


async def _try_send(stream: trio.abc.Stream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
