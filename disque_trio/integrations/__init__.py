"""Other job frameworks on a Disque cluster: keep your Celery tasks and your
Dramatiq actors, let disque-trio hold their messages (docs/integrations.md).

``disque_trio.integrations.celery``
    A kombu transport: ``broker_url = "disque://h1:7711,h2:7711"`` with
    ``broker_transport = "disque_trio.integrations.celery:Transport"`` (no
    import needed), or the ``disque`` scheme alone after ``import
    disque_trio.integrations.celery``, which registers it with kombu.

``disque_trio.integrations.dramatiq``
    ``DisqueBroker(url="disque://...")``, a Dramatiq broker.

Both sit on the blocking ``disque_trio.client.Client`` (its routing of
acknowledgements to the node that created a job, its fail-over) and never
import the node's code. Importing this package imports neither Celery nor
Dramatiq; each module needs its framework (the extras ``[celery]`` and
``[dramatiq]``).
"""
