"""The Celery app of tests/integration/test_celery_tools.py: remote control,
events and Flower on the transport. ``slow`` holds a worker thread for a
while (``inspect active`` sees it); ``add`` records its runs (a revoked
one must not run)."""

import time

from celery import Celery

from . import REPLICATE, URL, record

app = Celery("celery_tools_app")
app.conf.update(
    broker_url=URL,
    broker_transport="disque_trio.integrations.celery:Transport",
    broker_transport_options={"replicate": REPLICATE, "client_options": {"timeout": 5.0}},
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    worker_send_task_events=True,
)


@app.task
def slow(seconds: float) -> None:
    time.sleep(seconds)


@app.task
def add(n: int) -> None:
    record("done", n)
