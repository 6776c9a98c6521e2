"""SLOWLOG: the last commands that took longer than a threshold."""

from __future__ import annotations

from collections import deque

import attrs

from ..protocol.replies import Reply

MAX_ARGS = 32  # like Redis: keep the first 31 arguments and a "... (N more)"
MAX_ARG_LEN = 128


@attrs.frozen
class SlowEntry:
    id: int
    unix_s: int
    micros: int
    argv: tuple[bytes, ...]
    addr: str
    name: str

    def reply(self) -> list[Reply]:
        return [self.id, self.unix_s, self.micros, list(self.argv), self.addr, self.name]


class SlowLog:
    def __init__(self) -> None:
        self.entries: deque[SlowEntry] = deque()
        self._next_id = 0

    def add(
        self, argv: list[bytes], unix_s: int, micros: int, addr: str, name: str, max_len: int
    ) -> None:
        kept = [
            a
            if len(a) <= MAX_ARG_LEN
            else a[:MAX_ARG_LEN] + b"... (%d more bytes)" % (len(a) - MAX_ARG_LEN)
            for a in argv[: MAX_ARGS - 1]
        ]
        if len(argv) > MAX_ARGS - 1:
            kept.append(b"... (%d more arguments)" % (len(argv) - MAX_ARGS + 1))
        self.entries.appendleft(SlowEntry(self._next_id, unix_s, micros, tuple(kept), addr, name))
        self._next_id += 1
        while len(self.entries) > max(max_len, 0):
            self.entries.pop()

    def get(self, count: int) -> list[Reply]:
        return [e.reply() for e in list(self.entries)[: max(count, 0)]]

    def reset(self) -> None:
        self.entries.clear()
