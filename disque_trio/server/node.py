"""One node: the core wrapped in its services, and the commit point.

The nursery tree (built by :meth:`NodeServer.run`)::

    NodeServer.run                               the node's nursery
      +-- AppendOnlyFile.run                      the AOF writer (group commit)
      +-- Bus.run                                 the cluster bus (server/peers.py)
      |     +-- accept loop per bus listener
      |     +-- inbound link task per connection  (handshake, decode, dispatch)
      |     +-- outbound link task per known node (connect, handshake, send)
      +-- Delivery.run                            one task per queue with waiting consumers
      +-- Timer.run                               sleeps until the core's next deadline
      +-- Cron.run                                housekeeping ten times a second
      +-- Connections.run                         the client ports (server/connections.py)
      |     +-- accept loop per client / TLS listener
      |     +-- per client: executor (the socket's only writer) + reader (while blocked)
      +-- WebServer.serve                         the web port (server/web.py)
      |     +-- accept loop per web listener, the events hub
      |     +-- task per HTTP connection / WebSocket session
      +-- background tasks                        CLUSTER MEET, BGREWRITEAOF, turning the AOF on
    signal watcher (cli.py, beside the node)      SIGINT/SIGTERM -> shutdown

Every call into the core (a command, a bus message, a timer tick, a
delivery round) ends at the commit point, :meth:`NodeServer.commit`, the one
place that drains the core's effects: AOF records first (to the writer),
then bus messages (held until those records are written, when there are
any), then wake-ups of blocked commands and of queues' delivery tasks, then
log lines. Replies go out after it, once their records are written.

Shutdown stops accepting, answers blocked clients, lets connections finish
their replies for up to ``connections.DRAIN_S``, then cancels the tree.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from math import inf
from typing import Any

import attrs
import trio

from ..config import Config, ConfigError
from ..core import clusterjobs
from ..core.cluster import LEAVING, ClusterTable
from ..core.commands import CORE_COMMANDS, Command
from ..core.effects import Effects, Log, Persist, Send, Wake, WakeQueue
from ..core.ids import new_node_id
from ..core.node import Node
from ..core.waiters import Waiter
from ..env import Env
from ..protocol import bus
from ..protocol.replies import Reply, ReplyError, err
from . import admin, clusterview, tls
from .aof import AppendOnlyFile
from .client import Client
from .connections import DRAIN_S, MONITOR_BUFFER, Connections
from .delivery import Delivery
from .host import Context
from .latency import LatencyMonitor
from .logs import VERBOSE, set_log_level
from .peers import Bus
from .pubsub import PUBSUB_COMMANDS, SUBSCRIBED_OK, PubSub, on_bus_publish, subscribed_only
from .slowlog import SlowLog
from .timer import Cron, Timer
from .tls import TlsContexts, TlsHandshakeError
from .web import WebServer

# Bus messages that are not held until the records of their commit are
# written (NodeServer._apply).
_HEARTBEATS: frozenset[type] = frozenset({bus.Ping, bus.Pong, bus.Meet, bus.Fail})
# Bus messages for the cluster dashboard (server/clusterview.py): none of
# the core's business.
_OBSERVING: frozenset[type] = frozenset(clusterview.MESSAGES)

log = logging.getLogger("disque_trio")


# A full garbage collection after at least this many jobs went away, when at
# most so many are left (its cost grows with the objects still alive).
RELEASE_AFTER_DROP = 100_000
RELEASE_MAX_LIVE = 100_000
STARTUP_LINK_WAIT_S = 1.0  # how long a starting node waits for its peers' first answers
NOAUTH = ReplyError("NOAUTH", "Authentication required.")
OOM = ReplyError("OOM", "command not allowed when used memory > 'maxmemory'.")
# Commands a client may send before AUTH.
_NOAUTH_OK = frozenset({"auth", "hello", "quit"})

Listeners = list[trio.abc.Listener[trio.abc.Stream]]


class ListenError(OSError):
    """A port could not be bound. Says which listener (``client``, ``tls``,
    ``bus`` or ``web``), on which address and port, so that the CLI can name the
    port that is taken and the directive that moves it."""

    def __init__(self, role: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.role = role
        self.host = host
        self.port = port
        self.cause = cause


async def _open_listeners(env: Env, role: str, hosts: Sequence[str], port: int) -> Listeners:
    """Listeners on every address; on failure close what was opened and
    raise ListenError naming the role, address and port."""
    listeners: Listeners = []
    host = ""
    try:
        for host in hosts:
            listeners += await env.net.open_listeners(host, port)
    except BaseException as e:
        for listener in listeners:
            await listener.aclose()
        if isinstance(e, OSError) and not isinstance(e, ListenError):
            raise ListenError(role, host, port, e) from e
        raise
    return listeners


@attrs.frozen
class BoundListeners:
    """What :meth:`NodeServer.bind` opened: client, bus, web and TLS client
    listeners."""

    client: Listeners
    bus: Listeners
    web: Listeners
    tls: Listeners = attrs.Factory(list)


class NodeServer:
    """One node: the core state machine plus everything that talks to it."""

    def __init__(
        self,
        config: Config,
        env: Env,
        *,
        persist_cluster: bool = True,
        tls_contexts: TlsContexts | None = None,
        bus_version: int | None = None,
    ) -> None:
        self.config = config
        self.env = env
        # SSL contexts, built from the tls-* directives unless the caller did
        # (the CLI, to report bad certificate files before anything starts).
        # None of them when TLS is off, as in the simulator.
        self.tls = tls_contexts if tls_contexts is not None else TlsContexts.from_config(config)
        # nodes.conf is written (in `dir`) only by nodes that own a directory:
        # in-process test nodes share the test's working directory.
        self.persist_cluster = persist_cluster
        self._saved_cluster_config = ""
        self._saved_cluster_version = -1
        self._node_flags: dict[str, int] = {}  # last logged flags per peer
        node_id, peers = self._load_cluster_config()
        table = ClusterTable(
            node_id,
            self.announce_ip(),
            config.base_port(),
            config.cluster_bus_port(),
            env.rng,
            config.cluster_node_timeout,
        )
        if bus_version is not None:
            # Play a node of an older release on the bus (the simulator's
            # mixed clusters): it offers, gossips and negotiates no more.
            if not bus.MIN_PROTOCOL_VERSION <= bus_version <= bus.PROTOCOL_VERSION:
                raise ValueError(f"bus_version {bus_version} not spoken by this release")
            table.protocol = bus_version
        for peer_id, ip, port, cport, leaving in peers:
            peer = table.add(peer_id, ip, port, cport)
            if peer is not None and leaving:
                peer.flags |= LEAVING
        self.node = Node(node_id, env.clock, env.rng, table)
        self.node.maxmemory = config.maxmemory
        self.bus = Bus(self, table, self._dispatch)
        self.aof = AppendOnlyFile(self)
        self._loaded = False
        self.commands: dict[str, Command] = {
            **CORE_COMMANDS,
            **admin.SHELL_COMMANDS,
            **PUBSUB_COMMANDS,
        }
        self.pubsub = PubSub()
        # Raw name bytes -> command, so the hot path skips decode and lower().
        self._by_raw_name: dict[bytes, Command] = {}
        self.clients: dict[int, Client] = {}
        # Open HTTP connections of the web port that are not (yet) WebSocket
        # sessions; with the clients they count against maxclients.
        self.web_connections = 0
        self.slowlog = SlowLog()
        self.latency = LatencyMonitor()
        self.peak_memory = 0
        # RSS before any job exists (the interpreter and its modules): what
        # INFO's fragmentation ratio measures the job memory on top of.
        self.startup_rss = env.rss() or 0
        self._jobs_high = 0  # most jobs held since the last full collection
        # (trio time, commands processed) samples for instantaneous_ops_per_sec
        self._ops_samples: list[tuple[float, int]] = []
        self.started_ms = env.clock.wall_ms()
        self.stat_connections = 0
        self.stat_commands = 0
        self.stat_rejected = 0
        self.stat_query_buffer_closed = 0  # clients over client-query-buffer-limit
        self.stat_net_in = 0
        self.stat_net_out = 0
        self.monitors: dict[int, trio.MemorySendChannel[bytes]] = {}
        self.bound: list[tuple[str, int]] = []
        self.tls_bound: list[tuple[str, int]] = []  # the TLS client listeners
        self.stat_tls_refused = 0  # TLS handshakes failed on the client and web ports
        # (host, port) of each web listener, once serving (web_port below).
        self.web_bound: list[tuple[str, int]] = []
        self.web = WebServer(self)
        self.connections = Connections(self, self._tls_client)
        self.delivery = Delivery(self)
        node = self.node
        self.timer = Timer(node.next_deadline, node.now_ms, self._timer_tick, env.alarm())
        self.cron = Cron(self._cron_tick, self._cron_second)
        self.shutdown_requested = False
        self._fsync_at_exit = True
        self._rewrite_at_exit = False
        # Set once the exit's last write began: what arrives after it (a
        # peer's frame read in the same scheduler pass as the cancellation)
        # is not taken in, or the node would hold at its end what its file
        # does not (simulator seed 724138: a job moved to it by YOURJOBS
        # then, not in its AOF after a controlled restart; its giver keeps
        # its copy, as for any message lost).
        self._exiting = False
        self.finished = trio.Event()  # set when run() returns
        self._next_client_id = 0
        self._nursery: trio.Nursery | None = None
        self._background: trio.Nursery | None = None
        self.on_shutdown: list[Callable[[], None]] = []
        self._slow_us = self._slow_max = self._latency_ms = 0
        self._cache_config()

    # ------------------------------------------------------------ lifecycle

    async def run(
        self,
        listeners: Listeners | None = None,
        bus_listeners: Listeners | None = None,
        web_listeners: Listeners | None = None,
        tls_listeners: Listeners | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind (unless given listeners), serve until shutdown, return.

        Given listeners (the CLI after :meth:`bind`, tests, the simulator),
        the node serves exactly those: no web port unless ``web_listeners``,
        no TLS client port unless ``tls_listeners``. Raises OSError if a
        port is taken.
        """
        self.load()
        # The node's identity is on disk before anything it does can name
        # it: killed before its first cron tick, a new node came back with
        # a fresh ID, and the jobs its AOF held listed the old one as a
        # holder, which no node would ever answer for (simulator seed
        # 564200: an acked job that could never be collected). The
        # original saves nodes.conf, fsynced, when it makes its ID.
        self.save_cluster_config()
        if listeners is None:
            bound = await self.bind()
            listeners, bus_listeners, web_listeners = bound.client, bound.bus, bound.web
            tls_listeners = bound.tls
        else:
            self.bound = [_listener_name(listener) for listener in listeners]
        web_listeners = web_listeners or []
        tls_listeners = tls_listeners or []
        self.web_bound = [_listener_name(listener) for listener in web_listeners]
        self.tls_bound = [_listener_name(listener) for listener in tls_listeners]
        try:
            await self._serve(
                listeners, bus_listeners or [], web_listeners, tls_listeners, task_status
            )
        finally:
            self.finished.set()

    async def bind(self) -> BoundListeners:
        """Client, bus, web and TLS listeners (OSError if a port is taken)."""
        listeners = await self._bind()
        tls_listeners = await self._bind_tls(listeners)
        bus_listeners = await self._bind_bus(listeners + tls_listeners)
        web_listeners = await self._bind_web(listeners + tls_listeners + bus_listeners)
        return BoundListeners(listeners, bus_listeners, web_listeners, tls_listeners)

    def load(self) -> None:
        """Load the AOF if configured (once; AofLoadError if unusable)."""
        if not self._loaded:
            self._loaded = True
            self._load_aof()

    async def _bind_bus(self, client_listeners: Listeners) -> Listeners:
        try:
            return await _open_listeners(
                self.env, "bus", self.config.bind, self.config.cluster_bus_port()
            )
        except BaseException:
            for listener in client_listeners:
                await listener.aclose()
            raise

    async def _bind_tls(self, others: Listeners) -> Listeners:
        """The TLS client port's listeners; none without tls-port."""
        port = self.config.tls_port
        if not port or self.tls.clients is None:
            return []
        try:
            return await _open_listeners(self.env, "tls", self.config.bind, port)
        except BaseException:
            for listener in others:
                await listener.aclose()
            raise

    async def _bind_web(self, others: Listeners) -> Listeners:
        """The web port's listeners on every bind address; none when the
        web port is disabled (web-port 0, or port 0 with web-port auto)."""
        port = self.config.web_listen_port()
        if port is None:
            return []
        try:
            return await _open_listeners(self.env, "web", self.config.bind, port)
        except BaseException:
            for listener in others:
                await listener.aclose()
            raise

    async def _serve(
        self,
        listeners: Listeners,
        bus_listeners: Listeners,
        web_listeners: Listeners,
        tls_listeners: Listeners,
        task_status: trio.TaskStatus[None],
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.aof.run)
            await nursery.start(self.bus.run, bus_listeners)
            # Rejoin first, then serve: a restarted node tells its peers it is
            # back, and waits until they answered (their failure flags on it
            # cleared), before its first client can count on it: a client
            # that saw it answer and then asked a peer for REPLICATE N got
            # NOREPL when the peer had not read our PING yet (the original's
            # suite, "Sync REPLJOB messages are retried against old nodes",
            # under load). Clients that connect meanwhile wait in the backlog.
            with trio.move_on_after(STARTUP_LINK_WAIT_S):
                await self.bus.wait_peers_heard()
            await nursery.start(self.delivery.run)
            nursery.start_soon(self.timer.run)
            nursery.start_soon(self.cron.run)
            await nursery.start(self._run_background)
            await nursery.start(self.connections.run, listeners, tls_listeners)
            if web_listeners:
                await nursery.start(self.web.serve, web_listeners)
                web = ", ".join(f"{h}:{p}" for h, p in self.web_bound)
                scheme = "HTTPS, " if self.tls.web else ""
                log.info("web listener on %s (%sdashboard, /metrics, /ws)", web, scheme)
            addrs = ", ".join(
                [f"{h}:{p}" for h, p in self.bound] + [f"{h}:{p} (TLS)" for h, p in self.tls_bound]
            )
            log.info(
                "Disque node %s ready to accept connections on %s", self.node.node_id[:8], addrs
            )
            task_status.started()
        self._nursery = self._background = None

    async def _run_background(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The nursery of tasks commands start (CLUSTER MEET, BGREWRITEAOF)."""
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            await trio.sleep_forever()

    async def _bind(self) -> Listeners:
        port = self.config.port
        listeners: Listeners = []
        if port == 0:
            return listeners  # no plain-text client port (TLS only, or none)
        try:
            for host in self.config.bind:
                got = await _open_listeners(self.env, "client", [host], port)
                self.bound += [_listener_name(listener, host, port) for listener in got]
                listeners += got
        except BaseException:
            for listener in listeners:
                await listener.aclose()
            raise
        return listeners

    @property
    def port(self) -> int:
        """The client port actually bound (tests give listeners on port 0):
        the plain one, else the TLS one. HELLO and INFO tell this one.
        A listener with no socket (in-memory, the simulator's) has no port
        of its own: the configured one is told (HELLO said 0 there)."""
        if self.bound and self.bound[0][1]:
            return self.bound[0][1]
        if self.tls_bound and self.tls_bound[0][1]:
            return self.tls_bound[0][1]
        return self.config.base_port()

    @property
    def web_port(self) -> int | None:
        """The web port actually bound, None when there is no web listener."""
        return self.web_bound[0][1] if self.web_bound else None

    def shutdown(self, fsync_aof: bool = True, rewrite_aof: bool = False) -> None:
        """Stop serving and end :meth:`run`: stop accepting, answer blocked
        clients, write and fsync the AOF (unless the caller did, or was
        told not to: SHUTDOWN, SHUTDOWN NOSAVE), save nodes.conf, then let
        the connections finish their replies for a moment and cancel.
        ``rewrite_aof`` (SHUTDOWN REWRITE-AOF, which wrote a snapshot
        already): the AOF is written again from memory at the exit."""
        if self.shutdown_requested:
            return
        self.shutdown_requested = True
        self._fsync_at_exit = fsync_aof
        self._rewrite_at_exit = rewrite_aof
        log.warning("Disque is now ready to exit, bye bye...")
        for hook in self.on_shutdown:
            hook()
        self.connections.stop()
        self.node.unblock_all(None)
        self.commit()
        self.bus.flush()  # now: the nursery ends soon
        self.aof.write_now(force=True)
        self.save_cluster_config()
        if fsync_aof and self.aof.state == "on":
            try:
                self.env.disk.fsync(self.aof.path)
            except OSError as e:
                log.warning("could not fsync the AOF at shutdown: %s", e.strerror or e)
        self.env.disk.close(self.aof.path)
        if self._nursery is not None:
            self._nursery.start_soon(self._end_after_drain)

    async def _end_after_drain(self) -> None:
        # Polled: this runs once, at shutdown, for DRAIN_S at most; an event
        # would cost every batch of every client a check in the hot path.
        with trio.move_on_after(DRAIN_S):
            while any(c.busy for c in self.clients.values()):  # noqa: ASYNC110
                await trio.sleep(0.01)
        # What ran since (the commands the connections still had, bus
        # messages, timers) is on the disk before the exit too: an ADDJOB
        # answered OK during the drain had its record appended after the
        # last fsync (simulator seed 500542: lost in a crash after the
        # restart). Refusing commands and bus messages after SHUTDOWN
        # instead left a node that still counted as up deaf to its peers
        # (its timers re-queued jobs another holder had postponed) and
        # stalled the simulator's consumers (seeds 511325, 512357, five
        # others).
        #
        # After SHUTDOWN REWRITE-AOF the file is written again from memory:
        # appended records say nothing of queues, and a job queued during
        # the drain (an ADDJOB answered then) came back active at a
        # controlled restart (aof-enqueue-jobs-once), with RETRY 0 never to
        # be queued again (simulator seed 32 of the explorer's controlled
        # restarts, issue 58).
        self._exiting = True
        self.aof.write_now(force=True)
        if self._rewrite_at_exit and self.aof.state == "on":
            try:
                self.aof.shutdown_rewrite()
            except OSError as e:
                log.warning("could not rewrite the AOF at exit: %s", e.strerror or e)
        if self._fsync_at_exit and self.aof.state == "on":
            try:
                self.env.disk.fsync(self.aof.path)
            except OSError as e:
                log.warning("could not fsync the AOF at exit: %s", e.strerror or e)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a background task (CLUSTER MEET, BGREWRITEAOF); none once the
        node is stopping. Its background nursery closes as the stop begins,
        and the cron, cancelled in the same pass, may still tick once and
        start the automatic AOF rewrite: the stop then failed with
        "Nursery is closed to new arrivals" (simulator seed 773936)."""
        nursery = self._background
        if nursery is None:
            return
        try:
            nursery.start_soon(fn, *args)
        except RuntimeError:
            log.debug("not started, the node is stopping: %s", getattr(fn, "__name__", fn))

    async def _tls_client(self, stream: trio.abc.Stream) -> trio.abc.Stream | None:
        return await self.tls_accept(stream, "TLS client")

    async def tls_accept(self, stream: trio.abc.Stream, port: str) -> tls.TlsStream | None:
        """The TLS side of an accepted client or web connection, or None
        when the handshake failed (logged at verbose level, as Redis does:
        port scanners and probes fail handshakes all day)."""
        context = self.tls.clients
        assert context is not None
        try:
            return await tls.accept(stream, context)
        except TlsHandshakeError as e:
            self.stat_tls_refused += 1
            addr, _ = _peer_names(stream)
            log.log(VERBOSE, "%s port: TLS handshake with %s failed: %s", port, addr, e)
            return None

    # -------------------------------------------------------------- clients

    def open_connections(self) -> int:
        """What maxclients bounds: RESP and WebSocket clients, and the open
        HTTP connections of the web port."""
        return len(self.clients) + self.web_connections

    def new_client(self, stream: trio.abc.Stream, kind: str = "normal") -> Client | None:
        """Register a connection; None when maxclients is reached."""
        if self.open_connections() >= self.config.maxclients:
            self.stat_rejected += 1
            return None
        self._next_client_id += 1
        addr, laddr = _peer_names(stream)
        client = Client(self._next_client_id, addr, laddr, self.env.clock.wall_ms(), kind)
        client.authenticated = not self.config.requirepass
        self.clients[client.id] = client
        self.stat_connections += 1
        return client

    def open_web_connection(self) -> bool:
        """Count an HTTP connection of the web port; False (and counted as
        rejected) when maxclients is reached. :meth:`close_web_connection`
        when it ends or becomes a WebSocket client."""
        if self.open_connections() >= self.config.maxclients:
            self.stat_rejected += 1
            return False
        self.web_connections += 1
        return True

    def close_web_connection(self) -> None:
        self.web_connections -= 1

    def drop_client(self, client: Client) -> None:
        self.clients.pop(client.id, None)
        self.monitors.pop(client.id, None)
        if client.pubsub is not None:
            self.pubsub.drop(client)
        if client.blocked is not None:
            self.node.cancel_wait(client.blocked)
            client.blocked = None
        # What giving up produced (the DELJOBs of an abandoned ADDJOB's
        # copies) goes out now, not at the next unit of work.
        self.commit()

    def cancel_wait(self, waiter: Waiter) -> Reply:
        """A blocked command gave up (timeout, client gone): its timeout reply."""
        return self.node.cancel_wait(waiter)

    async def durable(self, seq: int) -> bool:
        return await self.aof.written(seq)

    def monitor_feed(self, client: Client) -> trio.MemoryReceiveChannel[bytes]:
        """MONITOR: this client gets every command other clients send."""
        send, receive = trio.open_memory_channel[bytes](MONITOR_BUFFER)
        self.monitors[client.id] = send
        return receive

    # ------------------------------------------------------------- commands

    def execute(self, client: Client, argv: list[bytes]) -> Reply | Waiter:
        """Run one command for a client: checks, dispatch, stats, monitor."""
        cmd = self._by_raw_name.get(argv[0]) or self._lookup(argv[0])
        if self.monitors:
            self._feed_monitors(client, argv)
        self.stat_commands += 1
        if cmd is None:
            return err(f"unknown command '{argv[0].decode('utf-8', 'replace')}'")
        client.last_cmd = cmd.name
        if not cmd.arity_ok(len(argv)):
            return err(f"wrong number of arguments for '{cmd.name}' command")
        if not client.authenticated and cmd.name not in _NOAUTH_OK:
            return NOAUTH
        sub = client.pubsub
        if sub is not None and client.proto < 3 and cmd.name not in SUBSCRIBED_OK and sub.count():
            return subscribed_only(cmd.name)
        if "denyoom" in cmd.flags and self.node.memory_level() >= 3:
            return OOM
        if self.aof.last_write_error is not None and "write" in cmd.flags:
            misconf = self.aof.misconf()
            if misconf is not None:
                return misconf
        started = self.env.perf()
        try:
            if cmd.core:
                reply = cmd.handler(self.node, argv)
            else:
                reply = cmd.handler(Context(self, client), argv)
        except ReplyError as e:
            # A reply, not an error to trace. Its traceback (and that of the
            # exception it was raised from) holds the frames down from here,
            # which hold the client's parser and buffers, and the caller's
            # frame holds the reply: a cycle, freed only by a full
            # collection. A fuzzer grew RSS to 1.9 GB that way.
            e.__traceback__ = e.__context__ = e.__cause__ = None
            reply = e
        micros = int((self.env.perf() - started) * 1_000_000)
        if micros >= self._slow_us >= 0 or (
            self._latency_ms and micros >= self._latency_ms * 1000
        ):
            self._record_slow(client, argv, micros)
        return reply

    def _lookup(self, raw: bytes) -> Command | None:
        """Case-insensitive command lookup; remembers the spellings it saw
        (only of real commands, so the cache is bounded)."""
        cmd = self.commands.get(raw.decode("utf-8", "surrogateescape").lower())
        if cmd is not None and len(self._by_raw_name) < 4096:
            self._by_raw_name[raw] = cmd
        return cmd

    def _record_slow(self, client: Client, argv: list[bytes], micros: int) -> None:
        unix_s = self.env.clock.wall_ms() // 1000
        if micros >= self._slow_us >= 0:
            self.slowlog.add(argv, unix_s, micros, client.addr, client.name, self._slow_max)
        if self._latency_ms and micros >= self._latency_ms * 1000:
            self.latency.add("command", unix_s, micros // 1000)

    # --------------------------------------------------------- commit point

    def commit(self) -> int:
        """Apply what the core recorded since the last commit, in order:
        AOF records to the writer; bus messages (held until those records,
        and any still unwritten, are on disk: a GOTJOB must not promise a
        copy a crash could lose); wake-ups of blocked commands (their
        replies wait for the same records) and of delivery tasks; log
        lines. Returns the AOF sequence number replies must wait for (0:
        none). Called at the end of every unit of core work; the only place
        that drains the core."""
        effects = self.node.effects
        barrier = 0
        if effects:
            self.node.effects = self.node.cluster.effects = Effects()
            barrier = self._apply(effects)
            self.bus.flush_soon()
        self.timer.reschedule(self.node.next_deadline())
        if barrier or not self.aof.failing:
            return barrier or self.aof.pending
        # Writes fail (a full disk): what this commit changed nothing on
        # disk, so its replies (reads: writes are refused) go now, not
        # after the disk recovers.
        return 0

    def held_sent(self) -> None:
        self.bus.flush_soon()

    def _apply(self, effects: Effects) -> int:
        """Carry out a commit's effects; returns the AOF sequence number of
        its records (0: none)."""
        records = [e.record for e in effects if type(e) is Persist]
        appended = self.aof.append(records) if records else 0
        barrier = appended or self.aof.pending
        send = self.bus.send
        for effect in effects:
            kind = type(effect)
            if kind is Send:
                assert isinstance(effect, Send)
                # Counted from now, the core's instant, not from when the
                # records it waits for are written.
                send_by = trio.current_time() + effect.valid_ms / 1000 if effect.valid_ms else inf
                # Heartbeats promise nothing of jobs: they never wait for
                # records. Held behind a write that fails (a full disk),
                # they made the peers flag this node failing, and itself
                # flag them, and ADDJOBs were refused NOREPL after that.
                if barrier and type(effect.message) not in _HEARTBEATS:
                    self.aof.after_written(
                        barrier, partial(send, effect.peer, effect.message, send_by)
                    )
                else:
                    send(effect.peer, effect.message, send_by)
            elif kind is Wake:
                assert isinstance(effect, Wake)
                effect.waiter.durable = barrier
                effect.waiter.wake()
            elif kind is WakeQueue:
                assert isinstance(effect, WakeQueue)
                self.delivery.wake(effect.queue)
            elif kind is Log:
                assert isinstance(effect, Log)
                log.log(effect.level, "%s", effect.message)
        return appended

    # ------------------------------------------------------------- delivery

    def serve_queue(self, name: str) -> bool:
        q = self.node.queues.get(name)
        if q is None:
            return False
        self.node.serve_waiters(q)
        self.commit()
        return bool(q.waiters)

    def federation_due(self, name: str) -> int | None:
        return clusterjobs.needjobs_due(self.node, name)

    def ask_for_jobs(self, name: str) -> None:
        clusterjobs.need_jobs(self.node, name)
        self.commit()

    def now_ms(self) -> int:
        return self.node.now_ms()

    def wall_ms(self) -> int:
        return self.env.clock.wall_ms()

    def _feed_monitors(self, client: Client, argv: list[bytes]) -> None:
        now = self.env.clock.wall_ms()
        words = " ".join('"' + _escape(a) + '"' for a in argv)
        line = f"+{now // 1000}.{now % 1000:03d}000 [0 {client.addr}] {words}\r\n".encode()
        for cid, channel in list(self.monitors.items()):
            if cid == client.id:
                continue
            try:
                channel.send_nowait(line)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                # A monitor that cannot keep up is disconnected, like Redis'
                # output buffer limit does, rather than slowing the node.
                self.monitors.pop(cid, None)
                channel.close()

    # ---------------------------------------------------------- timer, cron

    def _timer_tick(self) -> None:
        self.node.tick()
        self.commit()

    def _cron_tick(self) -> None:
        """Ten times a second: cluster pings and failure detection, rate
        samples, peak memory, nodes.conf."""
        table = self.node.cluster
        table.cron(self.env.clock.wall_ms())
        self.node.cron()
        for node_id in sorted(table.stuck_links):
            self.bus.restart_link(node_id)
        table.stuck_links.clear()
        self.after_bus_event()
        self._ops_samples.append((trio.current_time(), self.stat_commands))
        del self._ops_samples[:-16]
        self.peak_memory = max(self.peak_memory, self.used_memory())
        self.release_memory_after_a_drop()
        if self.node.cluster.version != self._saved_cluster_version:
            self.save_cluster_config()
        if self.aof.rewrite_due() and self.aof.claim_rewrite():
            self.spawn(self.aof.rewrite, True)

    def _cron_second(self) -> None:
        self.aof.every_second()

    def release_memory_after_a_drop(self, now: bool = False) -> None:
        """Give memory back to the OS once many jobs went away (acked,
        expired, flushed). Freed jobs leave CPython's allocator holding
        1 MB arenas pinned by a few recycled objects (the interpreter's free
        lists of tuples, dicts and floats), and the C allocator holding the
        big blocks it freed: RSS stayed at 1 GB after DEBUG FLUSHALL.
        ``Env.release_memory`` (a full collection, then malloc_trim) gives
        them back. It costs time in proportion to the objects still alive,
        so it runs only when few jobs remain (or ``now``, for DEBUG
        FLUSHALL)."""
        jobs = len(self.node.jobs)
        self._jobs_high = max(self._jobs_high, jobs)
        dropped = self._jobs_high - jobs
        if now or (dropped >= RELEASE_AFTER_DROP and jobs <= RELEASE_MAX_LIVE):
            self.node.forget_shared_ints()
            self.env.release_memory()
            self._jobs_high = jobs

    # -------------------------------------------------------------- cluster

    def announce_ip(self) -> str:
        """The IP other nodes should dial: the announce setting, else the
        first bind address unless it is a wildcard."""
        if self.config.cluster_announce_ip:
            return self.config.cluster_announce_ip
        first = self.config.bind[0] if self.config.bind else ""
        return "127.0.0.1" if first in ("", "0.0.0.0", "::", "*") else first

    def _dispatch(self, sender: str, msg: object) -> None:
        """A bus message arrived from a known node (or a QUEUED from one
        that passed the handshake and is not in the table yet)."""
        if self._exiting:
            return
        table = self.node.cluster
        if isinstance(msg, bus.Heartbeat):
            table.on_heartbeat(msg, self.env.clock.wall_ms())
            self.bus.sync_links_if_moved()
        elif isinstance(msg, bus.Fail):
            table.on_fail(msg, self.env.clock.wall_ms())
        elif type(msg) is bus.Publish:
            peer = table.nodes.get(sender)
            if peer is not None:
                table.heard_from(peer)
                on_bus_publish(self.pubsub, msg)
        elif type(msg) in _OBSERVING:  # a dashboard's questions and answers
            peer = table.nodes.get(sender)
            if peer is not None:
                table.heard_from(peer)  # as any message: it is alive
                self.web.cluster.on_message(sender, msg)
        else:  # job traffic, by the thousand a second: no clock read
            peer = table.nodes.get(sender)
            if peer is None:
                clusterjobs.receive_from_stranger(self.node, sender, msg)
                return
            table.heard_from(peer)
            clusterjobs.receive(self.node, sender, msg)

    def after_bus_event(self) -> None:
        """Refresh the cluster view, save nodes.conf if membership moved,
        then commit."""
        self.node.refresh_cluster_view()
        self._log_flag_changes()
        self.bus.progress()
        if self.node.cluster.version != self._saved_cluster_version:
            # Before anything else can happen: a node killed right after
            # meeting a peer must come back with the same identity.
            self.save_cluster_config()
        self.commit()

    def _log_flag_changes(self) -> None:
        """Log nodes turning fail?/fail/leaving and back, like the original.
        Compares the flag bits (this runs after every bus message); the
        names are built only for a change."""
        seen = self._node_flags
        myself = self.node.cluster.myself
        for node in self.node.cluster.nodes.values():
            if seen.get(node.node_id, 0) != node.flags and node is not myself:
                seen[node.node_id] = node.flags
                log.info("node %s is now %s", node.node_id[:8], node.flag_names())

    def _load_cluster_config(self) -> tuple[str, list[tuple[str, str, int, int, bool]]]:
        """Our node ID and known peers from nodes.conf, or a fresh ID."""
        if not self.persist_cluster:
            return new_node_id(self.env.rng), []
        path = self.config.cluster_config_file
        text = self.env.disk.read(path)
        if text is None:
            return new_node_id(self.env.rng), []
        try:
            rows = ClusterTable.parse_config(text.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"Unrecoverable error: corrupted cluster config file {path}: {e}"
            ) from None
        mine = [r for r in rows if r[4]]
        if len(mine) != 1:
            raise ConfigError(f"Unrecoverable error: {path} must name exactly one 'myself' node")
        peers = [(r[0], r[1], r[2], r[3], r[5]) for r in rows if not r[4]]
        return mine[0][0], peers

    def save_cluster_config(self, force: bool = False) -> bool:
        """Write nodes.conf (atomically) when membership changed. False
        when the disk refused it (the next cron tick tries again)."""
        if not self.persist_cluster:
            return True
        self._saved_cluster_version = self.node.cluster.version
        text = self.node.cluster.to_config()
        if text == self._saved_cluster_config and not force:
            return True
        try:
            self.env.disk.replace(self.config.cluster_config_file, text.encode())
            self._saved_cluster_config = text
        except OSError as e:
            self._saved_cluster_version = -1  # the next cron tick tries again
            log.warning("could not save %s: %s", self.config.cluster_config_file, e)
            return False
        return True

    # ----------------------------------------------------------------- info

    def ops_per_sec(self) -> int:
        samples = self._ops_samples
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return int((c1 - c0) / (t1 - t0))

    def used_memory(self) -> int:
        return self.node.memory_estimate()

    def persistence_info(self) -> list[tuple[str, object]]:
        return self.aof.info()

    def _load_aof(self) -> None:
        """Rebuild jobs from the AOF before serving. A controlled restart
        (aof-enqueue-jobs-once set now, or when SHUTDOWN REWRITE-AOF wrote
        the file) loads it even with appendonly no, then turns the option
        off again."""
        config = self.config
        marked = self.aof.restart_marked()
        enqueue_once = config.aof_enqueue_jobs_once or marked
        if not (config.appendonly or enqueue_once):
            return
        if config.appendonly:
            self.node.persisting = True
        self.aof.loading = True
        try:
            self.aof.load(enqueue_once)
        finally:
            self.aof.loading = False
        if not config.appendonly:
            self.aof.turn_off()
        log.info("%s", self.aof.load_summary())
        if marked:
            self.aof.clear_restart_mark()
        if config.aof_enqueue_jobs_once:
            config.config_set("aof-enqueue-jobs-once", "no")
            if config.path is not None:
                try:
                    config.rewrite()
                except ConfigError as e:
                    log.warning("could not turn aof-enqueue-jobs-once off in the config: %s", e)

    def extra_info_sections(self, section: str) -> list[str]:
        """Sections other layers add to INFO default/all (cluster, ...)."""
        return []

    def extra_info(self, name: str) -> tuple[str, list[tuple[str, object]]] | None:
        return None

    def config_changed(self, name: str) -> None:
        """React to CONFIG SET of a directive that has a live effect."""
        if name == "loglevel":
            set_log_level(self.config.loglevel)
        elif name == "appendonly":
            if self.config.appendonly:
                self.spawn(self.aof.turn_on)
            else:
                self.aof.turn_off()
        elif name == "maxmemory":
            self.node.maxmemory = self.config.maxmemory
        elif name == "cluster-node-timeout":
            self.node.cluster.timeout_ms = self.config.cluster_node_timeout
        elif name == "cluster-secret":
            self.bus.secret_changed()
        self._cache_config()

    def _cache_config(self) -> None:
        """Copy the settings the per-command path reads (a dict lookup each
        is measurable at 50k commands per second)."""
        self._slow_us = self.config.slowlog_log_slower_than
        self._slow_max = self.config.slowlog_max_len
        self._latency_ms = self.config.latency_monitor_threshold
        limit = self.config.pubsub_output_buffer_limit
        self.pubsub.hard, self.pubsub.soft = limit.hard, limit.soft
        self.pubsub.soft_seconds = limit.soft_seconds

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT."""
        self.stat_connections = self.stat_commands = self.stat_rejected = 0
        self.stat_query_buffer_closed = self.stat_net_in = self.stat_net_out = 0
        self.stat_tls_refused = 0
        hub = self.pubsub
        hub.published = hub.received = hub.delivered = hub.dropped_clients = 0
        self.node.stats.reset()
        self.slowlog.reset()
        self.peak_memory = self.used_memory()

    def uptime_s(self) -> int:
        return (self.env.clock.wall_ms() - self.started_ms) // 1000

    def process_info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "executable": sys.argv[0] if sys.argv else ""}


def _escape(arg: bytes) -> str:
    out = []
    for b in arg:
        ch = chr(b)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append({10: "\\n", 13: "\\r", 9: "\\t"}.get(b, f"\\x{b:02x}"))
    return "".join(out)


def _listener_name(
    listener: trio.abc.Listener[trio.abc.Stream], host: str = "memory", port: int = 0
) -> tuple[str, int]:
    sock = getattr(listener, "socket", None)
    if sock is None:
        return host, port
    name = sock.getsockname()
    return str(name[0]), int(name[1])


def _peer_names(stream: trio.abc.Stream) -> tuple[str, str]:
    sock = getattr(tls.unwrap(stream), "socket", None)
    if sock is None:
        return "memory:0", "memory:0"
    try:
        peer, local = sock.getpeername(), sock.getsockname()
    except OSError:
        return "?:0", "?:0"
    return f"{peer[0]}:{peer[1]}", f"{local[0]}:{local[1]}"
