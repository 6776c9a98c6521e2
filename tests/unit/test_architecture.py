"""The design rules that keep the core pure and runs reproducible (docs/design.md):
imports flow one way, and the banned calls are enforced by ruff, not review."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "disque_trio"


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute names of the modules a file imports (relative ones resolved)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            # `from . import server` imports a module too.
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _offending(directory: Path, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted(directory.rglob("*.py")):
        for name in sorted(_imports(path, root)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(root)} imports {name}")
    return bad


def test_import_scanner_sees_relative_imports(tmp_path: Path) -> None:
    """Guard the guard: the forbidden imports are caught however spelled."""
    names = _imports(PACKAGE / "core" / "node.py")
    assert "disque_trio.protocol.replies" in names and "disque_trio.core.awake" in names
    core = tmp_path / "disque_trio" / "core"
    core.mkdir(parents=True)
    (core / "bad.py").write_text(
        "from ..server import node\nfrom .. import env\nimport trio.lowlevel\n"
    )
    found = _offending(core, ("disque_trio.server", "disque_trio.env", "trio"), tmp_path)
    assert {line.split(" imports ")[1] for line in found} == {
        "disque_trio.server",
        "disque_trio.server.node",
        "disque_trio.env",
        "trio.lowlevel",
    }


def test_core_imports_neither_server_env_nor_trio() -> None:
    forbidden = ("disque_trio.server", "disque_trio.env", "disque_trio.cli", "trio", "sim")
    assert _offending(PACKAGE / "core", forbidden) == []


def test_protocol_imports_nothing_of_the_node() -> None:
    forbidden = ("disque_trio.core", "disque_trio.server", "disque_trio.env", "trio", "sim")
    assert _offending(PACKAGE / "protocol", forbidden) == []


def test_client_uses_only_the_protocol_layer() -> None:
    """client -> protocol: never the node (core, server, env, config, cli),
    nor the worker built on top of it."""
    forbidden = (
        "disque_trio.core",
        "disque_trio.server",
        "disque_trio.env",
        "disque_trio.config",
        "disque_trio.cli",
        "disque_trio.worker",
        "disque_trio.testing",
        "trio",
        "sim",
    )
    assert _offending(PACKAGE / "client", forbidden) == []


# The client's sans-I/O modules: no sockets, no clocks, no event loop.
SANS_IO = ("commands.py", "protocol.py", "cluster.py", "scan.py", "types.py", "errors.py")


def test_client_core_is_sans_io() -> None:
    forbidden = ("socket", "ssl", "time", "asyncio", "anyio", "trio", "selectors", "threading")
    bad = []
    for name in SANS_IO:
        path = PACKAGE / "client" / name
        for imported in sorted(_imports(path)):
            if any(imported == f or imported.startswith(f + ".") for f in forbidden):
                bad.append(f"client/{name} imports {imported}")
    assert bad == []


def test_worker_reaches_nodes_only_through_the_client() -> None:
    forbidden = ("disque_trio.core", "disque_trio.server", "disque_trio.env", "trio", "sim")
    assert [
        line for line in _offending(PACKAGE, forbidden) if line.startswith("disque_trio/worker.py")
    ] == []


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


def test_nothing_in_the_package_imports_sim() -> None:
    assert _offending(PACKAGE, ("sim",)) == []


def test_no_simulator_module_imports_its_command_line() -> None:
    """sim/__main__.py only parses arguments: what it runs lives in modules
    that import each other one way (sim/runs.py, sim/sweep.py)."""
    assert _offending(ROOT / "sim", ("sim.__main__",)) == []


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
