"""The run's trace: every event as one JSON line, digested with sha256."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import trio


class Trace:
    """Events collected in memory, in the order they happened."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def record(self, node: str, category: str, data: dict[str, Any]) -> None:
        try:
            now = trio.current_time()
        except RuntimeError:  # outside trio.run
            now = 0.0
        self.lines.append(
            json.dumps(
                {"t": round(now, 6), "node": node, "cat": category, "data": data},
                sort_keys=True,
                separators=(",", ":"),
            )
        )

    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def dump(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for line in self.lines:
                f.write(line + "\n")
