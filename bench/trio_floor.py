#!/usr/bin/env python3
"""The floor under any node built like disque-trio: a Trio server that does
nothing but answer PING, one task per connection, reading and writing with
the node's own socket helpers (disque_trio/server/sockio.py).

It parses nothing: each command it reads (each ``*`` that starts one; a
PING holds no other) gets a ``+PONG``, whatever it is: redis-benchmark's
CONFIG GET too, which it then reports it could not fetch. What it
costs per request (a wake-up, a read, a write, the scheduler) is what every
request to a node costs before any parsing or command runs, so its ratio to
C Disque's PING is a ceiling for any -P 1 figure of the node.

    python bench/trio_floor.py PORT     (bench_vs_c.py starts it itself)
"""

from __future__ import annotations

import sys
from functools import partial

import trio

from disque_trio.server.sockio import receive_some, send_all

PONG = b"+PONG\r\n"


async def serve(stream: trio.SocketStream) -> None:
    answered = False
    try:
        while data := await receive_some(stream, 65536, answered):
            await send_all(stream, PONG * data.count(b"*"))
            answered = True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def main() -> None:
    port = int(sys.argv[1])
    trio.run(partial(trio.serve_tcp, serve, port, host="127.0.0.1"))


if __name__ == "__main__":
    main()
