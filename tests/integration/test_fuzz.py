"""Fuzzers against a real node: the RESP port and the cluster bus.

Each sends random input for a bounded time (``DISQUE_FUZZ_SECONDS``, 20 by
default; set it higher to fuzz for longer by hand) from a seed it prints
(``DISQUE_FUZZ_SEED`` replays one), and after every batch checks that the
node still answers PING within two seconds on a fresh connection and that its
resident memory stays under ``RSS_LIMIT``. Commands that stop or reconfigure
the node on purpose (SHUTDOWN, DEBUG SLEEP, CONFIG SET, CLUSTER RESET...)
are left out, and so is CLIENT KILL (it would close the checking
connection, by its sequential ID): they are not attacks.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest

from disque_trio.protocol import bus

from .conftest import NodeProcess
from .test_hostile import STOLEN, BusStranger, ping_time, rss_of

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("DISQUE_FUZZ_SECONDS", "20"))
RSS_LIMIT = 400 << 20

COMMANDS = [
    b"ADDJOB", b"GETJOB", b"ACKJOB", b"FASTACK", b"DELJOB", b"SHOW", b"QLEN", b"QPEEK",
    b"QSTAT", b"QSCAN", b"JSCAN", b"ENQUEUE", b"DEQUEUE", b"NACK", b"WORKING", b"PAUSE",
    b"HELLO", b"INFO", b"PING", b"TIME", b"AUTH", b"COMMAND", b"CLIENT", b"SLOWLOG",
    b"LATENCY", b"MONITOR", b"QUIT", b"ECHO", b"BGREWRITEAOF", b"NOSUCHCMD", b"",
]  # fmt: skip
WORDS = [
    b"NOHANG", b"TIMEOUT", b"COUNT", b"WITHCOUNTERS", b"FROM", b"REPLICATE", b"DELAY",
    b"RETRY", b"TTL", b"MAXLEN", b"ASYNC", b"BUSYLOOP", b"MINLEN", b"IMPORTRATE", b"QUEUE",
    b"STATE", b"REPLY", b"all", b"id", b"in", b"out", b"none", b"bcast", b"queued",
    b"active", b"acked", b"LIST", b"SETNAME", b"GET", b"RESET", b"LATEST",
    b"DOCTOR", b"JOBS", b"HELP", b"NODES", b"INFO", b"MYID", b"3", b"2", b"q", b"",
]  # fmt: skip
NUMBERS = [
    0, 1, -1, 2, 100, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
    -(2**63), 2**64, 10**30,
]  # fmt: skip


def fuzz_seed() -> int:
    seed = int(os.environ.get("DISQUE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"fuzz seed {seed} (DISQUE_FUZZ_SEED={seed} replays it)")
    return seed


def batches(seconds: float) -> Iterator[int]:
    """Batch numbers until the time is spent."""
    deadline = time.monotonic() + seconds
    batch = 0
    while time.monotonic() < deadline:
        yield batch
        batch += 1


def still_healthy(node: NodeProcess) -> None:
    assert node.proc is not None and node.proc.poll() is None, "the node exited"
    assert ping_time(node) < 2.0
    assert rss_of(node) < RSS_LIMIT


# ---------------------------------------------------------------- RESP


def _arg(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.choice(NUMBERS)).encode()
    if kind == 1:
        return rng.choice(WORDS)
    if kind == 2:
        return b"D-" + rng.randbytes(4).hex().encode() + b"-" + b"A" * 24 + b"-05a1"
    if kind == 3:
        return rng.randbytes(rng.randrange(40))
    if kind == 4:
        return "é✓\u0000\ud800".encode("utf-8", "surrogatepass")[: rng.randrange(12)]
    if kind == 5:
        return b"x" * rng.choice((0, 1, 1000, 70_000))
    return str(rng.randrange(-10, 5000)).encode()


def _command(rng: random.Random) -> list[bytes]:
    return [rng.choice(COMMANDS)] + [_arg(rng) for _ in range(rng.randrange(8))]


def _frame(rng: random.Random, argv: list[bytes]) -> bytes:
    """RESP for argv, sometimes inline, sometimes broken on purpose."""
    shape = rng.randrange(10)
    if shape == 0:  # inline, quotes and all
        return b" ".join(argv).replace(b"\r", b"").replace(b"\n", b"") + b"\r\n"
    out = [b"*%d\r\n" % len(argv)]
    for a in argv:
        out.append(b"$%d\r\n%b\r\n" % (len(a), a))
    data = b"".join(out)
    if shape == 1:  # a lying header
        return rng.choice((b"*", b"$")) + str(rng.choice(NUMBERS)).encode() + b"\r\n" + data
    if shape == 2:  # flipped bytes
        raw = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if shape == 3:  # cut short
        return data[: rng.randrange(len(data) + 1)]
    return data


def test_resp_fuzzer(node_factory: Callable[..., NodeProcess]) -> None:
    # Bodies of up to 70 KB pile up as jobs: maxmemory keeps that bounded
    # (past it ADDJOB is refused), so RSS measures leaks, not jobs.
    node = node_factory("--appendonly", "yes", "--maxmemory", "64mb")
    rng = random.Random(fuzz_seed())
    for _ in batches(SECONDS):
        sockets = []
        for _ in range(rng.randrange(1, 6)):
            s = socket.create_connection(("127.0.0.1", node.port), timeout=5)
            sockets.append(s)
            payload = b"".join(_frame(rng, _command(rng)) for _ in range(rng.randrange(1, 40)))
            try:
                for start in range(0, len(payload), 1 << 16):
                    s.sendall(payload[start : start + (1 << 16)])
            except OSError:
                pass  # the node closed it: a protocol error
        for s in sockets:
            s.close()
        still_healthy(node)


# ----------------------------------------------------------------- bus


def _extreme_int(rng: random.Random) -> int:
    return rng.choice([0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, rng.randrange(2**64)])


def _random_message(rng: random.Random, sender: str) -> bytes:
    """A frame: well-formed messages with extreme numbers, or random
    msgpack bodies for a real type code, or raw garbage."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(64))
    if kind == 1:
        body = [
            rng.choice([None, True, 1.5, "s", b"b", [], {}, _extreme_int(rng)]) for _ in range(6)
        ]
        payload = msgpack.packb([rng.choice(list(bus.MsgType)).value, body], use_bin_type=True)
        return len(payload).to_bytes(4, "big") + payload
    job_id = STOLEN.id
    messages: list[bus.Message] = [
        bus.ReplJob(
            bus.JobData(
                job_id, "q", b"x", _extreme_int(rng) % 65536, _extreme_int(rng),
                rng.choice([1, 600, 2**32 - 1]), rng.choice([0, 2**32 - 1]),
                rng.choice([0, 1, 2**32 - 1]), _extreme_int(rng), _extreme_int(rng), (sender,),
            ),
            rng.random() < 0.5,
        ),
        bus.Queued(job_id, _extreme_int(rng)),
        bus.SetAck(job_id, _extreme_int(rng)),
        bus.NeedJobs("q", _extreme_int(rng)),
        bus.Pause("q", _extreme_int(rng)),
        bus.Enqueue(job_id, rng.choice([0, 1, 2**32 - 1])),
        bus.Ping(sender, _extreme_int(rng), ()),
        bus.WillQueue(job_id),
        bus.DelJob(job_id),
        bus.GotAck(job_id, rng.random() < 0.5),
    ]  # fmt: skip
    try:
        return bus.encode_frame(rng.choice(messages))
    except bus.BusError:
        return b"\x00\x00\x00\x01\xc1"  # an int past 64 bits: a bad frame instead


def test_bus_fuzzer(node_factory: Callable[..., NodeProcess]) -> None:
    node = node_factory("--appendonly", "yes")
    rng = random.Random(fuzz_seed())
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"ADDJOB q body 0\r\n")  # something for NEEDJOBS to take
        assert s.recv(128).startswith(b"+D-")
    for batch in batches(SECONDS):
        if batch % 3 == 0:  # before any handshake: garbage
            with socket.create_connection(("127.0.0.1", node.port + 10000), timeout=5) as s:
                try:
                    s.sendall(b"".join(_random_message(rng, "ab" * 20) for _ in range(5)))
                except OSError:
                    pass
        else:  # after a handshake and MEET: messages with extreme values
            # A few peers, not a new one per batch: joining with made-up
            # nodes is what cluster-secret stops (test_hostile), and each
            # joined node costs a link task; this fuzzes the frames.
            sender = f"{rng.randrange(8) + 1:040x}"
            stranger = BusStranger(node, node_id=sender)
            try:
                stranger.send(bus.Meet(sender, 0))
                for _ in range(rng.randrange(1, 20)):
                    stranger.sock.sendall(_random_message(rng, sender))
            except OSError:
                pass  # the node closed the link: a bad frame
            finally:
                stranger.close()
        still_healthy(node)
