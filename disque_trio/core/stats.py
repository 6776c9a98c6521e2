"""Counters the node keeps for INFO and the metrics endpoint."""

from __future__ import annotations

import attrs


@attrs.define
class NodeStats:
    blocked_clients: int = 0  # GETJOB and WAITJOB clients waiting right now (a gauge)
    expired_jobs: int = 0  # jobs dropped because their TTL elapsed
    acked_jobs: int = 0  # ACKJOB that acknowledged a known job
    added_jobs: int = 0  # jobs created by ADDJOB on this node
    delivered_jobs: int = 0  # jobs handed to GETJOB clients
    # ADDJOBs answered -NOREPL: too few reachable nodes, or the replication
    # timed out or the job expired before enough copies were confirmed.
    replication_failures: int = 0

    def reset(self) -> None:
        """CONFIG RESETSTAT: zero the counters, keep the gauges."""
        blocked = self.blocked_clients
        for field in attrs.fields(NodeStats):
            setattr(self, field.name, 0)
        self.blocked_clients = blocked
