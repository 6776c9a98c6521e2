"""Celery: a no-op task, no result backend, ``task_acks_late`` (acknowledged
after it ran, so that "nothing left in the broker" means "every task ran").

Redis: ``broker_url = "redis://..."``. disque-trio: the same app with
``broker_url = "disque://..."`` and ``broker_transport`` naming the
transport class. Worker: ``celery -A integration_apps.celery_app worker
--pool threads --concurrency 50``. Producer: ``noop.delay()``.
"""

from collections.abc import Callable

from celery import Celery

from . import BROKER, REPLICATE, URL

app = Celery("bench")
app.conf.update(
    broker_url=URL,
    task_default_queue="bench",
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
)
if BROKER == "disque":
    app.conf.update(
        broker_transport="disque_trio.integrations.celery:Transport",
        broker_transport_options={"replicate": REPLICATE},
    )


@app.task
def noop() -> None:
    pass


def open_producer() -> Callable[[], object]:
    return noop.delay
