"""bench/pypy39.py: the Python 3.9 rewrite of the package keeps its meaning."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pypy39", ROOT / "bench" / "pypy39.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unions_typing_names_and_zip_are_rewritten() -> None:
    source = '''"""Doc."""
from __future__ import annotations

from typing import Any, TypeAlias

FLAG_A = 1
FLAG_B = 2
FLAGS = FLAG_A | FLAG_B


class Ping:
    sender: str | None = None


class Pong:
    pass


Alias: TypeAlias = tuple[bytes, Ping | str]


def kind(msg: Ping | Pong, flags: int = FLAG_A | FLAG_B) -> str | None:
    pairs = list(zip([1], [2], strict=True))
    return "ping" if isinstance(msg, Ping | Pong) and pairs else None
'''
    out = _tool().rewrite(source, {"Ping", "Pong"}, "example.py")
    tree = ast.parse(out)
    # The docstring and the __future__ import stay first.
    assert isinstance(tree.body[0], ast.Expr)
    assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
    assert "import typing as _typing39" in out
    assert "from typing_extensions import TypeAlias" in out
    assert "from typing import Any" in out
    # Int flags stay bitwise; unions of types become typing.Union or tuples.
    assert "FLAGS = FLAG_A | FLAG_B" in out
    assert "flags: int=FLAG_A | FLAG_B" in out
    assert "sender: _typing39.Union[str, None]" in out
    assert "tuple[bytes, _typing39.Union[Ping, str]]" in out
    assert "msg: _typing39.Union[Ping, Pong]" in out
    assert "isinstance(msg, (Ping, Pong))" in out
    assert "strict" not in out
    namespace: dict[str, object] = {}
    exec(compile(out, "example.py", "exec"), namespace)
    kind = namespace["kind"]
    assert callable(kind)
    assert kind(namespace["Ping"]()) == "ping"
    assert namespace["FLAGS"] == 3


def test_forms_without_a_39_spelling_are_refused() -> None:
    tool = _tool()
    with pytest.raises(SystemExit, match=r"example.py:2: no Python 3.9 form"):
        tool.rewrite("x = 1\nmatch x:\n    case 1:\n        pass\n", set(), "example.py")


def test_the_rewritten_package_runs_a_node_core(tmp_path: Path) -> None:
    """The whole package, rewritten, still imports and works (here, on this
    interpreter): a node takes a job and hands it out."""
    tool = _tool()
    tool.write_tree(tmp_path)
    script = f"""
import random
import disque_trio, disque_trio.server.node
assert disque_trio.__file__.startswith({str(tmp_path)!r})
from disque_trio.core.node import Node
from disque_trio.core.jobcmds import addjob
from disque_trio.core.queuecmds import getjob

class Clock:
    def wall_ms(self): return 1_700_000_000_000
    def mono_ms(self): return 1_700_000_000_000

node = Node("dcb833cf" + "a1" * 16, Clock(), random.Random(1))
job_id = addjob(node, [b"ADDJOB", b"q", b"body", b"0"])
[[queue, got, body]] = getjob(node, [b"GETJOB", b"NOHANG", b"FROM", b"q"])
assert (queue, got, body) == ("q", job_id, b"body"), (queue, got, body)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path / "src",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
