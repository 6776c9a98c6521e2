"""Redis' ``sdssplitargs``: one line split into arguments, with quotes and escapes.

Redis (and Disque) split two things this way: inline commands on the client
port (networking.c's processInlineBuffer) and lines of the configuration file
(config.c). disque-trio does the same, with this one implementation:
``resp.split_args`` turns its error into a protocol error, and
``config.split_args`` works on text, encoding and decoding each line with
surrogateescape so that any byte survives a load/rewrite round trip.

The language, as sds.c's sdssplitargs accepts it:

- arguments are separated by C ``isspace()`` characters (space, ``\\t``,
  ``\\n``, ``\\v``, ``\\f``, ``\\r``); an unquoted argument ends only at space,
  ``\\t``, ``\\n`` or ``\\r``, so ``\\v`` and ``\\f`` are ordinary characters
  inside one (unlike ``bytes.split()``);
- ``"double quotes"`` take ``\\xHH`` (two hex digits), ``\\n``, ``\\r``,
  ``\\t``, ``\\b``, ``\\a``, and a backslash before any other character stands
  for that character; ``'single quotes'`` take only ``\\'``;
- a quote may open in the middle of an argument (``a"b c"`` is ``ab c``), and
  the closing quote ends the argument: it must be followed by a space or by
  the end of the line;
- the line is a C string: a NUL byte ends it, and what follows is ignored.

Where sdssplitargs returns NULL (a quote not closed, a closing quote followed
by something else than a space), ``UnbalancedQuotes`` is raised.
"""

from __future__ import annotations

from typing import Final

__all__ = ["UnbalancedQuotes", "sdssplitargs"]


class UnbalancedQuotes(ValueError):
    """sdssplitargs' NULL; ``str(exc)`` says which of the two cases it was."""


# Characters that need the character-by-character splitter: quotes, NUL (it
# ends the line), and \v, \f (they separate arguments but are ordinary
# characters inside one, unlike bytes.split()).
_SPECIAL: Final = frozenset(b"\"'\x00\x0b\x0c")
_SPACE: Final = frozenset(b" \t\n\r\x0b\x0c")  # C isspace()
_TOKEN_END: Final = frozenset(b" \n\r\t")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES: Final = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
_DOUBLE_QUOTE: Final = 0x22
_SINGLE_QUOTE: Final = 0x27
_BACKSLASH: Final = 0x5C


def sdssplitargs(line: bytes) -> list[bytes]:
    """The arguments of ``line``, split like Redis' sdssplitargs().

    Raises UnbalancedQuotes where sdssplitargs returns NULL.
    """
    if _SPECIAL.isdisjoint(line):
        return line.split()  # the common case, at C speed
    nul = line.find(b"\x00")
    if nul >= 0:
        line = line[:nul]
    args: list[bytes] = []
    i, end = 0, len(line)
    while True:
        while i < end and line[i] in _SPACE:
            i += 1
        if i >= end:
            return args
        arg, i = _split_one(line, i)
        args.append(arg)


def _split_one(line: bytes, i: int) -> tuple[bytes, int]:
    """One argument starting at ``line[i]``; returns it and where to go on."""
    out = bytearray()
    end = len(line)
    while i < end:
        c = line[i]
        if c in _TOKEN_END:
            return bytes(out), i
        if c in (_DOUBLE_QUOTE, _SINGLE_QUOTE):
            reader = _double_quoted if c == _DOUBLE_QUOTE else _single_quoted
            closing = reader(line, i + 1, out)
            # A closing quote ends the argument (and is followed by space).
            return bytes(out), closing + 1
        out.append(c)
        i += 1
    return bytes(out), i


def _close_quote(line: bytes, i: int) -> int:
    # `"foo"bar` is refused: it would be ambiguous to write back.
    if i + 1 < len(line) and line[i + 1] not in _SPACE:
        raise UnbalancedQuotes("closing quote must be followed by a space")
    return i


def _double_quoted(line: bytes, i: int, out: bytearray) -> int:
    """Append a "..." body to ``out``; returns the index of the closing quote."""
    end = len(line)
    while i < end:
        c = line[i]
        if c == _BACKSLASH and i + 1 < end:
            nxt = line[i + 1]
            if nxt == 0x78 and i + 3 < end and line[i + 2] in _HEX and line[i + 3] in _HEX:
                out.append(int(line[i + 2 : i + 4], 16))  # \xHH
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        if c == _DOUBLE_QUOTE:
            return _close_quote(line, i)
        out.append(c)
        i += 1
    raise UnbalancedQuotes("unbalanced quotes")


def _single_quoted(line: bytes, i: int, out: bytearray) -> int:
    """Append a '...' body to ``out``; only \\' is an escape there."""
    end = len(line)
    while i < end:
        c = line[i]
        if c == _BACKSLASH and i + 1 < end and line[i + 1] == _SINGLE_QUOTE:
            out.append(_SINGLE_QUOTE)
            i += 2
            continue
        if c == _SINGLE_QUOTE:
            return _close_quote(line, i)
        out.append(c)
        i += 1
    raise UnbalancedQuotes("unbalanced quotes")
