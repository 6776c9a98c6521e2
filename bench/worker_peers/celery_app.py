"""Celery: a no-op task, Redis broker, no result backend.

Worker: ``celery -A worker_peers.celery_app worker --pool threads
--concurrency 50 --without-gossip --without-mingle --without-heartbeat``.
Producer: ``noop.delay()``.

``task_acks_late``: the message is acknowledged after the task ran, as
Dramatiq, arq and disque-trio do, so that "nothing left unacknowledged in
Redis" means "every task ran" (the default acknowledges just before the
task runs; the Redis commands are the same either way).
"""

from collections.abc import Callable

from celery import Celery

from . import BROKER_URL, QUEUE

app = Celery("bench", broker=BROKER_URL or "redis://127.0.0.1:6379/0")
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
)


@app.task
def noop() -> None:
    pass


def open_producer() -> Callable[[], object]:
    return noop.delay
