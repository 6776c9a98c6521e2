"""disque-trio: a Worker with an async no-op handler, concurrency 50.

Worker: ``python -m disque_trio worker worker_peers.disque_trio_app:worker
--nodes URL --path bench``. Producer: the blocking ``Client.add_job``, one
ADDJOB and its reply per job, as an application would call it.
"""

from collections.abc import Callable

from disque_trio.client import Client, Job
from disque_trio.worker import Worker

from . import BROKER_URL, QUEUE

BODY = b"0123456789"  # what bench_worker.py and bench_single.py send

worker = Worker(BROKER_URL or "disque://127.0.0.1:7711")


@worker.handler(QUEUE, concurrency=50)
async def noop(job: Job) -> None:
    pass


def open_producer() -> Callable[[], object]:
    client = Client(BROKER_URL)
    return lambda: client.add_job(QUEUE, BODY)
