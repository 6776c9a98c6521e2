"""Node IDs and job IDs.

A job ID is exactly 40 characters::

    D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1
    | |        |                        |
    | |        |                        +-- TTL in minutes, 4 hex digits,
    | |        |                            odd for RETRY > 0, even for RETRY 0
    | |        +-- 24 base64 chars: 144 pseudo-random bits
    | +-- first 8 hex chars of the creating node's ID
    +-- "D-"

The random part comes from SHAKE-128(seed || counter) in counter mode, the
random parts of 64 IDs from each call. One hash call per ID cost 7 % of an
ADDJOB's core under CPython and 40 % under PyPy, where each hashlib call is
dear (1.1 and 3.0 us an ID; batched, 0.5 and 0.14 to 0.24 us, the whole
``next_id``). The seed comes from the node's RNG once, so a simulated node
produces the same IDs for the same seed while a real node never repeats
them. The TTL in the ID lets a node that
never saw a job still expire an acknowledgement for it, and the parity tells
it whether an acknowledgement (a "dummy ack") is worth keeping at all.
"""

from __future__ import annotations

import binascii
import hashlib
import random

JOB_ID_LEN = 40
NODE_ID_LEN = 40
# A u16 of minutes: about 45 days. Longer TTLs saturate in the ID only.
MAX_TTL_MINUTES = 0xFFFF
# IDs whose random parts one hash call makes.
_BATCH = 64


def new_node_id(rng: random.Random) -> str:
    """40 lowercase hex characters (160 random bits), like the original."""
    return f"{rng.getrandbits(160):040x}"


def is_valid_job_id(job_id: str) -> bool:
    """Cheap shape check, the same the original does: length and separators.

    Looking the ID up afterwards is the real check; spending more CPU here
    would only reject IDs that the lookup rejects anyway.
    """
    return (
        len(job_id) == JOB_ID_LEN
        and job_id.startswith("D-")
        and job_id[10] == "-"
        and job_id[35] == "-"
    )


def creator_prefix(job_id: str) -> str:
    """The first 8 hex digits of the ID of the node that made the job."""
    return job_id[2:10]


def ttl_minutes_from_id(job_id: str) -> int:
    """The TTL (minutes) encoded in a well-formed ID; bad hex digits read as 0."""
    value = 0
    for ch in job_id[36:40]:
        digit = int(ch, 16) if ch in "0123456789abcdefABCDEF" else 0
        value = (value << 4) | digit
    return value


def is_at_most_once_id(job_id: str) -> bool:
    """True when the ID says RETRY 0 (even TTL minutes): no dummy ack needed."""
    return ttl_minutes_from_id(job_id) & 1 == 0


class JobIdGenerator:
    """Makes job IDs for one node.

    The state is per node (never module level): several nodes share one
    process in the simulator and must not share a counter.
    """

    __slots__ = ("_batch", "_counter", "_next", "_prefix", "_seed", "_suffixes")

    def __init__(self, node_id: str, rng: random.Random) -> None:
        self._prefix = "D-" + node_id[:8] + "-"
        self._seed = rng.getrandbits(160).to_bytes(20, "big")
        self._counter = 0
        # The random parts of the next IDs, already in base64: 18 bytes are
        # exactly 24 characters, so a batch of 64 encodes in one call, with
        # no padding, and each ID takes the next 24 characters.
        self._batch = ""
        self._next = 0
        # "-" + the 4 TTL hex digits, per (ttl, retry > 0): a handful of values.
        self._suffixes: dict[tuple[int, bool], str] = {}

    def set_node_id(self, node_id: str) -> None:
        """Follow a node ID change (CLUSTER RESET HARD)."""
        self._prefix = "D-" + node_id[:8] + "-"

    def next_id(self, ttl_seconds: int, retry: int) -> str:
        at = self._next
        if at >= len(self._batch):
            self._counter += 1
            shake = hashlib.shake_128(
                self._seed + self._counter.to_bytes(8, "little"), usedforsecurity=False
            )
            raw = shake.digest(18 * _BATCH)
            self._batch = binascii.b2a_base64(raw, newline=False).decode("ascii")
            at = 0
        self._next = at + 24
        middle = self._batch[at : at + 24]
        key = (ttl_seconds, retry > 0)
        suffix = self._suffixes.get(key)
        if suffix is None:
            suffix = self._suffixes[key] = _ttl_suffix(ttl_seconds, retry)
        return self._prefix + middle + suffix


def _ttl_suffix(ttl_seconds: int, retry: int) -> str:
    minutes = min(max(ttl_seconds // 60, 0), MAX_TTL_MINUTES)
    minutes = minutes | 1 if retry > 0 else minutes & ~1
    return f"-{minutes:04x}"
