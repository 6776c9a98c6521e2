"""bench/bench_failover.py's Celery app: the quick start of
docs/integrations.md (``task_acks_late``, ``task_ignore_result``, every
other setting Celery's or the transport's default: ``visibility_timeout``
3600, the default queue ``celery``), with a task that sleeps 0.1 s and
records its start and end.

``BENCH_BROKER_URL``: the broker URL (every node); ``BENCH_FAILOVER_LOG``:
the file the task's runs are recorded in (failover_record.py).

Producer: ``python -m integration_apps.failover_produce celery N``.
"""

import os
import time

from celery import Celery

from .failover_record import TASK_S, record

app = Celery("failover")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER_URL", "disque://127.0.0.1:7711"),
    broker_transport="disque_trio.integrations.celery:Transport",
    task_acks_late=True,
    task_ignore_result=True,
)


@app.task(bind=True, name="failover.work")
def work(self, index: int) -> None:  # type: ignore[no-untyped-def]
    record("start", index, self.request.id or "-")
    time.sleep(TASK_S)
    record("end", index, self.request.id or "-")
