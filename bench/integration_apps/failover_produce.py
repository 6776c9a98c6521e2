"""``python -m integration_apps.failover_produce celery|dramatiq N``: adds
tasks 0..N-1 of bench/bench_failover.py's app with the framework's own
call (``work.delay(i)`` / ``work.send(i)``), one after the other, then
prints ``sent N``."""

import importlib
import sys


def main(framework: str, count: int) -> None:
    app = importlib.import_module(f"integration_apps.failover_{framework}_app")
    enqueue = app.work.delay if framework == "celery" else app.work.send
    for i in range(count):
        enqueue(i)
    print(f"sent {count}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
