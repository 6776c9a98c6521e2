"""Version strings (INFO, HELLO, --version)."""

from __future__ import annotations

from typing import Final

from ..about import RELEASE, commit

__all__ = ["PACKAGE_VERSION", "VERSION", "commit", "git_sha1"]

VERSION: Final = "1.0-rc1"  # the Disque version whose wire behaviour we follow
PACKAGE_VERSION: Final = RELEASE  # this release (disque_trio/__init__.py)


def git_sha1() -> str:
    """INFO's disque_git_sha1: the build's commit in eight hex digits, as
    Redis and the original Disque print theirs (zeros when unknown)."""
    return commit()[:8]
