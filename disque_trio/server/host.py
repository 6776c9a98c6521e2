"""What the shell's commands and the web port need of the node.

``NodeServer`` (``server/node.py``) builds the services and runs them; the
modules that serve commands and pages (``admin``, ``clustercmds``, ``info``,
``web``, ``websocket``, ``metrics``, ``observe``) take a :class:`ServerHost`
instead of importing it, so that imports go one way (``node`` imports them,
they import this module), and this list says what they rely on. The
services have narrower ones of their own (``connections.ClientHost``,
``delivery.DeliveryHost``, ``aof.AofHost``, ``peers.BusHost``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

from ..config import Config
from ..core.commands import Command
from ..core.node import Node
from ..core.waiters import Waiter
from ..env import Env
from ..protocol.replies import Reply
from .aof import AppendOnlyFile
from .client import Client
from .latency import LatencyMonitor
from .peers import Bus
from .pubsub import PubSub
from .slowlog import SlowLog
from .tls import TlsContexts, TlsStream


class ServerHost(Protocol):
    config: Config
    env: Env
    node: Node
    aof: AppendOnlyFile
    bus: Bus
    pubsub: PubSub
    tls: TlsContexts
    clients: dict[int, Client]
    commands: dict[str, Command]
    slowlog: SlowLog
    latency: LatencyMonitor
    web_bound: list[tuple[str, int]]
    web_connections: int
    shutdown_requested: bool
    peak_memory: int
    startup_rss: int
    stat_commands: int
    stat_connections: int
    stat_rejected: int
    stat_query_buffer_closed: int
    stat_tls_refused: int
    stat_net_in: int
    stat_net_out: int

    @property
    def port(self) -> int: ...

    # commands and their replies
    def execute(self, client: Client, argv: list[bytes]) -> Reply | Waiter: ...

    def commit(self) -> int: ...

    async def durable(self, seq: int) -> bool: ...

    # clients
    def new_client(self, stream: trio.abc.Stream, kind: str = "normal") -> Client | None: ...

    def drop_client(self, client: Client) -> None: ...

    def open_web_connection(self) -> bool: ...

    def close_web_connection(self) -> None: ...

    async def tls_accept(self, stream: trio.abc.Stream, port: str) -> TlsStream | None: ...

    # the node's life
    def shutdown(self, fsync_aof: bool = True, rewrite_aof: bool = False) -> None: ...

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...

    def config_changed(self, name: str) -> None: ...

    def reset_stats(self) -> None: ...

    def release_memory_after_a_drop(self, now: bool = False) -> None: ...

    # the cluster
    def after_bus_event(self) -> None: ...

    def announce_ip(self) -> str: ...

    def save_cluster_config(self, force: bool = False) -> bool: ...

    # figures (INFO, /metrics, the dashboard)
    def uptime_s(self) -> int: ...

    def used_memory(self) -> int: ...

    def ops_per_sec(self) -> int: ...

    def persistence_info(self) -> list[tuple[str, object]]: ...

    def process_info(self) -> dict[str, Any]: ...

    def extra_info_sections(self, section: str) -> list[str]: ...

    def extra_info(self, name: str) -> tuple[str, list[tuple[str, object]]] | None: ...


@attrs.frozen
class Context:
    """What a shell command handler gets: the node and the calling client."""

    server: ServerHost
    client: Client
