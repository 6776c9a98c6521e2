"""disque-trio: the Disque distributed job queue, rebuilt on Trio."""

__version__ = "0.2.0"
