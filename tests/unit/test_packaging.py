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


def test_the_build_backend_has_a_tested_upper_bound_and_reads_pep_639() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (backend,) = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    assert backend.name == "setuptools"
    # PEP 639's license expression needs setuptools 77; an upper bound keeps
    # a new major release of the backend from changing what gets built.
    assert backend.specifier.contains("77.0.3") and not backend.specifier.contains("76.1.0")
    assert any(spec.operator == "<" for spec in backend.specifier)
    project = pyproject["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]


def test_the_release_has_one_source() -> None:
    """pyproject.toml reads the version from disque_trio/__init__.py, and
    CHANGELOG.md has an entry for it."""
    import disque_trio
    from disque_trio.server.version import PACKAGE_VERSION

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "disque_trio.__version__"}
    assert disque_trio.__version__ == PACKAGE_VERSION
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{disque_trio.__version__}] - " in changelog
