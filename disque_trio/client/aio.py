"""The async client, on AnyIO: the same code under Trio and asyncio.

``AsyncClient`` keeps a bounded pool of connections per node, asks the
sans-I/O ``Router`` where each command goes, speaks through
``ClientProtocol``, and retries what may be retried (docs/client.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, cast

import anyio
import anyio.abc

from . import commands as cmds
from ._base import (
    ADD_JOBS_RUN,
    PROBE_TIMEOUT,
    ClientOptions,
    NodesSpec,
    addjob_commands,
    combine,
    job_ids_of,
    log_reassert,
    log_retry,
)
from .cluster import Router
from .commands import Command
from .errors import (
    ConnectionLostError,
    DisqueConnectionError,
    DisqueError,
    DisqueTimeoutError,
    LeavingError,
    NoNodeAvailableError,
    ResponseError,
)
from .held import ReassertResult
from .protocol import NEED_DATA, ClientProtocol, Response
from .pubsub import Message, SubscriberProtocol
from .scan import Scan
from .types import Address, HelloInfo, Job, JobInfo, QueueStats
from .waits import JobWait

__all__ = ["AsyncClient", "AsyncSubscription", "Connector"]

T = TypeVar("T")
log = logging.getLogger("disque_trio.client")

Connector = Callable[[str, int], Awaitable[anyio.abc.ByteStream]]
"""Opens a byte stream to (host, port); ``anyio.connect_tcp`` by default."""

_NETWORK_ERRORS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


async def _tcp(host: str, port: int) -> anyio.abc.ByteStream:
    return await anyio.connect_tcp(host, port)


class _Connection:
    def __init__(self, stream: anyio.abc.ByteStream, address: Address) -> None:
        self.stream = stream
        self.address = address
        self.proto = ClientProtocol()
        self.hello: HelloInfo | None = None
        self.calls = 0  # calls answered: a reused connection may be stale

    @property
    def reusable(self) -> bool:
        return self.proto.reusable

    def peer_closed(self) -> bool:
        """Whether the node closed this idle connection, checked without
        waiting: its socket is closed, or has something to read (its end
        of file). A command written to it would be lost, never run."""
        try:
            sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
        except anyio.TypedAttributeLookupError:
            return False  # not a socket (tests)
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def call(self, command: Command[T]) -> T:
        """Send one command and read its reply; a broken connection is
        ConnectionLostError (the command may have run)."""
        data = self.proto.send(command)
        try:
            await self.stream.send(data)
            while (event := self.proto.next_event()) is NEED_DATA:
                self.proto.receive_data(await self.stream.receive(65536))
        except anyio.EndOfStream:
            self.proto.receive_data(b"")
            event = self.proto.next_event()
            assert event is not NEED_DATA
        except _NETWORK_ERRORS as e:
            self.proto.receive_data(b"")
            raise ConnectionLostError(f"connection to {_fmt(self.address)} lost: {e}") from e
        return cast(T, event.result())

    async def call_many(self, commands: list[Command[T]]) -> list[Response[T]]:
        """Pipelined: every command in one write, then every reply. A
        connection that breaks answers what is left with
        ConnectionLostError (those commands may have run)."""
        data = self.proto.send(*commands)
        responses: list[Response[T]] = []
        try:
            await self.stream.send(data)
            while len(responses) < len(commands):
                event = self.proto.next_event()
                if event is NEED_DATA:
                    self.proto.receive_data(await self.stream.receive(65536))
                else:
                    responses.append(cast(Response[T], event))
        except (anyio.EndOfStream, *_NETWORK_ERRORS):
            self.proto.receive_data(b"")
            while len(responses) < len(commands):
                responses.append(cast(Response[T], self.proto.next_event()))
        return responses

    async def aclose(self) -> None:
        await anyio.aclose_forcefully(self.stream)


class _Pool:
    """At most ``size`` connections to one node; callers beyond wait."""

    def __init__(
        self, address: Address, size: int, opener: Callable[[Address], Awaitable[_Connection]]
    ) -> None:
        self.address = address
        self.opener = opener
        self.slots = anyio.Semaphore(size)
        self.idle: list[_Connection] = []
        self.open = 0

    async def acquire(self) -> _Connection:
        await self.slots.acquire()
        try:
            while self.idle:
                conn = self.idle.pop()
                if conn.reusable:
                    return conn
                await conn.aclose()
                self.open -= 1
            conn = await self.opener(self.address)
            self.open += 1
            return conn
        except BaseException:
            self.slots.release()
            raise

    async def release(self, conn: _Connection) -> None:
        try:
            if conn.reusable:
                self.idle.append(conn)
            else:
                self.open -= 1
                with anyio.CancelScope(shield=True):
                    await conn.aclose()
        finally:
            self.slots.release()

    async def aclose(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            self.open -= 1
            await conn.aclose()


class AsyncClient:
    """A Disque client for AnyIO code (Trio or asyncio).

    ``nodes``: ``"disque://[:password@]host:port[,host:port...]"``, a list
    of such URLs or ``host:port`` strings, or ``(host, port)`` tuples.
    ``timeout`` bounds every call (plus what the command itself may wait,
    GETJOB's timeout); ``connect_timeout`` every connection attempt;
    ``pool_size`` the connections to each node. Use as ``async with``, or
    call ``aclose()``.
    """

    def __init__(
        self,
        nodes: NodesSpec = "disque://127.0.0.1:7711",
        *,
        pool_size: int = 16,
        connector: Connector | None = None,
        **options: Any,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.options = ClientOptions(nodes, **options)
        self.router: Router = self.options.router
        self.pool_size = pool_size
        self._connector = connector or _tcp
        self._pools: dict[Address, _Pool] = {}
        self._discovery = anyio.Lock()
        self._closed = False
        self._reasserting = False  # a round of WORKING for held jobs is on

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when
        their call ends."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            for pool in self._pools.values():
                await pool.aclose()

    # ------------------------------------------------------------ plumbing

    def _pool(self, address: Address) -> _Pool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = _Pool(address, self.pool_size, self._open)
        return pool

    async def _open(self, address: Address) -> _Connection:
        """A new connection, authenticated, switched to the protocol asked
        for, and HELLO answered; DisqueConnectionError if it cannot be."""
        opts = self.options
        try:
            with anyio.fail_after(opts.connect_timeout):
                stream = await self._connector(*address)
        except TimeoutError:
            raise DisqueConnectionError(
                f"could not connect to {_fmt(address)}: timed out"
            ) from None
        except OSError as e:
            raise DisqueConnectionError(f"could not connect to {_fmt(address)}: {e}") from e
        conn = _Connection(stream, address)
        try:
            with anyio.fail_after(opts.connect_timeout):
                if opts.protocol == 3:
                    await conn.call(cmds.hello_resp(3, opts.password))
                elif opts.password is not None:
                    await conn.call(cmds.auth(opts.password))
                if opts.client_name:
                    await conn.call(cmds.raw("CLIENT", "SETNAME", opts.client_name))
                conn.hello = await conn.call(cmds.hello())
        except TimeoutError:
            await conn.aclose()
            raise DisqueConnectionError(f"{_fmt(address)} did not answer HELLO in time") from None
        except BaseException:
            await conn.aclose()
            raise
        self.router.learn(address, conn.hello, anyio.current_time())
        self.router.heard(anyio.current_time())
        return conn

    async def _once(self, address: Address, command: Command[T]) -> T:
        """The command on one node. A pooled connection found dead (the
        node restarted, or closed it while idle) is replaced once for an
        idempotent command."""
        pool = self._pool(address)
        for attempt in range(2):
            conn = await pool.acquire()
            reused = conn.calls > 0
            while reused and (command.duplicates or not command.idempotent) and conn.peer_closed():
                # Closed by the node while idle (a restart): the command
                # would be lost unsent, and could not be sent again.
                conn.proto.receive_data(b"")
                await pool.release(conn)  # closes it
                conn = await pool.acquire()
                reused = conn.calls > 0
            try:
                result = await conn.call(command)
                conn.calls += 1
                return result
            except ConnectionLostError as e:
                if attempt or not (reused and command.idempotent):
                    raise
                log_retry(command, e, address)
            finally:
                await pool.release(conn)
        raise AssertionError("unreachable")

    async def _hello_at(self, address: Address) -> HelloInfo:
        """HELLO at ``address``: the handshake's answer if the connection
        is new, else asked again."""
        pool = self._pool(address)
        conn = await pool.acquire()
        try:
            hello, conn.hello = conn.hello, None
            if hello is None:
                hello = await conn.call(cmds.hello())
            return hello
        finally:
            await pool.release(conn)

    async def _current(self) -> Address:
        """The current node, found (and connected to) if need be."""
        if self._closed:
            raise DisqueError("the client is closed")
        current = self.router.current
        if current is not None:
            return current
        async with self._discovery:
            if self.router.current is not None:
                return self.router.current
            errors = []
            fallback: tuple[Address, HelloInfo] | None = None
            for address in self.router.connect_order(anyio.current_time()):
                try:
                    hello = await self._hello_at(address)
                except (DisqueConnectionError, OSError) as e:
                    self.router.failed(address, anyio.current_time())
                    errors.append(f"{_fmt(address)}: {e}")
                    continue
                me = next((n for n in hello.nodes if n.id == hello.node_id), None)
                if me is not None and me.priority >= 100 and fallback is None:
                    fallback = (address, hello)  # leaving or failing: only if nothing else
                    continue
                self.router.connected(address, hello, anyio.current_time())
                log.debug("connected to %s (%s)", _fmt(address), hello.node_id[:8])
                return address
            if fallback is not None:
                self.router.connected(*fallback, anyio.current_time())
                return fallback[0]
            raise NoNodeAvailableError("no node reachable: " + "; ".join(errors))

    async def _on_current(self, command: Command[T]) -> T:
        attempt = 0
        while True:
            address: Address | None = None
            try:
                address = await self._current()
                return await self._once(address, command)
            except LeavingError as e:
                error: DisqueError = e
                if address is not None:
                    self.router.leaving(address, anyio.current_time())
                    log.info("%s is leaving the cluster: moving", _fmt(address))
            except ResponseError as e:
                if e.code not in command.retry_codes or address is None:
                    raise
                error = e
                self.router.refused(address, e, anyio.current_time())
            except DisqueConnectionError as e:
                error = e
                if address is not None:
                    self.router.failed(address, anyio.current_time())
                    log.info("%s: %s", _fmt(address), e)
            attempt += 1
            limit = command.attempts or self.options.max_attempts
            if attempt >= limit or not Router.retryable(command, error):
                raise error
            log_retry(command, error, address)
            await anyio.sleep(self.router.backoff.delay(attempt - 1, self.router.rng))

    async def _part(self, address: Address | None, command: Command[T]) -> T:
        if address is not None:
            try:
                result: T = await self._once(address, command)
                outcome: object = result
            except DisqueError as e:
                outcome = e
                if isinstance(e, DisqueConnectionError):
                    self.router.failed(address, anyio.current_time())
            if not Router.fall_back(command, outcome):
                if isinstance(outcome, DisqueError):
                    raise outcome
                return cast(T, outcome)
        return await self._on_current(command)

    async def execute(self, command: Command[T]) -> T:
        """Run a command (from ``disque_trio.client.commands``): routed,
        retried when safe, within the call timeout."""
        budget = self.options.call_timeout(command)
        try:
            with anyio.fail_after(None if math.isinf(budget) else budget):
                if command.routed and not self.router.nodes:
                    with contextlib.suppress(DisqueConnectionError):
                        await self._current()  # learn the cluster before routing
                parts = self.router.route(command)
                if len(parts) == 1:
                    return await self._part(parts[0][0], command)
                results = await self._parts(parts, concurrent=command.block != 0)
                return cast(T, combine(command, [c for _, c in parts], results))
        except TimeoutError:
            raise DisqueTimeoutError(
                f"{command.name} did not complete in {budget:.3g} s"
            ) from None
        finally:
            if self.router.held.due:
                await (
                    self._reassert_quietly()
                )  # this call found a node gone that held jobs came from

    # ------------------------------------------------------------ held jobs

    def hold(self, job_ids: Iterable[str], node: Address | None = None) -> None:
        """Count these jobs as held by this client (delivered by ``node``,
        if known), as if it had fetched them: for jobs fetched through
        another client and settled through this one."""
        self.router.hold(node, job_ids)

    def release(self, *job_ids: str) -> None:
        """These jobs are no longer held (settled through another client)."""
        self.router.held.release(job_ids)

    async def check_held(self) -> ReassertResult | None:
        """Make sure the jobs this client holds are kept alive: PING each
        node they were delivered by (one that does not answer in time is
        looked up in HELLO elsewhere: failing?), and for the jobs of a
        node gone, WORKING at a node holding a copy (docs/client.md,
        "Held jobs"). What that round did, or None if nothing was due.
        ``watch_held`` calls it every ``interval``; any call does the
        second half."""
        for address in self.router.held.nodes():
            await self._probe(address)
        return await self._reassert()

    async def watch_held(
        self,
        interval: float = 0.5,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """``check_held`` every ``interval`` seconds while jobs are held,
        until cancelled: run it in a task beside the code that works on
        the jobs (the Worker does). Never raises: what goes wrong is logged."""
        task_status.started()
        while True:
            await anyio.sleep(interval)
            if len(self.router.held) and not self._closed:
                try:
                    await self.check_held()
                except Exception:
                    log.exception("checking the held jobs failed")

    async def _probe(self, address: Address) -> None:
        try:
            with anyio.fail_after(PROBE_TIMEOUT):
                await self._once(address, cmds.ping())
        except DisqueConnectionError as e:
            self.router.failed(address, anyio.current_time())
            log.info("%s (it delivered held jobs): %s", _fmt(address), e)
        except (TimeoutError, DisqueError) as e:
            log.info("%s (it delivered held jobs) did not answer PING: %s", _fmt(address), e)
            await self._hello_elsewhere(address)

    async def _hello_elsewhere(self, address: Address) -> None:
        """Learn from HELLO at another node whether ``address`` is failing."""
        for other in self.router.connect_order(anyio.current_time(), exclude=[address]):
            try:
                with anyio.fail_after(PROBE_TIMEOUT):
                    hello = await self._once(other, cmds.hello())
            except (TimeoutError, DisqueError):
                continue
            self.router.learn(other, hello, anyio.current_time())
            return

    async def _reassert_quietly(self) -> None:
        """A round at the end of a call: whatever goes wrong in it is the
        round's, never the call's."""
        try:
            await self._reassert()
        except Exception:
            log.exception("keeping the held jobs of a gone node alive failed")

    async def _reassert(self) -> ReassertResult | None:
        """A round of WORKING for the held jobs whose node is gone
        (held.py), pipelined node by node; errors are the round's."""
        if self._reasserting or not self.router.held.due:
            return None
        self._reasserting = True
        try:
            plan = self.router.reassert(anyio.current_time())
            while (batch := plan.next_batch()) is not None:
                address, commands = batch
                try:
                    with anyio.fail_after(self.options.timeout):
                        responses = await self._pipeline(address, commands)
                except (TimeoutError, DisqueError):
                    self.router.failed(address, anyio.current_time())
                    plan.unreachable(address)
                    continue
                if any(isinstance(r.error, DisqueConnectionError) for r in responses):
                    self.router.failed(address, anyio.current_time())
                plan.feed(address, responses)
            result = self.router.reasserted(plan)
        finally:
            self._reasserting = False
        log_reassert(result)
        return result

    async def _pipeline(self, address: Address, commands: list[Command[T]]) -> list[Response[T]]:
        pool = self._pool(address)
        conn = await pool.acquire()
        try:
            return await conn.call_many(commands)
        finally:
            await pool.release(conn)

    async def _parts(
        self, parts: list[tuple[Address | None, Command[T]]], concurrent: bool
    ) -> list[object]:
        """Every part of a split command; a blocking one (WAITJOB) waits on
        its nodes at once, so that its timeout does not add up."""
        if not concurrent:
            return [await self._part(a, c) for a, c in parts]
        results: list[object] = [None] * len(parts)

        async def one(i: int, address: Address | None, part: Command[T]) -> None:
            results[i] = await self._part(address, part)

        async with anyio.create_task_group() as tg:
            for i, (address, part) in enumerate(parts):
                tg.start_soon(one, i, address, part)
        return results

    async def call(self, *args: cmds.Arg) -> object:
        """Any command, its reply as decoded; not retried after a lost
        connection (it may have run)."""
        return await self.execute(cmds.raw(*args))

    # ------------------------------------------------------------ jobs

    async def add_job(
        self,
        queue: str,
        body: bytes | str,
        *,
        timeout_ms: int | None = None,
        replicate: int | None = None,
        delay: float | None = None,
        eta: datetime | None = None,
        retry: int | None = None,
        ttl: int | None = None,
        maxlen: int | None = None,
        asynchronous: bool = False,
        resend: bool | None = None,
        retries: int | None = None,
    ) -> str:
        """ADDJOB; returns the job ID. ``timeout_ms`` (replication) defaults
        to the client's call timeout. ``delay`` (seconds, rounded up) or
        ``eta`` (a datetime; naive means local time): when the job is first
        queued. Refused with -NOREPL, or not sent (no connection), it is
        sent again elsewhere, after a back-off, up to ``retries`` times
        (the client's ``add_job_retries`` by default). After a connection
        lost with it in flight the job may or may not exist: it is sent
        again only with ``resend`` (the client's, True by default), and
        may then exist twice."""
        return await self.execute(
            self.options.addjob_command(
                queue,
                body,
                timeout_ms=timeout_ms,
                delay=delay,
                eta=eta,
                resend=resend,
                retries=retries,
                replicate=replicate,
                retry=retry,
                ttl=ttl,
                maxlen=maxlen,
                asynchronous=asynchronous,
            )
        )

    async def add_jobs(
        self,
        queue: str,
        bodies: Iterable[bytes | str],
        *,
        timeout_ms: int | None = None,
        **options: Any,
    ) -> list[str]:
        """ADDJOB for every body, pipelined in runs on one connection to
        the current node (``add_job``'s options apply to each, ``eta``
        too): their IDs, in order. Much faster than one ``add_job`` call
        each (one write and one read per run; the node replicates a run
        together). Raises AddJobsError when some failed (its ``ids`` has
        the others'); none is sent again after a lost connection."""
        commands = addjob_commands(self.options, queue, bodies, timeout_ms, options)
        responses: list[Response[str]] = []
        for start in range(0, len(commands), ADD_JOBS_RUN):
            run = commands[start : start + ADD_JOBS_RUN]
            budget = self.options.call_timeout(run[0])
            try:
                with anyio.fail_after(None if math.isinf(budget) else budget):
                    pool = self._pool(await self._current())
                    conn = await pool.acquire()
                    try:
                        responses += await conn.call_many(run)
                    finally:
                        await pool.release(conn)
            except TimeoutError:
                raise DisqueTimeoutError(f"{len(run)} ADDJOBs did not complete in time") from None
        return job_ids_of(responses)

    async def get_jobs(
        self,
        *queues: str,
        count: int = 1,
        timeout: float | None = None,
        nohang: bool = False,
    ) -> list[Job]:
        """GETJOB WITHCOUNTERS: up to ``count`` jobs. Waits up to
        ``timeout`` seconds for one ([] then), for ever when None, not at
        all with ``nohang``."""
        if nohang:
            return await self._fetch(cmds.getjob(queues, count=count, nohang=True))
        deadline = None if timeout is None else anyio.current_time() + timeout
        while True:
            wait = self.options.poll
            if deadline is not None:
                wait = min(wait, deadline - anyio.current_time())
                if wait <= 0:
                    return []
            jobs = await self._fetch(
                cmds.getjob(queues, count=count, timeout_ms=max(1, round(wait * 1000)))
            )
            if not jobs:
                jobs = await self._sweep(queues, count)
            if jobs or (deadline is not None and anyio.current_time() >= deadline):
                return jobs

    async def get_job(self, *queues: str, timeout: float | None = None) -> Job | None:
        jobs = await self.get_jobs(*queues, timeout=timeout)
        return jobs[0] if jobs else None

    async def _sweep(self, queues: Sequence[str], count: int) -> list[Job]:
        """After a wait that brought nothing: refresh HELLO when due, then
        take jobs from leaving nodes with GETJOB NOHANG (a leaving node
        refuses only GETJOBs that would block, and no node may ask it for
        its queued jobs), so that they are not left there."""
        now = anyio.current_time()
        if self.router.hello_due(now) and self.router.current is not None:
            address = self.router.current
            try:
                with anyio.fail_after(self.options.timeout):
                    hello = await self._once(address, cmds.hello())
                    self.router.learn(address, hello, anyio.current_time())
                self.router.heard(now)
            except (DisqueError, TimeoutError) as e:
                log.debug("HELLO refresh at %s failed: %s", _fmt(address), e)
        for address in self.router.sweep_targets(now):
            try:
                with anyio.fail_after(self.options.connect_timeout + self.options.timeout):
                    jobs = await self._once(address, cmds.getjob(queues, count=count, nohang=True))
            except (DisqueError, TimeoutError) as e:
                log.debug("GETJOB NOHANG at %s failed: %s", _fmt(address), e)
                self.router.sweep_failed(address, anyio.current_time())
                continue
            if jobs:
                log.info("took %d job(s) from %s (leaving or failing)", len(jobs), _fmt(address))
                self.router.delivered(address, [j.id for j in jobs])
                return jobs
        return []

    async def _fetch(self, command: Command[list[Job]]) -> list[Job]:
        jobs = await self.execute(command)
        if jobs and self.router.current is not None:
            self.router.delivered(self.router.current, [j.id for j in jobs])
        if jobs:
            target = self.router.jobs_received([j.id for j in jobs], anyio.current_time())
            if target is not None:
                node_id = self.router.node_id_at(target)
                log.info(
                    "following producers: most jobs come from %s, moving there from %s",
                    _fmt(target),
                    _fmt(self.router.current) if self.router.current else "-",
                )
                self.router.move_to(target, node_id)
        return jobs

    async def ack_job(self, *job_ids: str) -> int:
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        done = await self.execute(cmds.ackjob(*job_ids))
        self.router.forget_jobs(job_ids)
        return done

    async def fast_ack(self, *job_ids: str) -> int:
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        done = await self.execute(cmds.fastack(*job_ids))
        self.router.forget_jobs(job_ids)
        return done

    async def nack(self, *job_ids: str, delay: float | None = None) -> int:
        """NACK: queue the jobs again, now or after ``delay`` seconds
        (rounded up), counting a nack; how many were queued."""
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        return await self.execute(cmds.nack(*job_ids, delay=delay))

    async def working(self, job_id: str) -> int:
        """WORKING: postpones the next re-queue; returns the RETRY in s."""
        return await self.execute(cmds.working(job_id))

    async def show(self, job_id: str) -> JobInfo | None:
        return await self.execute(cmds.show(job_id))

    async def enqueue(self, *job_ids: str, delay: float | None = None) -> int:
        self.router.held.release(job_ids)
        return await self.execute(cmds.enqueue(*job_ids, delay=delay))

    async def wait_job(self, job_id: str, *, timeout: float | None = None) -> str:
        """Block until the job is done (WAITJOB, sent to the node that
        created it): ``"acked"``, ``"gone"`` (deleted or expired without an
        ack), ``"unknown"`` (the node knows nothing of it), or
        ``"pending"`` once ``timeout`` seconds passed (None: for ever).
        Raises JobNodeUnavailableError when the job's node is out of reach
        and the node asked knows nothing of it."""
        return (await self.wait_jobs(job_id, timeout=timeout))[job_id]

    async def wait_jobs(self, *job_ids: str, timeout: float | None = None) -> dict[str, str]:
        """``wait_job`` for several jobs at once: their outcomes by ID, in
        the order given, once all are done or the timeout passed."""
        wait = JobWait(job_ids, timeout=timeout, poll=self.options.poll, now=anyio.current_time())
        while (command := wait.next_command(anyio.current_time())) is not None:
            wait.feed(await self.execute(command), command)
        return wait.result(self.router, anyio.current_time())

    async def dequeue(self, *job_ids: str) -> int:
        return await self.execute(cmds.dequeue(*job_ids))

    async def del_job(self, *job_ids: str) -> int:
        self.router.held.release(job_ids)
        return await self.execute(cmds.deljob(*job_ids))

    # ------------------------------------------------------------ queues

    async def qlen(self, queue: str) -> int:
        return await self.execute(cmds.qlen(queue))

    async def qstat(self, queue: str) -> QueueStats | None:
        return await self.execute(cmds.qstat(queue))

    async def qpeek(self, queue: str, count: int) -> list[Job]:
        return await self.execute(cmds.qpeek(queue, count))

    async def pause(self, queue: str, *options: str) -> str:
        return await self.execute(cmds.pause(queue, *options))

    async def qscan(self, *, count: int | None = None, **filters: Any) -> AsyncIterator[str]:
        """Every queue name of the current node (QSCAN, deduplicated)."""
        scan = Scan(lambda cursor: cmds.qscan(cursor, count=count, **filters))
        async for name in self._scan(scan):
            yield name

    async def jscan(
        self, *, count: int | None = None, queue: str | None = None, states: Sequence[str] = ()
    ) -> AsyncIterator[str]:
        """Every job ID of the current node (JSCAN, deduplicated)."""
        scan = Scan(lambda cursor: cmds.jscan(cursor, count=count, queue=queue, states=states))
        async for job_id in self._scan(scan):
            yield job_id

    async def jscan_jobs(
        self, *, count: int | None = None, queue: str | None = None, states: Sequence[str] = ()
    ) -> AsyncIterator[JobInfo]:
        """Every job of the current node with what SHOW tells (JSCAN REPLY all)."""
        scan: Scan[JobInfo] = Scan(
            lambda cursor: cmds.jscan_all(cursor, count=count, queue=queue, states=states),
            key=lambda info: info.id,
        )
        async for info in self._scan(scan):
            yield info

    async def _scan(self, scan: Scan[T]) -> AsyncIterator[T]:
        address = await self._current()  # a cursor is only valid on its node
        while (command := scan.next_command()) is not None:
            with anyio.fail_after(self.options.timeout):
                page = await self._once(address, command)
            for item in scan.feed(page):
                yield item

    # ------------------------------------------------------------ cluster

    async def hello(self) -> HelloInfo:
        """HELLO on the current node (and learn the cluster from it)."""
        address = await self._current()
        hello = await self.execute(cmds.hello())
        self.router.learn(address, hello, anyio.current_time())
        return hello

    async def ping(self) -> str:
        return await self.execute(cmds.ping())

    # ------------------------------------------------------------- pub/sub

    async def publish(self, channel: str, message: bytes | str) -> int:
        """PUBLISH: delivered to the subscribers of every node linked to
        the one it is sent to; returns how many clients of that node got
        it. At most once (docs/commands.md)."""
        return await self.execute(cmds.publish(channel, message))

    async def subscribe(self, *channels: str, patterns: Sequence[str] = ()) -> AsyncSubscription:
        """A subscription on a connection of its own, to the client's
        current node: ``await get_message()`` or ``async for`` it; close it
        with ``aclose()`` (or ``async with``). When its node goes, it
        subscribes again on another (what was published meanwhile is
        lost)."""
        sub = AsyncSubscription(self)
        try:
            await sub.subscribe(*channels)
            await sub.psubscribe(*patterns)
        except BaseException:
            await sub.aclose()
            raise
        return sub

    async def info(self, section: str | None = None) -> str:
        return await self.execute(cmds.info(section))

    @property
    def current_node(self) -> Address | None:
        """The node the client works with now (None before the first call
        or after it failed)."""
        return self.router.current


def _fmt(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class AsyncSubscription:
    """AsyncClient.subscribe(): a connection that receives published
    messages. One task reads it at a time."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self.proto = SubscriberProtocol()
        self._stream: anyio.abc.ByteStream | None = None
        self.address: Address | None = None
        self.reconnects = 0  # new connections after the first

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Message:
        """The next message; the iteration ends when the subscription is
        closed. (Not an async generator: breaking out of one leaves it to
        be finalized by the garbage collector, which Trio warns about.)"""
        while self._stream is not None or self.proto.channels or self.proto.patterns:
            message = await self.get_message(timeout=None)
            if message is not None:
                return message
        raise StopAsyncIteration

    @property
    def channels(self) -> list[str]:
        return list(self.proto.channels)

    @property
    def patterns(self) -> list[str]:
        return list(self.proto.patterns)

    async def subscribe(self, *channels: str) -> None:
        await self._send(self.proto.subscribe(*channels))

    async def psubscribe(self, *patterns: str) -> None:
        await self._send(self.proto.psubscribe(*patterns))

    async def unsubscribe(self, *channels: str) -> None:
        """None named: every channel."""
        await self._send(self.proto.unsubscribe(*channels))

    async def punsubscribe(self, *patterns: str) -> None:
        """None named: every pattern."""
        await self._send(self.proto.punsubscribe(*patterns))

    async def get_message(self, timeout: float | None = 0.0) -> Message | None:
        """The next message, waiting at most ``timeout`` seconds (None: as
        long as it takes); None if none came. A connection lost is replaced
        (on another node if its own is gone), else DisqueConnectionError."""
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                message = self.proto.next_message()
                if message is not None:
                    return message
                if self._stream is None:
                    await self._connect()
                stream = self._stream
                assert stream is not None
                try:
                    data = await stream.receive(65536)
                except (anyio.EndOfStream, *_NETWORK_ERRORS):
                    await self._lost()
                    continue
                self.proto.receive_data(data)
        return self.proto.next_message()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        self.proto.channels.clear()
        self.proto.patterns.clear()
        if stream is not None:
            await anyio.aclose_forcefully(stream)

    # ------------------------------------------------------------ plumbing

    async def _send(self, data: bytes) -> None:
        if self._stream is None:
            await self._connect()  # subscribes to all, this too
            return
        try:
            await self._stream.send(data)
        except _NETWORK_ERRORS:
            await self._lost()
            await self._connect()

    async def _lost(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await anyio.aclose_forcefully(stream)
        if self.address is not None:
            self._client.router.failed(self.address, anyio.current_time())

    async def _connect(self) -> None:
        """A new connection to the client's current node (another one once
        this one's node failed), subscribed to everything asked so far."""
        client = self._client
        opts = client.options
        errors: list[str] = []
        for _ in range(opts.max_attempts):
            try:
                address = await client._current()
                with anyio.fail_after(opts.connect_timeout):
                    stream = await client._connector(*address)
            except (DisqueConnectionError, TimeoutError, OSError) as e:
                errors.append(str(e) or type(e).__name__)
                continue
            conn = _Connection(stream, address)
            try:
                with anyio.fail_after(opts.connect_timeout):
                    if opts.password is not None:
                        await conn.call(cmds.auth(opts.password))
                    data = self.proto.resubscribe()
                    if data:
                        await stream.send(data)
            except (TimeoutError, ConnectionLostError, *_NETWORK_ERRORS) as e:
                await conn.aclose()
                client.router.failed(address, anyio.current_time())
                errors.append(f"{_fmt(address)}: {e}")
                continue
            if self.address is not None:
                self.reconnects += 1
            self._stream, self.address = stream, address
            return
        raise DisqueConnectionError("could not subscribe: " + "; ".join(errors))
