"""``python -m integration_apps.produce APP WARMUP COUNT``: enqueues WARMUP
jobs, prints ``ready``, waits for a line on stdin, enqueues COUNT jobs with
the framework's own call one after the other, and prints one JSON line: the
CLOCK_MONOTONIC times of the first and the last enqueue."""

import importlib
import json
import sys
import time


def main(app: str, warmup: int, count: int) -> None:
    enqueue = importlib.import_module(f"integration_apps.{app}").open_producer()
    for _ in range(warmup):
        enqueue()
    print("ready", flush=True)
    sys.stdin.readline()
    first = time.monotonic()
    for _ in range(count):
        enqueue()
    print(json.dumps({"first": first, "last": time.monotonic(), "count": count}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
