"""AOF records: their bytes, reading them back, torn tails, damage, check-aof."""

from __future__ import annotations

import itertools
from pathlib import Path

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio import checkaof, cli
from disque_trio.protocol import aof
from disque_trio.protocol.aof import ACKJOB, DELJOB, LOADJOB, AofError, JobRecord

# What a node stores (protocol/limits.py): a LOADJOB outside is damage.
INT64 = st.integers(min_value=0, max_value=2**63 - 1)
SECONDS = st.integers(min_value=0, max_value=2**32 - 1)
# Job IDs as the core makes them ("D-" + hex), and arbitrary text.
IDS = st.from_regex(r"\AD-[0-9a-f]{8}-[0-9a-f]{24}-[0-9a-f]{4}\Z") | st.text(max_size=40)
# Queue names come off the wire as bytes and are kept surrogateescape-decoded.
QUEUES = st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape"))

records_st = st.builds(
    JobRecord,
    id=IDS,
    queue=QUEUES,
    body=st.binary(max_size=512),
    state=st.integers(0, 10),
    repl=st.integers(0, 2**32),
    ctime=INT64,
    etime=INT64,
    delay=SECONDS,
    retry=SECONDS,
    nacks=INT64,
    deliveries=INT64,
    nodes_delivered=st.lists(st.text(max_size=40), max_size=7).map(tuple),
    qtime=INT64,
    flags=st.integers(0, 2**31),
    pending=st.lists(st.text(max_size=40), max_size=3).map(tuple),
)


def job(n: int, body: bytes = b"body", queue: str = "q") -> JobRecord:
    return JobRecord(
        id=f"D-dcb833cf-{n:024x}-05a1",
        queue=queue,
        body=body,
        state=3,
        repl=1,
        ctime=1_700_000_000_000_000_000 + n,
        etime=1_800_000_000,
        delay=0,
        retry=1,
        nacks=0,
        deliveries=0,
        nodes_delivered=("dcb833cf" * 5,),
        qtime=1_700_000_001_000 + n,
        flags=2,
    )


def sample_file() -> tuple[bytes, list[int]]:
    """A small AOF of every record kind, and the end offset of each record."""
    parts = [
        aof.loadjob(job(1)),
        aof.loadjob(job(2, body=b"\r\n*2\r\n$7\r\n\x00\xff")),
        aof.ackjob(job(1).id),
        aof.deljob(job(1).id),
        aof.loadjob(job(3, queue="q\udcff\udc80")),
    ]
    ends, pos = [], 0
    for p in parts:
        pos += len(p)
        ends.append(pos)
    return b"".join(parts), ends


# ---------------------------------------------------------------- round trip


@settings(max_examples=300, deadline=None)
@given(records_st)
def test_loadjob_round_trip(rec: JobRecord) -> None:
    data = aof.loadjob(rec)
    [(start, end, (kind, back))] = list(aof.records(data))
    assert (start, end, kind) == (0, len(data), LOADJOB)
    assert back == rec
    # The queue name gives back the very bytes it was made from.
    assert isinstance(back, JobRecord)
    assert back.queue.encode("utf-8", "surrogateescape") == rec.queue.encode(
        "utf-8", "surrogateescape"
    )
    assert aof.scan(data) == (len(data), None)


def test_pending_holders_ride_as_a_15th_element_only_when_there_are_any() -> None:
    """A record without pending holders is the 14 fields it always was, and
    one with them adds a 15th: a node of the release before reads the 14
    it knows from either, and this one reads both."""
    plain = job(1)
    with_pending = attrs.evolve(plain, pending=("5a5a5a5a" * 5,))
    fields = msgpack.unpackb(aof.loadjob(plain).split(b"\r\n", 4)[4][:-2])
    assert len(fields) == 14
    more = msgpack.unpackb(aof.loadjob(with_pending).split(b"\r\n", 4)[4][:-2])
    assert more[:14] == fields and more[14] == ["5a5a5a5a" * 5]
    [(_, _, (_, back))] = list(aof.records(aof.loadjob(with_pending)))
    assert back == with_pending
    [(_, _, (_, back))] = list(aof.records(aof.loadjob(plain)))
    assert isinstance(back, JobRecord) and back.pending == ()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("LAD"), records_st), min_size=1, max_size=8))
def test_record_sequences_round_trip(items: list[tuple[str, JobRecord]]) -> None:
    encoders = {"L": aof.loadjob, "A": lambda r: aof.ackjob(r.id), "D": lambda r: aof.deljob(r.id)}
    chunks = [encoders[k](r) for k, r in items]
    data = b"".join(chunks)
    got = list(aof.records(data))
    assert len(got) == len(items)
    pos = 0
    for (kind, rec), chunk, (start, end, (name, payload)) in zip(items, chunks, got, strict=True):
        assert (start, end) == (pos, pos + len(chunk))
        pos = end
        if kind == "L":
            assert (name, payload) == (LOADJOB, rec)
        else:
            assert name == (ACKJOB if kind == "A" else DELJOB)
            # IDs are ASCII in practice; any text comes back as its UTF-8 bytes.
            assert payload == rec.id.encode().decode("latin-1")


def test_records_are_resp_arrays() -> None:
    assert aof.ackjob("D-1") == b"*2\r\n$6\r\nACKJOB\r\n$3\r\nD-1\r\n"
    assert aof.deljob("D-1") == b"*2\r\n$6\r\nDELJOB\r\n$3\r\nD-1\r\n"
    assert aof.loadjob(job(1)).startswith(b"*2\r\n$7\r\nLOADJOB\r\n$")


def test_empty_file_is_valid() -> None:
    assert aof.scan(b"") == (0, None)
    assert list(aof.records(b"")) == []


# ------------------------------------------------------------------ torn tail


def test_every_cut_inside_the_last_record_is_a_torn_tail() -> None:
    data, ends = sample_file()
    before_last = ends[-2]
    for cut in range(before_last, len(data)):
        good, damage = aof.scan(data[:cut])
        assert damage is None, (cut, damage)
        assert good == before_last, cut
        assert len(list(aof.records(data[:cut]))) == len(ends) - 1


def test_every_cut_anywhere_keeps_the_complete_records() -> None:
    data, ends = sample_file()
    for cut in range(len(data) + 1):
        good, damage = aof.scan(data[:cut])
        assert damage is None, (cut, damage)
        assert good == max([0] + [e for e in ends if e <= cut]), cut


@settings(max_examples=150, deadline=None)
@given(st.lists(records_st, min_size=1, max_size=4), st.data())
def test_random_files_cut_anywhere(recs: list[JobRecord], data: st.DataObject) -> None:
    chunks = [aof.loadjob(r) for r in recs]
    whole = b"".join(chunks)
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    complete = 0
    for c in chunks:
        if complete + len(c) > cut:
            break
        complete += len(c)
    assert aof.scan(whole[:cut]) == (complete, None)


# --------------------------------------------------------------------- damage


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage\r\n",  # an inline "command" of one word
        b"not a record\r\n",  # three words
        b"FOO bar\r\n",  # an unknown record of the right size
        b"*2\r\n$7\r\nLOADJOB\r\n$3\r\nabc\r\n",  # LOADJOB whose payload is no msgpack
        b"*2\r\n$7\r\nLOADJOB\r\n$1\r\n\x93\r\n",  # msgpack of the wrong shape
        b"*3\r\n$6\r\nACKJOB\r\n$1\r\nx\r\n$1\r\ny\r\n",  # too many arguments
        b"*2\r\n$6\r\nACKJOB\r\nX1\r\n",  # no '$' where a bulk length goes
        b"*x\r\n",  # a bad multibulk count
    ],
)
def test_garbage_in_the_middle_names_its_offset(garbage: bytes) -> None:
    data, ends = sample_file()
    at = ends[1]
    damaged = data[:at] + garbage + data[at:]
    good, damage = aof.scan(damaged)
    assert isinstance(damage, AofError)
    assert good == damage.offset == at
    assert f"byte offset {at}" in str(damage)
    with pytest.raises(AofError) as info:
        list(aof.records(damaged))
    assert info.value.offset == at


def test_damage_at_the_start() -> None:
    data, _ = sample_file()
    good, damage = aof.scan(b"\x01\x02 junk\r\n" + data)
    assert good == 0 and damage is not None and damage.offset == 0


# ------------------------------------------------------------------ check-aof


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["check-aof", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_check_aof_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, _ = sample_file()
    path = tmp_path / "disque.aof"
    path.write_bytes(data)
    code, out = run_check(capsys, str(path))
    assert code == 0 and "AOF is valid" in out
    assert "Valid records: 5 (1 ACKJOB, 1 DELJOB, 3 LOADJOB)" in out
    code, out = run_check(capsys, "--fix", str(path))  # nothing to ask, nothing to do
    assert code == 0 and path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disque.aof"]  # no backup


def test_check_aof_torn_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, ends = sample_file()
    path = tmp_path / "disque.aof"
    cut = ends[-2] + 17
    path.write_bytes(data[:cut])
    code, out = run_check(capsys, str(path))
    assert code == 1
    assert f"ok_up_to={ends[-2]}" in out and "--fix" in out
    assert f"Torn: bytes {ends[-2]}-{cut - 1} (17 bytes)" in out
    assert path.stat().st_size == cut  # without --fix nothing is touched
    code, out = run_check(capsys, "--fix", "--yes", str(path))
    assert code == 0 and "Repaired" in out
    assert path.read_bytes() == data[: ends[-2]]
    assert (tmp_path / "disque.aof.bak").read_bytes() == data[:cut]
    assert run_check(capsys, str(path))[0] == 0


def test_check_aof_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, ends = sample_file()
    path = tmp_path / "disque.aof"
    garbage = b"\x00junk junk\r\n"
    damaged = data[: ends[2]] + garbage + data[ends[2] :]
    path.write_bytes(damaged)
    code, out = run_check(capsys, str(path))
    assert code == 1 and f"Damaged: bytes {ends[2]}-{ends[2] + len(garbage) - 1}" in out
    code, out = run_check(capsys, "--fix", "--yes", str(path))
    assert code == 0
    # Every record is kept, before and after the damage; only the garbage goes.
    assert path.read_bytes() == data
    assert (tmp_path / "disque.aof.bak").read_bytes() == damaged


def test_check_aof_usage_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_check(capsys)[0] == 2
    assert run_check(capsys, "a", "b")[0] == 2
    code, out = run_check(capsys, str(tmp_path / "missing.aof"))
    assert code == 1 and "Cannot read" in out


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x00\n",  # NULs up to a newline: a zero-filled block
        b"\r\n",  # a blank line
        b"ACKJOB D-1\r\n",  # a record in inline form (never written so)
        b"*0\r\n",  # an empty array
    ],
)
def test_bytes_the_writer_never_produces_are_damage(garbage: bytes) -> None:
    data, ends = sample_file()
    good, damage = aof.scan(data[: ends[0]] + garbage + data[ends[0] :])
    assert damage is not None and good == damage.offset == ends[0]


def test_bad_bulk_trailer_is_damage() -> None:
    rec = aof.ackjob("D-1")
    bad = rec[:-2] + b"xx"
    good, damage = aof.scan(rec + bad + rec)
    assert damage is not None and good == damage.offset == len(rec)


# ------------------------------------------------------- resynchronisation


def chunks_of(data: bytes, analysis: aof.Analysis) -> list[bytes]:
    return [data[start:end] for start, end, _ in analysis.records]


def sample_chunks() -> list[bytes]:
    data, ends = sample_file()
    return [data[a:b] for a, b in itertools.pairwise([0, *ends])]


def break_trailer(chunk: bytes) -> bytes:
    """The record with its last CRLF damaged: not a record any more."""
    return chunk[:-2] + b"X\n"


@pytest.mark.parametrize("k", range(5))
def test_a_damaged_record_in_the_middle_costs_only_itself(k: int) -> None:
    chunks = sample_chunks()
    damaged = [*chunks[:k], break_trailer(chunks[k]), *chunks[k + 1 :]]
    data = b"".join(damaged)
    analysis = aof.analyze(data)
    start = sum(map(len, chunks[:k]))
    assert chunks_of(data, analysis) == chunks[:k] + chunks[k + 1 :]
    assert [(s.start, s.end) for s in analysis.dropped] == [(start, start + len(chunks[k]))]
    assert analysis.torn is None and not analysis.valid and analysis.ok_up_to == start
    assert analysis.repaired(data) == b"".join(chunks[:k] + chunks[k + 1 :])
    good, damage = aof.scan(data)
    assert damage is not None and good == damage.offset == start


def test_several_damaged_spans_and_a_torn_tail() -> None:
    chunks = sample_chunks()
    parts = [
        chunks[0],
        b"\x00" * 100,  # a zero-filled block
        chunks[1],
        break_trailer(chunks[2]),
        b"garbage\r\n",
        chunks[3],
        chunks[4],
        chunks[0][:30],  # torn
    ]
    data = b"".join(parts)
    analysis = aof.analyze(data)
    assert chunks_of(data, analysis) == [chunks[0], chunks[1], chunks[3], chunks[4]]
    offsets = list(itertools.accumulate(map(len, parts), initial=0))
    assert [(s.start, s.end) for s in analysis.damaged] == [
        (offsets[1], offsets[2]),
        (offsets[3], offsets[5]),
    ]
    assert analysis.torn is not None and (analysis.torn.start, analysis.torn.end) == (
        offsets[7],
        len(data),
    )
    assert [(s.start, s.end) for s in analysis.dropped] == [
        (offsets[1], offsets[2]),
        (offsets[3], offsets[5]),
        (offsets[7], len(data)),
    ]


def test_a_length_running_past_the_end_with_records_after_it_is_damage() -> None:
    """A damaged length can make a record look incomplete: that is not a
    torn tail to cut (which would drop every record after it)."""
    chunks = sample_chunks()
    long = chunks[2].replace(b"$6\r\nACKJOB\r\n$", b"$6\r\nACKJOB\r\n$99999", 1)
    data = chunks[0] + chunks[1] + long + chunks[3] + chunks[4]
    analysis = aof.analyze(data)
    assert chunks_of(data, analysis) == [chunks[0], chunks[1], chunks[3], chunks[4]]
    assert analysis.torn is None and len(analysis.damaged) == 1
    good, damage = aof.scan(data)
    assert damage is not None and good == len(chunks[0] + chunks[1])
    # records() stops there; scan() is what tells the loader it is damage.
    assert len(list(aof.records(data))) == 2


def test_a_length_that_swallows_the_next_record_start_is_undone() -> None:
    """ACKJOB's length grown by 4 takes the next record's "*2\\r\\n" as its
    payload and still ends on a CRLF; what follows does not parse, so the
    swallowing record is dropped and the swallowed one read again."""
    ack = aof.ackjob(job(7).id)
    bad = ack.replace(b"$40\r\n", b"$44\r\n", 1)
    after = [aof.loadjob(job(8)), aof.deljob(job(8).id)]
    data = aof.loadjob(job(6)) + bad + b"".join(after)
    # Read in order, the grown ACKJOB parses, ending inside the next record.
    read = []
    with pytest.raises(AofError):
        read.extend(aof.records(data))
    [_, (_, end, (kind, _))] = read
    assert kind == ACKJOB and end == len(aof.loadjob(job(6))) + len(bad) + 4
    analysis = aof.analyze(data)
    assert chunks_of(data, analysis) == [aof.loadjob(job(6)), *after]
    assert [s.reason for s in analysis.damaged] == [aof._SWALLOWS]


def test_resync_needs_a_job_id() -> None:
    """A body holding a record's bytes is not a place to resume reading."""
    inner = aof.ackjob("not a job id")
    holder = aof.loadjob(job(1, body=inner + inner))
    data = break_trailer(holder) + aof.loadjob(job(2))
    analysis = aof.analyze(data)
    assert chunks_of(data, analysis) == [aof.loadjob(job(2))]
    assert [(s.start, s.end) for s in analysis.damaged] == [(0, len(holder))]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", True),
        (b"*", True),
        (b"*2\r\n$7\r\nLOAD", True),
        (b"*2\r\n$6\r\nACKJOB\r\n$40\r\n", True),
        (b"*2\r\n$6\r\ndeljob\r\n$3\r\nD-1\r\n", True),
        (b"hello world\n", False),
        (b"*3\r\n$3\r\nSET\r\n", False),  # a Redis AOF
        (b"*2\r\n$6\r\nSELECT\r\n$1\r\n0\r\n", False),  # another
        # A damaged first header, valid records after it.
        (b"*2\r\n$7\r\nLOjunk" + aof.loadjob(job(1)), True),
        (b"*2\r\n$7\r\nLOjunk", False),
        (b"REDIS0011", False),  # an RDB file
        (b"\x00" * 64, False),
    ],
)
def test_looks_like_aof(data: bytes, expected: bool) -> None:
    assert aof.looks_like_aof(data) is expected


def test_lost_records_names_kinds_and_job_ids() -> None:
    lost = [aof.loadjob(job(1)), aof.ackjob(job(2).id), aof.deljob(job(3).id)]
    data = aof.loadjob(job(9)) + b"".join(break_trailer(c) for c in lost)
    [span] = aof.analyze(data).damaged
    assert aof.lost_records(data, span) == [
        aof.LostRecord(LOADJOB, job(1).id),
        aof.LostRecord(ACKJOB, job(2).id),
        aof.LostRecord(DELJOB, job(3).id),
    ]
    headless = b"\x00\x00" + aof.ackjob(job(4).id)[12:]  # "*2\r\n$6\r\nACKJ" gone
    span = aof.Span(0, len(headless), "test")
    assert aof.lost_records(headless, span) == [aof.LostRecord(None, job(4).id)]


# Job IDs as ids.py makes them: a resync point must carry one.
WELL_FORMED_IDS = st.from_regex(r"\AD-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}\Z")
well_formed_records = st.builds(attrs.evolve, records_st, id=WELL_FORMED_IDS)
DAMAGE = st.tuples(
    st.sampled_from(["insert", "overwrite", "delete"]),
    st.floats(0, 1, exclude_max=True),  # where, as a fraction of the file
    st.binary(min_size=1, max_size=40),  # the garbage (its length for delete)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("LAD"), well_formed_records), min_size=1, max_size=10),
    st.lists(DAMAGE, min_size=1, max_size=3),
)
def test_every_record_the_damage_did_not_touch_is_recovered(
    items: list[tuple[str, JobRecord]], damages: list[tuple[str, float, bytes]]
) -> None:
    encoders = {"L": aof.loadjob, "A": lambda r: aof.ackjob(r.id), "D": lambda r: aof.deljob(r.id)}
    chunks = [encoders[kind](rec) for kind, rec in items]
    bounds = list(itertools.pairwise(itertools.accumulate(map(len, chunks), initial=0)))
    data = b"".join(chunks)
    # Damage in original offsets, applied from the end so that the offsets
    # of the earlier ones still hold; overlapping damage merges.
    touched: set[int] = set()
    edits = sorted(
        ((int(f * len(data)), how, garbage) for how, f, garbage in damages), reverse=True
    )
    limit = len(data)
    for at, how, garbage in edits:
        width = 0 if how == "insert" else min(len(garbage), limit - at)
        if at > limit or (how != "insert" and width <= 0):
            continue  # overlaps a later edit already applied
        for i, (start, end) in enumerate(bounds):
            if (how == "insert" and start < at < end) or (at < end and at + width > start):
                touched.add(i)
        replacement = b"" if how == "delete" else garbage
        data = data[:at] + replacement + data[at + width :]
        limit = at
    analysis = aof.analyze(data)
    recovered = chunks_of(data, analysis)
    untouched = [c for i, c in enumerate(chunks) if i not in touched]
    it = iter(recovered)
    assert all(any(c == r for r in it) for c in untouched), (untouched, recovered)
    # The repaired file is valid and holds exactly the recovered records.
    repaired = aof.analyze(analysis.repaired(data))
    assert repaired.valid
    assert len(repaired.records) == len(recovered)
    # What is dropped plus what is kept is the whole file, in order.
    pieces = sorted(
        [(s.start, s.end) for s in analysis.dropped] + [(a, b) for a, b, _ in analysis.records]
    )
    assert [a for a, _ in pieces] == [0, *[b for _, b in pieces[:-1]]] and (
        not pieces or pieces[-1][1] == len(data)
    )


def test_check_aof_report_tells_what_each_lost_record_means() -> None:
    ids = [job(n).id for n in range(6)]
    parts = [
        aof.loadjob(job(0)),
        break_trailer(aof.loadjob(job(1))),  # lost: the job is gone
        aof.loadjob(job(2)),
        break_trailer(aof.ackjob(ids[2])),  # lost, but the DELJOB is kept
        aof.deljob(ids[2]),
        aof.loadjob(job(3)),
        break_trailer(aof.ackjob(ids[3])),  # lost: job 3 comes back
        aof.loadjob(job(4)),
        break_trailer(aof.deljob(ids[4])),  # lost: job 4 comes back
        break_trailer(aof.loadjob(job(5))),  # lost, but acknowledged anyway
        aof.ackjob(ids[5]),
        break_trailer(aof.ackjob(ids[0]))[:-20],  # torn
    ]
    data = b"".join(parts)
    lines = checkaof.report(data, aof.analyze(data))
    assert lines[1] == "Valid records: 6 (1 ACKJOB, 1 DELJOB, 4 LOADJOB)"
    effects = [line for line in lines if line.startswith("  ")]
    assert effects == [
        f"  LOADJOB of {ids[1]}: this job is lost on this node (other nodes may still hold a copy)",
        f"  ACKJOB of {ids[2]}: no effect: another ACKJOB or DELJOB of this job is kept",
        f"  ACKJOB of {ids[3]}: the acknowledgement is lost: after a restart the job comes "
        "back as not acknowledged and may be delivered again",
        f"  DELJOB of {ids[4]}: the deletion is lost: after a restart the deleted job comes back",
        f"  LOADJOB of {ids[5]}: no effect that matters: the job was acknowledged "
        "(its ACKJOB is kept)",
        "  ACKJOB of an unreadable job ID: unknown: the job's ID cannot be read; that job "
        "comes back after a restart if nothing else acknowledges it",
    ]
    assert lines[-1] == (
        "Jobs affected: 1 job lost, 1 acknowledged job comes back not acknowledged, "
        "1 deleted job comes back, 1 unreadable record of unknown effect"
    )
    assert sum(line.startswith("Damaged: ") for line in lines) == 4
    assert sum(line.startswith("Torn: ") for line in lines) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("retry", 2**32), ("delay", 2**40), ("ctime", 2**63), ("nacks", -1), ("qtime", 2**64 - 1)],
)
def test_a_loadjob_with_numbers_a_node_never_stores_is_damage(field: str, value: int) -> None:
    record = aof.loadjob(attrs.evolve(job(1), **{field: value}))
    with pytest.raises(AofError, match="malformed LOADJOB"):
        list(aof.records(record))
