"""Version strings (INFO, HELLO, --version)."""

from __future__ import annotations

from typing import Final

VERSION: Final = "1.0-rc1"  # the Disque version whose wire behaviour we follow
PACKAGE_VERSION: Final = "0.1.0"
