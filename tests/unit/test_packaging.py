"""The dependency policy: every dependency has a tested upper bound, and
constraints.txt (what the README's commands and CI install with) pins each
one to a version inside its range."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        names += extra
    return [Requirement(name) for name in names]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_has_an_upper_bound() -> None:
    unbounded = [
        str(req)
        for req in _requirements()
        if not any(spec.operator in ("<", "<=", "~=", "==") for spec in req.specifier)
    ]
    assert unbounded == []


def test_constraints_pin_every_dependency_inside_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pinned), f"{req.name}=={pinned} is outside {req}"
