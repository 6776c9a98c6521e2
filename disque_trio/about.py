"""What this install is: its release, the commit it was built from, and the
operator's files it carries (``disque-trio sample-config`` and friends).

The release has one source, ``disque_trio.__version__``; the build reads it
from there (``pyproject.toml``'s dynamic version) and so do ``--version``,
INFO and the dashboard. The commit is written into the wheel by the build
(``setup.py`` writes ``disque_trio/_commit.py`` when it builds from a clone,
and the sdist carries that file on); an editable install reads it from the
clone's ``.git`` instead, so it follows the checkout.
"""

from __future__ import annotations

import functools
import importlib
from importlib import resources
from pathlib import Path
from typing import Final

from . import __version__
from ._gitref import read_git_head

RELEASE: Final = __version__

UNKNOWN_COMMIT: Final = "0" * 40

# The operator's files: `disque-trio sample-NAME` prints them. They live in
# the clone's docs/ (where the manual links to them); the build copies them
# into the wheel's disque_trio/operator/.
OPERATOR_FILES: Final = {
    "config": "disque.conf",
    "unit": "disque-trio.service",
    "alerts": "prometheus-alerts.yml",
}

_PACKAGE = Path(__file__).resolve().parent


@functools.cache
def commit() -> str:
    """The full commit (40 hex digits) this install was built from, or
    forty zeros when nothing says (a build from an sdist made outside a
    clone, or a copy of the files)."""
    try:
        written = importlib.import_module("disque_trio._commit")  # by the build
    except ImportError:
        pass
    else:
        sha = getattr(written, "COMMIT", None)
        if isinstance(sha, str):
            return sha
    return read_git_head(_PACKAGE.parent / ".git") or UNKNOWN_COMMIT


def operator_file(kind: str) -> str:
    """The text of an operator's file by kind (a key of OPERATOR_FILES):
    from the wheel's copy, or from the clone's docs/ in an editable
    install. FileNotFoundError when neither is there."""
    name = OPERATOR_FILES[kind]
    packaged = resources.files("disque_trio") / "operator" / name
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (_PACKAGE.parent / "docs" / name).read_text(encoding="utf-8")
