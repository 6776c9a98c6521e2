"""disque_trio.about: the commit an install was built from, read from a
clone's files, and the operator's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from disque_trio import about
from disque_trio._gitref import read_git_head

A = "a" * 40
B = "b" * 40


def _repo(tmp_path: Path, head: str) -> Path:
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    return git


def test_a_branch_head_is_read_from_its_loose_ref(tmp_path: Path) -> None:
    git = _repo(tmp_path, "ref: refs/heads/main")
    (git / "refs" / "heads" / "main").write_text(A + "\n")
    assert read_git_head(git) == A


def test_a_packed_ref_and_a_detached_head(tmp_path: Path) -> None:
    git = _repo(tmp_path, "ref: refs/heads/main")
    (git / "packed-refs").write_text(
        f"# pack-refs with: peeled\n{B} refs/heads/other\n{A} refs/heads/main\n"
    )
    assert read_git_head(git) == A
    (git / "HEAD").write_text(B + "\n")
    assert read_git_head(git) == B


def test_a_worktree_reads_its_head_and_the_common_refs(tmp_path: Path) -> None:
    common = _repo(tmp_path / "main", "ref: refs/heads/main")
    (common / "refs" / "heads" / "feature").write_text(B + "\n")
    wt_git = common / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/feature\n")
    (wt_git / "commondir").write_text("../..\n")
    checkout = tmp_path / "wt"
    checkout.mkdir()
    (checkout / ".git").write_text(f"gitdir: {wt_git}\n")
    assert read_git_head(checkout / ".git") == B


@pytest.mark.parametrize("head", ["ref: refs/heads/gone", "not a sha", ""])
def test_nothing_readable_is_none(tmp_path: Path, head: str) -> None:
    assert read_git_head(_repo(tmp_path, head)) is None
    assert read_git_head(tmp_path / "nowhere") is None


def test_this_install_knows_its_commit() -> None:
    """Run from a clone (or an install built from one), the commit is
    the clone's; never the zeros of an unknown build here."""
    sha = about.commit()
    assert len(sha) == 40 and sha != about.UNKNOWN_COMMIT


@pytest.mark.parametrize("kind", sorted(about.OPERATOR_FILES))
def test_the_operator_files_are_the_docs_ones(kind: str) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert about.operator_file(kind) == (docs / about.OPERATOR_FILES[kind]).read_text()
