"""RESP on the wire: a sans-I/O request parser, the reply encoder, a reply reader.

Theory of operation
-------------------

Request parsing follows h11: the connection task passes whatever bytes the
socket returned to ``feed()`` and then calls ``next_command()`` until it
answers ``None`` ("need more data"). Nothing here does I/O or knows about
Trio, so the parser is tested byte by byte without a network.

``RequestParser`` keeps one ``bytearray`` and a read position. It never
re-slices the whole buffer: consumed bytes are dropped in ``feed()`` with
``del buf[:pos]`` (CPython just moves the array's start for that), a partly
received multibulk keeps its state (arguments read so far, arguments left,
length of the bulk being waited for), and the search for the end of a line
resumes where it stopped, so input that trickles in one byte at a time is
parsed in linear time. While a big bulk body is pending the parser only
compares lengths; the body is copied once, into ``bytes``, when complete.

The accepted language and the error texts are those of
``processInlineBuffer``/``processMultibulkBuffer`` and ``sdssplitargs`` in
Redis' networking.c and sds.c (Disque shares them); the parsers were checked
against a real redis-server 7.0 on random garbage. In particular: length
fields must be canonical decimals, ``*0``/``*-N`` are skipped, a header ends
at its CR and the byte after the CR is not looked at, nor are the two bytes
after a bulk body. Two deliberate differences: a line longer than
max_inline_len is refused even when its end arrived in the same read (Redis
only checks while the end is missing, so its answer depends on how the bytes
were split), and a NUL in an inline command ends its arguments instead of
leaving Redis waiting for a newline that ``strchr`` cannot see.

``HiredisRequestParser`` lets hiredis' C reader split complete ``*``
commands, but hiredis parses *replies*: it accepts ``+``/``(``/``=`` items
(all read back as bytes), nested arrays and any bulk size. So every command
it returns is checked against its own canonical encoding: the ``*n`` and
``$len`` headers rebuilt from a table and compared with
``bytearray.startswith`` at our read position. RESP is self-delimiting, so a
match proves that the bytes hiredis consumed were exactly a well-formed
request and tells us how far to advance. Anything else (inline commands, a
command not complete yet, limits exceeded, a mismatch, a hiredis error) is
handed to the pure parser, which alone decides what is accepted and what the
error says; the hiredis reader is then rebuilt at the new position. hiredis
is fed lazily from our buffer in growing pieces, so a rebuild never re-copies
much.

Speed, 10,000 ``ADDJOB q body 0`` multibulk commands (36 bytes each),
CPython 3.11.7, hiredis 3.5, best of 15 on a shared 2-core VM, so treat them
as ratios (``python bench/bench_codecs.py --only resp`` re-measures)::

                              RequestParser       HiredisRequestParser
    all in one feed           33-35 ms (3.4 us)   12-13 ms (1.2 us/command)
    in 4 KB feeds             33-35 ms            12-13 ms
    1,000 commands, 1 B feeds 23 ms               39 ms

so ``make_parser`` uses hiredis by default on CPython: about 2.5-3.5x
faster on real pipelines. It is slower only for byte-at-a-time input, where
every command is incomplete and goes the pure way plus some bookkeeping. A
50 MB bulk fed in 4 KB chunks costs the same in both (one copy, well under a
second). On other interpreters (PyPy), or where hiredis is not installed,
the pure parser is the default: PyPy's JIT runs it faster than hiredis runs
on CPython (parsing a pipelined ``GETJOB NOHANG FROM q``: 0.5 us a command
under PyPy 7.3, against 1.7 to 2.1 us with hiredis under CPython), and
hiredis, a C extension, did not even build for Debian's PyPy.

The encoder turns ``replies.Reply`` values into RESP2 or RESP3 following the
table in ``replies``. ``encode_into`` appends to a caller's ``bytearray`` so a
pipelined batch of replies goes out in one send. The common shapes (bytes,
int, Status, lists of those) are tested first with exact ``type() is``
checks; everything else goes through a per-type table. Doubles print like
Redis 7.2's d2string: integral values below 1e16 without exponent or ".0",
otherwise the shortest round-tripping form (Redis 7.0 used "%.17g").

``ReplyReader`` decodes server replies for tests and tools. It re-parses a
reply from its start whenever more data arrives, which is simple and fine for
those uses but quadratic for huge replies fed in tiny pieces.
"""

from __future__ import annotations

import enum
import math
import re
import sys
from collections.abc import Callable
from typing import Any, Final

from disque_trio.protocol.replies import (
    NULL_ARRAY,
    Push,
    Reply,
    ReplyError,
    Status,
    Verbatim,
    _NullArray,
)
from disque_trio.protocol.splitargs import UnbalancedQuotes, sdssplitargs

try:
    import hiredis
except ImportError:  # not installed: PyPy (see the module doc)
    hiredis = None  # type: ignore[assignment]


def hiredis_pays(installed: bool, implementation: str) -> bool:
    """Whether ``make_parser`` uses hiredis by default: where it is
    installed and the interpreter is CPython (see the module doc)."""
    return installed and implementation == "cpython"


HIREDIS_DEFAULT: Final = hiredis_pays(hiredis is not None, sys.implementation.name)

__all__ = [
    "NOT_READY",
    "HiredisRequestParser",
    "ProtocolError",
    "ReplyReader",
    "RequestParser",
    "encode",
    "encode_into",
    "format_double",
    "make_parser",
    "split_args",
]

# Redis' defaults: proto-max-bulk-len, PROTO_INLINE_MAX_SIZE, and a cap on the
# argument count so that "*2147483647" cannot make us plan a huge list.
DEFAULT_MAX_BULK_LEN: Final = 512 * 1024 * 1024
DEFAULT_MAX_INLINE_LEN: Final = 64 * 1024
DEFAULT_MAX_MULTIBULK_LEN: Final = 1024 * 1024

_STAR: Final = 0x2A
_DOLLAR: Final = 0x24
_CR: Final = 0x0D
_ZERO: Final = 0x30
_CRLF: Final = b"\r\n"


class ProtocolError(Exception):
    """Malformed request; ``str(exc)`` is the text after "ERR Protocol error: ".

    After raising it a parser is in an undefined state: the server replies
    with the error and closes the connection, as Redis does.
    """


def _parse_count(digits: bytes | bytearray) -> int | None:
    """A canonical non-negative decimal (Redis' string2ll), else None.

    ``int()`` alone would accept "+5", " 5", "0_5" and "05".
    """
    if digits.isdigit() and (digits[0] != _ZERO or len(digits) == 1):
        return int(digits)
    return None


# --------------------------------------------------------------------------
# Inline commands
# --------------------------------------------------------------------------


def split_args(line: bytes) -> list[bytes]:
    """Split an inline command like Redis' sdssplitargs() (protocol/splitargs.py).

    Raises ProtocolError("unbalanced quotes in request") where sdssplitargs
    returns NULL.
    """
    try:
        return sdssplitargs(line)
    except UnbalancedQuotes:
        raise ProtocolError("unbalanced quotes in request") from None


# --------------------------------------------------------------------------
# The pure-Python request parser
# --------------------------------------------------------------------------


class RequestParser:
    """Incremental RESP request parser (multibulk and inline), pure Python."""

    def __init__(
        self,
        max_bulk_len: int = DEFAULT_MAX_BULK_LEN,
        max_inline_len: int = DEFAULT_MAX_INLINE_LEN,
        max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN,
    ) -> None:
        self._max_bulk = max_bulk_len
        self._max_inline = max_inline_len
        self._max_multibulk = max_multibulk_len
        self._buf = bytearray()
        self._pos = 0  # first byte not consumed yet
        # Where to resume looking for the end of the line at _pos: a line
        # that trickles in byte by byte is scanned once, not once per byte.
        self._scan = 0
        # State of a multibulk in progress. _left == 0 means "at a command
        # boundary"; _bulk == -1 means "a $len header comes next".
        self._args: list[bytes] = []
        self._left = 0
        self._bulk = -1

    def feed(self, data: bytes) -> None:
        """Add bytes received from the client."""
        if self._pos:
            # O(1) in CPython: the bytearray just moves its start.
            del self._buf[: self._pos]
            self._scan = max(0, self._scan - self._pos)
            self._pos = 0
        self._buf += data

    def buffered(self) -> int:
        """Bytes received but not consumed yet (CLIENT LIST qbuf)."""
        return len(self._buf) - self._pos

    def next_command(self) -> list[bytes] | None:
        """The next complete command, or None if more data is needed."""
        while True:
            if self._left:
                if not self._read_bulks():
                    return None
                cmd, self._args = self._args, []
                return cmd
            if self._pos >= len(self._buf):
                return None
            if self._buf[self._pos] == _STAR:
                if not self._read_multibulk_count():
                    return None
                continue
            args = self._read_inline()
            if args is None:
                return None
            if args:  # an empty or blank line is skipped, like Redis
                return args

    def _find_eol(self, pos: int, sep: bytes, error: str) -> int:
        """Index of ``sep`` ending the line that starts at ``pos``, or -1.

        Enforces max_inline_len on the line whether or not its end has
        arrived, so the outcome never depends on how the bytes were split.
        """
        buf = self._buf
        eol = buf.find(sep, max(pos, self._scan))
        if eol < 0:
            self._scan = len(buf)
        if (eol if eol >= 0 else len(buf)) - pos > self._max_inline:
            raise ProtocolError(error)
        return eol

    # Like Redis, a header line ends at its CR and the byte after the CR is
    # skipped without being looked at (it must have arrived, though).

    def _read_multibulk_count(self) -> bool:
        """Parse ``*N\r\n`` at _pos; False if the line is incomplete."""
        cr = self._find_eol(self._pos, b"\r", "too big mbulk count string")
        if cr < 0 or cr + 1 >= len(self._buf):
            return False
        digits = self._buf[self._pos + 1 : cr]
        self._pos = cr + 2
        if digits[:1] == b"-" and _parse_count(digits[1:]):
            return True  # *-N: nothing to run, like *0 (but "-0" is no number)
        count = _parse_count(digits)
        if count is None or count > self._max_multibulk:
            raise ProtocolError("invalid multibulk length")
        self._left = count
        return True

    def _read_bulks(self) -> bool:
        """Read the multibulk's remaining ``$len`` items; False if incomplete."""
        # The hot loop: locals, and the header parsed inline.
        buf, pos, end = self._buf, self._pos, len(self._buf)
        args, left, size = self._args, self._left, self._bulk
        while left:
            if size < 0:
                cr = buf.find(b"\r", pos)
                if cr < 0 or cr + 1 >= end or cr - pos > self._max_inline:
                    # Incomplete or too long: the careful way.
                    cr = self._find_eol(pos, b"\r", "too big bulk count string")
                    if cr < 0 or cr + 1 >= end:
                        break
                if buf[pos] != _DOLLAR:
                    raise ProtocolError(f"expected '$', got '{chr(buf[pos])}'")
                digits = buf[pos + 1 : cr]
                if not digits.isdigit() or (digits[0] == _ZERO and len(digits) > 1):
                    raise ProtocolError("invalid bulk length")
                size = int(digits)
                if size > self._max_bulk:
                    raise ProtocolError("invalid bulk length")
                pos = cr + 2
            if end - pos < size + 2:
                break
            args.append(
                bytes(buf[pos : pos + size]) if size < _BIG_BODY else _take(buf, pos, size)
            )
            pos += size + 2  # Redis does not check that these two are CRLF
            size = -1
            left -= 1
        self._pos, self._left, self._bulk = pos, left, size
        return not left

    def _read_inline(self) -> list[bytes] | None:
        """Parse one inline command line at _pos; None if incomplete."""
        buf, pos = self._buf, self._pos
        nl = self._find_eol(pos, b"\n", "too big inline request")
        if nl < 0:
            return None
        stop = nl - 1 if nl > pos and buf[nl - 1] == _CR else nl
        line = bytes(buf[pos:stop])
        self._pos = nl + 1
        return split_args(line)


# Above this size a body is copied out through a memoryview (one copy)
# instead of slicing the bytearray and converting (two copies, but faster for
# small pieces).
_BIG_BODY: Final = 4096


def _take(buf: bytearray, pos: int, size: int) -> bytes:
    with memoryview(buf) as view:
        return bytes(view[pos : pos + size])


# --------------------------------------------------------------------------
# The hiredis-assisted request parser
# --------------------------------------------------------------------------

# hiredis gets at least this much at a time, or twice what it holds unparsed:
# few feeds for a big command, little wasted copying when it must be rebuilt.
_HIREDIS_MIN_FEED: Final = 16 * 1024
# hiredis sizes an array from its header before reading a single item (13
# bytes, "*2147483648\r\n", cost 3.5 s of allocation), nested arrays
# included, and waits for a whole bulk whatever its announced length. Before
# bytes reach it they are searched for a count of a million or more (7 digits)
# or a bulk length of 100 MB or more (9 digits); such bytes, header or body,
# go to the pure parser, which checks its limits on the header alone. The
# search reaches back over the previous feed's last bytes, for a header cut
# between two feeds.
_BIG_HEADER: Final = re.compile(rb"\*[0-9]{7}|\$[0-9]{9}")
_BIG_HEADER_REACH: Final = 10
# Canonical headers of small items, to rebuild a command at C speed.
_BULK_HEADERS: Final = tuple(b"$%d\r\n" % n for n in range(_BIG_BODY))
_COUNT_HEADERS: Final = tuple(b"*%d\r\n" % n for n in range(1024))


class HiredisRequestParser(RequestParser):
    """Same contract as RequestParser; complete ``*`` commands go via hiredis."""

    def __init__(
        self,
        max_bulk_len: int = DEFAULT_MAX_BULK_LEN,
        max_inline_len: int = DEFAULT_MAX_INLINE_LEN,
        max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN,
    ) -> None:
        super().__init__(max_bulk_len, max_inline_len, max_multibulk_len)
        self._reader = hiredis.Reader()
        # _buf[:_fed] has been given to the reader, which has parsed exactly
        # up to _pos (and may hold the start of the command at _pos).
        self._fed = 0
        # The command at this position was incomplete for hiredis: the pure
        # parser, which keeps partial state, finishes it.
        self._stuck = -1
        # A header hiredis accepts could still break a tiny max_inline_len;
        # then the pure parser does everything.
        widest = len(str(max(max_bulk_len, max_multibulk_len))) + 1
        self._use_reader = max_inline_len >= widest

    def feed(self, data: bytes) -> None:
        shift = self._pos
        super().feed(data)
        shift -= self._pos
        self._fed -= shift
        self._stuck -= shift

    def next_command(self) -> list[bytes] | None:
        while True:
            pos, buf = self._pos, self._buf
            if self._left or pos == self._stuck or not self._use_reader:
                return self._pure_next()
            if pos >= len(buf):
                return None
            if buf[pos] != _STAR:
                return self._pure_next()
            try:
                cmd = self._reader.gets()
            except hiredis.ProtocolError:
                return self._pure_next()
            if cmd is False:
                if self._fed < len(buf) and self._feed_reader():
                    continue
                self._stuck = pos
                return self._pure_next()
            if type(cmd) is list and cmd and self._accept(cmd):
                return cmd
            if not self._skip_empty(cmd):
                return self._pure_next()

    def _feed_reader(self) -> bool:
        """Give hiredis the next piece of the buffer; False (nothing fed)
        when the piece holds what looks like a huge count or length."""
        size = max(_HIREDIS_MIN_FEED, self._fed - self._pos)
        size = min(size, len(self._buf) - self._fed)
        reach = max(self._pos, self._fed - _BIG_HEADER_REACH)
        if _BIG_HEADER.search(self._buf, reach, self._fed + size) is not None:
            return False
        # hiredis reads any buffer; its stub only names str and bytes.
        self._reader.feed(self._buf, self._fed, size)  # type: ignore[arg-type]
        self._fed += size
        return True

    def _pure_next(self) -> list[bytes] | None:
        """Let the pure parser go on from _pos, then put hiredis back in step."""
        dirty = self._fed > self._pos
        try:
            return RequestParser.next_command(self)
        finally:
            if dirty:
                self._reader = hiredis.Reader()
            self._fed = self._pos

    def _accept(self, cmd: list[Any]) -> bool:
        """Consume ``cmd`` if _buf holds its canonical encoding at _pos.

        hiredis checks that lengths are canonical numbers but would take
        ``+``, ``(`` or ``=`` items, nested arrays and any size.
        """
        if len(cmd) > self._max_multibulk:
            return False
        try:
            # TypeError: not all bytes; IndexError: a big item.
            body = _CRLF.join([_BULK_HEADERS[len(a)] + a for a in cmd])
            head = _COUNT_HEADERS[len(cmd)]
        except (TypeError, IndexError):
            return self._accept_slowly(cmd)
        if len(body) > self._max_bulk and max(map(len, cmd)) > self._max_bulk:
            return False
        buf, pos = self._buf, self._pos
        if not (buf.startswith(head, pos) and buf.startswith(body, pos + len(head))):
            return False
        # The two bytes after the last body are skipped unchecked, as both
        # hiredis and Redis do.
        self._pos = pos + len(head) + len(body) + 2
        return True

    def _accept_slowly(self, cmd: list[Any]) -> bool:
        """_accept for commands with big items: compare piece by piece."""
        buf = self._buf
        pos = self._pos
        if not buf.startswith(b"*%d\r\n" % len(cmd), pos):
            return False
        pos += len(b"*%d\r\n" % len(cmd))
        for item in cmd:
            if type(item) is not bytes or len(item) > self._max_bulk:
                return False
            header = b"$%d\r\n" % len(item)
            if not (buf.startswith(header, pos) and buf.startswith(item, pos + len(header))):
                return False
            pos += len(header) + len(item) + 2
        self._pos = pos
        return True

    def _skip_empty(self, cmd: object) -> bool:
        """Consume ``*0`` (read as []) or ``*-1`` (read as None)."""
        for empty, reading in ((b"*0\r\n", []), (b"*-1\r\n", None)):
            if cmd == reading and self._buf.startswith(empty, self._pos):
                self._pos += len(empty)
                return True
        return False


def make_parser(
    max_bulk_len: int = DEFAULT_MAX_BULK_LEN,
    *,
    max_inline_len: int = DEFAULT_MAX_INLINE_LEN,
    max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN,
    use_hiredis: bool = HIREDIS_DEFAULT,
) -> RequestParser:
    """A request parser; hiredis-assisted by default on CPython (measured
    faster there), pure elsewhere."""
    if use_hiredis and hiredis is None:
        raise RuntimeError("hiredis is not installed: use the pure parser (use_hiredis=False)")
    cls = HiredisRequestParser if use_hiredis else RequestParser
    return cls(max_bulk_len, max_inline_len, max_multibulk_len)


# --------------------------------------------------------------------------
# Reply encoder
# --------------------------------------------------------------------------

_Encoder = Callable[[bytearray, object, int], None]


def encode(reply: Reply, proto: int = 2) -> bytes:
    """The RESP2 (``proto=2``) or RESP3 (``proto=3``) bytes for one reply."""
    out = bytearray()
    encode_into(out, reply, proto)
    return bytes(out)


def encode_into(out: bytearray, reply: Reply, proto: int = 2) -> None:
    """Append the encoding of ``reply`` to ``out``."""
    # Exact type() checks (which mypy narrows on) for the hot shapes; bool,
    # subclasses and the rest go through the table. Three appends beat one
    # "%b" format: no temporary copy of the body.
    if type(reply) is bytes:
        out += b"$%d\r\n" % len(reply)
        out += reply
        out += _CRLF
    elif type(reply) is int:
        out += b":%d\r\n" % reply
    elif type(reply) is Status:
        data = reply.encode("utf-8", "surrogateescape")
        out += b"+"
        out += _one_line(data) if b"\r" in data or b"\n" in data else data
        out += _CRLF
    elif type(reply) is list:
        _enc_array(out, reply, proto)
    else:
        _encoder_for(type(reply))(out, reply, proto)


def _enc_array(out: bytearray, items: list[Reply] | tuple[Reply, ...], proto: int) -> None:
    out += b"*%d\r\n" % len(items)
    for item in items:
        # Bulk strings inline, to save calls per element: bodies (bytes),
        # and the queue names and job IDs of GETJOB's replies (str).
        if type(item) is bytes:
            out += b"$%d\r\n" % len(item)
            out += item
            out += _CRLF
        elif type(item) is str:
            data = item.encode("utf-8", "surrogateescape")
            out += b"$%d\r\n" % len(data)
            out += data
            out += _CRLF
        elif type(item) is list:
            _enc_array(out, item, proto)
        else:
            encode_into(out, item, proto)


def _text(value: str) -> bytes:
    # surrogateescape: strings made from client bytes with the same handler
    # go back out unchanged.
    return value.encode("utf-8", "surrogateescape")


def _one_line(data: bytes) -> bytes:
    """A status or error must stay on its line."""
    return data.replace(b"\r", b" ").replace(b"\n", b" ")


def _enc_bulk(out: bytearray, data: bytes) -> None:
    out += b"$%d\r\n" % len(data)
    out += data
    out += _CRLF


def _enc_bytes(out: bytearray, reply: object, proto: int) -> None:
    # bytes subclasses, and buffers that are not in the Reply type but cost
    # nothing to allow.
    assert isinstance(reply, bytes | bytearray | memoryview)
    _enc_bulk(out, reply if isinstance(reply, bytes) else bytes(reply))


def _enc_str(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, str)
    _enc_bulk(out, _text(reply))


def _enc_int(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, int)
    out += b":%d\r\n" % reply


def _enc_status(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, str)
    out += b"+%b\r\n" % _one_line(_text(reply))


def _enc_error(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, ReplyError)
    out += b"-%b\r\n" % _one_line(_text(reply.line))


def _enc_none(out: bytearray, reply: object, proto: int) -> None:
    out += b"_\r\n" if proto >= 3 else b"$-1\r\n"


def _enc_null_array(out: bytearray, reply: object, proto: int) -> None:
    out += b"_\r\n" if proto >= 3 else b"*-1\r\n"


def _enc_bool(out: bytearray, reply: object, proto: int) -> None:
    if proto >= 3:
        out += b"#t\r\n" if reply else b"#f\r\n"
    else:
        out += b":1\r\n" if reply else b":0\r\n"


def _enc_float(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, float)
    text = format_double(reply)
    if proto >= 3:
        out += b",%b\r\n" % text
    else:
        out += b"$%d\r\n%b\r\n" % (len(text), text)


def format_double(value: float) -> bytes:
    """A double as Redis' d2string() prints it.

    inf/-inf/nan by name, "-0" for negative zero, integral values of
    moderate size without exponent or ".0", otherwise the shortest
    round-tripping form (Python's repr, like Redis' fpconv_dtoa).
    """
    if value == 0:
        return b"-0" if math.copysign(1.0, value) < 0 else b"0"
    if value.is_integer() and abs(value) < 1e16:
        return b"%d" % int(value)
    return repr(value).encode("ascii")  # includes 'inf', '-inf', 'nan'


def _enc_verbatim(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, str)
    data = _text(reply)
    if proto >= 3:
        out += b"=%d\r\ntxt:" % (len(data) + 4)
        out += data
        out += _CRLF
    else:
        _enc_bulk(out, data)


def _enc_list(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, list | tuple)
    _enc_array(out, reply, proto)


def _enc_push(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, tuple)
    if proto >= 3:
        out += b">%d\r\n" % len(reply)
        for item in reply:
            encode_into(out, item, proto)
    else:
        _enc_array(out, reply, proto)


def _enc_dict(out: bytearray, reply: object, proto: int) -> None:
    assert isinstance(reply, dict)
    out += (b"%%%d\r\n" if proto >= 3 else b"*%d\r\n") % (
        len(reply) if proto >= 3 else 2 * len(reply)
    )
    for key, value in reply.items():
        encode_into(out, key, proto)
        encode_into(out, value, proto)


# Exact types first; subclasses (an IntEnum, a str subclass) are resolved once
# through the MRO and cached. Order matters for the MRO walk only in that
# bool must win over int, which the MRO does by itself.
_ENCODERS: dict[type, _Encoder] = {
    bytes: _enc_bytes,
    bytearray: _enc_bytes,
    memoryview: _enc_bytes,
    str: _enc_str,
    int: _enc_int,
    bool: _enc_bool,
    float: _enc_float,
    Status: _enc_status,
    Verbatim: _enc_verbatim,
    ReplyError: _enc_error,
    type(None): _enc_none,
    _NullArray: _enc_null_array,
    list: _enc_list,
    tuple: _enc_list,
    Push: _enc_push,
    dict: _enc_dict,
}


def _encoder_for(cls: type) -> _Encoder:
    try:
        return _ENCODERS[cls]
    except KeyError:
        pass
    for base in cls.__mro__[1:]:
        if base in _ENCODERS:
            _ENCODERS[cls] = _ENCODERS[base]
            return _ENCODERS[base]
    raise TypeError(f"cannot encode {cls.__name__} as a RESP reply")


# --------------------------------------------------------------------------
# Reply reader (tests and tools)
# --------------------------------------------------------------------------


class _NotReady(enum.Enum):
    NOT_READY = "NOT_READY"


NOT_READY: Final = _NotReady.NOT_READY
"""What ``ReplyReader.next_reply`` returns while a reply is incomplete."""


class _Incomplete(Exception):
    pass


class ReplyReader:
    """Decode RESP2/RESP3 replies into Python values.

    ``+`` Status, ``-``/``!`` ReplyError (not raised), ``:``/``(`` int,
    ``$`` bytes (``$-1`` None), ``*`` list (``*-1`` NULL_ARRAY), ``_`` None,
    ``,`` float, ``#`` bool, ``=`` Verbatim (format prefix dropped), ``%``
    dict, ``~``/``>`` list; ``|`` attributes are read and dropped.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        del self._buf[: self._pos]
        self._pos = 0
        self._buf += data

    def next_reply(self) -> object:
        """The next decoded reply, or NOT_READY."""
        try:
            value, self._pos = self._read(self._pos)
        except _Incomplete:
            return NOT_READY
        except ValueError as exc:  # a length or number that is not one
            raise ProtocolError(str(exc)) from exc
        return value

    def _line(self, pos: int) -> tuple[bytes, int]:
        cr = self._buf.find(_CRLF, pos)
        if cr < 0:
            raise _Incomplete
        return bytes(self._buf[pos:cr]), cr + 2

    def _blob(self, size: int, pos: int) -> tuple[bytes, int]:
        if len(self._buf) - pos < size + 2:
            raise _Incomplete
        return bytes(self._buf[pos : pos + size]), pos + size + 2

    def _read(self, pos: int) -> tuple[object, int]:
        line, pos = self._line(pos)
        if not line:
            raise ProtocolError("empty reply line")
        kind, rest = chr(line[0]), line[1:]
        if kind in "$=!":
            return self._read_blob(kind, int(rest), pos)
        if kind in "*~>%|":
            return self._read_aggregate(kind, int(rest), pos)
        return _simple(kind, rest), pos

    def _read_blob(self, kind: str, size: int, pos: int) -> tuple[object, int]:
        if size < 0:
            return None, pos
        data, pos = self._blob(size, pos)
        if kind == "=":
            return Verbatim(data[4:].decode("utf-8", "surrogateescape")), pos
        if kind == "!":
            return _error(data), pos
        return data, pos

    def _read_aggregate(self, kind: str, count: int, pos: int) -> tuple[object, int]:
        if count < 0:
            return NULL_ARRAY, pos
        items = []
        for _ in range(2 * count if kind in "%|" else count):
            item, pos = self._read(pos)
            items.append(item)
        if kind == "|":  # attributes annotate the reply that follows
            return self._read(pos)
        if kind == "%":
            return dict(zip(items[::2], items[1::2], strict=True)), pos
        return items, pos


def _error(data: bytes) -> ReplyError:
    code, _, message = data.decode("utf-8", "surrogateescape").partition(" ")
    return ReplyError(code, message)


def _simple(kind: str, rest: bytes) -> object:
    if kind == "+":
        return Status(rest.decode("utf-8", "surrogateescape"))
    if kind == "-":
        return _error(rest)
    if kind in ":(":
        return int(rest)
    if kind == "_":
        return None
    if kind == ",":
        return float(rest)
    if kind == "#":
        return rest == b"t"
    raise ProtocolError(f"unknown reply type {kind!r}")
