"""The sample systemd unit (docs/disque-trio.service) is one systemd
accepts: ``systemd-analyze verify`` on it, its ExecStart pointed at this
venv's console script (verify wants the program to exist)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_sample_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    program = Path(sys.executable).with_name("disque-trio")
    if not program.exists():
        pytest.skip(f"no console script at {program} (not installed with pip?)")
    text = (ROOT / "docs" / "disque-trio.service").read_text()
    assert "ExecStart=/opt/disque-trio/venv/bin/disque-trio " in text
    unit = tmp_path / "disque-trio.service"
    unit.write_text(text.replace("/opt/disque-trio/venv/bin/disque-trio", str(program)))
    checked = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
