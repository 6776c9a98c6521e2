"""Codec speed: the RESP request parsers and the bus frame codec, in process.

    python bench/bench_codecs.py               # both
    python bench/bench_codecs.py --only resp   # or --only bus

No server, no network: each figure is the best of several timeit repeats
(so the least disturbed by other work on the machine). The figures quoted in
the docstrings of disque_trio/protocol/resp.py and bus.py come from here.

resp: 10,000 ``ADDJOB q body 0`` multibulk commands (36 bytes each) fed to
``RequestParser`` and ``HiredisRequestParser`` all at once, in 4 KB pieces,
and (1,000 commands) one byte at a time; best of 15, whole run in ms.

bus: ``encode_frame`` and ``FrameDecoder`` for a REPLJOB (10-byte body, 3
nodes), a GOTJOB and a PING with 3 gossip entries; best of 7 x 20,000, per
message in us, with the frame's size.
"""

from __future__ import annotations

import argparse
import functools
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disque_trio.protocol.bus import (
    FrameDecoder,
    GossipEntry,
    GotJob,
    JobData,
    Message,
    Ping,
    ReplJob,
    encode_frame,
)
from disque_trio.protocol.resp import HiredisRequestParser, RequestParser, encode


def bench_resp() -> None:
    one = encode([b"ADDJOB", b"q", b"body", b"0"])
    batch = one * 10_000

    def run(cls: type[RequestParser], data: bytes, step: int) -> None:
        parser = cls()
        for i in range(0, len(data), step):
            parser.feed(data[i : i + step])
            while parser.next_command() is not None:
                pass

    cases = [("one feed", batch, len(batch)), ("4 KB feeds", batch, 4096)]
    cases.append(("1-byte feeds (1,000 cmds)", one * 1000, 1))
    for label, data, step in cases:
        for cls in (RequestParser, HiredisRequestParser):
            job = functools.partial(run, cls, data, step)
            best = min(timeit.repeat(job, number=1, repeat=15))
            print(f"{label:28} {cls.__name__:22} {best * 1e3:8.2f} ms")


def bench_bus() -> None:
    node_ids = tuple(f"{n:040x}" for n in range(1, 4))
    job = JobData(
        id="D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1",
        queue="queue",
        body=b"0123456789",
        repl=3,
        ctime=1_700_000_000_000 * 1_000_000,
        ttl=86400,
        delay=0,
        retry=300,
        nacks=0,
        deliveries=0,
        nodes_delivered=node_ids,
    )
    gossip = tuple(
        GossipEntry(n, "10.0.0.1", 7711, 17711, 0, 0, 1_700_000_000_000) for n in node_ids
    )
    cases: list[tuple[str, Message]] = [
        ("REPLJOB, 10-byte body", ReplJob(job)),
        ("GOTJOB", GotJob(job.id)),
        ("PING, 3 gossip entries", Ping(node_ids[0], 0, gossip)),
    ]
    for label, msg in cases:
        frame = encode_frame(msg)
        decoder = FrameDecoder()

        def encode_one(msg: Message = msg) -> None:
            encode_frame(msg)

        def decode_one(frame: bytes = frame, decoder: FrameDecoder = decoder) -> None:
            decoder.feed(frame)
            decoder.next_message()

        for what, fn in (("encode", encode_one), ("decode", decode_one)):
            best = min(timeit.repeat(fn, number=20_000, repeat=7)) / 20_000
            print(f"{label:26} {what}  {best * 1e6:6.2f} us  ({len(frame)} bytes)")


BENCHES = {"resp": bench_resp, "bus": bench_bus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(BENCHES), help="one codec only")
    args = parser.parse_args()
    for name, bench in BENCHES.items():
        if args.only in (None, name):
            bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
