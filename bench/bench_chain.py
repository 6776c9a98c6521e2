#!/usr/bin/env python3
"""Where one client's REPLICATE 3 ADDJOB spends its time, step by step.

Starts three nodes on loopback, each with probes wrapped around a few of
its functions (in that node's process only: nothing of the installed code
changes), sends ADDJOB ... REPLICATE 3 one after another on one connection
and prints, for the commonest order of events, the median time between
consecutive events across the three processes (CLOCK_MONOTONIC is one
clock for the whole machine):

    O:c_read      the origin read the request
    O:x_start     ... started the ADDJOB (parsed it, looked up the command)
    O:x_end       ... finished it (job made, REPLJOBs handed to the bus)
    O:b_write     ... is about to write a REPLJOB to a replica (once each)
    R1:b_read     the first replica read the REPLJOB
    R1:d_start    ... decoded it and started handling it
    R1:d_end      ... handled it (copy stored, GOTJOB handed to the bus)
    R1:b_write    ... is about to write the GOTJOB
    O:b_read      the origin read a GOTJOB
    O:c_sent      the origin wrote the reply (after the second GOTJOB)

    python bench/bench_chain.py [--requests 3000] [--skip 200]

A benchmark that prints figures, not a test. The probes cost a little
themselves (a clock read and a list append each, under a microsecond).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench_single import BODY, HOST, BenchError, Server, command, encode
from bench_vs_c import free_pair, one_client, reachable

ADDJOB = encode("ADDJOB", "q", BODY, 5000, "REPLICATE", 3)


# ------------------------------------------------------------ in a node


def _node_main(out: str, argv: list[str]) -> None:
    """Run one node (argv as for ``python -m disque_trio``) with probes,
    writing its events to ``out`` when it exits."""
    from disque_trio import cli
    from disque_trio.server import connections, node, peers, sockio

    events: list[tuple[str, int]] = []
    clock = time.monotonic_ns

    def mark(tag: str) -> None:
        events.append((tag, clock()))

    def after(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            mark(tag)
            return result

        return wrapped

    def around(fn: Callable[..., Any], start: str, end: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            mark(start)
            try:
                return fn(*args, **kwargs)
            finally:
                mark(end)

        return wrapped

    def mark_then_write(stream: Any, data: bytes) -> int:
        mark("b_write")  # before: the reader may wake before the write returns
        return int(write(stream, data))

    # The names the node's modules call (each imported its own reference).
    write = sockio.write_nowait
    connections.receive_some = after(sockio.receive_some, "c_read")  # type: ignore[attr-defined]
    connections.send_all = after(sockio.send_all, "c_sent")  # type: ignore[attr-defined]
    peers.receive_some = after(sockio.receive_some, "b_read")  # type: ignore[attr-defined]
    peers.write_nowait = mark_then_write  # type: ignore[attr-defined]
    server = node.NodeServer
    server.execute = around(server.execute, "x_start", "x_end")  # type: ignore[method-assign]
    server._dispatch = around(server._dispatch, "d_start", "d_end")  # type: ignore[method-assign]

    def dump() -> None:
        with open(out, "w") as f:
            f.writelines(f"{tag} {ns}\n" for tag, ns in events)

    atexit.register(dump)
    sys.exit(cli.main(argv))


# --------------------------------------------------------------- driver


def run(requests: int, root: str) -> tuple[list[float], list[str]]:
    """Three probed nodes, meshed; ``requests`` ADDJOBs from one client.
    The client's sorted times, and each node's event file (written when it
    stops)."""
    nodes: list[Server] = []
    outs: list[str] = []
    try:
        for i in range(3):
            port, bus_port = free_pair()
            work = os.path.join(root, f"n{i}")
            os.makedirs(work)
            out = os.path.join(root, f"events{i}")
            argv = [sys.executable, os.path.abspath(__file__), "--node", out]
            argv += ["--port", str(port), "--cluster-port", str(bus_port)]
            argv += ["--bind", HOST, "--dir", work, "--loglevel", "warning"]
            nodes.append(Server(f"node{i}", argv, port, work))
            outs.append(out)
            nodes[-1].wait_ready()
        first = nodes[0].port
        for node in nodes[1:]:
            if command(first, b"CLUSTER", b"MEET", HOST, node.port, node.port + 10000) != b"OK":
                raise BenchError("CLUSTER MEET failed")
        deadline = time.monotonic() + 30
        while any(reachable(node.port) != 2 for node in nodes):
            if time.monotonic() > deadline:
                raise BenchError("the nodes did not mesh in 30 s")
            time.sleep(0.1)
        times = one_client(first, ADDJOB, requests)
    finally:
        for node in nodes:
            node.stop()  # SIGTERM: each writes its events as it exits
    return times, outs


def chains(outs: list[str], skip: int) -> list[list[tuple[int, str, str]]]:
    """Every request's events, from the origin's read to its reply."""
    events: list[tuple[int, str, str]] = []
    for i, path in enumerate(outs):
        with open(path) as f:
            for line in f:
                tag, ns = line.split()
                events.append((int(ns), str(i), tag))
    events.sort()
    found: list[list[tuple[int, str, str]]] = []
    current: list[tuple[int, str, str]] | None = None
    for ev in events:
        _, who, tag = ev
        if who == "0" and tag == "c_read":
            current = [ev]
        elif current is not None:
            current.append(ev)
            if who == "0" and tag == "c_sent":
                found.append(current)
                current = None
    return found[skip:]


def _first(events: list[tuple[int, str]], tag: str, after: int = 0) -> int | None:
    return next((ns for ns, t in events if t == tag and ns >= after), None)


def _last(events: list[tuple[int, str]], tag: str, before: float = float("inf")) -> int | None:
    return next((ns for ns, t in reversed(events) if t == tag and ns <= before), None)


def stages(chain: list[tuple[int, str, str]]) -> dict[str, float] | None:
    """One request's steps in microseconds, or None if one is missing (a
    timer or a heartbeat got in the way: left out)."""
    by: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for ns, who, tag in chain:
        by[who].append((ns, tag))
    origin = by.pop("0")
    if len(by) != 2:
        return None
    read, start, end = (_first(origin, t) for t in ("c_read", "x_start", "x_end"))
    out = _last(origin, "b_write")
    done, sent = _last(origin, "d_end"), _last(origin, "c_sent")
    if None in (read, start, end, out, done, sent):
        return None
    assert read is not None and start is not None and end is not None
    assert out is not None and done is not None and sent is not None
    got: dict[str, list[float]] = defaultdict(list)
    for events in by.values():
        r_read = _first(events, "b_read")
        r_start = _first(events, "d_start")
        r_end = _first(events, "d_end")
        r_write = _first(events, "b_write")
        if None in (r_read, r_start, r_end, r_write):
            return None
        assert r_read is not None and r_start is not None
        assert r_end is not None and r_write is not None
        back = _first(origin, "b_read", r_write)
        woke = _last(origin, "b_write", r_read)  # the write that woke it
        if back is None or woke is None:
            return None
        got["replica: REPLJOB read to decoded"].append(r_start - r_read)
        got["replica: handled (copy stored, GOTJOB sent)"].append(r_end - r_start)
        got["replica: commit, GOTJOB encoded, to the write"].append(r_write - r_end)
        got["hop: origin's REPLJOB write to the replica's read"].append(r_read - woke)
        got["hop: replica's GOTJOB write to the origin's read"].append(back - r_write)
    row: dict[str, float] = {
        "origin: request read to ADDJOB started (parse)": start - read,
        "origin: ADDJOB (job made, REPLJOBs to the bus)": end - start,
        "origin: commit to the last REPLJOB write": out - end,
        "origin: waiting for both GOTJOBs": done - out,
        "origin: last GOTJOB handled to the reply written": sent - done,
    }
    row.update({k: sum(v) / len(v) for k, v in got.items()})
    row["request read to reply written"] = sent - read
    return {k: v / 1000 for k, v in row.items()}


def report(found: list[list[tuple[int, str, str]]]) -> None:
    rows = [r for r in (stages(c) for c in found) if r is not None]
    if not rows:
        print("no complete request to report")
        return
    print(
        f"{len(rows)} of {len(found)} requests complete; medians (replica rows: mean of the two)"
    )
    for key in rows[0]:
        print(f"  {key:<56} {statistics.median(r[key] for r in rows):7.1f} us")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--node"]:
        _node_main(args[1], args[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--skip", type=int, default=200, help="first requests left out (warm-up)")
    opts = parser.parse_args(args)
    root = tempfile.mkdtemp(prefix="bench-chain-")
    try:
        times, outs = run(opts.requests, root)
        n = len(times)
        print(
            f"{n} ADDJOB REPLICATE 3, one client: p50 {times[n // 2] * 1000:.3f} ms, "
            f"p99 {times[int(n * 0.99)] * 1000:.3f} ms (client side, probes on)"
        )
        report(chains(outs, opts.skip))
    except BenchError as e:
        print(f"bench_chain: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
