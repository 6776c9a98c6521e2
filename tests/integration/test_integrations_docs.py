"""docs/integrations.md's quick starts, run as written: the Python file of
each section is written out, the console lines run (the worker in the
background), against a node of the test's own (the address in the file
is the one thing replaced; ``pip install`` and starting ``disque-trio`` are
skipped: the test environment has the extras, the node is started here)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import NodeProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"

pytestmark = pytest.mark.slow


def section(title: str) -> tuple[str, str, list[str]]:
    """The file name, the Python code and the console commands of the
    quick start under ``title``."""
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    code = re.search(r"```python\n(# (\S+)\n.*?)```", body, re.S)
    console = re.search(r"```console\n(.*?)```", body, re.S)
    assert code and console, f"no quick start under {title!r}"
    commands = [line[2:] for line in console.group(1).splitlines() if line.startswith("$ ")]
    return code.group(2), code.group(1), commands


@pytest.mark.parametrize(
    ("title", "framework"),
    [("Celery: quick start", "celery"), ("Dramatiq: quick start", "dramatiq")],
)
def test_quick_start_runs_as_written(
    title: str, framework: str, node: NodeProcess, tmp_path: Path
) -> None:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (pip install -c constraints.txt -e '.[test]')")
    filename, code, commands = section(title)
    assert "127.0.0.1:7711" in code
    (tmp_path / filename).write_text(code.replace("127.0.0.1:7711", f"127.0.0.1:{node.port}"))
    steps = [c for c in commands if not c.startswith(("pip ", "disque-trio "))]
    assert len(steps) == 2 and steps[0].endswith(" &"), steps
    worker_cmd = shlex.split(steps[0][:-2])
    producer_cmd = shlex.split(steps[1])
    assert worker_cmd[0] == framework and producer_cmd[0] == "python"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", *worker_cmd],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        subprocess.run(
            [sys.executable, *producer_cmd[1:]], cwd=tmp_path, env=env, check=True, timeout=60
        )
        deadline = time.monotonic() + 60
        while "2 + 3 = 5" not in log_path.read_text(errors="replace"):
            assert worker.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log_path.read_text(errors="replace")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=15)
