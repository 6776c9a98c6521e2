"""Seeds in worker processes: the wall-clock guard, sweeps and CI's seed range.

Each seed runs as ``python -m sim run --seed N`` in a process of its own,
killed if it outlives ``SEED_WALL_LIMIT_S``; ``sweep`` runs a range of
seeds that way and saves the failing ones in ``sim/regressions/``, and
``python -m sim mutants`` (sim/mutants.py) runs its seeds the same way. The
checkout's root and commit live here too, for the worker processes' working
directory and for ``ci_seeds``.

Nothing here imports the run machinery (sim/runs.py) or the mutants: they
import this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .plan import Plan

REGRESSIONS = Path(
    os.environ.get("SIM_REGRESSIONS") or Path(__file__).resolve().parent / "regressions"
)
ROOT = Path(__file__).resolve().parent.parent
# A seed whose run takes longer than this (wall) is reported as a failure:
# a node spinning without letting virtual time advance is a bug too.
SEED_WALL_LIMIT_S = 180.0


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def seed_command(
    seed: int, nodes: int | None = None, duration: int | None = None, mutant: str | None = None
) -> list[str]:
    """The ``python -m sim run`` command line of one seed."""
    cmd = [sys.executable, "-m", "sim", "run", "--seed", str(seed)]
    if nodes is not None:
        cmd += ["--nodes", str(nodes)]
    if duration is not None:
        cmd += ["--duration", str(duration)]
    if mutant:
        cmd += ["--mutant", mutant]
    return cmd


def run_seed_process(cmd: list[str], limit: float = SEED_WALL_LIMIT_S) -> tuple[int, list[str]]:
    """One seed in a worker process, killed if it outlives ``limit``."""
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=limit
        )
    except subprocess.TimeoutExpired:
        return 2, [f"VIOLATION wall-clock guard: still running after {limit:.0f}s"]
    lines = out.stdout.strip().splitlines()
    if out.returncode not in (0, 1):
        lines += out.stderr.strip().splitlines()[-20:]
    return out.returncode, lines


def sweep(
    seeds: range,
    jobs: int,
    nodes: int | None = None,
    duration: int | None = None,
    mutant: str | None = None,
    save: bool = True,
) -> int:
    """Run ``seeds`` in ``jobs`` worker processes at a time; one line per
    seed, then the probes hit and ``seeds: N passed, N failed``. Failing
    seeds are saved in REGRESSIONS unless a mutant is planted."""
    started = time.perf_counter()

    def one(seed: int) -> tuple[int, int, list[str], float]:
        t0 = time.perf_counter()
        rc, lines = run_seed_process(seed_command(seed, nodes, duration, mutant))
        return seed, rc, lines, time.perf_counter() - t0

    passed = failed = 0
    hit: set[str] = set()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for seed, rc, lines, wall in pool.map(one, seeds):
            for line in lines:
                if line.startswith("probes hit: "):
                    names = line[len("probes hit: ") :].split(";")[0]
                    hit.update(x.strip() for x in names.split(",") if x.strip() != "-")
            digest = next((x for x in reversed(lines) if x.startswith("digest ")), "no digest")
            if rc == 0:
                passed += 1
                print(f"seed {seed}: PASS {wall:.1f}s {digest}", flush=True)
                continue
            failed += 1
            violations = [x[len("VIOLATION ") :] for x in lines if x.startswith("VIOLATION ")]
            # FAIL: a checker's verdict; ERROR: the run itself broke.
            verdict = "FAIL" if rc == 1 and violations else f"ERROR (exit {rc})"
            print(f"seed {seed}: {verdict} {wall:.1f}s", flush=True)
            for text in violations[:5] or lines[-10:]:
                print(f"    {text}", flush=True)
            if save and not mutant:
                REGRESSIONS.mkdir(exist_ok=True)
                plan = Plan.from_seed(seed, nodes, duration)
                command = seed_command(seed, nodes, duration, mutant)
                record = {
                    "seed": seed,
                    "plan": json.loads(plan.to_json()),
                    "replay": " ".join(["python", *command[1:]]),
                    "violations": violations or lines[-20:],
                    "digest": digest,
                }
                (REGRESSIONS / f"seed-{seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    from .world import PROBES

    missed = [p for p in PROBES if p not in hit]
    print(
        f"probes hit in this sweep: {len(PROBES) - len(missed)}/{len(PROBES)}; never: {', '.join(missed) or '-'}"
    )
    print(f"sweep wall time {time.perf_counter() - started:.1f}s for {len(seeds)} seeds")
    print(f"seeds: {passed} passed, {failed} failed")
    return 1 if failed else 0


def ci_seeds(count: int) -> range:
    """A seed range picked by the commit: every commit explores new seeds,
    and a commit's CI run can be repeated exactly."""
    head = commit()
    start = int(head[:7], 16) % 1_000_000 * 1000 + 1 if head != "unknown" else 1
    return range(start, start + count)
