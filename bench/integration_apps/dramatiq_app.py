"""Dramatiq: a no-op actor, default middleware; RedisBroker or DisqueBroker.

Worker: ``dramatiq integration_apps.dramatiq_app --processes 1 --threads
50``. Producer: ``noop.send()``.
"""

from collections.abc import Callable

import dramatiq

from . import BROKER, REPLICATE, URL

if BROKER == "disque":
    from disque_trio.integrations.dramatiq import DisqueBroker

    broker: dramatiq.Broker = DisqueBroker(url=URL, replicate=REPLICATE)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench")
def noop() -> None:
    pass


def open_producer() -> Callable[[], object]:
    return noop.send
