"""Seeds in worker processes: the wall-clock guard, sweeps and CI's seed range.

A sweep runs its seeds in ``jobs`` long-lived worker processes
(sim/worker.py: the simulator imported once, each seed in a child forked
from that clean state), so the process start-up is paid per worker, not per
seed. A seed that outlives ``SEED_WALL_LIMIT_S`` is reported as a failure
and its worker killed and replaced. Failing seeds are saved in
``sim/regressions/``, and the sweep writes a one-page summary
(sim/summary.py). ``python -m sim mutants`` (sim/mutants.py) runs its seeds
as ``python -m sim run --seed N`` processes of their own
(``run_seed_process``). The checkout's root and commit live here too, for
the worker processes' working directory and for ``ci_seeds``.

Sweeps run for the record are kept as data in ``sim/sweeps.jsonl``, one
JSON object a line: the seeds, the commit and workers, passed and failed,
wall seconds, probes hit, each failure's first violation and a note on what
came of it (the fix, the plan kept in ``sim/regressions/``).

Nothing here imports the run machinery (sim/runs.py) or the mutants: they
import this module, and the workers run them.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .plan import Plan
from .summary import SeedResult, write_summary

REGRESSIONS = Path(
    os.environ.get("SIM_REGRESSIONS") or Path(__file__).resolve().parent / "regressions"
)
ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "sim" / "traces"  # failing runs' traces and timelines, summaries
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


class SeedWorker:
    """One ``python -m sim.worker`` process (sim/worker.py), in a process
    group of its own so that the guard kills its forked child with it.
    With ``coverage_dir``, its seeds measure branch coverage into that
    directory (sim/branchcov.py)."""

    def __init__(self, coverage_dir: str | None = None) -> None:
        extra = ["--coverage", coverage_dir] if coverage_dir is not None else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sim.worker", *extra],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.pending = b""  # answer bytes read but not yet a whole line
        self.alive = True

    def run(self, request: dict[str, Any], limit: float) -> tuple[int, list[str]]:
        """One seed: its exit status and output lines, or the guard's
        failure (exit 2) if no answer came within ``limit`` seconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + limit
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                return 2, [f"VIOLATION wall-clock guard: still running after {limit:.0f}s"]
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.kill()
                return 2, [f"worker process died (exit {self.proc.returncode})"]
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        answer = json.loads(line)
        return int(answer["rc"]), list(answer["lines"])

    def signal(self) -> None:
        """SIGKILL to the worker and its forked child."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal()
        self._reap()

    def close(self) -> None:
        """End of the sweep: stdin closed, the worker's loop ends."""
        if self.alive:
            self._reap()

    def _reap(self) -> None:
        self.alive = False
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:  # a killed worker's stdin
                    pass
        self.proc.wait()


def sweep(
    seeds: range,
    jobs: int,
    nodes: int | None = None,
    duration: int | None = None,
    mutant: str | None = None,
    save: bool = True,
    limit: float = SEED_WALL_LIMIT_S,
    summary: str | None = None,
    coverage_dir: str | None = None,
) -> int:
    """Run ``seeds`` in ``jobs`` worker processes; one line per seed, then
    each probe with the share of seeds that hit it, the probes never hit,
    the summary's path and ``seeds: N passed, N failed``. Failing seeds
    are saved in REGRESSIONS unless a mutant is planted. With
    ``coverage_dir``, every seed saves its branch coverage there
    (``python -m sim coverage``)."""
    started = time.perf_counter()
    local = threading.local()
    workers: list[SeedWorker] = []

    def one(seed: int) -> SeedResult:
        worker: SeedWorker | None = getattr(local, "worker", None)
        if worker is None or not worker.alive:
            worker = local.worker = SeedWorker(coverage_dir)
            workers.append(worker)
        request = {"seed": seed, "nodes": nodes, "duration": duration, "mutant": mutant}
        t0 = time.perf_counter()
        rc, lines = worker.run(request, limit)
        return SeedResult(seed, rc, lines, time.perf_counter() - t0)

    results: list[SeedResult] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            for result in pool.map(one, seeds):
                results.append(result)
                _print_result(result)
                if not result.ok and save and not mutant:
                    _save_regression(result, nodes, duration)
        except BaseException:
            # Ctrl-C (the workers, in sessions of their own, did not get
            # it) or a bug here: no more seeds, and the running ones
            # killed, their threads see EOF and reap them.
            pool.shutdown(wait=False, cancel_futures=True)
            for worker in workers:
                worker.signal()
            raise
    for worker in workers:
        worker.close()
    from .world import PROBES

    hit: Counter[str] = Counter(p for r in results for p in set(r.probes_hit))  # probe -> seeds
    missed = [p for p in PROBES if p not in hit]
    print(f"probe shares ({len(seeds)} seeds):")
    for p in PROBES:
        print(f"  {p:<34} {hit[p]:>5}  {100 * hit[p] / max(1, len(seeds)):5.1f}%")
    print(
        f"probes hit in this sweep: {len(PROBES) - len(missed)}/{len(PROBES)}; never: {', '.join(missed) or '-'}"
    )
    wall = time.perf_counter() - started
    print(f"sweep wall time {wall:.1f}s for {len(seeds)} seeds")
    path = summary or str(TRACES / f"sweep-{seeds.start}-{seeds.stop - 1}.html")
    commands = {r.seed: replay_text(r.seed, nodes, duration, mutant) for r in results}
    page = write_summary(path, results, commands, PROBES, wall, mutant, commit(), TRACES)
    print(f"summary: {page}")
    failed = sum(1 for r in results if not r.ok)
    print(f"seeds: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def replay_text(seed: int, nodes: int | None, duration: int | None, mutant: str | None) -> str:
    """The command that runs one seed of a sweep again."""
    return " ".join(["python", *seed_command(seed, nodes, duration, mutant)[1:]])


def _print_result(result: SeedResult) -> None:
    if result.ok:
        print(f"seed {result.seed}: PASS {result.wall:.1f}s {result.digest}", flush=True)
        return
    print(f"seed {result.seed}: {result.verdict} {result.wall:.1f}s", flush=True)
    for text in result.violations[:5] or result.lines[-10:]:
        print(f"    {text}", flush=True)


def _save_regression(result: SeedResult, nodes: int | None, duration: int | None) -> None:
    REGRESSIONS.mkdir(exist_ok=True)
    plan = Plan.from_seed(result.seed, nodes, duration)
    record = {
        "seed": result.seed,
        "plan": json.loads(plan.to_json()),
        "replay": replay_text(result.seed, nodes, duration, None),
        "violations": result.violations or result.lines[-20:],
        "digest": result.digest,
    }
    path = REGRESSIONS / f"seed-{result.seed}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")


def ci_seeds(count: int) -> range:
    """A seed range picked by the commit: every commit explores new seeds,
    and a commit's CI run can be repeated exactly."""
    head = commit()
    start = int(head[:7], 16) % 1_000_000 * 1000 + 1 if head != "unknown" else 1
    return range(start, start + count)
