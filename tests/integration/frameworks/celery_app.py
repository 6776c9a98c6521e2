"""The Celery app: ``celery -A celery_app worker --pool threads``.

``task_acks_late``: acknowledged after the task ran. A task that fails for
good is rejected without requeue (``task_acks_on_failure_or_timeout``
False), which the transport turns into a dead letter in ``celery:dead``.
"""

import time

from celery import Celery

from . import REPLICATE, RETRY, SLOW, SLOW_TASKS, URL, record

app = Celery("celery_app")
app.conf.update(
    broker_url=URL,
    broker_transport="disque_trio.integrations.celery:Transport",
    broker_transport_options={
        "visibility_timeout": RETRY,
        "replicate": REPLICATE,
        "client_options": {"timeout": 5.0},
    },
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    task_acks_late=True,
    task_acks_on_failure_or_timeout=False,
    worker_hijack_root_logger=False,
)


@app.task(bind=True, max_retries=2)
def work(self, n: int, fail: bool = False) -> None:
    record("start", n)
    if fail:
        record("fail", n)
        raise self.retry(countdown=1, exc=ValueError(f"task {n} fails"))
    time.sleep(SLOW if n in SLOW_TASKS else 0.002)
    record("done", n)


def send(n: int, fail: bool) -> None:
    work.delay(n, fail)
