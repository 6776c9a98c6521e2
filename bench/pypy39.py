#!/usr/bin/env python3
"""Prepare PyPy 3.9 to run disque-trio nodes, for benchmarks only.

    apt-get install pypy3 pypy3-venv        # Debian 12 ships PyPy 7.3 for Python 3.9
    python bench/pypy39.py [--pypy pypy3] [OUT]
    python bench/bench_vs_c.py --disque-c PATH --node-python OUT/python

disque-trio needs Python 3.11; PyPy for 3.11 runs it as it is (hiredis is
left out there: see protocol/resp.py). Where only Debian's PyPy 3.9 is at
hand, this script writes a copy of the package that Python 3.9 can import
and a ``python`` wrapper that runs it (from the copy's directory: give it
absolute paths), so that the node's speed under PyPy
can be measured beside CPython and C Disque. The copy is rewritten
mechanically (the syntax tree, then printed back): the unions written
``A | B`` become ``typing.Union[A, B]`` (or a tuple, in isinstance), names
``typing`` gained after 3.9 come from ``typing_extensions``, ``zip(...,
strict=True)`` loses its check, and ``BaseExceptionGroup`` comes from the
``exceptiongroup`` backport that Trio uses on 3.9. It is not a supported
runtime: the tests run on CPython 3.11 only.

Default OUT: /tmp/disque-trio-pypy39. Prints the wrapper's path.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the nodes import (pyproject.toml's dependencies but hiredis), with the
# two backports 3.9 needs. No upper bounds: pip picks what supports 3.9.
PACKAGES = [
    "trio",
    "trio-websocket",
    "h11",
    "wsproto",
    "attrs",
    "cattrs",
    "msgpack",
    "sortedcontainers",
    "anyio",
    "typing_extensions",
    "exceptiongroup",
]

# typing names added after Python 3.9.
NEWER_TYPING = {
    "Concatenate",
    "LiteralString",
    "Never",
    "NotRequired",
    "ParamSpec",
    "Required",
    "Self",
    "TypeAlias",
    "TypeGuard",
    "TypeVarTuple",
    "Unpack",
    "assert_never",
    "dataclass_transform",
    "override",
    "reveal_type",
}

BUILTIN_TYPES = {
    "None",
    "bool",
    "bytearray",
    "bytes",
    "dict",
    "float",
    "frozenset",
    "int",
    "list",
    "memoryview",
    "object",
    "set",
    "str",
    "tuple",
    "type",
}

SITECUSTOMIZE = """\
# Written by bench/pypy39.py: Python 3.9 has no exception groups built in.
import builtins

import exceptiongroup

builtins.BaseExceptionGroup = exceptiongroup.BaseExceptionGroup
builtins.ExceptionGroup = exceptiongroup.ExceptionGroup
"""


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    return [node]


def _union(node: ast.BinOp) -> ast.expr:
    return ast.Subscript(
        value=ast.Attribute(value=ast.Name("_typing39", ast.Load()), attr="Union", ctx=ast.Load()),
        slice=ast.Tuple(elts=_union_members(node), ctx=ast.Load()),
        ctx=ast.Load(),
    )


class _Annotation(ast.NodeTransformer):
    """Inside an annotation every ``|`` is a union of types."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        return _union(node) if isinstance(node.op, ast.BitOr) else node


class To39(ast.NodeTransformer):
    def __init__(self, classes: set[str]) -> None:
        self.classes = classes | BUILTIN_TYPES

    def _is_type(self, node: ast.expr) -> bool:
        """A ``|`` between these is a union of types, not of int flags."""
        if isinstance(node, ast.Constant):
            return node.value is None
        if isinstance(node, ast.Name):
            return node.id in self.classes
        if isinstance(node, ast.Attribute):
            return node.attr in self.classes
        if isinstance(node, ast.Subscript):
            return True
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.BitOr)
            and (self._is_type(node.left) or self._is_type(node.right))
        )

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = _Annotation().visit(node.annotation)
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        if node.annotation is not None:
            node.annotation = _Annotation().visit(node.annotation)
        return node

    def visit_FunctionDef(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> ast.FunctionDef | ast.AsyncFunctionDef:
        if node.returns is not None:
            node.returns = _Annotation().visit(node.returns)
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> ast.Call:
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        if name in ("isinstance", "issubclass") and len(node.args) == 2:
            second = node.args[1]
            if isinstance(second, ast.BinOp) and isinstance(second.op, ast.BitOr):
                node.args[1] = ast.Tuple(elts=_union_members(second), ctx=ast.Load())
        if name == "zip":
            node.keywords = [k for k in node.keywords if k.arg != "strict"]
        self.generic_visit(node)
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.BitOr) and self._is_type(node):
            return _union(node)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.stmt | list[ast.stmt]:
        if node.module != "typing":
            return node
        newer = [a for a in node.names if a.name in NEWER_TYPING]
        if not newer:
            return node
        older = [a for a in node.names if a.name not in NEWER_TYPING]
        out: list[ast.stmt] = [ast.ImportFrom("typing_extensions", newer, 0)]
        if older:
            out.append(ast.ImportFrom("typing", older, 0))
        return out


def rewrite(source: str, classes: set[str], name: str) -> str:
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Match | ast.TryStar):
            raise SystemExit(f"pypy39: {name}:{node.lineno}: no Python 3.9 form for this")
    tree = To39(classes).visit(tree)
    # After the docstring and the __future__ import, which must come first.
    at = 0
    for stmt in tree.body:
        docstring = at == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring or future):
            break
        at += 1
    tree.body.insert(at, ast.Import([ast.alias("typing", "_typing39")]))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def write_tree(out: Path) -> None:
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "disque_trio", src / "disque_trio")
    files = sorted((src / "disque_trio").rglob("*.py"))
    sources = {f: f.read_text() for f in files}
    classes = {
        n.name
        for f, text in sources.items()
        for n in ast.walk(ast.parse(text, str(f)))
        if isinstance(n, ast.ClassDef)
    }
    for f, text in sources.items():
        f.write_text(rewrite(text, classes, str(f.relative_to(src))))
    (src / "sitecustomize.py").write_text(SITECUSTOMIZE)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", default="/tmp/disque-trio-pypy39", type=Path)
    p.add_argument("--pypy", default="pypy3", help="the PyPy 3.9 interpreter (default: pypy3)")
    args = p.parse_args()
    out: Path = args.out.resolve()
    pypy = shutil.which(args.pypy)
    if pypy is None:
        print(f"pypy39: {args.pypy} not found (apt-get install pypy3 pypy3-venv)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    write_tree(out)
    venv = out / "venv"
    try:
        if not (venv / "bin" / "python").exists():
            subprocess.run([pypy, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + PACKAGES, check=True)
    except subprocess.CalledProcessError as e:
        print(f"pypy39: {' '.join(map(str, e.cmd))} failed (exit {e.returncode})", file=sys.stderr)
        return 1
    wrapper = out / "python"
    # From the copy's directory: ``-m`` and ``-c`` put the working directory
    # first on sys.path, where a checkout's 3.11 package would win (so the
    # paths given to it must be absolute, as bench_vs_c's are); and with it
    # on PYTHONPATH, for scripts (bench/trio_floor.py).
    src = out / "src"
    python = venv / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\ncd "{src}" && PYTHONPATH="{src}" exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    check = subprocess.run(
        [str(wrapper), "-c", "import disque_trio.server.node"], capture_output=True, text=True
    )
    if check.returncode != 0:
        print(f"pypy39: the copy does not import:\n{check.stderr}", file=sys.stderr)
        return 1
    print(wrapper)
    return 0


if __name__ == "__main__":
    sys.exit(main())
