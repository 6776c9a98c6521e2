"""Numeric ranges a node can store, checked at every boundary.

Numbers come in as RESP arguments, bus message fields and AOF records.
Python integers never overflow, but msgpack (the bus and the AOF) stops at 64
bits, and the node adds numbers together (an expire time is the clock plus a
TTL; a requeue time adds DELAY and RETRY in milliseconds). A value is
therefore refused where it enters, so that nothing derived from it can fail
later, half way through a command, with a job already held in memory and not
yet on disk.
"""

from __future__ import annotations

from typing import Final

# Any count or time on the bus or in the AOF. The largest derived value, a
# time in ms plus MAX_JOB_SECONDS * 1000, stays far below it.
MAX_INT64: Final = 2**63 - 1

# TTL, RETRY and DELAY, in seconds. The original keeps them in 32 bits (and
# wraps larger values silently); 136 years is plenty for a job.
MAX_JOB_SECONDS: Final = 2**32 - 1
