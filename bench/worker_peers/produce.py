"""The producer step: ``python -m worker_peers.produce APP WARMUP COUNT``.

Enqueues WARMUP jobs, prints ``ready``, waits for a line on stdin (the
benchmark's go, sent once it has read the worker's CPU time), then
enqueues COUNT jobs with the framework's own call, one after the other,
and prints one JSON line: the monotonic times of the first and last
enqueue (CLOCK_MONOTONIC is one clock for every process of the machine,
so the benchmark compares them with its own samples).
"""

import asyncio
import importlib
import json
import sys
import time


def report(first: float, count: int) -> None:
    last = time.monotonic()
    print(json.dumps({"first": first, "last": last, "count": count}), flush=True)


def run_sync(enqueue, warmup: int, count: int) -> None:
    for _ in range(warmup):
        enqueue()
    print("ready", flush=True)
    sys.stdin.readline()
    first = time.monotonic()
    for _ in range(count):
        enqueue()
    report(first, count)


async def run_async(open_producer, warmup: int, count: int) -> None:
    enqueue = await open_producer()
    for _ in range(warmup):
        await enqueue()
    print("ready", flush=True)
    sys.stdin.readline()  # blocking on purpose: nothing else runs meanwhile
    first = time.monotonic()
    for _ in range(count):
        await enqueue()
    report(first, count)


def main(argv: list[str]) -> None:
    app, warmup, count = argv[0], int(argv[1]), int(argv[2])
    module = importlib.import_module(f"worker_peers.{app}")
    if hasattr(module, "open_async_producer"):
        asyncio.run(run_async(module.open_async_producer, warmup, count))
    else:
        run_sync(module.open_producer(), warmup, count)


if __name__ == "__main__":
    main(sys.argv[1:])
