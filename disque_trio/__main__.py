"""``python -m disque_trio`` is the ``disque-trio`` command."""

from .cli import main

raise SystemExit(main())
