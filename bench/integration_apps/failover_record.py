"""What bench/bench_failover.py's tasks record: each run of a task appends
``start|end INDEX TASK_ID CLOCK_MONOTONIC PID`` to the file named by
``BENCH_FAILOVER_LOG`` (one ``write`` of a short line to a file opened with
``O_APPEND``: whole lines, whichever process or thread writes)."""

import os
import time

TASK_S = 0.1  # how long each task sleeps


def record(kind: str, index: int, task_id: str) -> None:
    line = f"{kind} {index} {task_id} {time.monotonic():.6f} {os.getpid()}\n"
    fd = os.open(os.environ["BENCH_FAILOVER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
