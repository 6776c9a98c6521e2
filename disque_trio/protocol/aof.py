"""Append-only file records: their bytes, and reading them back with offsets.

The AOF is a sequence of RESP arrays, like the original's, so it can be read
with any RESP tool and checked record by record:

* ``LOADJOB <job>``: a job this node holds, as a msgpack array (its whole
  state: written when the copy is created, and by rewrites);
* ``ACKJOB <id>``: the job was acknowledged here;
* ``DELJOB <id>``: the job was deleted here.

Replaying the records in order rebuilds the jobs: a later LOADJOB replaces
an earlier one, so a rewrite can snapshot the jobs while new records keep
coming and simply append those after the snapshot.

A crash can leave the last record torn; :func:`scan` tells the length of the
well-formed prefix and whether what follows is a torn tail (incomplete: safe
to cut) or damage (bytes that are not a record: stop and tell the operator).
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import msgpack

from .resp import ProtocolError, RequestParser, encode

LOADJOB = b"LOADJOB"
ACKJOB = b"ACKJOB"
DELJOB = b"DELJOB"
_RECORD = b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n"  # every record, as encode() writes it


@attrs.frozen
class JobRecord:
    """Everything needed to rebuild a job after a restart."""

    id: str
    queue: str
    body: bytes
    state: int  # JobState value
    repl: int
    ctime: int
    etime: int  # unix seconds: the AOF stays on this machine, unlike the bus
    delay: int
    retry: int
    nacks: int
    deliveries: int
    nodes_delivered: tuple[str, ...]
    qtime: int
    flags: int


def loadjob(rec: JobRecord) -> bytes:
    payload = msgpack.packb(
        [
            rec.id,
            rec.queue.encode("utf-8", "surrogateescape"),
            rec.body,
            rec.state,
            rec.repl,
            rec.ctime,
            rec.etime,
            rec.delay,
            rec.retry,
            rec.nacks,
            rec.deliveries,
            list(rec.nodes_delivered),
            rec.qtime,
            rec.flags,
        ],
        use_bin_type=True,
    )
    return encode([LOADJOB, payload])


def ackjob(job_id: str) -> bytes:
    return encode([ACKJOB, job_id.encode()])


def deljob(job_id: str) -> bytes:
    return encode([DELJOB, job_id.encode()])


class AofError(Exception):
    """A record that is not one: carries the byte offset where it starts."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"bad record at byte offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


Record = tuple[bytes, JobRecord | str]


def _decode(argv: list[bytes], offset: int) -> Record:
    if len(argv) != 2:
        raise AofError(offset, f"expected 2 arguments, got {len(argv)}")
    name = argv[0].upper()
    if name in (ACKJOB, DELJOB):
        return name, argv[1].decode("latin-1")
    if name != LOADJOB:
        raise AofError(offset, f"unknown record {argv[0][:20]!r}")
    try:
        f = msgpack.unpackb(argv[1], raw=False, strict_map_key=True)
        ints = [int(x) for x in f[3:11]]
        rec = JobRecord(
            str(f[0]),
            bytes(f[1]).decode("utf-8", "surrogateescape"),
            bytes(f[2]),
            ints[0],
            ints[1],
            ints[2],
            ints[3],
            ints[4],
            ints[5],
            ints[6],
            ints[7],
            tuple(str(n) for n in f[11]),
            int(f[12]),
            int(f[13]),
        )
    except Exception as e:  # any shape problem is damage at this offset
        raise AofError(offset, f"malformed LOADJOB: {e}") from None
    return LOADJOB, rec


def records(data: bytes) -> Iterator[tuple[int, int, Record]]:
    """(start, end, record) for each complete record; raises AofError on
    damage. Stops silently at a torn tail: :func:`scan` tells if one exists."""
    parser = RequestParser(max_bulk_len=1 << 40)
    parser.feed(data)
    end = 0
    while True:
        start = end
        # Only RESP arrays are ever written. The request parser alone would
        # take other bytes for an inline command or skip them as a blank
        # line: a run of NUL bytes up to a newline vanished silently and
        # check-aof called the file valid.
        if data[start : start + 1] not in (b"", b"*"):
            raise AofError(start, f"expected '*', got {data[start : start + 1]!r}")
        try:
            argv = parser.next_command()
        except ProtocolError as e:
            raise AofError(start, str(e)) from None
        if argv is None:
            return
        end = len(data) - parser.buffered()
        # The parser neither checks the CRLF after a bulk nor objects to a
        # "*0" header (it skips it): a record must be exactly what encode()
        # writes (other argument counts are refused by _decode).
        if len(argv) == 2 and data[start:end] != _RECORD % (
            len(argv[0]),
            argv[0],
            len(argv[1]),
            argv[1],
        ):
            raise AofError(start, "not a well-formed record (bad CRLF or header)")
        yield start, end, _decode(argv, start)


def scan(data: bytes) -> tuple[int, AofError | None]:
    """(length of the valid prefix, the damage found or None).

    When no damage is found and the prefix is shorter than the data, the rest
    is a torn last record, safe to cut.
    """
    good = 0
    try:
        for _, end, _ in records(data):
            good = end
    except AofError as e:
        return e.offset, e
    return good, None
