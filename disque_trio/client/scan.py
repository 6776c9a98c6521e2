"""QSCAN/JSCAN iteration, sans I/O: which command next, what came back.

    scan = Scan(lambda cursor: commands.qscan(cursor, count=100))
    while (command := scan.next_command()) is not None:
        for name in scan.feed(send_and_parse(command)):
            ...

A cursor only means something to the node that gave it, so the shells run
a whole scan on one node. Like SCAN, an item present for the whole
iteration is returned at least once; ``dedupe`` drops the repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from .commands import Command
from .types import ScanPage

__all__ = ["Scan"]

T = TypeVar("T")


class Scan(Generic[T]):
    def __init__(
        self,
        make: Callable[[int], Command[ScanPage[T]]],
        *,
        dedupe: bool = True,
        key: Callable[[T], Hashable] | None = None,
    ) -> None:
        self._make = make
        self._cursor = 0
        self._started = False
        self._seen: set[Hashable] | None = set() if dedupe else None
        self._key = key

    @property
    def done(self) -> bool:
        return self._started and self._cursor == 0

    def next_command(self) -> Command[ScanPage[T]] | None:
        """The command for the next page, or None when the scan is over."""
        return None if self.done else self._make(self._cursor)

    def feed(self, page: ScanPage[T]) -> list[T]:
        """The items of a page (repeats dropped when deduplicating)."""
        self._started = True
        self._cursor = page.cursor
        if self._seen is None:
            return list(page.items)
        fresh = []
        for item in page.items:
            key = self._key(item) if self._key else item
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(item)
        return fresh
