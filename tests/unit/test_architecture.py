"""The design rules that keep the core pure and runs reproducible (docs/design.md):
imports flow one way, and the banned calls are enforced by ruff, not review."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "disque_trio"


def test_import_contracts_hold() -> None:
    """The layers and the forbidden imports of pyproject's [tool.importlinter]
    (cli > server > core > protocol; a pure core; codecs that import nothing
    of the node; the client on the protocol alone, its core sans-IO; the
    worker through the client; the simulator outside the package)."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def _circles(packages: list[str]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one
    module) among the modules of ``packages``, TYPE_CHECKING imports included."""
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None)
    modules = sorted(graph.modules)
    edges = {
        m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_circles() -> None:
    assert _circles(["disque_trio", "sim"]) == []


def test_the_circle_finder_finds_circles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard the guard: a circle through a TYPE_CHECKING import is found."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "c.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _circles(["circled"]) == [["circled.a", "circled.b"]]


def test_importing_the_client_never_imports_the_node() -> None:
    code = (
        "import sys\n"
        "import disque_trio.client, disque_trio.worker\n"
        "bad = sorted(n for n in sys.modules if n.startswith(('disque_trio.core',\n"
        "             'disque_trio.server', 'disque_trio.env', 'disque_trio.config')))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_importing_core_and_protocol_never_imports_trio() -> None:
    code = (
        "import sys, pkgutil, importlib\n"
        "import disque_trio.core, disque_trio.protocol\n"
        "for pkg in (disque_trio.core, disque_trio.protocol):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "import disque_trio.core.node, disque_trio.core.commands\n"
        "bad = sorted(n for n in sys.modules if n == 'trio' or n.startswith('trio.')\n"
        "             or n.startswith(('disque_trio.server', 'disque_trio.env')))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------- lint


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_banned_calls_in_the_package() -> None:
    """The determinism rule alone (time.time, os.urandom, threads, ...)."""
    result = _ruff("--select", "TID251", "disque_trio")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check_passes() -> None:
    result = _ruff("disque_trio")
    assert result.returncode == 0, result.stdout + result.stderr


PLANTED = [
    ("import time\n\n\ndef now() -> float:\n    return time.time()\n", "time.time"),
    ("import os\n\n\ndef salt() -> bytes:\n    return os.urandom(8)\n", "os.urandom"),
    ("import random\n\n\ndef pick() -> float:\n    return random.random()\n", "random.random"),
    ("from uuid import uuid4\n\nID = uuid4()\n", "uuid.uuid4"),
    ("import threading\n\nLOCK = threading.Lock()\n", "threading"),
    ("import trio\n\n\nasync def f() -> None:\n    await trio.to_thread.run_sync(print)\n", ""),
]


@pytest.mark.parametrize(
    ("source", "name"), PLANTED, ids=[n or "trio.to_thread" for _, n in PLANTED]
)
def test_banned_api_lint_is_on(tmp_path: Path, source: str, name: str) -> None:
    """Plant a banned call in a copy of the package: ruff must flag it."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        PACKAGE, tmp_path / "disque_trio", ignore=shutil.ignore_patterns("__pycache__")
    )
    planted = tmp_path / "disque_trio" / "core" / "_planted.py"
    planted.write_text(source)
    result = _ruff("--select", "TID251", "disque_trio", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    hits = [line for line in result.stdout.splitlines() if "_planted.py" in line]
    assert hits and all("TID251" in line for line in hits), result.stdout
    assert name in "".join(hits)
    # Tests may use the banned calls (per-file ignore): the rule is scoped.
    (tmp_path / "tests").mkdir()
    shutil.copy(planted, tmp_path / "tests" / "test_planted.py")
    assert _ruff("--select", "TID251", "tests", cwd=tmp_path).returncode == 0


def test_the_bench_scripts_import_no_circle() -> None:
    """bench/ is a directory of scripts, not a package (grimp cannot read
    it): the imports between them, nested ones included, are read with ast.
    bench_single and bench_vs_c imported each other."""
    import ast

    bench = Path(__file__).resolve().parents[2] / "bench"
    scripts = {p.stem: p for p in bench.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in scripts.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.add(node.module.split(".")[0])
        edges[name] = targets & scripts.keys()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges[start]:
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert edges["bench_vs_c"] >= {"bench_single"}  # the graph is read at all
    assert sorted(name for name in edges if reaches(name, name, {name})) == []
