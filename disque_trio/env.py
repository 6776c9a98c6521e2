"""The seams between a node and the world: clock, randomness, network, disk.

Node code (``core`` and ``server``) reaches the outside only through an
:class:`Env`. Production uses :func:`real_env`; the simulator builds an Env
with a virtual clock, a seeded RNG, in-memory streams and in-memory files, so
that the code under simulation is the code that runs over TCP. This module is
the one place allowed to read the real clock and the OS entropy pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import os
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import BinaryIO, Final, Protocol

import attrs
import trio

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (may jump)."""
        ...

    def mono_ms(self) -> int:
        """Monotonic milliseconds from an arbitrary origin (never jumps)."""
        ...


class Net(Protocol):
    async def open_listeners(
        self, host: str, port: int
    ) -> list[trio.abc.Listener[trio.abc.Stream]]:
        """Bind a listening socket (raises OSError when the port is taken)."""
        ...

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """Open a stream to a peer."""
        ...


class Disk(Protocol):
    def read(self, path: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        ...

    def replace(self, path: str, data: bytes) -> None:
        """Atomically replace a file's content (write temp, fsync, rename)."""
        ...

    def append(self, path: str, data: bytes) -> None:
        """Append to a file (created if missing); durable only after fsync.
        All or nothing: a failed append leaves the file as it was."""
        ...

    def fsync(self, path: str) -> None: ...

    def close(self, path: str) -> None:
        """Stop appending to a file (its handle, if any, is released)."""
        ...

    def size(self, path: str) -> int: ...

    def remove(self, path: str) -> None:
        """Delete a file (nothing if it does not exist)."""
        ...

    def lock(self, path: str) -> None:
        """Hold ``path`` for this process until it ends: raises
        :class:`LockedError` when another process holds it, OSError when it
        cannot be locked at all (its directory is not writable)."""
        ...


class LockedError(Exception):
    """A file a node keeps to itself (its cluster-config-file) is held by
    another process: :meth:`Disk.lock`."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid  # the holder's, when its lock file names it
        holder = f" (pid {pid})" if pid is not None else ""
        super().__init__(f"{path} is in use by another disque-trio node{holder}")


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def mono_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class TrioClock:
    """Wall time that follows Trio's clock: under ``MockClock`` job timers
    run on virtual time (tests, simulator). ``skew_ms`` shifts it."""

    def __init__(self, base_ms: int = 1_700_000_000_000, skew_ms: int = 0) -> None:
        self.base_ms = base_ms
        self.skew_ms = skew_ms

    def wall_ms(self) -> int:
        return self.base_ms + self.skew_ms + int(trio.current_time() * 1000)

    def mono_ms(self) -> int:
        return int(trio.current_time() * 1000)


class TcpNet:
    async def open_listeners(
        self, host: str, port: int
    ) -> list[trio.abc.Listener[trio.abc.Stream]]:
        listeners = await trio.open_tcp_listeners(port, host=host)
        return list(listeners)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(host, port)
        sock = stream.socket
        if sock.getsockname() == sock.getpeername():
            # A TCP self-connection: nothing listened on a loopback port in
            # the ephemeral range, and the kernel picked that very port as
            # our source port. Closed normally it would sit in TIME_WAIT for
            # a minute, keeping the node that owns the port (restarting
            # after a crash) from binding it. Reset it instead.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            raise ConnectionRefusedError(f"{host}:{port}: connected to itself (nothing listens)")
        return stream


class FileDisk:
    """Real files. Writes happen on the event loop: they are small appends
    to the page cache; only fsync may take long, and the AOF writer task is
    the one that calls it."""

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def replace(self, path: str, data: bytes) -> None:
        self.close(path)  # an append handle would keep writing the old file
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def __init__(self) -> None:
        # Files being appended to stay open: the AOF appends after every
        # batch of commands, and an open() per batch would dominate. Raw
        # (unbuffered) files, so that a failed write leaves no bytes behind
        # in a buffer to go out with the next one.
        self._open: dict[str, BinaryIO] = {}
        # lock(): path -> the descriptor of its lock file.
        self._locks: dict[str, int] = {}

    def append(self, path: str, data: bytes) -> None:
        f = self._open.get(path)
        if f is None:
            f = self._open[path] = open(path, "ab", buffering=0)  # noqa: SIM115 (kept open)
        fd = f.fileno()
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            # A full disk takes part of it: cut that part off, so that the
            # file never holds half a record (a retry writes it whole),
            # as Redis does.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise

    def fsync(self, path: str) -> None:
        f = self._open.get(path)
        if f is not None:
            os.fsync(f.fileno())
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self, path: str) -> None:
        f = self._open.pop(path, None)
        if f is not None:
            f.close()

    def size(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return 0

    def remove(self, path: str) -> None:
        self.close(path)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def lock(self, path: str) -> None:
        # An flock() on a lock file beside the path (nodes.conf.lock), not
        # on the path itself: replace() renames a new file over the path,
        # so a lock on nodes.conf would guard only the inode the node found
        # at start, gone at its first save, and a second node would lock
        # the new one and start. flock(), not fcntl()/lockf(): a POSIX
        # record lock belongs to the whole process, never conflicts with
        # another lock of the same process, and is dropped when any
        # descriptor of the file is closed; flock's belongs to this open
        # file. The kernel drops either when the process dies, SIGKILL
        # included. The descriptor is a raw one, kept until the process
        # ends (or unlock()) even if this FileDisk is dropped; the lock
        # file is never removed (a node that opened it just before the
        # unlink would lock the old inode, and the next one a new file of
        # the same name). It holds the pid of its holder, for the message.
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise LockedError(os.path.abspath(path), holder) from None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # the pid is a courtesy; the lock is what counts
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._locks[path] = fd

    def unlock(self, path: str) -> None:
        """Release :meth:`lock` before the process ends (tests)."""
        fd = self._locks.pop(path, None)
        if fd is not None:
            os.close(fd)


def _holder_pid(fd: int) -> int | None:
    """The pid a lock file names, or None (empty: its holder has not
    written it yet)."""
    try:
        return int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (OSError, ValueError):
        return None


class Alarm(Protocol):
    """A sleep whose end can move while it sleeps (Trio time, seconds)."""

    async def sleep_until(self, deadline: float) -> None: ...

    def move(self, deadline: float) -> None:
        """The sleep in progress ends at ``deadline`` instead."""


class ScopeAlarm:
    """The node's alarm: a cancel scope whose deadline moves."""

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None

    async def sleep_until(self, deadline: float) -> None:
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                self._scope = scope
                await trio.sleep_forever()
        finally:
            self._scope = None

    def move(self, deadline: float) -> None:
        if self._scope is not None:
            self._scope.deadline = deadline


@attrs.define
class Env:
    clock: Clock
    rng: random.Random
    net: Net
    disk: Disk
    # Resident memory in bytes, or None where it cannot be read (simulation).
    rss: Callable[[], int | None] = lambda: None
    # A high-resolution timer for measuring how long a command took (SLOWLOG,
    # LATENCY). The simulator passes one that follows virtual time.
    perf: Callable[[], float] = time.perf_counter
    # Stop the whole node for that many seconds (DEBUG SLEEP). In production
    # the event loop really stops; the simulator freezes the node instead.
    block: Callable[[float], None] = lambda seconds: None
    # Give freed memory back to the OS after many jobs went away (a full
    # garbage collection, then the C allocator's trim). Nothing to do in
    # the simulator.
    release_memory: Callable[[], None] = lambda: None
    # Unpredictable bytes (bus handshake nonces): the OS's in production;
    # unset, they come from rng, so that simulated runs replay exactly.
    secure_bytes: Callable[[int], bytes] | None = None
    # A new alarm for the node's timer task (server/timer.py). The simulator
    # makes them of its virtual timers: a wake-up without a cancel scope.
    alarm: Callable[[], Alarm] = ScopeAlarm

    def token_bytes(self, count: int) -> bytes:
        if self.secure_bytes is not None:
            return self.secure_bytes(count)
        return self.rng.randbytes(count)


def _read_rss() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _release_memory() -> None:
    """A full collection clears the interpreter's free lists, which pin
    CPython's arenas; malloc_trim (glibc only; elsewhere skipped) returns
    the free pages of the C heap."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM: Final = _find_malloc_trim()


def real_env() -> Env:
    return Env(
        clock=SystemClock(),
        rng=random.Random(int.from_bytes(os.urandom(16), "big")),
        net=TcpNet(),
        disk=FileDisk(),
        rss=_read_rss,
        block=time.sleep,
        secure_bytes=os.urandom,
        release_memory=_release_memory,
    )
