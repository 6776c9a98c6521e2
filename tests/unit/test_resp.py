"""RESP request parsers, reply encoder and reply reader."""

from __future__ import annotations

import enum
import itertools
import math
import re
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque_trio.protocol import resp
from disque_trio.protocol.replies import (
    NULL_ARRAY,
    OK,
    Reply,
    ReplyError,
    Status,
    Verbatim,
)
from disque_trio.protocol.resp import (
    NOT_READY,
    HiredisRequestParser,
    ProtocolError,
    ReplyReader,
    RequestParser,
    encode,
    encode_into,
    format_double,
    make_parser,
    split_args,
)

PARSERS = [RequestParser, HiredisRequestParser]
ParserClass = type[RequestParser]


@pytest.fixture(params=PARSERS, ids=["pure", "hiredis"])
def parser_cls(request: pytest.FixtureRequest) -> ParserClass:
    cls: ParserClass = request.param
    return cls


def multibulk(cmd: Sequence[bytes]) -> bytes:
    """A request as a client library writes it (independent of encode())."""
    out = [b"*%d\r\n" % len(cmd)]
    for arg in cmd:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` split at the given (unsorted, possibly repeated) offsets."""
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def outcome(
    parser: RequestParser, chunks: Iterable[bytes]
) -> tuple[list[list[bytes]], str | None]:
    """Commands parsed from ``chunks``, and the protocol error that stopped it."""
    commands: list[list[bytes]] = []
    try:
        for chunk in chunks:
            parser.feed(chunk)
            while (cmd := parser.next_command()) is not None:
                commands.append(cmd)
    except ProtocolError as exc:
        return commands, str(exc)
    return commands, None


def parse(cls: ParserClass, chunks: Iterable[bytes], **limits: int) -> list[list[bytes]]:
    commands, error = outcome(cls(**limits), chunks)
    assert error is None
    return commands


def one_byte_at_a_time(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# --------------------------------------------------------------------------
# Request parsing: the happy paths
# --------------------------------------------------------------------------

PIPELINE_COMMANDS: list[list[bytes]] = [
    [b"ADDJOB", b"queue", b"body", b"0"],
    [b"PING"],
    [b"SET", b"k", b""],
    [b"BIN", b"\r\n", b"\x00\xff\r\r\n\n", b"$3\r\n*1\r\n"],
    [b"GETJOB", b"FROM", b"q1", b"q2"],
]
# Multibulk and inline mixed, with what Redis skips: *0, *-1, blank lines.
PIPELINE = (
    multibulk(PIPELINE_COMMANDS[0])
    + b"PING\r\n"
    + b"*0\r\n"
    + multibulk(PIPELINE_COMMANDS[2])
    + b"\r\n  \r\n\n"
    + b"*-1\r\n"
    + multibulk(PIPELINE_COMMANDS[3])
    + b"GETJOB FROM  q1\tq2\n"
)


def test_pipeline_in_one_feed(parser_cls: ParserClass) -> None:
    assert parse(parser_cls, [PIPELINE]) == PIPELINE_COMMANDS


def test_pipeline_one_byte_at_a_time(parser_cls: ParserClass) -> None:
    assert parse(parser_cls, one_byte_at_a_time(PIPELINE)) == PIPELINE_COMMANDS


def test_pipeline_at_every_split_point(parser_cls: ParserClass) -> None:
    for cut in range(len(PIPELINE) + 1):
        assert parse(parser_cls, [PIPELINE[:cut], PIPELINE[cut:]]) == PIPELINE_COMMANDS, cut


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(PIPELINE)), max_size=40))
def test_pipeline_in_random_chunks(cuts: list[int]) -> None:
    chunks = chunked(PIPELINE, cuts)
    for cls in PARSERS:
        assert parse(cls, chunks) == PIPELINE_COMMANDS


def test_commands_come_one_per_call(parser_cls: ParserClass) -> None:
    parser = parser_cls()
    parser.feed(multibulk([b"A"]) + multibulk([b"B"]) + b"C\r\n")
    assert parser.next_command() == [b"A"]
    assert parser.next_command() == [b"B"]
    assert parser.next_command() == [b"C"]
    assert parser.next_command() is None
    assert parser.next_command() is None


def test_nothing_fed(parser_cls: ParserClass) -> None:
    parser = parser_cls()
    assert parser.next_command() is None
    parser.feed(b"")
    assert parser.next_command() is None
    assert parser.buffered() == 0


@pytest.mark.parametrize(
    "data",
    [b"*0\r\n", b"*-1\r\n", b"*-7\r\n", b"\r\n", b"\n", b"   \t \r\n", b"\x00 ignored\r\n"],
)
def test_skipped_requests(parser_cls: ParserClass, data: bytes) -> None:
    tail = multibulk([b"NEXT"])
    assert parse(parser_cls, [data * 3 + tail]) == [[b"NEXT"]]


def test_bytes_after_a_bulk_are_skipped_unchecked(parser_cls: ParserClass) -> None:
    # Redis (and hiredis) skip the two bytes after a body without looking.
    data = b"*2\r\n$3\r\nabcXY$1\r\nd??" + multibulk([b"NEXT"])
    assert parse(parser_cls, [data]) == [[b"abc", b"d"], [b"NEXT"]]
    assert parse(parser_cls, one_byte_at_a_time(data)) == [[b"abc", b"d"], [b"NEXT"]]


def test_buffered_counts_unconsumed_bytes(parser_cls: ParserClass) -> None:
    parser = parser_cls()
    first = multibulk([b"PING"])
    partial = b"*2\r\n$3\r\nfoo\r\n$5\r\nab"
    parser.feed(first + partial)
    assert parser.buffered() == len(first + partial)
    assert parser.next_command() == [b"PING"]
    assert parser.buffered() == len(partial)
    assert parser.next_command() is None
    parser.feed(b"cde\r\n")
    assert parser.next_command() == [b"foo", b"abcde"]
    assert parser.buffered() == 0


def test_make_parser() -> None:
    # The tests run on CPython with hiredis installed: hiredis by default.
    assert type(make_parser()) is HiredisRequestParser
    assert type(make_parser(use_hiredis=False)) is RequestParser
    for use_hiredis in (True, False):
        parser = make_parser(4, use_hiredis=use_hiredis, max_multibulk_len=2)
        assert outcome(parser, [multibulk([b"12345"])]) == ([], "invalid bulk length")
        parser = make_parser(4, use_hiredis=use_hiredis, max_multibulk_len=2)
        assert outcome(parser, [b"*3\r\n"]) == ([], "invalid multibulk length")


def test_hiredis_only_by_default_where_it_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resp.hiredis_pays(True, "cpython")
    assert not resp.hiredis_pays(True, "pypy")  # the pure parser is faster there
    assert not resp.hiredis_pays(False, "cpython")
    # Without hiredis installed, asking for it is a clear error, and the
    # pure parser does the work.
    monkeypatch.setattr(resp, "hiredis", None)
    with pytest.raises(RuntimeError, match="hiredis is not installed"):
        make_parser(use_hiredis=True)
    parser = make_parser(use_hiredis=False)
    parser.feed(b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n")
    assert parser.next_command() == [b"PING", b"hi"]


def test_tiny_max_inline_len_still_parses(parser_cls: ParserClass) -> None:
    # hiredis cannot enforce a header length limit; the parser must notice.
    data = multibulk([b"x" * 100]) + multibulk([b"y"])
    assert parse(parser_cls, [data], max_inline_len=4) == [[b"x" * 100], [b"y"]]
    parser = parser_cls(max_inline_len=3)
    assert outcome(parser, [data]) == ([], "too big bulk count string")


# --------------------------------------------------------------------------
# Request parsing: round trips of random commands
# --------------------------------------------------------------------------

# Mostly short arguments, some with the protocol's own bytes, a few large.
ARG = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"\r\n", b"\r", b"\n", b"$1\r\n", b"*1\r\n", b"+OK\r\n"]),
    st.builds(
        lambda unit, n: unit * n,
        st.sampled_from([b"x", b"\r\n", b"\x00\xff"]),
        st.integers(min_value=1000, max_value=40_000),
    ),
)
COMMANDS = st.lists(st.lists(ARG, min_size=1, max_size=8), min_size=1, max_size=12)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(commands=COMMANDS, data=st.data())
def test_multibulk_round_trip(commands: list[list[bytes]], data: st.DataObject) -> None:
    wire = b"".join(multibulk(cmd) for cmd in commands)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(wire)), max_size=30))
    for cls in PARSERS:
        assert parse(cls, [wire]) == commands
        assert parse(cls, chunked(wire, cuts)) == commands


@given(commands=COMMANDS)
def test_encoder_output_parses_back(commands: list[list[bytes]]) -> None:
    # A reply array of bulks is byte-for-byte a request: encode() agrees.
    wire = b"".join(encode(list(cmd)) for cmd in commands)
    assert wire == b"".join(multibulk(cmd) for cmd in commands)


# Vocabulary for garbage: enough RESP fragments that the parsers go deep.
TOKENS = [
    *(bytes([c]) for c in b"*$+-:=(%~>|_#,!0123456789 \t\r\n\"'\\xa\x00\x0b"),
    b"*1\r\n",
    b"*2\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"$1\r\n",
    b"$3\r\nabc\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"+ok\r\n",
    b":1\r\n",
    b"=7\r\ntxt:abc\r\n",
    b"(12\r\n",
    b"PING\r\n",
    b'SET "a b"\r\n',
    b"\\x41",
]


@settings(max_examples=400)
@given(
    tokens=st.lists(st.sampled_from(TOKENS), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20),
)
def test_parsers_agree_on_anything(tokens: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(tokens)
    expected = outcome(RequestParser(max_bulk_len=100), [wire])
    for cls in PARSERS:
        assert outcome(cls(max_bulk_len=100), [wire]) == expected
        assert outcome(cls(max_bulk_len=100), chunked(wire, cuts)) == expected


# --------------------------------------------------------------------------
# Inline commands
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "args"),
    [
        (b"PING", [b"PING"]),
        (b"  ADDJOB  q   body\t0  ", [b"ADDJOB", b"q", b"body", b"0"]),
        (b'SET k "hello world"', [b"SET", b"k", b"hello world"]),
        (b"SET k 'hello world'", [b"SET", b"k", b"hello world"]),
        (b'SET k ""', [b"SET", b"k", b""]),
        (b'ECHO "a\\nb\\r\\t\\b\\a\\"\\\\\\q"', [b"ECHO", b'a\nb\r\t\b\x07"\\q']),
        (b'ECHO "\\x41\\x4a\\xzz"', [b"ECHO", b"AJxzz"]),
        (b"ECHO 'it\\'s' '\\n'", [b"ECHO", b"it's", b"\\n"]),
        (b'ECHO a"b c"', [b"ECHO", b"ab c"]),  # a quote opens mid-argument too
        (b"ECHO a\x0bb \x0c c", [b"ECHO", b"a\x0bb", b"c"]),  # \v, \f: C isspace quirks
        (b'ECHO "a"\x0bb', [b"ECHO", b"a", b"b"]),
        (b"ECHO a\x00 ignored after NUL", [b"ECHO", b"a"]),
        (b"ECHO \xc3\xa9\xff", [b"ECHO", b"\xc3\xa9\xff"]),
        (b"", []),
    ],
)
def test_split_args(line: bytes, args: list[bytes]) -> None:
    assert split_args(line) == args


@pytest.mark.parametrize(
    "line", [b'SET "abc', b"SET 'abc", b'SET "abc"def', b"SET 'a'b", b'SET "a\\"']
)
def test_split_args_unbalanced(line: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        split_args(line)
    assert str(info.value) == "unbalanced quotes in request"


def test_inline_terminators(parser_cls: ParserClass) -> None:
    data = b"A 1\r\nB 2\nC\r3\r\n"  # a lone CR inside a line separates arguments
    assert parse(parser_cls, [data]) == [[b"A", b"1"], [b"B", b"2"], [b"C", b"3"]]


@given(args=st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=6))
def test_inline_quoted_round_trip(args: list[bytes]) -> None:
    # Quote every argument with \xHH escapes: any bytes come back.
    line = b" ".join(b'"%s"' % b"".join(b"\\x%02x" % c for c in arg) for arg in args)
    for cls in PARSERS:
        assert parse(cls, [line + b"\r\n"]) == [args]


# --------------------------------------------------------------------------
# Protocol errors
# --------------------------------------------------------------------------

LIMITS = {"max_bulk_len": 100, "max_inline_len": 64, "max_multibulk_len": 10}
OK_FIRST = multibulk([b"FIRST"])

ERROR_CASES = [
    (b"*1\r\n$101\r\n", "invalid bulk length"),
    (b"*1\r\n$-1\r\n", "invalid bulk length"),
    (b"*1\r\n$03\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$+3\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$ 3\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$\r\n", "invalid bulk length"),
    (b"*1\r\n$3x\r\nabc\r\n", "invalid bulk length"),
    (b"*11\r\n", "invalid multibulk length"),
    (b"*x\r\n", "invalid multibulk length"),
    (b"*\r\n", "invalid multibulk length"),
    (b"*01\r\n", "invalid multibulk length"),
    (b"*-0\r\n", "invalid multibulk length"),
    (b"*1\r\n:1\r\n", "expected '$', got ':'"),
    (b"*1\r\n+abc\r\n", "expected '$', got '+'"),
    (b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n", "expected '$', got '*'"),
    (b"*1\r\n=7\r\ntxt:abc\r\n", "expected '$', got '='"),
    (b"*1\r\n(12\r\n", "expected '$', got '('"),
    (b"*1\r\n_\r\n", "expected '$', got '_'"),
    (b"*1\r\n%1\r\n$1\r\na\r\n$1\r\nb\r\n", "expected '$', got '%'"),
    (b"*1\r\n>1\r\n$1\r\na\r\n", "expected '$', got '>'"),
    (b"*1\r\n-ERR x\r\n", "expected '$', got '-'"),
    # Shorter and longer items whose lengths cancel out.
    (b"*3\r\n+0123456789\r\n=7\r\n$$x:abc\r\n$1\r\na\r\n", "expected '$', got '+'"),
    (b"x" * 65, "too big inline request"),
    (b"x" * 65 + b"\r\n", "too big inline request"),
    (b"*" + b"1" * 64, "too big mbulk count string"),
    (b"*" + b"1" * 64 + b"\r\n", "too big mbulk count string"),
    (b"*1\r\n$" + b"1" * 64, "too big bulk count string"),
    (b"*1\r\n$" + b"1" * 64 + b"\r\n", "too big bulk count string"),
    (b'SET "abc\r\n', "unbalanced quotes in request"),
    (b"SET 'a'b\r\n", "unbalanced quotes in request"),
]


@pytest.mark.parametrize(("data", "message"), ERROR_CASES)
def test_protocol_errors(parser_cls: ParserClass, data: bytes, message: str) -> None:
    wire = OK_FIRST + data
    # Commands before the bad one still come out, then the error.
    assert outcome(parser_cls(**LIMITS), [wire]) == ([[b"FIRST"]], message)
    assert outcome(parser_cls(**LIMITS), one_byte_at_a_time(wire)) == ([[b"FIRST"]], message)


def test_limits_are_inclusive(parser_cls: ParserClass) -> None:
    commands = [[b"x" * 100] * 10, [b"y" * 63]]
    wire = multibulk(commands[0]) + b"y" * 63 + b"\r\n"
    assert parse(parser_cls, [wire], **LIMITS) == commands
    assert parse(parser_cls, one_byte_at_a_time(wire), **LIMITS) == commands


def test_hiredis_protocol_error_is_ours() -> None:
    # hiredis itself rejects '!' as a type byte; we answer with Redis' text.
    parser = HiredisRequestParser()
    parser.feed(b"*1\r\n!3\r\nabc\r\n")
    with pytest.raises(ProtocolError) as info:
        parser.next_command()
    assert str(info.value) == "expected '$', got '!'"


# --------------------------------------------------------------------------
# Work stays linear
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", PARSERS, ids=["pure", "hiredis"])
def test_large_bulk_in_small_chunks_is_linear(cls: ParserClass) -> None:
    body = bytes(range(256)) * (50 * 1024 * 1024 // 256)
    head = b"*2\r\n$3\r\nSET\r\n$%d\r\n" % len(body)
    parser = cls()
    start = time.perf_counter()
    parser.feed(head)
    assert parser.next_command() is None
    view = memoryview(body)
    for i in range(0, len(body), 4096):
        parser.feed(view[i : i + 4096])  # type: ignore[arg-type]
        assert parser.next_command() is None
    parser.feed(b"\r\n")
    cmd = parser.next_command()
    elapsed = time.perf_counter() - start
    assert cmd is not None and cmd[0] == b"SET" and cmd[1] == body
    assert elapsed < 5.0


@pytest.mark.parametrize("cls", PARSERS, ids=["pure", "hiredis"])
def test_trickled_long_lines_are_linear(cls: ParserClass) -> None:
    # Lines just under the limit, a byte at a time: rescanning them from
    # the start on every byte would be ~10^9 steps.
    inline = b"x" * 60_000 + b"\r\n"
    many_args = multibulk([b"a"] * 20_000)
    start = time.perf_counter()
    commands = parse(cls, one_byte_at_a_time(inline + many_args))
    assert time.perf_counter() - start < 5.0
    assert commands == [[b"x" * 60_000], [b"a"] * 20_000]


# --------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 3


ENCODINGS: list[tuple[Reply, bytes, bytes]] = [
    # value, RESP2, RESP3
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (Status("a\r\nb"), b"+a  b\r\n", b"+a  b\r\n"),
    (ReplyError("ERR", "bad\r\nthing"), b"-ERR bad  thing\r\n", b"-ERR bad  thing\r\n"),
    (ReplyError("NOJOB", "x"), b"-NOJOB x\r\n", b"-NOJOB x\r\n"),
    (0, b":0\r\n", b":0\r\n"),
    (-42, b":-42\r\n", b":-42\r\n"),
    (2**70, b":%d\r\n" % 2**70, b":%d\r\n" % 2**70),
    (Color.RED, b":3\r\n", b":3\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
    ("é", b"$2\r\n\xc3\xa9\r\n", b"$2\r\n\xc3\xa9\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ([b"a", 1, None], b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n", b"*3\r\n$1\r\na\r\n:1\r\n_\r\n"),
    ((b"a", [OK]), b"*2\r\n$1\r\na\r\n*1\r\n+OK\r\n", b"*2\r\n$1\r\na\r\n*1\r\n+OK\r\n"),
    ({}, b"*0\r\n", b"%0\r\n"),
    (
        {"k": 1, b"j": [True]},
        b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\nj\r\n*1\r\n:1\r\n",
        b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\nj\r\n*1\r\n#t\r\n",
    ),
    (True, b":1\r\n", b"#t\r\n"),
    (False, b":0\r\n", b"#f\r\n"),
    (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
    (3.0, b"$1\r\n3\r\n", b",3\r\n"),
    (math.inf, b"$3\r\ninf\r\n", b",inf\r\n"),
    (-math.inf, b"$4\r\n-inf\r\n", b",-inf\r\n"),
    (math.nan, b"$3\r\nnan\r\n", b",nan\r\n"),
    (Verbatim("a\r\nb"), b"$4\r\na\r\nb\r\n", b"=8\r\ntxt:a\r\nb\r\n"),
]


@pytest.mark.parametrize(("value", "resp2", "resp3"), ENCODINGS)
def test_encode(value: Reply, resp2: bytes, resp3: bytes) -> None:
    assert encode(value) == resp2
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, b"0"),
        (-0.0, b"-0"),
        (3.0, b"3"),
        (-17.0, b"-17"),
        (0.1, b"0.1"),
        (1e15, b"1000000000000000"),
        (2.0**53, b"9007199254740992"),
        (1e16, b"1e+16"),
        (1e-7, b"1e-07"),
        (1.0 / 3, b"0.3333333333333333"),
        (math.inf, b"inf"),
        (-math.inf, b"-inf"),
        (math.nan, b"nan"),
    ],
)
def test_format_double(value: float, text: bytes) -> None:
    assert format_double(value) == text


def test_encode_into_appends() -> None:
    out = bytearray(b"+previous\r\n")
    encode_into(out, [b"x"], 2)
    encode_into(out, 7, 3)
    assert out == b"+previous\r\n*1\r\n$1\r\nx\r\n:7\r\n"


def test_encode_big_and_buffer_types() -> None:
    big = b"\r\n" * 10_000
    assert encode(big) == b"$20000\r\n" + big + b"\r\n"
    assert encode(bytearray(big)) == encode(big)  # type: ignore[arg-type]
    assert encode(memoryview(big)) == encode(big)  # type: ignore[arg-type]
    assert encode(Verbatim("v" * 5000), 3) == b"=5004\r\ntxt:" + b"v" * 5000 + b"\r\n"


def test_encode_rejects_unknown_types() -> None:
    with pytest.raises(TypeError, match="cannot encode object"):
        encode(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot encode set"):
        encode([{1}])  # type: ignore[list-item]


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # encodable
# Replies: every kind, nested. Dict keys of one kind so "k" and b"k" cannot
# collide after encoding.
SCALARS = st.one_of(
    st.builds(Status, TEXT),
    st.builds(
        ReplyError,
        st.from_regex(r"[A-Z]{1,8}", fullmatch=True),
        TEXT,
    ),
    st.integers(),
    st.binary(max_size=30),
    TEXT,
    st.none(),
    st.just(NULL_ARRAY),
    st.floats(),
    st.booleans(),
    st.builds(Verbatim, TEXT),
)
REPLIES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.binary(max_size=5), children, max_size=4),
        st.dictionaries(st.text(max_size=5), children, max_size=4),
    ),
    max_leaves=20,
)


def expected_decoding(value: Any, proto: int) -> Any:
    """What ReplyReader gives back for ``encode(value, proto)``."""
    if isinstance(value, Status | ReplyError) or value is None or type(value) is int:
        if isinstance(value, Status | ReplyError):
            return _one_line(value)
        return value
    if value is NULL_ARRAY:
        return None if proto == 3 else NULL_ARRAY
    if isinstance(value, bool):
        return value if proto == 3 else int(value)
    if isinstance(value, float):
        return value if proto == 3 else format_double(value)
    if isinstance(value, Verbatim):
        return value if proto == 3 else value.encode()
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list | tuple):
        return [expected_decoding(v, proto) for v in value]
    if isinstance(value, dict):
        pairs = {
            expected_decoding(k, proto): expected_decoding(v, proto) for k, v in value.items()
        }
        return pairs if proto == 3 else [x for kv in pairs.items() for x in kv]
    return value


def _one_line(value: Status | ReplyError) -> Status | ReplyError:
    if isinstance(value, ReplyError):
        line = value.line.replace("\r", " ").replace("\n", " ")
        code, _, message = line.partition(" ")
        return ReplyError(code, message)
    return Status(value.replace("\r", " ").replace("\n", " "))


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and types must match."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, ReplyError):  # an exception: attrs compares by identity
        return (a.code, a.message) == (b.code, b.message)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(REPLIES, min_size=1, max_size=5), proto=st.sampled_from([2, 3]))
def test_encode_decode_round_trip(values: list[Reply], proto: int) -> None:
    out = bytearray()
    for value in values:
        encode_into(out, value, proto)
    reader = ReplyReader()
    decoded = []
    for i in range(0, len(out), 7):  # odd chunks cut through everything
        reader.feed(bytes(out[i : i + 7]))
        while (reply := reader.next_reply()) is not NOT_READY:
            decoded.append(reply)
    assert len(decoded) == len(values)
    for value, got in zip(values, decoded, strict=True):
        assert same(got, expected_decoding(value, proto)), (value, got)


# --------------------------------------------------------------------------
# Reply reader
# --------------------------------------------------------------------------


def test_reply_reader_waits_for_complete_replies() -> None:
    reader = ReplyReader()
    assert reader.next_reply() is NOT_READY
    reader.feed(b"*2\r\n$3\r\nfoo\r\n$3\r\nba")
    assert reader.next_reply() is NOT_READY
    reader.feed(b"r\r\n:5\r\n+O")
    assert reader.next_reply() == [b"foo", b"bar"]
    assert reader.next_reply() == 5
    assert reader.next_reply() is NOT_READY
    reader.feed(b"K\r\n")
    reply = reader.next_reply()
    assert reply == "OK" and type(reply) is Status


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b"-ERR no such job\r\n", ReplyError("ERR", "no such job")),
        (b"-NOAUTH\r\n", ReplyError("NOAUTH", "")),
        (b"!9\r\nERR oh no\r\n", ReplyError("ERR", "oh no")),
        (b"(12345678901234567890\r\n", 12345678901234567890),
        (b"~2\r\n:1\r\n:2\r\n", [1, 2]),
        (b">2\r\n$7\r\nmessage\r\n:1\r\n", [b"message", 1]),
        (b"|1\r\n+key\r\n+value\r\n:7\r\n", 7),
        (b"=9\r\nmkd:hello\r\n", Verbatim("hello")),
        (b"%1\r\n+a\r\n*-1\r\n", {Status("a"): NULL_ARRAY}),
        (b"#f\r\n", False),
        (b",-1.5e3\r\n", -1500.0),
        (b"$-1\r\n", None),
        (b"_\r\n", None),
    ],
)
def test_reply_reader_types(data: bytes, value: object) -> None:
    reader = ReplyReader()
    reader.feed(data)
    assert same(reader.next_reply(), value)
    assert reader.next_reply() is NOT_READY


@pytest.mark.parametrize("data", [b"?what\r\n", b":x\r\n", b"$x\r\n", b"\r\n"])
def test_reply_reader_rejects_garbage(data: bytes) -> None:
    reader = ReplyReader()
    reader.feed(data)
    with pytest.raises(ProtocolError):
        reader.next_reply()


@pytest.mark.parametrize(
    ("hostile", "error"),
    [
        (b"*2147483648\r\n", "invalid multibulk length"),
        (b"*4294967295\r\n", "invalid multibulk length"),
        (b"*1\r\n*2147483648\r\n", "expected '$', got '*'"),
        (b"*2\r\n$4\r\nPING\r\n*2147483648\r\n", "expected '$', got '*'"),
        (b"*1\r\n$2147483648\r\n", "invalid bulk length"),
        (b"*1\r\n$999999999\r\n", "invalid bulk length"),
    ],
)
@pytest.mark.parametrize("split", [None, 3])
def test_huge_counts_are_refused_before_any_allocation(
    hostile: bytes, error: str, split: int | None
) -> None:
    """13 bytes once made hiredis allocate a 2**31-slot list (3.5 s of the
    event loop): the header is refused from its digits alone, whole or cut
    between two reads, after a good command in the same pipeline too."""
    parser = make_parser()
    good = b"*1\r\n$4\r\nPING\r\n"
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=re.escape(error)):
            if split is None:
                parser.feed(good + hostile)
            else:
                parser.feed(good + hostile[:split])
                assert parser.next_command() == [b"PING"]
                assert parser.next_command() is None
                parser.feed(hostile[split:])
            while parser.next_command() is not None:
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_big_looking_digits_inside_a_body_are_still_read() -> None:
    """The guard only sends such bytes to the pure parser, which reads them."""
    body = b"*1234567 and $123456789 are text here"
    parser = make_parser()
    parser.feed(b"*2\r\n$4\r\nECHO\r\n$%d\r\n%b\r\n" % (len(body), body) * 3)
    assert [parser.next_command() for _ in range(3)] == [[b"ECHO", body]] * 3
    assert parser.next_command() is None
