"""A process's pub/sub listener for the framework adapters: one subscribed
connection, read by a thread of its own.

``Listener.subscribe(key)`` returns once the node confirmed the
subscription (a reply published right after it is then not missed); the
thread hands every message to ``on_message``. When the connection is lost
(its node died), the thread connects to another node (the one the shared
client uses now) and subscribes to everything again; what was published
meanwhile is lost, as pub/sub is at most once (docs/commands.md). A forked
child starts a listener of its own: the parent's socket stays the
parent's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from ..client import DisqueError, Message
from ..client.pubsub import SubscriberProtocol
from ._common import SharedClient

log = logging.getLogger("disque_trio.integrations")

READ_TIMEOUT_S = 0.5  # how often the thread looks whether it was closed
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)  # between reconnection attempts


class Listener:
    """One subscribed connection and its reader thread."""

    def __init__(
        self,
        shared: SharedClient,
        on_message: Callable[[Message], None],
        *,
        password: str | None = None,
        connect_timeout: float = 5.0,
        name: str = "disque-listener",
    ) -> None:
        self._shared = shared
        self._on_message = on_message
        self._password = password
        self._connect_timeout = connect_timeout
        self._name = name
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._proto = SubscriberProtocol()
        self._refs: Counter[tuple[str, str]] = Counter()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()
        self._connected_once = False
        self.reconnects = 0  # connections after the first

    # ------------------------------------------------------------ callers

    def subscribe(self, key: str, *, pattern: bool = False, timeout: float = 5.0) -> None:
        """Listen to a channel (a pattern); returns once a node confirmed
        it, DisqueError if none did within ``timeout``."""
        self._check_fork()
        kind = "p" if pattern else "c"
        with self._lock:
            self._refs[kind, key] += 1
            if self._refs[kind, key] > 1 and (kind, key) in self._proto.live:
                return
            data = self._proto.psubscribe(key) if pattern else self._proto.subscribe(key)
            self._send(data)
            self._start()
            deadline = time.monotonic() + timeout
            while (kind, key) not in self._proto.live:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DisqueError(f"no node confirmed the subscription to {key!r}")
                self._changed.wait(left)

    def unsubscribe(self, key: str, *, pattern: bool = False) -> None:
        kind = "p" if pattern else "c"
        with self._lock:
            if self._refs[kind, key] <= 0:
                return
            self._refs[kind, key] -= 1
            if self._refs[kind, key]:
                return
            del self._refs[kind, key]
            self._send(self._proto.punsubscribe(key) if pattern else self._proto.unsubscribe(key))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            thread = self._thread
        if sock is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * READ_TIMEOUT_S + 1)

    # ------------------------------------------------------------ plumbing

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # A forked child: a listener of its own, subscribed to nothing.
            self._lock = threading.Lock()
            self._changed = threading.Condition(self._lock)
            self._proto = SubscriberProtocol()
            self._refs = Counter()
            self._sock = None
            self._thread = None
            self._pid = os.getpid()

    def _send(self, data: bytes) -> None:
        """Under the lock. Without a connection, the thread's next one
        subscribes to everything asked."""
        if self._sock is None or not data:
            return
        try:
            self._sock.sendall(data)
        except OSError:
            self._drop()

    def _drop(self) -> None:
        """Under the lock: the connection is gone; the thread makes another."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _connect(self) -> socket.socket:
        with self._shared() as client:
            client.ping()  # finds a node that answers (the client's fail-over)
            address = client.current_node
        if address is None:
            raise DisqueError("no node to listen on")
        sock = socket.create_connection(address, timeout=self._connect_timeout)
        sock.settimeout(READ_TIMEOUT_S)
        return sock

    def _run(self) -> None:
        attempt = 0
        while True:
            with self._lock:
                if self._closed:
                    return
                sock = self._sock
            if sock is None:
                try:
                    sock = self._connect()
                except (OSError, DisqueError) as e:
                    pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                    attempt += 1
                    log.warning("pub/sub listener: no connection (%s); again in %.2f s", e, pause)
                    time.sleep(pause)
                    continue
                with self._lock:
                    if self._closed:
                        sock.close()
                        return
                    if self._connected_once:
                        self.reconnects += 1
                    self._connected_once = True
                    self._sock = sock
                    attempt = 0
                    hello = self._proto.resubscribe()  # resets the reader first
                    if self._password is not None:
                        hello = self._proto.auth(self._password) + hello
                    self._send(hello)
                continue
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            with self._lock:
                if not data:
                    if self._sock is sock:
                        self._drop()
                    continue
                messages = self._parse(data)
                self._changed.notify_all()
            for message in messages:
                try:
                    self._on_message(message)
                except Exception:
                    log.exception("pub/sub listener: a message handler failed")

    def _parse(self, data: bytes) -> list[Message]:
        """Under the lock."""
        self._proto.receive_data(data)
        out: list[Message] = []
        try:
            while (message := self._proto.next_message()) is not None:
                out.append(message)
        except DisqueError as e:
            log.warning("pub/sub listener: %s; reconnecting", e)
            self._drop()
        return out
