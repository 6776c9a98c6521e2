"""Build the release and try it as an operator would, outside the clone.

    python scripts/check_release.py [--out DIR] [--keep]

1. ``python -m build`` makes the sdist and the wheel (into DIR, a new
   temporary directory by default), and ``twine check --strict`` reads
   their metadata and README as an index would.
2. The sdist holds what a packager needs (docs, tests, constraints.txt,
   LICENSE, CHANGELOG.md, the operator's files) and the wheel what a
   running install needs (the package, its dashboard, the operator's
   files, the commit it was built from).
3. A new virtual environment gets the wheel (not the source tree, not
   editable), with constraints.txt, and from a directory outside the
   clone: ``disque-trio --version``, ``sample-config``/``-unit``/
   ``-alerts``, a node with an AOF, the client adding and taking jobs,
   ``disque-trio worker`` running a handler, and ``disque-trio check-aof``
   on the AOF the node wrote.

Exit status 0 when every step passed; each step prints what it checked.
tests/integration/test_release.py runs this script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from disque_trio import __version__  # noqa: E402
from disque_trio._gitref import read_git_head  # noqa: E402
from disque_trio.about import OPERATOR_FILES  # noqa: E402
from tests.helpers import free_port  # noqa: E402  (the node's port, web and bus ports free)

SDIST_MUST_HOLD = [
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "constraints.txt",
    "pyproject.toml",
    "setup.py",
    "mkdocs.yml",
    "docs/index.md",
    "docs/operations.md",
    *(f"docs/{name}" for name in OPERATOR_FILES.values()),
    "tests/conftest.py",
    "tests/unit/test_packaging.py",
    "sim/__main__.py",
    "disque_trio/__init__.py",
    "disque_trio/_commit.py",
]
WHEEL_MUST_HOLD = [
    "disque_trio/__init__.py",
    "disque_trio/py.typed",
    "disque_trio/static/dashboard.html",
    "disque_trio/_commit.py",
    *(f"disque_trio/operator/{name}" for name in OPERATOR_FILES.values()),
]


def step(text: str) -> None:
    print(f"== {text}", flush=True)


def run(
    cmd: list[str],
    *,
    cwd: Path | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode:
        raise SystemExit(
            f"FAILED ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done.stdout


def build(out: Path) -> tuple[Path, Path]:
    step(f"python -m build into {out}")
    # A copy of the clone's tracked files (what a fresh clone holds), so
    # that scratch files of a working tree never reach the sdist. The copy
    # keeps a .git file pointing at the clone, so the build still reads
    # the commit.
    src = out / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True, timeout=120
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=120)
    for path in tracked_changes():
        # Uncommitted edits and new files are built as they are (a
        # developer running this before committing).
        target = src / path
        if (ROOT / path).exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, target)
    (src / ".git").write_text(f"gitdir: {git_dir()}\n")
    dist = out / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], timeout=900)
    sdists = sorted(dist.glob("*.tar.gz"))
    wheels = sorted(dist.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, (sdists, wheels)
    print(f"   {sdists[0].name} ({sdists[0].stat().st_size:,} bytes)")
    print(f"   {wheels[0].name} ({wheels[0].stat().st_size:,} bytes)")
    assert wheels[0].name == f"disque_trio-{__version__}-py3-none-any.whl", wheels[0].name
    return sdists[0], wheels[0]


def git_dir() -> Path:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--absolute-git-dir"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return Path(out.stdout.strip())


def tracked_changes() -> list[str]:
    """Files changed since HEAD, and new ones git does not ignore."""
    names: list[str] = []
    for cmd in (["diff", "--name-only", "HEAD"], ["ls-files", "--others", "--exclude-standard"]):
        out = subprocess.run(
            ["git", "-C", str(ROOT), *cmd], capture_output=True, text=True, check=True, timeout=30
        )
        names += [line for line in out.stdout.splitlines() if line]
    return names


def twine_check(sdist: Path, wheel: Path) -> None:
    step("twine check --strict")
    print(
        "   "
        + run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
        .strip()
        .replace("\n", "\n   ")
    )


def check_contents(sdist: Path, wheel: Path, commit: str | None) -> None:
    step("what the sdist and the wheel hold")
    with tarfile.open(sdist) as tar:
        prefix = f"disque_trio-{__version__}/"
        names = {m.name.removeprefix(prefix) for m in tar.getmembers()}
        missing = [n for n in SDIST_MUST_HOLD if n not in names]
        assert not missing, f"the sdist lacks {missing}"
        print(f"   sdist: {len(names)} files, {len(SDIST_MUST_HOLD)} required present")
        if commit:
            member = tar.extractfile(prefix + "disque_trio/_commit.py")
            assert member is not None and commit in member.read().decode(), "sdist commit"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [n for n in WHEEL_MUST_HOLD if n not in names]
        assert not missing, f"the wheel lacks {missing}"
        stray = sorted(
            {n.split("/")[0] for n in names}
            - {"disque_trio", f"disque_trio-{__version__}.dist-info"}
        )
        assert not stray, f"the wheel installs more than the package: {stray}"
        metadata = zf.read(f"disque_trio-{__version__}.dist-info/METADATA").decode()
        for line in (
            "License-Expression: BSD-3-Clause",
            "License-File: LICENSE",
            f"Version: {__version__}",
        ):
            assert line in metadata, f"METADATA lacks {line!r}"
        for name in OPERATOR_FILES.values():
            assert (
                zf.read(f"disque_trio/operator/{name}") == (ROOT / "docs" / name).read_bytes()
            ), name
        if commit:
            assert commit in zf.read("disque_trio/_commit.py").decode(), "wheel commit"
        print(
            f"   wheel: {len(names)} files, {len(WHEEL_MUST_HOLD)} required present; METADATA: "
            "License-Expression BSD-3-Clause, License-File LICENSE"
        )


def terminate(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, as systemd stops it; SIGKILL after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def install(wheel: Path, out: Path) -> Path:
    step("a new virtual environment with the wheel (not editable, not the source tree)")
    venv = out / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    python = venv / "bin" / "python"
    run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            str(ROOT / "constraints.txt"),
            f"{wheel}[worker]",
        ],
        cwd=out,
        timeout=900,
    )
    where = run(
        [str(python), "-c", "import disque_trio; print(disque_trio.__file__)"], cwd=out
    ).strip()
    assert where.startswith(str(venv)), f"disque_trio imported from {where}, not the venv"
    print(f"   disque_trio from {where}")
    return venv


def smoke(venv: Path, out: Path, commit: str | None) -> None:
    bin_ = venv / "bin"
    work = out / "smoke"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_}:{env.get('PATH', '')}"

    step("disque-trio --version")
    version = run([str(bin_ / "disque-trio"), "--version"], cwd=work, env=env).strip()
    print(f"   {version}")
    assert version.startswith(f"disque-trio {__version__} "), version
    if commit:
        assert f"commit {commit[:12]}" in version, version

    step("disque-trio sample-config, sample-unit, sample-alerts")
    for kind, name in OPERATOR_FILES.items():
        text = run([str(bin_ / "disque-trio"), f"sample-{kind}"], cwd=work, env=env)
        assert text == (ROOT / "docs" / name).read_text(), name
        print(f"   sample-{kind}: {name}, {len(text.splitlines())} lines")

    step("a node with an AOF, the client, the worker")
    port = free_port()
    log = (work / "node.log").open("w")
    node = subprocess.Popen(
        [
            str(bin_ / "disque-trio"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(work),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--web-port",
            "0",
        ],
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        client_script = textwrap.dedent(f"""
            import time
            from disque_trio.client import Client
            deadline = time.monotonic() + 30
            while True:
                try:
                    c = Client("127.0.0.1:{port}", timeout=5)
                    c.ping()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            with c:
                info = c.info()
                assert "disque_trio_version:{__version__}" in info, info
                sha = [l for l in info.splitlines() if l.startswith("disque_git_sha1:")][0]
                print("INFO", sha.strip())
                ids = [c.add_job("smoke", "job %d" % i, replicate=1, retry=30) for i in range(3)]
                jobs = c.get_jobs("smoke", count=1, timeout=2)
                assert [j.body for j in jobs] == [b"job 0"], jobs
                assert c.ack_job(jobs[0].id) == 1
                for i in range(3, 8):
                    c.add_job("work", "task %d" % i, replicate=1, retry=30)
            print("CLIENT added 8, took and acked 1")
        """)
        printed = run([str(bin_ / "python"), "-c", client_script], cwd=work, env=env, timeout=120)
        print("   " + printed.strip().replace("\n", "\n   "))
        if commit:
            assert f"disque_git_sha1:{commit[:8]}" in printed, printed

        (work / "smoketasks.py").write_text(
            textwrap.dedent(f"""
            from pathlib import Path
            from disque_trio.worker import Worker

            worker = Worker(["disque://127.0.0.1:{port}"])


            @worker.handler("work", concurrency=2)
            async def handle(job):
                with open(Path(__file__).with_name("done.txt"), "a") as f:
                    f.write(job.text + "\\n")
        """)
        )
        worker = subprocess.Popen(
            [str(bin_ / "disque-trio"), "worker", "smoketasks:worker", "--path", str(work)],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            done = work / "done.txt"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if done.exists() and len(done.read_text().splitlines()) >= 5:
                    break
                assert worker.poll() is None, worker.communicate()[0]
                time.sleep(0.1)
            handled = sorted(done.read_text().splitlines()) if done.exists() else []
            assert handled == [f"task {i}" for i in range(3, 8)], handled
            print(f"   worker: handled {len(handled)} jobs")
        finally:
            terminate(worker)
        assert worker.returncode == 0, (
            worker.communicate()[0] if worker.stdout else worker.returncode
        )
        # The worker acks in batches: wait until the node has the acks.
        settle = textwrap.dedent(f"""
            import time
            from disque_trio.client import Client
            with Client("127.0.0.1:{port}", timeout=5) as c:
                deadline = time.monotonic() + 30
                while c.qlen("work") and time.monotonic() < deadline:
                    time.sleep(0.1)
                print("QLEN work", c.qlen("work"), "smoke", c.qlen("smoke"))
        """)
        print("   " + run([str(bin_ / "python"), "-c", settle], cwd=work, env=env).strip())
    finally:
        terminate(node)
        log.close()
    assert node.returncode == 0, (work / "node.log").read_text()[-3000:]

    step("disque-trio check-aof on the node's AOF")
    aofs = sorted(work.glob("*.aof"))
    assert aofs, f"no AOF in {work}: {sorted(p.name for p in work.iterdir())}"
    checked = run(
        [str(bin_ / "disque-trio"), "check-aof", str(aofs[0])], cwd=work, env=env
    ).strip()
    print("   " + checked.replace("\n", "\n   "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        help="where to build and install (a new temporary directory by default)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="disque-trio-release-"))
    out.mkdir(parents=True, exist_ok=True)
    commit = read_git_head(git_dir())
    started = time.monotonic()
    try:
        sdist, wheel = build(out)
        twine_check(sdist, wheel)
        check_contents(sdist, wheel, commit)
        venv = install(wheel, out)
        smoke(venv, out, commit)
    finally:
        if args.out is None and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    print(f"release {__version__} checked in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
