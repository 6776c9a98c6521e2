"""The simulator's CI figures (sweep, mutants, speed) reach the pytest log
through the terminal summary: a test's own output is captured."""

from __future__ import annotations

import pytest

SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("simulator")
        for line in SUMMARY:
            terminalreporter.write_line(line)
