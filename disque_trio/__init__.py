"""disque-trio: the Disque distributed job queue, rebuilt on Trio."""

__version__ = "0.1.0"
