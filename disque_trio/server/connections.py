"""RESP clients: the listeners, and one connection as a reader and an executor.

:class:`Connections` accepts on the client (and TLS client) listeners with
the shared accept loop (``listen.py``) into a nursery of its own, the
connections nursery, so that shutdown can stop accepting, let the
connections finish what they are doing for a moment, then cancel them.

One connection (:func:`serve_client`) is an executor, the connection's own
task and the socket's only writer, and a reader:

* the **executor** reads what the client sent, runs every complete command
  in the core, commits (``NodeServer.commit``: AOF records to the writer,
  messages to peers, wake-ups), waits until the records are written when
  the AOF is on, then sends all the replies in one write (pipelining costs
  nothing);
* a blocked command (GETJOB waiting for a job, ADDJOB for its copies) waits
  on a ``trio.Event`` that its waiter's wake-up sets, with the command's
  timeout; no task or nursery per wait, and no deadline either while its
  grace lasts: one timer task per kind of wait ends the graces of them all
  (``grace.py``). If it waits longer than
  ``READER_GRACE_S`` (50 ms for an ADDJOB: ``READER_GRACE_REPL_S``), the
  **reader**, a task started once per connection and
  parked the rest of the time, takes over the input: it keeps pipelined
  commands in the parser (under ``client-query-buffer-limit``) and sees the
  client leave at once, which abandons the command. The executor takes the
  input back when the wait ends (it cancels the reader's turn, which is
  safe for a socket or TLS stream between reads).

Why not a reader that always reads and hands every batch to the executor
over a channel: measured side by side, the extra task switch per request
made single-node ADDJOB and GETJOB at -P 1 17 % slower, and most commands
never block, while those that do mostly wait less than the grace period.

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
from .client import Client, Subscriber
from .grace import Grace
from .listen import accept_loop
from .logs import VERBOSE
from .pubsub import PubSub, Several
from .sockio import receive_some, send_all

log = logging.getLogger("disque_trio.client")

READ_SIZE = 64 * 1024
MAX_CLIENTS_ERROR = b"-ERR max number of clients reached\r\n"
# A monitor gets every command; 10,000 lines of slack (a few MB at most)
# absorb bursts, and a monitor slower than that is disconnected.
MONITOR_BUFFER = 10_000
DRAIN_S = 1.0  # at shutdown, how long connections may finish what they do
# A blocked command waits this long before its reader takes over the input
# (handing the socket over and back costs three task switches and an epoll
# registration): a GETJOB on an empty queue sees its client leave within a
# few milliseconds, before a job is handed to a consumer that is gone.
READER_GRACE_S = 0.005
# A synchronous ADDJOB waits longer: its copies come within a few ms when
# idle, but in tens of ms under load, when the reader's turns took 11 % of
# the origin's time (REPLICATE 3, 50 clients). A client that leaves in its
# first 50 ms is noticed when the wait ends: its job then exists, as if it
# had left just after the reply.
READER_GRACE_REPL_S = 0.05


class _Disconnected(Exception):
    """The client went away (or must be dropped) while a command waited."""


_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, _Disconnected)

# A batch: the commands parsed from one read, their size in bytes, and the
# protocol error that ended the input after them, if any.
_Batch = tuple[list[list[bytes]], int, ProtocolError | None]


class ClientHost(Protocol):
    """What a client connection needs of the node (``NodeServer``)."""

    config: Config
    pubsub: PubSub
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
        # The grace periods' timers (grace.py): a blocked GETJOB's, and a
        # synchronous ADDJOB's.
        self.graces = _Graces(Grace(READER_GRACE_S), Grace(READER_GRACE_REPL_S))

    async def run(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        tls_listeners: list[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as timers:
            # Outside the connections' nursery: they rely on the timers
            # until the last one ends.
            timers.start_soon(self.graces.short.run)
            timers.start_soon(self.graces.repl.run)
            await self._serve(listeners, tls_listeners, task_status)
            timers.cancel_scope.cancel()

    async def _serve(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        tls_listeners: list[trio.abc.Listener[trio.abc.Stream]],
        task_status: trio.TaskStatus[None],
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
        await serve_client(self.host, stream, self.graces)

    async def _tls(self, stream: trio.abc.Stream) -> None:
        async with stream:
            secure = await self._tls_accept(stream)
            if secure is not None:
                await serve_client(self.host, secure, self.graces)


# --------------------------------------------------------------------------
# One connection
# --------------------------------------------------------------------------


class _Graces:
    """The grace timers a connection's waits use."""

    def __init__(self, short: Grace, repl: Grace) -> None:
        self.short = short  # a blocked command's (READER_GRACE_S)
        self.repl = repl  # a synchronous ADDJOB's (READER_GRACE_REPL_S)


async def serve_client(
    host: ClientHost, stream: trio.abc.Stream, graces: _Graces | None = None
) -> None:
    """Handle one connection until it closes; never raise into the server.
    Without ``graces`` (a connection served on its own, in tests), each
    wait's grace has a deadline of its own."""
    async with stream:
        client = host.new_client(stream)
        if client is None:
            await _try_send(stream, MAX_CLIENTS_ERROR)
            return
        log.log(VERBOSE, "Accepted %s", client.addr)
        try:
            with trio.CancelScope() as scope:
                client.cancel_scope = scope
                connection = _Connection(host, client, stream, graces)
                async with trio.open_nursery() as nursery:
                    connection.nursery = nursery
                    nursery.start_soon(connection.reader)
                    await connection.executor()
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


class _Connection:
    """One client: the executor (the connection's own task) and its reader."""

    def __init__(
        self, host: ClientHost, client: Client, stream: trio.abc.Stream, graces: _Graces | None
    ) -> None:
        self.host = host
        self.graces = graces
        self.client = client
        self.stream = stream
        self.parser = make_parser(host.config.proto_max_bulk_len)
        self.out = bytearray()
        # The reader's turns: set to start one (the executor waits), and the
        # scope the executor cancels to end it; parked is set when it ended.
        self._turn = trio.Event()
        self._turn_scope = trio.CancelScope()
        self._parked = trio.Event()
        self._parked.set()
        # Once the client subscribed (pubsub.py), a pump task writes its
        # outbox, where its replies go too; the lock keeps the pump and a
        # last flush at the end from writing at once.
        self.nursery: trio.Nursery | None = None
        self._pump_started = False
        self._write_lock = trio.Lock()

    # ------------------------------------------------------------ executor

    async def executor(self) -> None:
        host, client, parser = self.host, self.client, self.parser
        answered = False
        while data := await self._receive(answered):
            host.stat_net_in += len(data)
            client.last_ms = host.wall_ms()
            parser.feed(data)
            self._check_query_limit()
            client.busy = True
            await self._run_buffered()
            client.busy = False
            client.qbuf = parser.buffered()
            # Everything it sent is answered: a client mostly waits for its
            # replies before it sends more, so the next read waits first.
            answered = not client.qbuf

    async def _run_buffered(self) -> None:
        """Run every complete command read so far (pipelining), then commit
        and send all the replies in one write.

        A run of pipelined ADDJOBs replicates together: an ADDJOB waiting
        for its copies does not hold up the ADDJOBs right behind it, which
        start their own replication at once (one commit sends all their
        REPLJOBs); their replies still go out in order, each once its own
        wait ends. Any other command first waits for the run to finish, so
        it sees what a client executing one command at a time would."""
        host, client, out = self.host, self.client, self.out
        run: list[Reply | Waiter] = []  # ADDJOB replies of the current run
        while True:
            try:
                argv = self.parser.next_command()
            except ProtocolError as e:
                await self._settle(run)
                encode_into(out, ReplyError("ERR", f"Protocol error: {e}"), 2)
                await self._commit_and_send()
                await self._flush_outbox()
                raise _Disconnected from None
            if argv is None:
                if await self._settle_at_end(run):
                    continue
                break
            if run and argv[0].upper() != b"ADDJOB":
                await self._settle(run)
            reply = host.execute(client, argv)
            if run or (isinstance(reply, Waiter) and reply.job_id is not None):
                run.append(reply)  # an ADDJOB: waiting for its copies, or after one
                continue
            if isinstance(reply, Waiter):
                reply = await self._wait(reply)
            if type(reply) is Several:
                for each in reply:
                    encode_into(out, each, client.proto)
            else:
                encode_into(out, reply, client.proto)
            if client.close_after_reply:
                await self._commit_and_send()
                await self._flush_outbox()
                raise _Disconnected
            if client.monitoring:
                await self._commit_and_send()
                await self._monitor()
                raise _Disconnected
        await self._commit_and_send()

    async def _settle_at_end(self, run: list[Reply | Waiter]) -> bool:
        """The input read so far is used up: settle the run, if any. True
        when there was one: while it waited, its reader may have read more
        commands (past the grace), which must run now, not wait for input
        that a client waiting for these replies will never send."""
        if not run:
            return False
        await self._settle(run)
        return True

    async def _settle(self, run: list[Reply | Waiter]) -> None:
        """Wait for each reply of a run of ADDJOBs in order, and encode it.
        If the wait ends early (the client left, shutdown), the ADDJOBs
        still waiting give up as at their timeout."""
        done = 0
        try:
            for reply in run:
                if isinstance(reply, Waiter):
                    reply = await self._wait(reply)
                encode_into(self.out, reply, self.client.proto)
                done += 1
        except BaseException:
            for left in run[done:]:
                if isinstance(left, Waiter) and not left.done:
                    self.host.cancel_wait(left)
            raise
        finally:
            run.clear()

    async def _receive(self, wait_first: bool) -> bytes:
        """The next chunk of input; b"" at EOF, or when the client stayed
        idle longer than the ``timeout`` directive (0 = never)."""
        idle = self.host.config.timeout
        if not idle:
            return await receive_some(self.stream, READ_SIZE, wait_first)
        with trio.move_on_after(idle):
            return await receive_some(self.stream, READ_SIZE, wait_first)
        return b""

    async def _commit_and_send(self) -> None:
        """The end of a batch: commit, wait for its AOF records, reply."""
        host, out = self.host, self.out
        seq = host.commit()
        if seq and not await host.durable(seq):
            # The batch's records could not be written: its replies may
            # acknowledge jobs a crash would lose. Send none of them; the
            # client sees the connection drop, later writes get -MISCONF.
            raise _Disconnected
        sub = self.client.pubsub
        if sub is not None:
            # A subscriber: the replies join its messages, in order.
            host.pubsub.release(sub, bytes(out))
            out.clear()
            if not self._pump_started and self.nursery is not None:
                self._pump_started = True
                self.nursery.start_soon(self._pump, sub)
            return
        if out:
            host.stat_net_out += len(out)
            data = bytes(out)
            out.clear()
            await send_all(self.stream, data)

    async def _pump(self, sub: Subscriber) -> None:
        """A subscriber's writer: the outbox to the socket, as it fills.
        Reading goes on meanwhile (the executor), so a subscriber may
        (un)subscribe at any time; one that does not read what it is sent
        fills its outbox until pubsub-output-buffer-limit drops it."""
        host = self.host
        while True:
            if not sub.outbox:
                sub.wake = trio.Event()
                await sub.wake.wait()
                continue
            async with self._write_lock:
                data = sub.take()
                host.stat_net_out += len(data)
                await send_all(self.stream, data)
                host.pubsub.written(sub, len(data))

    async def _flush_outbox(self) -> None:
        """Before the connection closes (QUIT, a protocol error): what the
        outbox holds, the last reply among it, is written."""
        sub = self.client.pubsub
        if sub is None or not sub.outbox:
            return
        async with self._write_lock:
            while sub.outbox:
                data = sub.take()
                self.host.stat_net_out += len(data)
                await send_all(self.stream, data)
                self.host.pubsub.written(sub, len(data))

    async def _wait(self, waiter: Waiter) -> Reply:
        """A blocked command: send the replies before it, then wait for the
        core's answer (a Wake), the command's timeout, or the client
        leaving. Most waits are short (a synchronous ADDJOB's copies): only
        one that lasts past its grace (READER_GRACE_S, READER_GRACE_REPL_S)
        hands the reading to the reader, so that a disconnect is still seen
        at once. A waiter already done (an ADDJOB of a pipelined run whose
        copies came back while the run's first one waited) waits for
        nothing: its reply joins the others, sent in the batch's one write."""
        host, client = self.host, self.client
        if not waiter.done:
            await self._commit_and_send()
        if not waiter.done and not client.gone:
            client.blocked = waiter
            try:
                await self._wait_blocked(waiter)
            finally:
                client.blocked = None
        self._check_query_limit()
        if waiter.done:
            if waiter.durable and not await host.durable(waiter.durable):
                raise _Disconnected  # the reply depends on records not written
            return waiter.reply
        reply = host.cancel_wait(waiter)
        if client.gone:
            raise _Disconnected
        return reply

    async def _wait_blocked(self, waiter: Waiter) -> None:
        """Wait for the waiter's wake-up, its grace first (on the shared
        timer, grace.py), then with the reader reading, until its
        deadline."""
        woken = trio.Event()
        waiter.wake = woken.set
        now = trio.current_time()
        deadline = now + waiter.timeout_ms / 1000 if waiter.timeout_ms else math.inf
        short = waiter.job_id is None
        period = READER_GRACE_S if short else READER_GRACE_REPL_S
        graces = self.graces
        if graces is None or deadline <= now + period:
            # A deadline of its own: served without the timers, or the
            # command's timeout ends first.
            with trio.move_on_at(min(deadline, now + period)):
                await woken.wait()
            expired = not woken.is_set() and trio.current_time() < deadline
        else:
            grace = graces.short if short else graces.repl
            entry = grace.arm(woken.set)
            try:
                await woken.wait()
            finally:
                grace.disarm(entry)
            expired = entry.expired
        if waiter.done or self.client.gone or not expired:
            return
        woken = trio.Event()
        waiter.wake = woken.set
        self._start_reader()
        try:
            with trio.move_on_at(deadline):
                await woken.wait()
        finally:
            await self._stop_reader()

    async def _monitor(self) -> None:
        """After MONITOR: stream the command feed; end when the client leaves
        (the reader, which now reads, cancels the scope) or falls behind."""
        feed = self.host.monitor_feed(self.client)
        with trio.CancelScope() as scope:
            self.client.monitor_scope = scope
            self._start_reader()
            async with feed:
                async for line in feed:
                    await self.stream.send_all(line)

    def _check_query_limit(self) -> None:
        client = self.client
        size = self.parser.buffered()
        if size > self.host.config.client_query_buffer_limit:
            self.host.stat_query_buffer_closed += 1
            log.warning(
                "closing client %d (%s): query buffer of %d bytes is over "
                "client-query-buffer-limit",
                client.id,
                client.addr,
                size,
            )
            raise _Disconnected

    # -------------------------------------------------------------- reader

    def _start_reader(self) -> None:
        self._turn_scope = trio.CancelScope()
        self._parked = trio.Event()
        self._turn.set()

    async def _stop_reader(self) -> None:
        self._turn_scope.cancel()
        await self._parked.wait()

    async def reader(self) -> None:
        """Reads while the executor waits (a blocked command, MONITOR): keeps
        pipelined input in the parser (under the query buffer limit), and
        sees the client leave at once (the command is then abandoned)."""
        host, client, parser = self.host, self.client, self.parser
        while True:
            await self._turn.wait()
            self._turn = trio.Event()  # this turn is taken
            with self._turn_scope:
                gone = True
                try:
                    while data := await self.stream.receive_some(READ_SIZE):
                        host.stat_net_in += len(data)
                        parser.feed(bytes(data))
                        if parser.buffered() > host.config.client_query_buffer_limit:
                            gone = False  # the executor closes it (_check_query_limit)
                            break
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                client.gone = gone
                # The end of the input (or of what may be buffered): wake the
                # executor out of its wait.
                if client.blocked is not None:
                    client.blocked.wake()
                if client.monitor_scope is not None:
                    client.monitor_scope.cancel()
                await trio.sleep_forever()  # until the executor ends the turn
            self._parked.set()


async def _try_send(stream: trio.abc.Stream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
