"""An in-memory disk implementing the Env disk seam.

A file is a list of segments, each ``durable`` (survives a crash),
``pending`` (written, not fsynced) or ``limbo``. Reads see them all, in
order, as a process reads its page cache. ``crash()`` drops every segment
not durable, like a power loss (a torn crash keeps a prefix of the pending
bytes).

A disk can fail (``failing``, an errno): a full one (ENOSPC) refuses
appends, which write nothing (the node's FileDisk cuts a partial write
off), and replaces; a failing one (EIO) takes appends into the page cache
but cannot write them back. Either way ``fsync`` raises, and its pending
bytes go to limbo: still read back, never made durable by a later fsync,
lost at a crash. That is Linux's behaviour after a failed
fsync (the dirty pages are marked clean, the error reported once: the
"fsyncgate" that made PostgreSQL panic on fsync errors), so a node that
retries the fsync and takes its success for the bytes' durability is
caught out.
"""

from __future__ import annotations

import errno as errno_codes
import os
from collections.abc import Callable

DURABLE, PENDING, LIMBO = 0, 1, 2


class SimDisk:
    def __init__(self) -> None:
        self.files: dict[str, list[tuple[int, bytes]]] = {}
        self.fsyncs = 0
        self.failing = 0  # an errno while writes fail; 0 when they work
        self.refuse_writes = False  # appends and replaces fail too (a full disk)
        self.failed_writes = 0  # appends, replaces and fsyncs refused
        self.limbo_bytes = 0  # bytes an fsync failure left never durable
        # A slow disk: each fsync stalls the calling process this long
        # (on_slow_fsync, set by the World: the node's tasks wait).
        self.slow_s = 0.0
        self.on_slow_fsync: Callable[[float], None] | None = None

    # ------------------------------------------------------------ faults

    def fail(self, code: int, writes: bool) -> None:
        """Fsyncs fail with ``code`` (errno) until ``heal``; appends and
        replaces too with ``writes``."""
        self.failing = code
        self.refuse_writes = writes

    def heal(self) -> None:
        self.failing = 0
        self.refuse_writes = False

    def _refuse(self) -> None:
        self.failed_writes += 1
        raise OSError(self.failing, os.strerror(self.failing))

    # -------------------------------------------------------------- seam

    def read(self, path: str) -> bytes | None:
        segments = self.files.get(path)
        if segments is None:
            return None
        return b"".join(data for _, data in segments)

    def written(self, path: str) -> bytes:
        """What a later fsync can still make durable, or already did: the
        file without its limbo segments."""
        return b"".join(data for state, data in self.files.get(path, ()) if state != LIMBO)

    def durable_of(self, path: str) -> bytes:
        """What a crash would keep of the file."""
        return b"".join(data for state, data in self.files.get(path, ()) if state == DURABLE)

    @property
    def durable(self) -> dict[str, bytes]:
        """Each file's durable bytes (what a crash keeps)."""
        return {
            path: b"".join(data for state, data in segments if state == DURABLE)
            for path, segments in self.files.items()
        }

    def replace(self, path: str, data: bytes) -> None:
        """Atomic and durable (temp file, fsync, rename): fails whenever
        fsyncs do."""
        if self.failing:
            self._refuse()
        self.files[path] = [(DURABLE, bytes(data))]

    def append(self, path: str, data: bytes) -> None:
        if self.failing and self.refuse_writes:
            self._refuse()
        segments = self.files.setdefault(path, [])
        if segments and segments[-1][0] == PENDING:
            segments[-1] = (PENDING, segments[-1][1] + bytes(data))
        elif data:
            segments.append((PENDING, bytes(data)))

    def fsync(self, path: str) -> None:
        self.fsyncs += 1
        if self.slow_s and self.on_slow_fsync is not None:
            self.on_slow_fsync(self.slow_s)
        segments = self.files.get(path)
        if self.failing:
            if segments:
                for k, (state, data) in enumerate(segments):
                    if state == PENDING:
                        segments[k] = (LIMBO, data)
                        self.limbo_bytes += len(data)
            self._refuse()
        if segments:
            self.files[path] = [
                (DURABLE, data) if state == PENDING else (state, data) for state, data in segments
            ]

    def close(self, path: str) -> None:
        """Closing does not make data durable."""

    def size(self, path: str) -> int:
        return sum(len(data) for _, data in self.files.get(path, ()))

    def remove(self, path: str) -> None:
        """Durable at once, like replace (a rename-like metadata change)."""
        self.files.pop(path, None)

    def lock(self, path: str) -> None:
        """Nothing to do: a SimDisk is one node's, and the simulator starts
        its nodes itself (the CLI takes the lock for a real process)."""

    def crash(self, torn: float = 0.0) -> int:
        """Lose what was not fsynced. With ``torn`` in (0, 1] that fraction
        of each file's pending bytes reached the platter anyway (a prefix,
        possibly ending mid-record). Limbo bytes are lost whatever ``torn``
        says. Returns the bytes kept that way."""
        kept = 0
        for path, segments in list(self.files.items()):
            out = [(DURABLE, data) for state, data in segments if state == DURABLE]
            if torn > 0:
                pending = b"".join(data for state, data in segments if state == PENDING)
                n = int(len(pending) * torn)
                if n:
                    out.append((DURABLE, pending[:n]))
                    kept += n
            self.files[path] = out
        self.heal()  # the machine restarts with its disk working
        return kept

    def wipe(self) -> None:
        """The disk is replaced by an empty one (amnesia)."""
        self.files.clear()
        self.heal()


# The errno a disk fault fails writes with (FAULT_KINDS' "disk-full" and
# "disk-error").
ENOSPC = errno_codes.ENOSPC
EIO = errno_codes.EIO


class DiskHandle:
    """One node incarnation's view of its SimDisk. After a crash the dead
    incarnation's tasks may still run cleanup code while being cancelled:
    ``alive = False`` makes their writes vanish, as if the process were gone."""

    def __init__(self, disk: SimDisk) -> None:
        self.disk = disk
        self.alive = True

    def read(self, path: str) -> bytes | None:
        return self.disk.read(path)

    def replace(self, path: str, data: bytes) -> None:
        if self.alive:
            self.disk.replace(path, data)

    def append(self, path: str, data: bytes) -> None:
        if self.alive:
            self.disk.append(path, data)

    def fsync(self, path: str) -> None:
        if self.alive:
            self.disk.fsync(path)

    def close(self, path: str) -> None:
        pass

    def size(self, path: str) -> int:
        return self.disk.size(path)

    def remove(self, path: str) -> None:
        if self.alive:
            self.disk.remove(path)

    def lock(self, path: str) -> None:
        self.disk.lock(path)
