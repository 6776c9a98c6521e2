"""The commit a git checkout is at, read from its files (no git binary).

Standard library only and no import of the package: setup.py loads this file
on its own at build time, before the package's dependencies exist.
"""

from __future__ import annotations

from pathlib import Path


def read_git_head(git: Path) -> str | None:
    """The commit HEAD names in the repository ``git`` (a ``.git``
    directory, or the file a worktree has in its place), read from the
    files themselves: no git binary needed. None when there is none."""
    try:
        if git.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = git.read_text().strip()
            if not text.startswith("gitdir:"):
                return None
            git = (git.parent / text.removeprefix("gitdir:").strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head if _is_sha(head) else None
        ref = head.removeprefix("ref:").strip()
        # A worktree keeps its refs in the common directory.
        common = git
        if (git / "commondir").is_file():
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for base in (git, common):
            loose = base / ref
            if loose.is_file():
                sha = loose.read_text().strip()
                return sha if _is_sha(sha) else None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref and _is_sha(sha):
                    return sha
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)
