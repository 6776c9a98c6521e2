"""disque-trio with the client's batch call: the same worker as
``disque_trio_app`` (its command line names that module), and a producer
that adds jobs with ``Client.add_jobs`` in runs of ``BATCH`` (one write and
one read per run, pipelined ADDJOBs), the fastest way the client offers to
enqueue. The peers' producers have no such call: their rows use one call
per job, like ``disque_trio_app``'s."""

from collections.abc import Callable

from disque_trio.client import Client

from . import BROKER_URL, QUEUE
from .disque_trio_app import BODY

BATCH = 100


def open_batch_producer() -> Callable[[int], object]:
    client = Client(BROKER_URL)
    return lambda n: client.add_jobs(QUEUE, [BODY] * n)
