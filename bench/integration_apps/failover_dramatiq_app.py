"""bench/bench_failover.py's Dramatiq app: ``DisqueBroker`` with its
defaults (RETRY 60 s, the node's default REPLICATE), default middleware,
an actor that sleeps 0.1 s and records its start and end as
failover_record.py says (``BENCH_BROKER_URL``, ``BENCH_FAILOVER_LOG``;
the task ID column is the message ID).

Producer: ``python -m integration_apps.failover_produce dramatiq N``.
"""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage

from disque_trio.integrations.dramatiq import DisqueBroker

from .failover_record import TASK_S, record

broker = DisqueBroker(url=os.environ.get("BENCH_BROKER_URL", "disque://127.0.0.1:7711"))
broker.add_middleware(CurrentMessage())  # only to read the message ID
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="failover")
def work(index: int) -> None:
    message = CurrentMessage.get_current_message()
    message_id = message.message_id if message is not None else "-"
    record("start", index, message_id)
    time.sleep(TASK_S)
    record("end", index, message_id)
