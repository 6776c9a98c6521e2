"""The blocking client, on plain sockets.

``Client`` has the methods of ``AsyncClient`` without ``await``. It keeps
one connection per node it talks to and is meant for one thread at a time
(give each thread its own ``Client``); there is no pool to bound.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

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

__all__ = ["Client", "SocketLike", "Subscription"]

T = TypeVar("T")
log = logging.getLogger("disque_trio.client")


class SocketLike(Protocol):
    """What the blocking client needs of a socket (tests pass fakes)."""

    def settimeout(self, value: float | None) -> None: ...
    def sendall(self, data: bytes) -> None: ...
    def recv(self, size: int) -> bytes: ...
    def close(self) -> None: ...


SocketConnector = Callable[[Address, float], SocketLike]
"""Opens a socket to (host, port) within a timeout."""


def _tcp(address: Address, timeout: float) -> SocketLike:
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left_or_zero(self) -> float:
        """Seconds left, 0 when none (inf for no limit)."""
        return max(0.0, self.at - time.monotonic())

    def left(self) -> float:
        """Seconds left (inf for no limit); TimeoutError when none."""
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    def socket_timeout(self) -> float | None:
        left = self.left()
        return None if math.isinf(left) else left


class _Connection:
    def __init__(self, sock: SocketLike, address: Address) -> None:
        self.sock = sock
        self.address = address
        self.proto = ClientProtocol()
        self.hello: HelloInfo | None = None  # the handshake's, until used
        self.calls = 0  # calls answered: a reused connection may be stale

    @property
    def usable(self) -> bool:
        return self.proto.reusable

    def peer_closed(self) -> bool:
        """Whether the node closed this idle connection (it has something
        to read: its end of file), checked without waiting. A command
        written to it would be lost unanswered, never run."""
        fileno = getattr(self.sock, "fileno", None)
        if fileno is None:
            return False  # not a real socket (tests)
        try:
            readable, _, _ = select.select([fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def call(self, command: Command[T], deadline: _Deadline) -> T:
        data = self.proto.send(command)
        try:
            self.sock.settimeout(deadline.socket_timeout())
            self.sock.sendall(data)
            while (event := self.proto.next_event()) is NEED_DATA:
                self.sock.settimeout(deadline.socket_timeout())
                self.proto.receive_data(self.sock.recv(65536))
        except TimeoutError:
            self.close()
            raise TimeoutError from None
        except OSError as e:
            self.close()
            raise ConnectionLostError(f"connection to {_fmt(self.address)} lost: {e}") from e
        return cast(T, event.result())

    def call_many(self, commands: list[Command[T]], deadline: _Deadline) -> list[Response[T]]:
        """Pipelined: every command in one write, then every reply. A
        connection that breaks answers what is left with
        ConnectionLostError (those commands may have run)."""
        data = self.proto.send(*commands)
        responses: list[Response[T]] = []
        try:
            self.sock.settimeout(deadline.socket_timeout())
            self.sock.sendall(data)
            while len(responses) < len(commands):
                event = self.proto.next_event()
                if event is NEED_DATA:
                    self.sock.settimeout(deadline.socket_timeout())
                    self.proto.receive_data(self.sock.recv(65536))
                else:
                    responses.append(cast(Response[T], event))
        except TimeoutError:
            self.close()
            raise TimeoutError from None
        except OSError:
            self.close()
            while len(responses) < len(commands):
                responses.append(cast(Response[T], self.proto.next_event()))
        return responses

    def close(self) -> None:
        self.proto.receive_data(b"")
        try:
            self.sock.close()
        except OSError:
            pass


class Client:
    """A Disque client for blocking code; the same options as AsyncClient
    (but no ``pool_size``). Use as ``with Client(...) as c:`` or call
    ``close()``."""

    def __init__(
        self,
        nodes: NodesSpec = "disque://127.0.0.1:7711",
        *,
        connector: SocketConnector | None = None,
        **options: Any,
    ) -> None:
        self.options = ClientOptions(nodes, **options)
        self.router: Router = self.options.router
        self._connector = connector or _tcp
        self._conns: dict[Address, _Connection] = {}
        self._reasserting = False  # a round of WORKING for held jobs is on

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # ------------------------------------------------------------ plumbing

    def _connection(self, address: Address, deadline: _Deadline) -> _Connection:
        conn = self._conns.get(address)
        if conn is not None and conn.usable:
            return conn
        if conn is not None:
            conn.close()
            del self._conns[address]
        opts = self.options
        budget = min(opts.connect_timeout, deadline.left())
        try:
            sock = self._connector(address, budget)
        except TimeoutError:
            raise DisqueConnectionError(
                f"could not connect to {_fmt(address)}: timed out"
            ) from None
        except OSError as e:
            raise DisqueConnectionError(f"could not connect to {_fmt(address)}: {e}") from e
        conn = _Connection(sock, address)
        setup = _Deadline(budget)
        try:
            if opts.protocol == 3:
                conn.call(cmds.hello_resp(3, opts.password), setup)
            elif opts.password is not None:
                conn.call(cmds.auth(opts.password), setup)
            if opts.client_name:
                conn.call(cmds.raw("CLIENT", "SETNAME", opts.client_name), setup)
            hello = conn.hello = conn.call(cmds.hello(), setup)
        except TimeoutError:
            conn.close()
            raise DisqueConnectionError(f"{_fmt(address)} did not answer HELLO in time") from None
        except BaseException:
            conn.close()
            raise
        self.router.learn(address, hello, time.monotonic())
        self.router.heard(time.monotonic())
        self._conns[address] = conn
        return conn

    def _once(self, address: Address, command: Command[T], deadline: _Deadline) -> T:
        """See AsyncClient._once: a stale connection is replaced once for
        an idempotent command."""
        for attempt in range(2):
            conn = self._connection(address, deadline)
            reused = conn.calls > 0
            if reused and (command.duplicates or not command.idempotent) and conn.peer_closed():
                # Closed by the node while idle (a restart): the command
                # would be lost unsent, and could not be sent again (or,
                # sent again, could exist twice).
                conn.close()
                conn = self._connection(address, deadline)
                reused = False
            try:
                result = conn.call(command, deadline)
            except ConnectionLostError as e:
                if attempt or not (reused and command.idempotent):
                    raise
                log_retry(command, e, address)
                continue
            conn.calls += 1
            return result
        raise AssertionError("unreachable")

    def _hello_at(self, address: Address, deadline: _Deadline) -> HelloInfo:
        conn = self._connection(address, deadline)
        hello, conn.hello = conn.hello, None
        return hello or conn.call(cmds.hello(), deadline)

    def _current(self, deadline: _Deadline) -> Address:
        current = self.router.current
        if current is not None:
            return current
        errors = []
        fallback: tuple[Address, HelloInfo] | None = None
        for address in self.router.connect_order(time.monotonic()):
            try:
                hello = self._hello_at(address, deadline)
            except DisqueConnectionError as e:
                self.router.failed(address, time.monotonic())
                errors.append(f"{_fmt(address)}: {e}")
                continue
            me = next((n for n in hello.nodes if n.id == hello.node_id), None)
            if me is not None and me.priority >= 100 and fallback is None:
                fallback = (address, hello)
                continue
            self.router.connected(address, hello, time.monotonic())
            return address
        if fallback is not None:
            self.router.connected(*fallback, time.monotonic())
            return fallback[0]
        raise NoNodeAvailableError("no node reachable: " + "; ".join(errors))

    def _on_current(self, command: Command[T], deadline: _Deadline) -> T:
        attempt = 0
        while True:
            address: Address | None = None
            try:
                address = self._current(deadline)
                return self._once(address, command, deadline)
            except LeavingError as e:
                error: DisqueError = e
                if address is not None:
                    self.router.leaving(address, time.monotonic())
                    log.info("%s is leaving the cluster: moving", _fmt(address))
            except ResponseError as e:
                if e.code not in command.retry_codes or address is None:
                    raise
                error = e
                self.router.refused(address, e, time.monotonic())
            except DisqueConnectionError as e:
                error = e
                if address is not None:
                    self.router.failed(address, time.monotonic())
                    log.info("%s: %s", _fmt(address), e)
            attempt += 1
            limit = command.attempts or self.options.max_attempts
            if attempt >= limit or not Router.retryable(command, error):
                raise error
            log_retry(command, error, address)
            pause = self.router.backoff.delay(attempt - 1, self.router.rng)
            time.sleep(min(pause, deadline.left()))

    def _part(self, address: Address | None, command: Command[T], deadline: _Deadline) -> T:
        if address is not None:
            try:
                result: T = self._once(address, command, deadline)
                outcome: object = result
            except DisqueError as e:
                outcome = e
                if isinstance(e, DisqueConnectionError):
                    self.router.failed(address, time.monotonic())
            if not Router.fall_back(command, outcome):
                if isinstance(outcome, DisqueError):
                    raise outcome
                return cast(T, outcome)
        return self._on_current(command, deadline)

    def execute(self, command: Command[T]) -> T:
        """Run a command (from ``disque_trio.client.commands``): routed,
        retried when safe, within the call timeout."""
        budget = self.options.call_timeout(command)
        deadline = _Deadline(budget)
        try:
            if command.routed and not self.router.nodes:
                with contextlib.suppress(DisqueConnectionError):
                    self._current(deadline)  # learn the cluster before routing
            parts = self.router.route(command)
            if len(parts) == 1:
                return self._part(parts[0][0], command, deadline)
            results: list[object] = [self._part(a, c, deadline) for a, c in parts]
            return cast(T, combine(command, [c for _, c in parts], results))
        except TimeoutError:
            raise DisqueTimeoutError(
                f"{command.name} did not complete in {budget:.3g} s"
            ) from None
        finally:
            if self.router.held.due:
                self._reassert_quietly()  # this call found a node gone that held jobs came from

    # ------------------------------------------------------------ held jobs

    def hold(self, job_ids: Iterable[str], node: Address | None = None) -> None:
        """Count these jobs as held by this client (delivered by ``node``,
        if known), as if it had fetched them: for jobs fetched through
        another client and settled through this one."""
        self.router.hold(node, job_ids)

    def release(self, *job_ids: str) -> None:
        """These jobs are no longer held (settled through another client)."""
        self.router.held.release(job_ids)

    def check_held(self) -> ReassertResult | None:
        """Make sure the jobs this client holds are kept alive: PING each
        node they were delivered by (one that does not answer in time is
        looked up in HELLO elsewhere: failing?), and for the jobs of a
        node gone, WORKING at a node holding a copy (docs/client.md,
        "Held jobs"). What that round did, or None if nothing was due.
        Call it every second or so while working on jobs with nothing
        else calling the client; any call does the second half."""
        for address in self.router.held.nodes():
            self._probe(address)
        return self._reassert()

    def _probe(self, address: Address) -> None:
        try:
            self._once(address, cmds.ping(), _Deadline(PROBE_TIMEOUT))
        except DisqueConnectionError as e:
            self.router.failed(address, time.monotonic())
            log.info("%s (it delivered held jobs): %s", _fmt(address), e)
        except (TimeoutError, DisqueError) as e:
            log.info("%s (it delivered held jobs) did not answer PING: %s", _fmt(address), e)
            self._hello_elsewhere(address)

    def _hello_elsewhere(self, address: Address) -> None:
        """Learn from HELLO at another node whether ``address`` is failing."""
        for other in self.router.connect_order(time.monotonic(), exclude=[address]):
            try:
                hello = self._once(other, cmds.hello(), _Deadline(PROBE_TIMEOUT))
            except (TimeoutError, DisqueError):
                continue
            self.router.learn(other, hello, time.monotonic())
            return

    def _reassert_quietly(self) -> None:
        """A round at the end of a call: whatever goes wrong in it is the
        round's, never the call's."""
        try:
            self._reassert()
        except Exception:
            log.exception("keeping the held jobs of a gone node alive failed")

    def _reassert(self) -> ReassertResult | None:
        """A round of WORKING for the held jobs whose node is gone
        (held.py), pipelined node by node; errors are the round's."""
        if self._reasserting or not self.router.held.due:
            return None
        self._reasserting = True
        try:
            plan = self.router.reassert(time.monotonic())
            while (batch := plan.next_batch()) is not None:
                address, commands = batch
                deadline = _Deadline(self.options.timeout)
                try:
                    responses = self._connection(address, deadline).call_many(commands, deadline)
                except (TimeoutError, DisqueError):
                    self.router.failed(address, time.monotonic())
                    plan.unreachable(address)
                    continue
                if any(isinstance(r.error, DisqueConnectionError) for r in responses):
                    self.router.failed(address, time.monotonic())
                plan.feed(address, responses)
            result = self.router.reasserted(plan)
        finally:
            self._reasserting = False
        log_reassert(result)
        return result

    def call(self, *args: cmds.Arg) -> object:
        """Any command, its reply as decoded; not retried after a lost
        connection (it may have run)."""
        return self.execute(cmds.raw(*args))

    # ------------------------------------------------------------ jobs

    def add_job(
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
        """ADDJOB; see AsyncClient.add_job."""
        return self.execute(
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

    def add_jobs(
        self,
        queue: str,
        bodies: Iterable[bytes | str],
        *,
        timeout_ms: int | None = None,
        **options: Any,
    ) -> list[str]:
        """See AsyncClient.add_jobs."""
        commands = addjob_commands(self.options, queue, bodies, timeout_ms, options)
        responses: list[Response[str]] = []
        for start in range(0, len(commands), ADD_JOBS_RUN):
            run = commands[start : start + ADD_JOBS_RUN]
            deadline = _Deadline(self.options.call_timeout(run[0]))
            try:
                conn = self._connection(self._current(deadline), deadline)
                responses += conn.call_many(run, deadline)
            except TimeoutError:
                raise DisqueTimeoutError(f"{len(run)} ADDJOBs did not complete in time") from None
        return job_ids_of(responses)

    def get_jobs(
        self, *queues: str, count: int = 1, timeout: float | None = None, nohang: bool = False
    ) -> list[Job]:
        """GETJOB WITHCOUNTERS; see AsyncClient.get_jobs."""
        if nohang:
            return self._fetch(cmds.getjob(queues, count=count, nohang=True))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.options.poll
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return []
            jobs = self._fetch(
                cmds.getjob(queues, count=count, timeout_ms=max(1, round(wait * 1000)))
            )
            if not jobs:
                jobs = self._sweep(queues, count)
            if jobs or (deadline is not None and time.monotonic() >= deadline):
                return jobs

    def get_job(self, *queues: str, timeout: float | None = None) -> Job | None:
        jobs = self.get_jobs(*queues, timeout=timeout)
        return jobs[0] if jobs else None

    def _sweep(self, queues: Sequence[str], count: int) -> list[Job]:
        """See AsyncClient._sweep: HELLO when due, then GETJOB NOHANG at
        leaving nodes."""
        now = time.monotonic()
        if self.router.hello_due(now) and self.router.current is not None:
            address = self.router.current
            try:
                self.router.learn(
                    address,
                    self._once(address, cmds.hello(), _Deadline(self.options.timeout)),
                    time.monotonic(),
                )
                self.router.heard(now)
            except (DisqueError, TimeoutError) as e:
                log.debug("HELLO refresh at %s failed: %s", _fmt(address), e)
        for address in self.router.sweep_targets(now):
            budget = _Deadline(self.options.connect_timeout + self.options.timeout)
            try:
                jobs = self._once(address, cmds.getjob(queues, count=count, nohang=True), budget)
            except (DisqueError, TimeoutError) as e:
                log.debug("GETJOB NOHANG at %s failed: %s", _fmt(address), e)
                self.router.sweep_failed(address, time.monotonic())
                continue
            if jobs:
                self.router.delivered(address, [j.id for j in jobs])
                return jobs
        return []

    def _fetch(self, command: Command[list[Job]]) -> list[Job]:
        jobs = self.execute(command)
        if jobs and self.router.current is not None:
            self.router.delivered(self.router.current, [j.id for j in jobs])
        if jobs:
            target = self.router.jobs_received([j.id for j in jobs], time.monotonic())
            if target is not None:
                log.info("following producers: moving to %s", _fmt(target))
                self.router.move_to(target, self.router.node_id_at(target))
        return jobs

    def ack_job(self, *job_ids: str) -> int:
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        done = self.execute(cmds.ackjob(*job_ids))
        self.router.forget_jobs(job_ids)
        return done

    def fast_ack(self, *job_ids: str) -> int:
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        done = self.execute(cmds.fastack(*job_ids))
        self.router.forget_jobs(job_ids)
        return done

    def nack(self, *job_ids: str, delay: float | None = None) -> int:
        """See AsyncClient.nack."""
        if not job_ids:
            return 0
        self.router.held.release(job_ids)
        return self.execute(cmds.nack(*job_ids, delay=delay))

    def working(self, job_id: str) -> int:
        return self.execute(cmds.working(job_id))

    def show(self, job_id: str) -> JobInfo | None:
        return self.execute(cmds.show(job_id))

    def enqueue(self, *job_ids: str, delay: float | None = None) -> int:
        self.router.held.release(job_ids)
        return self.execute(cmds.enqueue(*job_ids, delay=delay))

    def wait_job(self, job_id: str, *, timeout: float | None = None) -> str:
        """See AsyncClient.wait_job."""
        return self.wait_jobs(job_id, timeout=timeout)[job_id]

    def wait_jobs(self, *job_ids: str, timeout: float | None = None) -> dict[str, str]:
        """See AsyncClient.wait_jobs. IDs made by several nodes are waited
        for on each node in turn (each wait at most the client's ``poll``)."""
        wait = JobWait(job_ids, timeout=timeout, poll=self.options.poll, now=time.monotonic())
        while (command := wait.next_command(time.monotonic())) is not None:
            wait.feed(self.execute(command), command)
        return wait.result(self.router, time.monotonic())

    def dequeue(self, *job_ids: str) -> int:
        return self.execute(cmds.dequeue(*job_ids))

    def del_job(self, *job_ids: str) -> int:
        self.router.held.release(job_ids)
        return self.execute(cmds.deljob(*job_ids))

    # ------------------------------------------------------------ queues

    def qlen(self, queue: str) -> int:
        return self.execute(cmds.qlen(queue))

    def qstat(self, queue: str) -> QueueStats | None:
        return self.execute(cmds.qstat(queue))

    def qpeek(self, queue: str, count: int) -> list[Job]:
        return self.execute(cmds.qpeek(queue, count))

    def pause(self, queue: str, *options: str) -> str:
        return self.execute(cmds.pause(queue, *options))

    def qscan(self, *, count: int | None = None, **filters: Any) -> Iterator[str]:
        return self._scan(Scan(lambda cursor: cmds.qscan(cursor, count=count, **filters)))

    def jscan(
        self, *, count: int | None = None, queue: str | None = None, states: Sequence[str] = ()
    ) -> Iterator[str]:
        return self._scan(
            Scan(lambda cursor: cmds.jscan(cursor, count=count, queue=queue, states=states))
        )

    def jscan_jobs(
        self, *, count: int | None = None, queue: str | None = None, states: Sequence[str] = ()
    ) -> Iterator[JobInfo]:
        scan: Scan[JobInfo] = Scan(
            lambda cursor: cmds.jscan_all(cursor, count=count, queue=queue, states=states),
            key=lambda info: info.id,
        )
        return self._scan(scan)

    def _scan(self, scan: Scan[T]) -> Iterator[T]:
        address = self._current(_Deadline(self.options.timeout))
        while (command := scan.next_command()) is not None:
            try:
                page = self._once(address, command, _Deadline(self.options.timeout))
            except TimeoutError:
                raise DisqueTimeoutError(f"{command.name} did not complete in time") from None
            yield from scan.feed(page)

    # ------------------------------------------------------------ cluster

    def hello(self) -> HelloInfo:
        hello = self.execute(cmds.hello())
        if self.router.current is not None:
            self.router.learn(self.router.current, hello, time.monotonic())
        return hello

    def ping(self) -> str:
        return self.execute(cmds.ping())

    # ------------------------------------------------------------- pub/sub

    def publish(self, channel: str, message: bytes | str) -> int:
        """PUBLISH: delivered to the subscribers of every node linked to
        the one it is sent to; returns how many clients of that node got
        it. At most once (docs/commands.md)."""
        return self.execute(cmds.publish(channel, message))

    def subscribe(self, *channels: str, patterns: Sequence[str] = ()) -> Subscription:
        """A subscription on a connection of its own, to the client's
        current node: ``get_message()`` or iterate it; ``close()`` it (or
        use it in a ``with``). When its node goes, it subscribes again on
        another (what was published meanwhile is lost)."""
        sub = Subscription(self)
        try:
            sub.subscribe(*channels)
            sub.psubscribe(*patterns)
        except BaseException:
            sub.close()
            raise
        return sub

    def info(self, section: str | None = None) -> str:
        return self.execute(cmds.info(section))

    @property
    def current_node(self) -> Address | None:
        return self.router.current


class Subscription:
    """Client.subscribe(): a connection that receives published messages."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.proto = SubscriberProtocol()
        self._sock: SocketLike | None = None
        self.address: Address | None = None
        self.reconnects = 0  # new connections after the first

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        """Every message, for as long as the subscription is open."""
        while self._sock is not None or self.proto.channels or self.proto.patterns:
            message = self.get_message(timeout=None)
            if message is not None:
                yield message

    @property
    def channels(self) -> list[str]:
        return list(self.proto.channels)

    @property
    def patterns(self) -> list[str]:
        return list(self.proto.patterns)

    def subscribe(self, *channels: str) -> None:
        self._send(self.proto.subscribe(*channels))

    def psubscribe(self, *patterns: str) -> None:
        self._send(self.proto.psubscribe(*patterns))

    def unsubscribe(self, *channels: str) -> None:
        """None named: every channel."""
        self._send(self.proto.unsubscribe(*channels))

    def punsubscribe(self, *patterns: str) -> None:
        """None named: every pattern."""
        self._send(self.proto.punsubscribe(*patterns))

    def get_message(self, timeout: float | None = 0.0) -> Message | None:
        """The next message, waiting at most ``timeout`` seconds (None: as
        long as it takes); None if none came. A connection lost is replaced
        (on another node if its own is gone) within the client's connect
        budget, else DisqueConnectionError."""
        deadline = _Deadline(math.inf if timeout is None else timeout)
        polled = False
        while True:
            message = self.proto.next_message()
            if message is not None:
                return message
            if self._sock is None:
                self._connect()
            sock = self._sock
            assert sock is not None
            left = deadline.left_or_zero()
            if left <= 0 and polled:
                return None
            polled = True
            try:
                sock.settimeout(None if math.isinf(left) else left)
                data = sock.recv(65536)
            except (TimeoutError, BlockingIOError):
                return None
            except OSError:
                data = b""
            if not data:
                self._lost()
                continue
            self.proto.receive_data(data)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self.proto.channels.clear()
        self.proto.patterns.clear()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    # ------------------------------------------------------------ plumbing

    def _send(self, data: bytes) -> None:
        if self._sock is None:
            self._connect()  # subscribes to all, this too
            return
        try:
            self._sock.settimeout(self._client.options.timeout)
            self._sock.sendall(data)
        except OSError:
            self._lost()
            self._connect()

    def _lost(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        if self.address is not None:
            self._client.router.failed(self.address, time.monotonic())

    def _connect(self) -> None:
        """A new connection to the client's current node (another one once
        this one's node failed), subscribed to everything asked so far."""
        client = self._client
        opts = client.options
        errors: list[str] = []
        for _ in range(opts.max_attempts):
            deadline = _Deadline(opts.connect_timeout)
            try:
                address = client._current(deadline)
                sock = client._connector(address, opts.connect_timeout)
            except (DisqueConnectionError, OSError) as e:
                errors.append(str(e))
                continue
            conn = _Connection(sock, address)
            try:
                if opts.password is not None:
                    conn.call(cmds.auth(opts.password), deadline)
                data = self.proto.resubscribe()
                if data:
                    sock.settimeout(opts.timeout)
                    sock.sendall(data)
            except (OSError, ConnectionLostError) as e:
                conn.close()
                client.router.failed(address, time.monotonic())
                errors.append(f"{_fmt(address)}: {e}")
                continue
            if self.address is not None:
                self.reconnects += 1
            self._sock, self.address = sock, address
            return
        raise DisqueConnectionError("could not subscribe: " + "; ".join(errors))


def _fmt(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
