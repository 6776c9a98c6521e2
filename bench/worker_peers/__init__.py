"""The no-op task of bench/bench_workers.py, written once per framework the
way that framework's documentation writes it, plus one producer runner.

Each ``*_app`` module reads its broker's URL from ``BENCH_BROKER_URL`` (the
worker command lines import these modules, so an environment variable is
the one way in that all of them share) and defines the task on the queue
``QUEUE``. ``produce`` runs a framework's own enqueue call in a loop.

Modules are named ``*_app`` so that none shadows the framework it imports.
"""

import os

QUEUE = "bench"
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "")
