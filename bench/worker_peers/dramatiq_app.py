"""Dramatiq: a no-op actor on a RedisBroker, default middleware.

Worker: ``dramatiq --processes 1 --threads 50|8 worker_peers.dramatiq_app``.
Producer: ``noop.send()``, the actor's own enqueue call.
"""

from collections.abc import Callable

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import BROKER_URL, QUEUE

broker = RedisBroker(url=BROKER_URL or "redis://127.0.0.1:6379/0")
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    pass


def open_producer() -> Callable[[], object]:
    return noop.send
