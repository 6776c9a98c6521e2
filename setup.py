"""The build's two additions to pyproject.toml's metadata, for a wheel that
says what it is and carries what an operator needs:

- disque_trio/_commit.py, the commit the build ran from (read from the
  clone's .git, no git binary needed), which INFO's disque_git_sha1 and
  --version show; an sdist carries it on to the wheels built from it;
- disque_trio/operator/, copies of docs/disque.conf, docs/disque-trio.service
  and docs/prometheus-alerts.yml, which `disque-trio sample-config`,
  `sample-unit` and `sample-alerts` print.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def _git_commit() -> str | None:
    """The clone's commit, by disque_trio/_gitref.py loaded on its own (the
    package itself cannot be imported before its dependencies exist)."""
    spec = importlib.util.spec_from_file_location("_gitref", ROOT / "disque_trio" / "_gitref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sha: str | None = module.read_git_head(ROOT / ".git")
    return sha


def _write_commit(package_dir: Path) -> None:
    sha = _git_commit()
    if sha is not None:
        (package_dir / "_commit.py").write_text(
            f'"""Written by the build (setup.py): the commit it ran from."""\n\nCOMMIT = "{sha}"\n'
        )


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads .git and docs/ itself
        package_dir = Path(self.build_lib) / "disque_trio"
        _write_commit(package_dir)
        operator = package_dir / "operator"
        operator.mkdir(exist_ok=True)
        for name in ("disque.conf", "disque-trio.service", "prometheus-alerts.yml"):
            shutil.copyfile(ROOT / "docs" / name, operator / name)


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _write_commit(Path(base_dir) / "disque_trio")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
