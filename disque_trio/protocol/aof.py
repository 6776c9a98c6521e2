"""Append-only file records: their bytes, and reading them back with offsets.

The AOF is a sequence of RESP arrays, like the original's, so it can be read
with any RESP tool and checked record by record:

* ``LOADJOB <job>``: a job this node holds, as a msgpack array (its whole
  state, and the holders still in their handshake here when there are
  any: written when the copy is created, when it changes, and by
  rewrites);
* ``ACKJOB <id>``: the job was acknowledged here (with no LOADJOB of the
  job before it: a dummy ack, an acknowledgement of a job this node never
  held, which a replay makes again);
* ``DELJOB <id>``: the job was deleted here.

Replaying the records in order rebuilds the jobs: a later LOADJOB replaces
an earlier one, so a rewrite can snapshot the jobs while new records keep
coming and simply append those after the snapshot.

A crash can leave the last record torn; :func:`scan` tells the length of the
well-formed prefix and whether what follows is a torn tail (incomplete: safe
to cut) or damage (bytes that are not a record: stop and tell the operator).

Damage in the middle does not doom what follows it. Every record starts with
the same bytes (``*2\r\n$``) and its two lengths say exactly where it ends,
so :func:`analyze` skips damaged bytes up to the next place where a whole,
well-formed record begins and reads on from there: ``check-aof --fix`` keeps
every valid record before and after the damage and drops only the damaged
spans. Since a job body may hold any bytes, including a record's, a record
found by skipping must also carry a well-formed job ID to count as the place
to resume. A damaged length can also make a record look longer than it is:
it then ends inside the next one and what follows does not parse; when a
record starts inside the one just read, that one is taken as damaged and
reading resumes at the record it swallowed. (A damaged length that lands
exactly on a later record boundary cannot be told from a valid record.)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import attrs
import msgpack

from .limits import MAX_INT64, MAX_JOB_SECONDS
from .resp import encode

LOADJOB = b"LOADJOB"
ACKJOB = b"ACKJOB"
DELJOB = b"DELJOB"
# Every record is the array "*2\r\n$<len>\r\n<name>\r\n$<len>\r\n<payload>\r\n".
_ARRAY2 = b"*2\r\n"
_RECORD_START = b"*2\r\n$"
HEADERS = {name: b"*2\r\n$%d\r\n%b\r\n" % (len(name), name) for name in (LOADJOB, ACKJOB, DELJOB)}
_MAX_LEN_DIGITS = 20
_RUNS_INTO = "an incomplete record with valid records after it (a damaged length?)"
_SWALLOWS = "a record whose length runs over the start of the next one (a damaged length?)"
# A job ID as ids.py makes them: "D-", 8 hex digits, 24 base64 characters, 4 hex digits.
JOB_ID_RE = re.compile(rb"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")


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
    # Holders a peer's list named while still in their handshake here
    # (core/records.merge_holders): added to the list once they answer.
    # Written only when there are any, as a 15th element; an older node
    # reads the first 14 and ignores it.
    pending: tuple[str, ...] = ()


def loadjob(rec: JobRecord) -> bytes:
    fields: list[object] = [
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
    ]
    if rec.pending:
        fields.append(list(rec.pending))
    return encode([LOADJOB, msgpack.packb(fields, use_bin_type=True)])


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


def _int(value: object, highest: int) -> int:
    """A number of a LOADJOB, within what the node stores (ValueError if
    not: the record is damaged)."""
    if type(value) is not int or not 0 <= value <= highest:
        raise ValueError(f"{value!r} is not an integer in 0..{highest}")
    return value


def _decode(argv: list[bytes], offset: int) -> Record:
    name = argv[0].upper()
    if name in (ACKJOB, DELJOB):
        return name, argv[1].decode("latin-1")
    if name != LOADJOB:
        raise AofError(offset, f"unknown record {argv[0][:20]!r}")
    try:
        f = msgpack.unpackb(argv[1], raw=False, strict_map_key=True)
        # state, repl, ctime, etime, delay, retry, nacks, deliveries
        highest = (MAX_INT64,) * 4 + (MAX_JOB_SECONDS,) * 2 + (MAX_INT64,) * 2
        ints = [_int(x, top) for x, top in zip(f[3:11], highest, strict=True)]
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
            _int(f[12], MAX_INT64),
            _int(f[13], MAX_INT64),
            tuple(str(n) for n in f[14]) if len(f) > 14 else (),
        )
    except Exception as e:  # any shape problem is damage at this offset
        raise AofError(offset, f"malformed LOADJOB: {e}") from None
    return LOADJOB, rec


def _bulk_at(data: bytes, at: int, start: int) -> tuple[bytes, int] | None:
    """The bulk string ``$<len>\\r\\n<bytes>\\r\\n`` at ``at``: (bytes, end);
    None when the data ends before it does; AofError (for the record that
    starts at ``start``) when the bytes are not one, exactly as encode()
    writes it (no sign, no leading zero, CRLF after the bytes)."""
    size = len(data)
    if at >= size:
        return None
    if data[at] != 0x24:  # "$"
        raise AofError(start, f"expected '$' at byte {at}, got {data[at : at + 1]!r}")
    eol = data.find(b"\r\n", at + 1, at + 3 + _MAX_LEN_DIGITS)
    if eol < 0:
        digits = data[at + 1 : at + 3 + _MAX_LEN_DIGITS].removesuffix(b"\r")
        if at + 3 + _MAX_LEN_DIGITS > size and (not digits or digits.isdigit()):
            return None  # the data ends inside the length
        raise AofError(start, f"bad bulk length at byte {at}")
    digits = data[at + 1 : eol]
    if not digits.isdigit() or (digits[0] == 0x30 and len(digits) > 1):
        raise AofError(start, f"bad bulk length {digits[:24]!r} at byte {at}")
    first = eol + 2
    stop = first + int(digits)
    trailer = data[stop : stop + 2]
    if trailer != b"\r\n"[: len(trailer)]:
        raise AofError(start, f"no CRLF after the {int(digits)} bytes at byte {first}")
    if len(trailer) < 2:
        return None
    return data[first:stop], stop + 2


def record_at(data: bytes, pos: int) -> tuple[int, Record] | None:
    """The record that starts at ``pos``: (its end, the record). None when
    the data ends before the record does (a torn record, or a length that
    runs past the end of the data); AofError when the bytes at ``pos`` are
    not a record."""
    head = data[pos : pos + 4]
    if head != _ARRAY2[: len(head)]:
        raise AofError(pos, f"expected a record ('*2'), got {data[pos : pos + 8]!r}")
    if len(head) < 4:
        return None
    name = _bulk_at(data, pos + 4, pos)
    if name is None:
        return None
    payload = _bulk_at(data, name[1], pos)
    if payload is None:
        return None
    if name[0].upper() not in HEADERS:
        raise AofError(pos, f"unknown record {name[0][:20]!r}")
    return payload[1], _decode([name[0], payload[0]], pos)


def records(data: bytes) -> Iterator[tuple[int, int, Record]]:
    """(start, end, record) for each complete record; raises AofError on
    damage. Stops silently at an incomplete record: :func:`scan` tells
    whether that is a torn tail or damage with records after it."""
    pos = 0
    size = len(data)
    while pos < size:
        got = record_at(data, pos)
        if got is None:
            return
        end, record = got
        yield pos, end, record
        pos = end


@attrs.frozen
class Span:
    """Bytes ``[start, end)`` that are not records, and why."""

    start: int
    end: int
    reason: str

    @property
    def size(self) -> int:
        return self.end - self.start


@attrs.frozen
class Analysis:
    """A whole file, record by record: what is valid, what is not."""

    size: int
    # Every valid record, in order: before, between and after damaged spans.
    records: list[tuple[int, int, Record]]
    # Bytes that are not records, each followed by a valid record or by the end.
    damaged: list[Span]
    # An incomplete last record with nothing valid after it (a torn write).
    torn: Span | None

    @property
    def valid(self) -> bool:
        return not self.damaged and self.torn is None

    @property
    def dropped(self) -> list[Span]:
        """Every span that a repair drops, in file order."""
        return self.damaged + ([self.torn] if self.torn is not None else [])

    @property
    def ok_up_to(self) -> int:
        """The length of the valid prefix."""
        dropped = self.dropped
        return dropped[0].start if dropped else self.size

    def repaired(self, data: bytes) -> bytes:
        """The file with the dropped spans cut out: every valid record."""
        return b"".join(data[start:end] for start, end, _ in self.records)


def analyze(data: bytes) -> Analysis:
    """Read every record, skipping damaged spans (see the module comment)."""
    found: list[tuple[int, int, Record]] = []
    damaged: list[Span] = []
    torn = None
    pos = 0
    size = len(data)
    while pos < size:
        reason = None
        try:
            got = record_at(data, pos)
        except AofError as e:
            got, reason = None, e.reason
        if got is not None:
            end, record = got
            found.append((pos, end, record))
            pos = end
            continue
        if found and found[-1][1] == pos:
            # Damage right after a record: if a record starts inside that
            # one, its length was damaged and it swallowed the start of the
            # next one. It is damage too; read on from the swallowed record.
            before = found[-1][0]
            inner = resync(data, before + 1)
            if inner is not None and inner < pos:
                found.pop()
                damaged.append(Span(before, inner, _SWALLOWS))
                pos = inner
                continue
        resume = resync(data, pos + 1)
        if resume is None:
            if reason is None:
                torn = Span(pos, size, "incomplete last record (a torn write)")
            else:
                damaged.append(Span(pos, size, reason))
            break
        if reason is None:
            reason = _RUNS_INTO
        damaged.append(Span(pos, resume, reason))
        pos = resume
    return Analysis(size, found, damaged, torn)


def resync(data: bytes, start: int) -> int | None:
    """The first offset at or after ``start`` where a whole, well-formed
    record begins that carries a well-formed job ID; None if there is none."""
    at = data.find(_RECORD_START, start)
    while at >= 0:
        try:
            got = record_at(data, at)
        except AofError:
            got = None
        if got is not None and _has_job_id(got[1]):
            return at
        at = data.find(_RECORD_START, at + 1)
    return None


def _has_job_id(record: Record) -> bool:
    _, payload = record
    job_id = payload.id if isinstance(payload, JobRecord) else payload
    return JOB_ID_RE.fullmatch(job_id.encode("latin-1", "replace")) is not None


def scan(data: bytes) -> tuple[int, AofError | None]:
    """(length of the valid prefix, the first damage or None).

    When no damage is found and the prefix is shorter than the data, the rest
    is a torn last record, safe to cut. Damage is reported even when valid
    records follow it: an incomplete record followed by valid ones is damage
    too (a corrupted length), never a tail to cut.
    """
    good = 0
    try:
        for _, end, _ in records(data):
            good = end
    except AofError:
        pass
    else:
        if good == len(data) or resync(data, good + 1) is None:
            return good, None  # valid, or a torn tail
    # Damaged: the whole analysis tells where the damage starts (it may be
    # a record before the one that failed to parse).
    first = analyze(data).damaged[0]
    return first.start, AofError(first.start, first.reason)


def looks_like_aof(data: bytes) -> bool:
    """Whether the data starts like an AOF: empty, or with a record's header
    (LOADJOB, ACKJOB or DELJOB), whole or cut short, or with a damaged one
    (the array of two that starts every record) followed by valid records.
    A Redis AOF ("*2\\r\\n$6\\r\\nSELECT...") has none of ours: it is not one."""
    if not data or any(
        header.startswith(data[: len(header)].upper()) for header in HEADERS.values()
    ):
        return True
    return data.startswith(_RECORD_START) and resync(data, 1) is not None


@attrs.frozen
class LostRecord:
    """What a dropped span seems to have held: a record kind where its
    header is still readable, and the first job ID that follows it."""

    kind: bytes | None  # LOADJOB, ACKJOB, DELJOB, or None when unreadable
    job_id: str | None


def lost_records(data: bytes, span: Span) -> list[LostRecord]:
    """Best effort: the records (or parts of them) inside a dropped span,
    found by their headers and by job IDs."""
    chunk = data[span.start : span.end]
    # The names alone: damage often spares them when it hits the lengths.
    marks = sorted((at, name) for name in HEADERS for at in _find_all(chunk, name))
    bounds = [*marks, (len(chunk), b"")]
    lost = []
    # Bytes before the first readable header: a record whose header is gone.
    orphan = JOB_ID_RE.search(chunk, 0, marks[0][0] if marks else len(chunk))
    if orphan is not None:
        lost.append(LostRecord(None, orphan.group().decode()))
    for (at, name), (nxt, _) in itertools.pairwise(bounds):
        found = JOB_ID_RE.search(chunk, at, nxt)
        lost.append(LostRecord(name, found.group().decode() if found else None))
    return lost


def _find_all(data: bytes, needle: bytes) -> Iterator[int]:
    at = data.find(needle)
    while at >= 0:
        yield at
        at = data.find(needle, at + 1)
