"""The apps the integration tests run in real Celery and Dramatiq worker
processes (tests/integration/test_integrations_*.py), and their producer.

Configured through the environment, since the frameworks' command lines
import these modules: ``DISQUE_URL``, ``RECORD`` (a file each task run
appends a line to), ``RETRY`` (the jobs' RETRY / visibility timeout),
``REPLICATE`` (optional).

Every run of ``work(n, fail)`` appends ``start n``, then ``done n`` (or
``fail n`` and raises): one ``os.write`` of a short line to a file opened
with O_APPEND, which concurrent threads and processes do not interleave.
``fail=True`` tasks raise every time; they are retried twice (one second
apart), then reach the dead letter. Tasks in ``SLOW_TASKS`` take ``SLOW``
seconds (so that a worker killed at any moment has some running), the
others 2 ms.
"""

import os

URL = os.environ.get("DISQUE_URL", "disque://127.0.0.1:7711")
RETRY = int(os.environ.get("RETRY", "5"))
REPLICATE = int(os.environ["REPLICATE"]) if os.environ.get("REPLICATE") else None
SLOW = 0.5
SLOW_TASKS = frozenset(n for n in range(100_000) if n % 50 == 13)
_record_fd: int | None = None


def record(event: str, n: int) -> None:
    global _record_fd
    if _record_fd is None:
        _record_fd = os.open(os.environ["RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_record_fd, f"{event} {n} {os.getpid()}\n".encode())
