"""Cheap mutants are caught by the simulator's checks."""

from __future__ import annotations

import pytest

from sim.mutants import run_mutant


@pytest.mark.parametrize(
    ("name", "seeds"),
    [("setack-forgets-one-holder", (1, 2, 3)), ("aof-write-dropped", (1, 2, 3, 4))],
)
def test_cheap_mutants_are_caught(name: str, seeds: tuple[int, ...]) -> None:
    seed, violations = run_mutant(name, seeds)
    assert seed is not None and violations
