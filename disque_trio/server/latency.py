"""LATENCY: spikes of named events above ``latency-monitor-threshold`` ms.

Events recorded: ``command`` (one command took too long) and
``timer-processing`` (one pass over the due job timers). A deliberately small
version of Redis' latency monitor: enough for LATENCY LATEST / HISTORY /
RESET / DOCTOR to answer sensibly.
"""

from __future__ import annotations

from collections import deque

from ..protocol.replies import Reply

HISTORY_LEN = 160


class LatencyMonitor:
    def __init__(self) -> None:
        # event -> samples of (unix seconds, milliseconds), oldest first
        self.events: dict[str, deque[tuple[int, int]]] = {}
        self.max_ms: dict[str, int] = {}

    def add(self, event: str, unix_s: int, ms: int) -> None:
        samples = self.events.setdefault(event, deque(maxlen=HISTORY_LEN))
        if samples and samples[-1][0] == unix_s:
            # One sample per second per event, keeping the worst.
            ms = max(ms, samples.pop()[1])
        samples.append((unix_s, ms))
        self.max_ms[event] = max(self.max_ms.get(event, 0), ms)

    def latest(self) -> list[Reply]:
        return [
            [event, s[-1][0], s[-1][1], self.max_ms[event]]
            for event, s in sorted(self.events.items())
        ]

    def history(self, event: str) -> list[Reply]:
        return [[ts, ms] for ts, ms in self.events.get(event, ())]

    def reset(self, events: list[str]) -> int:
        names = events or list(self.events)
        count = 0
        for name in names:
            if self.events.pop(name, None) is not None:
                self.max_ms.pop(name, None)
                count += 1
        return count

    def doctor(self) -> str:
        if not self.events:
            return (
                "I have no latency reports to show you at this time. Either the "
                "latency monitor is disabled (latency-monitor-threshold 0) or "
                "nothing was slower than the threshold.\n"
            )
        lines = ["Latency spikes observed, per event:"]
        for event, samples in sorted(self.events.items()):
            avg = sum(ms for _, ms in samples) // len(samples)
            lines.append(
                f"- {event}: {len(samples)} spikes, average {avg} ms, worst {self.max_ms[event]} ms."
            )
        return "\n".join(lines) + "\n"
