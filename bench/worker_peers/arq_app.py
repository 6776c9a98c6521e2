"""arq: a no-op coroutine, max_jobs 50, poll_delay 0.05 s, no result kept.

Runs in its own virtual environment (arq 0.28 requires redis<6, the
project pins redis 8; see bench/requirements-arq.txt). Worker: ``arq
worker_peers.arq_app.WorkerSettings``. Producer: ``await
pool.enqueue_job("noop")``.
"""

from collections.abc import Awaitable, Callable

from arq import create_pool
from arq.connections import RedisSettings

from . import BROKER_URL

REDIS = RedisSettings.from_dsn(BROKER_URL or "redis://127.0.0.1:6379/0")


async def noop(ctx: dict[str, object]) -> None:
    pass


class WorkerSettings:
    functions = [noop]
    redis_settings = REDIS
    max_jobs = 50
    poll_delay = 0.05
    keep_result = 0


async def open_async_producer() -> Callable[[], Awaitable[object]]:
    pool = await create_pool(REDIS)
    return lambda: pool.enqueue_job("noop")
