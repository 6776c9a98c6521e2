"""A sweep's worker process: imports the simulator once, then runs seed
after seed, each in a child forked from that clean state.

``python -m sim.worker`` reads one request per line on stdin (JSON:
``{"seed": N, "nodes": K|null, "duration": S|null, "mutant": M|null}``) and
answers one line per request on stdout: ``{"rc": 0|1|2, "lines": [...]}``,
the lines being what ``python -m sim run --seed N`` prints. It is the
process start-up (the interpreter, Trio, the node code: about 0.4 s) that a
sweep no longer pays per seed.

Why a fork per seed rather than runs in this process: a run must give the
digest a fresh ``python -m sim run --seed N`` gives, and a process that has
run seeds is no longer fresh: mutants monkeypatch the node code (a patch
left behind by a failing run would plant its bug in every later seed), and
any module-level state (caches, counters, logging handlers) would carry
over. The child starts from this process's state, which has only imported
modules and never run a seed; it dies with whatever the run changed. A fork
of an idle interpreter costs a few milliseconds.

The wall-clock guard stays with the sweep (sim/sweep.py): a seed that does
not answer in time has its worker's whole process group killed, the child
included, and the worker replaced.

``python -m sim.worker --coverage DIR`` measures the node code's branch
coverage (sim/branchcov.py): the worker records its own imports (the module
bodies: definitions, module-level branches) into ``DIR``, and each forked
child starts coverage before its run and saves it, under a data suffix of
its own, before it exits. Coverage only watches the run: the digest is the
one a run without it gives.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def run_request(request: dict[str, Any]) -> int:
    """One seed in this process, printing what ``python -m sim run`` prints."""
    from .plan import Plan
    from .runs import report_run, run_plan

    plan = Plan.from_seed(request["seed"], request.get("nodes"), request.get("duration"))
    outcome = run_plan(plan, request.get("mutant"))
    return report_run(outcome, request.get("mutant"))


def run_forked(request: dict[str, Any], coverage_dir: str | None = None) -> tuple[int, list[str]]:
    """One seed in a forked child; its exit status and output lines. With
    ``coverage_dir``, the child measures the node code's branch coverage
    and saves it there."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        # Its stdout and stderr, at the file descriptor level, are the pipe:
        # nothing it prints can reach the worker's answers on fd 1.
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        rc = 2
        measure = None
        try:
            if coverage_dir is not None:
                from .branchcov import start_measuring

                measure = start_measuring(coverage_dir, f"seed-{request['seed']}")
            rc = run_request(request)
        except BaseException:  # the run broke: its traceback is the output
            traceback.print_exc()
        finally:
            if measure is not None:
                # os._exit runs no atexit hook: the data is saved here.
                measure.stop()
                measure.save()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    os.close(write_fd)
    with os.fdopen(read_fd, encoding="utf-8", errors="replace") as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    lines = text.strip().splitlines()
    return rc, lines if rc in (0, 1) else lines[-20:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    coverage_dir = args[1] if args[:1] == ["--coverage"] else None
    imports = None
    if coverage_dir is not None:
        from .branchcov import start_measuring

        imports = start_measuring(coverage_dir, f"imports-{os.getpid()}")
    # Modules imported here, once, before any fork.
    from . import mutants, runs, world  # noqa: F401

    if imports is not None:
        imports.stop()
        imports.save()
    for line in sys.stdin:
        if not line.strip():
            continue
        rc, lines = run_forked(json.loads(line), coverage_dir)
        sys.stdout.write(json.dumps({"rc": rc, "lines": lines}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
