"""An in-memory disk implementing the Env disk seam.

Each file has a durable part (survives a crash) and a pending part (written
but not fsynced). ``crash()`` drops every pending part, like a power loss.
"""

from __future__ import annotations


class SimDisk:
    def __init__(self) -> None:
        self.durable: dict[str, bytes] = {}
        self.pending: dict[str, bytearray] = {}
        self.fsyncs = 0

    def read(self, path: str) -> bytes | None:
        if path not in self.durable and path not in self.pending:
            return None
        return self.durable.get(path, b"") + bytes(self.pending.get(path, b""))

    def replace(self, path: str, data: bytes) -> None:
        """Atomic and durable (temp file, fsync, rename)."""
        self.pending.pop(path, None)
        self.durable[path] = bytes(data)

    def append(self, path: str, data: bytes) -> None:
        self.durable.setdefault(path, b"")
        self.pending.setdefault(path, bytearray()).extend(data)

    def fsync(self, path: str) -> None:
        self.fsyncs += 1
        pending = self.pending.pop(path, None)
        if pending:
            self.durable[path] = self.durable.get(path, b"") + bytes(pending)

    def close(self, path: str) -> None:
        """Closing does not make data durable."""

    def size(self, path: str) -> int:
        return len(self.durable.get(path, b"")) + len(self.pending.get(path, b""))

    def remove(self, path: str) -> None:
        """Durable at once, like replace (a rename-like metadata change)."""
        self.durable.pop(path, None)
        self.pending.pop(path, None)

    def lock(self, path: str) -> None:
        """Nothing to do: a SimDisk is one node's, and the simulator starts
        its nodes itself (the CLI takes the lock for a real process)."""

    def crash(self, torn: float = 0.0) -> int:
        """Lose what was not fsynced. With ``torn`` in (0, 1] that fraction
        of each file's unsynced bytes reached the platter anyway (a prefix,
        possibly ending mid-record). Returns the bytes kept that way."""
        kept = 0
        if torn > 0:
            for path, pending in self.pending.items():
                n = int(len(pending) * torn)
                if n:
                    self.durable[path] = self.durable.get(path, b"") + bytes(pending[:n])
                    kept += n
        self.pending.clear()
        return kept

    def wipe(self) -> None:
        """The disk is replaced by an empty one (amnesia)."""
        self.durable.clear()
        self.pending.clear()


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
