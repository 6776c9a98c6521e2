"""The release as an operator gets it: scripts/check_release.py builds the
sdist and the wheel, checks them with twine, installs the wheel (not the
source tree) into a new virtual environment and runs a node, the client,
the worker, --version, the sample files and check-aof from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_built_wheel_installs_and_runs_outside_the_clone(tmp_path: Path) -> None:
    if subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True
    ).returncode:
        pytest.skip("not a git clone (an unpacked sdist): the release is built from a clone")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "check_release.py"),
            "--out",
            str(tmp_path / "rel"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    out = done.stdout
    for seen in (
        "PASSED",
        "sample-config: disque.conf",
        "worker: handled 5 jobs",
        "QLEN work 0",
        "AOF is valid",
        "release ",
    ):
        assert seen in out, out
