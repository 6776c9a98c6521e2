"""The Dramatiq app: ``dramatiq dramatiq_app --processes 1 --threads 8``.

Failing messages are retried twice by the Retries middleware (NACK DELAY
of their job, 1 s), then nacked: a dead letter in ``default:dead``.
"""

import time

import dramatiq

from disque_trio.integrations.dramatiq import DisqueBroker

from . import REPLICATE, RETRY, SLOW, SLOW_TASKS, URL, record

broker = DisqueBroker(url=URL, retry=RETRY, replicate=REPLICATE, client_options={"timeout": 5.0})
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=2, min_backoff=500, max_backoff=1000)
def work(n: int, fail: bool = False) -> None:
    record("start", n)
    if fail:
        record("fail", n)
        raise ValueError(f"task {n} fails")
    time.sleep(SLOW if n in SLOW_TASKS else 0.002)
    record("done", n)


def send(n: int, fail: bool) -> None:
    work.send(n, fail)
