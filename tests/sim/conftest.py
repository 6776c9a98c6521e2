"""The simulator's CI figures (sweep, mutants, speed) reach the pytest log
through the terminal summary: a test's own output is captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SUMMARY: list[str] = []


def sim_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m sim ARGS`` from the checkout, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("simulator")
        for line in SUMMARY:
            terminalreporter.write_line(line)
