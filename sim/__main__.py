"""``python -m sim run --seed N [--nodes K] [--duration S]`` runs one world;
``python -m sim run --seeds A..B [--jobs J]`` sweeps seeds in subprocesses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .checkers import Crashes, Report, check
from .workload import Workload
from .world import World

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
ROOT = Path(__file__).resolve().parent.parent


def run_once(
    seed: int,
    nodes: int = 3,
    duration: float = 10.0,
    partition: bool = True,
    crashes: bool = True,
) -> tuple[World, Workload]:
    world = World(seed, nodes=nodes)
    workload = Workload(duration=duration, partition=partition, crashes=crashes)
    started = time.perf_counter()
    world.run(workload)
    world.wall_seconds = time.perf_counter() - started
    return world, workload


def check_world(world: World, workload: Workload) -> Report:
    crashes = Crashes(world.appendfsync, world.holders, world.amnesia)
    return check(workload.history, workload.drained, crashes)


def sweep_nodes(seed: int) -> int:
    """The node count a sweep uses for a seed (3 to 5)."""
    return 3 + seed % 3


def _parse_range(text: str) -> range:
    first, _, last = text.partition("..")
    return range(int(first), int(last or first) + 1)


def _one_command(seed: int, args: argparse.Namespace) -> list[str]:
    nodes = args.nodes if args.nodes is not None else sweep_nodes(seed)
    cmd = ["python", "-m", "sim", "run", "--seed", str(seed), "--nodes", str(nodes)]
    cmd += ["--duration", str(args.duration)]
    if args.no_partition:
        cmd.append("--no-partition")
    if args.no_crash:
        cmd.append("--no-crash")
    return cmd


def _sweep(args: argparse.Namespace) -> int:
    seeds = _parse_range(args.seeds)
    started = time.perf_counter()

    def one(seed: int) -> tuple[int, list[str], int, float]:
        cmd = _one_command(seed, args)
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, *cmd[1:]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        lines = out.stdout.strip().splitlines() + out.stderr.strip().splitlines()[-20:]
        return out.returncode, lines, seed, time.perf_counter() - t0

    passed = failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for rc, lines, seed, wall in pool.map(one, seeds):
            digest = next((x for x in reversed(lines) if x.startswith("digest ")), "no digest")
            if rc == 0:
                passed += 1
                print(f"seed {seed}: PASS {wall:.1f}s {digest}", flush=True)
                continue
            failed += 1
            violations = [x[len("VIOLATION ") :] for x in lines if x.startswith("VIOLATION ")]
            print(f"seed {seed}: FAIL {wall:.1f}s {len(violations)} violations", flush=True)
            REGRESSIONS.mkdir(exist_ok=True)
            record = {
                "seed": seed,
                "replay": " ".join(_one_command(seed, args)),
                "violations": violations or lines[-20:],
                "digest": digest,
            }
            (REGRESSIONS / f"seed-{seed}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"sweep wall time {time.perf_counter() - started:.1f}s")
    print(f"seeds: {passed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one simulated world, or sweep seeds")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--seeds", help="A..B: run every seed in subprocesses")
    run.add_argument("--jobs", type=int, default=1, help="parallel seeds (with --seeds)")
    run.add_argument("--nodes", type=int, default=None, help="3, or 3 + seed %% 3 with --seeds")
    run.add_argument("--duration", type=float, default=10.0)
    run.add_argument("--no-partition", action="store_true")
    run.add_argument("--no-crash", action="store_true")
    run.add_argument("--trace", help="write the trace (JSON lines) to this file")
    mut = sub.add_parser("mutants", help="run the mutants (sim/mutants.py) until caught")
    mut.add_argument("names", nargs="*", help="only these mutants")
    mut.add_argument("--seeds", default="1..30", help="A..B: seeds tried per mutant")
    args = parser.parse_args(argv)
    if args.cmd == "mutants":
        from . import mutants

        return mutants.main(args.names or None, tuple(_parse_range(args.seeds)))
    if args.seeds is not None:
        return _sweep(args)
    nodes = args.nodes if args.nodes is not None else 3
    world, workload = run_once(
        args.seed, nodes, args.duration, not args.no_partition, not args.no_crash
    )
    report = check_world(world, workload)
    virtual = world.virtual_seconds
    print(
        f"seed {args.seed} nodes {nodes} appendfsync {world.appendfsync}: "
        f"{report.added} adds ({report.added_ok} ok), "
        f"{report.delivered} deliveries, {report.duplicates} duplicates, "
        f"{len(world.trace.lines)} trace events, {virtual:.1f} virtual s "
        f"in {world.wall_seconds:.2f} wall s, drained={workload.drained}"
    )
    print("probes: " + ", ".join(f"{k}={v}" for k, v in world.probes.items()))
    hit = [k for k, v in world.probes.items() if v]
    missed = [k for k, v in world.probes.items() if not v]
    print(f"probes hit: {', '.join(hit) or '-'}; missed: {', '.join(missed) or '-'}")
    print(
        f"amnesia: {len(world.amnesia)} jobs forgotten by a crash; "
        f"{len(report.excused)} losses excused"
    )
    for excused in report.excused:
        print(f"EXCUSED {excused}")
    if args.trace:
        world.trace.dump(args.trace)
    for violation in report.violations:
        print(f"VIOLATION {violation}")
    print(f"digest {world.trace.digest()}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
