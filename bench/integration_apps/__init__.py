"""The no-op task of bench/bench_integrations.py, once for Celery and once
for Dramatiq, on whichever broker the environment names, and a producer.

``BENCH_BROKER`` is ``redis`` or ``disque``; ``BENCH_BROKER_URL`` its URL;
``BENCH_REPLICATE`` the Disque jobs' REPLICATE (unset: the node's default).
The worker command lines import these modules, so the environment is the
one way in they all share. Modules are named ``*_app`` so that none shadows
the framework it imports.
"""

import os

BROKER = os.environ.get("BENCH_BROKER", "disque")
URL = os.environ.get("BENCH_BROKER_URL", "disque://127.0.0.1:7711")
REPLICATE = int(os.environ["BENCH_REPLICATE"]) if os.environ.get("BENCH_REPLICATE") else None
