"""AOF records: their bytes, reading them back, torn tails, damage, check-aof."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio import cli
from disque_trio.protocol import aof
from disque_trio.protocol.aof import ACKJOB, DELJOB, LOADJOB, AofError, JobRecord

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
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
    ctime=UINT64,
    etime=INT64,
    delay=INT64,
    retry=INT64,
    nacks=UINT64,
    deliveries=UINT64,
    nodes_delivered=st.lists(st.text(max_size=40), max_size=7).map(tuple),
    qtime=INT64,
    flags=st.integers(0, 2**31),
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
    code, out = run_check(capsys, "--fix", str(path))
    assert code == 0 and path.read_bytes() == data


def test_check_aof_torn_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, ends = sample_file()
    path = tmp_path / "disque.aof"
    cut = ends[-2] + 17
    path.write_bytes(data[:cut])
    code, out = run_check(capsys, str(path))
    assert code == 1
    assert f"ok_up_to={ends[-2]}" in out and "--fix" in out
    assert path.stat().st_size == cut  # without --fix nothing is touched
    code, out = run_check(capsys, "--fix", str(path))
    assert code == 0 and "Successfully truncated" in out
    assert path.read_bytes() == data[: ends[-2]]
    assert run_check(capsys, str(path))[0] == 0


def test_check_aof_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, ends = sample_file()
    path = tmp_path / "disque.aof"
    path.write_bytes(data[: ends[2]] + b"\x00junk junk\r\n" + data[ends[2] :])
    code, out = run_check(capsys, str(path))
    assert code == 1 and f"byte offset {ends[2]}" in out
    code, out = run_check(capsys, "--fix", str(path))
    assert code == 0
    # --fix keeps what precedes the damage (like redis-check-aof).
    assert path.stat().st_size == ends[2]
    assert path.read_bytes() == data[: ends[2]]


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
