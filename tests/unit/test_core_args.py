"""The argument parsers of core/args.py, called directly (no node)."""

from __future__ import annotations

import pytest

from disque_trio.core.args import MAX_GETJOB_QUEUES, parse_getjob
from disque_trio.protocol.replies import ReplyError

USAGE = "GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]"


def argv(*words: object) -> list[bytes]:
    return [b"GETJOB", *(w if isinstance(w, bytes) else str(w).encode() for w in words)]


def refusal(*words: object) -> str:
    with pytest.raises(ReplyError) as raised:
        parse_getjob(argv(*words))
    return raised.value.line


def test_getjob_defaults() -> None:
    args = parse_getjob(argv("FROM", "q"))
    assert (args.timeout, args.count, args.nohang, args.withcounters) == (0, 1, False, False)
    assert args.queues == ["q"]


def test_getjob_every_option_in_any_order_and_case() -> None:
    args = parse_getjob(
        argv("withcounters", "Count", 5, "NOHANG", "timeout", 250, "from", "a", "b")
    )
    assert (args.timeout, args.count, args.nohang, args.withcounters) == (250, 5, True, True)
    assert args.queues == ["a", "b"]


def test_getjob_words_after_from_are_queue_names() -> None:
    args = parse_getjob(argv("FROM", "a", "TIMEOUT", "10", "a", "FROM"))
    assert args.queues == ["a", "TIMEOUT", "10", "a", "FROM"]  # repeats kept
    assert args.timeout == 0
    assert parse_getjob(argv("FROM", "FROM")).queues == ["FROM"]


def test_getjob_binary_queue_names_round_trip() -> None:
    name = parse_getjob(argv("FROM", b"\xff\x00q")).queues[0]
    assert name.encode("utf-8", "surrogateescape") == b"\xff\x00q"


def test_getjob_later_options_win() -> None:
    args = parse_getjob(argv("COUNT", 2, "COUNT", 3, "TIMEOUT", 5, "TIMEOUT", 0, "FROM", "q"))
    assert (args.count, args.timeout) == (3, 0)


def test_getjob_from_without_a_queue_says_so() -> None:
    message = f"ERR syntax error: a queue name is needed after FROM ({USAGE})"
    assert refusal("FROM") == message
    assert refusal("NOHANG", "TIMEOUT", 10, "FROM") == message


def test_getjob_without_from_says_so() -> None:
    message = f"ERR syntax error: FROM and at least one queue name are needed ({USAGE})"
    assert refusal("NOHANG") == message
    assert refusal("COUNT", 1) == message
    assert refusal("NOHANG", "WITHCOUNTERS", "TIMEOUT", 10) == message


def test_getjob_option_without_value() -> None:
    assert refusal("TIMEOUT") == f"ERR syntax error: TIMEOUT needs a value ({USAGE})"
    assert refusal("NOHANG", "count") == f"ERR syntax error: COUNT needs a value ({USAGE})"


def test_getjob_unknown_option_is_named() -> None:
    assert refusal("FOO", "FROM", "q") == f"ERR syntax error: unknown option 'FOO' ({USAGE})"
    # Options come before FROM only; a value where an option belongs is unknown.
    assert (
        refusal("TIMEOUT", 1, 2, "FROM", "q") == f"ERR syntax error: unknown option '2' ({USAGE})"
    )


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["COUNT", 0], "ERR COUNT must be a number greater than zero"),
        (["COUNT", -1], "ERR COUNT must be a number greater than zero"),
        (["COUNT", "abc"], "ERR COUNT must be a number greater than zero"),
        (["COUNT", "99999999999999999999"], "ERR COUNT must be a number greater than zero"),
        (["TIMEOUT", -1], "ERR timeout is negative"),
        (["TIMEOUT", "abc"], "ERR timeout is not an integer or out of range"),
        (["TIMEOUT", "1.5"], "ERR timeout is not an integer or out of range"),
    ],
)
def test_getjob_bad_values_keep_the_original_messages(words: list[object], message: str) -> None:
    """The original's texts for these are already clear: unchanged."""
    assert refusal(*words, "FROM", "q") == message


def test_getjob_errors_start_like_the_original() -> None:
    """Clients that matched the original's "ERR syntax error" still match."""
    for words in (["FROM"], ["NOHANG"], ["TIMEOUT"], ["FOO", "FROM", "q"]):
        assert refusal(*words).startswith("ERR syntax error")


def test_getjob_takes_at_most_so_many_queues() -> None:
    many = [b"q%d" % i for i in range(MAX_GETJOB_QUEUES)]
    assert len(parse_getjob([b"GETJOB", b"FROM", *many]).queues) == MAX_GETJOB_QUEUES
    with pytest.raises(ReplyError, match="too many queues: GETJOB takes at most 10000"):
        parse_getjob([b"GETJOB", b"NOHANG", b"FROM", *many, b"one-more"])
