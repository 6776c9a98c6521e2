"""The documentation: the site builds with --strict (a broken link, a
missing page, a page left out of the navigation fail), its generated
tables match the run logs they are made from, and the README stays a front
door whose commands are the ones CI runs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

NODE_COMMAND = "python3 -m pip install -c constraints.txt -e . && disque-trio"
TEST_COMMAND = "python3 -m pip install -q -c constraints.txt -e '.[test]' && python3 -m pytest"


def _tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tables", ROOT / "scripts" / "tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_with_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    config = str(ROOT / "mkdocs.yml")
    site = str(tmp_path / "site")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", site],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*")}
    for page in ROOT.joinpath("docs").glob("*.md"):
        name = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert name in built, f"{page.name} was not built"
    # The files the docs give to copy (sample config, unit, alert rules) are on the site too.
    for extra in ("disque.conf", "disque-trio.service", "prometheus-alerts.yml"):
        assert extra in built


def test_generated_tables_match_their_data() -> None:
    tables = _tables()
    stale = [p.name for p in tables.stale_pages()]
    assert stale == [], f"stale tables in {stale}: run python scripts/tables.py --write"


def test_a_later_run_of_the_same_day_is_the_current_one(tmp_path: Path) -> None:
    tables = _tables()
    tables.RESULTS = tmp_path
    for name in (
        "repl-cost-2026-12-06T1745.json",
        "repl-cost-2026-12-06.json",
        "repl-cost-2026-12-05.json",
        "repl-cost-2026-12-06-before.json",  # a peer's figures, not a run of its own
        "repl-ab-2026-12-07.json",
    ):
        (tmp_path / name).write_text(json.dumps({"date": name}))
    files = [p.name for p in tables.result_files("repl-cost")]
    assert files == [
        "repl-cost-2026-12-05.json",
        "repl-cost-2026-12-06.json",
        "repl-cost-2026-12-06T1745.json",
    ]
    assert tables._latest("repl-cost")["date"] == "repl-cost-2026-12-06T1745.json"


def test_tables_data_is_not_git_ignored() -> None:
    """A result a table reads must be committable: an ignored file passes here
    and fails on a clean clone (stop 50's CI: worker-nodes-*.json)."""
    tables = _tables()
    if not ROOT.joinpath(".git").exists():
        return  # an sdist or archive: nothing is ignored there
    read = [tables.SWEEPS]
    for name in tables.TABLES:
        read += tables.result_files(name)
    read += list(tables.RESULTS.glob("*.jsonl"))
    assert len(read) > len(tables.TABLES) // 2
    paths = [str(p.relative_to(ROOT)) for p in read]
    out = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    ignored = out.stdout.split()
    assert ignored == [], f"git ignores {ignored}: add a !bench/results/... line to .gitignore"


def test_every_generated_block_names_a_table() -> None:
    tables = _tables()
    used = set()
    for page in ROOT.joinpath("docs").glob("*.md"):
        used |= {m.group("name") for m in tables.BLOCK.finditer(page.read_text())}
    assert used <= set(tables.TABLES)
    # Every run log the script reads is shown somewhere.
    assert used == set(tables.TABLES)


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert NODE_COMMAND in text
    assert TEST_COMMAND in text


def test_ci_runs_the_readmes_test_command() -> None:
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_readmes_links_lead_to_files() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []
