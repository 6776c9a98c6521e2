"""The key order QSCAN and JSCAN walk (see ``jobcmds.ScanArgs``)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable


class ScanSnapshot:
    """Keys sorted by CRC32, with the hashes alongside for bisecting."""

    __slots__ = ("hashes", "keys")

    def __init__(self, keys: Iterable[str]) -> None:
        pairs = sorted((zlib.crc32(k.encode("utf-8", "surrogateescape")), k) for k in keys)
        self.hashes = [h for h, _ in pairs]
        self.keys = [k for _, k in pairs]
