"""A worker: handlers for queues, run with the policies a job queue needs.

    from disque_trio.worker import Worker

    worker = Worker(["disque://127.0.0.1:7711"])

    @worker.handler("emails", concurrency=20, timeout=30)
    async def send(job):
        await deliver(job.body)

and run it with ``disque-trio worker myapp.tasks:worker`` (or
``await worker.run()`` in your own AnyIO program).

Each handler has a lane: a fetcher asking for as many jobs as there is
room for (GETJOB COUNT n) and a fixed set of runner tasks taking them one
at a time (worker.py). What happens around a handler is a chain of small
middleware pieces, outermost first, in the style of Dramatiq's middleware
(each gets the job's context and the next piece to call), one module
each:

``JobLog``     (logs.py) one structured log line per job (outcome,
               duration, error; done at DEBUG, failures at WARNING);
               ``JsonLogFormatter`` for JSON lines
``Metrics``    (metrics.py) Prometheus counters and a duration histogram
               (optional), and the HTTP page that serves them
``Retries``    (retries.py) ACKJOB (or FASTACK) on success, batched
               (``AckBatcher``, acks.py); NACK with an exponential back-off
               (DELAY) on failure; after
               ``max_retries`` failures (or ``max_deliveries`` deliveries
               of any kind), the job goes to ``<queue>:dead``
               (``DeadLetter``, deadletter.py) with the error, then is
               acknowledged
``KeepAlive``  (keepalive.py) WORKING every ``fraction`` of the job's RETRY
               for jobs that run that long, from one task for the worker
``TimeLimit``  (timelimit.py) a handler running past its ``timeout`` is
               cancelled: a failure

The ``Worker`` and its lanes are in worker.py, ``JobContext``,
``HandlerSpec`` and the ``Middleware`` protocol in context.py, the
``disque-trio worker`` command in cli.py.

Shutdown (SIGTERM, SIGINT, or ``stop()``): no more fetching, running
handlers get ``shutdown_timeout`` seconds, what is still running is then
cancelled and given back (ENQUEUE: not a failure); a second signal
cancels at once. See docs/worker.md.
"""

from .acks import AckBatcher
from .cli import main
from .context import Handler, HandlerSpec, HandlerTimeout, JobContext, Middleware, Next
from .deadletter import DeadLetter
from .keepalive import KeepAlive
from .logs import JobLog, JsonLogFormatter
from .metrics import Metrics
from .retries import Retries
from .timelimit import TimeLimit
from .worker import Worker

__all__ = [
    "AckBatcher",
    "DeadLetter",
    "Handler",
    "HandlerSpec",
    "HandlerTimeout",
    "JobContext",
    "JobLog",
    "JsonLogFormatter",
    "KeepAlive",
    "Metrics",
    "Middleware",
    "Next",
    "Retries",
    "TimeLimit",
    "Worker",
    "main",
]
