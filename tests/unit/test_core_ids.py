"""Node IDs and job IDs: shape, TTL-in-ID encoding, validation (-BADID)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio.core.ids import (
    JOB_ID_LEN,
    MAX_TTL_MINUTES,
    JobIdGenerator,
    is_at_most_once_id,
    is_valid_job_id,
    new_node_id,
    ttl_minutes_from_id,
)

from .core_support import NODE_ID, add, error_line, make_node, run

JOB_ID_RE = re.compile(r"^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$")
BADID = "BADID Invalid Job ID format."


def test_job_id_shape() -> None:
    node, _ = make_node()
    job_id = add(node)
    assert len(job_id) == JOB_ID_LEN == 40
    assert JOB_ID_RE.match(job_id)
    assert job_id.startswith("D-" + NODE_ID[:8] + "-")
    assert is_valid_job_id(job_id)


@pytest.mark.parametrize(
    ("ttl", "retry", "minutes"),
    [
        (3600, None, 0x3D),  # 60 min, RETRY > 0 by default: forced odd
        (3600, 0, 0x3C),  # RETRY 0: forced even
        (7260, 5, 0x79),  # 121 min: already odd
        (7260, 0, 0x78),
        (30, 1, 0x01),  # under a minute, odd for RETRY > 0
        (30, 0, 0x00),
        (24 * 3600, None, 0x5A1),  # the default TTL, like the example in core/ids.py
        (100 * 24 * 3600, None, 0xFFFF),  # saturates at a u16
        (100 * 24 * 3600, 0, 0xFFFE),
    ],
)
def test_ttl_minutes_and_parity_in_id(ttl: int, retry: int | None, minutes: int) -> None:
    node, _ = make_node()
    opts: list[object] = ["TTL", ttl] + ([] if retry is None else ["RETRY", retry])
    job_id = add(node, "q", "b", *opts)
    assert job_id[-4:] == f"{minutes:04x}"
    assert ttl_minutes_from_id(job_id) == minutes
    assert is_at_most_once_id(job_id) == (retry == 0)


@given(ttl=st.integers(1, 2**40), retry=st.integers(0, 2**31))
@settings(max_examples=200, deadline=None, database=None)
def test_generator_encodes_ttl_with_parity(ttl: int, retry: int) -> None:
    gen = JobIdGenerator(NODE_ID, random.Random(1))
    job_id = gen.next_id(ttl, retry)
    assert JOB_ID_RE.match(job_id)
    minutes = ttl_minutes_from_id(job_id)
    expected = min(ttl // 60, MAX_TTL_MINUTES)
    assert minutes in (expected, expected ^ 1)
    assert minutes & 1 == (1 if retry > 0 else 0)


def test_ids_are_unique_and_seeded() -> None:
    a = JobIdGenerator(NODE_ID, random.Random(7))
    b = JobIdGenerator(NODE_ID, random.Random(7))
    c = JobIdGenerator(NODE_ID, random.Random(8))
    ids_a = [a.next_id(60, 1) for _ in range(5000)]
    assert len(set(ids_a)) == 5000
    assert ids_a[:50] == [b.next_id(60, 1) for _ in range(50)]  # same seed, same IDs
    assert not set(ids_a[:50]) & {c.next_id(60, 1) for _ in range(50)}


def test_set_node_id_changes_prefix() -> None:
    gen = JobIdGenerator(NODE_ID, random.Random(1))
    gen.set_node_id("0123456789" + "f" * 30)
    assert gen.next_id(60, 1).startswith("D-01234567-")


def test_new_node_id_is_40_hex() -> None:
    rng = random.Random(3)
    ids = {new_node_id(rng) for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{40}", i) for i in ids)


GOOD = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "D-dcb833cf",
        GOOD + "0",  # 41 characters
        GOOD[:-1],  # 39 characters
        "d" + GOOD[1:],  # lowercase prefix
        "X" + GOOD[1:],
        "DX" + GOOD[2:],
        GOOD[:10] + "+" + GOOD[11:],  # separator at 10
        GOOD[:35] + "+" + GOOD[36:],  # separator at 35
    ],
)
def test_is_valid_job_id_rejects(bad: str) -> None:
    assert not is_valid_job_id(bad)


def test_is_valid_job_id_only_checks_shape() -> None:
    # The original checks length and separators only; the lookup does the rest.
    assert is_valid_job_id(GOOD)
    assert is_valid_job_id("D-" + "?" * 8 + "-" + "!" * 24 + "-zzzz")


def test_ttl_from_id_reads_bad_hex_as_zero_and_accepts_uppercase() -> None:
    assert ttl_minutes_from_id(GOOD) == 0x5A1
    assert ttl_minutes_from_id(GOOD[:36] + "05A1") == 0x5A1
    assert ttl_minutes_from_id(GOOD[:36] + "z5a1") == 0x5A1
    assert ttl_minutes_from_id(GOOD[:36] + "zzzz") == 0
    assert is_at_most_once_id(GOOD[:36] + "zzzz")  # 0: even


@pytest.mark.parametrize(
    "cmd", ["ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB", "WORKING", "SHOW"]
)
def test_commands_validate_ids(cmd: str) -> None:
    node, _ = make_node()
    assert error_line(run(node, cmd, "not-an-id")) == BADID
    assert error_line(run(node, cmd, GOOD + "x")) == BADID


@pytest.mark.parametrize("cmd", ["ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB"])
def test_one_bad_id_means_nothing_is_done(cmd: str) -> None:
    node, _ = make_node()
    job_id = add(node)
    if cmd in ("NACK", "ENQUEUE"):
        run(node, "GETJOB", "FROM", "q")  # make it active so that it could be queued
    state = node.jobs[job_id].state
    assert error_line(run(node, cmd, job_id, "bad")) == BADID
    assert node.jobs[job_id].state == state
    assert node.queue_length("q") == (1 if cmd not in ("NACK", "ENQUEUE") else 0)


def test_ids_accept_arbitrary_bytes_after_shape_check() -> None:
    # Non-ASCII bytes of the right length are a well-formed unknown ID.
    node, _ = make_node()
    weird = b"D-" + b"\xff" * 8 + b"-" + b"\x00" * 24 + b"-" + b"\xfe" * 4
    assert run(node, "SHOW", weird) is None
    assert run(node, "ACKJOB", weird) == 0
