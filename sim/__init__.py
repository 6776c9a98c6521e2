"""Deterministic simulator: whole nodes (shell included) in one trio.run."""
